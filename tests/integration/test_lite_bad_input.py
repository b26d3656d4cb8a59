"""Bad input gets a clear error and loses nothing (issue 2, acceptance 6).

* a malformed ``[leoflow]`` value: ``start()`` raises ConfigError naming key and value, and a real
  ``airflow scheduler`` refuses to start with that message in its log;
* a broken resilience ladder (``[scheduler] task_instance_heartbeat_timeout = 60``): LadderViolation naming
  keys and values, in-process and from the real scheduler;
* an api-server that is not up yet when the agent starts: the Task SDK client retries with backoff and the
  task still succeeds;
* a corrupted record file: read as "no record", so the reconciler re-drives instead of losing or
  misreading the attempt;
* a zygote killed with SIGKILL while the scheduler runs (and an agent is running): the executor says so,
  restarts it, the running task still succeeds and later tasks still run.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time

import pytest

from devtools import procs
from leoflow_agent import outcome, proc
from leoflow_airflow.dispatch.guard import TIRow
from leoflow_airflow.errors import ConfigError, LadderViolation
from leoflow_airflow.reconcile import Act, decide
from lite_procs import agents, lite_stack, log_text, scheduler, spawn_in_stack, wait_for, zygotes

PROBE = "leoflow_test_probe"
HOLD = "leoflow_test_hold"

BAD_CONFIG = [
    ("AIRFLOW__LEOFLOW__SETTLE_TIMEOUT", "abc", ConfigError, ["[leoflow] settle_timeout = 'abc'", "not a valid float"]),
    ("AIRFLOW__LEOFLOW__RUNTIME", "docker", ConfigError, ["[leoflow] runtime = 'docker'", "`lite` or `kubernetes`"]),
    ("AIRFLOW__LEOFLOW__ZYGOTE_PRELOAD", "pandas, dags/etl.py", ConfigError,
     ["[leoflow] zygote_preload = 'pandas, dags/etl.py'", "'dags/etl.py' is not a dotted module name"]),
    ("AIRFLOW__LEOFLOW__AGENT_ENV_DENY", "AWS_*, MY VAR", ConfigError,
     ["[leoflow] agent_env_deny = 'AWS_*, MY VAR'", "'MY VAR' is not an environment variable name"]),
    ("AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT", "60", LadderViolation,
     ["leoflow refuses to start", "[scheduler] task_instance_heartbeat_timeout = 60",
      "[core] task_success_overtime (20)", "[workers] socket_cleanup_timeout (60)"]),
]


@pytest.mark.parametrize(("var", "value", "error", "needles"), BAD_CONFIG, ids=[c[0].split("__")[-1] for c in BAD_CONFIG])
def test_start_refuses_bad_config(monkeypatch, tmp_path, var, value, error, needles):
    """``LeoflowExecutor.start()`` raises before starting anything; the message names key and value."""
    from leoflow_airflow.executor import LeoflowExecutor

    monkeypatch.setenv("AIRFLOW__LEOFLOW__RUNTIME_DIR", str(tmp_path / "rt"))
    monkeypatch.setenv(var, value)
    executor = LeoflowExecutor()
    with pytest.raises(error) as info:
        executor.start()
    for needle in needles:
        assert needle in str(info.value)
    assert not (tmp_path / "rt").exists(), "start() touched the runtime before refusing"


@pytest.mark.airflow
@pytest.mark.timeout(300)
def test_scheduler_refuses_to_start_with_the_message_in_its_log(tmp_path):
    """A real ``airflow scheduler`` with each bad value exits non-zero, the message in its log, no zygote."""
    with lite_stack(tmp_path / "home") as stack:
        stack.migrate()
        for var, value, _, needles in BAD_CONFIG:
            name = f"scheduler-{var.split('__')[-1].lower()}"
            popen = spawn_in_stack(stack, name, [sys.executable, "-m", "airflow", "scheduler"],
                                   env={**stack.env(), var: value})
            try:
                code = popen.wait(timeout=90)
            except subprocess.TimeoutExpired:
                pytest.fail(f"the scheduler kept running with {var}={value}; see {stack.process_logs}/{name}.log")
            text = log_text(stack, name)
            assert code != 0, text[-2000:]
            for needle in needles:
                assert needle in text, f"{needle!r} not in {name}.log:\n{text[-3000:]}"
            assert zygotes(stack) == []


def test_corrupted_record_file_is_no_record_and_nothing_is_lost(tmp_path):
    """A record file that is garbage, truncated, empty, or another attempt's reads as "no record"
    (never raises), and the reconciler then re-drives (TI running) or re-dispatches (TI queued) the attempt
    instead of closing it: nothing is lost and nothing misread is replayed."""
    attempt = outcome.AttemptIdentity("0190b6c2-7e4f-7a3c-9d1e-2b5f6a7c8d90", 1, 1)
    good = outcome.record_for_state("success", {"state": "success", "end_date": "2025-01-01T00:00:00Z"},
                                    attempt=attempt, api_version="2025-09-23")
    path = tmp_path / "record.json"
    outcome.write_record_file(path, good)
    body = path.read_bytes()
    assert outcome.read_record_file(path, expect=attempt) == good  # the control: a good file decodes
    corruptions = [b"", b"\x00" * 64, body[: len(body) // 2], body[:-1], body.replace(b"success", b"succezz"),
                   os.urandom(512), body + b"trailing garbage",
                   outcome.encode(outcome.record_for_state(
                       "success", {"state": "success"}, attempt=outcome.AttemptIdentity(attempt.ti_id, 1, 2),
                       api_version=None)).encode()]
    for content in corruptions:
        path.write_bytes(content)
        record = outcome.read_record_file(path, expect=attempt)
        assert record is None, content[:80]
        for state, act in (("running", Act.INFRA_REDRIVE), ("queued", Act.REDISPATCH)):
            row = TIRow(id=attempt.ti_id, state=state, try_number=1, max_tries=0, queued_by_job_id=1)
            assert decide(ti_id=attempt.ti_id, try_number=1, record=record, ti=row).act == act
    path.unlink()
    assert outcome.read_record_file(path, expect=attempt) is None
    os.mkfifo(path)  # a FIFO must not block the reader
    assert outcome.read_record_file(path, expect=attempt) is None


def serialized(stack, dag_id: str) -> bool:
    """The DAG is in the metadata DB (read straight from SQLite: the api-server is not up)."""
    try:
        with sqlite3.connect(f"file:{stack.home / 'airflow.db'}?mode=ro", uri=True, timeout=30) as db:
            return db.execute("select 1 from serialized_dag where dag_id = ?", (dag_id,)).fetchone() is not None
    except sqlite3.Error:
        return False


def airflow_cli(stack, *args: str) -> str:
    """Run an ``airflow`` CLI command with the stack's configuration; return its output."""
    out = subprocess.run([sys.executable, "-m", "airflow", *args], env=stack.env(), cwd=stack.home,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    return out.stdout


@pytest.mark.airflow
@pytest.mark.timeout(300)
def test_api_server_not_up_yet_when_the_agent_starts(tmp_path):
    """Scheduler + dag-processor run, the DAG is triggered, its agent starts against a closed port; the
    api-server comes up ~10 s later and the run still succeeds (the SDK client retries with backoff)."""
    # 7 retries: attempts after 1, 3, 7, 15, 31, 63 s, room for a slow api-server start on a busy box
    with lite_stack(tmp_path / "home", extra_env={"AIRFLOW__WORKERS__EXECUTION_API_RETRIES": "7"}) as stack:
        stack.migrate()
        env = stack.env()
        spawn_in_stack(stack, "scheduler", [sys.executable, "-m", "airflow", "scheduler"], env=env)
        spawn_in_stack(stack, "dag-processor", [sys.executable, "-m", "airflow", "dag-processor"], env=env)
        wait_for(lambda: serialized(stack, PROBE), 120, f"{PROBE} to be serialized")
        airflow_cli(stack, "dags", "unpause", PROBE)
        airflow_cli(stack, "dags", "trigger", PROBE, "--run-id", "late_api")
        first = wait_for(lambda: agents(stack), 90, "the first agent to start")
        assert not stack._api_up()  # noqa: SLF001 - the point of the test: nothing listens yet
        time.sleep(10)
        assert any(proc.identity(a.pid) for a in first), "the agent gave up before the api-server came up"
        spawn_in_stack(stack, "api-server", [sys.executable, "-m", "airflow", "api-server"], env=env)
        wait_for(stack._api_up, 90, "the api-server")  # noqa: SLF001
        assert stack.wait_for_run(PROBE, "late_api", timeout=120) == "success"
        assert stack.task_states(PROBE, "late_api") == {"hello": "success", "echo": "success"}


@pytest.mark.airflow
@pytest.mark.timeout(300)
def test_killed_zygote_is_restarted_and_work_goes_on(tmp_path):
    """SIGKILL the zygote while an agent runs: the scheduler log says it died and was restarted, a new
    zygote serves, the running task still succeeds, and later tasks still run (with one slot, so a slot
    leaked by the orphaned attempt would starve them)."""
    with lite_stack(tmp_path / "home", parallelism=1) as stack:
        stack.migrate()
        stack.start(wait_for_dags=[PROBE, HOLD])
        for dag in (PROBE, HOLD):
            stack.unpause(dag)
        assert stack.wait_for_run(PROBE, stack.trigger(PROBE), timeout=120) == "success"

        hold_run = stack.trigger(HOLD, conf={"seconds": 30})  # the restart below takes 1-3 s
        running = wait_for(lambda: [a for a in agents(stack) if b".hold " in a.cmdline], 60, "the hold agent")
        agent = proc.identity(running[0].pid)
        (old,) = zygotes(stack)
        os.kill(old.pid, signal.SIGKILL)
        # well before the hold agent ends: an agent must not keep the dead zygote's socket answering
        wait_for(lambda: "restarted" in log_text(stack, "scheduler"), 30, "the executor to restart the zygote")
        text = log_text(stack, "scheduler")
        assert "zygote died" in text and "the leoflow zygote was restarted (restart #1)" in text, text[-3000:]
        new = wait_for(lambda: zygotes(stack), 30, "a new zygote")
        assert len(new) == 1 and new[0].pid != old.pid and new[0].ppid == scheduler(stack).pid
        assert agent is not None and proc.is_alive(agent), "the zygote's death took a running agent with it"

        assert stack.wait_for_run(HOLD, hold_run, timeout=120) == "success"
        for _ in range(2):  # later work runs through the new zygote, in the one slot
            run_id = stack.trigger(PROBE)
            assert stack.wait_for_run(PROBE, run_id, timeout=90) == "success", stack.task_states(PROBE, run_id)
