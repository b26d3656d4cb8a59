"""Issue 3 acceptance on a real Airflow (scheduler, dag-processor, api-server; SQLite) with fault injection.

Each scenario kills the agent of one attempt at a named fault point (DESIGN §3) through the test-only
``[leoflow] test_fault_plan`` and checks what a user would see: the TI's final state, how often the task's
body ran (a side-effect counter), which callbacks fired, and the TI's event log. All scenarios run in one
stack, in parallel DAG runs.
"""

from __future__ import annotations

import json
import sqlite3
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from devtools.stack import AirflowStack
from fault_helpers import callbacks

pytestmark = pytest.mark.airflow

FAULT_DAGS = Path(__file__).resolve().parent.parent / "fault_dags"
EXECUTOR = "leoflow_airflow.executor.LeoflowExecutor"


def _runs(stack: AirflowStack, dag_id: str, task: str, run_id: str) -> list[str]:
    path = stack.traces_dir / f"{dag_id}.{task}.runs"
    if not path.exists():
        return []
    return [line.split()[1] for line in path.read_text().splitlines() if line.split()[0] == run_id]


def _db(stack: AirflowStack, query: str, *args: object) -> list[tuple]:
    with sqlite3.connect(stack.home / "airflow.db", timeout=30) as conn:
        return conn.execute(query, args).fetchall()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory):
    home = tmp_path_factory.mktemp("recovery")
    plan = home / "fault-plan.json"
    plan.write_text("{}")
    extra = {
        "AIRFLOW__LEOFLOW__TEST_FAULT_INJECTION": "True",
        "AIRFLOW__LEOFLOW__TEST_FAULT_PLAN": str(plan),
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
    }
    with AirflowStack(home, executor=EXECUTOR, parallelism=8, dags_folder=FAULT_DAGS, extra_env=extra) as s:
        s.migrate()
        s.start(wait_for_dags=["leoflow_faulty_r0", "leoflow_faulty_r1"])
        s.fault_plan = plan  # type: ignore[attr-defined]
        yield s


def _trigger(stack: AirflowStack, dag_id: str, faults: dict[str, str]) -> str:
    """Trigger ``dag_id`` with a known run_id after adding ``{"task/try/epoch": fault}`` to the plan."""
    run_id = f"t_{dag_id}_{time.monotonic_ns()}"
    plan = json.loads(stack.fault_plan.read_text())  # type: ignore[attr-defined]
    for key, fault in faults.items():
        task, try_number, epoch = key.split("/")
        plan[f"{dag_id}/{run_id}/{task}/{try_number}/{epoch}"] = fault
    stack.fault_plan.write_text(json.dumps(plan))  # type: ignore[attr-defined]
    body = {"dag_run_id": run_id, "logical_date": datetime.now(timezone.utc).isoformat(), "conf": {}}
    stack._call("POST", f"/dags/{dag_id}/dagRuns", json=body)
    return run_id


def test_failure_paths(stack: AirflowStack) -> None:
    """All scenarios at once; each assertion names its scenario."""
    t0 = time.monotonic()
    runs = {
        # lost report, success: killed after its success record, before the terminal PATCH
        "lost_success": ("leoflow_faulty_r0", _trigger(stack, "leoflow_faulty_r0", {"work/1/1": "after_record"})),
        # lost report, up_for_retry (retries left) on fails_first
        "lost_retry": ("leoflow_faulty_r1", _trigger(stack, "leoflow_faulty_r1", {"fails_first/1/1": "after_record"})),
        # killed mid-task, no record, retries=0: re-run on the infra budget
        "mid_task": ("leoflow_faulty_r0", _trigger(stack, "leoflow_faulty_r0", {"work/1/1": "mid_task"})),
        # killed before /run: same ti_id again as epoch 2
        "before_run": ("leoflow_faulty_r0", _trigger(stack, "leoflow_faulty_r0", {"work/1/1": "before_run"})),
    }
    finished = {}
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and len(finished) < len(runs):
        for name, (dag_id, run_id) in runs.items():
            if name not in finished:
                state = stack.run(dag_id, run_id)["state"]
                if state in ("success", "failed"):
                    finished[name] = state
        time.sleep(2)
    elapsed = time.monotonic() - t0
    assert len(finished) == len(runs), f"runs not finished after {elapsed:.0f}s: {finished}"

    # --- lost success: SUCCESS, body once, no failure/retry callback, downstream ran, Log row says so
    dag, run = runs["lost_success"]
    assert finished["lost_success"] == "success"
    states = stack.task_states(dag, run)
    assert states == {"work": "success", "downstream": "success"}, (finished, states)
    assert _runs(stack, dag, "work", run) == ["1"], "the body ran exactly once"
    assert _runs(stack, dag, "downstream", run) == ["1"]
    events = [e for (e,) in _db(stack, "select event from log where run_id = ? and task_id = 'work'", run)]
    assert "leoflow lost on_success_callback" in events
    assert not any(e.startswith("leoflow infra") for e in events)

    # --- lost up_for_retry: follows the recorded path once; on_retry ran exactly once; try 2 succeeded
    dag, run = runs["lost_retry"]
    assert stack.task_states(dag, run)["fails_first"] == "success"
    assert _runs(stack, dag, "fails_first", run) == ["1", "2"], "each try's body ran exactly once"
    deadline = time.monotonic() + 60  # the DAG processor runs the callback request asynchronously
    while time.monotonic() < deadline and not callbacks(stack, dag)[("fails_first", "1", "retry")]:
        time.sleep(1)
    time.sleep(3)
    cb = callbacks(stack, dag)
    assert cb[("fails_first", "1", "retry")] == 1, cb
    assert cb[("fails_first", "1", "failure")] == 0, cb

    # --- mid-task kill, retries=0: re-run as a new try on the infra budget, max_tries rose by exactly 1
    dag, run = runs["mid_task"]
    assert stack.task_states(dag, run)["work"] == "success"
    assert _runs(stack, dag, "work", run) == ["1", "2"]
    (max_tries,) = _db(stack, "select max_tries from task_instance where run_id = ? and task_id='work'", run)[0]
    assert max_tries == 1, "max_tries rose by exactly one for one infra re-run (retries=0)"
    events = [e for (e,) in _db(stack, "select event from log where run_id = ? and task_id = 'work'", run)]
    assert "leoflow infra re-drive" in events

    # --- killed before /run: ran as epoch 2 of the same ti_id, within seconds
    dag, run = runs["before_run"]
    assert stack.task_states(dag, run)["work"] == "success"
    assert _runs(stack, dag, "work", run) == ["1"], "the body ran once, on try 1"
    rows = _db(stack, "select attempt_epoch, resolution from leoflow_attempt where run_id = ? and task_id='work' "
                      "order by attempt_epoch", run)
    assert rows[0] == (1, "redispatched") and rows[1][0] == 2, rows
    assert elapsed < 200
