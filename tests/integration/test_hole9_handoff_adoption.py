"""Issue 8, hole 9: adoption strands a QUEUED TI whose last epoch rescheduled (or deferred).

After a reschedule the same ``ti_id`` comes back QUEUED. While the previous epoch's agent still runs,
leoflow's dispatch defers (the workload waits in the executor's ``queued_tasks``). If the scheduler dies
then, its successor adopts the TI through the old epoch; once that agent exits, ``decide()`` closes the
epoch (TI QUEUED with a hand-off record) and nothing dispatches a new one: the TI stays QUEUED until
Airflow's stuck-in-queued handling revokes it after ``[scheduler] task_queued_timeout`` (600 s) (review
finding 6). The stored workload allows dispatching the new epoch at once.

Scenario: ``lf_h9``, a reschedule-mode ``PythonSensor`` (``poke_interval=1``) whose first poke says "not
yet" and whose task process then lingers 20 s after that report (so the re-queued TI waits while epoch 1's
agent lives). As soon as the TI is QUEUED again with epoch 1 still open, SIGKILL the scheduler and start a
new one. Asserted: the second poke runs within 120 s of the restart (well under the 600 s timeout, so this
fails fast where the TI is stranded), on try 1 (a reschedule is not a new try; Airflow's reset of the TI
would make it try 2), and the run succeeds without a "stuck in queued" Log row.
"""

from __future__ import annotations

import signal
import time

import pytest

from fault_helpers import FaultStack, executions, wait_until

pytestmark = pytest.mark.airflow

DAG = "lf_h9"
EXTRA = {
    "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_THRESHOLD": "10",
    "AIRFLOW__SCHEDULER__ORPHANED_TASKS_CHECK_INTERVAL": "5",
}


def test_a_rescheduled_sensor_is_dispatched_again_after_a_restart(tmp_path_factory: pytest.TempPathFactory) -> None:
    """See the module docstring."""
    with FaultStack(tmp_path_factory.mktemp("hole9"), extra_env=EXTRA) as stack:
        stack.up([DAG])
        run = stack.trigger_with(DAG)

        def requeued_while_epoch_1_lives() -> bool:
            ti = stack.ti_row(DAG, run, "sense")
            attempts = stack.attempts(DAG, run, "sense")
            return (ti.get("state") == "queued" and len(executions(stack, DAG, "sense", run)) == 1
                    and len(attempts) == 1 and attempts[0]["state"] != "closed")

        wait_until(requeued_while_epoch_1_lives, 180, "the rescheduled TI QUEUED again while epoch 1 is open",
                   poll=0.2)
        stack.kill_component("scheduler", signal.SIGKILL)
        t_restart = time.monotonic()
        stack.start_component("scheduler")
        try:
            wait_until(lambda: len(executions(stack, DAG, "sense", run)) >= 2, 120, "the second poke")
        except TimeoutError:
            pytest.fail(f"the TI was stranded: {stack.ti_row(DAG, run, 'sense')}, ledger "
                        f"{stack.attempts(DAG, run, 'sense')}, {time.monotonic() - t_restart:.0f}s after the restart")
        assert stack.wait_for_run(DAG, run, timeout=120) == "success"
        ti = stack.ti_row(DAG, run, "sense")
        execs = executions(stack, DAG, "sense", run)
        events = stack.log_events(DAG, run, "sense")
        # a reschedule is not a new try: both pokes on try 1 (a reset of the adopted TI would make it try 2)
        assert [e.try_number for e in execs] == [1, 1] and ti["try_number"] == 1, (ti, execs, events)
        assert not [e for e in events if "stuck in queued" in e], events
