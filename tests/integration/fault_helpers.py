"""Helpers for the fault tests on a real Airflow: a stack with a fault plan and per-component control,
body-trace parsing (how often a body ran, whether two executions overlapped), DB queries, polling, a throwaway
PostgreSQL database, and the judgement of recorded Kubernetes task pods (``devtools.kube.KubeStack.pods``).

Body traces are written by ``tests/fault_dags/leoflow_more.py`` and ``leoflow_chaos.py``:
``<run_id> <try> <event> <unix time> <pid> [extra]`` per line in ``$AIRFLOW_HOME/traces/<dag>.<task>.body``.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import time
import uuid
from collections import Counter
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import psutil

from devtools import procs
from devtools.stack import AirflowStack, StackError
from leoflow_airflow.runtime.kubernetes.pod import LABEL_PREFIX

FAULT_DAGS = Path(__file__).resolve().parent.parent / "fault_dags"
EXECUTOR = "leoflow_airflow.executor.LeoflowExecutor"


class FaultStack(AirflowStack):
    """An :class:`AirflowStack` on ``tests/fault_dags`` with leoflow, fault injection and a fault plan, that
    can stop and start one component (api-server, scheduler) while the others keep running. Its metadata DB is
    SQLite unless ``sql_alchemy_conn`` names another (:func:`pg_database`); the ``db``/``ti_row``/``attempts``/
    ``log_events`` readers below read the SQLite file only. ``api_host``: where the api-server listens
    (:attr:`devtools.kube.KubeStack.api_host` for the real node's pods)."""

    def __init__(self, home: Path, *, extra_env: dict[str, str] | None = None, parallelism: int = 8,
                 public_api_apart: bool = False, sql_alchemy_conn: str | None = None,
                 dags_folder: Path = FAULT_DAGS, example_dags: tuple[str, ...] = (),
                 api_host: str = "127.0.0.1") -> None:
        self.fault_plan = Path(home).resolve() / "fault-plan.json"
        env = {
            "AIRFLOW__LEOFLOW__TEST_FAULT_INJECTION": "True",
            "AIRFLOW__LEOFLOW__TEST_FAULT_PLAN": str(self.fault_plan),
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
            **(extra_env or {}),
        }
        super().__init__(home, executor=EXECUTOR, parallelism=parallelism, dags_folder=dags_folder, extra_env=env,
                         public_api_apart=public_api_apart, sql_alchemy_conn=sql_alchemy_conn,
                         example_dags=example_dags, api_host=api_host)

    def up(self, dags: list[str]) -> FaultStack:
        """Migrate and start, waiting for ``dags``; returns self."""
        self.prepare_home()
        self.fault_plan.write_text("{}")
        self.migrate()
        self.start(wait_for_dags=dags)
        return self

    # --- fault plan and runs ---------------------------------------------------------------------------
    def add_faults(self, entries: dict[str, str]) -> None:
        """Merge ``{"dag/run/task/try/epoch": point}`` into the plan (written atomically)."""
        plan = json.loads(self.fault_plan.read_text() or "{}")
        plan.update(entries)
        tmp = self.fault_plan.with_suffix(".tmp")
        tmp.write_text(json.dumps(plan))
        os.replace(tmp, self.fault_plan)

    def trigger_with(self, dag_id: str, faults: dict[str, str] | None = None, *, prefix: str = "t",
                     attempts: int = 4, prepare: Callable[[str], None] | None = None) -> str:
        """Trigger ``dag_id`` with a fresh run_id after planning ``{"task/try/epoch": point}`` and calling
        ``prepare(run_id)`` (a test's per-run files, written before any task of the run can start); returns the id.

        The run id is chosen here, so a call answered with a 5xx (a busy SQLite) is retried with the same id;
        a 409 on a retry means the earlier call did create the run. ``StackError`` after ``attempts`` 5xx
        answers or on any 4xx of a first call."""
        run_id = f"{prefix}_{dag_id}_{time.monotonic_ns()}"
        if faults:
            self.add_faults({f"{dag_id}/{run_id}/{key}": point for key, point in faults.items()})
        if prepare is not None:
            prepare(run_id)
        body = {"dag_run_id": run_id, "logical_date": datetime.now(timezone.utc).isoformat(), "conf": {}}
        for attempt in range(1, attempts + 1):
            try:
                self._call("POST", f"/dags/{dag_id}/dagRuns", json=body)
                return run_id
            except StackError as exc:
                if attempt > 1 and " answered 409" in str(exc):
                    return run_id  # the earlier call created it
                if attempt == attempts or " answered 4" in str(exc):
                    raise
            time.sleep(2 * attempt)
        return run_id  # not reached: the last attempt returns or raises

    def release(self, run_id: str, kind: str = "release") -> None:
        """Write ``traces/<kind>.<run_id>`` (bodies waiting on it go on)."""
        (self.traces_dir / f"{kind}.{run_id}").write_text("go\n")

    # --- DB -----------------------------------------------------------------------------------------
    def db(self, query: str, *args: object) -> list[tuple]:
        """Run a read query on the stack's SQLite metadata DB."""
        with sqlite3.connect(self.home / "airflow.db", timeout=60) as conn:
            return conn.execute(query, args).fetchall()

    def ti_row(self, dag_id: str, run_id: str, task_id: str) -> dict[str, Any]:
        """The live TI row: id, state, try_number, max_tries, queued_by_job_id."""
        rows = self.db("select id, state, try_number, max_tries, queued_by_job_id from task_instance "
                       "where dag_id=? and run_id=? and task_id=? and map_index=-1", dag_id, run_id, task_id)
        if not rows:
            return {}
        keys = ("id", "state", "try_number", "max_tries", "queued_by_job_id")
        return dict(zip(keys, rows[0]))

    def attempts(self, dag_id: str, run_id: str, task_id: str) -> list[dict[str, Any]]:
        """The ledger rows of one logical TI, ordered by id (oldest first)."""
        cols = ("ti_id", "try_number", "attempt_epoch", "state", "resolution", "pid", "proc_start_time",
                "record_path", "dispatched_at", "exited_at", "closed_at", "detail")
        rows = self.db(f"select {', '.join(cols)} from leoflow_attempt where dag_id=? and run_id=? and task_id=? "
                       "order by id", dag_id, run_id, task_id)
        return [dict(zip(cols, row)) for row in rows]

    def log_events(self, dag_id: str, run_id: str, task_id: str) -> list[str]:
        """The TI's event-log ``event`` column values, oldest first."""
        return [e for (e,) in self.db("select event from log where dag_id=? and run_id=? and task_id=? order by id",
                                      dag_id, run_id, task_id)]

    # --- components -----------------------------------------------------------------------------------
    def _index(self, name: str) -> int:
        for i, (n, popen) in enumerate(zip(self._names, self._popens)):
            if n == name and popen.poll() is None:
                return i
        raise StackError(f"no running {name}")

    def pid_of(self, name: str) -> int:
        """The pid of the running component ``name`` (``api-server``, ``scheduler``, ``dag-processor``)."""
        return self._popens[self._index(name)].pid

    def kill_component(self, name: str, sig: int = signal.SIGKILL, *, group: bool = False,
                       timeout: float = 30.0, resume: bool = False) -> None:
        """Send ``sig`` to component ``name`` (its leader, or its whole process group) and wait for the
        leader to exit (SIGKILL to the group after ``timeout`` seconds); it is then forgotten
        (``start_component`` starts a new one). Its children in other sessions (the scheduler's agents) are
        left alone. ``resume``: send SIGCONT right after ``sig``, for a component stopped with
        :meth:`stop_component` (a stopped process acts on ``sig`` only once it runs again)."""
        i = self._index(name)
        popen = self._popens[i]
        members = procs.tree([psutil.Process(popen.pid)])
        send = os.killpg if group else os.kill
        send(popen.pid, sig)
        if resume:
            send(popen.pid, signal.SIGCONT)
        try:
            popen.wait(timeout=timeout)
        except Exception:  # noqa: BLE001 - escalate
            os.killpg(popen.pid, signal.SIGKILL)
            popen.wait(timeout=10)
        if group:  # nothing of that group may linger (a uvicorn worker holding the port)
            same_group = [p for p in members if _pgid(p) == popen.pid]
            for p in same_group:
                try:
                    p.kill()
                except psutil.Error:
                    pass
            psutil.wait_procs(same_group, timeout=10)
        del self._popens[i], self._names[i]  # stopped on purpose: not "a stack process exited"

    def stop_component(self, name: str) -> int:
        """SIGSTOP the leader of component ``name`` only (its zygote and agents run on); returns its pid.
        Undo with :meth:`continue_component`, or end it with ``kill_component(..., resume=True)``."""
        pid = self.pid_of(name)
        os.kill(pid, signal.SIGSTOP)
        return pid

    def continue_component(self, name: str) -> None:
        """SIGCONT the leader of component ``name`` (after :meth:`stop_component`)."""
        os.kill(self.pid_of(name), signal.SIGCONT)

    def start_component(self, name: str) -> None:
        """Start component ``name`` again (same arguments, log appended); returns at once."""
        popen = procs.spawn(self._airflow(name), env=self.env(), log_path=self.process_logs / f"{name}.log",
                            cwd=self.home)
        self._popens.append(popen)
        self._names.append(name)

    def wait_api(self, timeout: float = 180.0) -> None:
        """Wait until the api-server answers again."""
        wait_until(self._api_up, timeout, "the api-server to answer")


@contextmanager
def kube_fault_stack(work: Path, *, extra_env: dict[str, str], dags: list[str], parallelism: int = 8,
                     dags_folder: Path = FAULT_DAGS, example_dags: tuple[str, ...] = (), node: str = "harness",
                     memory_limit: str | None = None) -> Iterator[tuple[FaultStack, Any]]:
    """``(stack, kube)``: a :class:`FaultStack` under ``work/airflow`` (started, ``dags`` serialized) on a
    :class:`devtools.kube.KubeStack` under ``work/kube`` (``K8SENV_DIR`` reuses a running control plane), for a
    module's Kubernetes end-to-end tests; prints the pods when the body raises, stops both after it and fails
    when a stack process is left. Skips (or fails under ``K8SENV_REQUIRED``) without the Kubernetes binaries.
    ``dags_folder`` (default ``tests/fault_dags``) and ``example_dags`` (Airflow's bundled example files, a second
    bundle) are the :class:`~devtools.stack.AirflowStack`'s; ``node`` what runs the pods (``"harness"`` or
    ``"real"``, the ``kube_node`` fixture's); ``memory_limit`` (a quantity, e.g. ``"1Gi"``) goes into the pod
    template as the agent container's ``resources.limits.memory`` (warm pods included)."""
    from devtools.kube import KubeStack, require_binaries

    require_binaries()
    t0 = time.monotonic()
    reuse = os.environ.get("K8SENV_DIR")
    with KubeStack(work / "kube", reuse_dir=Path(reuse) if reuse else None, build=False, node=node) as kube:
        stack = FaultStack(work / "airflow", extra_env=extra_env, parallelism=parallelism, dags_folder=dags_folder,
                           example_dags=example_dags, api_host=kube.api_host)
        try:
            kube.configure(stack)
            if memory_limit is not None:
                template = json.loads(kube.pod_template_file.read_text())
                resources = template["spec"]["containers"][0].setdefault("resources", {})
                resources.setdefault("limits", {})["memory"] = memory_limit
                kube.pod_template_file.write_text(json.dumps(template, indent=2) + "\n")
            stack.up(dags)
            print(f"stack up in {time.monotonic() - t0:.0f}s")
            yield stack, kube
        except BaseException:
            print("task pods:\n  " + "\n  ".join(kube.describe_pods()))
            raise
        finally:
            left = stack.stop()
            print(f"module wall time {time.monotonic() - t0:.0f}s")
        assert not left, f"processes left after stopping the stack: {left}"


class _CgroupV1:
    """A throwaway cgroup (v1) of one controller that test processes are moved into and, at :meth:`close`, moved
    back out of. Subclasses name the controller (``CONTROLLER``) and what :meth:`release` undoes first."""

    CONTROLLER = ""

    def __init__(self, name: str) -> None:
        self.path = self.root() / name
        self.path.mkdir(exist_ok=True)
        self._origin: dict[int, Path] = {}

    @classmethod
    def root(cls) -> Path:
        """The controller's hierarchy, ``/sys/fs/cgroup/<controller>``."""
        return Path("/sys/fs/cgroup") / cls.CONTROLLER

    @classmethod
    def available(cls) -> bool:
        """True when the controller's cgroup v1 hierarchy is mounted and writable."""
        return os.access(cls.root() / "cgroup.procs", os.W_OK)

    def add(self, pid: int) -> None:
        """Move process ``pid`` (all its threads) into this cgroup; children it forks later stay in."""
        for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
            _, controllers, where = line.split(":", 2)
            if self.CONTROLLER in controllers.split(","):
                self._origin[pid] = self.root() / where.lstrip("/")
        (self.path / "cgroup.procs").write_text(str(pid))

    def release(self) -> None:
        """Undo the controller's effect before the processes are moved out (lift a limit, thaw)."""

    def close(self) -> None:
        """:meth:`release`, move every process left to where it came from (the first added one's cgroup for its
        children), wait up to 10 s for the cgroup to empty, remove it; errors are ignored (a process may exit
        meanwhile, as one with a pending SIGKILL does)."""
        fallback = next(iter(self._origin.values()), self.root())
        try:
            self.release()
            for pid in (self.path / "cgroup.procs").read_text().split():
                try:
                    (self._origin.get(int(pid), fallback) / "cgroup.procs").write_text(pid)
                except OSError:
                    pass  # exiting: it leaves the cgroup as it goes
            wait_until(lambda: not (self.path / "cgroup.procs").read_text().split(), 10, "the cgroup to empty",
                       poll=0.05)
            self.path.rmdir()
        except (OSError, TimeoutError):
            pass


class ForkLimit(_CgroupV1):
    """A pids cgroup (v1, under ``/sys/fs/cgroup/pids``) to make one process's forks fail with EAGAIN, as a
    host at its pids limit does (root ignores ``RLIMIT_NPROC``, so ``prlimit --nproc`` cannot do it here).

    ``add(pid)`` moves a process in (its children forked later stay in); ``block()`` sets ``pids.max`` to the
    tasks (threads) inside now, so the next fork in the cgroup fails; ``lift()`` sets it back to ``max``;
    ``close()`` lifts, moves what is left back to the cgroup each process came from, and removes the
    cgroup. Raises ``OSError`` when the hierarchy is missing or read-only (check :meth:`available` first).
    """

    CONTROLLER = "pids"

    def block(self) -> int:
        """Forbid any new task in the cgroup; returns the limit set (the tasks inside now, at least 1)."""
        limit = max(1, int((self.path / "pids.current").read_text()))
        (self.path / "pids.max").write_text(str(limit))
        return limit

    def lift(self) -> None:
        """No limit any more."""
        (self.path / "pids.max").write_text("max")

    release = lift


class Freezer(_CgroupV1):
    """A freezer cgroup (v1, under ``/sys/fs/cgroup/freezer``) that holds processes in uninterruptible sleep,
    as a hung NFS mount or a dying disk does: ``ps`` shows them in state ``D`` and a SIGKILL sent to them stays
    pending (they neither run nor die) until :meth:`thaw`, when it takes effect.

    ``add(pid)`` moves a process in (children it forks later stay in); ``freeze()`` freezes everything inside
    and waits until the kernel reports it FROZEN; ``thaw()`` lets it run (or die) again; ``close()`` thaws,
    moves what is left back to the freezer cgroup each process came from, and removes the cgroup. Raises
    ``OSError`` when the hierarchy is missing or read-only (check :meth:`available` first). Always ``close()``
    in a ``finally``: a frozen process cannot be killed, so a stack's cleanup would wait on it for ever.
    """

    CONTROLLER = "freezer"

    def freeze(self, timeout: float = 10.0) -> None:
        """Freeze every process inside; returns once the kernel says FROZEN (``TimeoutError`` after ``timeout``
        seconds: a freeze is asynchronous)."""
        (self.path / "freezer.state").write_text("FROZEN")
        wait_until(lambda: (self.path / "freezer.state").read_text().strip() == "FROZEN", timeout,
                   "the freezer cgroup to be FROZEN", poll=0.05)

    def thaw(self) -> None:
        """Let every process inside run again (a pending SIGKILL then takes effect)."""
        (self.path / "freezer.state").write_text("THAWED")

    release = thaw


def zygote_pid(stack: AirflowStack) -> int | None:
    """The pid of the stack's running Lite zygote (from the pidfiles of the per-scheduler zygote directories
    in the default ``runtime_dir``), or ``None`` when there is none."""
    for pidfile in sorted((stack.home / "leoflow" / "zygotes").glob("*/zygote.pid")):
        try:
            pid = int(json.loads(pidfile.read_text())["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if pid_alive(pid):
            return pid
    return None


def _pgid(p: psutil.Process) -> int | None:
    try:
        return os.getpgid(p.pid)
    except OSError:
        return None


def wait_until(predicate: Callable[[], Any], timeout: float, what: str, poll: float = 0.5) -> Any:
    """Poll ``predicate`` until it returns something truthy (returned); ``TimeoutError`` naming ``what``
    (:func:`lite_procs.wait_for`, with the exception these tests catch)."""
    from lite_procs import wait_for

    try:
        return wait_for(predicate, timeout, what, poll)
    except AssertionError as exc:
        raise TimeoutError(str(exc)) from None


# --- body traces ---------------------------------------------------------------------------------------
@dataclass
class Execution:
    """One execution of a body: its try, pid, first and last trace time, whether it ended, its host (a pod's name on
    the real node; "" from a writer that does not trace it) and the ``key=value`` extras of its start line."""

    try_number: int
    pid: int
    start: float
    last: float
    ended: bool = False
    host: str = ""
    extra: list[str] = field(default_factory=list)


def executions(stack: AirflowStack, dag_id: str, task_id: str, run_id: str) -> list[Execution]:
    """The body executions of one TI, in start order (one per host and pid: on the real node two pods' bodies can
    have the same PID, each in its container's PID namespace)."""
    path = stack.traces_dir / f"{dag_id}.{task_id}.body"
    if not path.exists():
        return []
    found: dict[tuple[str, int], Execution] = {}
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) < 5 or parts[0] != run_id:
            continue
        try_number, event, when, pid = int(parts[1]), parts[2], float(parts[3]), int(parts[4])
        rest = parts[5:]
        host = rest.pop(0) if rest and "=" not in rest[0] else ""  # a writer's own extras are key=value
        ex = found.get((host, pid))
        if ex is None:
            ex = found[host, pid] = Execution(try_number, pid, when, when, host=host)
        ex.start, ex.last = min(ex.start, when), max(ex.last, when)
        if event == "end":
            ex.ended = True
        if event == "start":
            ex.extra.extend(rest)
    return sorted(found.values(), key=lambda e: e.start)


def attempt_of(stack: "FaultStack", dag_id: str, run_id: str, task_id: str, execution: Execution,
               timeout: float = 60.0) -> dict[str, Any]:
    """The ledger row (:meth:`FaultStack.attempts`) of the agent that runs ``execution``'s body: the row whose
    ``pid`` is the body's parent (the agent's supervisor forks the task process). Waits up to ``timeout``
    seconds for the scheduler to record the pid; ``TimeoutError`` when it does not (or the body has exited
    and its parent cannot be read any more)."""
    try:
        agent = psutil.Process(execution.pid).ppid()
    except psutil.Error:
        raise TimeoutError(f"the body pid {execution.pid} is gone; its agent is unknown") from None

    def row() -> dict[str, Any] | None:
        return next((a for a in stack.attempts(dag_id, run_id, task_id) if a["pid"] == agent), None)

    return wait_until(row, timeout, f"the ledger row of agent pid {agent}")


def overlaps(execs: list[Execution]) -> list[tuple[Execution, Execution]]:
    """Pairs of executions whose [start, last] intervals overlap (two bodies running at once)."""
    pairs = []
    for i, first in enumerate(execs):
        for second in execs[i + 1:]:
            if second.start <= first.last and first.start <= second.last:
                pairs.append((first, second))
    return pairs


def callbacks(stack: AirflowStack, dag_id: str, run_id: str | None = None) -> Counter:
    """``Counter((task_id, try, kind))`` of the callbacks that ran for ``dag_id`` (only those of ``run_id``
    when given; lines are ``<dag> <task> <try> <kind> <run_id>``, see ``tests/fault_dags/fault_trace.py``)."""
    path = stack.traces_dir / "callbacks.log"
    lines = path.read_text().splitlines() if path.exists() else []
    fields = [line.split() for line in lines]
    return Counter(tuple(f[1:4]) for f in fields
                   if len(f) >= 4 and f[0] == dag_id and (run_id is None or f[4:5] == [run_id]))


SIGTERM_BIT = 1 << (signal.SIGTERM - 1)


def catches_sigterm(pid: int) -> bool:
    """True when ``pid`` has a SIGTERM handler installed (``SigCgt`` of ``/proc/<pid>/status``)."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) & SIGTERM_BIT)
    except OSError:
        return False
    return False


def pid_alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def chaos_table(rows: dict[str, Counter], columns: list[str], order: list[str], first: str) -> list[str]:
    """A chaos loop's result as Markdown table lines: one row per name of ``order`` (``first`` heads that column),
    the ``columns`` counts, then every ``ledger …`` count any row has, and an **all** row of the totals
    (``tests/integration/test_lite_chaos.py``, ``test_kube_chaos.py``; the README tables are these)."""
    ledger_cols = sorted({k for r in rows.values() for k in r if k.startswith("ledger ")})
    header = [first, *columns, *ledger_cols]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name in order:
        r = rows.get(name, Counter())
        lines.append("| " + " | ".join([name, *(str(r[c]) for c in columns + ledger_cols)]) + " |")
    total = sum(rows.values(), Counter())
    lines.append("| **all** | " + " | ".join(str(total[c]) for c in columns + ledger_cols) + " |")
    return lines


# --- a throwaway PostgreSQL database -------------------------------------------------------------------
@contextmanager
def pg_database(server_url: str, prefix: str, *, template: str | None = None) -> Iterator[str]:
    """A database of its own on the PostgreSQL server of ``server_url`` (``LEOFLOW_TEST_PG_URL``, a role that may
    create databases), named ``<prefix>_<10 hex digits>``: empty, or a copy of the database ``template``
    (``CREATE DATABASE ... TEMPLATE``, as ``bench/compare.py`` does; the template must have no session open).
    Yields its SQLAlchemy URL with the password; drops it on exit (``WITH (FORCE)``: sessions a killed process
    left are ended). Errors of the server are raised (``sqlalchemy.exc.DBAPIError``)."""
    import sqlalchemy as sa

    server = sa.make_url(server_url)
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(server.set(database="postgres"), isolation_level="AUTOCOMMIT", poolclass=sa.NullPool)
    try:
        with admin.connect() as conn:
            conn.execute(sa.text(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else "")))
        try:
            yield server.set(database=name).render_as_string(hide_password=False)
        finally:
            with admin.connect() as conn:
                conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        admin.dispose()


# --- recorded Kubernetes task pods ---------------------------------------------------------------------
POD_LABEL = LABEL_PREFIX
"""The prefix of leoflow's attempt labels on a task pod (``ti-id``, ``try-number``, ``attempt-epoch``, ...)."""


def pod_phase(pod: dict) -> str | None:
    """``status.phase`` of one recorded pod version (``None`` before the API server set one)."""
    return (pod.get("status") or {}).get("phase")


def pod_disrupted(versions: list[dict]) -> bool:
    """Whether a Kubernetes controller marked the pod (a ``DisruptionTarget`` condition in any version)."""
    return any(c.get("type") == "DisruptionTarget" for v in versions
               for c in (v.get("status") or {}).get("conditions") or [])


def deleted_while_active(versions: list[dict]) -> bool:
    """Whether any version carries a ``deletionTimestamp`` while the pod was neither Succeeded nor Failed."""
    return any(v["metadata"].get("deletionTimestamp") and pod_phase(v) not in ("Succeeded", "Failed")
               for v in versions)


def pod_order(versions: list[dict]) -> tuple[int, int]:
    """``(try_number, attempt_epoch)`` of a pod from its first version's labels (``(0, 0)`` when unlabelled)."""
    labels = versions[0]["metadata"].get("labels") or {}
    return int(labels.get(POD_LABEL + "try-number", 0)), int(labels.get(POD_LABEL + "attempt-epoch", 0))


def pods_by_ti(pods: dict[str, list[dict]]) -> dict[str, dict[str, list[dict]]]:
    """``{ti_id: {uid: versions}}`` of the pods of ``pods`` (:meth:`devtools.kube.KubeStack.pods`'s shape) that
    carry a ``ti-id`` label (the label of their last version)."""
    found: dict[str, dict[str, list[dict]]] = {}
    for uid, versions in pods.items():
        ti_id = (versions[-1]["metadata"].get("labels") or {}).get(POD_LABEL + "ti-id")
        if ti_id:
            found.setdefault(ti_id, {})[uid] = versions
    return found


def newer_pods_touched(ti_pods: dict[str, list[dict]], spared: Collection[str | None] = ()) -> list[str]:
    """The UIDs, among the pods of one ti_id (``{uid: versions}``), of those other than the oldest by
    :func:`pod_order` that were deleted while active (:func:`deleted_while_active`) by no Kubernetes controller
    (:func:`pod_disrupted`) and are not in ``spared`` (pods a test deleted itself): an older execution touching a
    newer one, which issue 10 says must never happen."""
    ordered = sorted(ti_pods.items(), key=lambda item: pod_order(item[1]))
    return [uid for uid, versions in ordered[1:]
            if uid not in spared and deleted_while_active(versions) and not pod_disrupted(versions)]
