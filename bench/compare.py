"""LocalExecutor vs LeoflowExecutor (Lite) on PostgreSQL: throughput, queued-to-start latency, CPU per task.

Run from the repo root with the project venv::

    .venv/bin/python -m bench.compare                       # 1 round: both executors x parallelism 32, 4
    .venv/bin/python -m bench.compare --rounds 2             # repeat, print the median of the rounds too

What one round does. One throwaway PostgreSQL server (``scripts/pg``) serves every stack; ``airflow db
migrate`` runs once into a template database, and every stack gets a fresh ``CREATE DATABASE ... TEMPLATE``
copy. For each parallelism and each executor a fresh :class:`devtools.stack.AirflowStack` (scheduler,
dag-processor, api-server) is started with ``dags_folder = bench/dags`` and the same pinned settings
(:data:`PINNED`); its DAGs are run ONE AT A TIME so every run's CPU can be attributed to it:

- ``bench_fanout``: 50 independent trivial Python tasks;
- ``bench_chain``: 20 trivial Python tasks in a chain;
- ``bench_sleep``: 50 independent Python tasks that sleep 2 s.

Figures per (executor, DAG, parallelism):

- ``tasks/s`` = tasks / (last TI ``end_date`` - first TI ``start_date``); the DAG-run wall
  (run ``start_date`` -> ``end_date``) is kept in the JSON as ``run_wall_s``;
- as a user sees it (issue 11's bars): ``user tasks/s`` = tasks / (the run's ``end_date`` - the moment the
  trigger was sent), and for the chain the **per-hop** time, that wall divided by its 20 tasks;
- where that wall went (:func:`phases`): the trigger -> the run's start (Airflow's idle sleep, a draw in [0, 1] s
  for either executor), the run's two ends, the first task queued -> the last task's end, and for the chain its
  **link cycle** (one link queued -> the next queued, median), the per-hop time without the run's ends;
- ``machine CPU/task``: the scheduler's tree, the api-server, the dag-processor, orphans and PostgreSQL's
  server tree together, per task (every process the run made work);
- queued-to-start p50/p95 = TI ``queued_when`` -> ``start_date`` (REST API task-instance list), seconds;
- CPU/task = CPU seconds of the scheduler's whole process tree during the run (scheduler, executor
  workers or zygote, agents, task supervisors and task processes, including every one that exited), divided
  by the number of tasks; see :mod:`bench.cpu` for the method. ``stack CPU/task`` adds the api-server
  (which serves the tasks' Execution API calls) and the dag-processor; ``db CPU`` (JSON only) is the
  PostgreSQL server's tree.

Results are printed side by side with leoflow/local ratios and written to ``bench/results/<stamp>.json``
(git-ignored). The load average is printed with each run: the machine is shared.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from bench import cpu
from devtools.stack import AirflowStack, StackError

REPO_ROOT = Path(__file__).resolve().parent.parent
BENCH_DAGS = Path(__file__).resolve().parent / "dags"
RESULTS_DIR = Path(__file__).resolve().parent / "results"
PG_SCRIPT = REPO_ROOT / "scripts" / "pg"

EXECUTORS = {
    "local": "LocalExecutor",
    "leoflow": "leoflow_airflow.executor.LeoflowExecutor",
    "leoflow-cold": "leoflow_airflow.executor.LeoflowExecutor",
}
"""Name -> ``[core] executor``."""
VARIANT_ENV = {"leoflow-cold": {"AIRFLOW__LEOFLOW__LITE_WARM_FILES": "0"}}
"""Name -> environment on top of :data:`PINNED`: ``leoflow-cold`` is Lite with its file workers off (every agent
forked by the zygote, every task process parsing its DAG file), to see what the warm workers bring."""
DAGS = {"bench_fanout": 50, "bench_chain": 20, "bench_sleep": 50}
"""DAG id -> number of task instances it has."""

PHASES = ("to_start", "edges", "tasks", "link_cycle")
"""The parts of a run's user wall :func:`phases` returns, in order."""

PINNED = {
    # Same for both executors; parallelism itself is set per stack.
    "AIRFLOW__CORE__MAX_ACTIVE_TASKS_PER_DAG": "64",
    "AIRFLOW__CORE__MAX_ACTIVE_RUNS_PER_DAG": "1",
    "AIRFLOW__CORE__DEFAULT_POOL_TASK_SLOT_COUNT": "128",  # read when db migrate creates default_pool
    "AIRFLOW__SCHEDULER__MAX_TIS_PER_QUERY": "16",  # Airflow's default, pinned
    "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "5",  # Airflow's default, pinned
    "AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK": "False",
    "AIRFLOW__SCHEDULER__STANDALONE_DAG_PROCESSOR": "True",
    "AIRFLOW__CORE__MP_START_METHOD": "fork",  # LocalExecutor's default on Linux, pinned
    "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
    # The api-server serves every task's Execution API calls; with the default pool (5 + 10 overflow) 32
    # concurrent tasks on a loaded 2-core machine hit QueuePool timeouts (30 s), the SDK client retries and
    # tasks fail under BOTH executors. Same pool for every process; stays under PostgreSQL's 100 connections.
    "AIRFLOW__DATABASE__SQL_ALCHEMY_POOL_SIZE": "10",
    "AIRFLOW__DATABASE__SQL_ALCHEMY_MAX_OVERFLOW": "15",
}


# ---------------------------------------------------------------------------------------------- PostgreSQL


class Postgres:
    """The one throwaway PostgreSQL server of a benchmark run (``scripts/pg`` in ``directory``).

    ``url`` is the SQLAlchemy URL of its default database; :meth:`url_for` names another database.
    """

    def __init__(self, directory: Path | None, url: str = "") -> None:
        self.directory = directory
        self.url = url
        self._started = False

    @classmethod
    def existing(cls, url: str) -> "Postgres":
        """A server someone else runs (e.g. ``scripts/run-tests`` started it); never started or stopped here."""
        return cls(None, url)

    def start(self) -> None:
        """Start (or reuse) the server; sets :attr:`url`. Raises ``CalledProcessError`` on failure.

        A server that was already running in the directory is reused and left running by :meth:`stop`.
        """
        if self.directory is None:
            return
        status = subprocess.run(
            [str(PG_SCRIPT), "status", "--dir", str(self.directory)], capture_output=True, text=True
        )
        out = subprocess.run(
            [str(PG_SCRIPT), "start", "--dir", str(self.directory)],
            capture_output=True, text=True,
        )
        if out.returncode != 0:
            raise RuntimeError(f"scripts/pg start failed ({out.returncode}): {out.stderr.strip()[-2000:]}")
        self.url = out.stdout.strip().splitlines()[-1]
        self._started = status.returncode != 0

    def stop(self) -> None:
        """Stop the server if this object started it (fast shutdown)."""
        if self._started:
            subprocess.run([str(PG_SCRIPT), "stop", "--dir", str(self.directory)], check=False)
            self._started = False

    def url_for(self, database: str) -> str:
        """The SQLAlchemy URL of ``database`` on this server."""
        return self.url.rsplit("/", 1)[0] + "/" + database

    def execute(self, sql: str) -> None:
        """Run one statement in autocommit mode on the default database (for CREATE/DROP DATABASE)."""
        import sqlalchemy

        engine = sqlalchemy.create_engine(self.url, isolation_level="AUTOCOMMIT")
        try:
            with engine.connect() as conn:
                conn.execute(sqlalchemy.text(sql))
        finally:
            engine.dispose()

    def query(self, database: str, sql: str) -> list[tuple]:
        """The rows of one read-only statement on ``database`` of this server (a benchmark's progress check)."""
        import sqlalchemy

        engine = sqlalchemy.create_engine(self.url_for(database))
        try:
            with engine.connect() as conn:
                return [tuple(row) for row in conn.execute(sqlalchemy.text(sql))]
        finally:
            engine.dispose()

    def postmaster_pid(self) -> int | None:
        """Pid of the server's postmaster, or ``None`` when it cannot be found.

        From ``DIR/data/postmaster.pid`` for a server of ours; for an existing one, the local ``postgres``
        process whose command line has ``-p <port of the URL>`` (how ``scripts/pg`` starts it; its
        backends retitle themselves, so only the postmaster matches).
        """
        if self.directory is not None:
            try:
                return int((self.directory / "data" / "postmaster.pid").read_text().split()[0])
            except (OSError, ValueError, IndexError):
                return None
        import sqlalchemy

        port = sqlalchemy.make_url(self.url).port or 5432
        table = cpu.snapshot()
        for stat in table.values():
            try:
                argv = Path(f"/proc/{stat.pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
            except OSError:
                continue
            if argv[0].endswith("postgres") and ("-p", str(port)) in zip(argv, argv[1:]):
                return stat.pid
        return None


# ---------------------------------------------------------------------------------------------- measuring


@dataclass
class RunFigures:
    """What one DAG run measured. Times in seconds; CPU in CPU-seconds."""

    executor: str
    dag_id: str
    parallelism: int
    round: int
    state: str
    tasks: int
    tasks_ok: int
    span_s: float
    run_wall_s: float
    tasks_per_s: float
    q2s_p50_s: float
    q2s_p95_s: float
    q2s_max_s: float
    cpu_scheduler_tree_s: float
    cpu_api_server_s: float
    cpu_dag_processor_s: float
    cpu_orphans_s: float
    cpu_db_s: float
    cpu_per_task_s: float
    stack_cpu_per_task_s: float
    user_wall_s: float
    user_tasks_per_s: float
    machine_cpu_per_task_s: float
    load_before: tuple[float, float, float]
    load_after: tuple[float, float, float]
    settle_s: float
    extra: dict[str, Any] = field(default_factory=dict)


def _parse_ts(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value) if value else None


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile (0..100) of ``values`` with linear interpolation; NaN for an empty list."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def stack_roots() -> dict[str, int]:
    """``{"scheduler"|"api-server"|"dag-processor": pid}`` of this process's Airflow children."""
    roots: dict[str, int] = {}
    me = os.getpid()
    for stat in cpu.snapshot().values():
        if stat.ppid != me:
            continue
        try:
            argv = Path(f"/proc/{stat.pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        # setproctitle rewrites some titles into one string ("airflow api_server -- host:..."): match text.
        title = " ".join(a.decode(errors="replace") for a in argv if a)
        if "airflow" in title:
            for name, needles in (
                ("scheduler", ("airflow scheduler",)),
                ("api-server", ("airflow api-server", "airflow api_server")),
                ("dag-processor", ("airflow dag-processor", "airflow dag_processor")),
            ):
                if any(n in title for n in needles):
                    roots[name] = stat.pid
    return roots


class Meter:
    """CPU snapshots of one stack's trees (plus the database server and re-parented orphans)."""

    def __init__(self, roots: dict[str, int], pg_pid: int | None) -> None:
        self.roots = roots
        self.pg_pid = pg_pid
        self.known = set(roots.values())

    def sample(self) -> dict[str, float]:
        """CPU seconds so far per tree: ``scheduler``, ``api-server``, ``dag-processor``, ``orphans``, ``db``."""
        table = cpu.snapshot()
        out = {name: cpu.tree_cpu(table, pid) for name, pid in self.roots.items()}
        sched = table.get(self.roots.get("scheduler", -1))
        out["scheduler-self"] = sched.own if sched else 0.0  # the scheduler process alone, no children
        out["orphans"] = cpu.orphans_cpu(table, self.known)
        out["db"] = cpu.tree_cpu(table, self.pg_pid) if self.pg_pid else 0.0
        return out

    def attempt_processes(self) -> int:
        """Processes (zombies included) in the scheduler's tree now that are not an idle pool process.

        Idle pool processes live on between runs by design and cost no CPU while idle: LocalExecutor's workers
        (title ``airflow worker -- LocalExecutor: <idle>``), leoflow's zygote (``leoflow_agent serve``) and its
        Lite file workers (``leoflow warm ...``). Counting them would keep the window open after every run
        that started one (leoflow's file workers, LocalExecutor's spawned workers) and bill the stack's idle
        CPU of that wait to the run's tasks.
        """
        return sum(
            1 for p in cpu.subtree(cpu.snapshot(), self.roots["scheduler"])
            if p.pid != self.roots["scheduler"] and not _idle_pool_title(p.pid)
        )


IDLE_POOL_TITLE_PREFIXES = ("leoflow warm ",)
"""Title prefixes of idle pool processes (see :meth:`Meter.attempt_processes`): leoflow's Lite file workers."""


def is_idle_pool_title(title: str) -> bool:
    """Whether a process title (``/proc/<pid>/cmdline``, NULs as spaces) is an idle pool process's: a leoflow
    Lite file worker (``leoflow warm ...``), the zygote (``... leoflow_agent serve ...``) or an idle LocalExecutor
    worker (``airflow worker -- LocalExecutor: <idle>``, its title between workloads). A busy LocalExecutor
    worker (``... LocalExecutor: <dag_id> ...``), an agent (``leoflow agent ...``) and a task process are not."""
    title = title.strip()
    return (
        title.startswith(IDLE_POOL_TITLE_PREFIXES)
        or "leoflow_agent serve" in title
        or (title.startswith("airflow worker -- LocalExecutor") and title.endswith("<idle>"))
    )


def _idle_pool_title(pid: int) -> bool:
    """:func:`is_idle_pool_title` of ``pid``'s title; False when the process is gone."""
    try:
        title = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return False
    return is_idle_pool_title(title)


def task_instances(stack: AirflowStack, dag_id: str, run_id: str) -> list[dict[str, Any]]:
    """The run's task instances as the REST API v2 lists them (``queued_when``, ``start_date``, ...)."""
    body = stack._call(  # noqa: SLF001 - the stack has no public TI-list helper with timestamps
        "GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances", params={"limit": 1000}
    )
    return body["task_instances"]


def measure_run(
    stack: AirflowStack, meter: Meter, *, executor: str, dag_id: str, parallelism: int, rnd: int,
    baseline_size: int, timeout: float,
) -> RunFigures:
    """Trigger ``dag_id`` once, wait for it, and measure it (see the module docstring for the figures).

    After the run ends, waits (at most 20 s) until the scheduler's tree is back to ``baseline_size``
    attempt processes (:meth:`Meter.attempt_processes`: idle pool processes not counted), so lingering
    supervisors, agents and task processes are included in the CPU figure.
    """
    load_before = os.getloadavg()
    before = meter.sample()
    triggered = datetime.now(timezone.utc)
    run_id = stack.trigger(dag_id)
    try:
        state = stack.wait_for_run(dag_id, run_id, timeout=timeout, poll=0.5)
    except TimeoutError:
        state = "timeout"  # measured as far as it got; flagged in the table
    ended = time.monotonic()
    while meter.attempt_processes() > baseline_size and time.monotonic() - ended < 20:
        time.sleep(0.2)
    settle = time.monotonic() - ended
    after = meter.sample()
    cpu.reap_orphans(meter.known)
    load_after = os.getloadavg()
    run = stack.run(dag_id, run_id)
    tis = task_instances(stack, dag_id, run_id)
    starts = [_parse_ts(t["start_date"]) for t in tis if t.get("start_date")]
    ends = [_parse_ts(t["end_date"]) for t in tis if t.get("end_date")]
    q2s = [
        (_parse_ts(t["start_date"]) - _parse_ts(t["queued_when"])).total_seconds()
        for t in tis
        if t.get("start_date") and t.get("queued_when")
    ]
    span = (max(ends) - min(starts)).total_seconds() if starts and ends else float("nan")
    run_start, run_end = _parse_ts(run.get("start_date")), _parse_ts(run.get("end_date"))
    run_wall = (run_end - run_start).total_seconds() if run_start and run_end else float("nan")
    user_wall = (run_end - triggered).total_seconds() if run_end else float("nan")
    delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    n = len(tis)
    stack_cpu = sum(delta.get(k, 0.0) for k in ("scheduler", "api-server", "dag-processor", "orphans"))
    machine_cpu = stack_cpu + delta.get("db", 0.0)
    return RunFigures(
        executor=executor,
        dag_id=dag_id,
        parallelism=parallelism,
        round=rnd,
        state=state,
        tasks=n,
        tasks_ok=sum(1 for t in tis if t["state"] == "success"),
        span_s=span,
        run_wall_s=run_wall,
        tasks_per_s=n / span if span and span > 0 else float("nan"),
        q2s_p50_s=percentile(q2s, 50),
        q2s_p95_s=percentile(q2s, 95),
        q2s_max_s=max(q2s) if q2s else float("nan"),
        cpu_scheduler_tree_s=delta.get("scheduler", 0.0),
        cpu_api_server_s=delta.get("api-server", 0.0),
        cpu_dag_processor_s=delta.get("dag-processor", 0.0),
        cpu_orphans_s=delta.get("orphans", 0.0),
        cpu_db_s=delta.get("db", 0.0),
        cpu_per_task_s=delta.get("scheduler", 0.0) / n if n else float("nan"),
        stack_cpu_per_task_s=stack_cpu / n if n else float("nan"),
        user_wall_s=user_wall,
        user_tasks_per_s=n / user_wall if n and user_wall and user_wall > 0 else float("nan"),
        machine_cpu_per_task_s=machine_cpu / n if n else float("nan"),
        load_before=load_before,
        load_after=load_after,
        settle_s=settle,
        extra={
            "cpu_scheduler_process_only_s": delta.get("scheduler-self", 0.0),
            # TI start -> end (what Airflow shows as duration), and the slot time one task costs on average
            # (parallelism x span / tasks; meaningful when the run is slot-bound, i.e. tasks > parallelism).
            "mean_ti_duration_s": statistics.fmean(
                [(_parse_ts(t["end_date"]) - _parse_ts(t["start_date"])).total_seconds()
                 for t in tis if t.get("start_date") and t.get("end_date")] or [float("nan")]
            ),
            "slot_seconds_per_task": parallelism * span / n if n else float("nan"),
            "phases": phases(triggered, run_start, run_end, [
                (_parse_ts(t.get("queued_when")), _parse_ts(t.get("end_date")))
                for t in sorted(tis, key=lambda t: t["task_id"])
            ]),
            "tis": [
                [t["task_id"], t.get("queued_when"), t.get("start_date"), t.get("end_date"), t["state"]]
                for t in tis
            ],
        },
    )


def phases(triggered: datetime, run_start: datetime | None, run_end: datetime | None,
           tis: list[tuple[datetime | None, datetime | None]]) -> dict[str, float]:
    """Split one run's trigger -> dag run end (issue 11's "as a user sees it") into where it went, seconds.

    ``tis``: ``(queued_when, end_date)`` of each task instance, in the DAG's order (a chain: link order).
    Returns ``{"to_start", "edges", "tasks", "link_cycle"}`` (nan where a timestamp is missing):

    - ``to_start``: the trigger -> the run's ``start_date``. Airflow's scheduler starts a queued run on its next
      loop, and an idle loop sleeps ``[scheduler] scheduler_idle_sleep_time`` (1 s): a draw in [0, ~1] s for
      either executor, whatever it does.
    - ``edges``: the run's start -> its first task queued, plus its last task's end -> the run's end (the
      scheduler's loops around the tasks).
    - ``tasks``: the first task queued -> the last task's end: where an executor's work shows.
    - ``link_cycle``: the median of ``queued_when`` of one task -> of the next (a chain's per-link time
      without the run's two ends; nan with fewer than two tasks).

    ``to_start + edges + tasks`` is the user wall. Pure; raises nothing.
    """
    nan = float("nan")
    queued = [q for q, _ in tis if q is not None]
    ends = [e for _, e in tis if e is not None]
    first_q, last_end = (min(queued), max(ends)) if queued and ends else (None, None)
    to_start = (run_start - triggered).total_seconds() if run_start else nan
    tasks = (last_end - first_q).total_seconds() if first_q and last_end else nan
    edges = ((first_q - run_start).total_seconds() + (run_end - last_end).total_seconds()
             if run_start and run_end and first_q and last_end else nan)
    gaps = [(b - a).total_seconds() for (a, _), (b, _) in zip(tis, tis[1:]) if a is not None and b is not None]
    return {"to_start": to_start, "edges": edges, "tasks": tasks,
            "link_cycle": statistics.median(gaps) if gaps else nan}


# ---------------------------------------------------------------------------------------------- one stack


def run_stack(
    pg: Postgres, template_db: str, work: Path, *, executor: str, parallelism: int, rnd: int,
    dags: list[str], run_timeout: float, idle_seconds: float, log: Any,
) -> tuple[list[RunFigures], dict[str, Any]]:
    """Start a fresh stack for (``executor``, ``parallelism``) on a fresh database, run ``dags`` one by one.

    Returns the figures of each run and facts about the stack (its idle CPU rate in CPU-s per s, measured
    over ``idle_seconds`` before the first run; start-up seconds). The stack is always stopped.
    """
    database = f"bench_r{rnd}_{executor.replace('-', '_')}_p{parallelism}"
    pg.execute(f"DROP DATABASE IF EXISTS {database}")
    pg.execute(f"CREATE DATABASE {database} TEMPLATE {template_db}")
    home = work / database
    stack = AirflowStack(
        home,
        executor=EXECUTORS[executor],
        parallelism=parallelism,
        dags_folder=BENCH_DAGS,
        sql_alchemy_conn=pg.url_for(database),
        extra_env={**PINNED, **VARIANT_ENV.get(executor, {})},
    )
    figures: list[RunFigures] = []
    facts: dict[str, Any] = {"executor": executor, "parallelism": parallelism, "round": rnd, "home": str(home)}
    t0 = time.monotonic()
    try:
        stack.start(wait_for_dags=dags, timeout=240)
        for dag_id in dags:
            stack.unpause(dag_id)
        facts["startup_s"] = round(time.monotonic() - t0, 1)
        roots = stack_roots()
        if "scheduler" not in roots:
            raise StackError(f"no scheduler process found among {roots}")
        meter = Meter(roots, pg.postmaster_pid())
        time.sleep(3.0)  # let the executor finish starting (workers forked / zygote up)
        baseline = meter.attempt_processes()
        idle0, t_idle = meter.sample(), time.monotonic()
        time.sleep(idle_seconds)
        idle1 = meter.sample()
        facts["idle_scheduler_cpu_per_s"] = round(
            (idle1["scheduler"] - idle0["scheduler"]) / (time.monotonic() - t_idle), 4
        )
        facts["baseline_scheduler_tree_processes"] = baseline
        for dag_id in dags:
            fig = measure_run(
                stack, meter, executor=executor, dag_id=dag_id, parallelism=parallelism, rnd=rnd,
                baseline_size=baseline, timeout=run_timeout,
            )
            figures.append(fig)
            log(
                f"  {executor:8s} p={parallelism:<3d} {dag_id:13s} {fig.state:8s} "
                f"{fig.tasks_ok}/{fig.tasks} ok  {fig.tasks_per_s:6.2f} tasks/s  "
                f"q2s p50 {fig.q2s_p50_s:5.2f}s p95 {fig.q2s_p95_s:5.2f}s  "
                f"cpu/task {fig.cpu_per_task_s:5.3f}s (scheduler proc "
                f"{fig.extra['cpu_scheduler_process_only_s'] / max(fig.tasks, 1):5.3f}s, "
                f"stack {fig.stack_cpu_per_task_s:5.3f}s)  TI dur {fig.extra['mean_ti_duration_s']:4.2f}s  "
                f"load {fig.load_before[0]:.2f}->{fig.load_after[0]:.2f}"
            )
    finally:
        left = stack.stop()
        cpu.reap_orphans(set())
        if left:
            log(f"  WARNING: processes left after stop: {left}")
        facts["stopped_clean"] = not left
        facts["total_s"] = round(time.monotonic() - t0, 1)
        try:
            pg.execute(f"DROP DATABASE IF EXISTS {database}")  # the server may be shared (--pg-url)
        except Exception as exc:  # noqa: BLE001 - a database left behind is only disk space
            log(f"  could not drop database {database}: {exc}")
    return figures, facts


def migrate_template(pg: Postgres, template_db: str, work: Path, log: Any) -> None:
    """Create ``template_db`` and run ``airflow db migrate`` into it (Airflow's tables and leoflow's ledger)."""
    pg.execute(f"DROP DATABASE IF EXISTS {template_db}")
    pg.execute(f"CREATE DATABASE {template_db}")
    stack = AirflowStack(
        work / "template",
        executor=EXECUTORS["leoflow"],
        dags_folder=BENCH_DAGS,
        sql_alchemy_conn=pg.url_for(template_db),
        extra_env=PINNED,
    )
    t0 = time.monotonic()
    try:
        stack.migrate(timeout=300)
    finally:
        stack.stop()
    log(f"migrated template database {template_db} in {time.monotonic() - t0:.0f}s")


# ---------------------------------------------------------------------------------------------- report


def _median(values: list[float]) -> float:
    clean = [v for v in values if v == v]
    return statistics.median(clean) if clean else float("nan")


def _ratio(a: float, b: float) -> float:
    return a / b if b and b == b and a == a else float("nan")


def summarize(figures: list[RunFigures], variant: str = "leoflow") -> list[dict[str, Any]]:
    """One row per (DAG, parallelism): medians over rounds for ``local`` and ``variant``, and ratios.

    Each row holds ``local`` and ``leoflow`` (the variant's figures, whatever its name; ``variant`` names
    it), ``throughput_ratio``, ``cpu_ratio`` and ``stack_cpu_ratio`` (variant / local).
    """
    rows = []
    keys = sorted({(f.parallelism, f.dag_id) for f in figures}, key=lambda k: (-k[0], list(DAGS).index(k[1])))
    for parallelism, dag_id in keys:
        row: dict[str, Any] = {"dag_id": dag_id, "parallelism": parallelism, "variant": variant}
        for slot, ex in (("local", "local"), ("leoflow", variant)):
            sel = [f for f in figures if f.executor == ex and f.dag_id == dag_id and f.parallelism == parallelism]
            row[slot] = {
                "runs": len(sel),
                "all_ok": all(f.tasks_ok == f.tasks and f.state == "success" for f in sel) and bool(sel),
                "tasks_per_s": _median([f.tasks_per_s for f in sel]),
                "run_wall_s": _median([f.run_wall_s for f in sel]),
                "q2s_p50_s": _median([f.q2s_p50_s for f in sel]),
                "q2s_p95_s": _median([f.q2s_p95_s for f in sel]),
                "cpu_per_task_s": _median([f.cpu_per_task_s for f in sel]),
                "stack_cpu_per_task_s": _median([f.stack_cpu_per_task_s for f in sel]),
                "user_tasks_per_s": _median([f.user_tasks_per_s for f in sel]),
                "user_wall_s": _median([f.user_wall_s for f in sel]),
                "machine_cpu_per_task_s": _median([f.machine_cpu_per_task_s for f in sel]),
                **{f"{k}_s": _median([f.extra.get("phases", {}).get(k, float("nan")) for f in sel])
                   for k in PHASES},
            }
        row["throughput_ratio"] = _ratio(row["leoflow"]["tasks_per_s"], row["local"]["tasks_per_s"])
        row["cpu_ratio"] = _ratio(row["leoflow"]["cpu_per_task_s"], row["local"]["cpu_per_task_s"])
        row["stack_cpu_ratio"] = _ratio(
            row["leoflow"]["stack_cpu_per_task_s"], row["local"]["stack_cpu_per_task_s"]
        )
        row["user_throughput_ratio"] = _ratio(row["leoflow"]["user_tasks_per_s"], row["local"]["user_tasks_per_s"])
        row["machine_cpu_ratio"] = _ratio(
            row["leoflow"]["machine_cpu_per_task_s"], row["local"]["machine_cpu_per_task_s"]
        )
        tasks = DAGS.get(dag_id, 1)
        row["per_hop_delta_ms"] = 1000.0 * (row["leoflow"]["user_wall_s"] - row["local"]["user_wall_s"]) / tasks
        row["link_cycle_delta_ms"] = 1000.0 * (row["leoflow"]["link_cycle_s"] - row["local"]["link_cycle_s"])
        rows.append(row)
    return rows


def render(rows: list[dict[str, Any]]) -> str:
    """The side-by-side table (local | variant | ratio) and the verdict lines against the issue's bars."""
    variant = rows[0]["variant"] if rows else "leoflow"
    head = (
        f"{'dag':13s} {'par':>3s} | {'tasks/s':>15s} {'x':>5s} | {'q2s p50 (s)':>11s} | {'q2s p95 (s)':>11s} "
        f"| {'CPU/task (s)':>13s} {'x':>5s} | {'stack CPU/task':>14s} {'x':>5s}"
    )
    sub = (
        f"{'':13s} {'':>3s} | {'local':>7s} {'leoflow':>7s} {'':>5s} | {'local':>5s} {'leo':>5s} "
        f"| {'local':>5s} {'leo':>5s} | {'local':>6s} {'leo':>6s} {'':>5s} | {'local':>6s} {'leo':>7s} {'':>5s}"
    )
    lines = [f"local vs {variant} ('leo' columns), ratios x = {variant}/local", head, sub, "-" * len(head)]
    for r in rows:
        lo, le = r["local"], r["leoflow"]
        flag = "" if lo["all_ok"] and le["all_ok"] else "  (NOT ALL TASKS SUCCEEDED)"
        lines.append(
            f"{r['dag_id']:13s} {r['parallelism']:>3d} | {lo['tasks_per_s']:7.2f} {le['tasks_per_s']:7.2f} "
            f"{r['throughput_ratio']:5.2f} | {lo['q2s_p50_s']:5.2f} {le['q2s_p50_s']:5.2f} "
            f"| {lo['q2s_p95_s']:5.2f} {le['q2s_p95_s']:5.2f} "
            f"| {lo['cpu_per_task_s']:6.3f} {le['cpu_per_task_s']:6.3f} {r['cpu_ratio']:5.2f} "
            f"| {lo['stack_cpu_per_task_s']:6.3f} {le['stack_cpu_per_task_s']:7.3f} {r['stack_cpu_ratio']:5.2f}"
            f"{flag}"
        )
    lines.append("")
    lines.append(f"as a user sees it (trigger -> dag run end): user tasks/s local, {variant}, x; machine CPU/task "
                 "(scheduler tree + api-server + dag-processor + PostgreSQL) local, "
                 f"{variant}, x; chain per hop")
    for r in rows:
        lo, le = r["local"], r["leoflow"]
        hop = ""
        if r["dag_id"] == "bench_chain":
            n = DAGS["bench_chain"]
            hop = (f"; per hop {1000 * lo['user_wall_s'] / n:.0f} -> {1000 * le['user_wall_s'] / n:.0f} ms "
                   f"({r['per_hop_delta_ms']:+.0f} ms; bar <= +20 ms: "
                   f"{'PASS' if r['per_hop_delta_ms'] <= 20 else 'MISS'})")
        bar = 1.2 if r["parallelism"] >= 32 else 2.0
        lines.append(
            f"  {r['dag_id']:13s} p={r['parallelism']:<3d} user tasks/s {lo['user_tasks_per_s']:6.2f} "
            f"{le['user_tasks_per_s']:6.2f} {r['user_throughput_ratio']:5.2f}x (bar >= {bar}x: "
            f"{'PASS' if r['user_throughput_ratio'] >= bar else 'MISS'}); machine CPU/task "
            f"{lo['machine_cpu_per_task_s']:6.3f} {le['machine_cpu_per_task_s']:6.3f} "
            f"{r['machine_cpu_ratio']:5.2f}x (bar <= 0.9x: {'PASS' if r['machine_cpu_ratio'] <= 0.9 else 'MISS'})"
            f"{hop}"
        )
    lines.append("")
    lines.append("where the user wall went (medians, s, local / " + variant + "): trigger -> run start (the scheduler's "
                 "idle sleep, executor-independent) | run's two ends | first queued -> last end; chain link cycle")
    for r in rows:
        lo, le = r["local"], r["leoflow"]
        cycle = ""
        if r["dag_id"] == "bench_chain":
            cycle = (f"; link cycle {1000 * lo['link_cycle_s']:.0f} -> {1000 * le['link_cycle_s']:.0f} ms "
                     f"({r['link_cycle_delta_ms']:+.0f} ms)")
        lines.append(
            f"  {r['dag_id']:13s} p={r['parallelism']:<3d} {lo['to_start_s']:5.2f} / {le['to_start_s']:5.2f} | "
            f"{lo['edges_s']:5.2f} / {le['edges_s']:5.2f} | {lo['tasks_s']:6.2f} / {le['tasks_s']:6.2f}{cycle}"
        )
    lines.append("")
    for r in rows:
        if r["parallelism"] >= 32:
            ok_t = r["throughput_ratio"] >= 0.9
            ok_c = r["cpu_ratio"] <= 1.2
            lines.append(
                f"bar {variant} p={r['parallelism']} {r['dag_id']}: throughput {r['throughput_ratio']:.2f}x "
                f"(>= 0.9x: {'PASS' if ok_t else 'MISS'}), CPU/task {r['cpu_ratio']:.2f}x "
                f"(<= 1.2x: {'PASS' if ok_c else 'MISS'})"
            )
        else:
            ok = r["throughput_ratio"] >= 1.1
            lines.append(
                f"bar {variant} p={r['parallelism']} {r['dag_id']}: throughput {r['throughput_ratio']:.2f}x "
                f"(clearly faster, >= 1.1x: {'PASS' if ok else 'MISS'}), CPU/task {r['cpu_ratio']:.2f}x"
            )
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- main


def log(msg: str) -> None:
    """Print one progress line of a benchmark at once (stdout, flushed)."""
    print(msg, flush=True)


def _interrupted(signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def bench_session(prefix: str) -> tuple[str, Path]:
    """Start a benchmark run: SIGINT and SIGTERM raise ``KeyboardInterrupt`` (a background job starts with SIGINT
    ignored, and SIGTERM would skip the clean-up), and a fresh work directory ``/tmp/<prefix>XXXX`` mode 0755 (the
    postgres OS user must traverse it, scripts/pg). Returns ``(stamp, work)``, stamp a UTC ``%Y%m%dT%H%M%SZ``."""
    signal.signal(signal.SIGINT, _interrupted)
    signal.signal(signal.SIGTERM, _interrupted)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    work = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    work.chmod(0o755)
    return stamp, work


def main(argv: list[str] | None = None) -> int:
    """Run the comparison; returns 0 when every run ended with all tasks successful (bars do not gate)."""
    parser = argparse.ArgumentParser(prog="python -m bench.compare", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=1, help="repeat the whole comparison (default 1)")
    parser.add_argument("--parallelism", type=int, nargs="+", default=[32, 4])
    parser.add_argument("--executors", nargs="+", choices=list(EXECUTORS), default=["local", "leoflow"])
    parser.add_argument("--dags", nargs="+", choices=list(DAGS), default=list(DAGS))
    parser.add_argument("--run-timeout", type=float, default=300.0, help="seconds per DAG run (default 300)")
    parser.add_argument("--idle-seconds", type=float, default=5.0,
                        help="seconds of idle scheduler CPU measured per stack before the runs (default 5)")
    parser.add_argument("--pg-dir", type=Path, default=None,
                        help="scripts/pg directory to use (default: a fresh one under /tmp, removed after)")
    parser.add_argument("--pg-url", default=None,
                        help="use this running PostgreSQL server instead (SQLAlchemy URL; its user must be "
                             "allowed to CREATE DATABASE); overrides --pg-dir")
    parser.add_argument("--keep", action="store_true", help="keep the stacks' AIRFLOW_HOMEs (logs) afterwards")
    parser.add_argument("--out", type=Path, default=None, help="JSON output (default bench/results/<stamp>.json)")
    args = parser.parse_args(argv)

    stamp, work = bench_session("leoflow-bench-")
    pg_dir = args.pg_dir or work / "pg"
    pg = Postgres.existing(args.pg_url) if args.pg_url else Postgres(pg_dir)
    figures: list[RunFigures] = []
    stacks: list[dict[str, Any]] = []
    t_start = time.monotonic()
    log(f"leoflow bench {stamp}: work dir {work}; uptime: {_uptime()}")
    try:
        pg.start()
        # After PostgreSQL daemonized (so its server is not re-parented to us).
        subreaper = cpu.make_subreaper()
        template = "bench_template"
        migrate_template(pg, template, work, log)
        for rnd in range(1, args.rounds + 1):
            order = list(args.executors) if rnd % 2 else list(reversed(args.executors))
            for parallelism in args.parallelism:
                for executor in order:
                    log(f"round {rnd}: {executor} parallelism {parallelism} (load {_uptime()})")
                    figs, facts = run_stack(
                        pg, template, work, executor=executor, parallelism=parallelism, rnd=rnd,
                        dags=list(args.dags), run_timeout=args.run_timeout,
                        idle_seconds=args.idle_seconds, log=log,
                    )
                    figures.extend(figs)
                    stacks.append(facts)
                    log(f"  stack: start-up {facts.get('startup_s')}s, total {facts.get('total_s')}s, "
                        f"idle scheduler CPU {facts.get('idle_scheduler_cpu_per_s')} CPU-s/s")
    finally:
        try:
            if pg.url:
                pg.execute("DROP DATABASE IF EXISTS bench_template")
        except Exception:  # noqa: BLE001 - best effort on the way out
            pass
        pg.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    variants = [ex for ex in args.executors if ex != "local"]
    summaries = {v: summarize(figures, v) for v in variants}
    table = "\n\n".join(render(rows) for rows in summaries.values())
    elapsed = time.monotonic() - t_start
    log("")
    log(f"leoflow/local over {args.rounds} round(s) (medians), {elapsed / 60:.1f} min, uptime: {_uptime()}")
    log(table)
    out = args.out or RESULTS_DIR / f"{stamp}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "stamp": stamp,
        "command": " ".join([Path(sys.executable).name, "-m", "bench.compare", *(argv or sys.argv[1:])]),
        "host": {"cpus": os.cpu_count(), "python": platform.python_version(), "uname": platform.uname()._asdict()},
        "elapsed_s": round(elapsed, 1),
        "git": _git_state(),
        "pinned_env": PINNED,
        "subreaper": subreaper,
        "stacks": stacks,
        "runs": [asdict(f) for f in figures],
        "summary": summaries,
    }, indent=2, default=str))
    log(f"results: {out}")
    ok = all(f.tasks_ok == f.tasks and f.state == "success" for f in figures)
    return 0 if ok else 1


def _git_state() -> dict[str, Any]:
    """The repo's HEAD commit and the files that differ from it (the code measured may be uncommitted)."""
    def git(*a: str) -> str:
        r = subprocess.run(["git", "-C", str(REPO_ROOT), *a], capture_output=True, text=True)
        return r.stdout.strip()

    return {"head": git("rev-parse", "HEAD"), "dirty": git("status", "--short", "--untracked-files=no").splitlines()}


def _uptime() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f}, {five:.2f}, {fifteen:.2f} on {os.cpu_count()} CPUs"


if __name__ == "__main__":
    sys.exit(main())
