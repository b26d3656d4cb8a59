"""Task callbacks that leave a trace: on_success, on_retry and on_failure each append one line.

The line is ``dag_id task_id try_number callback_kind`` in ``$AIRFLOW_HOME/traces/<dag_id>.log``.
AIRFLOW_HOME is the only environment variable relied on: every executor must hand it to tasks.
"""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

from airflow.sdk import dag, task


def _trace(kind: str):
    """A callback that appends ``dag_id task_id try_number kind`` (one line, one write) to the trace file."""

    def callback(context) -> None:
        ti = context["ti"]
        folder = Path(os.environ["AIRFLOW_HOME"]) / "traces"
        folder.mkdir(parents=True, exist_ok=True)
        line = f"{ti.dag_id} {ti.task_id} {ti.try_number} {kind}\n"
        fd = os.open(folder / f"{ti.dag_id}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)

    return callback


CALLBACKS = {
    "on_success_callback": _trace("success"),
    "on_retry_callback": _trace("retry"),
    "on_failure_callback": _trace("failure"),
}


@dag(dag_id="leoflow_callbacks", schedule=None, catchup=False, tags=["leoflow"])
def leoflow_callbacks():
    """Three independent tasks: one succeeds, one retries then succeeds, one fails (run ends failed)."""

    @task(**CALLBACKS)
    def cb_succeeds() -> None:
        """Succeeds on try 1: traces ``1 success``."""

    @task(retries=1, retry_delay=timedelta(seconds=2), **CALLBACKS)
    def cb_retries(ti=None) -> None:
        """Fails try 1 (traces ``1 retry``), succeeds try 2 (traces ``2 success``)."""
        if ti.try_number == 1:
            raise RuntimeError("first try fails on purpose")

    @task(retries=0, **CALLBACKS)
    def cb_fails() -> None:
        """Always raises ``RuntimeError``: traces ``1 failure``."""
        raise RuntimeError("this task fails on purpose")

    cb_succeeds()
    cb_retries()
    cb_fails()


leoflow_callbacks()
