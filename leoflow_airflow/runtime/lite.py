"""The Lite runtime, executor side: start and watch the zygote, hand it launches, read its events.

DESIGN §3: the zygote (``python -m leoflow_agent serve``) is started once in the executor's ``start()`` with
an allow-listed environment and reached over a 0600 Unix socket; a stale zygote of an earlier scheduler is
removed first (pidfile holding pid + start time). Nothing here forks from the scheduler except the zygote's
own ``exec``.
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
    """Where the Lite runtime keeps its files, all under ``[leoflow] runtime_dir`` (mode 0700)."""

    root: str

    @property
    def socket(self) -> str:
        """The zygote's Unix socket."""
        return os.path.join(self.root, "zygote.sock")

    @property
    def pidfile(self) -> str:
        """JSON ``{"pid": int, "start_time": int}`` of the running zygote."""
        return os.path.join(self.root, "zygote.pid")

    @property
    def zygote_log(self) -> str:
        """The zygote's (and its agents') stdout/stderr."""
        return os.path.join(self.root, "zygote.log")

    def attempt_dir(self, ti_id: str, attempt_epoch: int) -> str:
        """Per-attempt directory: ``attempts/<ti_id>/<epoch>``."""
        return os.path.join(self.root, "attempts", ti_id, str(int(attempt_epoch)))

    def record_path(self, ti_id: str, attempt_epoch: int) -> str:
        """The attempt's Lite outcome-record file."""
        return os.path.join(self.attempt_dir(ti_id, attempt_epoch), "record.json")


class LiteRuntime:
    """Owns one zygote process and the connection to it.

    :param settings: the parsed ``[leoflow]`` section.
    :param environ: the scheduler's environment, filtered by
        :func:`~leoflow_airflow.runtime.environment.agent_environment` before it reaches the zygote.
    """

    def __init__(self, settings: LeoflowSettings, environ: dict[str, str] | None = None) -> None:
        self.settings = settings
        self.paths = LitePaths(settings.runtime_dir)
        self._environ = dict(os.environ if environ is None else environ)
        self._proc: subprocess.Popen[bytes] | None = None
        self._sock: socket.socket | None = None
        self._buf = protocol.LineBuffer()
        self.pending: set[str] = set()  # launch ids sent, not yet answered with launched/launch_failed
        self.restarts = 0

    # --- zygote lifecycle -----------------------------------------------------------------------------
    def start(self) -> None:
        """Remove a stale zygote, start a fresh one and connect to it.

        :raises ZygoteError: when it does not answer within ``[leoflow] zygote_start_timeout`` seconds
            (the message carries the tail of its log).
        """
        os.makedirs(self.paths.root, mode=0o700, exist_ok=True)
        os.chmod(self.paths.root, 0o700)
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
                 "--preload", ",".join(self.settings.zygote_preload)],
                env=env,
                cwd=self.paths.root,
                stdin=subprocess.DEVNULL,
                stdout=logf,
                stderr=subprocess.STDOUT,
                close_fds=True,
            )
        finally:
            logf.close()
        ident = None
        for _ in range(100):
            ident = proc.identity(self._proc.pid)
            if ident is not None:
                break
            time.sleep(0.01)
        with open(self.paths.pidfile + ".tmp", "w") as fh:
            json.dump({"pid": self._proc.pid, "start_time": ident.start_time if ident else None}, fh)
        os.replace(self.paths.pidfile + ".tmp", self.paths.pidfile)
        self._connect()

    def _remove_stale(self) -> None:
        try:
            with open(self.paths.pidfile) as fh:
                data = json.load(fh)
            ident = proc.ProcessIdentity(int(data["pid"]), int(data["start_time"]))
        except (OSError, ValueError, KeyError, TypeError):
            return
        if proc.is_alive(ident):
            log.warning("removing a stale leoflow zygote pid=%d left by an earlier scheduler", ident.pid)
            _terminate(ident)

    def _connect(self) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + self.settings.zygote_start_timeout
        last_err: Exception | None = None
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise ZygoteError(
                    f"the leoflow zygote exited with code {self._proc.returncode} during start-up; "
                    f"log tail:\n{_tail(self.paths.zygote_log)}"
                )
            try:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.connect(self.paths.socket)
            except OSError as exc:
                last_err = exc
                sock.close()
                time.sleep(0.05)
                continue
            sock.settimeout(self.settings.zygote_start_timeout)
            try:
                hello = sock.recv(65536)
            except OSError as exc:
                last_err = exc
                sock.close()
                time.sleep(0.05)
                continue
            if not hello:
                last_err = ConnectionError("the zygote closed the connection")
                sock.close()
                time.sleep(0.05)
                continue
            sock.setblocking(False)
            self._sock = sock
            self._buf = protocol.LineBuffer()
            for msg in self._buf.feed(hello):
                if msg.get("ev") != "hello":
                    log.error("unexpected first message from the zygote: %r", msg)
            return
        raise ZygoteError(
            f"the leoflow zygote did not answer on {self.paths.socket} within "
            f"[leoflow] zygote_start_timeout = {self.settings.zygote_start_timeout:g} s ({last_err}); "
            f"log tail:\n{_tail(self.paths.zygote_log)}"
        )

    def alive(self) -> bool:
        """True when the zygote process runs and the connection is open."""
        return self._proc is not None and self._proc.poll() is None and self._sock is not None

    @property
    def exit_code(self) -> int | None:
        """The zygote's exit code once it died, else ``None``."""
        return None if self._proc is None else self._proc.poll()

    def restart(self) -> None:
        """Replace a dead zygote (launches in flight are reported back as failed by the caller)."""
        self._close()
        self.restarts += 1
        self.start()

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
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    # --- messages -------------------------------------------------------------------------------------
    def launch(self, message: dict[str, Any]) -> bool:
        """Send a ``launch`` message (see :mod:`leoflow_agent.protocol`); False when the zygote is gone."""
        return self._send(dict(message, op="launch"), message["launch_id"])

    def kill_launch(self, launch_id: str) -> bool:
        """Ask the zygote to kill one agent's subtree, or to drop the launch if it still holds it (it then
        answers ``launch_failed``); False when the zygote is gone."""
        return self._send({"op": "kill", "launch_id": launch_id}, None)

    def set_limit(self, max_agents: int | None) -> bool:
        """Tell the zygote how many busy agents (forked, not yet reported or exited) it may have at once;
        it holds later launches and forks each the moment a busy agent reports or exits
        (:mod:`leoflow_agent.handoff`). ``None``: no limit. False when the zygote is gone."""
        return self._send({"op": "limit", "max_agents": max_agents}, None)

    def retoken(self, launch_id: str, workload: str) -> bool:
        """Replace a held launch's workload JSON (same workload, fresh token); a launch already forked
        ignores it. False when the zygote is gone."""
        return self._send({"op": "retoken", "launch_id": launch_id, "workload": workload}, None)

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
            if ev.get("ev") in ("launched", "launch_failed"):
                self.pending.discard(ev.get("launch_id"))
        return out


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
