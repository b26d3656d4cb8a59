"""The pure reading of a task pod's status (issue 9 item 5; facts file requirement 12): :func:`pod_view` over pod
JSON shaped as the kube-apiserver serves it, :func:`pod_evidence` (the same evidence Lite produces) and
:func:`describe_end` (the evidence order in one log line).

What a real apiserver and kwok make of pods (and the informer reading them) is in ``tests/k8s/test_informer.py``.
"""

from __future__ import annotations

import copy
import json
from datetime import datetime, timezone

import pytest

from leoflow_agent import outcome
from leoflow_airflow.ledger.states import AttemptRef
from leoflow_airflow.lifecycle.runtime import MAX_DETAIL_CHARS, EndCause, EndKind, Evidence
from leoflow_airflow.runtime.kubernetes.identity import IDENTITY_ANNOTATION, identity_annotation
from leoflow_airflow.runtime.kubernetes.status import ContainerEnd, describe_end, pod_evidence, pod_view

TI = "0190b6c2-7a1e-7000-8000-00000000abcd"
REF = AttemptRef(TI, 2, 3)


def pod(*, phase: str = "Running", agent_state: dict | None = None, status: dict | None = None,
        annotations: dict | None = None, deleting: bool = False, sidecar_state: dict | None = None) -> dict:
    """A pod as ``GET /api/v1/namespaces/ns/pods/p`` returns it (camelCase JSON), with the agent container
    ``base`` in ``agent_state`` and a sidecar in ``sidecar_state``."""
    meta = {"name": "leoflow-p-1", "namespace": "ns", "uid": "6f1c2d3e-0000-4000-8000-000000000001",
            "resourceVersion": "4711", "creationTimestamp": "2026-12-01T10:00:00Z",
            "labels": {"app.kubernetes.io/managed-by": "leoflow"},
            "annotations": {IDENTITY_ANNOTATION: identity_annotation(REF)} if annotations is None else annotations}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-01T10:05:00Z"
        meta["deletionGracePeriodSeconds"] = 30
    statuses = [{"name": "sidecar", "ready": False, "restartCount": 0, "image": "x", "imageID": "",
                 "state": sidecar_state or {"running": {"startedAt": "2026-12-01T10:00:02Z"}}},
                {"name": "base", "ready": phase == "Running", "restartCount": 0, "image": "leoflow:1",
                 "imageID": "", "containerID": "containerd://abc",
                 "state": agent_state or {"running": {"startedAt": "2026-12-01T10:00:02Z"}}}]
    st = {"phase": phase, "hostIP": "10.0.0.1", "podIP": "10.1.0.9", "startTime": "2026-12-01T10:00:01Z",
          "qosClass": "Guaranteed",
          "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "2026-12-01T10:00:02Z"}],
          "containerStatuses": statuses}
    st.update(status or {})
    return {"kind": "Pod", "apiVersion": "v1", "metadata": meta,
            "spec": {"nodeName": "node-a", "restartPolicy": "Never",
                     "containers": [{"name": "base", "image": "leoflow:1"}, {"name": "sidecar", "image": "x"}]},
            "status": st}


def terminated(code: int, reason: str, message: str | None = None) -> dict:
    """A container ``state`` that terminated with ``code``/``reason`` (and a termination message)."""
    t = {"exitCode": code, "reason": reason, "startedAt": "2026-12-01T10:00:02Z",
         "finishedAt": "2026-12-01T10:03:04Z", "containerID": "containerd://abc"}
    if message is not None:
        t["message"] = message
    return {"terminated": t}


def success_record(ref: AttemptRef = REF) -> str:
    """The termination message an agent writes for a successful attempt ``ref``."""
    rec = outcome.record_for_state("success", {"state": "success", "end_date": "2026-12-01T10:03:03Z"},
                                   attempt=ref, api_version="2026-06-30")
    return outcome.encode(rec, budget=outcome.TERMINATION_MESSAGE_BUDGET)


def test_running_pod_reads_identity_phase_node_and_start_time():
    v = pod_view(pod())
    assert v is not None
    assert (v.name, v.uid, v.namespace, v.resource_version) == (
        "leoflow-p-1", "6f1c2d3e-0000-4000-8000-000000000001", "ns", "4711")
    assert v.ref == REF
    assert (v.phase, v.terminal, v.deleting, v.node_name) == ("Running", False, False, "node-a")
    assert v.agent is None and v.finished_at is None and v.waiting_reason is None
    assert v.started_at == datetime(2026, 12, 1, 10, 0, 1, tzinfo=timezone.utc)
    assert pod_evidence(v, REF) == Evidence(None)
    assert "not terminated" in describe_end(v) and "phase Running" in describe_end(v)


def test_succeeded_pod_with_record_gives_the_record_and_exit_code_from_the_agent_container_only():
    message = success_record()
    v = pod_view(pod(phase="Succeeded", agent_state=terminated(0, "Completed", message),
                     sidecar_state=terminated(7, "Error", "sidecar noise")))
    assert v.terminal
    assert v.agent == ContainerEnd(0, "Completed", message)
    assert v.finished_at == datetime(2026, 12, 1, 10, 3, 4, tzinfo=timezone.utc)
    ev = pod_evidence(v, REF)
    assert ev.exit_code == 0
    assert ev.record == outcome.decode(message, expect=REF)
    assert ev.record.outcome is outcome.Outcome.SUCCESS and ev.record.state == "success"


def test_kubelet_runtime_prefix_on_the_message_still_decodes():
    v = pod_view(pod(phase="Succeeded", agent_state=terminated(0, "Completed",
                                                               "runtime says hi: " + success_record())))
    assert pod_evidence(v, REF).record is not None


def test_record_of_another_attempt_is_refused():
    other = AttemptRef(TI, 2, 2)  # the previous epoch of the same try
    v = pod_view(pod(phase="Succeeded", agent_state=terminated(0, "Completed", success_record(other)),
                     annotations={}))
    assert v.ref is None
    ev = pod_evidence(v, REF)
    assert ev.record is None and ev.exit_code == 0
    assert pod_evidence(v, other).record is not None


def test_pod_annotated_for_another_attempt_is_no_evidence_at_all():
    v = pod_view(pod(phase="Failed", agent_state=terminated(1, "Error", success_record())))
    assert pod_evidence(v, AttemptRef(TI, 2, 4)) == Evidence(None)
    assert pod_evidence(None, REF) == Evidence(None)


def test_oomkilled_reads_reason_and_exit_137_and_names_them_first():
    v = pod_view(pod(phase="Failed", agent_state=terminated(137, "OOMKilled")))
    assert v.agent == ContainerEnd(137, "OOMKilled", None)
    assert pod_evidence(v, REF) == Evidence(None, 137, EndCause(
        EndKind.OOM_KILLED, "OOMKilled, exit 137, container base (pod leoflow-p-1)"))  # tests/unit/test_pod_end.py
    assert describe_end(v) == ("pod leoflow-p-1 (uid 6f1c2d3e-0000-4000-8000-000000000001): "
                               "container base OOMKilled exit 137; phase Failed")


def test_error_exit_with_a_truncated_record_is_no_record_but_keeps_the_exit_code():
    cut = success_record()[:-20]  # the kubelet's 12 KiB/N head cut
    v = pod_view(pod(phase="Failed", agent_state=terminated(3, "Error", cut)))
    assert pod_evidence(v, REF) == Evidence(None, 3)
    assert describe_end(v).endswith("container base Error exit 3; termination message present; phase Failed")


def test_evicted_pod_names_the_pod_reason_and_the_disruption_after_the_container():
    v = pod_view(pod(phase="Failed", agent_state=terminated(137, "Error"), status={
        "reason": "Evicted", "message": "The node was low on resource: memory.",
        "conditions": [{"type": "Ready", "status": "False"},
                       {"type": "DisruptionTarget", "status": "True", "reason": "TerminationByKubelet",
                        "message": "The node was low on resource: memory."}]}))
    assert (v.reason, v.disruption, v.message) == ("Evicted", "TerminationByKubelet",
                                                   "The node was low on resource: memory.")
    line = describe_end(v)
    assert line.index("Error exit 137") < line.index("pod reason Evicted") < line.index(
        "DisruptionTarget TerminationByKubelet") < line.index("phase Failed")


def test_deadline_exceeded_before_the_container_started():
    v = pod_view(pod(phase="Failed", agent_state={"waiting": {"reason": "ContainerCreating"}}, status={
        "reason": "DeadlineExceeded", "message": "Pod was active on the node longer than the specified deadline"}))
    assert v.agent is None and v.terminal
    evidence = pod_evidence(v, REF)
    assert (evidence.record, evidence.exit_code) == (None, None)
    assert evidence.cause is not None and evidence.cause.kind is EndKind.DEADLINE_EXCEEDED
    assert "pod reason DeadlineExceeded: Pod was active" in describe_end(v)


def test_a_pod_the_kubelet_refused_for_lack_of_room_is_no_room():
    """Issue 35, the real node: a pod bound to a node whose allocatable CPU other pods hold ends Failed with the
    kubelet's admission reason before any container starts; that is backpressure, named for the log."""
    message = "Pod was rejected: Node didn't have enough resource: cpu, requested: 100, used: 1900, capacity: 2000"
    v = pod_view(pod(phase="Failed", agent_state={"waiting": {"reason": "ContainerCreating"}}, status={
        "reason": "OutOfcpu", "message": message, "containerStatuses": []}))
    evidence = pod_evidence(v, REF)
    assert evidence.record is None and evidence.cause is not None and evidence.cause.kind is EndKind.NO_ROOM
    assert evidence.cause.reason == f"pod leoflow-p-1 was refused by its node for lack of room (pod reason " \
                                    f"OutOfcpu: {message})"


def test_disruption_target_only_when_its_status_is_true():
    cond = {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"}
    v = pod_view(pod(deleting=True, status={"conditions": [cond]}))
    assert v.disruption == "EvictionByEvictionAPI" and v.deleting and not v.terminal
    assert describe_end(v).endswith("DisruptionTarget EvictionByEvictionAPI; phase Running; deleting")
    assert pod_view(pod(status={"conditions": [{**cond, "status": "False"}]})).disruption is None


def test_err_image_pull_is_read_from_the_waiting_state():
    msg = 'rpc error: code = NotFound desc = failed to pull and unpack image "leoflow:nope"'
    v = pod_view(pod(phase="Pending", agent_state={"waiting": {"reason": "ErrImagePull", "message": msg}},
                     status={"startTime": None}))
    assert (v.waiting_reason, v.waiting_message, v.started_at, v.agent) == ("ErrImagePull", msg, None, None)
    assert describe_end(v).endswith(f"container base waiting ErrImagePull: {msg}; phase Pending")


def test_describe_end_is_one_bounded_line():
    v = pod_view(pod(phase="Failed", status={"reason": "Evicted", "message": "a\nb " * 1000}))
    line = describe_end(v)
    assert "\n" not in line and len(line) <= MAX_DETAIL_CHARS


def _malformed():
    """Pod-ish JSON broken in every place :func:`pod_view` reads."""
    good = pod(phase="Failed", agent_state=terminated(1, "Error", "x"))
    yield None
    yield []
    yield "pod"
    yield {}
    yield {"metadata": None}
    yield {"metadata": {"name": "p"}}  # no uid
    yield {"metadata": {"name": 5, "uid": "u"}}
    for path, value in [(("status",), "Running"), (("status", "containerStatuses"), {"base": 1}),
                        (("status", "containerStatuses"), [None, 3, {"name": "base", "state": []}]),
                        (("status", "conditions"), "DisruptionTarget"), (("status", "conditions"), [None]),
                        (("status", "phase"), 7), (("status", "startTime"), "yesterday"),
                        (("metadata", "annotations"), ["x"]),
                        (("metadata", "annotations"), {IDENTITY_ANNOTATION: "{not json"}),
                        (("spec",), None), (("status", "containerStatuses", 1, "state", "terminated"), "dead"),
                        (("status", "containerStatuses", 1, "state", "terminated", "exitCode"), True),
                        (("status", "containerStatuses", 1, "state", "terminated", "message"), {"v": 1}),
                        (("status", "containerStatuses", 1, "state", "terminated", "finishedAt"), 12)]:
        broken = copy.deepcopy(good)
        node = broken
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
        yield broken


@pytest.mark.parametrize("obj", list(_malformed()), ids=lambda o: json.dumps(o, default=str)[:60])
def test_malformed_input_never_raises(obj):
    v = pod_view(obj)
    if v is not None:
        assert v.name and v.uid
        assert isinstance(pod_evidence(v, REF), Evidence)
        assert isinstance(describe_end(v), str)


def test_malformed_fields_read_as_absent_but_keep_the_rest():
    good = pod(phase="Failed", agent_state=terminated(1, "Error", "x"))
    good["status"]["containerStatuses"][1]["state"]["terminated"]["exitCode"] = True
    good["status"]["startTime"] = "yesterday"
    v = pod_view(good)
    assert v.agent == ContainerEnd(None, "Error", "x") and v.started_at is None and v.phase == "Failed"
    assert pod_view({"metadata": {"name": "p"}}) is None


# --- the confirmation valve (issue 10 item 3) ------------------------------------------------------------------

def test_a_deleted_pod_reads_its_deletion_grace():
    assert pod_view(pod(deleting=True)).deletion_grace == 30
    assert pod_view(pod()).deletion_grace is None


def test_an_unconfirmed_end_is_an_infra_loss_naming_pod_node_wait_and_valve():
    from leoflow_airflow.runtime.kubernetes.status import unconfirmed_cause

    cause = unconfirmed_cause(pod_view(pod(deleting=True)), waited=61.4, valve=60)
    assert cause.kind is EndKind.INFRA_LOSS
    assert cause.reason == ("pod leoflow-p-1 on node node-a was deleted and reported no end 61 s past its grace "
                            "period (its node is unreachable or lost): its record could not be read ([leoflow] "
                            "pod_termination_valve 60 s)")
    tainted = pod_view(pod(deleting=True, status={"conditions": [
        {"type": "DisruptionTarget", "status": "True", "reason": "DeletionByTaintManager"}]}))
    reason = unconfirmed_cause(tainted, waited=5, valve=60).reason
    assert reason.endswith("; pod leoflow-p-1 deleted by the taint manager (its node is not ready or unreachable) "
                           "(DisruptionTarget DeletionByTaintManager)"), reason
    assert len(unconfirmed_cause(tainted, waited=1e12, valve=1e12).reason) <= MAX_DETAIL_CHARS
