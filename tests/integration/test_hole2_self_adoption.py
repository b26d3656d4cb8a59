"""Issue 8, hole 2: a stalled scheduler adopts its own tasks and runs two bodies at once.

Airflow's ``adopt_or_reset_orphaned_tasks`` marks every SchedulerJob whose heartbeat is older than
``[scheduler] scheduler_health_check_threshold`` failed, its own included, and passes the TIs those jobs
queued to ``executor.try_adopt_task_instances``. leoflow then re-registers its own launches as adopted: a held
launch (CLAIMED) is re-dispatched as epoch 2 while the zygote still holds epoch 1, and the TI epoch 1 runs
is reset (review finding 1/hole 2 of issue 8). Adopting what this process already runs must change nothing.

How the stall is made deterministic: the scheduler heartbeats its job (``perform_heartbeat``) right before
it runs its timers (the orphan check among them) in the same loop, so a SIGSTOP at a random moment makes the
check see its own stale heartbeat only if it lands between the two. ``[scheduler] scheduler_heartbeat_sec``
1000 (above the 10 s threshold) makes every orphan check of this scheduler, from 10 s after its start, see
its own job stale, as a loop lagging past the threshold does; the 15 s SIGSTOP of issue 8's scenario is kept
on top, once six 25 s tasks run and three are handed to the zygote to be held (``lf_h2``, ``[core]
parallelism`` 6). On 3.3.2 with today's leoflow the three held launches are re-dispatched as new epochs on
every orphan check until ``redispatch_limit`` fails them (the run ends ``failed``).

Asserted for each of the nine tasks: its body started once and ended, no two bodies of it overlapped, it
succeeded on try 1, no "leoflow infra re-drive" Log row.
"""

from __future__ import annotations

import time

import pytest

from fault_helpers import FaultStack, executions, overlaps, wait_until

pytestmark = pytest.mark.airflow

DAG = "lf_h2"
TASKS = [f"t{i}" for i in range(9)]
EXTRA = {
    "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_THRESHOLD": "10",
    "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "1000",
    "AIRFLOW__SCHEDULER__ORPHANED_TASKS_CHECK_INTERVAL": "5",
}
STALL = 15.0  # seconds the scheduler is stopped: past the 10 s threshold


def test_a_stalled_scheduler_does_not_adopt_its_own_tasks(tmp_path_factory: pytest.TempPathFactory) -> None:
    """See the module docstring."""
    with FaultStack(tmp_path_factory.mktemp("hole2"), extra_env=EXTRA, parallelism=6) as stack:
        stack.up([DAG])
        run = stack.trigger_with(DAG)

        def six_run_three_dispatched() -> bool:
            started = [t for t in TASKS if executions(stack, DAG, t, run)]
            dispatched = [t for t in TASKS if t not in started and stack.attempts(DAG, run, t)]
            return len(started) == 6 and len(dispatched) == 3

        wait_until(six_run_three_dispatched, 240, "six bodies running and three launches handed to the zygote")
        stack.stop_component("scheduler")
        try:
            time.sleep(STALL)  # the stall itself (the scenario's input), not a wait for a condition
        finally:
            stack.continue_component("scheduler")
        final = stack.wait_for_run(DAG, run, timeout=300)

        problems = [] if final == "success" else [f"the run ended {final}"]
        for t in TASKS:
            execs = executions(stack, DAG, t, run)
            ti = stack.ti_row(DAG, run, t)
            if len(execs) != 1 or not execs[0].ended:
                problems.append(f"{t}: the body must start once and end: {execs}")
            if overlaps(execs):
                problems.append(f"{t}: two bodies at once: {overlaps(execs)}")
            if (ti["state"], ti["try_number"]) != ("success", 1):
                problems.append(f"{t}: must succeed on try 1: {ti}")
            if "leoflow infra re-drive" in stack.log_events(DAG, run, t):
                problems.append(f"{t}: re-driven: {stack.log_events(DAG, run, t)}")
        if problems:
            for t in TASKS:
                problems.append(f"{t} ledger: {[(a['attempt_epoch'], a['state'], a['resolution']) for a in stack.attempts(DAG, run, t)]}")
        assert not problems, "\n".join(problems)
