"""Issue 8, hole 3: a scheduler restart spends user retries.

TIs Airflow marked QUEUED for leoflow that leoflow had not started (still in the executor's
``queued_tasks``: deferred because the zygote's launch queue was full, or not yet handed over) have no ledger
row. After a scheduler crash, ``try_adopt_task_instances`` returns them and Airflow resets them: they run as a
new try with ``max_tries`` unchanged, i.e. on the user's retries (review finding 13c). A scheduler crash is an
infra fault: the successor must start them, or credit the reset on the infra budget.

Scenario: ``lf_h3``, 24 two-second tasks with ``retries=0``, ``[core] parallelism`` 4, ``[leoflow]
queue_ahead`` 12 and ``launch_queue_size`` 2 (so a dispatch burst leaves QUEUED TIs waiting in
``queued_tasks``). Once at least two TIs are QUEUED with no ledger row, SIGKILL the scheduler and start a new
one. Asserted: the run succeeds; no task spent a user retry (``try_number - 1 == max_tries - retries``, the
measure of ``test_lite_chaos.py``); no body ran twice.
"""

from __future__ import annotations

import signal

import pytest

from fault_helpers import FaultStack, executions, overlaps, wait_until

pytestmark = pytest.mark.airflow

DAG = "lf_h3"
TASKS = [f"t{i:02d}" for i in range(24)]
RETRIES = 0
EXTRA = {
    "AIRFLOW__LEOFLOW__QUEUE_AHEAD": "12",
    "AIRFLOW__LEOFLOW__LAUNCH_QUEUE_SIZE": "2",
    "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_THRESHOLD": "10",
    "AIRFLOW__SCHEDULER__ORPHANED_TASKS_CHECK_INTERVAL": "5",
}


def _queued_unclaimed(stack: FaultStack, run: str) -> list[str]:
    """Task ids of the run's TIs that are QUEUED and have no ledger row (leoflow has not started them)."""
    rows = stack.db("select task_id from task_instance where dag_id = ? and run_id = ? and state = 'queued' "
                    "and id not in (select ti_id from leoflow_attempt)", DAG, run)
    return [t for (t,) in rows]


def test_a_scheduler_crash_spends_no_user_retry(tmp_path_factory: pytest.TempPathFactory) -> None:
    """See the module docstring."""
    with FaultStack(tmp_path_factory.mktemp("hole3"), extra_env=EXTRA, parallelism=4) as stack:
        stack.up([DAG])
        run = stack.trigger_with(DAG)
        waiting = wait_until(lambda: len(q := _queued_unclaimed(stack, run)) >= 2 and q, 240,
                             "two QUEUED TIs that leoflow has not started")
        stack.kill_component("scheduler", signal.SIGKILL)
        stack.start_component("scheduler")
        assert stack.wait_for_run(DAG, run, timeout=400) == "success"

        problems = [f"QUEUED and not started at the kill: {waiting}"]
        for t in TASKS:
            ti = stack.ti_row(DAG, run, t)
            execs = executions(stack, DAG, t, run)
            if ti["state"] != "success":
                problems.append(f"{t}: {ti}")
            if ti["try_number"] - 1 != ti["max_tries"] - RETRIES:
                problems.append(f"{t}: user retry spent: try {ti['try_number']} of max_tries {ti['max_tries']}")
            if overlaps(execs) or sum(e.ended for e in execs) != 1:
                problems.append(f"{t}: bodies {execs}")
        assert len(problems) == 1, "\n".join(problems)
