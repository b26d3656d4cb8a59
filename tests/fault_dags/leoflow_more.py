"""Test DAGs for the remaining issue-3 failure paths (fault budget, bash survivors, heartbeat loss, user
actions, fencing, adoption, chaos).

Every body appends timestamped lines to ``$AIRFLOW_HOME/traces/<dag>.<task>.body``::

    <run_id> <try_number> <event> <unix time> <pid>

with ``event`` one of ``start``, ``tick`` (every 0.2 s while it works) and ``end``. From those lines a test
can tell how often a body ran and whether two executions of one task ever overlapped. When the agent armed
the ``mid_task`` fault point (``LEOFLOW_FAULT_MARKER`` in the environment) a body touches the marker and keeps
ticking until it is killed. Callbacks append ``<dag> <task> <try> <kind> <run_id>`` to ``traces/callbacks.log``.
Files named ``traces/release.<run_id>`` / ``traces/go.<run_id>`` are written by tests to let a body go on.
"""

from __future__ import annotations

import os
import time
from datetime import datetime, timedelta
from pathlib import Path

from airflow.providers.standard.operators.bash import BashOperator
from airflow.sdk import DAG, task
from fault_trace import CALLBACKS, traces_dir

START = datetime(2026, 1, 1)


_traces = traces_dir


class _Body:
    """The trace writer of one body execution."""

    def __init__(self, ti) -> None:
        self.ti = ti
        self.path = _traces() / f"{ti.dag_id}.{ti.task_id}.body"

    def line(self, event: str) -> None:
        with open(self.path, "a") as fh:
            fh.write(f"{self.ti.run_id} {self.ti.try_number} {event} {time.time():.6f} {os.getpid()}\n")

    def work(self, seconds: float, *, until: Path | None = None) -> None:
        """Tick for ``seconds`` (or until ``until`` exists, when given, bounded by ``seconds``)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if until is not None and until.exists():
                return
            self.line("tick")
            time.sleep(0.2)

    def fault_point(self) -> None:
        """``mid_task``: touch the marker and keep ticking until the agent's death takes this body down."""
        marker = os.environ.get("LEOFLOW_FAULT_MARKER")
        if marker:
            Path(marker).touch()
            self.work(60)


def _wait_file(path: Path, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not path.exists():
        time.sleep(0.2)


# 1. infra budget: a retries=0 task killed mid-task on every try the plan names
with DAG(dag_id="lf_budget", schedule=None, start_date=START, catchup=False, is_paused_upon_creation=False,
         default_args={"retries": 0, **CALLBACKS}):

    @task
    def work(ti=None) -> None:
        body = _Body(ti)
        body.line("start")
        body.fault_point()
        body.work(1)
        body.line("end")

    work()


# 2. a bash that outlives its agent: it touches the mid_task marker itself, then ticks; pids of earlier
#    starts still alive when a new one starts are written on its start line (``alive=``)
BASH = r"""
f="$AIRFLOW_HOME/traces/lf_bash.sh.body"
now() { date +%s.%N; }
alive=""
for p in $(awk -v r="$RUN" '$1 == r && $3 == "start" {print $5}' "$f" 2>/dev/null); do
  if kill -0 "$p" 2>/dev/null; then alive="$alive,$p"; fi
done
echo "$RUN $TRY start $(now) $$ alive=$alive" >> "$f"
if [ -n "${LEOFLOW_FAULT_MARKER:-}" ]; then touch "$LEOFLOW_FAULT_MARKER"; n=200; else n=10; fi
for i in $(seq $n); do echo "$RUN $TRY tick $(now) $$" >> "$f"; sleep 0.2; done
echo "$RUN $TRY end $(now) $$" >> "$f"
"""

with DAG(dag_id="lf_bash", schedule=None, start_date=START, catchup=False, is_paused_upon_creation=False,
         default_args={"retries": 0}):
    BashOperator(task_id="sh", bash_command=BASH, append_env=True,
                 env={"RUN": "{{ run_id }}", "TRY": "{{ ti.try_number }}"})


# 3. heartbeat loss: try 1 works until the supervisor gives up on heartbeats; later tries finish at once
with DAG(dag_id="lf_hb", schedule=None, start_date=START, catchup=False, is_paused_upon_creation=False,
         default_args={"retries": 1, "retry_delay": timedelta(seconds=1), **CALLBACKS}):

    @task
    def slow(ti=None) -> None:
        body = _Body(ti)
        body.line("start")
        if ti.try_number == 1:
            body.work(150, until=_traces() / f"release.{ti.run_id}")
        body.line("end")

    slow()


# 4. user actions on a running task: try 1 works for up to 120 s, later tries end at once
with DAG(dag_id="lf_user", schedule=None, start_date=START, catchup=False, is_paused_upon_creation=False,
         default_args={"retries": 0, **CALLBACKS}):

    @task
    def long(ti=None) -> None:
        body = _Body(ti)
        body.line("start")
        if ti.try_number == 1:
            body.work(120, until=_traces() / f"release.{ti.run_id}")
        body.line("end")

    long()


def _held(ti=None) -> None:
    """A body that keeps its dag run running until the test touches ``traces/release.<run_id>`` (at most 150 s)."""
    body = _Body(ti)
    body.line("start")
    body.work(150, until=_traces() / f"release.{ti.run_id}")
    body.line("end")


# 4b. an overwritten success: ``short`` ends at once while ``hold`` keeps the dag run running until released
with DAG(dag_id="lf_overwrite", schedule=None, start_date=START, catchup=False, is_paused_upon_creation=False,
         default_args={"retries": 0, **CALLBACKS}):

    @task
    def short(ti=None) -> None:
        body = _Body(ti)
        body.line("start")
        body.line("end")

    short()
    task(task_id="hold")(_held)()


# 4d. an overwritten failure: ``fails`` fails at once (no retries) while ``hold`` keeps the dag run running
with DAG(dag_id="lf_overwrite_failed", schedule=None, start_date=START, catchup=False,
         is_paused_upon_creation=False, default_args={"retries": 0, **CALLBACKS}):

    @task
    def fails(ti=None) -> None:
        body = _Body(ti)
        body.line("start")
        body.line("end")
        raise RuntimeError("lf_overwrite_failed: this task fails on purpose")

    fails()
    task(task_id="hold")(_held)()


def _success_callback_held(context) -> None:
    """The traced success callback, then a wait (at most 90 s) for ``traces/release-cb.<run_id>``: the agent
    outlives its landed report until the test lets it go."""
    CALLBACKS["on_success_callback"](context)
    release = _traces() / f"release-cb.{context['ti'].run_id}"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and not release.exists():
        time.sleep(0.2)


# 4c. an overwritten success the settle sees: the agent lives on in the success callback until released
with DAG(dag_id="lf_overwrite_cb", schedule=None, start_date=START, catchup=False, is_paused_upon_creation=False,
         default_args={"retries": 0, **CALLBACKS, "on_success_callback": _success_callback_held}):

    @task
    def reported(ti=None) -> None:
        body = _Body(ti)
        body.line("start")
        body.line("end")

    reported()


# 5. fencing: the body waits for the test's go file, then meets its fault point (if any)
with DAG(dag_id="lf_fence", schedule=None, start_date=START, catchup=False, is_paused_upon_creation=False,
         default_args={"retries": 0, **CALLBACKS}):

    @task
    def work(ti=None) -> None:
        body = _Body(ti)
        body.line("start")
        _wait_file(_traces() / f"go.{ti.run_id}", 90)
        body.fault_point()
        body.work(1)
        body.line("end")

    work()


# 6. adoption: five parallel tasks that work until the test releases them
with DAG(dag_id="lf_adopt", schedule=None, start_date=START, catchup=False, is_paused_upon_creation=False,
         max_active_tasks=8, default_args={"retries": 0, **CALLBACKS}):

    for i in range(5):

        @task(task_id=f"t{i}")
        def adopt_body(ti=None) -> None:
            body = _Body(ti)
            body.line("start")
            body.work(240, until=_traces() / f"release.{ti.run_id}")
            body.line("end")

        adopt_body()



# 7. a call the task needs while the api-server is down: try 1 waits for the test's go file, then pushes an XCom
#    through the Execution API (an unanswered call raises in the task; a Variable read would fall back to "not
#    found" across the secrets backends instead)
with DAG(dag_id="lf_api", schedule=None, start_date=START, catchup=False, is_paused_upon_creation=False,
         default_args={"retries": 1, "retry_delay": timedelta(seconds=1), **CALLBACKS}):

    @task
    def needs_api(ti=None) -> None:
        body = _Body(ti)
        body.line("start")
        if ti.try_number == 1:
            _wait_file(_traces() / f"go.{ti.run_id}", 120)
            ti.xcom_push(key="leoflow_probe", value=1)
        body.line("end")

    needs_api()
