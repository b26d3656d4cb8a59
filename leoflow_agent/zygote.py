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
import sys
import time
from typing import Any

from leoflow_agent import proc, protocol
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


class Zygote:
    """The zygote's state and event loop.

    :param socket_path: the Unix socket to listen on (created 0600; an existing file is replaced).
    :param preload: import the Task SDK, :data:`PRELOAD_MODULES` and ``extra_modules`` and build the
        workload decoder before serving (False only in narrow unit tests of the protocol).
    :param extra_modules: more module names to import before serving (``[leoflow] zygote_preload``); one
        that fails to import is logged and skipped.
    """

    def __init__(self, socket_path: str, *, preload: bool = True, extra_modules: tuple[str, ...] = ()) -> None:
        self.socket_path = socket_path
        self.extra_modules = tuple(extra_modules)
        self.sel = selectors.DefaultSelector()
        self.conn: socket.socket | None = None
        self.conn_buf = protocol.LineBuffer()
        self.agents: dict[int, dict[str, Any]] = {}  # pid -> {"launch_id", "report_fd", "buf"}
        self.report_fds: dict[int, int] = {}  # read fd -> pid
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
        try:
            from airflow.settings import dispose_orm

            dispose_orm(do_log=False)  # never carry a DB connection into a fork
        except Exception:  # noqa: BLE001 - nothing to dispose is fine
            pass
        # Freeze everything imported so far into the permanent generation: a forked agent's (and its task
        # child's) garbage collections then never walk, and so never copy, the zygote's heap page by page.
        # LocalExecutor does the same before forking its workers. Measured by bench/: ~0.15 s CPU per task.
        import gc

        gc.collect()
        gc.freeze()

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
        """Fork the agent of one (validated) launch; False (and ``launch_failed`` sent) when the fork failed."""
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
            code = 1
            try:
                os.close(rfd)
                self.handoff = Handoff()  # other launches' workloads (and tokens) are not this agent's
                self.conn_buf = protocol.LineBuffer()
                signal.set_wakeup_fd(-1)
                for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT):
                    signal.signal(sig, signal.SIG_DFL)
                self._join_cgroup(launch_id)  # first: before the agent forks its task
                self.sel.close()
                if self.conn is not None:
                    self.conn.close()
                for fd in list(self.report_fds):
                    os.close(fd)
                for inherited in getattr(self, "_agent_closes", ()):
                    try:
                        inherited.close() if isinstance(inherited, socket.socket) else os.close(inherited)
                    except OSError:
                        pass
                from leoflow_agent.runner import agent_main

                code = agent_main(msg, decode_workload=self.decode_workload, report_fd=wfd)
            finally:
                try:
                    sys.stdout.flush()
                    sys.stderr.flush()
                finally:
                    os._exit(code)
        os.close(wfd)
        os.set_blocking(rfd, False)
        self.agents[pid] = {"launch_id": launch_id, "report_fd": rfd, "buf": protocol.LineBuffer()}
        self.report_fds[rfd] = pid
        self.sel.register(rfd, selectors.EVENT_READ, "report")
        start = proc.start_time(pid)
        self._send(protocol.ev_message(protocol.Ev.LAUNCHED, launch_id=launch_id, pid=pid, start_time=start))
        return True

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
        pid = self.report_fds.get(fd)
        if agent is None:
            agent = self.agents.get(pid) if pid is not None else None
        if agent is None:
            return
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._close_report(fd)
            return
        for event in agent["buf"].feed(chunk):
            if protocol.ev_of(event) is protocol.Ev.REPORTED:
                self._send(protocol.ev_message(protocol.Ev.REPORTED, launch_id=agent["launch_id"],
                                               state=event.get("state"), recorded=event.get("recorded") is not False))
                self._freed(agent["launch_id"])  # the slot is freed at the terminal report: next held one

    def _close_report(self, fd: int) -> None:
        if self.report_fds.pop(fd, None) is None:
            return
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
            agent = self.agents.pop(pid, None)
            if agent is None:
                continue  # an orphan of a dead agent, reaped
            # drain what the agent said before it died, then kill what is left of its subtree: orphans
            # reparent to us, so every direct child that is not a live agent belongs to a dead attempt.
            self._read_report(agent["report_fd"], agent)
            self._close_report(agent["report_fd"])
            self._kill_orphans()
            for path in proc.attempt_cgroups(agent["launch_id"]):
                proc.kill_cgroup(path)  # what left the tree (reparented past us) is still in the cgroup
            self.kills.pop(pid, None)
            code = os.waitstatus_to_exitcode(status)
            self._send(protocol.ev_message(protocol.Ev.EXITED, launch_id=agent["launch_id"], pid=pid, exit_code=code))
            self._freed(agent["launch_id"])

    def _kill_orphans(self) -> None:
        for child in proc.children(os.getpid()):
            if child not in self.agents:
                proc.kill_tree(child)
        # reap them now so nothing of the attempt lingers as a zombie
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            orphans = [c for c in proc.children(os.getpid()) if c not in self.agents]
            if not orphans:
                return
            for c in orphans:
                try:
                    os.waitpid(c, os.WNOHANG)
                except ChildProcessError:
                    pass
            time.sleep(0.01)


def _killed_task_cleanup_time() -> float:
    """Airflow's ``[core] killed_task_cleanup_time`` (seconds a killed task gets between SIGTERM and SIGKILL,
    60 by default in Airflow 3.3.2's ``config.yml``); 60 when it cannot be read."""
    try:
        from airflow.configuration import conf

        return float(conf.getint("core", "killed_task_cleanup_time", fallback=60))
    except Exception:  # noqa: BLE001 - a missing or odd value: Airflow's default
        return 60.0


def serve_main(socket_path: str, extra_modules: tuple[str, ...] = ()) -> int:
    """Configure logging, build the zygote (importing ``extra_modules`` too) and serve; returns the
    process exit code."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    return Zygote(socket_path, extra_modules=extra_modules).serve()
