"""What the Kubernetes end-to-end modules read of one task instance's attempts (``test_kube_faults_e2e.py`` on the
node harness, ``test_kube_pod_ends_e2e.py`` on either node): its ledger rows and event log, its pods as the stack's
pod recorder saw them (:meth:`devtools.kube.KubeStack.pods`), and its bodies' executions
(:func:`fault_helpers.executions`).
Each body of these modules holds until the test releases its try (:func:`fault_trace.hold`)."""

from __future__ import annotations

import uuid

from devtools.kube import KubeStack
from fault_helpers import FaultStack, executions, overlaps, wait_until

TASK = "work"
"""The task of every DAG these modules fault (``tests/fault_dags/leoflow_kube.py``)."""
LABEL = "leoflow.io/"


def closed_rows(stack: FaultStack, run_id: str, dag_id: str, task_id: str = TASK) -> list[tuple]:
    """``(try_number, attempt_epoch, state, resolution)`` of each ledger row of the TI once every row is closed (a
    pod's end is seen after its TI's report), or as they are after 90 s (:func:`settled_rows`)."""
    return [(r["try_number"], r["attempt_epoch"], r["state"], r["resolution"])
            for r in settled_rows(stack, dag_id, run_id, task_id)]


def log_rows(stack: FaultStack, dag_id: str, run_id: str, task_id: str = TASK) -> list[tuple[str, str]]:
    """``(event, extra)`` of the TI's event log (Airflow's ``log`` table, the UI's event log), oldest first."""
    return stack.db("select event, coalesce(extra, '') from log where dag_id=? and run_id=? and task_id=? "
                    "order by id", dag_id, run_id, task_id)


def running_try(stack: FaultStack, kube: KubeStack, dag_id: str, run_id: str, try_number: int,
                task_id: str = TASK) -> str:
    """Wait until the body of ``try_number`` has started in a Running pod whose UID the ledger holds; the pod's
    name."""
    def started() -> str | None:
        if not [e for e in executions(stack, dag_id, task_id, run_id) if e.try_number == try_number]:
            return None
        rows = [r for r in ledger_rows(stack, dag_id, run_id, task_id)
                if r["try_number"] == try_number and r["pod_uid"]]
        if not rows:
            return None
        name, uid = rows[-1]["pod_name"], rows[-1]["pod_uid"]
        versions = kube.pods().get(uid)
        return name if versions and (versions[-1].get("status") or {}).get("phase") == "Running" else None

    return wait_until(started, 240, f"{dag_id} try {try_number}'s body running in its pod")


def release_try(stack: FaultStack, run_id: str, try_number: int) -> None:
    """Let the held body of ``try_number`` end (:func:`fault_trace.hold`: ``traces/release.<run_id>.<try>``)."""
    (stack.traces_dir / f"release.{run_id}.{try_number}").write_text("go\n")


def check_bodies(stack: FaultStack, dag_id: str, run_id: str, *, lost_tries: set[int], ended_tries: set[int],
                 task_id: str = TASK) -> list:
    """The body executions of the TI, after asserting: one per try in ``lost_tries | ended_tries``, those of
    ``lost_tries`` never ended (their pod was lost or stopped before the body's end), those of ``ended_tries``
    ended; no two overlapped; none started after one had ended (a recorded success never runs again)."""
    execs = executions(stack, dag_id, task_id, run_id)
    assert sorted(e.try_number for e in execs) == sorted(lost_tries | ended_tries), execs
    assert {e.try_number for e in execs if not e.ended} == lost_tries, execs
    assert overlaps(execs) == [], execs
    for i, e in enumerate(execs):
        assert not (e.ended and execs[i + 1:]), f"a body ran after one that ended: {execs}"
    return execs


def ti_id_of(stack: FaultStack, dag_id: str, run_id: str, task_id: str) -> str:
    """The TI's id, as the pods' ``leoflow.io/ti-id`` label writes it (a UUID with dashes)."""
    return str(uuid.UUID(stack.ti_row(dag_id, run_id, task_id)["id"]))


def pods_of(kube: KubeStack, ti_id: str) -> dict[str, list[dict]]:
    """``{uid: every version seen, oldest first}`` of the pods labelled with ``ti_id``."""
    return {uid: versions for uid, versions in kube.pods().items()
            if versions[-1]["metadata"]["labels"].get(LABEL + "ti-id") == ti_id}


def ended_pods(kube: KubeStack, ti_id: str, timeout: float = 60.0) -> dict[str, list[dict]]:
    """:func:`pods_of` once each pod is Succeeded, Failed or deleted (its agent may still be exiting when its
    TI is already SUCCESS), or as they are after ``timeout`` seconds (the assertions then show what still runs)."""
    def ended() -> dict[str, list[dict]] | None:
        pods = pods_of(kube, ti_id)
        done = all(pod_phase(v[-1]) in ("Succeeded", "Failed") or v[-1]["metadata"].get("deletionTimestamp")
                   for v in pods.values())
        return pods if pods and done else None

    try:
        return wait_until(ended, timeout, f"the pods of TI {ti_id} to end")
    except TimeoutError:
        return pods_of(kube, ti_id)


def pod_phase(pod: dict) -> str | None:
    """``status.phase`` of a pod's JSON, or None."""
    return (pod.get("status") or {}).get("phase")


def deleted_while_active(versions: list[dict]) -> list[str]:
    """Versions that carry a ``deletionTimestamp`` while the pod was not yet Succeeded or Failed."""
    return [v["metadata"]["resourceVersion"] for v in versions
            if v["metadata"].get("deletionTimestamp") and pod_phase(v) not in ("Succeeded", "Failed")]


def ledger_rows(stack: FaultStack, dag_id: str, run_id: str, task_id: str) -> list[dict]:
    """The ledger rows of one TI, oldest first, with the pod columns."""
    cols = ("try_number", "attempt_epoch", "state", "resolution", "pod_name", "pod_uid", "dispatched_at",
            "exchanged_at")
    rows = stack.db(f"select {', '.join(cols)} from leoflow_attempt where dag_id=? and run_id=? and task_id=? "
                    "order by id", dag_id, run_id, task_id)
    return [dict(zip(cols, row)) for row in rows]


def settled_rows(stack: FaultStack, dag_id: str, run_id: str, task_id: str, timeout: float = 90.0) -> list[dict]:
    """The ledger rows once every epoch is CLOSED (its pod's end seen), or as they are after ``timeout``."""
    def closed() -> list[dict] | None:
        rows = ledger_rows(stack, dag_id, run_id, task_id)
        return rows if rows and all(r["state"] == "closed" for r in rows) else None

    try:
        return wait_until(closed, timeout, f"every epoch of {dag_id}.{task_id} to be settled")
    except TimeoutError:
        return ledger_rows(stack, dag_id, run_id, task_id)


def scheduler_jobs(stack: FaultStack) -> list[int]:
    """The ids of the stack's scheduler jobs, oldest first."""
    return [j for (j,) in stack.db("select id from job where job_type = 'SchedulerJob' order by id")]
