"""Lite warm workers (issue 11 item 3): a DAG file's attempts are forked by a file worker that parsed the file
once, so their task processes neither parse it nor import what it imports; a changed file is never served
from the old parse. Against a real Airflow (scheduler, dag-processor, api-server) with LeoflowExecutor (Lite)."""

from __future__ import annotations

import json
import shutil
import time

import pytest

from lite_procs import TEST_DAGS, lite_stack, zygote_file

DAG = "leoflow_test_warm"


def probes(home, run_id: str) -> list[dict]:
    """The probe lines the tasks of ``run_id`` wrote (``tests/dags/leoflow_test_warm.py``)."""
    path = home / "warm_probe.jsonl"
    lines = [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []
    return [x for x in lines if x["run_id"] == run_id]


def wait_for_log(stack, needle: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while True:
        text = zygote_file(stack, "zygote.log").read_text()
        if needle in text:
            return text
        assert time.monotonic() < deadline, f"{needle!r} not in the zygote log:\n{text[-3000:]}"
        time.sleep(0.5)


@pytest.mark.airflow
@pytest.mark.timeout(420)
def test_attempts_of_a_dag_file_are_forked_parsed_and_a_changed_file_is_parsed_again(tmp_path):
    """Run 1: the file's first attempt starts its file worker and is forked by the zygote (its task process
    parses the file). Run 2, once the file worker is ready: every task ran from the file worker's parse (none
    parsed the file itself). Then the file's ``VERSION`` is rewritten: every task of run 3 runs the new text."""
    dags = tmp_path / "dags"
    dags.mkdir()
    dag_file = dags / "leoflow_test_warm.py"
    shutil.copy(TEST_DAGS / "leoflow_test_warm.py", dag_file)
    home = tmp_path / "home"
    with lite_stack(home, dags_folder=dags) as stack:
        stack.migrate()
        stack.start(wait_for_dags=[DAG])
        stack.unpause(DAG)

        first = stack.trigger(DAG)
        assert stack.wait_for_run(DAG, first, timeout=120) == "success", stack.task_states(DAG, first)
        assert any(p["parsed_here"] for p in probes(home, first)), probes(home, first)  # the probe tells them apart
        wait_for_log(stack, f":{dag_file.name}: 1 DAGs, parse cached in it", timeout=60)

        second = stack.trigger(DAG)
        assert stack.wait_for_run(DAG, second, timeout=120) == "success", stack.task_states(DAG, second)
        ran = probes(home, second)
        assert len(ran) == 4 and not any(p["parsed_here"] for p in ran), ran
        assert {p["version"] for p in ran} == {"first"}

        dag_file.write_text(dag_file.read_text().replace('VERSION = "first"', 'VERSION = "second-version"'))
        third = stack.trigger(DAG)
        assert stack.wait_for_run(DAG, third, timeout=120) == "success", stack.task_states(DAG, third)
        ran = probes(home, third)
        assert len(ran) == 4 and {p["version"] for p in ran} == {"second-version"}, ran
        wait_for_log(stack, f"{dag_file} changed", timeout=10)
