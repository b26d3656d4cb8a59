"""The deadline callback of ``leoflow_deadline``: a top-level callable importable by the executor's agents."""

from __future__ import annotations

import os
from pathlib import Path


def record_missed(note: str = "", **context) -> None:
    """Append one line to ``$AIRFLOW_HOME/traces/deadline.log`` saying the deadline was missed."""
    traces = Path(os.environ["AIRFLOW_HOME"]) / "traces"
    traces.mkdir(parents=True, exist_ok=True)
    with open(traces / "deadline.log", "a") as fh:
        fh.write(f"missed {note} pid={os.getpid()}\n")
