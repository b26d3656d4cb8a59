"""Issues 9 and 10 acceptance, end to end: what a user sees when things go wrong under ``[leoflow] runtime =
kubernetes`` on a real Airflow (scheduler, dag-processor, api-server on SQLite; the k8senv control plane with its real
PodGC; the node harness runs the pods, devtools/kube.py). One stack for the module (:class:`~fault_helpers.FaultStack`
on ``tests/fault_dags`` pointed at a :class:`~devtools.kube.KubeStack`); the tests run in file order, in three groups:

**How a pod's end is settled** (issue 10 item 2), each fault once, deterministically: node loss, OOM kill, eviction,
``DeadlineExceeded``. The bodies (``tests/fault_dags/leoflow_kube.py``) tick into ``traces/<dag>.work.body`` until the
test releases their try (``traces/release.<run_id>.<try>``), so every fault lands while a body runs. ``[leoflow]
pod_override_allow`` adds ``spec.nodeName`` and ``spec.terminationGracePeriodSeconds``: ``lf_knode`` runs on a Node of
its own (``harness-node-lost``, served by a second node harness) so losing it leaves the stack's ``harness-node``
alone, and both DAGs' pods stop 2 s after a SIGTERM (the Task SDK's task process ignores SIGTERM). The checks shared by
all (:func:`_check_bodies`): no body that recorded its end ran again, no two bodies of one TI overlapped, and a body
whose pod was lost or stopped never ended.

**Adoption, revoke and token lifetimes** (issue 9), with:

* ``[scheduler] task_queued_timeout`` :data:`QUEUED_TIMEOUT` (checked every 2 s): Airflow revokes a TI held
  QUEUED that long and queues it again (``_handle_tasks_stuck_in_queued``: ``executor.revoke_task(ti=ti)``,
  then the TI back to SCHEDULED with the same ``ti_id`` and try);
* ``[execution_api] jwt_expiration_time`` :data:`JWT_EXPIRATION` and ``[api_auth] jwt_leeway``
  :data:`JWT_LEEWAY`: an execution token is refused :data:`TOKEN_DEAD_AFTER` seconds after it is minted, unless
  the api-server's ``Refreshed-API-Token`` header replaced it (it does on every request while less than
  ``max(20 %, 30 s)`` of its life is left: here always);
* ``[scheduler] scheduler_health_check_threshold`` 10 s and ``orphaned_tasks_check_interval`` 15 s, so a new
  scheduler adopts a SIGKILLed one's tasks within the test;
* ``[leoflow] pod_retention_success`` an hour: no pod is deleted by the retention GC during the module, so every
  deletion the pod recorder sees is a fault, an adoption or a revoke decision.

**The finalizer** (issue 10 item 4): a success whose pod is force-deleted after termination, before any scheduler
read it, is settled SUCCESS from the record the finalizer kept; the body ran once.

Each asserts what a user notices: TI states, try numbers and ``max_tries``, the Log rows of the TI's event log, how
often each body ran, and every version of every pod the namespace held. The adoption and finalizer tests restart the
scheduler; the stack stays whole.

Wall time on the 2-core host: about 11 min at low load (the stack's start 55-100 s; node loss 82 s, of which PodGC's
wait 56 s; OOM 21 s, eviction 20 s, deadline 17 s; adoption 60 s; the revoke's wait for ``task_queued_timeout``
100 s; token lifetimes 60 s; finalizer 65 s; measured when ``task_queued_timeout`` was 90 s and ``[leoflow]
pod_termination_valve`` 60 s: each wait is 20 s and 35 s shorter now).
"""

from __future__ import annotations

import json
import signal
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path

import pytest

from devtools.kube import KubeStack
from fault_helpers import FaultStack, executions, kube_fault_stack, overlaps, wait_until

pytestmark = [pytest.mark.k8s, pytest.mark.airflow, pytest.mark.timeout(2400)]

# --- node loss, OOM, eviction, deadline (tests/fault_dags/leoflow_kube.py)
HOLD_DAG, NODE_DAG, KTASK = "lf_khold", "lf_knode", "work"
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

# --- adoption, revoke, token lifetimes (tests/fault_dags/leoflow_holes.py and leoflow_more.py)
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
ADOPT_DAG, ADOPT_TASKS = "lf_adopt", [f"t{i}" for i in range(5)]
REVOKE_DAG, REVOKE_TASK = "lf_h10", "work"
WAIT_DAG, WAIT_TASK = "lf_budget", "work"
LONG_DAG, LONG_TASK = "lf_user", "long"
STUCK = "stuck in queued reschedule"
"""The event Airflow logs when it revokes a TI stuck in QUEUED and sets it back to SCHEDULED."""
LABEL = "leoflow.io/"

# --- the finalizer (tests/fault_dags/leoflow_finalizer.py)
FINALIZER_DAG = "leoflow_test_finalizer"

INFRA = "leoflow infra re-drive"
VALVE = 25
"""``[leoflow] pod_termination_valve`` for the module (default 60): the pods its other tests delete (a revoke, an
eviction) are on a running harness node and report their terminated status within seconds."""
DAGS = [HOLD_DAG, NODE_DAG, ADOPT_DAG, REVOKE_DAG, WAIT_DAG, LONG_DAG, FINALIZER_DAG]
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


def _closed_rows(stack: FaultStack, run_id: str, dag_id: str) -> list[tuple]:
    """``(try_number, attempt_epoch, state, resolution)`` of each ledger row of the ``work`` TI once every row is
    closed (a pod's end is seen after its TI's report), or as they are after 90 s (:func:`_settled`)."""
    return [(r["try_number"], r["attempt_epoch"], r["state"], r["resolution"])
            for r in _settled(stack, dag_id, run_id, KTASK)]


def _log_rows(stack: FaultStack, dag_id: str, run_id: str) -> list[tuple[str, str]]:
    """``(event, extra)`` of the TI's event log (Airflow's ``log`` table, the UI's event log), oldest first."""
    return stack.db("select event, coalesce(extra, '') from log where dag_id=? and run_id=? and task_id=? "
                    "order by id", dag_id, run_id, KTASK)


def _running_try(stack: FaultStack, kube: KubeStack, dag_id: str, run_id: str, try_number: int) -> str:
    """Wait until the body of ``try_number`` has started in a Running pod whose UID the ledger holds; the pod's
    name."""
    def started() -> str | None:
        if not [e for e in executions(stack, dag_id, KTASK, run_id) if e.try_number == try_number]:
            return None
        rows = [r for r in _ledger(stack, dag_id, run_id, KTASK) if r["try_number"] == try_number and r["pod_uid"]]
        if not rows:
            return None
        name, uid = rows[-1]["pod_name"], rows[-1]["pod_uid"]
        versions = kube.pods().get(uid)
        return name if versions and (versions[-1].get("status") or {}).get("phase") == "Running" else None

    return wait_until(started, 240, f"{dag_id} try {try_number}'s body running in its pod")


def _release(stack: FaultStack, run_id: str, try_number: int) -> None:
    (stack.traces_dir / f"release.{run_id}.{try_number}").write_text("go\n")


def _check_bodies(stack: FaultStack, dag_id: str, run_id: str, *, lost_tries: set[int], ended_tries: set[int]) -> list:
    """The body executions of the TI, after asserting: one per try in ``lost_tries | ended_tries``, those of
    ``lost_tries`` never ended (their pod was lost or stopped before the body's end), those of ``ended_tries``
    ended; no two overlapped; none started after one had ended (a recorded success never runs again)."""
    execs = executions(stack, dag_id, KTASK, run_id)
    assert sorted(e.try_number for e in execs) == sorted(lost_tries | ended_tries), execs
    assert {e.try_number for e in execs if not e.ended} == lost_tries, execs
    assert overlaps(execs) == [], execs
    for i, e in enumerate(execs):
        assert not (e.ended and execs[i + 1:]), f"a body ran after one that ended: {execs}"
    return execs


def _disruption(pod: dict) -> dict | None:
    return next((c for c in (pod.get("status") or {}).get("conditions") or [] if c["type"] == "DisruptionTarget"),
                None)


def _callbacks(stack: FaultStack, dag_id: str) -> list[str]:
    """``<dag> <task> <try> <kind>`` of each callback of ``dag_id``, in the order they ran."""
    path = stack.traces_dir / "callbacks.log"
    return [" ".join(line.split()[:4]) for line in (path.read_text().splitlines() if path.exists() else [])
            if line.startswith(dag_id + " ")]


def _ti_id(stack: FaultStack, dag_id: str, run_id: str, task_id: str) -> str:
    return str(uuid.UUID(stack.ti_row(dag_id, run_id, task_id)["id"]))


def _pods_of(kube: KubeStack, ti_id: str) -> dict[str, list[dict]]:
    """``{uid: every version seen, oldest first}`` of the pods labelled with ``ti_id``."""
    return {uid: versions for uid, versions in kube.pods().items()
            if versions[-1]["metadata"]["labels"].get(LABEL + "ti-id") == ti_id}


def _ended_pods(kube: KubeStack, ti_id: str, timeout: float = 60.0) -> dict[str, list[dict]]:
    """:func:`_pods_of` once each pod is Succeeded, Failed or deleted (its agent may still be exiting when its
    TI is already SUCCESS), or as they are after ``timeout`` seconds (the assertions then show what still runs)."""
    def ended() -> dict[str, list[dict]] | None:
        pods = _pods_of(kube, ti_id)
        done = all(_phase(v[-1]) in ("Succeeded", "Failed") or v[-1]["metadata"].get("deletionTimestamp")
                   for v in pods.values())
        return pods if pods and done else None

    try:
        return wait_until(ended, timeout, f"the pods of TI {ti_id} to end")
    except TimeoutError:
        return _pods_of(kube, ti_id)


def _label(pod: dict, key: str) -> str | None:
    return pod["metadata"]["labels"].get(LABEL + key)


def _phase(pod: dict) -> str | None:
    return (pod.get("status") or {}).get("phase")


def _started(pod: dict) -> bool:
    """Whether the pod's container ever ran (a Running or terminated container state)."""
    states = [s.get("state") or {} for s in (pod.get("status") or {}).get("containerStatuses") or []]
    return any("running" in s or "terminated" in s for s in states)


def _deleted_while_active(versions: list[dict]) -> list[str]:
    """Versions that carry a ``deletionTimestamp`` while the pod was not yet Succeeded or Failed."""
    return [v["metadata"]["resourceVersion"] for v in versions
            if v["metadata"].get("deletionTimestamp") and _phase(v) not in ("Succeeded", "Failed")]


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


def _ledger(stack: FaultStack, dag_id: str, run_id: str, task_id: str) -> list[dict]:
    """The ledger rows of one TI, oldest first, with the pod columns."""
    cols = ("try_number", "attempt_epoch", "state", "resolution", "pod_name", "pod_uid", "dispatched_at",
            "exchanged_at")
    rows = stack.db(f"select {', '.join(cols)} from leoflow_attempt where dag_id=? and run_id=? and task_id=? "
                    "order by id", dag_id, run_id, task_id)
    return [dict(zip(cols, row)) for row in rows]


def _settled(stack: FaultStack, dag_id: str, run_id: str, task_id: str, timeout: float = 90.0) -> list[dict]:
    """The ledger rows once every epoch is CLOSED (its pod's end seen), or as they are after ``timeout``."""
    def closed() -> list[dict] | None:
        rows = _ledger(stack, dag_id, run_id, task_id)
        return rows if rows and all(r["state"] == "closed" for r in rows) else None

    try:
        return wait_until(closed, timeout, f"every epoch of {dag_id}.{task_id} to be settled")
    except TimeoutError:
        return _ledger(stack, dag_id, run_id, task_id)


def _live_pods(kube: KubeStack) -> list[dict]:
    """The task namespace's pods as the API server lists them now."""
    from kubernetes import client

    return json.loads(client.CoreV1Api(kube.api).list_namespaced_pod(kube.namespace, _preload_content=False)
                      .data)["items"]


def _scheduler_jobs(stack: FaultStack) -> list[int]:
    return [j for (j,) in stack.db("select id from job where job_type = 'SchedulerJob' order by id")]


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
        first_pod = _running_try(stack, kube, NODE_DAG, run, 1)
        before = stack.ti_row(NODE_DAG, run, KTASK)
        assert (before["state"], before["try_number"], before["max_tries"]) == ("running", 1, 0), before

        lost.lose_node()
        t_lost = time.monotonic()
        first_uid = next(r["pod_uid"] for r in _ledger(stack, NODE_DAG, run, KTASK) if r["pod_name"] == first_pod)

        def deleted() -> bool:  # PodGC marked it Failed and deleted it; leoflow's finalizer may still hold it
            kube.record_current()
            return first_uid in kube.pods() and not any(
                p["metadata"]["uid"] == first_uid and not p["metadata"].get("deletionTimestamp")
                for p in _live_pods(kube))

        wait_until(deleted, PODGC_BOUND, "PodGC to delete the lost node's pod")
        print(f"node loss: PodGC deleted the pod {time.monotonic() - t_lost:.0f}s after the Node's deletion")
        replacement = NodeHarness(kube.api, LOST_NODE, kube.workdir / "harness-replacement").start()

        _running_try(stack, kube, NODE_DAG, run, 2)
        _release(stack, run, 2)
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
    rows = _log_rows(stack, NODE_DAG, run)
    infra = [extra for event, extra in rows if event == INFRA]
    assert len(infra) == 1 and "DeletionByPodGC" in infra[0] and "max_tries 0 -> 1" in infra[0], rows
    assert FAILED not in [e for e, _ in rows], rows
    ledger = _closed_rows(stack, run, NODE_DAG)
    assert ledger == [(1, 1, "closed", "infra_redrive"), (2, 1, "closed", "reported")], ledger
    _check_bodies(stack, NODE_DAG, run, lost_tries={1}, ended_tries={2})
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
        pod = _running_try(stack, kube, NODE_DAG, run, 1)
        node.become_unreachable()
        deleted_at = time.monotonic()
        client.CoreV1Api(kube.api).delete_namespaced_pod(pod, kube.namespace, body=client.V1DeleteOptions(
            grace_period_seconds=UNREACHABLE_GRACE))
        wait_until(lambda: stack.ti_row(NODE_DAG, run, KTASK)["try_number"] == 2, VALVE + 180,
                   "the TI re-run as try 2 once the valve opened")
        waited = time.monotonic() - deleted_at
        kept = _live_pods(kube)
        back = NodeHarness(kube.api, LOST_NODE, kube.workdir / "harness-back").start()
        _running_try(stack, kube, NODE_DAG, run, 2)
        _release(stack, run, 2)
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
    rows = _log_rows(stack, NODE_DAG, run)
    infra = [extra for event, extra in rows if event == INFRA]
    assert len(infra) == 1 and f"pod {pod} on node {LOST_NODE} was deleted and reported no end" in infra[0], rows
    assert f"[leoflow] pod_termination_valve {VALVE} s" in infra[0] and "max_tries 0 -> 1" in infra[0], rows
    assert FAILED not in [e for e, _ in rows], rows
    assert _closed_rows(stack, run, NODE_DAG) == [(1, 1, "closed", "infra_redrive"), (2, 1, "closed", "reported")]
    _check_bodies(stack, NODE_DAG, run, lost_tries={1}, ended_tries={2})
    assert _callbacks(stack, NODE_DAG) == callbacks + [f"{NODE_DAG} {KTASK} 2 success"]


def test_an_oom_kill_is_redriven_once_and_the_log_names_it(kube_stack) -> None:
    """The harness OOM-kills the agent container of ``lf_khold.work`` while its body runs (``OOMKilled``, exit 137;
    the whole container's processes die). Re-driven once on the infra budget: try 2, ``max_tries`` 0 → 1, the Log
    row names ``OOMKilled, exit 137, container base``; try 2 runs and succeeds. A second run is OOM-killed on both
    tries: the second kill fails the TI through Airflow (no third try) with a ``leoflow task failed`` Log row
    naming it."""
    stack, kube = kube_stack
    once = stack.trigger_with(HOLD_DAG)
    twice = stack.trigger_with(HOLD_DAG)
    for run in (once, twice):
        kube.harness.oom_kill(kube.namespace, _running_try(stack, kube, HOLD_DAG, run, 1))
    _running_try(stack, kube, HOLD_DAG, once, 2)
    _release(stack, once, 2)
    kube.harness.oom_kill(kube.namespace, _running_try(stack, kube, HOLD_DAG, twice, 2))
    assert stack.wait_for_run(HOLD_DAG, once, timeout=240) == "success"
    assert stack.wait_for_run(HOLD_DAG, twice, timeout=240) == "failed"

    ti = stack.ti_row(HOLD_DAG, once, KTASK)
    assert (ti["state"], ti["try_number"], ti["max_tries"]) == ("success", 2, 1), ti
    rows = _log_rows(stack, HOLD_DAG, once)
    infra = [extra for event, extra in rows if event == INFRA]
    assert len(infra) == 1 and infra[0].startswith("OOMKilled, exit 137, container base (pod "), rows
    assert "max_tries 0 -> 1" in infra[0], rows
    ledger = _closed_rows(stack, once, HOLD_DAG)
    assert ledger == [(1, 1, "closed", "oom_redrive"), (2, 1, "closed", "reported")], ledger
    _check_bodies(stack, HOLD_DAG, once, lost_tries={1}, ended_tries={2})

    ti = stack.ti_row(HOLD_DAG, twice, KTASK)
    assert (ti["state"], ti["try_number"], ti["max_tries"]) == ("failed", 2, 1), ti
    rows = _log_rows(stack, HOLD_DAG, twice)
    assert [e for e, _ in rows].count(INFRA) == 1, rows
    failed = [extra for event, extra in rows if event == FAILED]
    assert len(failed) == 1 and failed[0].startswith("OOMKilled, exit 137, container base (pod "), rows
    assert "OOM-killed again" in failed[0], rows
    ledger = _closed_rows(stack, twice, HOLD_DAG)
    assert ledger == [(1, 1, "closed", "oom_redrive"), (2, 1, "closed", "executor_failed")], ledger
    _check_bodies(stack, HOLD_DAG, twice, lost_tries={1, 2}, ended_tries=set())


def test_an_eviction_through_the_eviction_api_is_redriven_naming_it(kube_stack) -> None:
    """``lf_khold.work``'s pod is evicted through the real Eviction API while its body runs (no
    PodDisruptionBudget: the API server adds ``DisruptionTarget`` ``EvictionByEvictionAPI`` and deletes it; the
    harness stops it as a kubelet does). Re-driven on the infra budget: try 2, ``max_tries`` 0 → 1, the Log row
    names ``EvictionByEvictionAPI``, no retry or failure callback; try 2 succeeds; try 1's body never ended."""
    from kubernetes import client

    stack, kube = kube_stack
    run = stack.trigger_with(HOLD_DAG)
    pod = _running_try(stack, kube, HOLD_DAG, run, 1)
    client.CoreV1Api(kube.api).create_namespaced_pod_eviction(pod, kube.namespace, client.V1Eviction(
        metadata=client.V1ObjectMeta(name=pod, namespace=kube.namespace)))
    _running_try(stack, kube, HOLD_DAG, run, 2)
    _release(stack, run, 2)
    assert stack.wait_for_run(HOLD_DAG, run, timeout=240) == "success"

    ti = stack.ti_row(HOLD_DAG, run, KTASK)
    assert (ti["state"], ti["try_number"], ti["max_tries"]) == ("success", 2, 1), ti
    rows = _log_rows(stack, HOLD_DAG, run)
    infra = [extra for event, extra in rows if event == INFRA]
    assert len(infra) == 1 and "EvictionByEvictionAPI" in infra[0] and "max_tries 0 -> 1" in infra[0], rows
    ledger = _closed_rows(stack, run, HOLD_DAG)
    assert ledger == [(1, 1, "closed", "infra_redrive"), (2, 1, "closed", "reported")], ledger
    _check_bodies(stack, HOLD_DAG, run, lost_tries={1}, ended_tries={2})


def test_a_pod_past_its_deadline_fails_the_task_with_the_reason_never_redriven(kube_stack) -> None:
    """The harness ends ``lf_khold.work``'s pod as the kubelet's ``activeDeadlineSeconds`` check does (Failed,
    reason ``DeadlineExceeded``) while its body runs: the TI fails at try 1 (``max_tries`` still 0, no infra
    re-drive) with a ``leoflow task failed`` Log row naming ``DeadlineExceeded``; its body ran once, never ended."""
    stack, kube = kube_stack
    run = stack.trigger_with(HOLD_DAG)
    kube.harness.exceed_deadline(kube.namespace, _running_try(stack, kube, HOLD_DAG, run, 1))
    assert stack.wait_for_run(HOLD_DAG, run, timeout=240) == "failed"

    ti = stack.ti_row(HOLD_DAG, run, KTASK)
    assert (ti["state"], ti["try_number"], ti["max_tries"]) == ("failed", 1, 0), ti
    rows = _log_rows(stack, HOLD_DAG, run)
    assert INFRA not in [e for e, _ in rows], rows
    failed = [extra for event, extra in rows if event == FAILED]
    assert len(failed) == 1 and failed[0].startswith("DeadlineExceeded: Pod was active on the node longer than the "
                                                     "specified deadline"), rows
    ledger = _closed_rows(stack, run, HOLD_DAG)
    assert ledger == [(1, 1, "closed", "executor_failed")], ledger
    _check_bodies(stack, HOLD_DAG, run, lost_tries={1}, ended_tries=set())


def test_scheduler_sigkilled_with_five_pods_running_adopts_them_all(kube_stack) -> None:
    """Five tasks run in five pods, each body holding until released; the scheduler is SIGKILLed and a new one
    started. The new scheduler's job owns every TI; every pod the namespace ever held for those TIs is one of the
    five seen before the kill (none created), none got a ``deletionTimestamp`` while it ran (none deleted), each
    body ran once, and every TI ends SUCCESS at try 1 with one ledger epoch, reported by its own agent."""
    stack, kube = kube_stack
    run = stack.trigger_with(ADOPT_DAG)

    def all_running() -> dict[str, str] | None:
        if not all(executions(stack, ADOPT_DAG, t, run) for t in ADOPT_TASKS):
            return None
        rows = {t: _ledger(stack, ADOPT_DAG, run, t) for t in ADOPT_TASKS}
        if not all(len(r) == 1 and r[0]["pod_uid"] for r in rows.values()):
            return None  # the scheduler has not yet recorded every pod's UID: the state the restart must find
        uids = {t: r[0]["pod_uid"] for t, r in rows.items()}
        pods = kube.pods()
        running = all(pods.get(uid) and _phase(pods[uid][-1]) == "Running" for uid in uids.values())
        return uids if running else None

    before = wait_until(all_running, 240, "five pods Running, their bodies started and their UIDs recorded")
    (old_job,) = {stack.ti_row(ADOPT_DAG, run, t)["queued_by_job_id"] for t in ADOPT_TASKS}

    stack.kill_component("scheduler", signal.SIGKILL)
    stack.start_component("scheduler")

    def adopted() -> int | None:
        jobs = [j for j in _scheduler_jobs(stack) if j != old_job]
        if not jobs:
            return None
        owners = {stack.ti_row(ADOPT_DAG, run, t)["queued_by_job_id"] for t in ADOPT_TASKS}
        return jobs[-1] if owners == {jobs[-1]} else None

    new_job = wait_until(adopted, 240, "the new scheduler's job to own every TI")
    stack.release(run)
    assert stack.wait_for_run(ADOPT_DAG, run, timeout=240) == "success"

    problems = []
    for t in ADOPT_TASKS:
        ti = stack.ti_row(ADOPT_DAG, run, t)
        epochs = [(r["try_number"], r["attempt_epoch"], r["state"], r["resolution"], r["pod_uid"])
                  for r in _settled(stack, ADOPT_DAG, run, t)]
        pods = _ended_pods(kube, _ti_id(stack, ADOPT_DAG, run, t))
        execs = executions(stack, ADOPT_DAG, t, run)
        if (ti["state"], ti["try_number"], ti["queued_by_job_id"]) != ("success", 1, new_job):
            problems.append(f"{t}: must succeed at try 1 under the new scheduler's job {new_job}: {ti}")
        if list(pods) != [before[t]]:
            problems.append(f"{t}: pods {sorted(pods)}, expected only the one running before the kill {before[t]}")
        for uid, versions in pods.items():
            if _deleted_while_active(versions):
                problems.append(f"{t}: pod {uid} was deleted while it ran: {_deleted_while_active(versions)}")
            if _phase(versions[-1]) != "Succeeded":
                problems.append(f"{t}: pod {uid} ended {_phase(versions[-1])}")
        if len(execs) != 1 or not execs[0].ended or execs[0].try_number != 1:
            problems.append(f"{t}: the body must run once, at try 1, to its end: {execs}")
        if epochs != [(1, 1, "closed", "reported", before[t])]:
            problems.append(f"{t}: ledger {epochs}")
        if INFRA in stack.log_events(ADOPT_DAG, run, t):
            problems.append(f"{t}: re-driven: {stack.log_events(ADOPT_DAG, run, t)}")
    assert not problems, "\n".join(problems)


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

    ti_id = _ti_id(stack, REVOKE_DAG, run, REVOKE_TASK)
    ti = stack.ti_row(REVOKE_DAG, run, REVOKE_TASK)
    rows = _settled(stack, REVOKE_DAG, run, REVOKE_TASK)
    pods = _ended_pods(kube, ti_id)
    execs = executions(stack, REVOKE_DAG, REVOKE_TASK, run)
    events = stack.log_events(REVOKE_DAG, run, REVOKE_TASK)
    seen = {uid: [(_phase(v), bool(v["metadata"].get("deletionTimestamp"))) for v in versions]
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
    assert _deleted_while_active(second) == [] and _phase(second[-1]) == "Succeeded", seen
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
    (row,) = _settled(stack, WAIT_DAG, wait_run, WAIT_TASK)
    pod = _ended_pods(kube, _ti_id(stack, WAIT_DAG, wait_run, WAIT_TASK))[uid]
    started = min(_ts(s["state"]["running"]["startedAt"]) for v in pod
                  for s in (v.get("status") or {}).get("containerStatuses") or [] if "running" in s["state"])
    assert started - _ts(pod[0]["metadata"]["creationTimestamp"]) > TOKEN_DEAD_AFTER, pod[-1].get("status")
    assert _phase(pod[-1]) == "Succeeded", pod[-1].get("status")
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
    (row,) = _settled(stack, LONG_DAG, long_run, LONG_TASK)
    assert (row["state"], row["resolution"]) == ("closed", "reported"), row
    for dag_id, run, task in ((WAIT_DAG, wait_run, WAIT_TASK), (LONG_DAG, long_run, LONG_TASK)):
        events = stack.log_events(dag_id, run, task)
        assert STUCK not in events and INFRA not in events, (dag_id, events)


def _lines(path: Path) -> list[str]:
    return [line.split(" pid=")[0] for line in path.read_text().splitlines()] if path.exists() else []


def test_a_success_force_deleted_after_termination_is_settled_from_its_record_and_ran_once(kube_stack) -> None:
    """"A success whose pod is force-deleted after termination: with the finalizer, settled SUCCESS from the record;
    the body ran once". ``leoflow_test_finalizer``'s ``body`` waits for the test's go; the test freezes the scheduler
    (SIGSTOP), lets the body finish: its agent writes the outcome record into the termination message and is
    SIGKILLed before its terminal PATCH (TEST-ONLY fault ``after_record``), so the record is the only evidence of the
    success. The pod ends; the test deletes it with grace 0 (``kubectl delete --force --grace-period=0``, what PodGC
    does), kills the frozen scheduler (it never read the pod) and starts a new one. The finalizer kept the pod,
    terminal and deleting, so the successor reads the record, settles the body SUCCESS from it (the ledger says
    ``replayed``), releases the finalizer and the pod goes; the body ran once and ``downstream`` ran once. Without
    the finalizer the delete would take the record with the pod, and the successor would re-run the body on the
    infra budget."""
    from kubernetes import client

    stack, kube = kube_stack
    core = client.CoreV1Api(kube.api)
    ns = kube.namespace
    body_trace = stack.traces_dir / "finalizer_body.txt"
    run_id = stack.trigger_with(FINALIZER_DAG)
    wait_until(lambda: _lines(body_trace) == ["started"], 300, "the body to start in its pod")
    [pod] = [p for p in core.list_namespaced_pod(ns).items
             if (p.metadata.labels.get(LABEL + "dag-id"), p.metadata.labels.get(LABEL + "task-id"))
             == (FINALIZER_DAG, "body")]
    name, uid = pod.metadata.name, pod.metadata.uid
    stack.stop_component("scheduler")  # from here on no scheduler reads the pod
    (stack.traces_dir / f"finalizer_go.{run_id}").write_text("go\n")

    def ended():
        p = core.read_namespaced_pod(name, ns)
        return p if p.status.phase in ("Succeeded", "Failed") else None

    ended_pod = wait_until(ended, 120, "the body's pod to end")
    message = ended_pod.status.container_statuses[0].state.terminated.message
    assert message and '"state":"success"' in message.replace(" ", ""), message
    core.delete_namespaced_pod(name, ns, body=client.V1DeleteOptions(
        grace_period_seconds=0, preconditions=client.V1Preconditions(uid=uid)))
    kept = core.read_namespaced_pod(name, ns)  # the finalizer keeps it, record and all
    assert kept.metadata.uid == uid and kept.metadata.deletion_timestamp is not None
    assert kept.status.container_statuses[0].state.terminated.message == message
    stack.kill_component("scheduler", signal.SIGKILL, resume=True)  # it never read the pod
    stack.start_component("scheduler")
    state = stack.wait_for_run(FINALIZER_DAG, run_id, timeout=600)
    wait_until(lambda: uid not in {p.metadata.uid for p in core.list_namespaced_pod(ns).items}, 120,
               "the successor to release the settled pod")
    tasks = stack.task_states(FINALIZER_DAG, run_id)
    assert state == "success" and tasks == {"body": "success", "downstream": "success"}, (state, tasks)
    assert _lines(body_trace) == ["started", "ran"]  # the body ran once
    assert _lines(stack.traces_dir / "finalizer_downstream.txt") == ["ran"]
    rows = [(r["try_number"], r["attempt_epoch"], r["state"], r["resolution"])
            for r in _ledger(stack, FINALIZER_DAG, run_id, "body")]
    assert rows == [(1, 1, "closed", "replayed")]  # settled SUCCESS from the record


# ---------------------------------------------------------------------------------------------------- plumbing


def _delete_node(kube: KubeStack) -> None:
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    try:
        client.CoreV1Api(kube.api).delete_node(LOST_NODE)
    except ApiException as exc:
        if exc.status != 404:
            raise
