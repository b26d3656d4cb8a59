"""Issue 8, hole 11: the settle budget counts calls, not time (review finding 11).

On a977a55 one ``sync()`` settled up to ``[leoflow] settle_budget`` (20) dead attempts, each replay an HTTP
call with a ``[leoflow] settle_timeout`` (10 s) per phase. Against an api-server that accepts connections
but does not answer (overloaded, stopped, waiting on a lock) every replay waits its full timeout, so a pass
over a few lost reports blocks the scheduler loop for minutes: no scheduling, no job heartbeat, and past
``[scheduler] scheduler_health_check_threshold`` Airflow takes the scheduler for dead (with HA a peer adopts
its tasks). Now a ``sync()`` settles within a wall-clock budget (one settle timeout) and stops replaying for
the pass after the first replay that did not settle.

Scenario: ``lf_h11``, eight tasks whose agents are killed at ``after_record`` (a success record on disk, the
terminal PATCH never sent). Once every body runs, the test SIGSTOPs the api-server (its whole process group:
connections are accepted by the kernel, nothing answers) and lets the bodies end; every agent records success
and dies, so every replay hangs (``[leoflow] settle_timeout`` 5 s here). For 60 s it reads the scheduler's
``job`` row as Airflow's health check does: its ``latest_heartbeat`` must never be older than the threshold
(30 s). Airflow writes that column one scheduler loop late (the row gets the previous heartbeat's time), so a
loop of one settle timeout shows as ages up to about two loops (at most 17 s in the runs here; 25 s at the
default 10 s settle timeout, which the resilience ladder now warns about once it reaches half the threshold). Then it
SIGCONTs the api-server: every TI ends SUCCESS at try 1 from its replayed record, each body having run once.
On a977a55 a pass over the eight hanging replays takes 8 settle timeouts and the heartbeat goes stale: it was
30 s old 21 s into the window in the run observed (31 s old after 26 s with the default 10 s settle timeout).
"""

from __future__ import annotations

import os
import signal
import time
from datetime import datetime, timezone

import pytest

from fault_helpers import FaultStack, attempt_of, executions, wait_until
from leoflow_agent import outcome

pytestmark = pytest.mark.airflow

DAG = "lf_h11"
TASKS = [f"t{i}" for i in range(8)]
HEALTH_CHECK_THRESHOLD = 30.0  # Airflow's default, stated: the bound asserted below
SETTLE_TIMEOUT = 5.0  # half leoflow's default: a pass here lasts about this long, a977a55's 8 x this (40 s)
# seconds watched (45): a977a55's 40 s pass, starting within the first pass of the window, shows a 30 s old
# heartbeat inside it (it did 21 s into a 60 s window)
WINDOW = HEALTH_CHECK_THRESHOLD + 3 * SETTLE_TIMEOUT
EXTRA = {
    "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_THRESHOLD": str(int(HEALTH_CHECK_THRESHOLD)),
    "AIRFLOW__LEOFLOW__SETTLE_TIMEOUT": str(SETTLE_TIMEOUT),
    # the supervisors must hand their success over quickly while the api-server is stopped (a heartbeat in
    # flight then waits 2 x 5 s at most), and must not give up on heartbeats (heartbeat_lost) before they do
    "AIRFLOW__WORKERS__MAX_FAILED_HEARTBEATS": "10",
    "AIRFLOW__WORKERS__EXECUTION_API_RETRIES": "2",
    "AIRFLOW__WORKERS__EXECUTION_API_RETRY_WAIT_MIN": "0.5",
    "AIRFLOW__WORKERS__EXECUTION_API_RETRY_WAIT_MAX": "1",
}


def _utc(value: str) -> datetime:
    """A timestamp as SQLite holds Airflow's ``UtcDateTime`` (naive means UTC)."""
    when = datetime.fromisoformat(value)
    return when if when.tzinfo else when.replace(tzinfo=timezone.utc)


def test_hanging_replays_do_not_stall_the_scheduler(tmp_path_factory: pytest.TempPathFactory) -> None:
    """See the module docstring."""
    with FaultStack(tmp_path_factory.mktemp("hole11"), extra_env=EXTRA, parallelism=8) as stack:
        stack.up([DAG])
        stack.warm_execution_api()  # its cold start would otherwise make the agents (fast SDK retries) die before /run
        # every epoch of try 1 (a /run slowed by load may re-dispatch one) records its success and dies before its PATCH
        run = stack.trigger_with(DAG, {f"{task}/1/{epoch}": "after_record" for task in TASKS for epoch in (1, 2, 3)})
        bodies = wait_until(lambda: all(found := [executions(stack, DAG, task, run) for task in TASKS]) and found,
                            180, "every body to start")
        rows = {task: attempt_of(stack, DAG, run, task, execs[0]) for task, execs in zip(TASKS, bodies)}
        (job_id,) = [j for (j,) in stack.db("select id from job where job_type='SchedulerJob' and state='running'")]

        api = stack.pid_of("api-server")
        os.killpg(api, signal.SIGSTOP)
        ages: list[float] = []
        try:
            stack.release(run, "go")

            def recorded() -> bool:
                return all(outcome.read_record_file(
                    r["record_path"], expect=outcome.AttemptIdentity(r["ti_id"], r["try_number"], r["attempt_epoch"]))
                    for r in rows.values())

            wait_until(recorded, 90, "every agent's success record (each killed before its PATCH)")
            # every replay now hangs: watch the scheduler's job heartbeat, as Airflow's health check reads it
            until = time.monotonic() + WINDOW
            while time.monotonic() < until:
                (beat,) = stack.db("select latest_heartbeat from job where id=?", job_id)[0]
                ages.append((datetime.now(timezone.utc) - _utc(beat)).total_seconds())
                assert ages[-1] < HEALTH_CHECK_THRESHOLD, (
                    f"the scheduler's heartbeat is {ages[-1]:.0f}s old (threshold {HEALTH_CHECK_THRESHOLD:g}s): a "
                    f"sync() is blocked on hanging replays; ages seen {[round(a) for a in ages]}")
                time.sleep(1)
        finally:
            os.killpg(api, signal.SIGCONT)
        print(f"scheduler heartbeat age while every replay hung (s, one read a second): {[round(a) for a in ages]}")
        stack.wait_api()

        assert stack.wait_for_run(DAG, run, timeout=180) == "success"
        assert stack.db("select state from job where id=?", job_id) == [("running",)], \
            "the scheduler was taken for dead"
        try:
            wait_until(lambda: all(a["state"] == "closed" for task in TASKS for a in stack.attempts(DAG, run, task)),
                       60, "every attempt to be settled")
        except TimeoutError:
            pass  # the ledger assertion below shows what stayed open
        for task in TASKS:
            ti = stack.ti_row(DAG, run, task)
            execs = executions(stack, DAG, task, run)
            ledger = {a["attempt_epoch"]: (a["state"], a["resolution"]) for a in stack.attempts(DAG, run, task)}
            assert (ti["state"], ti["try_number"], ti["max_tries"]) == ("success", 1, 0), (task, ti, ledger)
            assert len(execs) == 1 and execs[0].ended, (task, execs)
            # the body's epoch: replayed, or moved_on when a replay that timed out on our side landed once the
            # api-server resumed; every epoch settled
            body_epoch = ledger[rows[task]["attempt_epoch"]]
            assert body_epoch in (("closed", "replayed"), ("closed", "moved_on")), (task, ledger)
            assert all(state == "closed" for state, _ in ledger.values()), (task, ledger)
        assert max(ages) < HEALTH_CHECK_THRESHOLD, ages
