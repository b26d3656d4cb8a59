"""A lost report is replayed over https with the Task SDK's TLS settings (issue 8 hole 7a; review finding 7).

A real Airflow whose api-server serves https with a self-signed certificate generated here (``[api]
ssl_cert`` / ``ssl_key``; the Task SDK trusts ``ssl_cert`` as its CA, so agents reach it). The agent of
``work`` is killed at ``after_record``: its success record is on disk, its terminal PATCH never left. The
scheduler must replay the record over the same https endpoint, verifying the certificate as the SDK does,
so the task ends SUCCESS with its body run once and no infra re-drive. With httpx's default trust store the
replay fails verification on every ``sync()`` and the task stays RUNNING until Airflow's heartbeat purge.
"""

from __future__ import annotations

import sqlite3
import time
from datetime import datetime, timezone

import pytest

from devtools.stack import AirflowStack
from devtools.tls import self_signed_cert
from fault_helpers import EXECUTOR, FAULT_DAGS

pytestmark = [pytest.mark.airflow, pytest.mark.timeout(600)]

DAG = "leoflow_faulty_r0"


def test_lost_success_is_replayed_over_https(tmp_path):
    home = tmp_path / "home"
    cert, key = self_signed_cert(tmp_path / "tls")
    plan = tmp_path / "fault-plan.json"
    run_id = f"tls_{time.monotonic_ns()}"
    plan.write_text(f'{{"{DAG}/{run_id}/work/1/1": "after_record"}}')
    extra = {
        "AIRFLOW__LEOFLOW__TEST_FAULT_INJECTION": "True",
        "AIRFLOW__LEOFLOW__TEST_FAULT_PLAN": str(plan),
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
    }
    with AirflowStack(home, executor=EXECUTOR, parallelism=4, dags_folder=FAULT_DAGS, extra_env=extra,
                      tls=(cert, key)) as stack:
        assert stack.base_url.startswith("https://")
        stack.migrate()
        stack.start(wait_for_dags=[DAG])
        body = {"dag_run_id": run_id, "logical_date": datetime.now(timezone.utc).isoformat(), "conf": {}}
        stack._call("POST", f"/dags/{DAG}/dagRuns", json=body)
        # well inside the 300 s heartbeat purge, which is what fails the task when the replay cannot land
        state = stack.wait_for_run(DAG, run_id, timeout=200, poll=2)

        with sqlite3.connect(home / "airflow.db", timeout=60) as conn:
            attempts = conn.execute(
                "select attempt_epoch, resolution, detail from leoflow_attempt where run_id = ? and task_id = 'work'",
                (run_id,)).fetchall()
            events = [e for (e,) in conn.execute(
                "select event from log where run_id = ? and task_id = 'work'", (run_id,))]
        assert state == "success", (state, stack.task_states(DAG, run_id), attempts)
        assert stack.task_states(DAG, run_id) == {"work": "success", "downstream": "success"}
        runs = (stack.traces_dir / f"{DAG}.work.runs").read_text().split()
        assert runs.count(run_id) == 1, "the body ran exactly once"
        assert [(epoch, resolution) for epoch, resolution, _ in attempts] == [(1, "replayed")], attempts
        assert "leoflow lost on_success_callback" in events
        assert not any(e.startswith("leoflow infra") for e in events), events
