"""The agent's outcome records on a real Airflow (scheduler, dag-processor, api-server; SQLite), issue 8:

* hole 12: the attempt's record directory is read-only (a read-only bind mount: the agent runs as root, so
  file modes would not stop it). The success report still lands: try 1, one body, and the TI's log says the
  record could not be written;
* hole 16h: a success body over the record's 1 MiB; the record drops its asset events and the TI's log says
  so, while Airflow registers every event from the real report;
* hole 5: an api-server outage spans the task's end. The success is recorded, its PATCH times out, and the
  third failed heartbeat comes after it: the success record is kept, the reconciler replays it once the
  api-server is back, and the body ran once (before the fix: ``heartbeat_lost`` replaced the record, the task
  was re-driven and its body ran twice).

DAGs: ``tests/fault_dags/leoflow_records.py``. Helpers: ``fault_helpers.py``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from fault_helpers import FaultStack, executions, pid_alive, wait_until
from lite_procs import zygote_file
from leoflow_agent import outcome

pytestmark = pytest.mark.airflow

INFRA = "leoflow infra re-drive"

# The supervisor gives up after 3 failed heartbeat calls, 2 s apart, each 3 tries of up to 6 s with 0.5-1 s
# between them (Airflow's defaults: 3 calls 5 s apart, 5 tries each with waits up to 90 s, i.e. minutes). A
# failing call then lasts about 19 s: the window the test aims the task's end at (it reacts within a second),
# and 3 tries of 6 s (Airflow's timeout is 5 s) keep a slow api-server on a loaded machine from failing calls
# outside the outage.
OUTAGE_SETTINGS = {
    "AIRFLOW__WORKERS__EXECUTION_API_RETRIES": "3",
    "AIRFLOW__WORKERS__EXECUTION_API_RETRY_WAIT_MIN": "0.5",
    "AIRFLOW__WORKERS__EXECUTION_API_RETRY_WAIT_MAX": "1",
    "AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT": "6",
    "AIRFLOW__WORKERS__MIN_HEARTBEAT_INTERVAL": "2",
    "AIRFLOW__WORKERS__MAX_FAILED_HEARTBEATS": "3",
}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory):
    """One stack for the module; every process is stopped at the end, even on failure."""
    with FaultStack(tmp_path_factory.mktemp("records"), extra_env=OUTAGE_SETTINGS) as s:
        s.up(["lf_rec", "lf_rec_assets"])
        yield s


def _ti_log(stack: FaultStack, dag_id: str, run_id: str, task_id: str, try_number: int = 1) -> list[dict]:
    """The JSON lines of one try's TI log file (the file the UI shows), ``[]`` when there is none yet."""
    matches = [p for p in (stack.home / "logs").rglob(f"attempt={try_number}.log")
               if f"dag_id={dag_id}" in p.parts and f"run_id={run_id}" in p.parts and f"task_id={task_id}" in p.parts]
    lines = []
    for path in matches:
        for raw in path.read_text().splitlines():
            try:
                lines.append(json.loads(raw))
            except ValueError:
                lines.append({"event": raw})
    return lines


def _events(lines: list[dict]) -> list[str]:
    return [str(line.get("event")) for line in lines]


@contextlib.contextmanager
def _read_only(directory: str) -> Iterator[None]:
    """Make ``directory`` read-only for everyone, root included (a read-only bind mount over itself)."""
    try:
        subprocess.run(["mount", "--bind", directory, directory], check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"cannot bind-mount here (needs root with CAP_SYS_ADMIN): {exc}")
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", directory], check=True, capture_output=True)
        yield
    finally:
        if subprocess.run(["umount", directory], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", directory], capture_output=True)


def _started(stack: FaultStack, dag_id: str, task_id: str, run_id: str) -> dict:
    """Wait for the body to start; returns the ledger row of the attempt running it (the latest epoch, its
    agent's pid known). An earlier epoch may have died before ``/run`` (a slow api-server): not this test's
    subject, and re-dispatched by leoflow."""
    wait_until(lambda: executions(stack, dag_id, task_id, run_id), 180, f"the body of {dag_id}.{task_id} to start")
    row = wait_until(lambda: [a for a in stack.attempts(dag_id, run_id, task_id)
                              if a["pid"] and a["state"] == "dispatched"], 60, "the running attempt's agent pid")
    assert len(row) == 1, stack.attempts(dag_id, run_id, task_id)
    return row[0]


def _resolutions(stack: FaultStack, dag_id: str, run_id: str, task_id: str) -> list[str]:
    return [a["resolution"] for a in stack.attempts(dag_id, run_id, task_id)]


def test_a_record_that_cannot_be_written_does_not_block_the_report(stack: FaultStack) -> None:
    """Hole 12. Before the fix the record error blocked the PATCH: the success never landed, the task was
    re-driven and its body ran again on try 2."""
    run = stack.trigger_with("lf_rec", prefix="ro")
    attempt = _started(stack, "lf_rec", "work", run)
    directory = os.path.dirname(attempt["record_path"])
    with _read_only(directory):
        with pytest.raises(OSError):
            Path(directory, "probe").write_text("x")
        stack.release(run)
        final = stack.wait_for_run("lf_rec", run, timeout=240, poll=2.0)
        wait_until(lambda: stack.attempts("lf_rec", run, "work")[-1]["state"] == "closed", 60, "the attempt closed")
    ti = stack.ti_row("lf_rec", run, "work")
    execs = executions(stack, "lf_rec", "work", run)
    assert final == "success" and (ti["state"], ti["try_number"]) == ("success", 1), (final, ti)
    assert len(execs) == 1 and execs[0].ended, execs
    assert not os.path.exists(attempt["record_path"])
    resolutions = _resolutions(stack, "lf_rec", run, "work")
    assert resolutions[-1] == "reported" and "infra_redrive" not in resolutions, resolutions
    assert INFRA not in stack.log_events("lf_rec", run, "work")
    said = [e for e in _events(_ti_log(stack, "lf_rec", run, "work")) if "outcome record" in e]
    assert said and "could not write" in said[0] and "Read-only file system" in said[0], said


def test_a_record_too_large_for_its_asset_events_says_so_in_the_ti_log(stack: FaultStack) -> None:
    """Hole 16h. The record left out the asset events (``assets_dropped``) and, before the fix, only the
    scheduler's log could say so; now the TI's log does, and the real report registered all 8 events."""
    run = stack.trigger_with("lf_rec_assets", prefix="assets")
    assert stack.wait_for_run("lf_rec_assets", run, timeout=240, poll=2.0) == "success"
    attempt = stack.attempts("lf_rec_assets", run, "emit")[-1]
    record = outcome.read_record_file(attempt["record_path"])
    assert record is not None and record.state == "success" and record.assets_dropped, record
    registered = stack.db("select count(*) from asset_event where source_dag_id=? and source_run_id=?",
                          "lf_rec_assets", run)[0][0]
    assert registered == 8, registered
    said = [e for e in _events(_ti_log(stack, "lf_rec_assets", run, "emit")) if "asset events" in e]
    assert said and "left out its 8 asset events" in said[0], said


def test_heartbeat_loss_after_the_success_was_recorded_replays_it(stack: FaultStack) -> None:
    """Hole 5. The api-server freezes (SIGSTOP) while the task runs. Once one heartbeat failed and the next
    is in flight, the task ends: its success is recorded, the PATCH times out, and the third failed heartbeat
    follows. The agent exits while the api-server is still down; the frozen api-server is then killed (its
    queued requests die with it) and started again. Expected: the success record kept, replayed by the
    reconciler: success on try 1, one body, resolution ``replayed``."""
    run = stack.trigger_with("lf_rec", prefix="outage")
    attempt = _started(stack, "lf_rec", "work", run)
    expect = outcome.AttemptIdentity(attempt["ti_id"], attempt["try_number"], attempt["attempt_epoch"])
    zygote_log = zygote_file(stack, "zygote.log")
    seen = zygote_log.stat().st_size
    retrying = f"heartbeat of {attempt['ti_id']}: trying again after 1 failed in a row"
    pgid = stack.pid_of("api-server")
    os.killpg(pgid, signal.SIGSTOP)
    try:
        wait_until(lambda: retrying in zygote_log.read_text(errors="replace")[seen:], 120,
                   "the second heartbeat call in flight")
        stack.release(run)
        wait_until(lambda: not pid_alive(attempt["pid"]), 180, "the agent to give up on heartbeats and exit")
        record = outcome.read_record_file(attempt["record_path"], expect=expect)
    finally:
        stack.kill_component("api-server", signal.SIGKILL, group=True)  # SIGKILL ends a stopped process too
        stack.start_component("api-server")
    stack.wait_api()
    final = stack.wait_for_run("lf_rec", run, timeout=240, poll=2.0)
    ti = stack.ti_row("lf_rec", run, "work")
    execs = executions(stack, "lf_rec", "work", run)
    rows = stack.attempts("lf_rec", run, "work")
    assert [e.try_number for e in execs] == [1] and execs[0].ended, ("a body that succeeded ran again", execs)
    assert final == "success" and (ti["state"], ti["try_number"]) == ("success", 1), (final, ti, rows)
    ours = [r for r in rows if r["attempt_epoch"] == attempt["attempt_epoch"]]
    assert [r["resolution"] for r in ours] == ["replayed"] and rows[-1] == ours[0], rows
    assert record is not None and record.state == "success" and record.reason is None, record
    assert INFRA not in stack.log_events("lf_rec", run, "work")
    said = [e for e in _events(_ti_log(stack, "lf_rec", run, "work")) if "heartbeats in a row failed" in e]
    assert said and "recorded success" in said[0] and "kept" in said[0], said

