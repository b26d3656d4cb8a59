"""Test DAG (tests/integration/test_warm_pod_agent_process.py): two tasks run one after another by one warm pod agent.

Its top level appends the parsing process's pid to ``$LEOFLOW_TEST_PARSE_LOG`` when that is set (only the agent's
environment sets it, not the dag-processor's), so the test counts how often the agent's processes parsed the file.
Each task appends one JSON line to ``$LEOFLOW_TEST_PROBE``: what it found in the first sweep root
(``$LEOFLOW_WARM_SWEEP_ROOTS``) before leaving a file there, its ``HOME`` and ``TMPDIR``, and whether its own
process parsed this file. With ``$LEOFLOW_TEST_HOLD`` set, a task first writes its pid to ``<that path>.pid``
and waits while the file ``$LEOFLOW_TEST_HOLD`` exists.
"""

from __future__ import annotations

import json
import os
import tempfile
import time

from airflow.sdk import dag, get_current_context, task

PARSED_IN = os.getpid()
if os.environ.get("LEOFLOW_TEST_PARSE_LOG"):
    with open(os.environ["LEOFLOW_TEST_PARSE_LOG"], "a") as parse_log:
        parse_log.write(f"{PARSED_IN}\n")


@dag(dag_id="leoflow_test_warm_pod", schedule=None, catchup=False, tags=["leoflow-test"])
def leoflow_test_warm_pod():
    """Tasks ``t0`` and ``t1``, each :func:`probe`."""

    @task(retries=0)
    def probe() -> None:
        """Look at the sweep root, leave files in it, in ``HOME`` and in ``TMPDIR``; append the probe line."""
        task_id = get_current_context()["ti"].task_id
        hold = os.environ.get("LEOFLOW_TEST_HOLD")
        if hold:
            with open(f"{hold}.pid", "w") as f:
                f.write(str(os.getpid()))
            while os.path.exists(hold):
                time.sleep(0.1)
        root = os.environ["LEOFLOW_WARM_SWEEP_ROOTS"].split(":")[0]
        found = sorted(os.listdir(root))
        with open(os.path.join(root, f"left-by-{task_id}"), "w") as f:
            f.write(task_id)
        with open(os.path.join(os.environ["HOME"], f"home-{task_id}"), "w") as f:
            f.write(task_id)
        with tempfile.NamedTemporaryFile(prefix=f"tmp-{task_id}-", delete=False) as f:
            tmp_file = f.name
        line = {"task_id": task_id, "found": found, "home": os.environ["HOME"],
                "tmpdir": os.environ.get("TMPDIR"), "tmp_file": tmp_file, "parsed_in": PARSED_IN,
                "parsed_here": PARSED_IN == os.getpid()}
        with open(os.environ["LEOFLOW_TEST_PROBE"], "a") as f:
            f.write(json.dumps(line) + "\n")

    probe.override(task_id="t0")() >> probe.override(task_id="t1")()


leoflow_test_warm_pod()
