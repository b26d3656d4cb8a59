"""Issue 8, hole 10: re-entrant dispatch claims two epochs (review finding 10).

On a977a55 a dispatch settled the previous epoch of its ``ti_id`` inline: ``_dispatch_task`` ->
``_prove_dead_and_close`` -> ``_settle`` -> (TI QUEUED, no record: the agent died before ``/run``) ->
``_redispatch``, which dispatched the ``ti_id`` again from inside the outer dispatch (epoch N+1); back in the
outer call the previous row was CLOSED, so it claimed and launched epoch N+2 as well: two agents of one try
racing ``/run``. Now a dispatch never settles: a previous epoch that is not CLOSED answers DEFERRED, the
cycle settles it (REDISPATCHED) and re-offers the workload, and the next dispatch claims one epoch.

How a real Airflow gets there: Airflow offers the same ``ti_id`` again only after a hand-off (deferred,
rescheduled: the epoch left a record, so it settles as CLOSE, never as a re-dispatch) or after its
stuck-in-queued handling (``[scheduler] task_queued_timeout``): ``revoke_task`` kills the attempt, then the TI
goes back to SCHEDULED with the same ``ti_id`` and is queued again. The revoke closes the epoch whenever its
kill completes. It does not complete when the agent is in uninterruptible sleep (state ``D``: a hung NFS mount,
a dying disk): SIGKILL stays pending, the row stays open, and the re-queued dispatch waits while the agent
lives. When the I/O returns, the pending SIGKILL takes the agent down before ``/run``, leaving no record while
the TI is QUEUED at the same ``ti_id``: exactly the re-entrant path.

Scenario: ``lf_h10.work`` with the ``hang_before_run`` fault on epoch 1, so its agent waits before ``/run``;
the test holds that agent (and its task process) in ``D`` with a freezer cgroup (:class:`Freezer`), waits for
Airflow to revoke and queue the TI again, then thaws it. Asserted: exactly one epoch per dispatch (epoch 1
for the first, re-dispatched; epoch 2 for the re-queued one), the body ran once, the TI ends SUCCESS at try
1, and no infra re-drive was needed. On a977a55 the thaw launched epochs 2 and 3 from the one re-queued
dispatch; in the run observed, epoch 2 won ``/run`` and ran the body, epoch 3 got 409 and exited without a
record, so its TI (RUNNING, current epoch, no record) was re-driven as try 2 and the body ran a second time.
"""

from __future__ import annotations

import os
import uuid

import pytest

from fault_helpers import FaultStack, Freezer, executions, wait_until
from lite_procs import descendants

pytestmark = [
    pytest.mark.airflow,
    pytest.mark.skipif(not Freezer.available(), reason="needs a writable freezer cgroup v1 hierarchy "
                                                         "(/sys/fs/cgroup/freezer) to hold an agent in D state"),
]

DAG, TASK = "lf_h10", "work"
QUEUED_TIMEOUT = 30.0
EXTRA = {
    # Airflow revokes and re-queues a TI QUEUED longer than this (checked every 2 s); the dispatch-lost reaper
    # (``[leoflow] dispatch_lost_threshold``, 120 s) stays out of the way. The re-queued dispatch must reach
    # /run within it too, or Airflow revokes again
    "AIRFLOW__SCHEDULER__TASK_QUEUED_TIMEOUT": str(QUEUED_TIMEOUT),
    "AIRFLOW__SCHEDULER__TASK_QUEUED_TIMEOUT_CHECK_INTERVAL": "2",
}
STUCK = "stuck in queued reschedule"
INFRA = "leoflow infra re-drive"


def _settled_epochs(stack: FaultStack, run: str, timeout: float = 60.0) -> list[dict]:
    """The ledger rows of ``run``'s TI once all are CLOSED (a reported epoch closes once its agent exited), or
    as they are after ``timeout`` seconds (the assertion on them then shows what stayed open)."""
    def closed() -> list[dict] | None:
        rows = stack.attempts(DAG, run, TASK)
        return rows if rows and all(a["state"] == "closed" for a in rows) else None

    try:
        return wait_until(closed, timeout, "every epoch to be settled")
    except TimeoutError:
        return stack.attempts(DAG, run, TASK)


def test_a_requeued_ti_whose_unkillable_agent_dies_claims_one_epoch(tmp_path_factory: pytest.TempPathFactory) -> None:
    """See the module docstring."""
    with FaultStack(tmp_path_factory.mktemp("hole10"), extra_env=EXTRA, parallelism=4) as stack:
        stack.up([DAG])
        stack.warm_execution_api()  # its cold start would otherwise delay leoflow's re-dispatch past Airflow's revoke
        run = stack.trigger_with(DAG, {f"{TASK}/1/1": "hang_before_run"})
        first = wait_until(lambda: next((a for a in stack.attempts(DAG, run, TASK) if a["pid"]), None), 120,
                           "epoch 1's agent to start")
        freezer = Freezer(f"leoflow-hole10-{os.getpid()}")
        try:
            freezer.add(first["pid"])  # first: a child it forks from now on is frozen with it
            for child in descendants(first["pid"]):
                freezer.add(child.pid)
            freezer.freeze()

            def requeued() -> bool:
                return (stack.ti_row(DAG, run, TASK).get("state") == "queued"
                        and STUCK in stack.log_events(DAG, run, TASK))

            wait_until(requeued, QUEUED_TIMEOUT + 120, "Airflow to revoke the stuck TI and queue it again", poll=0.2)
            rows = stack.attempts(DAG, run, TASK)
            # the scenario's precondition: the revoke could not kill the agent, so epoch 1 is still open
            assert [(a["attempt_epoch"], a["state"] != "closed") for a in rows] == [(1, True)], rows
            same_id = uuid.UUID(rows[0]["ti_id"]) == uuid.UUID(stack.ti_row(DAG, run, TASK)["id"])
            assert same_id, "the same ti_id was queued again"
        finally:
            freezer.close()  # the I/O returns: the pending SIGKILL takes the agent down before /run

        assert stack.wait_for_run(DAG, run, timeout=180) == "success"
        ti = stack.ti_row(DAG, run, TASK)
        rows = _settled_epochs(stack, run)
        epochs = [(a["try_number"], a["attempt_epoch"], a["state"], a["resolution"]) for a in rows]
        execs = executions(stack, DAG, TASK, run)
        events = stack.log_events(DAG, run, TASK)
        # one epoch per dispatch: the first dispatch's (re-dispatched after its agent died before /run), and the
        # re-queued dispatch's; a977a55 launched epochs 2 and 3 from that one dispatch
        assert epochs == [(1, 1, "closed", "redispatched"), (1, 2, "closed", "reported")], (epochs, execs, events)
        assert len(execs) == 1 and execs[0].ended and execs[0].try_number == 1, execs
        assert (ti["state"], ti["try_number"], ti["max_tries"]) == ("success", 1, 0), ti
        assert INFRA not in events and events.count(STUCK) == 1, events
