"""Lite warm workers (issue 11 item 3; DESIGN §3 "Warm pools"): one pre-parsed parent per DAG file.

The zygote imports the Task SDK once; a **file worker** goes one step further for one DAG file. It is a child of
the zygote that resolves the file's bundle, parses the file once with the same ``BundleDagBag`` call the Task
SDK's ``task_runner.parse`` makes (so everything the file and its operators import is imported), and then forks
the agent of every attempt of that file the zygote hands it. In those agents' task processes the parse is
answered from the bag parsed in the file worker: no attempt re-parses its DAG file or re-imports what the file
imports.

Freshness. At parse time the file worker records the signature (``st_mtime_ns``, ``st_size``) of the DAG file and
of every module of the bundle that parsing imported (a helper module beside the DAG counts). Before each fork, and
again in the task process before the cached bag is used, the signature is checked; a changed file makes the
file worker refuse the fork (``stale``) and exit, the zygote forks that attempt cold and starts a new file
worker. A file whose parse left import errors or no DAG is not cached: its task processes parse it themselves
(with the Task SDK's comms in place, as a DAG whose top-level code reads a Variable needs), and the file worker
only saves them the imports. What a DAG file computes at its top level (a ``datetime.now()``, an environment
variable) is computed once per file worker, as in a DAG processor, not once per attempt; ``[leoflow]
lite_warm_max_age`` bounds how long that value lives.

The wire between the zygote and a file worker is a ``SOCK_SEQPACKET`` socket pair, one JSON object per packet;
its kinds (:class:`~leoflow_agent.protocol.WarmOp`, :class:`~leoflow_agent.protocol.WarmEv`) are documented in
:mod:`leoflow_agent.protocol` with the others. The zygote hands a launch with ``fork``, the agent's report pipe
attached (``SCM_RIGHTS``); the file worker answers ``ready`` once prepared (or ``failed``), ``stale`` or
``fork_failed`` for a launch it did not fork, and ``exited`` for each agent it reaps.

The agent itself tells the zygote its pid: the first line it writes on its report pipe is ``started``
(:class:`~leoflow_agent.protocol.Ev`), so the zygote never depends on the file worker to know what runs. A file
worker is not a subreaper: when it exits (idle, too old, stale, or killed), its agents are reparented to the
zygote, which reaps them as its own.

Standard library only at import time; Airflow is imported in the file worker's process.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from leoflow_agent import protocol

log = logging.getLogger("leoflow.warm")

MAX_PACKET_BYTES = 4 * 1024 * 1024
"""Largest packet either side reads; a ``fork`` whose launch message does not fit is forked cold instead."""


@dataclass(frozen=True)
class FileKey:
    """Which DAG file a file worker serves: the bundle's ``bundle`` name and ``version`` (None: unversioned) and
    the file's ``path`` relative to the bundle (a workload's ``bundle_info`` and ``dag_rel_path``)."""

    bundle: str
    version: str | None
    path: str

    @classmethod
    def from_launch(cls, message: dict[str, Any]) -> FileKey | None:
        """The key of a ``launch`` message's ``dag_file`` (``{"bundle", "version", "path"}``), or None when it
        has none or a malformed one (that launch is forked cold)."""
        raw = message.get("dag_file")
        if not isinstance(raw, dict):
            return None
        bundle, version, path = raw.get("bundle"), raw.get("version"), raw.get("path")
        if not isinstance(bundle, str) or not bundle or not isinstance(path, str) or not path:
            return None
        if version is not None and not isinstance(version, str):
            return None
        return cls(bundle, version, path)

    def title(self) -> str:
        """The file worker's process title: ``leoflow warm <bundle>[@<version>]:<path>``."""
        at = f"@{self.version}" if self.version else ""
        return f"leoflow warm {self.bundle}{at}:{self.path}"


def send_packet(sock: socket.socket, message: dict[str, Any], fds: tuple[int, ...] = ()) -> None:
    """Send one packet (``message`` as JSON, ``fds`` attached). Raises ``OSError`` (``EMSGSIZE`` for one too
    large, ``EPIPE``/``ECONNRESET`` when the peer is gone)."""
    data = json.dumps(message, separators=(",", ":")).encode()
    if len(data) > MAX_PACKET_BYTES:
        raise OSError(90, "message too long")  # EMSGSIZE
    if fds:
        socket.send_fds(sock, [data], list(fds))
    else:
        sock.send(data)


def recv_packet(sock: socket.socket) -> tuple[dict[str, Any] | None, list[int]]:
    """Receive one packet: ``(message, fds)``; ``(None, [])`` at end of stream. A packet that is not a JSON
    object comes back as ``({}, fds)`` (the receiver logs it and closes the fds). Raises ``BlockingIOError`` on a
    non-blocking socket with nothing to read."""
    data, fds, _flags, _addr = socket.recv_fds(sock, MAX_PACKET_BYTES, 4)
    if not data:
        for fd in fds:
            os.close(fd)
        return None, []
    try:
        message = json.loads(data)
    except ValueError:
        return {}, fds
    return (message if isinstance(message, dict) else {}), fds


# --- the file worker's side ----------------------------------------------------------------------------


Signature = dict[str, tuple[int, int]]
"""``{absolute path: (st_mtime_ns, st_size)}`` of a DAG file and the bundle modules its parse imported."""


def signature_of(paths: list[str]) -> Signature:
    """The signature of ``paths`` now; a file that cannot be stat'ed gets ``(-1, -1)`` (so a later stat that
    succeeds reads as a change)."""
    out: Signature = {}
    for path in paths:
        try:
            st = os.stat(path)
            out[path] = (st.st_mtime_ns, st.st_size)
        except OSError:
            out[path] = (-1, -1)
    return out


def changed(signature: Signature) -> str | None:
    """The first file of ``signature`` whose signature differs now, or None when none does."""
    now = signature_of(list(signature))
    for path, sig in signature.items():
        if now[path] != sig:
            return path
    return None


@dataclass
class Prepared:
    """What :func:`prepare` made of a DAG file: its absolute ``path``, the ``signature`` to check before each
    fork, whether its bag is ``cached`` for task processes, how many ``dags`` it holds, and the parse's
    ``seconds`` (wall)."""

    path: str
    signature: Signature
    cached: bool
    dags: int
    seconds: float
    errors: dict[str, str] = field(default_factory=dict)


def prepare(key: FileKey) -> Prepared:
    """Resolve ``key``'s bundle and parse its DAG file once, in this process, as ``task_runner.parse`` does (a
    ``BundleDagBag`` with ``safe_mode=False``, ``load_op_links=False``); then, when the parse gave DAGs and no
    import error, make ``airflow.dag_processing.dagbag.BundleDagBag`` answer the same call in this process's
    descendants with that bag while the signature holds (:func:`install_cached_bag`).

    :raises Exception: whatever resolving the bundle raises (an unknown bundle name, a bundle that cannot be
        initialized); the file worker reports it as ``failed``.
    """
    from pathlib import Path

    import airflow.dag_processing.dagbag as dagbag_module
    from airflow.dag_processing.bundles.manager import DagBundlesManager

    started = time.monotonic()
    bundle = DagBundlesManager().get_bundle(name=key.bundle, version=key.version)
    bundle.initialize()
    bundle_path = Path(bundle.path)
    path = os.fspath(Path(bundle_path, key.path))
    before = set(sys.modules)
    bag = dagbag_module.BundleDagBag(dag_folder=path, safe_mode=False, load_op_links=False,
                                     bundle_path=bundle_path, bundle_name=key.bundle)
    root = os.fspath(bundle_path.resolve())
    files = {os.path.realpath(path)}
    for name in set(sys.modules) - before:
        module_file = getattr(sys.modules.get(name), "__file__", None)
        if module_file and os.path.realpath(module_file).startswith(root + os.sep):
            files.add(os.path.realpath(module_file))
    signature = signature_of(sorted(files))
    errors = {str(k): str(v)[:500] for k, v in (bag.import_errors or {}).items()}
    cached = bool(bag.dags) and not errors
    if cached:
        install_cached_bag(dagbag_module, bag, path=path, bundle_path=bundle_path, bundle_name=key.bundle,
                           signature=signature)
    return Prepared(path, signature, cached, len(bag.dags), time.monotonic() - started, errors)


def install_cached_bag(dagbag_module: Any, bag: Any, *, path: str, bundle_path: Any, bundle_name: str,
                       signature: Signature) -> None:
    """Replace ``dagbag_module.BundleDagBag`` (in this process and the ones it forks) with a function that
    returns ``bag`` for exactly the call ``task_runner.parse`` makes for this file (same ``dag_folder``,
    ``bundle_path``, ``bundle_name``, ``safe_mode=False``) while :func:`changed` finds nothing, and builds a
    real ``BundleDagBag`` for any other call. ``task_runner.parse`` imports the name at call time (Airflow
    3.3.2, ``task_runner.py``), so its next call sees the replacement."""
    real = dagbag_module.BundleDagBag

    def bundle_dag_bag(*args: Any, **kwargs: Any) -> Any:
        same = (not args and kwargs.get("dag_folder") == path and kwargs.get("bundle_path") == bundle_path
                and kwargs.get("bundle_name") == bundle_name and kwargs.get("safe_mode") is False)
        if same and changed(signature) is None:
            return bag
        return real(*args, **kwargs)

    bundle_dag_bag.leoflow_cached_path = path  # type: ignore[attr-defined]  # tests and logs read it
    dagbag_module.BundleDagBag = bundle_dag_bag


class FileWorkerLoop:
    """The file worker's event loop, after :func:`prepare`.

    :param sock: its end of the socket pair (blocking).
    :param prepared: what :func:`prepare` made.
    :param run_agent: runs, in a forked agent, the launch message with the given report pipe write end and
        returns the agent's exit code (the zygote's: join the attempt cgroup, then
        :func:`leoflow_agent.runner.agent_main`).
    :param idle_ttl: seconds with no fork and no agent after which the worker exits (> 0).
    :param max_age: seconds after which the worker exits as soon as it has no agent left to report on.
    """

    def __init__(self, sock: socket.socket, prepared: Prepared, run_agent: Callable[[dict[str, Any], int], int],
                 *, idle_ttl: float, max_age: float) -> None:
        self.sock = sock
        self.prepared = prepared
        self.run_agent = run_agent
        self._child_closes: tuple[int, ...] = ()
        self.idle_ttl = idle_ttl
        self.max_age = max_age
        self.agents: set[int] = set()
        self.born = self.last_used = time.monotonic()
        self.closing = False

    def run(self) -> int:
        """Serve fork requests and report exits until the zygote hangs up, the file changes, or a self-limit
        ends it; returns the exit code (0)."""
        import selectors
        import signal

        rfd, wfd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wfd, warn_on_full_buffer=False)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        sel = selectors.DefaultSelector()
        self._child_closes = (rfd, wfd, sel.fileno()) if hasattr(sel, "fileno") else (rfd, wfd)
        sel.register(self.sock, selectors.EVENT_READ, "zygote")
        sel.register(rfd, selectors.EVENT_READ, "signal")
        while not self.closing:
            for key, _ in sel.select(timeout=1.0):
                if key.data == "signal":
                    try:
                        os.read(rfd, 4096)
                    except BlockingIOError:
                        pass
                else:
                    self._read()
            self._reap()
            now = time.monotonic()
            if not self.agents and (now - self.last_used > self.idle_ttl or now - self.born > self.max_age):
                log.info("file worker of %s exits: %s", self.prepared.path,
                         "idle" if now - self.last_used > self.idle_ttl else "max age reached")
                break
        self._reap()
        return 0

    def _read(self) -> None:
        try:
            message, fds = recv_packet(self.sock)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            message, fds = None, []
        if message is None:
            self.closing = True  # the zygote hung up: our agents are reparented to its successor or init
            return
        if protocol.warm_op_of(message) is not protocol.WarmOp.FORK or not isinstance(message.get("launch"), dict) \
                or len(fds) != 1:
            log.error("bad packet from the zygote: %r", message)
            for fd in fds:
                os.close(fd)
            return
        launch, report_fd = message["launch"], fds[0]
        launch_id = launch.get("launch_id")
        try:
            stale = changed(self.prepared.signature)
            if stale is not None:
                self._send(protocol.warm_message(protocol.WarmEv.STALE, launch_id=launch_id, file=stale))
                self.closing = True
                return
            try:
                pid = self._fork(launch, report_fd)
            except OSError as exc:
                self._send(protocol.warm_message(protocol.WarmEv.FORK_FAILED, launch_id=launch_id,
                                                 error=exc.strerror))
                return
            self.agents.add(pid)
            self.last_used = time.monotonic()
        finally:
            os.close(report_fd)

    def _fork(self, launch: dict[str, Any], report_fd: int) -> int:
        """Fork the agent of ``launch``; in the child write ``started`` on ``report_fd`` first, then run it and
        exit. Returns the agent's pid; raises ``OSError`` when the fork failed."""
        import signal

        from leoflow_agent import proc

        pid = os.fork()
        if pid:
            return pid

        def agent() -> int:
            me = os.getpid()
            os.write(report_fd, protocol.encode(protocol.ev_message(
                protocol.Ev.STARTED, launch_id=launch.get("launch_id"), pid=me, start_time=proc.start_time(me))))
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            self.sock.close()
            for fd in self._child_closes:
                try:
                    os.close(fd)
                except OSError:
                    pass
            return self.run_agent(launch, report_fd)

        proc.exit_child(agent, f"the warm agent of {launch.get('launch_id')}")

    def _reap(self) -> None:
        while self.agents:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                self.agents.clear()
                return
            except InterruptedError:
                continue
            if pid == 0:
                return
            self.agents.discard(pid)
            self.last_used = time.monotonic()
            self._send(protocol.warm_message(protocol.WarmEv.EXITED, pid=pid,
                                             exit_code=os.waitstatus_to_exitcode(status)))

    def _send(self, message: dict[str, Any]) -> None:
        try:
            send_packet(self.sock, message)
        except OSError:
            self.closing = True


def ready_to_fork() -> None:
    """Make this process (the zygote after its preload, a file worker after its parse) cheap and safe to fork
    from: drop Airflow's database connections (never carried into a fork), then freeze everything allocated so
    far into the permanent generation, so a forked child's garbage collections never walk, and so never copy,
    the parent's heap page by page (LocalExecutor does the same before forking its workers; measured by
    ``bench/``: ~0.15 s of CPU per task)."""
    try:
        from airflow.settings import dispose_orm

        dispose_orm(do_log=False)
    except Exception:  # noqa: BLE001 - nothing to dispose is fine
        pass
    import gc

    gc.collect()
    gc.freeze()


def file_worker_main(sock: socket.socket, key: FileKey, run_agent: Callable[[dict[str, Any], int], int], *,
                     idle_ttl: float, max_age: float) -> int:
    """The file worker's process, forked by the zygote: title, :func:`prepare` ``key``'s file, drop the
    database connections parsing may have opened, freeze the heap for its forks (as the zygote does), say
    ``ready`` (or ``failed`` and exit 1), then serve (:class:`FileWorkerLoop`). Returns the exit code."""
    try:
        from setproctitle import setproctitle

        setproctitle(key.title())
    except ImportError:
        pass
    sock.setblocking(True)
    try:
        prepared = prepare(key)
    except BaseException as exc:  # noqa: BLE001 - a DAG file's top level may raise anything, even SystemExit
        log.warning("file worker of %s could not prepare: %r", key.title(), exc)
        try:
            send_packet(sock, protocol.warm_message(protocol.WarmEv.FAILED,
                                                    error=f"{type(exc).__name__}: {exc}"[:500]))
        except OSError:
            pass
        return 1
    if prepared.errors:
        log.warning("file worker of %s: the parse left import errors, so task processes parse the file "
                    "themselves: %s", key.title(), prepared.errors)
    ready_to_fork()
    try:
        send_packet(sock, protocol.warm_message(protocol.WarmEv.READY, cached=prepared.cached, dags=prepared.dags,
                                                seconds=round(prepared.seconds, 3)))
    except OSError:
        return 0
    return FileWorkerLoop(sock, prepared, run_agent, idle_ttl=idle_ttl, max_age=max_age).run()
