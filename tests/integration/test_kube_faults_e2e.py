"""Issues 9 and 10 acceptance, end to end, for what needs the node harness: several Nodes at once, and a pod held
unstarted at a chosen moment (a real node per machine, whose pods name it, can do neither; DESIGN §6). A real Airflow
(scheduler, dag-processor, api-server on SQLite) with ``[leoflow] runtime = kubernetes`` on the k8senv control plane
with its real PodGC; the node harness runs the pods (devtools/kube.py). One stack for the module
(:class:`~fault_helpers.FaultStack` on ``tests/fault_dags`` pointed at a :class:`~devtools.kube.KubeStack`); the tests
run in file order. How the other pod ends (OOM, eviction, deadline), adoption and the finalizer are settled runs on
the real node: ``test_kube_pod_ends_e2e.py``.

**A lost and an unreachable Node** (issue 10 item 2): ``lf_knode`` runs on a Node of its own (``harness-node-lost``,
served by a second node harness) so losing it leaves the stack's ``harness-node`` alone. The body
(``tests/fault_dags/leoflow_kube.py``) ticks into ``traces/lf_knode.work.body`` until the test releases its try
(``traces/release.<run_id>.<try>``), so the fault lands while it runs. ``[leoflow] pod_override_allow`` adds
``spec.nodeName`` and ``spec.terminationGracePeriodSeconds``: the pods stop 2 s after a SIGTERM (the Task SDK's task
process ignores SIGTERM). The checks shared by all (:func:`kube_attempts.check_bodies`): no body that recorded its end
ran again, no two bodies of one TI overlapped, and a body whose pod was lost or stopped never ended.

**Revoke and token lifetimes** (issue 9), each with a pod the harness holds unstarted, with:

* ``[scheduler] task_queued_timeout`` :data:`QUEUED_TIMEOUT` (checked every 2 s): Airflow revokes a TI held
  QUEUED that long and queues it again (``_handle_tasks_stuck_in_queued``: ``executor.revoke_task(ti=ti)``,
  then the TI back to SCHEDULED with the same ``ti_id`` and try);
* ``[execution_api] jwt_expiration_time`` :data:`JWT_EXPIRATION` and ``[api_auth] jwt_leeway``
  :data:`JWT_LEEWAY`: an execution token is refused :data:`TOKEN_DEAD_AFTER` seconds after it is minted, unless
  the api-server's ``Refreshed-API-Token`` header replaced it (it does on every request while less than
  ``max(20 %, 30 s)`` of its life is left: here always);
* ``[leoflow] pod_retention_success`` an hour: no pod is deleted by the retention GC during the module, so every
  deletion the pod recorder sees is a fault or a revoke decision.

Each asserts what a user notices: TI states, try numbers and ``max_tries``, the Log rows of the TI's event log, how
often each body ran, and every version of every pod the namespace held.

Wall time on the 2-core host: about 7 min at low load (the stack's start 35-100 s; node loss 130 s, of which PodGC's
wait 56 s and the heartbeat's silence; the unreachable node 130 s; the revoke's wait for ``task_queued_timeout``
78 s; token lifetimes 46 s).
"""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone

import pytest

from devtools.kube import KubeStack
from fault_helpers import FaultStack, executions, kube_fault_stack, wait_until
from kube_attempts import (
    LABEL,
    TASK,
    check_bodies,
    closed_rows,
    deleted_while_active,
    ended_pods,
    ledger_rows,
    log_rows,
    pod_phase,
    release_try,
    running_try,
    settled_rows,
    ti_id_of,
)

pytestmark = [pytest.mark.k8s, pytest.mark.airflow, pytest.mark.timeout(2400)]

# --- node loss (tests/fault_dags/leoflow_kube.py)
NODE_DAG, KTASK = "lf_knode", TASK
LOST_NODE = "harness-node-lost"
"""``tests/fault_dags/leoflow_kube.py``'s ``LOST_NODE``."""
ALLOW = ("metadata.labels, metadata.annotations, spec.containers.image, spec.containers.imagePullPolicy, "
         "spec.containers.resources, spec.containers.env, spec.nodeSelector, spec.affinity, spec.tolerations, "
         "spec.priorityClassName, spec.nodeName, spec.terminationGracePeriodSeconds")
"""``[leoflow] pod_override_allow``: leoflow's default list and the two fields the fault DAGs set."""
FAILED = "leoflow task failed"
PODGC_BOUND = 110.0
"""Seconds PodGC may take once a Node is deleted: a pass every 20 s, a 40 s quarantine (40-60 s, 80 s at worst:
scripts/k8senv), plus margin for a loaded host. The attempt settles later: PodGC's ``Failed`` proves the end only
once the task's heartbeat has been silent for ``[leoflow] agent_lost_threshold`` (120 s; k8s review §14), then the
re-drive names PodGC's disruption, and the pod goes when leoflow releases its finalizer."""

# --- revoke, token lifetimes (tests/fault_dags/leoflow_holes.py and leoflow_more.py)
QUEUED_TIMEOUT = 70
"""``[scheduler] task_queued_timeout``: three times a cold pod's way from create to ``/run`` on a loaded 2-core
host (observed 23 s for one pod at load 6.7: exchange after 2 s, then the Task SDK's start), above the token
test's held pod (:data:`TOKEN_DEAD_AFTER` + 3 s Pending, then that start), and below ``[leoflow]
dispatch_lost_threshold`` (120 s). A re-driven try of the node-loss test waits QUEUED for its replacement node
well within it."""
JWT_EXPIRATION = 10
"""``[execution_api] jwt_expiration_time``: Airflow takes any positive integer (no minimum is checked); it sets
the execution tokens' lifetime only (the workload token a pod gets at exchange lives ``task_queued_timeout``; the
REST API's tokens are ``[api_auth] jwt_expiration_time``, left alone)."""
JWT_LEEWAY = 10
"""``[api_auth] jwt_leeway`` (Airflow's default, set explicitly): the validator accepts a token this much past its
``exp``."""
TOKEN_DEAD_AFTER = JWT_EXPIRATION + JWT_LEEWAY
HEARTBEAT = 5
"""``[workers] min_heartbeat_interval`` (Airflow's default): how often the supervisor heartbeats (each request
may bring a refreshed token)."""
MAX_FAILED_HEARTBEATS = 3
"""``[workers] max_failed_heartbeats`` (default): a supervisor whose token died kills its task after this many."""
REVOKE_DAG, REVOKE_TASK = "lf_h10", "work"
WAIT_DAG, WAIT_TASK = "lf_budget", "work"
LONG_DAG, LONG_TASK = "lf_user", "long"
STUCK = "stuck in queued reschedule"
"""The event Airflow logs when it revokes a TI stuck in QUEUED and sets it back to SCHEDULED."""

INFRA = "leoflow infra re-drive"
VALVE = 25
"""``[leoflow] pod_termination_valve`` for the module (default 60): the pods its tests delete (a revoke) are on a
running harness node and report their terminated status within seconds."""
DAGS = [NODE_DAG, REVOKE_DAG, WAIT_DAG, LONG_DAG]
EXTRA = {
    "AIRFLOW__LEOFLOW__POD_OVERRIDE_ALLOW": ALLOW,
    "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_THRESHOLD": "10",
    "AIRFLOW__SCHEDULER__ORPHANED_TASKS_CHECK_INTERVAL": "15",
    "AIRFLOW__SCHEDULER__TASK_QUEUED_TIMEOUT": str(QUEUED_TIMEOUT),
    "AIRFLOW__SCHEDULER__TASK_QUEUED_TIMEOUT_CHECK_INTERVAL": "2",
    "AIRFLOW__EXECUTION_API__JWT_EXPIRATION_TIME": str(JWT_EXPIRATION),
    "AIRFLOW__API_AUTH__JWT_LEEWAY": str(JWT_LEEWAY),
    "AIRFLOW__WORKERS__MIN_HEARTBEAT_INTERVAL": str(HEARTBEAT),
    "AIRFLOW__WORKERS__MAX_FAILED_HEARTBEATS": str(MAX_FAILED_HEARTBEATS),
    "AIRFLOW__LEOFLOW__POD_RETENTION_SUCCESS": "3600",
    "AIRFLOW__LEOFLOW__POD_TERMINATION_VALVE": str(VALVE),
}


@pytest.fixture(scope="module")
def kube_stack(tmp_path_factory: pytest.TempPathFactory):
    """``(stack, kube)``: the module's Airflow (started, :data:`DAGS` serialized) on its Kubernetes."""
    with kube_fault_stack(tmp_path_factory.mktemp("kube-faults"), extra_env=EXTRA, dags=DAGS) as both:
        yield both


# ---------------------------------------------------------------------------------------------------- helpers


def _disruption(pod: dict) -> dict | None:
    return next((c for c in (pod.get("status") or {}).get("conditions") or [] if c["type"] == "DisruptionTarget"),
                None)


def _callbacks(stack: FaultStack, dag_id: str) -> list[str]:
    """``<dag> <task> <try> <kind>`` of each callback of ``dag_id``, in the order they ran."""
    path = stack.traces_dir / "callbacks.log"
    return [" ".join(line.split()[:4]) for line in (path.read_text().splitlines() if path.exists() else [])
            if line.startswith(dag_id + " ")]


def _label(pod: dict, key: str) -> str | None:
    return pod["metadata"]["labels"].get(LABEL + key)


def _started(pod: dict) -> bool:
    """Whether the pod's container ever ran (a Running or terminated container state)."""
    states = [s.get("state") or {} for s in (pod.get("status") or {}).get("containerStatuses") or []]
    return any("running" in s or "terminated" in s for s in states)


def _ts(text: str) -> float:
    """Unix time of an API server (RFC 3339) or SQLite (``YYYY-MM-DD HH:MM:SS[.ffffff][+00:00]``, UTC) time."""
    when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return (when if when.tzinfo else when.replace(tzinfo=timezone.utc)).timestamp()


def _held(harness, dag_id: str) -> tuple[str, float] | None:
    """``(uid, creation time)`` of a pod of ``dag_id`` the harness holds unstarted, or ``None``."""
    for uid, pod in list(harness.held.items()):
        if (pod.metadata.labels or {}).get(LABEL + "dag-id") == dag_id:
            return uid, pod.metadata.creation_timestamp.timestamp()
    return None


def _live_pods(kube: KubeStack) -> list[dict]:
    """The task namespace's pods as the API server lists them now."""
    from kubernetes import client

    return json.loads(client.CoreV1Api(kube.api).list_namespaced_pod(kube.namespace, _preload_content=False)
                      .data)["items"]


# ---------------------------------------------------------------------------------------------------- tests


def test_a_lost_node_s_task_is_rerun_as_a_new_try_on_the_infra_budget(kube_stack) -> None:
    """``lf_knode.work`` (retries 0) runs on ``harness-node-lost``; while its body runs the node is lost (its harness
    kills every process and reports nothing; the Node is deleted). The real PodGC marks the pod Failed with
    ``DisruptionTarget`` ``DeletionByPodGC`` and deletes it; a Node of the same name comes back (a new harness:
    the replacement machine). The TI is re-run as try 2 on the infra budget: ``max_tries`` 0 → 1 (up by exactly
    one, the user's retries untouched: no retry or failure callback), one ``leoflow infra re-drive`` Log row
    naming PodGC; try 1's body never ended, try 2's ran once and succeeded."""
    from tests.k8s.harness import NodeHarness

    stack, kube = kube_stack
    lost = NodeHarness(kube.api, LOST_NODE, kube.workdir / "harness-lost")
    replacement = None
    try:
        lost.start()
        run = stack.trigger_with(NODE_DAG)
        first_pod = running_try(stack, kube, NODE_DAG, run, 1)
        before = stack.ti_row(NODE_DAG, run, KTASK)
        assert (before["state"], before["try_number"], before["max_tries"]) == ("running", 1, 0), before

        lost.lose_node()
        t_lost = time.monotonic()
        first_uid = next(r["pod_uid"] for r in ledger_rows(stack, NODE_DAG, run, KTASK) if r["pod_name"] == first_pod)

        def deleted() -> bool:  # PodGC marked it Failed and deleted it; leoflow's finalizer may still hold it
            kube.record_current()
            return first_uid in kube.pods() and not any(
                p["metadata"]["uid"] == first_uid and not p["metadata"].get("deletionTimestamp")
                for p in _live_pods(kube))

        wait_until(deleted, PODGC_BOUND, "PodGC to delete the lost node's pod")
        print(f"node loss: PodGC deleted the pod {time.monotonic() - t_lost:.0f}s after the Node's deletion")
        replacement = NodeHarness(kube.api, LOST_NODE, kube.workdir / "harness-replacement").start()

        running_try(stack, kube, NODE_DAG, run, 2)
        release_try(stack, run, 2)
        assert stack.wait_for_run(NODE_DAG, run, timeout=240) == "success"
    finally:
        lost.stop()
        if replacement is not None:
            replacement.stop()
        _delete_node(kube)

    ti = stack.ti_row(NODE_DAG, run, KTASK)
    assert (ti["state"], ti["try_number"], ti["max_tries"]) == ("success", 2, 1), ti
    first_versions = kube.pods()[first_uid]
    failed = [v for v in first_versions if (v.get("status") or {}).get("phase") == "Failed"]
    assert failed and (_disruption(failed[0]) or {}).get("reason") == "DeletionByPodGC", first_versions[-1]["status"]
    rows = log_rows(stack, NODE_DAG, run)
    infra = [extra for event, extra in rows if event == INFRA]
    assert len(infra) == 1 and "DeletionByPodGC" in infra[0] and "max_tries 0 -> 1" in infra[0], rows
    assert FAILED not in [e for e, _ in rows], rows
    ledger = closed_rows(stack, run, NODE_DAG)
    assert ledger == [(1, 1, "closed", "infra_redrive"), (2, 1, "closed", "reported")], ledger
    check_bodies(stack, NODE_DAG, run, lost_tries={1}, ended_tries={2})
    assert _callbacks(stack, NODE_DAG) == [f"{NODE_DAG} {KTASK} 2 success"]


UNREACHABLE_GRACE = 5
"""The grace of the unreachable pod's delete (as the agent-lost reaper's kill or a taint manager would send one)."""


def test_a_pod_on_an_unreachable_node_is_rerun_once_the_valve_opens(kube_stack) -> None:
    """``lf_knode.work`` (retries 0) runs on ``harness-node-lost``; while its body runs the node becomes unreachable
    (its harness stops: the body is killed, nothing reports, the Node object stays, as for a partitioned or hung
    machine nobody deleted). The pod is deleted with grace 5 s: no kubelet confirms it, so it stays deleting and
    Running, and leoflow's finalizer keeps it. leoflow waits for its terminated status (the record) the grace plus
    ``[leoflow] pod_termination_valve`` (:data:`VALVE`), never less, then re-runs the TI as try 2 on the infra budget:
    ``max_tries`` 0 → 1, one ``leoflow infra re-drive`` Log row naming the pod, its node and the valve, no retry or
    failure callback. The node comes back (a new harness) and try 2 succeeds; try 1's body never ended."""
    from kubernetes import client

    from tests.k8s.harness import NodeHarness

    stack, kube = kube_stack
    node = NodeHarness(kube.api, LOST_NODE, kube.workdir / "harness-unreachable")
    back = None
    callbacks = _callbacks(stack, NODE_DAG)
    try:
        node.start()
        run = stack.trigger_with(NODE_DAG)
        pod = running_try(stack, kube, NODE_DAG, run, 1)
        node.become_unreachable()
        deleted_at = time.monotonic()
        client.CoreV1Api(kube.api).delete_namespaced_pod(pod, kube.namespace, body=client.V1DeleteOptions(
            grace_period_seconds=UNREACHABLE_GRACE))
        wait_until(lambda: stack.ti_row(NODE_DAG, run, KTASK)["try_number"] == 2, VALVE + 180,
                   "the TI re-run as try 2 once the valve opened")
        waited = time.monotonic() - deleted_at
        kept = _live_pods(kube)
        back = NodeHarness(kube.api, LOST_NODE, kube.workdir / "harness-back").start()
        running_try(stack, kube, NODE_DAG, run, 2)
        release_try(stack, run, 2)
        assert stack.wait_for_run(NODE_DAG, run, timeout=240) == "success"
    finally:
        node.stop()
        if back is not None:
            back.stop()
        _delete_node(kube)  # PodGC removes try 1's pod, as for a lost machine

    print(f"unreachable node: re-run {waited:.0f}s after the delete")
    assert waited >= UNREACHABLE_GRACE + VALVE, waited  # it waited for the terminated status first
    [old] = [p for p in kept if p["metadata"]["name"] == pod]  # still there, deleting and Running, when re-run
    assert old["metadata"].get("deletionTimestamp") and old["status"]["phase"] == "Running", old["status"]
    ti = stack.ti_row(NODE_DAG, run, KTASK)
    assert (ti["state"], ti["try_number"], ti["max_tries"]) == ("success", 2, 1), ti
    rows = log_rows(stack, NODE_DAG, run)
    infra = [extra for event, extra in rows if event == INFRA]
    assert len(infra) == 1 and f"pod {pod} on node {LOST_NODE} was deleted and reported no end" in infra[0], rows
    assert f"[leoflow] pod_termination_valve {VALVE} s" in infra[0] and "max_tries 0 -> 1" in infra[0], rows
    assert FAILED not in [e for e, _ in rows], rows
    assert closed_rows(stack, run, NODE_DAG) == [(1, 1, "closed", "infra_redrive"), (2, 1, "closed", "reported")]
    check_bodies(stack, NODE_DAG, run, lost_tries={1}, ended_tries={2})
    assert _callbacks(stack, NODE_DAG) == callbacks + [f"{NODE_DAG} {KTASK} 2 success"]


def test_revoke_of_a_ti_stuck_in_queued_deletes_that_epochs_pod_only(kube_stack) -> None:
    """The harness holds the first pod of ``lf_h10.work`` unstarted (Pending: a node that cannot start it), so its
    TI stays QUEUED; after ``task_queued_timeout`` Airflow calls ``revoke_task`` and queues the same ``ti_id``
    again. leoflow deletes exactly epoch 1's pod (gone from the API server, never started); the re-queued TI
    gets epoch 2's pod, which runs untouched (no ``deletionTimestamp`` while active) and succeeds; the body ran
    once; the TI ends SUCCESS at try 1 after exactly one stuck-in-queued revoke."""
    stack, kube = kube_stack
    harness = kube.harness
    harness.hold_pods(lambda pod: (pod.metadata.labels or {}).get(LABEL + "dag-id") == REVOKE_DAG
                      and (pod.metadata.labels or {}).get(LABEL + "attempt-epoch") == "1")
    try:
        run = stack.trigger_with(REVOKE_DAG)

        first_uid, _ = wait_until(lambda: _held(harness, REVOKE_DAG), 120,
                                  "epoch 1's pod to be created and held unstarted")
        assert stack.ti_row(REVOKE_DAG, run, REVOKE_TASK)["state"] == "queued"
        assert stack.wait_for_run(REVOKE_DAG, run, timeout=QUEUED_TIMEOUT + 240) == "success"
    finally:
        harness.hold_pods(None)

    ti_id = ti_id_of(stack, REVOKE_DAG, run, REVOKE_TASK)
    ti = stack.ti_row(REVOKE_DAG, run, REVOKE_TASK)
    rows = settled_rows(stack, REVOKE_DAG, run, REVOKE_TASK)
    pods = ended_pods(kube, ti_id)
    execs = executions(stack, REVOKE_DAG, REVOKE_TASK, run)
    events = stack.log_events(REVOKE_DAG, run, REVOKE_TASK)
    seen = {uid: [(pod_phase(v), bool(v["metadata"].get("deletionTimestamp"))) for v in versions]
            for uid, versions in pods.items()}

    assert events.count(STUCK) == 1 and INFRA not in events, events
    # epoch 1: the revoke deleted its pod (a Pending pod is LIVE, so the revoke cannot close it at once); the cycle
    # that saw it gone closed it (TI QUEUED again, no record: the same close as Lite's, test_hole10); epoch 2 is
    # the re-queued dispatch's, and reported
    assert [(r["try_number"], r["attempt_epoch"], r["state"], r["resolution"]) for r in rows] == \
        [(1, 1, "closed", "redispatched"), (1, 2, "closed", "reported")], rows
    assert rows[0]["pod_uid"] == first_uid, (rows, first_uid)
    second_uid = rows[1]["pod_uid"]
    assert set(pods) == {first_uid, second_uid}, seen
    first, second = pods[first_uid], pods[second_uid]
    # epoch 1's pod: never started, deleted (its last version carries the deletion), gone from the API server
    assert not any(_started(v) for v in first), seen
    assert first[-1]["metadata"].get("deletionTimestamp"), seen
    assert first_uid not in {p["metadata"]["uid"] for p in _live_pods(kube)}, seen
    # epoch 2's pod: created after epoch 1's deletion, ran untouched to Succeeded, still there
    assert _ts(second[0]["metadata"]["creationTimestamp"]) >= _ts(first[-1]["metadata"]["deletionTimestamp"]) - 1, seen
    assert _label(second[0], "attempt-epoch") == "2" and _label(second[0], "try-number") == "1", seen
    assert deleted_while_active(second) == [] and pod_phase(second[-1]) == "Succeeded", seen
    assert second_uid in {p["metadata"]["uid"] for p in _live_pods(kube)}, seen
    assert len(execs) == 1 and execs[0].ended and execs[0].try_number == 1, execs
    assert (ti["state"], ti["try_number"]) == ("success", 1), ti


def test_tokens_outlive_jwt_expiration_pending_and_running(kube_stack) -> None:
    """Two runs at once. ``lf_budget.work``'s pod is held Pending longer than an execution token lives
    (``jwt_expiration_time`` + leeway), then started: it exchanges only then (the ledger's ``exchanged_at``),
    runs its body once and succeeds at try 1. ``lf_user.long`` works longer than a token lives plus the
    supervisor's failed-heartbeat budget: its agent's transport passes the api-server's ``Refreshed-API-Token``
    through to the Task SDK, so its heartbeats and final report are accepted and it succeeds at try 1, once."""
    stack, kube = kube_stack
    harness = kube.harness
    harness.hold_pods(lambda pod: (pod.metadata.labels or {}).get(LABEL + "dag-id") == WAIT_DAG)
    try:
        wait_run = stack.trigger_with(WAIT_DAG)
        long_run = stack.trigger_with(LONG_DAG)

        uid, created = wait_until(lambda: _held(harness, WAIT_DAG), 120, "the waiting task's pod to be created and held unstarted")
        # the scenario's input: the pod stays Pending past an execution token's life
        time.sleep(max(0.0, created + TOKEN_DEAD_AFTER + 3 - time.time()))
        assert harness.release_held(uid) == [uid], "the held pod was not started"
    finally:
        harness.hold_pods(None)

    long_execs = wait_until(lambda: executions(stack, LONG_DAG, LONG_TASK, long_run), 120, "the long body to start")
    # the scenario's input: the body works past a token's life and the failed-heartbeat budget after it
    work_for = TOKEN_DEAD_AFTER + (MAX_FAILED_HEARTBEATS + 1) * HEARTBEAT
    time.sleep(max(0.0, long_execs[0].start + work_for - time.time()))
    stack.release(long_run)
    assert stack.wait_for_runs({WAIT_DAG: wait_run, LONG_DAG: long_run}, timeout=240) == \
        {WAIT_DAG: "success", LONG_DAG: "success"}

    # the waiting pod: started only after a token's life, exchanged after that, ran once
    (row,) = settled_rows(stack, WAIT_DAG, wait_run, WAIT_TASK)
    pod = ended_pods(kube, ti_id_of(stack, WAIT_DAG, wait_run, WAIT_TASK))[uid]
    started = min(_ts(s["state"]["running"]["startedAt"]) for v in pod
                  for s in (v.get("status") or {}).get("containerStatuses") or [] if "running" in s["state"])
    assert started - _ts(pod[0]["metadata"]["creationTimestamp"]) > TOKEN_DEAD_AFTER, pod[-1].get("status")
    assert pod_phase(pod[-1]) == "Succeeded", pod[-1].get("status")
    assert (row["attempt_epoch"], row["state"], row["resolution"], row["pod_uid"]) == (1, "closed", "reported", uid), row
    assert _ts(row["exchanged_at"]) - _ts(row["dispatched_at"]) > TOKEN_DEAD_AFTER, row
    execs = executions(stack, WAIT_DAG, WAIT_TASK, wait_run)
    assert len(execs) == 1 and execs[0].ended, execs
    ti = stack.ti_row(WAIT_DAG, wait_run, WAIT_TASK)
    assert (ti["state"], ti["try_number"]) == ("success", 1), ti

    # the long task: its body ran once, past a token's life and the failed-heartbeat budget, and succeeded
    execs = executions(stack, LONG_DAG, LONG_TASK, long_run)
    assert len(execs) == 1 and execs[0].ended and execs[0].try_number == 1, execs
    assert execs[0].last - execs[0].start >= work_for, execs
    ti = stack.ti_row(LONG_DAG, long_run, LONG_TASK)
    assert (ti["state"], ti["try_number"]) == ("success", 1), ti
    (row,) = settled_rows(stack, LONG_DAG, long_run, LONG_TASK)
    assert (row["state"], row["resolution"]) == ("closed", "reported"), row
    for dag_id, run, task in ((WAIT_DAG, wait_run, WAIT_TASK), (LONG_DAG, long_run, LONG_TASK)):
        events = stack.log_events(dag_id, run, task)
        assert STUCK not in events and INFRA not in events, (dag_id, events)


# ---------------------------------------------------------------------------------------------------- plumbing


def _delete_node(kube: KubeStack) -> None:
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    try:
        client.CoreV1Api(kube.api).delete_node(LOST_NODE)
    except ApiException as exc:
        if exc.status != 404:
            raise
