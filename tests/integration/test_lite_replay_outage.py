"""Replays during an api-server outage, on a real Airflow (issue 8 holes 7b and 16d; review findings 8, 13d).

``lf_fence.work`` (retries=0) waits for the test's go file. The test stops the api-server, lets the body
finish, and the agent is killed at ``after_record``: a success record on disk, the terminal PATCH never
sent. Airflow's heartbeat purge is DB-only, so it keeps running through the outage (``[scheduler]
task_instance_heartbeat_timeout`` lowered to 60 s here, the resilience ladder's other terms with it).

* **7b**: the api-server stays down well past the heartbeat timeout. leoflow must hold the purge off (a
  guarded ``last_heartbeat_at`` refresh of the RUNNING TI, ``airflow_db.hold_off_purge``) while the replay
  cannot land, so the task ends SUCCESS once the api-server is back, its body run once. Without the hold-off
  the purge fails the TI (retries=0) and the recorded success is lost.
* **16d**: the same outage, and the record's payload is made invalid while the api-server is down, so the
  replay gets 422 once it is back. A 422 cannot change by retrying: leoflow must take the infra re-drive path
  at once (a new try on the infra budget, ``max_tries`` + 1) instead of retrying until the purge.

Both failed before the lifecycle called ``airflow_db.hold_off_purge`` and honoured ``SettleResult.retryable``.
"""

from __future__ import annotations

import dataclasses
import signal
import time

import pytest

from fault_helpers import FaultStack, executions, wait_until
from leoflow_agent import outcome

pytestmark = [pytest.mark.airflow, pytest.mark.timeout(900)]

DAG, TASK = "lf_fence", "work"
INFRA = "leoflow infra re-drive"
HEARTBEAT_TIMEOUT = 60.0
DETECTION_INTERVAL = 5.0

OUTAGE_ENV = {
    # a short purge, and the ladder's terms that must fit under it:
    # task_success_overtime + min_heartbeat_interval + socket_cleanup_timeout (15) < agent_lost_threshold (30)
    # < heartbeat timeout (60) - 2 x maintenance_interval (10) - settle_timeout (10)
    "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": str(int(HEARTBEAT_TIMEOUT)),
    "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": str(DETECTION_INTERVAL),
    "AIRFLOW__CORE__TASK_SUCCESS_OVERTIME": "5",
    "AIRFLOW__WORKERS__SOCKET_CLEANUP_TIMEOUT": "5",
    "AIRFLOW__WORKERS__MIN_HEARTBEAT_INTERVAL": "5",
    "AIRFLOW__LEOFLOW__AGENT_LOST_THRESHOLD": "30",
    # the supervisor must hand over the success quickly while the api-server is down, and must not give up
    # on heartbeats (which would record heartbeat_lost instead) before it does
    "AIRFLOW__WORKERS__MAX_FAILED_HEARTBEATS": "10",
    "AIRFLOW__WORKERS__EXECUTION_API_RETRIES": "2",
    "AIRFLOW__WORKERS__EXECUTION_API_RETRY_WAIT_MIN": "0.5",
    "AIRFLOW__WORKERS__EXECUTION_API_RETRY_WAIT_MAX": "1",
}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory):
    with FaultStack(tmp_path_factory.mktemp("replay-outage"), extra_env=OUTAGE_ENV, parallelism=4) as s:
        s.up([DAG])
        yield s


def _lost_report_during_outage(stack: FaultStack, prefix: str) -> tuple[str, dict, outcome.OutcomeRecord, float]:
    """Run ``work`` up to its start, stop the api-server, let the body finish: the agent records success and
    is killed before its PATCH. Returns (run_id, ledger row, record, monotonic time the api-server stopped)."""
    stack.wait_api()  # an earlier test may have just restarted it
    run = stack.trigger_with(DAG, {f"{TASK}/1/1": "after_record"}, prefix=prefix)
    wait_until(lambda: executions(stack, DAG, TASK, run), 150, "the body to start")
    (attempt,) = stack.attempts(DAG, run, TASK)
    expect = outcome.AttemptIdentity(attempt["ti_id"], attempt["try_number"], attempt["attempt_epoch"])
    t_down = time.monotonic()
    stack.kill_component("api-server", signal.SIGTERM, group=True)
    stack.release(run, "go")
    record = wait_until(lambda: outcome.read_record_file(attempt["record_path"], expect=expect), 60,
                        "the agent's success record")
    assert record.state == "success" and record.payload is not None, record
    wait_until(lambda: stack.attempts(DAG, run, TASK)[0]["exited_at"], 60, "the agent's death to be seen")
    return run, attempt, record, t_down


def _outlast_the_purge(stack: FaultStack, run: str, t_down: float) -> None:
    """Keep the api-server down until Airflow's purge would certainly have acted (the last heartbeat was at
    most at ``t_down``), failing fast if the TI leaves RUNNING meanwhile."""
    until = t_down + HEARTBEAT_TIMEOUT + 3 * DETECTION_INTERVAL + 10
    while time.monotonic() < until:
        state = stack.ti_row(DAG, run, TASK)["state"]
        assert state == "running", f"the TI left RUNNING during the outage: {state}"
        time.sleep(1)


def test_a_recorded_success_survives_an_outage_longer_than_the_purge(stack: FaultStack) -> None:
    run, _, _, t_down = _lost_report_during_outage(stack, "holdoff")
    try:
        _outlast_the_purge(stack, run, t_down)
    finally:
        stack.start_component("api-server")
    stack.wait_api()
    assert stack.wait_for_run(DAG, run, timeout=120, poll=2) == "success"
    ti = stack.ti_row(DAG, run, TASK)
    assert (ti["state"], ti["try_number"], ti["max_tries"]) == ("success", 1, 0), ti
    execs = executions(stack, DAG, TASK, run)
    assert len(execs) == 1 and execs[0].ended, ("the body must run exactly once", execs)
    assert [a["resolution"] for a in stack.attempts(DAG, run, TASK)] == ["replayed"]
    assert INFRA not in stack.log_events(DAG, run, TASK)


def test_a_replay_answered_422_is_re_driven_not_retried_until_the_purge(stack: FaultStack) -> None:
    run, attempt, record, t_down = _lost_report_during_outage(stack, "final4xx")
    invalid = dataclasses.replace(record, payload={**record.payload, "end_date": "not a date"})
    outcome.write_record_file(attempt["record_path"], invalid)
    stack.start_component("api-server")
    stack.wait_api()
    # the 422 comes at the first replay after the api-server is back; the re-drive must follow well before
    # Airflow's purge (60 s after the last heartbeat) would fail the task
    assert stack.wait_for_run(DAG, run, timeout=180, poll=2) == "success"
    ti = stack.ti_row(DAG, run, TASK)
    assert (ti["state"], ti["try_number"], ti["max_tries"]) == ("success", 2, 1), ti
    events = stack.log_events(DAG, run, TASK)
    assert events.count(INFRA) == 1, events
    first = stack.attempts(DAG, run, TASK)[0]
    assert first["resolution"] == "infra_redrive" and "422" in (first["detail"] or ""), first
