"""A task that fails on its first try and succeeds on the retry (decided by ``ti.try_number``)."""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import dag, task


@dag(dag_id="leoflow_retry", schedule=None, catchup=False, tags=["leoflow"])
def leoflow_retry():
    """flaky (fails try 1, passes try 2) -> after_retry."""

    @task(retries=1, retry_delay=timedelta(seconds=2))
    def flaky(ti=None) -> int:
        """Raise ``RuntimeError`` on try 1; return the try number (2) afterwards."""
        if ti.try_number == 1:
            raise RuntimeError("first try fails on purpose")
        return ti.try_number

    @task
    def after_retry(try_number: int) -> None:
        """Raise ``ValueError`` unless the upstream succeeded on exactly its second try."""
        if try_number != 2:
            raise ValueError(f"flaky succeeded on try {try_number}, expected 2")

    after_retry(flaky())


leoflow_retry()
