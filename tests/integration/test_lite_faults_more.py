"""Issue 3 acceptance, the remaining Lite failure paths, each against a real Airflow (scheduler,
dag-processor, api-server; SQLite), with leoflow's test-only fault injection:

* infra budget spent → Airflow's own failure path (failure callback), ``max_tries`` +1 per infra re-run;
* a BashOperator ``bash`` that outlives its SIGKILLed agent is dead before the re-run starts;
* a user marking a running task success is not re-driven; a user clearing a running task re-runs at once;
* the api-server down until the supervisor gives up on heartbeats counts as infra, not as a user retry;
* fencing: Airflow's stuck-in-queued requeue keeps the ``ti_id``; epoch 1's record cannot settle epoch 2,
  and epoch 2 starts only after epoch 1 is dead;
* the orphan-run reaper (issue 10 item 1): a RUNNING task whose ledger row was lost is re-run on the infra
  budget once it is silent past ``[leoflow] orphan_run_threshold``, not failed by Airflow's purge.

DAGs: ``tests/fault_dags/leoflow_more.py``. Helpers: ``fault_helpers.py``.
"""

from __future__ import annotations

import os
import signal
import time
from datetime import datetime, timezone

import psutil
import pytest

from devtools.statsd import StatsdListener, airflow_env
from fault_helpers import FaultStack, attempt_of, callbacks, executions, overlaps, pid_alive, wait_until
from leoflow_agent import outcome

pytestmark = pytest.mark.airflow

INFRA = "leoflow infra re-drive"

# the supervisor gives up on heartbeats within seconds: 2 failed heartbeats, 2 s apart, each retried 3 times
# with 0.5-1 s waits (Airflow's defaults: 3 failures, 5 s apart, 5 tries with 1-90 s waits, i.e. minutes)
FAST_HEARTBEAT_LOSS = {
    "AIRFLOW__WORKERS__MIN_HEARTBEAT_INTERVAL": "2",
    "AIRFLOW__WORKERS__MAX_FAILED_HEARTBEATS": "2",
    "AIRFLOW__WORKERS__EXECUTION_API_RETRIES": "3",
    "AIRFLOW__WORKERS__EXECUTION_API_RETRY_WAIT_MIN": "0.5",
    "AIRFLOW__WORKERS__EXECUTION_API_RETRY_WAIT_MAX": "1",
}


def _wait_run(stack: FaultStack, dag_id: str, run_id: str, timeout: float) -> str:
    return stack.wait_for_run(dag_id, run_id, timeout=timeout, poll=2.0)


def _first_start(stack: FaultStack, dag_id: str, task_id: str, run_id: str, timeout: float = 150.0):
    return wait_until(lambda: executions(stack, dag_id, task_id, run_id), timeout,
                      f"the body of {dag_id}.{task_id} in {run_id} to start")[0]


@pytest.fixture(scope="class")
def statsd():
    """A StatsD listener the class's stack sends its metrics to (Airflow's StatsD logger, ``airflow.`` prefix)."""
    with StatsdListener() as listener:
        yield listener


@pytest.fixture(scope="class")
def stack(tmp_path_factory: pytest.TempPathFactory, statsd: StatsdListener):
    """One stack per class with ``[leoflow] infra_retry_budget = 1``, fast heartbeat loss and a 20 s
    ``orphan_run_threshold`` (it acts only on a RUNNING task with no open attempt: no other scenario makes one);
    every process is stopped at the end, even on failure. The test's triggers and user actions go to an
    api-server of their own (``public_api_apart``: see :class:`devtools.stack.AirflowStack`), as a UI would."""
    extra = {"AIRFLOW__LEOFLOW__INFRA_RETRY_BUDGET": "1", "AIRFLOW__LEOFLOW__ORPHAN_RUN_THRESHOLD": "20",
             **FAST_HEARTBEAT_LOSS, **airflow_env(statsd.port)}
    with FaultStack(tmp_path_factory.mktemp("faults-more"), extra_env=extra, public_api_apart=True) as s:
        s.up(["lf_budget", "lf_bash", "lf_user", "lf_hb", "lf_overwrite", "lf_overwrite_cb", "lf_overwrite_failed"])
        yield s


def _late_run(stack: FaultStack, dag_id: str, run_id: str, task_id: str) -> float:
    """Set the task instance RUNNING again as a late ``PATCH /run`` of its landed execution does on SQLite
    (state running, no end_date, heartbeat and update now); returns when (epoch seconds)."""
    (ti_id,), = stack.db("select id from task_instance where dag_id = ? and run_id = ? and task_id = ?",
                         dag_id, run_id, task_id)
    now = time.time()
    stack.db("UPDATE task_instance SET state = 'running', end_date = NULL, last_heartbeat_at = ?, updated_at = ? "
             "WHERE id = ?", _utc_text(now), _utc_text(now), ti_id)
    return now


class TestOneStack:
    """Scenarios sharing one stack (the api-server outage last: it would disturb every running task)."""

    def test_budget_bash_and_user_actions(self, stack: FaultStack) -> None:
        """Four scenarios in parallel runs; every problem found is reported together at the end."""
        t0 = time.monotonic()
        budget = stack.trigger_with("lf_budget", {"work/1/1": "mid_task", "work/2/1": "mid_task"})
        bash = stack.trigger_with("lf_bash", {"sh/1/1": "mid_task"})
        marked = stack.trigger_with("lf_user", prefix="mark")
        cleared = stack.trigger_with("lf_user", prefix="clear")
        problems: list[str] = []

        # --- user actions on running tasks: wait until both bodies run, then act
        _first_start(stack, "lf_user", "long", marked)
        stack._call("PATCH", f"/dags/lf_user/dagRuns/{marked}/taskInstances/long", json={"new_state": "success"})
        _first_start(stack, "lf_user", "long", cleared)
        t_clear = time.time()
        stack._call("POST", "/dags/lf_user/clearTaskInstances", json={
            "dry_run": False, "dag_run_id": cleared, "task_ids": ["long"], "only_failed": False,
            "reset_dag_runs": True,
        })

        finals = stack.wait_for_runs({"lf_budget": budget, "lf_bash": bash}, timeout=300)
        clear_final = _wait_run(stack, "lf_user", cleared, 300)

        # 1. infra budget (1) spent: the second kill fails the task through Airflow with its failure callback
        ti = stack.ti_row("lf_budget", budget, "work")
        execs = executions(stack, "lf_budget", "work", budget)
        if finals["lf_budget"] != "failed" or ti["state"] != "failed":
            problems.append(f"budget: run {finals['lf_budget']}, TI {ti}")
        if (ti["try_number"], ti["max_tries"]) != (2, 1):
            problems.append(f"budget: one infra re-run must give try 2 with max_tries 0+1, got {ti}")
        if [e.try_number for e in execs] != [1, 2]:
            problems.append(f"budget: bodies {execs}")
        events = stack.log_events("lf_budget", budget, "work")
        if events.count(INFRA) != 1:
            problems.append(f"budget: expected exactly one infra re-drive Log row, got {events}")
        try:
            wait_until(lambda: callbacks(stack, "lf_budget", budget)[("work", "2", "failure")], 120,
                       "the failure callback of lf_budget.work")
        except TimeoutError as exc:
            problems.append(f"budget: {exc}; callbacks {callbacks(stack, 'lf_budget', budget)}")
        time.sleep(3)
        cb = callbacks(stack, "lf_budget", budget)
        if cb[("work", "2", "failure")] != 1 or sum(cb.values()) != 1:
            problems.append(f"budget: exactly one failure callback expected, got {dict(cb)}")

        # 2. the bash that outlived its agent was dead before the re-run's bash started
        execs = executions(stack, "lf_bash", "sh", bash)
        if finals["lf_bash"] != "success" or [e.try_number for e in execs] != [1, 2]:
            problems.append(f"bash: run {finals['lf_bash']}, executions {execs}")
        elif execs[0].ended or not execs[1].ended:
            problems.append(f"bash: try 1 must have been killed and try 2 completed: {execs}")
        if overlaps(execs):
            problems.append(f"bash: two bashes ran at once: {overlaps(execs)}")
        if len(execs) == 2 and execs[1].extra != ["alive="]:
            problems.append(f"bash: earlier bash pids alive when try 2 started: {execs[1].extra}")
        if execs and pid_alive(execs[0].pid):
            problems.append(f"bash: the first bash (pid {execs[0].pid}) is still alive")

        # 4a. marked success while running: never re-driven, body ran once, stays success
        try:
            wait_until(lambda: [a for a in stack.attempts("lf_user", marked, "long") if a["state"] == "closed"],
                       120, "the marked attempt to be closed")
        except TimeoutError as exc:
            problems.append(f"mark: {exc}: {stack.attempts('lf_user', marked, 'long')}")
        time.sleep(10)  # room for a wrong re-drive to show
        ti = stack.ti_row("lf_user", marked, "long")
        attempts = stack.attempts("lf_user", marked, "long")
        if ti["state"] != "success" or ti["try_number"] != 1:
            problems.append(f"mark: TI {ti}")
        if len(executions(stack, "lf_user", "long", marked)) != 1:
            problems.append(f"mark: bodies {executions(stack, 'lf_user', 'long', marked)}")
        if INFRA in stack.log_events("lf_user", marked, "long") or len(attempts) != 1:
            problems.append(f"mark: re-driven: {stack.log_events('lf_user', marked, 'long')}, {attempts}")

        # 4b. cleared while running: re-runs within seconds (not after the 300 s purge), never two at once
        execs = executions(stack, "lf_user", "long", cleared)
        if clear_final != "success" or len(execs) != 2 or not execs[1].ended:
            problems.append(f"clear: run {clear_final}, bodies {execs}")
        elif execs[1].start - t_clear >= 60:
            problems.append(f"clear: the re-run started {execs[1].start - t_clear:.0f}s after the clear")
        if overlaps(execs):
            problems.append(f"clear: overlapping bodies {overlaps(execs)}")
        resolutions = [a["resolution"] for a in stack.attempts("lf_user", cleared, "long")]
        if resolutions[:1] != ["restarting"]:
            problems.append(f"clear: ledger resolutions {resolutions}")
        print(f"budget/bash/mark/clear scenarios took {time.monotonic() - t0:.0f}s")
        assert not problems, "\n".join(problems)

    def test_a_running_task_whose_ledger_row_was_lost_is_rerun_on_the_infra_budget(self, stack: FaultStack,
                                                                                     statsd: StatsdListener) -> None:
        """The orphan-run reaper. A running task's ledger row is closed behind leoflow's back (a lost row), then
        its agent and body are killed: nothing of leoflow watches the TI, which Airflow still shows RUNNING.
        Once silent past ``orphan_run_threshold`` (20 s) it is re-run as try 2 on the infra budget (``max_tries``
        0 -> 1, one re-drive Log row naming ``leoflow orphan-run``, no failure callback: the user's retries are
        untouched), long before Airflow's 300 s heartbeat purge would have failed it; the body ran once more. The
        re-drive is counted as ``leoflow.reaper.orphan-run`` and ``leoflow.recovery.orphan_redrive``."""
        run = stack.trigger_with("lf_user", prefix="orphan")
        first = _first_start(stack, "lf_user", "long", run)
        attempt = attempt_of(stack, "lf_user", run, "long", first)
        stack.db("UPDATE leoflow_attempt SET state = 'closed', resolution = 'moved_on', detail = 'lost by the test', "
                 "closed_at = updated_at WHERE ti_id = ? AND attempt_epoch = ?", attempt["ti_id"],
                 attempt["attempt_epoch"])
        agent = psutil.Process(attempt["pid"])
        for proc in [*agent.children(recursive=True), agent]:
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                pass
        t_kill = time.time()
        wait_until(lambda: not pid_alive(first.pid), 30, "the first body to die")
        assert stack.ti_row("lf_user", run, "long")["state"] == "running"
        assert _wait_run(stack, "lf_user", run, 240) == "success"

        ti = stack.ti_row("lf_user", run, "long")
        assert (ti["state"], ti["try_number"], ti["max_tries"]) == ("success", 2, 1), ti
        execs = executions(stack, "lf_user", "long", run)
        assert [e.try_number for e in execs] == [1, 2] and not execs[0].ended and execs[1].ended, execs
        assert not overlaps(execs)
        assert 20 <= execs[1].start - t_kill < 150, f"re-run {execs[1].start - t_kill:.0f}s after the kill"
        extras = [x for (x,) in stack.db("select extra from log where dag_id = ? and run_id = ? and task_id = ? "
                                         "and event = ?", "lf_user", run, "long", INFRA)]
        assert len(extras) == 1 and "leoflow orphan-run: " in extras[0] and "no open leoflow attempt" in extras[0], \
            extras
        time.sleep(3)
        cb = callbacks(stack, "lf_user", run)
        assert cb[("long", "1", "failure")] == 0 and cb[("long", "2", "failure")] == 0, dict(cb)
        rows = stack.attempts("lf_user", run, "long")
        assert [(a["try_number"], a["resolution"]) for a in rows] == [(1, "moved_on"), (2, "reported")], rows
        want = {"leoflow.reaper.orphan-run", "leoflow.recovery.orphan_redrive"}
        assert want <= statsd.wait_names(want), sorted(statsd.names("airflow."))

    @pytest.mark.parametrize(("dag", "task", "landed", "failure_callbacks"), [
        ("lf_overwrite", "short", "success", 0),
        ("lf_overwrite_failed", "fails", "failed", 1),
    ])
    def test_a_report_a_late_call_wrote_over_is_restored_not_rerun(self, stack: FaultStack, statsd: StatsdListener,
                                                                   dag: str, task: str, landed: str,
                                                                   failure_callbacks: int) -> None:
        """``task``'s terminal report (a success; a failure with no retries left) landed and its attempt closed;
        then its TI is set RUNNING again, as a late ``PATCH /run`` of that same execution does on SQLite (a /run
        the Task SDK client retried while the write lock was held; DESIGN §2). Once the TI is silent for 30 s the
        orphan-run reaper PATCHes the landed state again through the real Execution API (the body leoflow rebuilds
        must be one Airflow takes), where a re-drive past the 20 s ``orphan_run_threshold`` would run the body
        again: ``task`` ends in its landed state at try 1, its body ran once, its failure callback ran only if it
        failed, nothing was re-run, one ``leoflow orphan-run`` Log row says so and
        ``leoflow.recovery.orphan_restore`` is counted."""
        run = stack.trigger_with(dag, prefix=f"over{landed}")
        wait_until(lambda: [a["state"] for a in stack.attempts(dag, run, task)] == ["closed"], 90,
                   f"{task}'s attempt to be settled")
        assert stack.ti_row(dag, run, task)["state"] == landed
        t_over = _late_run(stack, dag, run, task)
        wait_until(lambda: stack.ti_row(dag, run, task)["state"] == landed, 120,
                   f"the overwritten {landed} to be restored")
        restored_after = time.time() - t_over
        (stack.traces_dir / f"release.{run}").touch()
        assert _wait_run(stack, dag, run, 120) == landed
        ti = stack.ti_row(dag, run, task)
        assert (ti["state"], ti["try_number"], ti["max_tries"]) == (landed, 1, 0), ti
        execs = executions(stack, dag, task, run)
        assert len(execs) == 1 and execs[0].ended, execs
        assert 30 <= restored_after < 100, f"restored {restored_after:.0f}s after the overwrite"
        rows = stack.attempts(dag, run, task)
        assert [(a["try_number"], a["attempt_epoch"], a["resolution"]) for a in rows] == [(1, 1, "reported")], rows
        extras = [x for (x,) in stack.db("select extra from log where dag_id = ? and run_id = ? and task_id = ? "
                                         "and event = ?", dag, run, task, "leoflow orphan-run")]
        assert len(extras) == 1 and f"{landed} report landed" in extras[0] and "restoring it" in extras[0], extras
        assert not [x for (x,) in stack.db("select extra from log where run_id = ? and event = ?", run, INFRA)]
        cb = callbacks(stack, dag, run)
        assert cb[(task, "1", "failure")] == failure_callbacks, dict(cb)
        assert "leoflow.recovery.orphan_restore" in statsd.wait_names({"leoflow.recovery.orphan_restore"})

    def test_a_success_overwritten_before_its_settle_is_replayed(self, stack: FaultStack) -> None:
        """``reported``'s success PATCH lands (its ledger row turns ``reported``) and its agent lives on in the
        task's success callback; meanwhile the TI is set RUNNING again, as a late ``PATCH /run`` of that execution
        does on SQLite. When the agent ends, the settle finds a landed report beside a RUNNING TI and replays the
        recorded success (DESIGN §2, the "overwritten report" row) instead of closing the row on the report's
        word: the task is SUCCESS at try 1 again within seconds, its body and its success callback ran once, and
        no "lost on_success_callback" row is written (the callback ran)."""
        dag, task = "lf_overwrite_cb", "reported"
        run = stack.trigger_with(dag, prefix="overcb")
        wait_until(lambda: [a["state"] for a in stack.attempts(dag, run, task)] == ["reported"], 90,
                   "the success report to land")
        assert stack.ti_row(dag, run, task)["state"] == "success"
        _late_run(stack, dag, run, task)
        (stack.traces_dir / f"release-cb.{run}").touch()
        wait_until(lambda: [a["state"] for a in stack.attempts(dag, run, task)] == ["closed"], 60,
                   "the attempt to be settled")
        wait_until(lambda: stack.ti_row(dag, run, task)["state"] == "success", 20, "the success to be replayed")
        ti = stack.ti_row(dag, run, task)
        assert (ti["state"], ti["try_number"], ti["max_tries"]) == ("success", 1, 0), ti
        rows = stack.attempts(dag, run, task)
        assert [(a["try_number"], a["attempt_epoch"], a["resolution"]) for a in rows] == [(1, 1, "replayed")], rows
        execs = executions(stack, dag, task, run)
        assert len(execs) == 1 and execs[0].ended, execs
        cb = callbacks(stack, dag, run)
        assert cb[(task, "1", "success")] == 1 and cb[(task, "1", "failure")] == 0, dict(cb)
        assert not stack.db("select 1 from log where run_id = ? and event = ?", run, "leoflow lost on_success_callback")
        assert _wait_run(stack, dag, run, 60) == "success"

    def test_api_server_blip_the_supervisor_survives_is_not_a_loss(self, stack: FaultStack) -> None:
        """The api-server freezes (SIGSTOP) for 16 s: long enough for several heartbeat *requests* to time out
        (5 s each), too short for the supervisor to give up (2 failed heartbeats of 3 tries each, ~33 s). The
        task goes on and its success must land: no heartbeat_lost, no re-run of a body that completed."""
        run = stack.trigger_with("lf_hb", prefix="blip")
        _first_start(stack, "lf_hb", "slow", run)
        (attempt,) = stack.attempts("lf_hb", run, "slow")
        pgid = stack.pid_of("api-server")
        os.killpg(pgid, signal.SIGSTOP)
        try:
            time.sleep(16)
        finally:
            os.killpg(pgid, signal.SIGCONT)
        stack.wait_api()
        stack.release(run)
        assert _wait_run(stack, "lf_hb", run, 180) == "success"
        ti = stack.ti_row("lf_hb", run, "slow")
        execs = executions(stack, "lf_hb", "slow", run)
        events = stack.log_events("lf_hb", run, "slow")
        assert [e.try_number for e in execs] == [1] and execs[0].ended, ("a completed body ran again", execs)
        assert (ti["state"], ti["try_number"], ti["max_tries"]) == ("success", 1, 1), ti
        assert INFRA not in events, events
        record = outcome.read_record_file(attempt["record_path"])
        assert record is not None and record.state == "success", record

    def test_api_server_outage_is_infra(self, stack: FaultStack) -> None:
        """The api-server is stopped while a task (retries=1) runs, until the supervisor gives up on its
        heartbeats, and stays stopped until leoflow has re-driven the TI and dispatched its next try (issue 8,
        hole 4). The loss is infra: ``max_tries`` +1, a re-drive Log row, no retry/failure callback; the next
        try succeeds once the api-server is back.

        Why the outage lasts that long: the re-drive is DB-only, so leoflow dispatches try 2 while the
        api-server is down; a restart right after the ``heartbeat_lost`` record (this test before issue 8)
        raced the api-server's start-up (10-30 s under load) against try 2's agents dying before ``/run`` and
        leoflow's ``redispatch_limit`` re-dispatches, and spent a user retry whenever the api-server came up
        last. Restarting it once try 2 was dispatched still raced (the third epoch reached a server started
        just in time). So the api-server stays down until leoflow gave try 2 up, or 35 s after try 2's
        dispatch (without the back-off its re-dispatches were spent within seconds): every run takes the slow
        path, and the product must wait the outage out."""
        run = stack.trigger_with("lf_hb")
        first = _first_start(stack, "lf_hb", "slow", run)
        attempt = attempt_of(stack, "lf_hb", run, "slow", first)
        expect = outcome.AttemptIdentity(attempt["ti_id"], attempt["try_number"], attempt["attempt_epoch"])
        t_down = time.monotonic()
        stack.kill_component("api-server", signal.SIGTERM, group=True)
        try:
            record = wait_until(lambda: outcome.read_record_file(attempt["record_path"], expect=expect), 120,
                                "the agent's heartbeat_lost record")
            lost_after = time.monotonic() - t_down
            wait_until(lambda: [a for a in stack.attempts("lf_hb", run, "slow") if a["try_number"] == 2], 120,
                       "leoflow to dispatch try 2 while the api-server is down")
            # ... and stays down until leoflow gave try 2 up (its re-dispatch limit spent) or for 35 s more:
            # long enough for every dispatch that does not wait for the api-server to fail
            try:
                wait_until(lambda: [a for a in stack.attempts("lf_hb", run, "slow")
                                    if a["try_number"] == 2 and a["resolution"] == "executor_failed"], 35,
                           "leoflow to give try 2 up")
            except TimeoutError:
                pass  # it waited the outage out: the behaviour this test wants
        finally:
            stack.start_component("api-server")
        stack.wait_api()
        assert record.reason == outcome.Reason.HEARTBEAT_LOST, record
        assert _wait_run(stack, "lf_hb", run, 240) == "success"

        ti = stack.ti_row("lf_hb", run, "slow")
        assert ti["state"] == "success"
        # retries=1: one infra re-run gives try 2 with max_tries 1+1; the user's retry is still unspent
        assert (ti["try_number"], ti["max_tries"]) == (2, 2), ti
        events = stack.log_events("lf_hb", run, "slow")
        assert events.count(INFRA) == 1, events
        execs = executions(stack, "lf_hb", "slow", run)
        assert [e.try_number for e in execs] == [1, 2] and not execs[0].ended and execs[1].ended, execs
        assert execs[0].pid == first.pid and not overlaps(execs)
        time.sleep(5)
        cb = callbacks(stack, "lf_hb")
        assert cb[("slow", "1", "retry")] == 0 and cb[("slow", "1", "failure")] == 0, dict(cb)
        resolutions = {(a["try_number"], a["attempt_epoch"]): a["resolution"]
                       for a in stack.attempts("lf_hb", run, "slow")}
        assert resolutions[(1, attempt["attempt_epoch"])] == "infra_redrive", resolutions
        print(f"heartbeat_lost recorded {lost_after:.1f}s after the api-server stopped")


def _utc_text(when: float) -> str:
    """Unix seconds as Airflow's SQLite rows hold a UTC timestamp (``YYYY-MM-DD HH:MM:SS.ffffff``)."""
    return datetime.fromtimestamp(when, timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")


def _utc(value: str | None) -> datetime:
    parsed = datetime.fromisoformat(str(value))
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)


def test_fencing_stuck_queued_requeue(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Epoch 1 hangs before ``/run``; Airflow's stuck-in-queued check (10 s) revokes and requeues the same
    ``ti_id``; epoch 2 is dispatched only after epoch 1 is dead. A success record of epoch 1 planted in both
    epochs' record files cannot settle epoch 2: when epoch 2 is killed mid-task the TI is re-driven as infra
    (a new try), not marked success from epoch 1's record."""
    from airflow.sdk.api.datamodels._generated import API_VERSION

    extra = {
        "AIRFLOW__SCHEDULER__TASK_QUEUED_TIMEOUT": "10",
        "AIRFLOW__SCHEDULER__TASK_QUEUED_TIMEOUT_CHECK_INTERVAL": "5",
    }
    with FaultStack(tmp_path_factory.mktemp("fencing"), extra_env=extra) as stack:
        stack.up(["lf_fence"])
        run = stack.trigger_with("lf_fence", {"work/1/1": "hang_before_run", "work/1/2": "mid_task"})
        rows = wait_until(lambda: (r := stack.attempts("lf_fence", run, "work")) and len(r) >= 2 and r, 180,
                          "epoch 2 of the stuck-queued task")
        e1, e2 = rows[0], rows[1]
        assert (e1["attempt_epoch"], e2["attempt_epoch"]) == (1, 2) and e1["ti_id"] == e2["ti_id"], rows
        assert e1["try_number"] == e2["try_number"] == 1, rows
        assert e1["state"] == "closed" and e1["resolution"] == "revoked", e1
        assert e1["pid"] is not None and not pid_alive(e1["pid"]), e1
        assert "stuck in queued reschedule" in stack.log_events("lf_fence", run, "work")
        # plant epoch 1's success record (a late write of a zombie epoch 1) into both record files
        payload = {"state": "success", "end_date": datetime.now(timezone.utc).isoformat(),
                   "task_outlets": [], "outlet_events": []}
        stale = outcome.record_for_state("success", payload, api_version=API_VERSION,
                                         attempt=outcome.AttemptIdentity(e1["ti_id"], 1, 1))
        for row in (e1, e2):
            outcome.write_record_file(row["record_path"], stale)
        stack.release(run, "go")
        assert stack.wait_for_run("lf_fence", run, timeout=240) == "success"

        rows = stack.attempts("lf_fence", run, "work")
        e1, e2 = rows[0], rows[1]
        end_1 = _utc(e1["exited_at"] or e1["closed_at"])
        assert end_1 < _utc(e2["dispatched_at"]), ("epoch 2 dispatched before epoch 1 was dead", rows)
        assert e2["resolution"] == "infra_redrive", rows
        ti = stack.ti_row("lf_fence", run, "work")
        assert (ti["state"], ti["try_number"], ti["max_tries"]) == ("success", 2, 1), ti
        events = stack.log_events("lf_fence", run, "work")
        assert INFRA in events and "leoflow lost on_success_callback" not in events, events
        execs = executions(stack, "lf_fence", "work", run)
        # epoch 1 never reached /run, so the body started once on try 1 (epoch 2) and once on try 2
        assert [e.try_number for e in execs] == [1, 2], execs
        assert not execs[0].ended and execs[1].ended and not overlaps(execs), execs
