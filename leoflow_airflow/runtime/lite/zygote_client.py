"""The zygote client: start and watch the Lite zygote, hand it messages, read its events.

DESIGN §3: the zygote (``python -m leoflow_agent serve``) is spawned in the executor's ``start()`` with an
allow-listed environment and reached over a 0600 Unix socket; a stale zygote of an earlier scheduler is
removed first (pidfile holding pid + start time). Spawning does not wait for the zygote to import the Task
SDK: :meth:`ZygoteClient.connect` is polled (non-blocking) until it answers, so a restarted scheduler's first
heartbeat never waits on it. Nothing here forks from the scheduler except the zygote's own ``exec``.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

from leoflow_agent import proc, protocol
from leoflow_airflow.errors import ZygoteError
from leoflow_airflow.runtime.environment import agent_environment
from leoflow_airflow.settings import LeoflowSettings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LitePaths:
    """Where the Lite runtime keeps its files, all under ``[leoflow] runtime_dir`` (mode 0700).

    Record files (``attempts/…``) are shared by every scheduler on the host, so a successor adopting an attempt
    reads its record at the path the ledger stores. The zygote's socket, pidfile and log live in ``zygote_dir``,
    one directory per scheduler process (:func:`zygote_dir_for`), so two schedulers on one host each run their
    own zygote (issue 8 hole 14); ``None`` puts them directly under ``root`` (tools and tests).
    """

    root: str
    zygote_dir: str | None = None

    @property
    def zygote_home(self) -> str:
        """The directory of the zygote's socket, pidfile and log (``zygote_dir``, else ``root``)."""
        return self.zygote_dir or self.root

    @property
    def socket(self) -> str:
        """The zygote's Unix socket."""
        return os.path.join(self.zygote_home, "zygote.sock")

    @property
    def pidfile(self) -> str:
        """JSON ``{"pid": int, "start_time": int, "owner_pid": int, "owner_start_time": int}``: the running
        zygote and the scheduler process that spawned it (its owner)."""
        return os.path.join(self.zygote_home, "zygote.pid")

    @property
    def zygote_log(self) -> str:
        """The zygote's (and its agents') stdout/stderr."""
        return os.path.join(self.zygote_home, "zygote.log")

    def attempt_dir(self, ti_id: str, attempt_epoch: int) -> str:
        """Per-attempt directory: ``attempts/<ti_id>/<epoch>``."""
        return os.path.join(self.root, "attempts", ti_id, str(int(attempt_epoch)))

    def record_path(self, ti_id: str, attempt_epoch: int) -> str:
        """The attempt's Lite outcome-record file."""
        return os.path.join(self.attempt_dir(ti_id, attempt_epoch), "record.json")


ZYGOTES_DIR = "zygotes"
"""Sub-directory of ``runtime_dir`` holding one directory per scheduler process."""


def zygote_dir_for(root: str, owner_pid: int) -> str:
    """``<root>/zygotes/<owner_pid>``: the zygote directory of the scheduler process ``owner_pid``. A pid is
    stable for the process's life and short (the socket path must fit ``sun_path``'s 108 bytes); a later
    process that reuses the pid finds a pidfile whose owner start time differs, i.e. a stale zygote of its own
    directory."""
    return os.path.join(root, ZYGOTES_DIR, str(int(owner_pid)))


class ZygoteClient:
    """Owns one zygote process and the connection to it.

    :param settings: the parsed ``[leoflow]`` section.
    :param environ: the scheduler's environment, filtered by
        :func:`~leoflow_airflow.runtime.environment.agent_environment` before it reaches the zygote.
    """

    def __init__(self, settings: LeoflowSettings, environ: dict[str, str] | None = None) -> None:
        self.settings = settings
        self.paths = LitePaths(settings.runtime_dir, zygote_dir_for(settings.runtime_dir, os.getpid()))
        self._environ = dict(os.environ if environ is None else environ)
        self._proc: subprocess.Popen[bytes] | None = None
        self._sock: socket.socket | None = None
        self._buf = protocol.LineBuffer()
        self.pending: set[str] = set()  # launch ids sent, not yet answered with launched/launch_failed
        self.restarts = 0
        self._spawned_at = 0.0
        self._connecting: socket.socket | None = None

    # --- zygote lifecycle -----------------------------------------------------------------------------
    def start(self) -> None:
        """Remove a stale zygote of this process's own zygote directory (and of any directory whose owner
        scheduler is dead; never a live peer's) and spawn a fresh one; returns at once (:meth:`connect`
        finishes the start).

        :raises OSError: the zygote could not be spawned (runtime_dir not writable, no interpreter).
        """
        self.paths = LitePaths(self.paths.root, zygote_dir_for(self.paths.root, os.getpid()))
        os.makedirs(self.paths.root, mode=0o700, exist_ok=True)
        os.chmod(self.paths.root, 0o700)
        os.makedirs(self.paths.zygote_home, mode=0o700, exist_ok=True)
        self._remove_stale()
        try:  # a dead zygote's socket file: connecting to it must fail until the new zygote listens
            os.unlink(self.paths.socket)
        except FileNotFoundError:
            pass
        env = agent_environment(self._environ, self.settings.agent_env_passthrough, self.settings.agent_env_deny)
        logf = open(self.paths.zygote_log, "ab")
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "leoflow_agent", "serve", "--socket", self.paths.socket,
                 "--preload", ",".join(self.settings.zygote_preload),
                 "--warm-files", str(self.settings.lite_warm_files),
                 "--warm-idle-ttl", repr(self.settings.lite_warm_idle_ttl),
                 "--warm-max-age", repr(self.settings.lite_warm_max_age)],
                env=env,
                cwd=self.paths.root,
                stdin=subprocess.DEVNULL,
                stdout=logf,
                stderr=subprocess.STDOUT,
                close_fds=True,
            )
        finally:
            logf.close()
        self._spawned_at = time.monotonic()
        self._sock = None
        self._connecting = None
        ident = None
        for _ in range(100):
            ident = proc.identity(self._proc.pid)
            if ident is not None:
                break
            time.sleep(0.01)
        owner = proc.identity(os.getpid())
        with open(self.paths.pidfile + ".tmp", "w") as fh:
            json.dump({"pid": self._proc.pid, "start_time": ident.start_time if ident else None,
                       "owner_pid": os.getpid(), "owner_start_time": owner.start_time if owner else None}, fh)
        os.replace(self.paths.pidfile + ".tmp", self.paths.pidfile)

    def start_and_wait(self) -> None:
        """:meth:`start`, then block until the zygote answers (tools and tests; the executor never blocks).

        :raises ZygoteError: as :meth:`connect`.
        """
        self.start()
        while not self.connect():
            time.sleep(0.05)

    def _remove_stale(self) -> None:
        """Terminate the zygote of our own directory (ours that lost its connection, or a dead earlier process's
        that had our pid), then the zygote of every sibling directory whose owner scheduler is dead. A live
        peer scheduler's zygote is never touched."""
        stale = _read_pidfile(self.paths.pidfile)
        if stale is not None and proc.is_alive(stale[0]):
            log.warning("removing a stale leoflow zygote pid=%d of this scheduler's directory", stale[0].pid)
            _terminate(stale[0])
        if self.paths.zygote_dir is None:
            return
        parent = os.path.dirname(self.paths.zygote_dir)
        try:
            names = os.listdir(parent)
        except OSError:
            return
        for name in names:
            other = os.path.join(parent, name)
            if other == self.paths.zygote_home:
                continue
            found = _read_pidfile(os.path.join(other, "zygote.pid"))
            if found is None or found[1] is None or proc.is_alive(found[1]):
                continue  # a live peer's (or one still being written): never ours to stop
            if proc.is_alive(found[0]):
                log.warning("removing leoflow zygote pid=%d: its scheduler pid=%d is gone", found[0].pid, found[1].pid)
                _terminate(found[0])

    def connect(self) -> bool:
        """Advance the connection to a spawned zygote without blocking; True once it said hello.

        :raises ZygoteError: it exited during start-up, or did not answer within ``[leoflow]
            zygote_start_timeout`` seconds of being spawned (the message carries the tail of its log).
        """
        if self._sock is not None:
            return True
        if self._proc is None:
            return False
        if self._proc.poll() is not None:
            raise ZygoteError(
                f"the leoflow zygote exited with code {self._proc.returncode} during start-up; "
                f"log tail:\n{_tail(self.paths.zygote_log)}"
            )
        if time.monotonic() - self._spawned_at > self.settings.zygote_start_timeout:
            raise ZygoteError(
                f"the leoflow zygote did not answer on {self.paths.socket} within "
                f"[leoflow] zygote_start_timeout = {self.settings.zygote_start_timeout:g} s; "
                f"log tail:\n{_tail(self.paths.zygote_log)}"
            )
        if self._connecting is None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(self.paths.socket)  # a Unix socket connects at once or fails at once
            except OSError:
                sock.close()
                return False
            sock.setblocking(False)
            self._connecting = sock
        try:
            hello = self._connecting.recv(65536)
        except BlockingIOError:
            return False  # connected; the hello comes once the zygote accepts
        except OSError:
            hello = b""
        if not hello:
            self._connecting.close()
            self._connecting = None
            return False
        self._sock, self._connecting = self._connecting, None
        self._buf = protocol.LineBuffer()
        for msg in self._buf.feed(hello):
            if protocol.ev_of(msg) is not protocol.Ev.HELLO:
                log.error("unexpected first message from the zygote: %r", msg)
        return True

    @property
    def starting(self) -> bool:
        """True while a spawned zygote runs but has not answered yet."""
        return self._sock is None and self._proc is not None and self._proc.poll() is None

    def alive(self) -> bool:
        """True when the zygote process runs and the connection is open."""
        return self._proc is not None and self._proc.poll() is None and self._sock is not None

    @property
    def exit_code(self) -> int | None:
        """The zygote's exit code once it died, else ``None``."""
        return None if self._proc is None else self._proc.poll()

    @property
    def pid(self) -> int | None:
        """The zygote's pid, or None before :meth:`start`."""
        return None if self._proc is None else self._proc.pid

    def restart(self) -> None:
        """Replace a dead zygote (the caller reports its launches in flight back); returns at once.

        :raises OSError: as :meth:`start`.
        """
        self._close()
        self.pending.clear()
        self.restarts += 1
        self.start()

    def hang_up(self, timeout: float) -> list[dict[str, Any]]:
        """Half-close the connection (the zygote exits on EOF and leaves its agents running) and return every
        event it still sends until its EOF, or until ``timeout`` seconds pass."""
        if self._sock is None:
            return []
        try:
            self._sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        out: list[dict[str, Any]] = []
        deadline = time.monotonic() + timeout
        while self._sock is not None and time.monotonic() < deadline:
            out.extend(self.events())
            if self._sock is not None:
                time.sleep(0.02)
        return out

    def stop(self, timeout: float = 10.0) -> None:
        """Hang up (the zygote exits and leaves running agents), then wait; SIGKILL after ``timeout`` s."""
        self._close()
        if self._proc is not None:
            try:
                self._proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        try:
            os.unlink(self.paths.pidfile)
        except FileNotFoundError:
            pass

    def kill(self) -> None:
        """Kill the zygote at once (``terminate()``)."""
        self._close()
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()

    def _close(self) -> None:
        if self._connecting is not None:
            self._connecting.close()
            self._connecting = None
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    # --- messages -------------------------------------------------------------------------------------
    def launch(self, message: protocol.LaunchMessage) -> bool:
        """Send a ``launch`` message (see :mod:`leoflow_agent.protocol`); False when the zygote is gone."""
        return self._send(protocol.op_message(protocol.Op.LAUNCH, **message), message["launch_id"])

    def kill_launch(self, launch_id: str, *, grace: float | None = None) -> bool:
        """Ask the zygote to kill one agent's subtree, or to drop the launch if it still holds it (it then
        answers ``launch_failed``); False when the zygote is gone.

        :param grace: seconds between the agent's SIGTERM (forwarded to the task, so ``on_kill`` runs) and the
            subtree's SIGKILL; 0 kills at once; ``None``: the zygote's default, ``[core]
            killed_task_cleanup_time``. The zygote escalates on its own loop: this never blocks.
        """
        message = protocol.op_message(protocol.Op.KILL, launch_id=launch_id)
        if grace is not None:
            message["grace"] = grace
        return self._send(message, None)

    def set_limit(self, max_agents: int | None) -> bool:
        """Tell the zygote how many busy agents (forked, not yet reported or exited) it may have at once;
        it holds later launches and forks each the moment a busy agent reports or exits
        (:mod:`leoflow_agent.handoff`). ``None``: no limit. False when the zygote is gone."""
        return self._send(protocol.op_message(protocol.Op.LIMIT, max_agents=max_agents), None)

    def retoken(self, launch_id: str, workload: str) -> bool:
        """Replace a held launch's workload JSON (same workload, fresh token); a launch already forked
        ignores it. False when the zygote is gone."""
        return self._send(protocol.op_message(protocol.Op.RETOKEN, launch_id=launch_id, workload=workload), None)

    def _send(self, message: dict[str, Any], launch_id: str | None) -> bool:
        if self._sock is None:
            return False
        data = protocol.encode(message)
        try:
            self._sock.setblocking(True)
            self._sock.sendall(data)
        except OSError:
            self._close()
            return False
        finally:
            if self._sock is not None:
                self._sock.setblocking(False)
        if launch_id is not None:
            self.pending.add(launch_id)
        return True

    def events(self) -> list[dict[str, Any]]:
        """Return every event the zygote sent since the last call (never blocks)."""
        out: list[dict[str, Any]] = []
        while self._sock is not None:
            try:
                chunk = self._sock.recv(1 << 20)
            except BlockingIOError:
                break
            except OSError:
                chunk = b""
            if not chunk:
                self._close()
                break
            out.extend(self._buf.feed(chunk))
        for err in self._buf.errors:
            log.error("bad message from the zygote: %s", err)
        self._buf.errors.clear()
        for ev in out:
            if protocol.ev_of(ev) in (protocol.Ev.LAUNCHED, protocol.Ev.LAUNCH_FAILED):
                self.pending.discard(ev.get("launch_id"))
        return out


def _read_pidfile(path: str) -> tuple[proc.ProcessIdentity, proc.ProcessIdentity | None] | None:
    """``(zygote, owner)`` identities from a zygote pidfile (owner None in a pidfile without one), or None
    when it is missing or unreadable."""
    try:
        with open(path) as fh:
            data = json.load(fh)
        zygote = proc.ProcessIdentity(int(data["pid"]), int(data["start_time"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    try:
        owner = proc.ProcessIdentity(int(data["owner_pid"]), int(data["owner_start_time"]))
    except (KeyError, ValueError, TypeError):
        owner = None
    return zygote, owner


def _terminate(ident: proc.ProcessIdentity, timeout: float = 5.0) -> None:
    """SIGTERM a process named by identity, SIGKILL it after ``timeout`` seconds."""
    import signal

    try:
        os.kill(ident.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.is_alive(ident):
        time.sleep(0.05)
    if proc.is_alive(ident):
        os.kill(ident.pid, signal.SIGKILL)


def _tail(path: str, lines: int = 20) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 8192))
            return b"\n".join(fh.read().splitlines()[-lines:]).decode(errors="replace")
    except OSError:
        return "(no log)"
