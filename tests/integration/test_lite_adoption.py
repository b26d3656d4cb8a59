"""Issue 3 acceptance: adoption by a restarted scheduler (DESIGN §3 "Adoption"), on a real Airflow.

Five tasks run under leoflow (Lite); the scheduler is killed with SIGKILL (its zygote dies with it, the agents
do not); while it is down one agent is SIGKILLed too. A new scheduler is started once the old one's heartbeat
is older than ``[scheduler] scheduler_health_check_threshold`` (10 s here). Expected: the new scheduler's job
owns every TI (``queued_by_job_id``), the four live agents are adopted and their bodies finish exactly once,
the dead one is re-driven once as a new try on the infra budget (its body never runs twice at once), and
Airflow's heartbeat purge (lowered to 90 s here, so it would act within the test) fails nothing.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from fault_helpers import FaultStack, callbacks, executions, overlaps, pid_alive, wait_until

pytestmark = pytest.mark.airflow

TASKS = [f"t{i}" for i in range(5)]
VICTIM = "t2"

EXTRA = {
    "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_THRESHOLD": "10",
    "AIRFLOW__SCHEDULER__ORPHANED_TASKS_CHECK_INTERVAL": "15",
    # the purge at 90 s (not 300 s) so it would fail the dead TI inside the test if nothing else acted; the
    # recovery window stays valid: 5 + 5 + 10 < agent_lost_threshold 30 < 90 - 2 x 5 - 10
    "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "90",
    "AIRFLOW__CORE__TASK_SUCCESS_OVERTIME": "5",
    "AIRFLOW__WORKERS__SOCKET_CLEANUP_TIMEOUT": "10",
    "AIRFLOW__LEOFLOW__AGENT_LOST_THRESHOLD": "30",
}


def _scheduler_jobs(stack: FaultStack) -> list[tuple[int, str]]:
    return stack.db("select id, state from job where job_type = 'SchedulerJob' order by id")


def test_scheduler_restart_adopts_live_agents_and_redrives_the_dead_one(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """See the module docstring."""
    with FaultStack(tmp_path_factory.mktemp("adoption"), extra_env=EXTRA) as stack:
        stack.up(["lf_adopt"])
        run = stack.trigger_with("lf_adopt")
        wait_until(lambda: all(executions(stack, "lf_adopt", t, run) for t in TASKS), 240, "all five bodies to start")

        # a body can start before the scheduler's next sync() reads its agent's ``launched`` event: wait for the
        # ledger to hold every agent's pid (the state the restart must find), never assert it at once
        def recorded() -> dict[str, list[dict]] | None:
            got = {t: stack.attempts("lf_adopt", run, t) for t in TASKS}
            ok = all(len(a) == 1 and a[0]["state"] == "dispatched" and a[0]["pid"] for a in got.values())
            return got if ok else None

        attempts = wait_until(recorded, 60, "every agent's launch to be recorded in the ledger")
        old_job = {stack.ti_row("lf_adopt", run, t)["queued_by_job_id"] for t in TASKS}
        assert len(old_job) == 1, old_job
        (old_job,) = old_job

        t_kill = time.monotonic()
        stack.kill_component("scheduler", signal.SIGKILL)
        victim_pid = attempts[VICTIM][0]["pid"]
        os.kill(victim_pid, signal.SIGKILL)
        wait_until(lambda: not pid_alive(victim_pid), 30, "the victim agent to die")
        live = {t: attempts[t][0]["pid"] for t in TASKS if t != VICTIM}
        assert all(pid_alive(pid) for pid in live.values()), "agents must outlive their scheduler and zygote"
        time.sleep(max(0.0, 15 - (time.monotonic() - t_kill)))  # > scheduler_health_check_threshold
        stack.start_component("scheduler")

        def adopted() -> bool:
            jobs = [j for j, _ in _scheduler_jobs(stack) if j != old_job]
            if not jobs:
                return False
            rows = {t: stack.ti_row("lf_adopt", run, t) for t in TASKS}
            return all(r["queued_by_job_id"] == jobs[-1] for r in rows.values()) and jobs[-1]

        new_job = wait_until(adopted, 240, "the new scheduler's job to own every TI")
        wait_until(lambda: len(executions(stack, "lf_adopt", VICTIM, run)) >= 2, 180,
                   "the dead task's re-run to start")
        assert all(pid_alive(pid) for pid in live.values()), "adopted agents keep running"
        stack.release(run)
        assert stack.wait_for_run("lf_adopt", run, timeout=240) == "success"

        for t in TASKS:
            ti = stack.ti_row("lf_adopt", run, t)
            execs = executions(stack, "lf_adopt", t, run)
            assert ti["state"] == "success" and ti["queued_by_job_id"] == new_job, (t, ti)
            if t == VICTIM:
                assert (ti["try_number"], ti["max_tries"]) == (2, 1), ("one infra re-run, no user retry", ti)
                assert [e.try_number for e in execs] == [1, 2], execs
                assert not execs[0].ended and execs[1].ended, execs
                assert not overlaps(execs), ("the dead agent's task body outlived it", overlaps(execs))
            else:
                assert (ti["try_number"], ti["max_tries"]) == (1, 0), (t, ti)
                assert len(execs) == 1 and execs[0].ended, (t, execs)
        spent = stack.db("select spent from leoflow_infra_budget where run_id = ? and task_id = ?", run, VICTIM)
        assert spent == [(1,)], spent
        for t in TASKS:
            infra = stack.log_events("lf_adopt", run, t).count("leoflow infra re-drive")
            assert infra == (1 if t == VICTIM else 0), (t, stack.log_events("lf_adopt", run, t))
        time.sleep(5)
        cb = callbacks(stack, "lf_adopt")
        assert not [k for k in cb if k[2] in ("failure", "retry")], dict(cb)
        assert sorted(k[0] for k in cb if k[2] == "success") == TASKS, dict(cb)
        purged = stack.db("select event, task_id from log where run_id = ? and (event like '%heartbeat%' "
                          "or event like '%zombie%')", run)
        assert not purged, purged
