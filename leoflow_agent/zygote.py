"""The Lite zygote: a pre-imported, single-threaded process that forks one agent per attempt (DESIGN §3).

Started once by the executor (``python -m leoflow_agent serve``) with an allow-listed environment, it imports
the Task SDK up front so no attempt pays for ``import airflow.sdk``; it then serves one executor connection
on a 0600 Unix socket. Each ``launch`` forks an agent in its own session. The zygote and every agent are
child subreapers, so a task's subprocesses that start new sessions (BashOperator's ``bash``) stay in the
attempt's tree; when an agent dies, the zygote kills whatever of its subtree is left (orphans reparent to
the zygote) and only then reports ``exited``. The zygote dies with the scheduler (parent-death signal and
executor hang-up); agents do not, so a restarted scheduler can adopt them.

Issue 8: where the host allows it (probed at start: a cgroup2 subtree, else the v1 ``pids`` hierarchy), each
agent first moves into its own attempt cgroup (``<hierarchy>/<our cgroup>/leoflow/<launch id>``), so proof
of death sees every process of the attempt whatever it did with sessions and environments
(:func:`leoflow_agent.proc.attempt_leftovers`). A failed fork is infra: that launch goes back as a retryable
``launch_failed`` and the other held launches wait out a bounded back-off (:mod:`leoflow_agent.handoff`). A
``kill`` is graceful and never blocks the loop: SIGTERM and SIGCONT (the Task SDK supervisor forwards SIGTERM to
the task, so ``on_kill`` runs), SIGKILL of the subtree after ``[core] killed_task_cleanup_time``.

Messages beyond :mod:`leoflow_agent.protocol`'s list: ``kill`` takes an optional ``"grace"`` (seconds; 0:
SIGKILL at once), and every ``launch_failed`` carries ``"retryable"`` (true only for a fork or pipe failure:
the executor should re-offer the workload rather than fail the task).
"""

from __future__ import annotations

import errno
import logging
import os
import selectors
import signal
import socket
import time
from dataclasses import dataclass
from typing import Any

from leoflow_agent import proc, protocol, warm
from leoflow_agent.handoff import Handoff

log = logging.getLogger("leoflow.zygote")


PRELOAD_MODULES: tuple[str, ...] = (
    # what the supervisor imports lazily for every attempt
    "airflow.sdk._shared.logging.factory",
    "airflow.sdk._shared.logging.remote",
    "airflow.sdk.definitions.connection",
    "encodings.idna",
    "leoflow_agent.transport",
    "airflow.sdk.definitions.asset.metadata",
    # what the task process imports to parse its DAG file (task_runner.parse -> BundleDagBag: the ORM
    # models and the serializers, ~0.05 s of CPU per attempt on the bench machine when not preloaded)
    "airflow.dag_processing.dagbag",
    "airflow.sdk.definitions.decorators",
    "airflow.sdk.bases.decorator",
    # the standard provider's operators, sensors and decorators nearly every DAG file imports
    "airflow.providers.standard.operators.python",
    "airflow.providers.standard.operators.bash",
    "airflow.providers.standard.operators.empty",
    "airflow.providers.standard.decorators.python",
    "airflow.providers.standard.decorators.bash",
    "airflow.providers.standard.sensors.time_delta",
)
"""Modules the zygote imports before it forks any agent, so no attempt pays for them (DESIGN §3: "imports
the Task SDK up front"). Module code only, never a DAG file: those change between attempts and are parsed
by each task process. Measured with ``bench/probe.py`` and py-spy: before ``airflow.dag_processing.dagbag``
was here, importing it was ~40% of an agent's and its task process's CPU."""


PLUGIN_ENTRY_POINT_GROUP = "airflow.plugins"
"""The entry-point group Airflow loads plugins from (``AirflowPlugin`` subclasses; Airflow's plugin docs,
"Plugins as Python packages")."""


def preload_plugin_modules() -> list[str]:
    """Import, in this process, the module of every installed Airflow plugin entry point (group
    :data:`PLUGIN_ENTRY_POINT_GROUP`), so that the forks of the zygote find them in ``sys.modules``.

    Why: every task process loads the plugins (``task_runner.startup`` -> the Task SDK's
    ``get_listener_manager`` -> ``_get_plugins`` -> ``EntryPoint.load()``), and a plugin module that builds an
    app at import (leoflow's own builds its FastAPI app and imports Airflow's ``api_fastapi``) costs that
    import in every attempt: measured with py-spy on ``bench_chain``, 95% of a Lite task process's CPU (about
    0.8 s per attempt on the 2-core bench machine). LocalExecutor's workers are forks of the scheduler, which
    imported the plugins at its start, so its task processes pay only the registration; this gives Lite the
    same. Only the import is paid here: each task process still instantiates and registers its plugins itself
    (Airflow's per-process ``cache`` is left empty), so listeners and ``on_load`` run where Airflow runs them.
    A plugin changed on disk is picked up by a new zygote (a scheduler restart), as LocalExecutor's workers
    pick it up with a new scheduler.

    :returns: the entry points' names that imported; one that fails to import (anything it raises, even
        ``SystemExit``) is logged and skipped: its task processes import it themselves and report the error as
        Airflow does.
    """
    from importlib.metadata import entry_points

    loaded = []
    for entry_point in entry_points(group=PLUGIN_ENTRY_POINT_GROUP):
        try:
            entry_point.load()
        except BaseException as exc:  # noqa: BLE001 - a plugin module may raise anything at import
            log.warning("could not pre-import the Airflow plugin %s (%s: %s); task processes will import it "
                        "themselves", entry_point.name, type(exc).__name__, exc)
            continue
        loaded.append(entry_point.name)
    return loaded


class Zygote:
    """The zygote's state and event loop.

    :param socket_path: the Unix socket to listen on (created 0600; an existing file is replaced).
    :param preload: import the Task SDK, :data:`PRELOAD_MODULES` and ``extra_modules`` and build the
        workload decoder before serving (False only in narrow unit tests of the protocol).
    :param extra_modules: more module names to import before serving (``[leoflow] zygote_preload``); one
        that fails to import is logged and skipped.
    :param warm_files: file workers at most (:mod:`leoflow_agent.warm`, ``[leoflow] lite_warm_files``); 0 forks
        every agent from the zygote.
    :param warm_idle_ttl: seconds a file worker with nothing to do stays (``[leoflow] lite_warm_idle_ttl``).
    :param warm_max_age: seconds after which a file worker retires (``[leoflow] lite_warm_max_age``).
    """

    def __init__(self, socket_path: str, *, preload: bool = True, extra_modules: tuple[str, ...] = (),
                 warm_files: int = 0, warm_idle_ttl: float = 600.0, warm_max_age: float = 3600.0) -> None:
        self.socket_path = socket_path
        self.extra_modules = tuple(extra_modules)
        self.sel = selectors.DefaultSelector()
        self.conn: socket.socket | None = None
        self.conn_buf = protocol.LineBuffer()
        # an agent: {"launch_id", "report_fd", "buf", "pid" (None until a warm agent says ``started``), "msg"
        # (its launch), "worker" (the FileKey of the file worker that forked it, or None), "kill" (a grace
        # asked for before its pid was known)}
        self.agents: dict[int, dict[str, Any]] = {}  # pid -> agent
        self.report_fds: dict[int, dict[str, Any]] = {}  # read fd -> agent
        self.warm_files = max(0, int(warm_files))
        self.warm_idle_ttl = float(warm_idle_ttl)
        self.warm_max_age = float(warm_max_age)
        self.file_workers: dict[warm.FileKey, FileWorker] = {}
        self.worker_pids: dict[int, FileWorker] = {}  # every file worker not yet reaped
        self.worker_socks: dict[int, FileWorker] = {}  # socket fd -> file worker still connected
        self.warm_refused: dict[warm.FileKey, float] = {}  # key -> monotonic time before which none is started
        self.decode_workload = None
        self.handoff = Handoff()  # held launches and busy agents (``limit`` op from the executor)
        self.stopping = False
        self.had_conn = False
        self.cgroup: proc.CgroupHierarchy | None = None  # where agents put their attempt's cgroup (serve())
        self.kill_grace = 60.0  # [core] killed_task_cleanup_time, read in _preload
        self.kills: dict[int, tuple[proc.ProcessIdentity, float]] = {}  # agent pid -> (identity, SIGKILL at)
        if preload:
            self._preload()

    # --- start-up -------------------------------------------------------------------------------------
    def _preload(self) -> None:
        from leoflow_agent.runner import workload_decoder

        import airflow.sdk.execution_time.supervisor  # noqa: F401 - the point: pay the import once
        import airflow.sdk.execution_time.task_runner  # noqa: F401
        import airflow.executors.base_executor  # noqa: F401

        self.decode_workload = workload_decoder()
        self.kill_grace = _killed_task_cleanup_time()
        self._warm_per_process_caches()
        self._import_extra_modules()
        warm.ready_to_fork()

    @staticmethod
    def _warm_per_process_caches() -> None:
        """Pay once, in the zygote, for what every agent would otherwise build for itself: the Task SDK
        client's SSL context (an ``lru_cache`` per process, ~0.04 s CPU) and the modules the supervisor
        imports lazily. Failures only cost speed."""
        try:
            from leoflow_agent.runner import sdk_ssl_context

            sdk_ssl_context()
        except Exception:  # noqa: BLE001
            log.debug("could not pre-build the SDK client's SSL context", exc_info=True)
        for module in PRELOAD_MODULES:
            try:
                __import__(module)
            except Exception:  # noqa: BLE001
                log.debug("could not pre-import %s", module, exc_info=True)
        preload_plugin_modules()

    def _import_extra_modules(self) -> None:
        for module in self.extra_modules:
            try:
                __import__(module)
            except BaseException as exc:  # noqa: BLE001 - a user's module may even sys.exit()
                log.warning("[leoflow] zygote_preload: could not import %s (%s); agents will import it "
                            "themselves", module, exc)

    def _listen(self) -> socket.socket:
        try:
            os.unlink(self.socket_path)
        except FileNotFoundError:
            pass
        old_umask = os.umask(0o177)
        try:
            srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            srv.bind(self.socket_path)
        finally:
            os.umask(old_umask)
        os.chmod(self.socket_path, 0o600)
        srv.listen(4)
        srv.setblocking(False)
        return srv

    # --- main loop ------------------------------------------------------------------------------------
    def serve(self) -> int:
        """Serve until the executor hangs up or SIGTERM arrives; return the exit code (0)."""
        proc.become_subreaper()
        try:
            proc.die_with_parent(signal.SIGTERM)
        except OSError:
            log.warning("could not set the parent-death signal")
        rfd, wfd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wfd, warn_on_full_buffer=False)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.signal(signal.SIGTERM, self._on_term)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        self.cgroup = proc.probe_cgroup()
        if self.cgroup is None:
            log.info("no usable cgroup hierarchy (cgroup2 subtree or v1 pids): proof of death scans /proc for "
                     "each attempt's session and environment marker")
        else:
            log.info("attempt cgroups: cgroup v%d under %s (%d empty ones of dead attempts removed)",
                     self.cgroup.version, self.cgroup.root, proc.sweep_attempt_cgroups(self.cgroup))
        srv = self._listen()
        # closed in every forked agent: an agent that outlives us must not hold our listening socket (a
        # successor's executor would connect to it and wait for a hello that never comes) or our signal pipe
        self._agent_closes = (srv, rfd, wfd)
        self.sel.register(srv, selectors.EVENT_READ, "listen")
        self.sel.register(rfd, selectors.EVENT_READ, "signal")
        self.had_conn = False
        while not self.stopping:
            try:
                self._step(srv, rfd)
            except Exception:  # noqa: BLE001 - one bad event must never take the zygote down
                log.exception("zygote event loop error (continuing)")
            if self.had_conn and self.conn is None:
                log.info("executor hung up; zygote exits and leaves %d running agents", len(self.agents))
                break
        self.sel.close()
        srv.close()
        try:
            os.unlink(self.socket_path)
        except OSError:
            pass
        return 0

    def _step(self, srv: socket.socket, rfd: int) -> None:
        """One pass of the event loop: wait up to 1 s (less when a held launch's fork retry or a kill's grace
        ends sooner) for events, handle them, reap children, retry held launches after a failed fork, and
        escalate kills whose grace is over."""
        timeout = 1.0
        for wait in (self.handoff.wait_for(time.monotonic()), self._next_kill_due(time.monotonic())):
            if wait is not None:
                timeout = min(timeout, wait)
        for key, _ in self.sel.select(timeout=timeout):
            what = key.data
            if what == "listen":
                self._accept(srv)
                self.had_conn = True
            elif what == "signal":
                try:
                    os.read(rfd, 4096)
                except BlockingIOError:
                    pass
            elif what == "conn":
                self._read_conn()
            elif what == "report":
                self._read_report(key.fd)
            elif what == "warm":
                self._read_worker(key.fd)
        self._reap()
        self._escalate_kills(time.monotonic())
        if self.handoff.retry_at is not None:
            self._fork_all(self.handoff.due(time.monotonic()))

    def _on_term(self, *_: Any) -> None:
        self.stopping = True

    def _accept(self, srv: socket.socket) -> None:
        try:
            conn, _ = srv.accept()
        except BlockingIOError:
            return
        if self.conn is not None:  # one executor at a time: the newest wins
            self._drop_conn()
        conn.setblocking(True)
        self.conn = conn
        self.conn_buf = protocol.LineBuffer()
        self.sel.register(conn, selectors.EVENT_READ, "conn")
        me = proc.identity(os.getpid())
        self._send(protocol.ev_message(protocol.Ev.HELLO, pid=os.getpid(), start_time=me.start_time if me else None))

    def _drop_conn(self) -> None:
        if self.conn is not None:
            try:
                self.sel.unregister(self.conn)
            except (KeyError, ValueError):
                pass
            self.conn.close()
            self.conn = None

    def _send(self, event: dict[str, Any]) -> None:
        if self.conn is None:
            return
        try:
            protocol.send(self.conn, event)
        except OSError:
            self._drop_conn()

    def _read_conn(self) -> None:
        assert self.conn is not None
        try:
            chunk = self.conn.recv(1 << 20)
        except OSError:
            chunk = b""
        if not chunk:
            self._drop_conn()
            return
        for msg in self.conn_buf.feed(chunk):
            self._handle(msg)
        for err in self.conn_buf.errors:
            log.error("bad message from the executor: %s", err)
        self.conn_buf.errors.clear()

    def _handle(self, msg: dict[str, Any]) -> None:
        """Act on one executor message by its :class:`~leoflow_agent.protocol.Op`; an unknown op is logged."""
        op = protocol.op_of(msg)
        if op is protocol.Op.LAUNCH:
            if self._valid_launch(msg):
                self._fork_all(self.handoff.offer(msg))
        elif op is protocol.Op.KILL:
            self._kill(msg)
        elif op is protocol.Op.LIMIT:
            limit = msg.get("max_agents")
            if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool)):
                log.error("bad limit message: %r", msg)
                return
            self._fork_all(self.handoff.set_limit(limit))
        elif op is protocol.Op.RETOKEN:
            if isinstance(msg.get("launch_id"), str) and isinstance(msg.get("workload"), str):
                self.handoff.retoken(msg["launch_id"], msg["workload"])
        else:
            log.error("unknown op %r", msg.get("op"))

    # --- kills ----------------------------------------------------------------------------------------
    def _kill(self, msg: dict[str, Any]) -> None:
        """The ``kill`` op: ``{"op": "kill", "launch_id": str, "grace": seconds (optional)}``.

        A held launch is dropped (``launch_failed``, not retryable). A running agent gets SIGTERM (and SIGCONT,
        so a stopped one acts on it), which the Task SDK supervisor forwards to the task process so the operator's ``on_kill`` runs (Airflow's
        ``ActivitySubprocess.wait`` installs that forwarder); its whole subtree (and attempt cgroup) gets
        SIGKILL once ``grace`` seconds pass (default ``[core] killed_task_cleanup_time``, 60 s), from the
        event loop, which never blocks on it (:meth:`_escalate_kills`). ``grace`` 0 kills at once. A bad
        ``grace`` is logged and the default used: a kill is never dropped.
        """
        launch_id = msg.get("launch_id")
        grace = msg.get("grace", self.kill_grace)
        if isinstance(grace, bool) or not isinstance(grace, (int, float)) or not 0 <= grace < float("inf"):
            log.error("bad grace in kill message %r; using %.0f s", msg, self.kill_grace)
            grace = self.kill_grace
        if isinstance(launch_id, str) and self.handoff.drop(launch_id):
            self._send(protocol.ev_message(protocol.Ev.LAUNCH_FAILED, launch_id=launch_id,
                                           error="killed before it was forked", retryable=False))
        now = time.monotonic()
        for agent in self.report_fds.values():
            if agent["pid"] is None and agent["launch_id"] == launch_id:
                agent["kill"] = grace  # its file worker is forking it: killed once its pid is known
        for pid, agent in list(self.agents.items()):
            if agent["launch_id"] != launch_id:
                continue
            ident = proc.identity(pid)
            if ident is None:
                continue  # exited already; _reap kills what is left
            if grace == 0:
                self._kill_now(ident, launch_id)
                continue
            if pid not in self.kills:  # a repeated kill keeps the first deadline
                os.kill(pid, signal.SIGTERM)
                os.kill(pid, signal.SIGCONT)  # a stopped agent (a frozen, "lost" supervisor) acts on it too
                self.kills[pid] = (ident, now + float(grace))

    def _kill_now(self, ident: proc.ProcessIdentity, launch_id: str) -> None:
        """SIGKILL an agent's subtree and its attempt cgroup's members."""
        proc.kill_tree(ident)
        for path in proc.attempt_cgroups(launch_id):
            proc.kill_cgroup(path)

    def _next_kill_due(self, now: float) -> float | None:
        """Seconds until the earliest pending kill's grace ends (0 if it has), ``None`` when none is pending."""
        if not self.kills:
            return None
        return max(0.0, min(at for _, at in self.kills.values()) - now)

    def _escalate_kills(self, now: float) -> None:
        """SIGKILL the subtree of every agent whose grace is over; forget kills of agents that exited."""
        for pid, (ident, at) in list(self.kills.items()):
            if pid not in self.agents:
                del self.kills[pid]
            elif now >= at:
                del self.kills[pid]
                log.warning("agent %d of %s outlived its kill grace; SIGKILL", pid, self.agents[pid]["launch_id"])
                self._kill_now(ident, self.agents[pid]["launch_id"])

    # --- agents ---------------------------------------------------------------------------------------
    def _valid_launch(self, msg: dict[str, Any]) -> bool:
        launch_id = msg.get("launch_id")
        if not isinstance(launch_id, str) or not isinstance(msg.get("workload"), str) or not msg.get("server"):
            self._send(protocol.ev_message(protocol.Ev.LAUNCH_FAILED, launch_id=launch_id,
                                           error="malformed launch message", retryable=False))
            return False
        if msg.get("fault") is not None and msg["fault"] not in protocol.FAULT_POINTS:
            self._send(protocol.ev_message(protocol.Ev.LAUNCH_FAILED, launch_id=launch_id,
                                           error=f"unknown fault {msg['fault']!r}", retryable=False))
            return False
        return True

    def _fork_all(self, messages: list[dict[str, Any]]) -> None:
        """Fork each launch the hand-off released. A failed fork is infra (issue 8, hole 8): that launch goes
        back to the executor as a retryable ``launch_failed``, the rest are held again and the hand-off
        pauses for its back-off (:meth:`Handoff.fork_failed`); the loop retries them in :meth:`_step`."""
        if self.stopping:  # SIGTERM: nothing new starts; the executor re-offers what it never saw launched
            return
        work = list(messages)
        while work:
            msg = work.pop(0)
            if self._launch(msg):
                self.handoff.forked()
                continue
            delay = self.handoff.fork_failed(msg["launch_id"], time.monotonic(), not_tried=work)
            log.warning("could not fork the agent of %s; holding %d launches for %.1f s (failed forks in a "
                        "row: %d)", msg["launch_id"], len(self.handoff.held), delay, self.handoff.fork_failures)
            return

    def _freed(self, launch_id: str) -> None:
        self._fork_all(self.handoff.freed(launch_id))

    def _launch(self, msg: dict[str, Any]) -> bool:
        """Start the agent of one (validated) launch: through its DAG file's file worker when one is ready
        (:mod:`leoflow_agent.warm`), else forked here (and, with warm workers on, a file worker started for the
        next attempts of the file). False (and ``launch_failed`` sent) when a fork here failed."""
        key = warm.FileKey.from_launch(msg) if self.warm_files else None
        if key is not None:
            worker = self._file_worker(key)
            if worker is not None and self._warm_launch(worker, msg):
                return True
        return self._cold_launch(msg)

    def _cold_launch(self, msg: dict[str, Any]) -> bool:
        """Fork the agent of one launch from the zygote; False (and ``launch_failed`` sent) when it failed."""
        launch_id = msg["launch_id"]
        try:
            rfd, wfd = os.pipe2(os.O_CLOEXEC)
        except OSError as exc:  # EMFILE/ENFILE: the host's limit, not the task's
            self._send(protocol.ev_message(protocol.Ev.LAUNCH_FAILED, launch_id=launch_id,
                                           error=f"pipe failed: {exc.strerror}", retryable=True))
            return False
        try:
            pid = os.fork()
        except OSError as exc:  # EAGAIN (pids limit, TasksMax), ENOMEM: infra, re-offered by the executor
            os.close(rfd)
            os.close(wfd)
            self._send(protocol.ev_message(protocol.Ev.LAUNCH_FAILED, launch_id=launch_id,
                                           error=f"fork failed: {exc.strerror}", retryable=True))
            return False
        if pid == 0:  # the agent
            def agent() -> int:
                os.close(rfd)
                self._in_child()
                return self._run_agent(msg, wfd)

            proc.exit_child(agent, f"the agent of {launch_id}")
        os.close(wfd)
        agent = self._track(msg, rfd, worker=None)
        agent["pid"] = pid
        self.agents[pid] = agent
        start = proc.start_time(pid)
        self._send(protocol.ev_message(protocol.Ev.LAUNCHED, launch_id=launch_id, pid=pid, start_time=start,
                                       **self._warm_field(msg, False)))
        return True

    def _track(self, msg: dict[str, Any], rfd: int, worker: warm.FileKey | None) -> dict[str, Any]:
        """Start reading the report pipe ``rfd`` of ``msg``'s agent; return its agent record (pid unknown)."""
        os.set_blocking(rfd, False)
        agent = {"launch_id": msg["launch_id"], "report_fd": rfd, "buf": protocol.LineBuffer(), "pid": None,
                 "msg": msg, "worker": worker, "kill": None}
        self.report_fds[rfd] = agent
        self.sel.register(rfd, selectors.EVENT_READ, "report")
        return agent

    def _in_child(self) -> None:
        """In a freshly forked child (an agent or a file worker): drop what is the zygote's alone: other
        launches' workloads and tokens, the executor connection, the signal set-up, the report pipes, the
        listening socket and the file workers' sockets."""
        self.handoff = Handoff()  # other launches' workloads (and tokens) are not this child's
        self.conn_buf = protocol.LineBuffer()
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_DFL)
        self.sel.close()
        if self.conn is not None:
            self.conn.close()
            self.conn = None
        for fd in list(self.report_fds):
            os.close(fd)
        self.report_fds.clear()
        for worker in list(self.worker_socks.values()):
            worker.sock.close()
        self.worker_socks.clear()
        self.file_workers.clear()
        for inherited in getattr(self, "_agent_closes", ()):
            try:
                inherited.close() if isinstance(inherited, socket.socket) else os.close(inherited)
            except OSError:
                pass

    def _run_agent(self, msg: dict[str, Any], report_fd: int) -> int:
        """In the forked agent (of the zygote or of a file worker): join the attempt's cgroup, then run the
        launch (:func:`leoflow_agent.runner.agent_main`); returns the exit code."""
        self._join_cgroup(msg["launch_id"])  # first: before the agent forks its task
        from leoflow_agent.runner import agent_main

        return agent_main(msg, decode_workload=self.decode_workload, report_fd=report_fd)

    # --- warm agents (file workers, :mod:`leoflow_agent.warm`) ---------------------------------------------
    def _file_worker(self, key: warm.FileKey) -> FileWorker | None:
        """The ready file worker of ``key``, or None: then one is started (unless one is starting, or the last
        one for this file failed less than :data:`WARM_REFUSED_SECONDS` ago), least recently used one retired
        first when :attr:`warm_files` are up."""
        worker = self.file_workers.get(key)
        if worker is not None:
            worker.last_used = time.monotonic()
            return worker if worker.ready else None
        now = time.monotonic()
        if self.warm_refused.get(key, 0.0) > now:
            return None
        if len(self.file_workers) >= self.warm_files:
            oldest = min(self.file_workers.values(), key=lambda w: w.last_used)
            self._drop_worker(oldest, "retired for a newer DAG file (lite_warm_files reached)")
        self._start_file_worker(key)
        return None

    def _start_file_worker(self, key: warm.FileKey) -> None:
        """Fork a file worker for ``key``; it parses the file and says ``ready`` (or ``failed``) on its socket."""
        try:
            mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        except OSError as exc:
            log.warning("no file worker for %s: socketpair failed (%s)", key.title(), exc.strerror)
            return
        try:
            pid = os.fork()
        except OSError as exc:
            mine.close()
            theirs.close()
            self.warm_refused[key] = time.monotonic() + WARM_REFUSED_SECONDS
            log.warning("no file worker for %s: fork failed (%s)", key.title(), exc.strerror)
            return
        if pid == 0:  # the file worker
            def file_worker() -> int:
                mine.close()
                self._in_child()
                try:
                    proc.die_with_parent(signal.SIGTERM)
                except OSError:
                    pass
                return warm.file_worker_main(theirs, key, self._run_agent, idle_ttl=self.warm_idle_ttl,
                                             max_age=self.warm_max_age)

            proc.exit_child(file_worker, f"the file worker of {key.title()}")
        theirs.close()
        mine.setblocking(False)
        worker = FileWorker(key, pid, mine, last_used=time.monotonic())
        self.file_workers[key] = worker
        self.worker_pids[pid] = worker
        self.worker_socks[mine.fileno()] = worker
        self.sel.register(mine, selectors.EVENT_READ, "warm")
        log.info("file worker %d started for %s", pid, key.title())

    def _warm_launch(self, worker: FileWorker, msg: dict[str, Any]) -> bool:
        """Hand ``msg`` to ``worker`` with a fresh report pipe; False when it could not be handed (the caller
        forks it here instead; a worker whose socket broke is dropped)."""
        try:
            rfd, wfd = os.pipe2(os.O_CLOEXEC)
        except OSError:
            return False
        try:
            warm.send_packet(worker.sock, protocol.warm_message(protocol.WarmOp.FORK, launch=msg), (wfd,))
        except OSError as exc:
            os.close(rfd)
            if exc.errno != errno.EMSGSIZE:
                self._drop_worker(worker, f"its socket broke ({exc.strerror})")
            return False
        finally:
            os.close(wfd)
        self._track(msg, rfd, worker=worker.key)
        worker.launches += 1
        return True

    def _started(self, agent: dict[str, Any], event: dict[str, Any]) -> None:
        """A warm agent's ``started`` line: its pid is known; tell the executor it launched, and kill it now if
        the executor asked before."""
        pid, start = event.get("pid"), event.get("start_time")
        if agent["pid"] is not None or not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
            log.error("bad or repeated started line from the agent of %s: %r", agent["launch_id"], event)
            return
        agent["pid"] = pid
        self.agents[pid] = agent
        self.handoff.forked()
        self._send(protocol.ev_message(protocol.Ev.LAUNCHED, launch_id=agent["launch_id"], pid=pid,
                                       start_time=start if isinstance(start, int) else proc.start_time(pid),
                                       warm=True))
        if agent["kill"] is not None:
            self._kill({"launch_id": agent["launch_id"], "grace": agent["kill"]})

    def _never_started(self, agent: dict[str, Any]) -> None:
        """A warm launch's report pipe closed with no ``started`` line: no agent of it ever ran anything (the
        agent writes that line first), so it is forked here instead; or, if the executor killed it meanwhile,
        dropped as a launch killed before its fork."""
        launch_id = agent["launch_id"]
        if agent["kill"] is not None:
            self._send(protocol.ev_message(protocol.Ev.LAUNCH_FAILED, launch_id=launch_id,
                                           error="killed before it was forked", retryable=False))
            self._freed(launch_id)
            return
        log.info("the file worker did not start the agent of %s; forking it from the zygote", launch_id)
        if self._cold_launch(agent["msg"]):
            self.handoff.forked()
            return
        delay = self.handoff.fork_failed(launch_id, time.monotonic())
        log.warning("could not fork the agent of %s; holding %d launches for %.1f s", launch_id,
                    len(self.handoff.held), delay)

    def _read_worker(self, fd: int) -> None:
        """One packet from a file worker (:mod:`leoflow_agent.warm`'s wire)."""
        worker = self.worker_socks.get(fd)
        if worker is None:
            return
        try:
            message, fds = warm.recv_packet(worker.sock)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            message, fds = None, []
        for extra in fds:
            os.close(extra)
        if message is None:
            self._drop_worker(worker, "it hung up")
            return
        ev = protocol.warm_ev_of(message)
        if ev is protocol.WarmEv.READY:
            before = self._ready_workers()
            worker.ready = True
            self._pool_changed(before)
            log.info("file worker %d ready for %s: %s DAGs, parse %s in it (%.2f s)", worker.pid,
                     worker.key.title(), message.get("dags"), "cached" if message.get("cached") else "not cached",
                     float(message.get("seconds") or 0.0))
        elif ev is protocol.WarmEv.FAILED:
            self.warm_refused[worker.key] = time.monotonic() + WARM_REFUSED_SECONDS
            self._drop_worker(worker, f"it could not prepare: {message.get('error')}")
        elif ev is protocol.WarmEv.STALE:
            self._drop_worker(worker, f"{message.get('file')} changed")
        elif ev is protocol.WarmEv.FORK_FAILED:
            log.warning("file worker %d could not fork the agent of %s (%s)", worker.pid,
                        message.get("launch_id"), message.get("error"))
        elif ev is protocol.WarmEv.EXITED:
            pid, code = message.get("pid"), message.get("exit_code")
            agent = self._agent_of(pid) if isinstance(pid, int) else None
            if agent is not None:
                self._agent_ended(agent, code if isinstance(code, int) else None)
        else:
            log.error("bad packet from file worker %d: %r", worker.pid, message)

    def _drop_worker(self, worker: FileWorker, why: str) -> None:
        """Stop using ``worker``: close its socket (it exits; its agents run on and are reparented to us).
        Launches handed to it and not started yet come back through their report pipes' end of stream."""
        if self.file_workers.get(worker.key) is worker:
            before = self._ready_workers()
            del self.file_workers[worker.key]
            self._pool_changed(before)
        if self.worker_socks.pop(worker.sock.fileno(), None) is not None:
            try:
                self.sel.unregister(worker.sock)
            except (KeyError, ValueError):
                pass
            worker.sock.close()
            log.info("file worker %d of %s dropped: %s (%d launches handed to it)", worker.pid, worker.key.title(),
                     why, worker.launches)

    def _ready_workers(self) -> int:
        """How many file workers are ready (the Lite warm pool's size)."""
        return sum(1 for w in self.file_workers.values() if w.ready)

    def _pool_changed(self, before: int) -> None:
        """Tell the executor the warm pool's new size (``warm_pool``) when it differs from ``before``."""
        ready = self._ready_workers()
        if ready != before:
            self._send(protocol.ev_message(protocol.Ev.WARM_POOL, before=before, ready=ready))

    def _warm_field(self, msg: dict[str, Any], warm_fork: bool) -> dict[str, bool]:
        """``{"warm": warm_fork}`` for a ``launched`` of a DAG file's launch while file workers are on, else
        ``{}`` (a callback, or warm workers off: neither a hit nor a miss)."""
        if self.warm_files and warm.FileKey.from_launch(msg) is not None:
            return {"warm": warm_fork}
        return {}

    def _worker_gone(self, worker: FileWorker, why: str) -> None:
        """``worker``'s process was reaped. Its live agents are ours now (reparented); one that it reaped but
        never reported is ended here with an unknown exit code."""
        self._drop_worker(worker, why)
        for agent in list(self.agents.values()):
            if agent["worker"] == worker.key and proc.identity(agent["pid"]) is None:
                self._agent_ended(agent, None)

    def _join_cgroup(self, launch_id: str) -> None:
        """In a freshly forked agent: move into the attempt's cgroup (if the probe found a hierarchy), so proof
        of death finds every process of the attempt whatever it does with sessions and environments."""
        if self.cgroup is None:
            return
        try:
            joined = proc.join_attempt_cgroup(self.cgroup, launch_id)
        except ValueError as exc:
            joined = None
            log.warning("%s", exc)
        if joined is None:
            log.warning("the agent of %s could not join its attempt cgroup; proof of death will scan /proc",
                        launch_id)

    def _read_report(self, fd: int, agent: dict[str, Any] | None = None) -> None:
        """Read what the agent whose report pipe is ``fd`` wrote (``agent``: whose pipe it must be) and act on
        it. A pipe closed already is never read: its fd number may belong to another launch's pipe by now."""
        if agent is None:
            agent = self.report_fds.get(fd)
        elif self.report_fds.get(fd) is not agent:
            return
        if agent is None:
            return
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._close_report(agent)
            if agent["pid"] is None:
                self._never_started(agent)
            return
        for event in agent["buf"].feed(chunk):
            if protocol.ev_of(event) is protocol.Ev.STARTED:
                self._started(agent, event)
            elif protocol.ev_of(event) is protocol.Ev.REPORTED:
                self._send(protocol.ev_message(protocol.Ev.REPORTED, launch_id=agent["launch_id"],
                                               state=event.get("state"), recorded=event.get("recorded") is not False))
                self._freed(agent["launch_id"])  # the slot is freed at the terminal report: next held one

    def _close_report(self, agent: dict[str, Any]) -> None:
        """Close ``agent``'s report pipe, once: a pipe closed at its end of stream is not closed again when the
        agent's exit comes later (its fd number may be another launch's pipe by then; closing it would cut
        that agent's ``started`` line off)."""
        fd = agent["report_fd"]
        if self.report_fds.get(fd) is not agent:
            return
        del self.report_fds[fd]
        try:
            self.sel.unregister(fd)
        except (KeyError, ValueError):
            pass
        os.close(fd)

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            except OSError as exc:
                if exc.errno == errno.EINTR:
                    continue
                return
            if pid == 0:
                return
            worker = self.worker_pids.pop(pid, None)
            if worker is not None:
                self._worker_gone(worker, f"exited ({os.waitstatus_to_exitcode(status)})")
                continue
            agent = self._agent_of(pid)  # a warm agent reparented to us when its file worker went
            if agent is None:
                continue  # an orphan of a dead agent, reaped
            self._agent_ended(agent, os.waitstatus_to_exitcode(status))

    def _agent_of(self, pid: int) -> dict[str, Any] | None:
        """The agent record of ``pid``. A warm agent's pid is known once its ``started`` line is read; it writes
        that line before anything else, so the pipes of agents not started yet are read first."""
        if pid not in self.agents:
            for fd, agent in list(self.report_fds.items()):
                if agent["pid"] is None:
                    self._read_report(fd, agent)
        return self.agents.get(pid)

    def _agent_ended(self, agent: dict[str, Any], code: int | None) -> None:
        """``agent`` exited with ``code`` (None: unknown): drain what it said, kill what is left of its subtree
        (orphans reparent to us, so every direct child that is neither a live agent nor a file worker belongs
        to a dead attempt) and its cgroup, tell the executor, free its hand-off slot."""
        pid = agent["pid"]
        self.agents.pop(pid, None)
        self._read_report(agent["report_fd"], agent)
        self._close_report(agent)
        self._kill_orphans()
        for path in proc.attempt_cgroups(agent["launch_id"]):
            proc.kill_cgroup(path)  # what left the tree (reparented past us) is still in the cgroup
        self.kills.pop(pid, None)
        self._send(protocol.ev_message(protocol.Ev.EXITED, launch_id=agent["launch_id"], pid=pid, exit_code=code))
        self._freed(agent["launch_id"])

    def _kill_orphans(self) -> None:
        for fd, agent in list(self.report_fds.items()):
            if agent["pid"] is None:
                self._read_report(fd, agent)  # a warm agent not known yet is no orphan: learn its pid first
        keep = set(self.agents) | set(self.worker_pids)
        for child in proc.children(os.getpid()):
            if child not in keep:
                proc.kill_tree(child)
        # reap them now so nothing of the attempt lingers as a zombie
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            orphans = [c for c in proc.children(os.getpid()) if c not in keep]
            if not orphans:
                return
            for c in orphans:
                try:
                    os.waitpid(c, os.WNOHANG)
                except ChildProcessError:
                    pass
            time.sleep(0.01)


WARM_REFUSED_SECONDS = 300.0
"""Seconds after a file worker failed to prepare (or to fork) during which no other is started for that file:
its attempts are forked from the zygote meanwhile."""


@dataclass
class FileWorker:
    """The zygote's handle on one file worker: its DAG file ``key``, ``pid``, its end of the socket pair,
    whether it said ``ready``, when it was ``last_used`` (monotonic seconds) and how many ``launches`` it was
    handed."""

    key: warm.FileKey
    pid: int
    sock: socket.socket
    ready: bool = False
    last_used: float = 0.0
    launches: int = 0


def _killed_task_cleanup_time() -> float:
    """Airflow's ``[core] killed_task_cleanup_time`` (seconds a killed task gets between SIGTERM and SIGKILL,
    60 by default in Airflow 3.3.2's ``config.yml``); 60 when it cannot be read."""
    try:
        from airflow.configuration import conf

        return float(conf.getint("core", "killed_task_cleanup_time", fallback=60))
    except Exception:  # noqa: BLE001 - a missing or odd value: Airflow's default
        return 60.0


def serve_main(socket_path: str, extra_modules: tuple[str, ...] = (), *, warm_files: int = 0,
               warm_idle_ttl: float = 600.0, warm_max_age: float = 3600.0) -> int:
    """Configure logging, build the zygote (importing ``extra_modules`` too; ``warm_*``: :class:`Zygote`'s)
    and serve; returns the process exit code."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    return Zygote(socket_path, extra_modules=extra_modules, warm_files=warm_files, warm_idle_ttl=warm_idle_ttl,
                  warm_max_age=warm_max_age).serve()
