"""Live task logs through ``get_task_log``, the finished task's log through the same REST call (issue 12 item 7,
Lite: the agent's log file in ``[logging] base_log_folder``), and ``supports_callbacks = True``: a DAG deadline's
SyncCallback reaches LeoflowExecutor as an ``ExecuteCallback`` workload and really runs (issue 2, item 3),
against a real Airflow."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from devtools.stack import REPO_ROOT, AirflowStack

pytestmark = pytest.mark.airflow

CALLBACK_DAGS = Path(__file__).resolve().parent.parent / "callback_dags"


def test_live_log_and_deadline_callback_through_leoflow(tmp_path: Path) -> None:
    extra = {
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
        "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), str(CALLBACK_DAGS)]),
    }
    with AirflowStack(tmp_path / "home", executor="leoflow_airflow.executor.LeoflowExecutor",
                      dags_folder=CALLBACK_DAGS, extra_env=extra) as stack:
        stack.migrate()
        stack.start(wait_for_dags=["leoflow_deadline"])
        run_id = stack.trigger("leoflow_deadline")
        # get_task_log: the live log of the running attempt is served through the executor
        live = ""
        until = time.monotonic() + 60
        while time.monotonic() < until and "leoflow-live-log-marker" not in live:
            ti = stack._call("GET", f"/dags/leoflow_deadline/dagRuns/{run_id}/taskInstances/slow")
            if ti["state"] == "running":
                body = stack._call("GET", f"/dags/leoflow_deadline/dagRuns/{run_id}/taskInstances/slow/logs/1",
                                   headers={"accept": "application/json"})
                live = str(body)
            time.sleep(1)
        assert "leoflow-live-log-marker" in live
        assert "leoflow attempt" in live, "the log source names the leoflow attempt (get_task_log)"
        trace = stack.traces_dir / "deadline.log"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not trace.exists():
            time.sleep(1)
        assert trace.exists(), "the deadline callback never ran (see process-logs/scheduler.log)"
        assert trace.read_text().startswith("missed leoflow pid=")
        assert stack.wait_for_run("leoflow_deadline", run_id, timeout=120) == "success"
        time.sleep(3)
        assert len(trace.read_text().splitlines()) == 1, "the callback ran exactly once"
        # the finished task's log: Airflow's file task handler reads the attempt's log file, not the executor
        body = stack._call("GET", f"/dags/leoflow_deadline/dagRuns/{run_id}/taskInstances/slow/logs/1",
                           headers={"accept": "application/json"})
        events = [c.get("event", "") for c in body["content"] if isinstance(c, dict)]
        assert "leoflow-live-log-marker" in events, body
        assert not [e for e in events if "leoflow attempt" in e], "a finished task's log is not the executor's"
