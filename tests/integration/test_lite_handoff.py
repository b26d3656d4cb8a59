"""Queue-ahead and in-band hand-off with long tasks: a workload held ahead is a task instance in QUEUED, and
Airflow revokes one that stays QUEUED past ``[scheduler] task_queued_timeout``. The adaptive queue-ahead depth
(``leoflow_airflow.dispatch.ahead``) keeps long tasks waiting in SCHEDULED instead."""

from __future__ import annotations

import sqlite3

import pytest

from lite_procs import lite_stack

HOLD = "leoflow_test_hold"


def ledger_rows(stack, dag_id: str, run_id: str) -> list[tuple[str, int, str, str | None]]:
    """``(task_id, attempt_epoch, state, resolution)`` of every ledger row of one DAG run."""
    with sqlite3.connect(f"file:{stack.home / 'airflow.db'}?mode=ro", uri=True, timeout=30) as db:
        return db.execute(
            "select task_id, attempt_epoch, state, resolution from leoflow_attempt where dag_id = ? and run_id = ? "
            "order by task_id, attempt_epoch", (dag_id, run_id),
        ).fetchall()


def stuck_in_queued_events(stack) -> list[str]:
    """Airflow's stuck-in-queued Log rows (re-schedule or fail), as ``event: extra``."""
    with sqlite3.connect(f"file:{stack.home / 'airflow.db'}?mode=ro", uri=True, timeout=30) as db:
        rows = db.execute("select event, extra from log where event like '%stuck in queued%'").fetchall()
    return [f"{event}: {extra}" for event, extra in rows]


@pytest.mark.airflow
@pytest.mark.timeout(400)
def test_long_tasks_are_not_held_queued_into_stuck_in_queued(tmp_path):
    """One slot and 25 s tasks, with ``task_queued_timeout`` 20 s checked every 5 s. After one 5 s task has
    finished (already longer than the queue-ahead's horizon, ``task_queued_timeout`` / 10), two 25 s tasks are
    triggered at once. A fixed queue-ahead would hold the second of them QUEUED for
    25 s, and Airflow would revoke and re-schedule it as stuck. The adaptive depth holds nothing ahead for
    tasks this long, so it waits in SCHEDULED: all succeed on their first epoch with no stuck-in-queued event."""
    env = {
        "AIRFLOW__SCHEDULER__TASK_QUEUED_TIMEOUT": "20",
        "AIRFLOW__SCHEDULER__TASK_QUEUED_TIMEOUT_CHECK_INTERVAL": "5",
        "AIRFLOW__LEOFLOW__DISPATCH_LOST_THRESHOLD": "10",
        "AIRFLOW__LEOFLOW__QUEUE_AHEAD": "4",
    }
    with lite_stack(tmp_path / "home", parallelism=1, extra_env=env) as stack:
        stack.migrate()
        stack.start(wait_for_dags=[HOLD])
        stack.unpause(HOLD)
        # one attempt first, so the executor has seen how long these take (before that, at scheduler start,
        # it holds one slot's worth ahead: parallelism, see QueueAhead.depth)
        runs = [stack.trigger(HOLD, conf={"seconds": 5})]
        assert stack.wait_for_run(HOLD, runs[0], timeout=120) == "success"
        runs += [stack.trigger(HOLD, conf={"seconds": 25}) for _ in range(2)]
        states = [stack.wait_for_run(HOLD, run, timeout=240) for run in runs[1:]]
        assert states == ["success"] * 2, states
        assert stuck_in_queued_events(stack) == []
        for run in runs:
            assert [(t, e) for t, e, _, _ in ledger_rows(stack, HOLD, run)] == [("hold", 1)]
