"""leoflow's finalizer on the real kube-apiserver (issue 10 item 4): a task pod deleted -- by a user with
``--grace-period=0 --force``, by PodGC, by a kill -- stays readable (terminal, ``deletionTimestamp`` set, its
termination message intact) until the ``KubernetesRuntime`` has read its record and the attempt is closed; then
the runtime takes the finalizer off and the pod goes. ``airflow leoflow release-pods`` strips it from every
leoflow pod so a namespace can be deleted.

Pods run on kwok nodes (``kwok.leoflow.test/*`` annotations: tests/k8s/README.md) or on the node harness, which
stops a deleted pod, writes its terminal status and deletes it with grace 0, as a kubelet does.
"""

from __future__ import annotations

import sys
import uuid
from types import SimpleNamespace

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from leoflow_agent import outcome
from leoflow_airflow import cli
from leoflow_airflow import settings as leoflow_settings
from leoflow_airflow.lifecycle.runtime import Exited, Presence, Started, launch_id
from leoflow_airflow.runtime.kubernetes.finalizer import ReleaseOutcome, release_finalizer
from leoflow_airflow.runtime.kubernetes.pod import OUTCOME_FINALIZER, PodAttempt, build_pod

from .conftest import HARNESS_NODE, wait_for
from .test_kube_runtime import TEMPLATE, attempt, make_runtime, new_ref  # noqa: F401 - make_runtime: a fixture

pytestmark = pytest.mark.k8s


def _kube(namespace: str, k8s_env, **more: str) -> leoflow_settings.KubernetesSettings:
    """The ``[leoflow]`` Kubernetes options ``make_runtime`` gives its runtime (``more``: other options)."""
    conf = {"image": "registry.example/leoflow:test", "exchange_url": "http://127.0.0.1:9/leoflow",
            "namespace": namespace, "in_cluster": "False", "kube_config": str(k8s_env.kubeconfig), **more}
    return leoflow_settings.load_kubernetes(lambda section, key, fallback: conf.get(key, fallback))


def _success_record(ref) -> tuple[outcome.OutcomeRecord, str]:
    record = outcome.record_for_state("success", {"state": "success", "end_date": "2026-12-01T00:00:00Z",
                                                  "task_outlets": [], "outlet_events": []},
                                      attempt=outcome.AttemptIdentity(ref.ti_id, 1, ref.attempt_epoch),
                                      api_version="2025-09-23")
    return record, outcome.encode(record)


def _kwok_pod(ref, kube, annotations: dict[str, str]) -> client.V1Pod:
    """The attempt's pod as the runtime builds it, on ``kwok-node-0``, finishing as ``annotations`` say."""
    template = client.V1Pod(metadata=client.V1ObjectMeta(annotations=annotations),
                            spec=client.V1PodSpec(node_name="kwok-node-0", containers=[
                                client.V1Container(name="base", image="registry.example/leoflow:test")]))
    return build_pod(PodAttempt(ref.ti_id, ref.try_number, ref.attempt_epoch, "dag", "task", "run"), kube,
                     template=template)


def _pods(core, namespace: str) -> dict[str, client.V1Pod]:
    return {p.metadata.uid: p for p in core.list_namespaced_pod(namespace).items}


def _ended_and_force_deleted(core, namespace: str, pod: client.V1Pod) -> client.V1Pod:
    """Create ``pod``, wait until it Succeeded, delete it with grace 0 (``kubectl delete --force
    --grace-period=0``, PodGC); return what is left of it (None: nothing)."""
    created = core.create_namespaced_pod(namespace, pod)
    wait_for(lambda: core.read_namespaced_pod(created.metadata.name, namespace).status.phase == "Succeeded", 30,
             what="the pod to succeed")
    core.delete_namespaced_pod(created.metadata.name, namespace, body=client.V1DeleteOptions(
        grace_period_seconds=0, preconditions=client.V1Preconditions(uid=created.metadata.uid)))
    return _pods(core, namespace).get(created.metadata.uid) or created


def test_a_success_force_deleted_before_the_runtime_read_it_is_kept_until_it_is_settled(
        make_runtime, namespace, core, k8s_env):
    """A pod that Succeeded with its record and was force-deleted (grace 0) while no runtime watched (the
    scheduler down: its successor starts after the delete) is still there, terminal and deleting, its record
    intact. The successor adopts the attempt: GONE, Exited 0, the record is the evidence; the finalizer stays
    while the attempt is open and comes off once it is closed; the pod then goes. A second release is a no-op.

    Without the finalizer the same delete takes the pod, and with it the record, at once: the successor finds
    no evidence (what the finalizer is for)."""
    kube = _kube(namespace, k8s_env)
    ref = new_ref()
    record, message = _success_record(ref)
    kept = _ended_and_force_deleted(core, namespace, _kwok_pod(ref, kube, {
        "kwok.leoflow.test/exit-code": "0", "kwok.leoflow.test/message": message}))
    name, uid = kept.metadata.name, kept.metadata.uid
    assert uid in _pods(core, namespace), "the finalizer did not keep the force-deleted pod"
    assert kept.metadata.deletion_timestamp is not None and kept.metadata.finalizers == [OUTCOME_FINALIZER]
    assert kept.status.container_statuses[0].state.terminated.message == message

    bare = new_ref()
    lost = _kwok_pod(bare, kube, {"kwok.leoflow.test/exit-code": "0",
                                  "kwok.leoflow.test/message": _success_record(bare)[1]})
    lost.metadata.finalizers = []
    lost_uid = _ended_and_force_deleted(core, namespace, lost).metadata.uid
    assert lost_uid not in _pods(core, namespace)

    d = make_runtime(namespace)  # the successor: its informer starts now, after the delete
    row = attempt(ref, Started(launch_id(ref), {"pod_name": name, "pod_uid": uid}))
    lost_row = attempt(bare, Started(launch_id(bare), {"pod_name": lost.metadata.name, "pod_uid": lost_uid}))
    d.call("adopt", row)
    assert d.poll_until(lambda e: e.launch_id == launch_id(ref), 30, "the adopted pod's end") == \
        Exited(launch_id(ref), 0)
    assert d.call("observe", [row])[ref] is Presence.GONE
    assert d.call("evidence", row).record == record
    wait_for(lambda: d.call("observe", [lost_row])[bare] is Presence.GONE, 30, what="the bare pod to read gone")
    assert d.call("evidence", lost_row).record is None  # its record went with it

    assert d.call("collect", lambda ti_id, epoch: False) == 0  # open: the finalizer stays
    d.call("forget", ref)  # the lifecycle settled it SUCCESS from the record and closed the row
    assert d.call("collect", lambda ti_id, epoch: (ti_id, epoch) == (ref.ti_id, 1)) == 1
    wait_for(lambda: uid not in _pods(core, namespace), 30, what="the released pod to go")
    assert release_finalizer(core, namespace, name, uid).outcome is ReleaseOutcome.GONE  # idempotent
    assert d.call("collect", lambda ti_id, epoch: True) == 0


def test_a_pod_the_node_harness_stops_on_delete_stays_terminating_until_released(namespace, core, harness,
                                                                                  k8s_env):
    """A running task pod on the node harness deleted with a grace period: the harness stops its process,
    writes its terminal status and deletes it with grace 0, as a kubelet does; the finalizer keeps it,
    ``Failed`` with the container's exit and ``Terminating``, until released (twice: the second is a no-op)."""
    kube = _kube(namespace, k8s_env)
    ref = new_ref()
    template = client.V1Pod(
        metadata=client.V1ObjectMeta(labels=harness.pod_labels),
        spec=client.V1PodSpec(node_name=HARNESS_NODE, termination_grace_period_seconds=1, containers=[
            client.V1Container(name="base", command=[sys.executable, "-c", "import time; time.sleep(60)"])]))
    pod = core.create_namespaced_pod(namespace, build_pod(
        PodAttempt(ref.ti_id, 1, 1, "dag", "task", "run"), kube, template=template))
    name, uid = pod.metadata.name, pod.metadata.uid
    wait_for(lambda: core.read_namespaced_pod(name, namespace).status.phase == "Running", 30,
             what="the pod to run")
    core.delete_namespaced_pod(name, namespace, grace_period_seconds=1)
    run = harness.run_named(namespace, name)
    assert run is not None and run.done.wait(30), "the harness did not stop the pod"

    def ended():
        p = core.read_namespaced_pod(name, namespace)
        return p if p.status.phase == "Failed" and p.metadata.deletion_timestamp else None

    held = wait_for(ended, 30, what="the stopped pod's terminal status")
    assert held.metadata.uid == uid and held.metadata.finalizers == [OUTCOME_FINALIZER]
    assert held.status.container_statuses[0].state.terminated.exit_code == 143  # SIGTERM
    assert uid in _pods(core, namespace)  # the harness's grace-0 delete did not take it
    assert release_finalizer(core, namespace, name, uid).outcome is ReleaseOutcome.RELEASED
    wait_for(lambda: uid not in _pods(core, namespace), 30, what="the released pod to go")
    assert release_finalizer(core, namespace, name, uid).done


def test_release_pods_strips_every_leoflow_pod_and_the_namespace_can_go(core, k8s_env, request, monkeypatch,
                                                                        capsys):
    """``airflow leoflow release-pods --namespace NS``: ``--dry-run`` lists the pods holding the finalizer and
    changes nothing; then every one loses it (a running pod, a finished one, a deleted one kept
    ``Terminating``); exit 0 both times. The namespace is then deleted and goes (nothing holds its pods)."""
    name = f"release-pods-{uuid.uuid4().hex[:6]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    request.addfinalizer(lambda: _delete_namespace(core, name))
    kube = _kube(name, k8s_env, instance="release-test")  # the CLI below is given the same
    running = core.create_namespaced_pod(name, _kwok_pod(new_ref(), kube, {}))
    done = new_ref()
    finished = core.create_namespaced_pod(name, _kwok_pod(done, kube, {"kwok.leoflow.test/exit-code": "0"}))
    deleted = _ended_and_force_deleted(core, name, _kwok_pod(new_ref(), kube, {"kwok.leoflow.test/exit-code": "0"}))
    wait_for(lambda: core.read_namespaced_pod(finished.metadata.name, name).status.phase == "Succeeded", 30,
             what="the finished pod")
    uids = {p.metadata.uid for p in (running, finished, deleted)}
    for key, value in {"RUNTIME": "kubernetes", "IMAGE": "registry.example/leoflow:test",
                       "EXCHANGE_URL": "http://127.0.0.1:9/leoflow", "NAMESPACE": "not-this-one",
                       "IN_CLUSTER": "False", "KUBE_CONFIG": str(k8s_env.kubeconfig),
                       "INSTANCE": "release-test"}.items():
        monkeypatch.setenv(f"AIRFLOW__LEOFLOW__{key}", value)

    def run(*argv: str) -> str:
        with pytest.raises(SystemExit) as exit_:
            cli.release_pods(SimpleNamespace(namespace=name, dry_run="--dry-run" in argv, unlabelled=False))
        assert exit_.value.code == 0
        return capsys.readouterr().out

    out = run("--dry-run")
    assert out.count("would-release") == 3 and f"would release {OUTCOME_FINALIZER} on 3 pod(s)" in out
    assert all(p.metadata.finalizers == [OUTCOME_FINALIZER] for p in _pods(core, name).values())
    out = run()
    assert sum(line.startswith("released ") and f" pod {name}/" in line for line in out.splitlines()) == 3
    assert f"released {OUTCOME_FINALIZER} on 3 pod(s) in namespace {name}" in out
    assert all(uid in out for uid in uids)
    wait_for(lambda: deleted.metadata.uid not in _pods(core, name), 30, what="the deleted pod to go")
    assert not [p for p in _pods(core, name).values() if p.metadata.finalizers]
    assert "on 0 pod(s)" in run()
    core.delete_namespace(name)

    def namespace_gone():
        try:
            core.read_namespace(name)
        except ApiException as e:
            return e.status == 404
        return False

    wait_for(namespace_gone, 60, what="the namespace to be deleted")


def _delete_namespace(core, name: str) -> None:
    try:
        core.delete_namespace(name)
    except ApiException as e:
        if e.status != 404:
            raise
    from .conftest import release_leoflow_pods

    release_leoflow_pods(core, name)
