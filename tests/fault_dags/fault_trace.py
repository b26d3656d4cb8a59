"""Trace writers shared by the fault-test DAG files (not a DAG file itself; DAG files import it from the
bundle folder, which Airflow puts on ``sys.path`` when it parses them, in the DAG processor and in a task).

Everything goes under ``$AIRFLOW_HOME/traces``: callbacks append ``<dag> <task> <try> <kind> <run_id>`` to
``callbacks.log``; :func:`body_line` appends ``<run_id> <try> <event> <unix time> <pid> <host>`` to
``<dag>.<task>.body`` (read by ``tests/integration/fault_helpers.py``). ``<host>`` is the host name: a pod's name on
the real node, where the PIDs of two containers' bodies can be the same number (each container has its own PID
namespace), so an execution is a (host, pid) pair.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path


def traces_dir() -> Path:
    """``$AIRFLOW_HOME/traces``, created if missing."""
    path = Path(os.environ["AIRFLOW_HOME"]) / "traces"
    path.mkdir(parents=True, exist_ok=True)
    return path


def callback(kind: str):
    """A task callback that appends ``<dag> <task> <try> <kind> <run_id>`` to ``traces/callbacks.log``."""

    def write(context):
        ti = context["ti"]
        with open(traces_dir() / "callbacks.log", "a") as fh:
            fh.write(f"{ti.dag_id} {ti.task_id} {ti.try_number} {kind} {ti.run_id}\n")

    return write


CALLBACKS = {
    "on_success_callback": callback("success"),
    "on_failure_callback": callback("failure"),
    "on_retry_callback": callback("retry"),
}


def body_line(ti, event: str) -> None:
    """Append one body trace line for ``ti`` (``event``: ``start``, ``tick`` or ``end``)."""
    with open(traces_dir() / f"{ti.dag_id}.{ti.task_id}.body", "a") as fh:
        fh.write(f"{ti.run_id} {ti.try_number} {event} {time.time():.6f} {os.getpid()} {socket.gethostname()}\n")


GROW_BYTES = 64 * 2**20
"""How much a body told to outgrow its memory limit adds at a time (written, so resident)."""


def hold(ti, seconds: float = 240.0) -> None:
    """A body the test decides the end of: ``start``, a ``tick`` every 0.2 s until ``traces/release.<run_id>.<try>``
    exists (at most ``seconds``), ``end`` (tests/integration/test_kube_faults_e2e.py, test_kube_warm_e2e.py). Once
    ``traces/oom.<run_id>.<try>`` exists it grows by :data:`GROW_BYTES` a tick instead of sleeping: on the real node
    the kernel's OOM killer ends it at its container's memory limit."""
    body_line(ti, "start")
    release = traces_dir() / f"release.{ti.run_id}.{ti.try_number}"
    oom = traces_dir() / f"oom.{ti.run_id}.{ti.try_number}"
    grown: list[bytes] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not release.exists():
        body_line(ti, "tick")
        if oom.exists():
            grown.append(b"\x01" * GROW_BYTES)
            continue
        time.sleep(0.2)
    body_line(ti, "end")
