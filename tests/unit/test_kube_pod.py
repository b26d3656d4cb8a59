"""The pure pod builder of the Kubernetes runtime (issue 9 item 1; DESIGN §3 "Dispatch"): name, labels,
identity annotation, what leoflow pins whatever the template, the task's pod_override or the pod_mutation_hook
say, the pod_override allowlist, the termination-message budget, and no credential anywhere on the pod.

What the real kube-apiserver makes of these pods (Pod Security ``restricted``, quotas, 409) is in
``tests/k8s/test_kube_pod_admission.py``.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import re
import uuid

import pytest
from kubernetes.client import ApiClient
from kubernetes.client import models as k8s

from leoflow_agent.outcome import MIN_TERMINATION_MESSAGE_BUDGET
from leoflow_airflow import settings as leoflow_settings
from leoflow_airflow.errors import PodRefused
from leoflow_airflow.ledger.states import AttemptRef
from leoflow_airflow.runtime.kubernetes import pod as pods
from leoflow_airflow.runtime.kubernetes.identity import (
    IDENTITY_ANNOTATION,
    identity_annotation,
    parse_identity_annotation,
)
from leoflow_airflow.runtime.kubernetes.pod import PodAttempt, build_pod

TI = "0190b6c2-7a1e-7000-8000-00000000abcd"
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
INSTANCE = "blue"  # [leoflow] instance


def kube(**overrides: str) -> leoflow_settings.KubernetesSettings:
    """KubernetesSettings as ``load_kubernetes`` gives them for these ``[leoflow]`` values (image and exchange
    URL set)."""
    values = {"image": "registry.example/leoflow:1", "exchange_url": "https://airflow.example/leoflow",
              "instance": INSTANCE, **overrides}
    return leoflow_settings.load_kubernetes(lambda section, key, fallback: values.get(key, fallback))


def attempt(**kw) -> PodAttempt:
    base = dict(ti_id=TI, try_number=1, attempt_epoch=1, dag_id="etl", task_id="load",
                run_id="manual__2026-01-01T00:00:00+00:00", map_index=-1)
    return PodAttempt(**{**base, **kw})


def as_json(pod: k8s.V1Pod) -> dict:
    return ApiClient().sanitize_for_serialization(pod)


def agent(pod: k8s.V1Pod) -> k8s.V1Container:
    return pod.spec.containers[0]


def env_of(container: k8s.V1Container) -> dict[str, str]:
    return {e.name: e.value for e in container.env or []}


def override(*, spec: dict | None = None, containers: list[k8s.V1Container] | None = None,
             metadata: k8s.V1ObjectMeta | None = None) -> dict:
    """An executor_config with a pod_override."""
    return {"pod_override": k8s.V1Pod(metadata=metadata, spec=k8s.V1PodSpec(containers=containers or [], **(spec or {})))}


# --------------------------------------------------------------------------------------------------
# name, labels, identity


def test_pod_name_is_deterministic_per_ti_id_and_epoch_and_a_dns_label():
    a = attempt()
    assert pods.pod_name(a) == pods.pod_name(attempt()) == "etl-load-0190b6c27a1e7000800000000000abcd-1"
    assert pods.pod_name(attempt(attempt_epoch=2)) != pods.pod_name(a)
    assert pods.pod_name(attempt(try_number=2)) == pods.pod_name(a)  # a new try is a new ti_id in Airflow
    other_ti = pods.pod_name(attempt(ti_id=str(uuid.uuid4())))
    assert other_ti != pods.pod_name(a)
    for dag, task in [("x" * 250, "y" * 250), ("Ünïcödé_DAG", "T.ask__1"), ("___", "..."), ("日本", "タスク")]:
        name = pods.pod_name(attempt(dag_id=dag, task_id=task, attempt_epoch=2**31 - 1))
        assert len(name) <= 63 and DNS_LABEL.fullmatch(name), name
    assert pods.pod_name(attempt(dag_id="日本", task_id="タスク")).startswith("leoflow-")
    with pytest.raises(ValueError):
        pods.pod_name(attempt(ti_id="not-a-uuid"))


def test_labels_are_valid_and_hashed_when_cut_and_the_annotation_keeps_the_whole_identity():
    """Labels fit (hashed when cut); the identity annotation is the exchange's one format
    (``identity.identity_annotation``), naming the attempt unabridged whatever the DAG, task and run ids, and
    ``is_attempt_pod`` reads it back as the exchange's parser does."""
    long_a, long_b = "d" * 80 + "a", "d" * 80 + "b"  # differ only past the cut
    a = attempt(dag_id=long_a, run_id="scheduled__2026-01-01T00:00:00+00:00", map_index=3)
    labels = pods.attempt_labels(a, instance=INSTANCE)
    for key, value in labels.items():
        assert len(value) <= 63 and LABEL_VALUE.fullmatch(value), (key, value)
    assert labels["app.kubernetes.io/managed-by"] == "leoflow"
    assert labels["app.kubernetes.io/name"] == "leoflow"
    assert labels["leoflow.io/ti-id"] == TI
    assert (labels["leoflow.io/try-number"], labels["leoflow.io/attempt-epoch"]) == ("1", "1")
    assert labels["leoflow.io/map-index"] == "3"
    other = pods.attempt_labels(attempt(dag_id=long_b), instance=INSTANCE)
    assert labels["leoflow.io/dag-id"] != other["leoflow.io/dag-id"]
    assert pods.label_value("etl") == "etl"  # a valid value is kept as it is
    assert "leoflow.io/map-index" not in pods.attempt_labels(attempt(), instance=INSTANCE)  # "-1" is no label value

    pod = build_pod(a, kube())
    value = pod.metadata.annotations[IDENTITY_ANNOTATION]
    assert json.loads(value) == {"ti_id": TI, "try_number": 1, "attempt_epoch": 1}
    assert value == identity_annotation(AttemptRef(TI, 1, 1)) and parse_identity_annotation(value) == a.ref
    unicode_ids = attempt(dag_id="日本" * 125, task_id="タスク" * 83, run_id="ü" * 250)  # Airflow's longest ids
    assert parse_identity_annotation(build_pod(unicode_ids, kube()).metadata.annotations[IDENTITY_ANNOTATION]) \
        == unicode_ids.ref
    assert pod.metadata.labels.items() >= labels.items()
    assert (pod.metadata.name, pod.metadata.namespace) == (pods.pod_name(a), "default")
    assert pods.is_attempt_pod(pod.metadata, a)
    assert pods.is_attempt_pod(pod.metadata, dataclasses.replace(a, ti_id=uuid.UUID(TI).hex.upper()))
    for other in (dataclasses.replace(a, try_number=2), dataclasses.replace(a, attempt_epoch=2),
                  dataclasses.replace(a, ti_id=str(uuid.uuid4()))):
        assert not pods.is_attempt_pod(pod.metadata, other)
    assert not pods.is_attempt_pod(None, a)


# --------------------------------------------------------------------------------------------------
# what the pod carries


def test_the_plain_pod_is_restricted_credential_free_and_runs_the_agent():
    pod = build_pod(attempt(), kube(namespace="tasks", service_account="leoflow-task"))
    spec, base = pod.spec, agent(pod)
    assert spec.restart_policy == "Never"
    assert spec.automount_service_account_token is False
    assert spec.service_account_name == "leoflow-task"
    assert pod.metadata.namespace == "tasks"
    assert spec.security_context.run_as_non_root is True
    assert spec.security_context.seccomp_profile.type == "RuntimeDefault"
    sc = base.security_context
    assert (sc.allow_privilege_escalation, sc.privileged, sc.capabilities.drop) == (False, False, ["ALL"])
    assert base.name == "base" and base.args == ["python", "-m", "leoflow_agent", "pod"]
    assert base.command is None  # the image's entrypoint, as under KE
    assert base.image == "registry.example/leoflow:1"
    assert (base.termination_message_path, base.termination_message_policy) == ("/dev/termination-log", "File")
    assert env_of(base) == {
        "LEOFLOW_EXCHANGE_URL": "https://airflow.example/leoflow",
        "LEOFLOW_TOKEN_FILE": "/var/run/secrets/leoflow/token",
        "LEOFLOW_TERMINATION_MESSAGE_BUDGET": "4096",
        "LEOFLOW_CREDENTIAL_CEILING_SECONDS": "604800",
        "LEOFLOW_AGENT_LEASE_SECONDS": "45",
    }
    [vol] = spec.volumes
    [src] = vol.projected.sources
    tok = src.service_account_token
    assert (tok.audience, tok.expiration_seconds, tok.path) == ("urn:leoflow:exchange", 600, "token")
    assert tok.expiration_seconds >= 600
    [mount] = base.volume_mounts
    assert (mount.name, mount.mount_path, mount.read_only) == (vol.name, "/var/run/secrets/leoflow", True)
    assert spec.active_deadline_seconds == 604800
    text = json.dumps(as_json(pod))
    assert not re.search(r"eyJ[A-Za-z0-9_-]{10,}", text)  # no JWT
    for needle in ("sql_alchemy", "SQL_ALCHEMY", "fernet", "FERNET", "jwt_secret", "JWT_SECRET", "postgresql://",
                   '"workload"', "ExecuteTask", "--json-string"):
        assert needle not in text


def test_a_template_cannot_change_what_leoflow_pins_but_keeps_everything_else():
    template = k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(name="tmpl", namespace="elsewhere", labels={"team": "data", "leoflow.io/ti-id": "x"},
                                  annotations={"note": "kept"}),
        spec=k8s.V1PodSpec(
            node_name="harness-node", restart_policy="OnFailure", automount_service_account_token=True,
            service_account_name="admin", host_network=False, active_deadline_seconds=10**9,
            security_context=k8s.V1PodSecurityContext(run_as_non_root=False, run_as_user=50000, fs_group=0,
                                                      seccomp_profile=k8s.V1SeccompProfile(type="Unconfined")),
            containers=[k8s.V1Container(
                name="main", command=["/usr/bin/env", "PATH=/venv/bin"], args=["sleep", "inf"],
                termination_message_path="/tmp/msg", termination_message_policy="FallbackToLogsOnError",
                env=[k8s.V1EnvVar(name="TZ", value="UTC"), k8s.V1EnvVar(name="LEOFLOW_TOKEN_FILE", value="/x")],
                security_context=k8s.V1SecurityContext(privileged=True, allow_privilege_escalation=True,
                                                       run_as_non_root=False,
                                                       capabilities=k8s.V1Capabilities(add=["NET_BIND_SERVICE"]),
                                                       seccomp_profile=k8s.V1SeccompProfile(type="Unconfined")),
                volume_mounts=[k8s.V1VolumeMount(name="scratch", mount_path="/scratch")])],
            volumes=[k8s.V1Volume(name="scratch", empty_dir=k8s.V1EmptyDirVolumeSource())]))
    before = copy.deepcopy(template)
    pod = build_pod(attempt(), kube())
    got = build_pod(attempt(), kube(), template=template)
    assert template == before  # not modified

    assert (got.metadata.name, got.metadata.namespace) == (pod.metadata.name, "default")
    assert got.metadata.labels["team"] == "data" and got.metadata.labels["leoflow.io/ti-id"] == TI
    assert got.metadata.annotations["note"] == "kept"
    spec, base = got.spec, agent(got)
    assert spec.node_name == "harness-node"
    assert (spec.restart_policy, spec.automount_service_account_token, spec.service_account_name) == (
        "Never", False, "default")
    assert spec.active_deadline_seconds == 604800  # clamped to the ceiling
    assert spec.security_context.run_as_non_root is True and spec.security_context.run_as_user == 50000
    assert spec.security_context.seccomp_profile.type == "RuntimeDefault"
    assert base.name == "base" and base.command == ["/usr/bin/env", "PATH=/venv/bin"]
    assert base.args == list(pods.AGENT_ARGS)
    assert (base.termination_message_path, base.termination_message_policy) == ("/dev/termination-log", "File")
    sc = base.security_context
    assert (sc.privileged, sc.allow_privilege_escalation, sc.run_as_non_root) == (False, False, True)
    assert sc.capabilities.drop == ["ALL"] and sc.capabilities.add == ["NET_BIND_SERVICE"]  # admission judges adds
    assert sc.seccomp_profile is None  # the pod's RuntimeDefault applies
    assert env_of(base)["TZ"] == "UTC" and env_of(base)["LEOFLOW_TOKEN_FILE"] == "/var/run/secrets/leoflow/token"
    assert [e.name for e in base.env].count("LEOFLOW_TOKEN_FILE") == 1
    assert [v.name for v in spec.volumes] == ["scratch", "leoflow-token"]
    assert [m.mount_path for m in base.volume_mounts] == ["/scratch", "/var/run/secrets/leoflow"]


def test_active_deadline_is_the_ceiling_unless_a_layer_asks_for_less():
    short = k8s.V1Pod(spec=k8s.V1PodSpec(containers=[k8s.V1Container(name="b")], active_deadline_seconds=900))
    assert build_pod(attempt(), kube(credential_ceiling_seconds="3600")).spec.active_deadline_seconds == 3600
    assert build_pod(attempt(), kube(credential_ceiling_seconds="3600"), template=short).spec.active_deadline_seconds == 900
    assert build_pod(attempt(), kube(credential_ceiling_seconds="0")).spec.active_deadline_seconds is None
    assert build_pod(attempt(), kube(credential_ceiling_seconds="0"), template=short).spec.active_deadline_seconds == 900
    cfg = override(spec={"active_deadline_seconds": 10**8}, containers=[k8s.V1Container(name="base")])
    got = build_pod(attempt(), kube(credential_ceiling_seconds="3600", pod_override_allow="spec.activeDeadlineSeconds"),
                    executor_config=cfg)
    assert got.spec.active_deadline_seconds == 3600
    assert env_of(agent(got))["LEOFLOW_CREDENTIAL_CEILING_SECONDS"] == "3600"


def test_the_agent_gets_its_lease_from_the_scheduler_settings():
    """k8s review §14: ``[leoflow] agent_lease_seconds`` reaches every task pod's agent (warm pods are built by the
    same builder), and a template or override cannot set another."""
    cfg = override(containers=[k8s.V1Container(name="base", env=[k8s.V1EnvVar(name="LEOFLOW_AGENT_LEASE_SECONDS",
                                                                                value="100000")])])
    got = build_pod(attempt(), kube(agent_lease_seconds="30", pod_override_allow="spec.containers"),
                    executor_config=cfg)
    assert [e.value for e in agent(got).env if e.name == "LEOFLOW_AGENT_LEASE_SECONDS"] == ["30"]


# --------------------------------------------------------------------------------------------------
# pod_override: merged like KE, under the allowlist


def test_pod_override_merges_like_the_kubernetes_executor():
    template = k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(labels={"team": "data", "tier": "t"}),
        spec=k8s.V1PodSpec(node_selector={"pool": "a"}, containers=[k8s.V1Container(
            name="base", image="template/image:1", env=[k8s.V1EnvVar(name="A", value="template")],
            resources=k8s.V1ResourceRequirements(requests={"cpu": "100m"}))]))
    cfg = override(
        metadata=k8s.V1ObjectMeta(labels={"tier": "gold"}, annotations={"x": "y"}),
        spec={"node_selector": {"pool": "b"}, "tolerations": [k8s.V1Toleration(key="k", operator="Exists")]},
        containers=[k8s.V1Container(name="whatever", image="task/image:2",
                                    env=[k8s.V1EnvVar(name="B", value="override")],
                                    resources=k8s.V1ResourceRequirements(limits={"memory": "1Gi"}))])
    before = copy.deepcopy(cfg)
    got = build_pod(attempt(), kube(), template=template, executor_config=cfg)
    assert cfg == before
    assert got.metadata.labels["team"] == "data" and got.metadata.labels["tier"] == "gold"  # key by key
    assert got.metadata.annotations["x"] == "y"
    assert got.spec.node_selector == {"pool": "b"}  # replaced whole
    assert [t.key for t in got.spec.tolerations] == ["k"]
    base = agent(got)
    assert base.name == "base"  # merged by position; leoflow names it
    assert base.image == "task/image:2"  # override > leoflow's image > template's
    assert [e.name for e in base.env][:2] == ["A", "B"]  # concatenated
    assert base.resources.limits == {"memory": "1Gi"} and base.resources.requests is None  # replaced whole
    no_override = build_pod(attempt(), kube(), template=template)
    assert agent(no_override).image == "registry.example/leoflow:1"  # leoflow's layer comes after the template
    assert agent(no_override).resources.requests == {"cpu": "100m"}


@pytest.mark.parametrize(("cfg", "field"), [
    (override(spec={"host_network": True}, containers=[k8s.V1Container(name="base")]), "spec.hostNetwork"),
    (override(containers=[k8s.V1Container(name="base", command=["sh", "-c", "id"])]), "spec.containers.command"),
    (override(containers=[k8s.V1Container(name="base", security_context=k8s.V1SecurityContext(run_as_user=0))]),
     "spec.containers.securityContext.runAsUser"),
    (override(spec={"volumes": [k8s.V1Volume(name="h", host_path=k8s.V1HostPathVolumeSource(path="/"))]},
              containers=[k8s.V1Container(name="base")]), "spec.volumes.hostPath.path"),
    (override(spec={"service_account_name": "admin"}, containers=[k8s.V1Container(name="base")]),
     "spec.serviceAccountName"),
    (override(metadata=k8s.V1ObjectMeta(namespace="kube-system"), containers=[k8s.V1Container(name="base")]),
     "metadata.namespace"),
    (override(containers=[k8s.V1Container(name="base"), k8s.V1Container(name="sidecar", image="s")]),
     "spec.containers"),
    ({"pod_override": {"spec": {}}}, "executor_config.pod_override"),
    ({"pod_template_file": "/x.yaml"}, "executor_config.pod_template_file"),
    ({"KubernetesExecutor": {"image": "x"}}, "executor_config.KubernetesExecutor"),
    ("pod_override", "executor_config"),
])
def test_a_forbidden_override_is_refused_naming_the_field(cfg, field):
    with pytest.raises(PodRefused) as err:
        build_pod(attempt(), kube(), executor_config=cfg)
    assert err.value.field == field
    assert field in str(err.value)


def test_the_allowlist_lets_an_operator_open_more():
    cfg = override(spec={"host_network": True},
                   containers=[k8s.V1Container(name="base"), k8s.V1Container(name="sidecar", image="s")])
    got = build_pod(attempt(), kube(pod_override_allow="spec.hostNetwork, spec.containers"), executor_config=cfg)
    assert got.spec.host_network is True  # left for Pod Security admission to judge
    assert [c.name for c in got.spec.containers] == ["base", "sidecar"]
    side = got.spec.containers[1]
    assert side.security_context.allow_privilege_escalation is False and side.security_context.capabilities.drop == ["ALL"]
    assert not side.volume_mounts and side.env is None  # the token and leoflow's env are the agent's alone
    typed = {"pod_override": k8s.V1Pod(api_version="v1", kind="Pod", spec=k8s.V1PodSpec(containers=[]))}
    assert build_pod(attempt(), kube(), executor_config=typed) == build_pod(attempt(), kube())
    assert build_pod(attempt(), kube(), executor_config={}) == build_pod(attempt(), kube())
    assert build_pod(attempt(), kube(), executor_config={"other_executor": 1}) == build_pod(attempt(), kube())


# --------------------------------------------------------------------------------------------------
# pod_mutation_hook


def test_the_mutation_hook_runs_after_the_override_and_cannot_undo_the_pins():
    seen = {}

    def hook(pod: k8s.V1Pod) -> None:
        seen["image"] = pod.spec.containers[0].image
        seen["args"] = list(pod.spec.containers[0].args)
        pod.metadata.labels["cost-center"] = "42"
        pod.spec.priority_class_name = "batch"
        pod.spec.restart_policy = "Always"
        pod.spec.automount_service_account_token = True
        pod.spec.containers[0].termination_message_path = "/elsewhere"
        pod.spec.containers[0].security_context = None
        pod.spec.volumes = []

    cfg = override(containers=[k8s.V1Container(name="base", image="task/image:2")])
    got = build_pod(attempt(), kube(), executor_config=cfg, mutation_hook=hook)
    assert seen == {"image": "task/image:2", "args": list(pods.AGENT_ARGS)}
    assert got.metadata.labels["cost-center"] == "42" and got.spec.priority_class_name == "batch"
    assert (got.spec.restart_policy, got.spec.automount_service_account_token) == ("Never", False)
    assert agent(got).termination_message_path == "/dev/termination-log"
    assert agent(got).security_context.allow_privilege_escalation is False
    assert [v.name for v in got.spec.volumes] == ["leoflow-token"]


def test_a_hook_that_raises_refuses_the_pod():
    def hook(pod):
        raise RuntimeError("policy says no")

    with pytest.raises(PodRefused) as err:
        build_pod(attempt(), kube(), mutation_hook=hook)
    assert err.value.field == "pod_mutation_hook" and "RuntimeError: policy says no" in str(err.value)


# --------------------------------------------------------------------------------------------------
# refusals no pin can mend


def test_termination_budget_follows_the_final_container_count():
    def with_containers(n: int, init: int = 0) -> k8s.V1Pod:
        return k8s.V1Pod(spec=k8s.V1PodSpec(
            containers=[k8s.V1Container(name=f"c{i}", image="i") for i in range(n)],
            init_containers=[k8s.V1Container(name=f"i{i}", image="i") for i in range(init)] or None))

    assert env_of(agent(build_pod(attempt(), kube())))["LEOFLOW_TERMINATION_MESSAGE_BUDGET"] == "4096"
    three = build_pod(attempt(), kube(), template=with_containers(3))  # 12288 / (3 + 1 reserve)
    assert env_of(agent(three))["LEOFLOW_TERMINATION_MESSAGE_BUDGET"] == "3072"
    seven = build_pod(attempt(), kube(), template=with_containers(5, init=2))
    assert env_of(agent(seven))["LEOFLOW_TERMINATION_MESSAGE_BUDGET"] == str(12288 // 8)
    assert 12288 // 8 >= MIN_TERMINATION_MESSAGE_BUDGET
    with pytest.raises(PodRefused) as err:
        build_pod(attempt(), kube(), template=with_containers(6, init=2))
    assert err.value.field == "spec.containers" and str(12288 // 9) in str(err.value)

    def add_two(pod):  # the count is taken after the hook
        pod.spec.containers += [k8s.V1Container(name="x", image="i"), k8s.V1Container(name="y", image="i")]

    hooked = build_pod(attempt(), kube(), mutation_hook=add_two)
    assert env_of(agent(hooked))["LEOFLOW_TERMINATION_MESSAGE_BUDGET"] == "3072"


@pytest.mark.parametrize("name", ["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "AIRFLOW__CORE__FERNET_KEY_CMD",
                                  "AIRFLOW__API_AUTH__JWT_SECRET", "airflow__api_auth__jwt_private_key_path",
                                  "AIRFLOW__TEAM1___DATABASE__SQL_ALCHEMY_CONN_SECRET"])
def test_airflow_own_secrets_in_the_pod_environment_are_refused(name):
    from_template = k8s.V1Pod(spec=k8s.V1PodSpec(containers=[k8s.V1Container(
        name="base", env=[k8s.V1EnvVar(name=name, value="postgresql://u:p@db/airflow")])]))
    with pytest.raises(PodRefused) as err:
        build_pod(attempt(), kube(), template=from_template)
    assert err.value.field == "spec.containers.env" and name in str(err.value)
    from_override = override(containers=[k8s.V1Container(name="base", env=[k8s.V1EnvVar(
        name=name, value_from=k8s.V1EnvVarSource(secret_key_ref=k8s.V1SecretKeySelector(name="s", key="k")))])])
    with pytest.raises(PodRefused):
        build_pod(attempt(), kube(), executor_config=from_override)


def test_a_second_service_account_token_is_refused():
    template = k8s.V1Pod(spec=k8s.V1PodSpec(containers=[k8s.V1Container(name="base")], volumes=[
        k8s.V1Volume(name="vault", projected=k8s.V1ProjectedVolumeSource(sources=[k8s.V1VolumeProjection(
            service_account_token=k8s.V1ServiceAccountTokenProjection(audience="vault", path="t"))]))]))
    with pytest.raises(PodRefused) as err:
        build_pod(attempt(), kube(), template=template)
    assert err.value.field == "spec.volumes" and "'vault'" in str(err.value)
    # a template volume named like leoflow's is replaced, not doubled
    own = k8s.V1Pod(spec=k8s.V1PodSpec(containers=[k8s.V1Container(name="base")], volumes=[
        k8s.V1Volume(name="leoflow-token", projected=k8s.V1ProjectedVolumeSource(sources=[k8s.V1VolumeProjection(
            service_account_token=k8s.V1ServiceAccountTokenProjection(audience="other", path="t"))]))]))
    [vol] = build_pod(attempt(), kube(), template=own).spec.volumes
    assert vol.projected.sources[0].service_account_token.audience == "urn:leoflow:exchange"


# --------------------------------------------------------------------------------------------------
# Secrets (k8s review §9)


def _secret_env(name: str, secret: str, key: str = "k") -> k8s.V1EnvVar:
    return k8s.V1EnvVar(name=name, value_from=k8s.V1EnvVarSource(
        secret_key_ref=k8s.V1SecretKeySelector(name=secret, key=key)))


def test_a_pod_never_carries_a_secret_reference_leoflow_did_not_allow():
    """Every route by which a Secret reaches a container is refused, naming the field, when a pod_override or a
    hook brings it in, unless ``[leoflow] pod_secret_allow`` names the Secret; the operator's template keeps its
    own (the README's remote-logging credentials). The exchange token is the agent container's alone, and
    ``agent_env_deny`` holds for pod environments too."""
    wide = "spec.containers, spec.initContainers, spec.volumes"

    def refused(field: str, **kw) -> PodRefused:
        with pytest.raises(PodRefused) as err:
            build_pod(attempt(), kw.pop("cfg", kube(pod_override_allow=wide)), **kw)
        assert err.value.field == field, err.value
        return err.value

    # a DAG author's pod_override, by each route (the default allowlist already lets env through)
    env_ref = override(containers=[k8s.V1Container(name="base", env=[_secret_env("DB", "prod-db", "password")])])
    err = refused("spec.containers.env.valueFrom.secretKeyRef", cfg=kube(), executor_config=env_ref)
    assert "'prod-db'" in str(err) and "pod_secret_allow" in str(err)
    env_from = override(containers=[k8s.V1Container(name="base", env_from=[
        k8s.V1EnvFromSource(secret_ref=k8s.V1SecretEnvSource(name="airflow-secrets"))])])
    refused("spec.containers.envFrom.secretRef", executor_config=env_from)
    sa_token = override(spec={"volumes": [k8s.V1Volume(name="legacy", secret=k8s.V1SecretVolumeSource(
        secret_name="default-token-abcde"))]}, containers=[k8s.V1Container(name="base")])
    refused("spec.volumes.secret", executor_config=sa_token)
    projected = override(spec={"volumes": [k8s.V1Volume(name="p", projected=k8s.V1ProjectedVolumeSource(sources=[
        k8s.V1VolumeProjection(secret=k8s.V1SecretProjection(name="prod-db"))]))]},
        containers=[k8s.V1Container(name="base")])
    refused("spec.volumes.projected.sources.secret", executor_config=projected)
    init = override(spec={"init_containers": [k8s.V1Container(name="fetch", image="i", env=[
        _secret_env("DB", "prod-db")])]}, containers=[k8s.V1Container(name="base")])
    refused("spec.initContainers.env.valueFrom.secretKeyRef", executor_config=init)

    # hooks get no more than an override
    def hook(pod):
        pod.spec.init_containers = [k8s.V1Container(name="x", image="i", env_from=[
            k8s.V1EnvFromSource(secret_ref=k8s.V1SecretEnvSource(name="prod-db"))])]

    refused("spec.initContainers.envFrom.secretRef", mutation_hook=hook)

    def plugin(pod, _attempt):
        pod.spec.volumes.append(k8s.V1Volume(name="s", secret=k8s.V1SecretVolumeSource(secret_name="prod-db")))

    refused("spec.volumes.secret", plugin_hook=plugin)

    # the operator's allowlist, by Secret name
    allowed = kube(pod_secret_allow="prod-db")
    got = build_pod(attempt(), allowed, executor_config=env_ref)
    assert [e.value_from.secret_key_ref.name for e in agent(got).env if e.value_from] == ["prod-db"]
    build_pod(attempt(), allowed, plugin_hook=plugin)
    refused("spec.containers.envFrom.secretRef", cfg=kube(pod_override_allow=wide, pod_secret_allow="prod-db"),
            executor_config=env_from)

    # the template's references are the operator's; an override may not point them elsewhere
    template = k8s.V1Pod(spec=k8s.V1PodSpec(containers=[k8s.V1Container(
        name="base", env=[_secret_env("AWS_SECRET_ACCESS_KEY", "leoflow-logs", "secret")])]))
    got = build_pod(attempt(), kube(), template=template)
    assert agent(got).env[0].value_from.secret_key_ref.name == "leoflow-logs"
    other_key = override(containers=[k8s.V1Container(name="base", env=[
        _secret_env("AWS_SECRET_ACCESS_KEY", "leoflow-logs", "admin-key")])])
    refused("spec.containers.env.valueFrom.secretKeyRef", cfg=kube(), template=template, executor_config=other_key)

    # the exchange token: the agent container's alone, whichever layer adds the mount
    mount = [k8s.V1VolumeMount(name="leoflow-token", mount_path="/t")]
    sidecar = k8s.V1Pod(spec=k8s.V1PodSpec(containers=[k8s.V1Container(name="base"),
                                                       k8s.V1Container(name="side", image="i", volume_mounts=mount)]))
    err = refused("spec.containers.volumeMounts", template=sidecar)
    assert "'side'" in str(err)
    init_mount = k8s.V1Pod(spec=k8s.V1PodSpec(containers=[k8s.V1Container(name="base")], init_containers=[
        k8s.V1Container(name="first", image="i", volume_mounts=mount)]))
    refused("spec.initContainers.volumeMounts", template=init_mount)

    # [leoflow] agent_env_deny holds for pods as for Lite agents; a denied forwarded variable is left out
    vault = k8s.V1Pod(spec=k8s.V1PodSpec(containers=[k8s.V1Container(
        name="base", env=[k8s.V1EnvVar(name="VAULT_TOKEN", value="s.xyz")])]))
    err = refused("spec.containers.env", cfg=kube(agent_env_deny="VAULT_*"), template=vault)
    assert "VAULT_TOKEN" in str(err) and "agent_env_deny" in str(err)
    assert "VAULT_TOKEN" in env_of(agent(build_pod(attempt(), kube(), template=vault)))
    forwarded = build_pod(attempt(), kube(agent_env_deny="VAULT_*"), forward_env={"VAULT_ADDR": "x", "TZ": "UTC"})
    assert "VAULT_ADDR" not in env_of(agent(forwarded)) and env_of(agent(forwarded))["TZ"] == "UTC"


def test_every_task_pod_carries_its_installations_label_and_no_layer_changes_it():
    """k8s review §5: the pod is labelled ``leoflow.io/instance=<[leoflow] instance>``, the label the runtime's
    informer selects on, so two installations sharing the namespace never see each other's pods. A template's or a
    hook's value is replaced by leoflow's; a ``pod_override`` that names another installation is refused."""
    template = k8s.V1Pod(metadata=k8s.V1ObjectMeta(labels={"leoflow.io/instance": "green", "team": "a"}),
                         spec=k8s.V1PodSpec(containers=[k8s.V1Container(name="base")]))

    def hook(p):
        p.metadata.labels["leoflow.io/instance"] = "green"

    for pod in (build_pod(attempt(), kube()), build_pod(attempt(), kube(), template=template, mutation_hook=hook),
                build_pod(attempt(), kube(), plugin_hook=lambda p, a: hook(p))):
        assert pod.metadata.labels["leoflow.io/instance"] == INSTANCE
    assert build_pod(attempt(), kube(instance="green")).metadata.labels["leoflow.io/instance"] == "green"
    override = {"pod_override": k8s.V1Pod(metadata=k8s.V1ObjectMeta(labels={"leoflow.io/instance": "green"}))}
    with pytest.raises(PodRefused) as err:
        build_pod(attempt(), kube(), executor_config=override)
    assert err.value.field == "metadata.labels.leoflow.io/instance"
