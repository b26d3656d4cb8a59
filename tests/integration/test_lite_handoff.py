"""In-band hand-off (``leoflow_agent.handoff``): with every slot busy, a workload the executor holds ahead is
handed to the zygote, which starts it the moment the busy agent reports; its workload token is re-minted
while it waits, so a wait longer than the token's lifetime (``[scheduler] task_queued_timeout``) still starts
on its first epoch instead of failing ``/run`` and being re-dispatched."""

from __future__ import annotations

import sqlite3

import pytest

from lite_procs import agents, lite_stack, wait_for

PROBE = "leoflow_test_probe"
HOLD = "leoflow_test_hold"


def ledger_rows(stack, dag_id: str, run_id: str) -> list[tuple[str, int, str, str | None]]:
    """``(task_id, attempt_epoch, state, resolution)`` of every ledger row of one DAG run."""
    with sqlite3.connect(f"file:{stack.home / 'airflow.db'}?mode=ro", uri=True, timeout=30) as db:
        return db.execute(
            "select task_id, attempt_epoch, state, resolution from leoflow_attempt where dag_id = ? and run_id = ? "
            "order by task_id, attempt_epoch", (dag_id, run_id),
        ).fetchall()


@pytest.mark.airflow
@pytest.mark.timeout(300)
def test_held_launch_outwaits_its_first_token_and_starts_on_epoch_one(tmp_path):
    """One slot, busy for 25 s; the next task waits in the zygote meanwhile, longer than the 10 s a workload
    token lives. It still succeeds on its first epoch (no re-dispatch), because its token was replaced
    while it waited."""
    env = {
        "AIRFLOW__SCHEDULER__TASK_QUEUED_TIMEOUT": "10",  # the workload token's lifetime
        "AIRFLOW__SCHEDULER__TASK_QUEUED_TIMEOUT_CHECK_INTERVAL": "3600",  # no stuck-in-queued revoke meanwhile
        "AIRFLOW__LEOFLOW__DISPATCH_LOST_THRESHOLD": "5",
        "AIRFLOW__LEOFLOW__QUEUE_AHEAD": "1",
    }
    with lite_stack(tmp_path / "home", parallelism=1, extra_env=env) as stack:
        stack.migrate()
        stack.start(wait_for_dags=[PROBE, HOLD])
        for dag in (PROBE, HOLD):
            stack.unpause(dag)
        hold_run = stack.trigger(HOLD, conf={"seconds": 25})
        wait_for(lambda: [a for a in agents(stack) if b".hold " in a.cmdline], 60, "the hold agent")
        probe_run = stack.trigger(PROBE)
        assert stack.wait_for_run(HOLD, hold_run, timeout=180) == "success"
        assert stack.wait_for_run(PROBE, probe_run, timeout=120) == "success", stack.task_states(PROBE, probe_run)
        rows = ledger_rows(stack, PROBE, probe_run)
        assert [(task, epoch) for task, epoch, _, _ in rows] == [("echo", 1), ("hello", 1)], rows
