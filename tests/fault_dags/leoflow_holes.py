"""Test DAGs for issue 8's executor-level holes (1, 2, 3, 4, 6, 9, 10, 11, 14), one DAG per hole.

Bodies write the timestamped trace lines of ``leoflow_more.py`` (``<run_id> <try> <event> <unix time> <pid>``
in ``$AIRFLOW_HOME/traces/<dag>.<task>.body``; ``event`` is ``start``, ``tick`` every 0.2 s, ``end``), so a
test can tell how often a body ran and whether two executions of one task overlapped
(``tests/integration/fault_helpers.py``). Files ``traces/release.<run_id>`` / ``traces/go.<run_id>`` written
by a test let a waiting body go on. Callbacks append ``<dag> <task> <try> <kind> <run_id>`` to ``traces/callbacks.log``.
"""

from __future__ import annotations

import atexit
import os
import time
from datetime import datetime, timedelta
from pathlib import Path

from airflow.providers.standard.sensors.python import PythonSensor
from airflow.sdk import DAG, task
from fault_trace import CALLBACKS, body_line, traces_dir

START = datetime(2026, 1, 1)


_traces = traces_dir
_line = body_line


def _body(ti, seconds: float, *, until: Path | None = None, fault_point: bool = False) -> None:
    """``start``; when ``until`` is given, wait (at most 300 s) for that file; then, when ``fault_point`` and
    the agent armed ``mid_task``, touch its marker and tick until the agent's death takes this body down; then
    tick for ``seconds``; ``end``."""
    _line(ti, "start")
    if until is not None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not until.exists():
            _line(ti, "tick")
            time.sleep(0.2)
    marker = os.environ.get("LEOFLOW_FAULT_MARKER")
    if fault_point and marker:
        Path(marker).touch()
        seconds = 60
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        _line(ti, "tick")
        time.sleep(0.2)
    _line(ti, "end")


# hole 1: a1/a2 hold the two slots until released; b is then held by the zygote (queue-ahead), c waits in the
# executor's queued_tasks (``[leoflow] launch_queue_size`` 1). Priorities fix the dispatch order a1, a2, b, c.
# b and c work until ``go.<run_id>`` exists (at most 300 s), so they still run when a new scheduler adopts.
with DAG(dag_id="lf_h1", schedule=None, start_date=START, catchup=False, is_paused_upon_creation=False,
         max_active_tasks=8, default_args={"retries": 0, "weight_rule": "absolute"}):
    for name, weight in (("a1", 40), ("a2", 30)):

        @task(task_id=name, priority_weight=weight)
        def holder(ti=None) -> None:
            _body(ti, 0, until=_traces() / f"release.{ti.run_id}")

        holder()

    for name, weight in (("b", 20), ("c", 10)):

        @task(task_id=name, priority_weight=weight)
        def long_body(ti=None) -> None:
            _body(ti, 1, until=_traces() / f"go.{ti.run_id}")

        long_body()


def _fan_out(dag_id: str, count: int, seconds: float, width: int) -> DAG:
    """``count`` independent tasks ``t<i>`` (``i`` zero-padded to ``width``) whose bodies tick ``seconds``."""
    with DAG(dag_id=dag_id, schedule=None, start_date=START, catchup=False, is_paused_upon_creation=False,
             max_active_tasks=32, default_args={"retries": 0}) as dag:
        for i in range(count):

            @task(task_id=f"t{i:0{width}d}")
            def work(ti=None) -> None:
                _body(ti, seconds)

            work()
    return dag


# hole 2: nine 25 s tasks (six run at parallelism 6, three are held ahead)
lf_h2 = _fan_out("lf_h2", 9, 25, 1)
# hole 3: a burst of 24 short tasks with retries=0
lf_h3 = _fan_out("lf_h3", 24, 2, 2)
# hole 14: eight 15 s tasks shared by two schedulers
lf_h14 = _fan_out("lf_h14", 8, 15, 1)


# hole 4: one retry; the body waits for ``go.<run_id>`` before its fault point, so a test can stop the
# api-server first
with DAG(dag_id="lf_h4", schedule=None, start_date=START, catchup=False, is_paused_upon_creation=False,
         default_args={"retries": 1, "retry_delay": timedelta(seconds=1), **CALLBACKS}):

    @task
    def work(ti=None) -> None:
        _body(ti, 1, until=_traces() / f"go.{ti.run_id}", fault_point=True)

    work()


# hole 9: a reschedule-mode sensor whose first poke says "not yet" and whose task process then lingers 20 s
# after that report (an atexit sleep; the SDK runs atexit handlers registered in the task process), so the
# re-queued TI waits in QUEUED while its previous epoch's agent is still alive; the second poke succeeds.
def _poke(ti=None) -> bool:
    path = _traces() / f"{ti.dag_id}.{ti.task_id}.body"
    pokes = sum(1 for line in path.read_text().splitlines() if line.split()[:1] == [ti.run_id]) if path.exists() else 0
    _line(ti, "start")
    if pokes == 0:
        atexit.register(time.sleep, 20)
        return False
    _line(ti, "end")
    return True


with DAG(dag_id="lf_h9", schedule=None, start_date=START, catchup=False, is_paused_upon_creation=False,
         default_args={"retries": 0}):
    PythonSensor(task_id="sense", python_callable=_poke, mode="reschedule", poke_interval=1, timeout=600)


# hole 6: a reschedule-mode sensor whose first poke waits for ``go.<run_id>`` (so a test can freeze the
# api-server first) and says "not yet"; the second poke (the same ti_id and try, the next attempt epoch) says
# done at once. Each poke writes ``start``; a poke that says done writes ``end`` too.
def _poke_after_go(ti=None) -> bool:
    path = _traces() / f"{ti.dag_id}.{ti.task_id}.body"
    lines = path.read_text().splitlines() if path.exists() else []
    pokes = sum(1 for line in lines if line.split()[:1] == [ti.run_id] and line.split()[2:3] == ["start"])
    _line(ti, "start")
    if pokes == 0:
        go = _traces() / f"go.{ti.run_id}"
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not go.exists():
            time.sleep(0.2)
        return False
    _line(ti, "end")
    return True


with DAG(dag_id="lf_h6", schedule=None, start_date=START, catchup=False, is_paused_upon_creation=False,
         default_args={"retries": 0}):
    PythonSensor(task_id="sense", python_callable=_poke_after_go, mode="reschedule", poke_interval=1, timeout=600)


# hole 10: one short task; its first epoch is made to hang before /run (fault plan), so Airflow's stuck-in-queued
# handling revokes it and queues the same ti_id again
with DAG(dag_id="lf_h10", schedule=None, start_date=START, catchup=False, is_paused_upon_creation=False,
         default_args={"retries": 0}):

    @task
    def work(ti=None) -> None:
        _body(ti, 1)

    work()


# hole 11: eight tasks that wait for ``go.<run_id>`` and end at once (no XCom: the api-server may be stopped)
with DAG(dag_id="lf_h11", schedule=None, start_date=START, catchup=False, is_paused_upon_creation=False,
         max_active_tasks=16, default_args={"retries": 0}):
    for i in range(8):

        @task(task_id=f"t{i}")
        def waiter(ti=None) -> None:
            _body(ti, 0, until=_traces() / f"go.{ti.run_id}")

        waiter()
