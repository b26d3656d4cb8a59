"""Issue 8, hole 6: a SETTLING row whose settler died, on a real Airflow (review finding 4).

The reconciler marks a ledger row SETTLING (committed) before it replays a lost report, and only that replay
call took the row out of SETTLING again. If the scheduler dies during the call (SIGKILL, or an exception out of
``executor.heartbeat()``, which ends Airflow's scheduler loop), nothing ever looked at the row again: a TI whose
success record was never delivered was failed by Airflow's heartbeat purge, and a later dispatch of the same
``ti_id`` waited for ever behind the row. The fix: a SETTLING row that no settle of this process holds is
settled again (the PATCH is idempotent).

Scenario, per test: the task's agent is killed at ``after_record`` (its report recorded, the terminal PATCH
never sent) while the scheduler is stopped (SIGSTOP), so the agent itself only ever meets a working api-server.
Then the api-server is frozen (SIGSTOP of its process group) and the scheduler continued: it finds the agent
dead and replays the record, and the PATCH hangs. Once the ledger row is SETTLING, the scheduler is SIGKILLed,
the api-server comes back and a new scheduler is started. How the api-server comes back:

* ``resumed`` (SIGCONT): the dead settler's request, waiting in the frozen server's accept queue, is served
  now but its client is gone; uvicorn answers it 400 (``ClientDisconnect``) and Airflow's row is unchanged
  (seen in the api-server's access log);
* ``restarted`` (SIGKILL, start): the request dies with the old server.

Either way the TI is RUNNING with its success recorded when the new scheduler starts. Tests (one stack;
``[scheduler] task_instance_heartbeat_timeout`` lowered to 120 s, so a TI left RUNNING fails within the test):

* ``lf_fence.work`` (retries=0), both ways: the TI ends SUCCESS at try 1, the body ran once, ``max_tries``
  unchanged (no retry spent, no infra re-run), the ledger row CLOSED ``replayed``, and the TI's event log says
  its ``on_success_callback`` was lost (DESIGN §2 "Callbacks"). Before the fix: FAILED by the heartbeat purge,
  the row SETTLING for ever.
* ``lf_h6.sense``, a reschedule-mode sensor, ``resumed``: the replayed ``up_for_reschedule`` makes Airflow queue
  the same ``ti_id`` again; its next epoch must be dispatched (the second poke runs within 120 s of the restart)
  and the run succeeds on try 1. Before the fix the purge failed the TI whose hand-off was never delivered;
  were it delivered, the dispatch would wait behind the SETTLING row until Airflow's 600 s stuck-in-queued
  timeout.

"The replay raises": an exception out of the settle path leaves ``executor.heartbeat()`` and ends Airflow's
scheduler loop (``scheduler_job_runner.py`` ``_execute``; its ``finally`` calls ``executor.end()``). A passing
one (a DB error) is therefore a scheduler that died mid-replay, as above; that ``end()`` settles the row again
in the same process is unit-tested (``tests/unit/test_lifecycle.py``). One that no retry changes would end
every successor too, since each settles the row again: a crash loop. The one found is a record whose
``api_version`` is no valid header value (httpx raises ``UnicodeEncodeError``, not an ``httpx.HTTPError``):

* ``lf_fence.work``, its record rewritten with a non-ASCII ``api_version`` before the scheduler reads it: the
  scheduler keeps running and the record, which no retry can send, takes the infra re-drive path (``max_tries``
  + 1): SUCCESS at try 2, the first row ``infra_redrive`` naming the header. Before the fix the scheduler exited.

A planned fault names an attempt epoch: ``after_record`` is planned for epochs 1 to 3 (an agent that dies
before ``/run`` on a loaded machine is re-dispatched as the next epoch), and once a body runs, the entries of
the epochs after its own are dropped (a sensor's next poke is the next epoch).
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import time
from typing import Any

import pytest

from devtools.stack import StackError
from fault_helpers import FaultStack, attempt_of, executions, pid_alive, wait_until
from leoflow_agent import outcome

pytestmark = [pytest.mark.airflow, pytest.mark.timeout(900)]

INFRA = "leoflow infra re-drive"
LOST_CALLBACK = "leoflow lost on_success_callback"
HEARTBEAT_TIMEOUT = 120
PLANNED_EPOCHS = (1, 2, 3)

HOLE6_ENV = {
    # a purge short enough that a TI left RUNNING fails within the test, with the resilience ladder's other
    # terms under it: task_success_overtime + min_heartbeat_interval + socket_cleanup_timeout (15)
    # < agent_lost_threshold (30) < heartbeat timeout (120) - 2 x maintenance interval - settle_timeout (10)
    "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": str(HEARTBEAT_TIMEOUT),
    "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": "5",
    "AIRFLOW__CORE__TASK_SUCCESS_OVERTIME": "5",
    "AIRFLOW__WORKERS__SOCKET_CLEANUP_TIMEOUT": "5",
    "AIRFLOW__WORKERS__MIN_HEARTBEAT_INTERVAL": "5",
    "AIRFLOW__LEOFLOW__AGENT_LOST_THRESHOLD": "30",
    "AIRFLOW__LEOFLOW__SETTLE_TIMEOUT": "10",  # how long the hanging replay holds its row SETTLING
}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory):
    """One stack for the module; every process is stopped at the end, even on failure."""
    with FaultStack(tmp_path_factory.mktemp("hole6"), extra_env=HOLE6_ENV, parallelism=4) as s:
        s.up(["lf_fence", "lf_h6"])
        yield s


def _running(stack: FaultStack, name: str) -> bool:
    try:
        stack.pid_of(name)
    except StackError:
        return False
    return True


def _trigger(stack: FaultStack, dag_id: str, task_id: str, prefix: str) -> str:
    """Trigger ``dag_id`` with ``after_record`` planned for ``task_id``'s epochs 1 to 3 of try 1."""
    return stack.trigger_with(dag_id, {f"{task_id}/1/{epoch}": "after_record" for epoch in PLANNED_EPOCHS},
                              prefix=prefix)


def _keep_fault_of(stack: FaultStack, dag_id: str, run_id: str, task_id: str, epoch: int) -> None:
    """Drop the planned faults of ``task_id``'s epochs after ``epoch`` (the plan is read at each dispatch)."""
    plan = json.loads(stack.fault_plan.read_text() or "{}")
    for later in PLANNED_EPOCHS:
        if later > epoch:
            plan.pop(f"{dag_id}/{run_id}/{task_id}/1/{later}", None)
    tmp = stack.fault_plan.with_suffix(".tmp")
    tmp.write_text(json.dumps(plan))
    os.replace(tmp, stack.fault_plan)


def _recorded_while_the_scheduler_is_stopped(stack: FaultStack, dag_id: str, run_id: str,
                                             task_id: str) -> tuple[dict[str, Any], outcome.OutcomeRecord]:
    """Wait for the body of ``task_id`` to start (it then waits for ``go.<run_id>``), SIGSTOP the scheduler,
    let the body go on, and wait for its agent's record and death (``after_record``). The scheduler is left
    stopped (continued if this fails). Returns (the ledger row of the body's attempt, its record)."""
    stack.wait_api()
    execs = wait_until(lambda: executions(stack, dag_id, task_id, run_id), 180, "the body to start")
    attempt = attempt_of(stack, dag_id, run_id, task_id, execs[-1])
    _keep_fault_of(stack, dag_id, run_id, task_id, attempt["attempt_epoch"])
    expect = outcome.AttemptIdentity(attempt["ti_id"], attempt["try_number"], attempt["attempt_epoch"])
    stack.stop_component("scheduler")
    try:
        stack.release(run_id, "go")
        record = wait_until(lambda: outcome.read_record_file(attempt["record_path"], expect=expect), 120,
                            "the agent's record")
        wait_until(lambda: not pid_alive(attempt["pid"]), 60, "the agent's death at after_record")
    except BaseException:
        stack.continue_component("scheduler")
        raise
    return attempt, record


def _kill_the_scheduler_mid_replay(stack: FaultStack, dag_id: str, run_id: str, task_id: str,
                                   api: str) -> tuple[dict[str, Any], float]:
    """Drive one scenario (module docstring) up to the new scheduler's start; ``api``: ``"resumed"`` or
    ``"restarted"``. Returns (the ledger row as it was SETTLING, ``time.monotonic()`` at the restart)."""
    attempt, record = _recorded_while_the_scheduler_is_stopped(stack, dag_id, run_id, task_id)
    pgid = stack.pid_of("api-server")
    os.killpg(pgid, signal.SIGSTOP)
    try:
        stack.continue_component("scheduler")

        def settling() -> dict[str, Any] | None:
            rows = stack.attempts(dag_id, run_id, task_id)
            return next((a for a in rows if a["attempt_epoch"] == attempt["attempt_epoch"]
                         and a["state"] == "settling"), None)

        row = wait_until(settling, 120, "the executor's replay in flight (its ledger row SETTLING)", poll=0.1)
        stack.kill_component("scheduler", signal.SIGKILL)
    finally:
        if api == "resumed":
            os.killpg(pgid, signal.SIGCONT)
        else:
            stack.kill_component("api-server", signal.SIGKILL, group=True)  # SIGKILL ends a stopped process too
            stack.start_component("api-server")
        if not _running(stack, "scheduler"):
            stack.start_component("scheduler")
    return row, time.monotonic()


def _earlier_epochs_never_ran(rows: list[dict[str, Any]], epoch: int) -> None:
    """Epochs before ``epoch`` may only be agents that died before ``/run`` (a loaded machine)."""
    assert all(r["resolution"] == "redispatched" for r in rows if r["attempt_epoch"] < epoch), rows


@pytest.mark.parametrize("api", ["resumed", "restarted"])
def test_a_success_whose_replay_died_with_the_scheduler_is_replayed_once(stack: FaultStack, api: str) -> None:
    """See the module docstring (``lf_fence.work``)."""
    dag_id, task_id = "lf_fence", "work"
    run = _trigger(stack, dag_id, task_id, f"h6{api}")
    row, _ = _kill_the_scheduler_mid_replay(stack, dag_id, run, task_id, api)
    stack.wait_api()
    final = stack.wait_for_run(dag_id, run, timeout=240, poll=2)
    ti = stack.ti_row(dag_id, run, task_id)
    execs = executions(stack, dag_id, task_id, run)
    rows = stack.attempts(dag_id, run, task_id)
    events = stack.log_events(dag_id, run, task_id)
    assert final == "success" and (ti["state"], ti["try_number"], ti["max_tries"]) == ("success", 1, 0), \
        (final, ti, rows, events)
    assert len(execs) == 1 and execs[0].ended, ("the body must run exactly once", execs)
    assert [(r["ti_id"], r["attempt_epoch"], r["state"], r["resolution"]) for r in rows[-1:]] == \
        [(row["ti_id"], row["attempt_epoch"], "closed", "replayed")], rows
    _earlier_epochs_never_ran(rows, row["attempt_epoch"])
    assert LOST_CALLBACK in events and INFRA not in events, events


def test_a_rescheduled_sensor_whose_replay_died_with_the_scheduler_pokes_again(stack: FaultStack) -> None:
    """See the module docstring (``lf_h6.sense``)."""
    dag_id, task_id = "lf_h6", "sense"
    run = _trigger(stack, dag_id, task_id, "h6sensor")
    row, restarted_at = _kill_the_scheduler_mid_replay(stack, dag_id, run, task_id, "resumed")
    try:
        wait_until(lambda: len(executions(stack, dag_id, task_id, run)) >= 2, 120, "the second poke")
    except TimeoutError:
        pytest.fail(f"the same ti_id was not dispatched again {time.monotonic() - restarted_at:.0f}s after the "
                    f"restart: TI {stack.ti_row(dag_id, run, task_id)}, ledger {stack.attempts(dag_id, run, task_id)}")
    assert stack.wait_for_run(dag_id, run, timeout=120, poll=2) == "success"
    ti = stack.ti_row(dag_id, run, task_id)
    execs = executions(stack, dag_id, task_id, run)
    rows = stack.attempts(dag_id, run, task_id)
    events = stack.log_events(dag_id, run, task_id)
    # a reschedule is not a new try: both pokes on try 1, the first one not run again
    assert (ti["state"], ti["try_number"], ti["max_tries"]) == ("success", 1, 0), (ti, rows, events)
    assert [(e.try_number, e.ended) for e in execs] == [(1, False), (1, True)], execs
    # the replayed hand-off closed its epoch; the next poke is the next epoch of the same ti_id (its row may
    # still wait for its agent's exit)
    epoch = row["attempt_epoch"]
    assert [(r["ti_id"], r["attempt_epoch"]) for r in rows if r["attempt_epoch"] >= epoch] == \
        [(row["ti_id"], epoch), (row["ti_id"], epoch + 1)], rows
    assert [(r["state"], r["resolution"]) for r in rows if r["attempt_epoch"] == epoch] == [("closed", "replayed")]
    _earlier_epochs_never_ran(rows, epoch)
    assert INFRA not in events and not [e for e in events if "stuck in queued" in e], events


def test_a_record_whose_replay_cannot_be_sent_is_redriven_without_ending_the_scheduler(stack: FaultStack) -> None:
    """See the module docstring ("the replay raises")."""
    dag_id, task_id = "lf_fence", "work"
    run = _trigger(stack, dag_id, task_id, "h6raise")
    attempt, record = _recorded_while_the_scheduler_is_stopped(stack, dag_id, run, task_id)
    try:
        outcome.write_record_file(attempt["record_path"], dataclasses.replace(record, api_version="2025-09-23\u00e9"))
    finally:
        stack.continue_component("scheduler")
    final = stack.wait_for_run(dag_id, run, timeout=240, poll=2)  # StackError at once if the scheduler exited
    ti = stack.ti_row(dag_id, run, task_id)
    execs = executions(stack, dag_id, task_id, run)
    rows = stack.attempts(dag_id, run, task_id)
    events = stack.log_events(dag_id, run, task_id)
    assert final == "success" and (ti["state"], ti["try_number"], ti["max_tries"]) == ("success", 2, 1), \
        (final, ti, rows, events)
    assert [e.try_number for e in execs] == [1, 2], execs
    redriven = [r for r in rows if r["attempt_epoch"] == attempt["attempt_epoch"] and r["try_number"] == 1]
    assert [r["resolution"] for r in redriven] == ["infra_redrive"], rows
    assert "airflow-api-version" in (redriven[0]["detail"] or ""), rows
    assert events.count(INFRA) == 1, events
