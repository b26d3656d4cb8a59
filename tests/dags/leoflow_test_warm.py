"""Test DAG (tests/integration/test_lite_warm.py): four tasks that each append one JSON line to
``$AIRFLOW_HOME/warm_probe.jsonl`` saying which process parsed this file for them and which ``VERSION`` of the
file they ran. The test rewrites ``VERSION`` to check that a changed file is never served from an old parse."""

from __future__ import annotations

import json
import os

from airflow.sdk import dag, get_current_context, task

VERSION = "first"
PARSED_IN = os.getpid()  # the process that executed this file's top level for the running task


@dag(dag_id="leoflow_test_warm", schedule=None, catchup=False, tags=["leoflow-test"])
def leoflow_test_warm():
    """Four tasks ``p0`` .. ``p3``, each :func:`probe`."""

    @task(retries=0)
    def probe() -> None:
        """Append ``{"run_id", "task_id", "version", "parsed_here"}`` to the probe file."""
        ctx = get_current_context()
        line = {"run_id": ctx["run_id"], "task_id": ctx["ti"].task_id, "version": VERSION,
                "parsed_here": PARSED_IN == os.getpid()}
        path = os.path.join(os.environ["AIRFLOW_HOME"], "warm_probe.jsonl")
        with open(path, "a") as f:
            f.write(json.dumps(line) + "\n")

    for i in range(4):
        probe.override(task_id=f"p{i}")()


leoflow_test_warm()
