"""Test DAGs for Kubernetes warm pods through a real Airflow (``tests/integration/test_kube_warm_e2e.py``; issue 11).

None of them sets an ``executor_config``, so every attempt may land on a warm pod of its DAG version (the
placement rule sends an attempt that asks for more than the pool's template gives to a cold pod).

* ``lf_kwarm``: one task ``work`` whose body (:func:`_hold`) ticks into ``traces/lf_kwarm.work.body`` until the
  test writes ``traces/release.<run_id>.<try>``: the test kills or OOM-kills the warm worker while it runs.
* ``lf_kwarm_chain``: four short tasks in a chain, each adding one to its upstream's XCom (the last checks 4).
* ``lf_kwarm_iso``: ``write`` leaves a file in ``/tmp``, in ``$HOME``, in ``$TMPDIR`` and in ``/dev/shm`` (where
  writable) and says where; ``check``, on the same worker (the test's pool holds one), fails if any of them is
  still there.
"""

from __future__ import annotations

import os
from datetime import datetime
from pathlib import Path

from airflow.sdk import DAG, task
from fault_trace import CALLBACKS, hold

START = datetime(2026, 1, 1)
HOLD_SECONDS = 240
CHAIN = 4
ISO_NAME = "leoflow-warm-iso-probe"


def _hold(ti) -> None:
    """The body: :func:`fault_trace.hold` for :data:`HOLD_SECONDS` at most."""
    hold(ti, HOLD_SECONDS)


def _iso_paths() -> list[Path]:
    """Where ``write`` leaves its probe files: ``/tmp``, ``$HOME``, ``$TMPDIR``, ``/dev/shm``."""
    roots = ["/tmp", os.environ.get("HOME") or "", os.environ.get("TMPDIR") or "", "/dev/shm"]
    return [Path(r) / ISO_NAME for r in dict.fromkeys(roots) if r]


with DAG(dag_id="lf_kwarm", schedule=None, start_date=START, catchup=False, is_paused_upon_creation=False,
         max_active_runs=8, default_args={"retries": 0, **CALLBACKS}):

    @task
    def work(ti=None) -> None:
        _hold(ti)

    work()


with DAG(dag_id="lf_kwarm_chain", schedule=None, start_date=START, catchup=False, is_paused_upon_creation=False,
         default_args={"retries": 0, **CALLBACKS}):

    @task
    def link(previous: int, last: bool = False) -> int:
        value = previous + 1
        if last and value != CHAIN:
            raise ValueError(f"chain counted {value}, expected {CHAIN}")
        return value

    value = 0
    for i in range(CHAIN):
        value = link.override(task_id=f"link_{i}")(value, last=(i == CHAIN - 1))


with DAG(dag_id="lf_kwarm_iso", schedule=None, start_date=START, catchup=False, is_paused_upon_creation=False,
         default_args={"retries": 0, **CALLBACKS}):

    @task
    def write() -> list[str]:
        written = []
        for path in _iso_paths():
            try:
                path.write_text("left by the previous attempt\n")
            except OSError:
                continue  # a root this worker does not let an attempt write (read-only)
            written.append(str(path))
        if not written:
            raise RuntimeError("no probe file could be written")
        return written

    @task
    def check(written: list[str]) -> None:
        left = [p for p in written if Path(p).exists()]
        if left:
            raise RuntimeError(f"files of the previous attempt are still there: {left}")

    check(write())
