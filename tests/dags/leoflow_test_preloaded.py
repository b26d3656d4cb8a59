"""Test DAG (tests/integration/test_lite_preload.py): a task that fails unless the module named in its
run's conf (``{"module": ...}``) was already imported when the task process started, i.e. by the zygote."""

from __future__ import annotations

import sys

from airflow.sdk import dag, get_current_context, task


@dag(dag_id="leoflow_test_preloaded", schedule=None, catchup=False, tags=["leoflow-test"])
def leoflow_test_preloaded():
    """One task: ``check``."""

    @task(retries=0)
    def check() -> None:
        """Raise unless ``conf["module"]`` is in ``sys.modules``."""
        module = get_current_context()["dag_run"].conf["module"]
        if module not in sys.modules:
            raise RuntimeError(f"{module} was not preloaded")

    check()


leoflow_test_preloaded()
