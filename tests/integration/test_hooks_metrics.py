"""Extension hooks and metrics on a real Airflow with LeoflowExecutor (Lite; issue 12 items 4 and 6).

One stack (scheduler, dag-processor, api-server; SQLite) on ``tests/fault_dags`` with fault injection, Lite
file workers on, ``[metrics] statsd_on`` pointed at a UDP StatsD listener this test starts, and the test plugin
(``tests/plugin_pkg``, installed by ``make venv``) switched on with ``LEOFLOW_TEST_PLUGIN_DIR`` and told to
raise after each observation (``LEOFLOW_TEST_PLUGIN_RAISE=1``): a broken plugin must not break settlement.

Runs, in parallel: a lost success report (replayed), a mid-task kill (infra re-drive), an agent that hangs
before ``/run`` (the dispatch-lost reaper kills it; re-dispatched as epoch 2), then, once the DAG file's file
worker is ready, a clean run (warm forks). Asserted: every run ends as it does without plugins; the plugin saw
each attempt settled with its evidence, resolution and epoch, and the warm pool grow; and every metric of
:data:`leoflow_airflow.metrics.METRICS` that the Lite runtime emits arrived at the listener at least once
(with the recoveries and the reaper that these runs cause by name).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from devtools.stack import AirflowStack
from devtools.statsd import StatsdListener
from leoflow_airflow.metrics import METRICS

pytestmark = pytest.mark.airflow

FAULT_DAGS = Path(__file__).resolve().parent.parent / "fault_dags"
EXECUTOR = "leoflow_airflow.executor.LeoflowExecutor"
DAG = "leoflow_faulty_r0"
PREFIX = "airflow."


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def _trigger(stack: AirflowStack, plan: Path, faults: dict[str, str]) -> str:
    """Trigger a run of :data:`DAG` after planning ``{"task/try/epoch": fault point}`` for it."""
    run_id = f"t_{DAG}_{time.monotonic_ns()}"
    entries = json.loads(plan.read_text())
    entries.update({f"{DAG}/{run_id}/{key}": point for key, point in faults.items()})
    plan.write_text(json.dumps(entries))
    return _post(stack, run_id)


def _post(stack: AirflowStack, run_id: str) -> str:
    """Create the dag run ``run_id`` of :data:`DAG` now."""
    from datetime import datetime, timezone

    stack._call("POST", f"/dags/{DAG}/dagRuns",
                json={"dag_run_id": run_id, "logical_date": datetime.now(timezone.utc).isoformat(), "conf": {}})
    return run_id


def _wait(stack: AirflowStack, runs: dict[str, str], timeout: float) -> dict[str, str]:
    done: dict[str, str] = {}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and len(done) < len(runs):
        for name, run_id in runs.items():
            if name not in done and (state := stack.run(DAG, run_id)["state"]) in ("success", "failed"):
                done[name] = state
        time.sleep(2)
    return done


@pytest.mark.timeout(600)
def test_plugins_observe_and_every_lite_metric_arrives(tmp_path):
    """The scenario in the module docstring."""
    home = tmp_path / "home"
    home.mkdir()
    plugin_dir = tmp_path / "plugin"
    plugin_dir.mkdir()
    plan = home / "fault-plan.json"
    plan.write_text("{}")
    with StatsdListener() as statsd:
        extra = {
            "AIRFLOW__LEOFLOW__TEST_FAULT_INJECTION": "True",
            "AIRFLOW__LEOFLOW__TEST_FAULT_PLAN": str(plan),
            "AIRFLOW__LEOFLOW__DISPATCH_LOST_THRESHOLD": "15",
            "AIRFLOW__LEOFLOW__LITE_WARM_FILES": "4",
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
            "AIRFLOW__METRICS__STATSD_ON": "True",
            "AIRFLOW__METRICS__STATSD_HOST": "127.0.0.1",
            "AIRFLOW__METRICS__STATSD_PORT": str(statsd.port),
            "AIRFLOW__METRICS__STATSD_PREFIX": PREFIX.rstrip("."),
            "LEOFLOW_TEST_PLUGIN_DIR": str(plugin_dir),
            "LEOFLOW_TEST_PLUGIN_RAISE": "1",
        }
        with AirflowStack(home, executor=EXECUTOR, parallelism=8, dags_folder=FAULT_DAGS, extra_env=extra) as stack:
            stack.migrate()
            stack.start(wait_for_dags=[DAG])
            runs = {
                "replayed": _trigger(stack, plan, {"work/1/1": "after_record"}),
                "infra_redrive": _trigger(stack, plan, {"work/1/1": "mid_task"}),
                "redispatched": _trigger(stack, plan, {"work/1/1": "hang_before_run"}),
            }
            done = _wait(stack, runs, timeout=240)
            assert done == {name: "success" for name in runs}, (done, {n: stack.task_states(DAG, r)
                                                                       for n, r in runs.items()})
            warm_run = _post(stack, f"t_{DAG}_warm_{time.monotonic_ns()}")
            assert _wait(stack, {"warm": warm_run}, timeout=120) == {"warm": "success"}
            deadline = time.monotonic() + 30  # the last settles and metrics of the warm run
            while time.monotonic() < deadline and not {"leoflow.warm.lite.hit"} <= statsd.names(PREFIX):
                time.sleep(1)

    # --- leoflow_attempt_settled: each attempt once, with its evidence, resolution and epoch
    settled = _lines(plugin_dir / "settled.jsonl")
    assert settled, "the plugin saw no attempt settled"
    resolutions = {(s["resolution"], s["attempt_epoch"], s["evidence"]["record_state"]) for s in settled
                   if s["task_id"] == "work"}
    assert ("replayed", 1, "success") in resolutions, resolutions  # the lost report, from its record
    assert ("infra_redrive", 1, None) in resolutions, resolutions  # no record: a new try
    assert ("redispatched", 1, None) in resolutions, resolutions  # killed before /run: epoch 2 follows
    assert any(r == "reported" and epoch == 2 for r, epoch, _ in resolutions), resolutions
    assert all(s["runtime"] == "lite" and s["dag_id"] == DAG for s in settled), settled
    keys = [(s["ti_id"], s["attempt_epoch"]) for s in settled]
    assert len(keys) == len(set(keys)), "each attempt is settled once"
    scheduler_log = (home / "process-logs" / "scheduler.log").read_text()
    assert "a leoflow_attempt_settled hook raised" in scheduler_log  # logged, and settlement went on

    # --- leoflow_warm_pool_resized: the file worker of leoflow_faulty.py became ready
    warm = _lines(plugin_dir / "warm.jsonl")
    assert {"pool_key": "lite:file_workers", "before": 0, "after": 1} in warm, warm

    # --- metrics: every documented Lite metric arrived, and the recoveries these runs caused by name
    names = statsd.names(PREFIX)
    missing = [m.name for m in METRICS if "lite" in m.runtimes and not any(m.matches(n) for n in names)]
    assert not missing, (missing, sorted(names))
    for expected in ("leoflow.recovery.replayed", "leoflow.recovery.infra_redrive", "leoflow.recovery.redispatched",
                     "leoflow.reaper.dispatch-lost", "leoflow.dispatch.dispatched", "leoflow.warm.lite.hit",
                     "leoflow.warm.lite.miss"):
        assert expected in names, (expected, sorted(names))
    kinds = {s.name[len(PREFIX):]: s.kind for s in statsd.samples() if s.name.startswith(PREFIX + "leoflow.")}
    assert kinds["leoflow.executor.sync"] == "ms" and kinds["leoflow.warm.lite.file_workers"] == "g"
    assert kinds["leoflow.dispatch.dispatched"] == "c"
