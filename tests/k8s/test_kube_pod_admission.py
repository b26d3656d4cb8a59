"""leoflow's task pod against the real kube-apiserver (issue 9 items 1 and 2; research/k8s-runtime-facts.md
"What the spec must say" 14): Pod Security ``restricted`` admits the pod :func:`build_pod` makes, with and
without a pod template and a pod_override, and refuses a non-compliant override with 403 ``violates
PodSecurity``; the three ResourceQuota 403s and a 409 on the deterministic name, each produced for real, are
classified as the dispositions table says.

Every create here is a real POST; the pods stay Pending (no scheduler, no nodeName), which is all admission needs.
"""

from __future__ import annotations

import dataclasses
import json
import uuid

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from leoflow_airflow import settings as leoflow_settings
from leoflow_airflow.runtime.kubernetes.classify import VerdictKind, classify_exception
from leoflow_airflow.runtime.kubernetes.identity import IDENTITY_ANNOTATION, parse_identity_annotation
from leoflow_airflow.runtime.kubernetes.pod import (
    PodAttempt,
    build_pod,
    is_attempt_pod,
    pod_name,
)
from leoflow_airflow.runtime.kubernetes.template import parse_pod_template

from .conftest import wait_for

pytestmark = pytest.mark.k8s

TEMPLATE = """
apiVersion: v1
kind: Pod
metadata:
  labels: {team: data}
spec:
  containers:
    - name: main
      command: ["/usr/bin/env", "PATH=/opt/venv/bin:/usr/bin:/bin"]
      resources:
        requests: {cpu: 50m, memory: 64Mi}
      securityContext: {runAsUser: 50000, runAsGroup: 0, readOnlyRootFilesystem: true}
      volumeMounts: [{name: scratch, mountPath: /scratch}]
  volumes:
    - {name: scratch, emptyDir: {}}
"""


def kube(namespace: str, **overrides: str) -> leoflow_settings.KubernetesSettings:
    values = {"namespace": namespace, "image": "leoflow.test/none:0",
              "exchange_url": "https://airflow.example/leoflow", **overrides}
    return leoflow_settings.load_kubernetes(lambda section, key, fallback: values.get(key, fallback))


def attempt(epoch: int = 1) -> PodAttempt:
    return PodAttempt(ti_id=str(uuid.uuid4()), try_number=1, attempt_epoch=epoch, dag_id="etl", task_id="load",
                      run_id="manual__2026-01-01T00:00:00+00:00")


def create_error(core: client.CoreV1Api, namespace: str, pod: client.V1Pod, **kw) -> ApiException:
    with pytest.raises(ApiException) as err:
        core.create_namespaced_pod(namespace, pod, **kw)
    return err.value


def plain_pod(name: str) -> client.V1Pod:
    """A pod with no security context: below the restricted level."""
    return client.V1Pod(metadata=client.V1ObjectMeta(name=name), spec=client.V1PodSpec(
        restart_policy="Never", containers=[client.V1Container(name="c", image="leoflow.test/none:0")]))


def test_restricted_namespace_admits_the_built_pod_and_refuses_a_plain_one(core, restricted_namespace):
    err = create_error(core, restricted_namespace, plain_pod("plain"))  # the namespace really enforces
    assert err.status == 403 and "violates PodSecurity" in err.body

    a = attempt()
    created = core.create_namespaced_pod(restricted_namespace, build_pod(a, kube(restricted_namespace)))
    assert created.metadata.name == pod_name(a) and created.metadata.uid
    assert created.spec.automount_service_account_token is False
    assert created.spec.restart_policy == "Never"
    [vol] = created.spec.volumes
    assert vol.projected.sources[0].service_account_token.audience == "urn:leoflow:exchange"
    base = created.spec.containers[0]
    assert base.termination_message_path == "/dev/termination-log" and base.termination_message_policy == "File"
    assert parse_identity_annotation(created.metadata.annotations[IDENTITY_ANNOTATION]) == a.ref
    stored = json.dumps(client.ApiClient().sanitize_for_serialization(created))
    assert "eyJ" not in stored and "sql_alchemy" not in stored.lower() and "fernet" not in stored.lower()


def test_restricted_namespace_admits_the_pod_from_a_template_and_an_override(core, restricted_namespace):
    template = parse_pod_template(TEMPLATE)
    override = client.V1Pod(metadata=client.V1ObjectMeta(labels={"cost": "42"}), spec=client.V1PodSpec(
        node_selector={"pool": "batch"},
        containers=[client.V1Container(name="base", image="leoflow.test/other:1",
                                       env=[client.V1EnvVar(name="TZ", value="UTC")],
                                       resources=client.V1ResourceRequirements(limits={"memory": "128Mi"}))]))
    pod = build_pod(attempt(), kube(restricted_namespace), template=template,
                    executor_config={"pod_override": override})
    created = core.create_namespaced_pod(restricted_namespace, pod)
    assert created.metadata.labels["team"] == "data" and created.metadata.labels["cost"] == "42"
    assert created.spec.node_selector == {"pool": "batch"}
    base = created.spec.containers[0]
    assert base.image == "leoflow.test/other:1" and base.security_context.run_as_user == 50000
    assert base.resources.limits == {"memory": "128Mi"}
    assert {"TZ", "LEOFLOW_EXCHANGE_URL"} <= {e.name for e in base.env}
    assert [v.name for v in created.spec.volumes] == ["scratch", "leoflow-token"]


def test_a_non_compliant_override_is_refused_by_pod_security_and_classified_refused(core, restricted_namespace):
    settings = kube(restricted_namespace, pod_override_allow="spec.containers.securityContext")
    override = client.V1Pod(spec=client.V1PodSpec(containers=[client.V1Container(
        name="base", security_context=client.V1SecurityContext(
            run_as_user=0, capabilities=client.V1Capabilities(add=["SYS_ADMIN"])))]))
    a = attempt()
    pod = build_pod(a, settings, executor_config={"pod_override": override})
    assert pod.spec.containers[0].security_context.allow_privilege_escalation is False  # the pins still hold
    err = create_error(core, restricted_namespace, pod)
    assert err.status == 403 and "violates PodSecurity" in err.body
    verdict = classify_exception(err, pod_name=pod_name(a))
    assert verdict.kind is VerdictKind.REFUSED
    assert "violates PodSecurity" in verdict.reason and "runAsUser=0" in verdict.reason
    assert "SYS_ADMIN" in verdict.reason
    assert core.list_namespaced_pod(restricted_namespace).items == []


def _quota(core: client.CoreV1Api, namespace: str, hard: dict[str, str]) -> None:
    """Create ResourceQuota ``q`` and wait until its controller has computed its status (admission enforces it
    from then on)."""
    core.create_namespaced_resource_quota(namespace, client.V1ResourceQuota(
        metadata=client.V1ObjectMeta(name="q"), spec=client.V1ResourceQuotaSpec(hard=hard)))
    wait_for(lambda: (core.read_namespaced_resource_quota("q", namespace).status.used or {}).keys() >= hard.keys(),
             30, what="quota status")


def _dry_run_refusal(core, namespace: str, text: str, executor_config: dict | None = None) -> None:
    """Wait until a dry-run create of a fresh built pod is refused with ``text``: admission's quota cache has
    caught up (a dry run changes nothing)."""
    def refused() -> bool:
        pod = build_pod(attempt(), kube(namespace), executor_config=executor_config)
        try:
            core.create_namespaced_pod(namespace, pod, dry_run="All")
        except ApiException as e:
            return e.status == 403 and text in e.body
        return False
    wait_for(refused, 30, what=f"admission to answer {text!r}")


def test_quota_exceeded_is_backpressure(core, namespace):
    _quota(core, namespace, {"pods": "1"})
    core.create_namespaced_pod(namespace, build_pod(attempt(), kube(namespace)))
    a = attempt()
    err = create_error(core, namespace, build_pod(a, kube(namespace)))
    assert err.status == 403 and "exceeded quota: q" in err.body
    verdict = classify_exception(err, pod_name=pod_name(a))
    assert verdict.kind is VerdictKind.BACKPRESSURE and "exceeded quota" in verdict.reason


def test_a_pod_alone_over_the_quota_is_refused(core, namespace):
    _quota(core, namespace, {"limits.memory": "64Mi"})
    big = client.V1Pod(spec=client.V1PodSpec(containers=[client.V1Container(
        name="base", resources=client.V1ResourceRequirements(limits={"memory": "128Mi"}))]))
    _dry_run_refusal(core, namespace, "exceeded quota: q", {"pod_override": big})
    a = attempt()
    err = create_error(core, namespace, build_pod(a, kube(namespace), executor_config={"pod_override": big}))
    assert err.status == 403 and "exceeded quota: q" in err.body and "used: limits.memory=0" in err.body
    verdict = classify_exception(err, pod_name=pod_name(a))
    assert verdict.kind is VerdictKind.REFUSED and "this pod alone is over" in verdict.reason


def test_quota_status_unknown_is_backpressure(core, namespace):
    _quota(core, namespace, {"pods": "10"})
    # Admission answers "status unknown" for a resource in status.hard without a status.used figure (the
    # controller has not counted it yet). The quota controller ignores status-only updates (it recounts on spec
    # changes, pod replenishment and its 5-minute resync), so a status with the hard limit and no usage stays.
    quota = core.read_namespaced_resource_quota("q", namespace)
    quota.status = client.V1ResourceQuotaStatus(hard={"pods": "10"})
    core.replace_namespaced_resource_quota_status("q", namespace, quota)
    _dry_run_refusal(core, namespace, "status unknown for quota: q")
    a = attempt()
    err = create_error(core, namespace, build_pod(a, kube(namespace)))
    assert err.status == 403 and "status unknown for quota: q" in err.body
    verdict = classify_exception(err, pod_name=pod_name(a))
    assert verdict.kind is VerdictKind.BACKPRESSURE and "status unknown for quota" in verdict.reason


def test_quota_must_specify_is_refused_naming_the_quota(core, namespace):
    _quota(core, namespace, {"limits.cpu": "2"})  # admission checks what the quota's status lists
    _dry_run_refusal(core, namespace, "must specify")
    a = attempt()
    err = create_error(core, namespace, build_pod(a, kube(namespace)))
    assert err.status == 403 and "failed quota: q: must specify limits.cpu" in err.body
    verdict = classify_exception(err, pod_name=pod_name(a))
    assert verdict.kind is VerdictKind.REFUSED and "failed quota: q" in verdict.reason


def test_a_second_create_of_one_attempt_meets_its_own_pod(core, namespace):
    a = attempt()
    first = core.create_namespaced_pod(namespace, build_pod(a, kube(namespace)))
    err = create_error(core, namespace, build_pod(a, kube(namespace)))
    assert err.status == 409
    verdict = classify_exception(err, pod_name=pod_name(a))
    assert verdict.kind is VerdictKind.CHECK_EXISTING
    # the check it asks for: the pod under that name is this attempt's, with the UID of the first create
    existing = core.read_namespaced_pod(pod_name(a), namespace)
    assert is_attempt_pod(existing.metadata, a) and existing.metadata.uid == first.metadata.uid
    assert not is_attempt_pod(existing.metadata, dataclasses.replace(a, try_number=2))
    # a new epoch of the same ti_id is a new name, never this pod
    epoch2 = dataclasses.replace(a, attempt_epoch=2)
    second = core.create_namespaced_pod(namespace, build_pod(epoch2, kube(namespace)))
    assert second.metadata.name != first.metadata.name
