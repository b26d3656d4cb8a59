"""Process-tree bookkeeping for the Airflow stack: start in own groups, stop everything, verify.

Airflow's processes escape their parent's process group: the Task SDK puts every task child in a group of
its own and BashOperator starts ``bash`` in a new session. So stopping a stack by killing process groups is
not enough; this module snapshots the whole descendant tree (psutil, pid + create time, so a recycled pid is
never signalled) and also finds strays by a marker variable in their environment.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
import psutil

MARKER_VAR = "LEOFLOW_DEVSTACK_ID"
"""Environment variable carrying a stack's id; every process the stack starts inherits it."""


def spawn(argv: list[str], *, env: dict[str, str], log_path: Path, cwd: Path) -> subprocess.Popen:
    """Start ``argv`` in a new session (so its own process group), stdout+stderr appended to ``log_path``.

    Returns the ``Popen`` of the leader (its pid is also its process-group id). Raises ``OSError`` when the
    program cannot be executed.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            argv,
            env=env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return proc


def marked_processes(markers: list[str]) -> list[psutil.Process]:
    """Every live process whose environment (at exec time) holds one of ``markers`` (``"NAME=value"``).

    Unreadable processes are skipped (as root, none are). Never raises for vanished processes.
    """
    wanted = {marker.encode() for marker in markers}
    found: list[psutil.Process] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if wanted.intersection(environ.split(b"\0")):
            try:
                found.append(psutil.Process(int(entry.name)))
            except psutil.Error:
                continue
    return found


def tree(leaders: list[psutil.Process]) -> list[psutil.Process]:
    """The leaders and all their live descendants (recursive), deduplicated by (pid, create time)."""
    seen: dict[tuple[int, float], psutil.Process] = {}
    for leader in leaders:
        try:
            if not leader.is_running():
                continue
            members = [leader, *leader.children(recursive=True)]
        except psutil.Error:
            continue
        for proc in members:
            try:
                seen.setdefault((proc.pid, proc.create_time()), proc)
            except psutil.Error:
                continue
    return list(seen.values())


def _alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    alive = []
    for proc in procs:
        try:
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(proc)
        except psutil.Error:
            continue
    return alive


def _signal(procs: list[psutil.Process], sig: int) -> None:
    for proc in procs:
        try:
            proc.send_signal(sig)  # psutil checks pid + create time first
        except psutil.Error:
            continue


def stop_all(
    popens: list[subprocess.Popen], markers: list[str], *, grace_seconds: float = 20.0
) -> list[str]:
    """Stop the leaders, everything below them and every process whose environment holds a marker.

    ``markers`` are ``"NAME=value"`` entries (e.g. ``MARKER_VAR=<stack id>``, ``AIRFLOW_HOME=<home>``): a
    process that dropped the stack marker from its environment (leoflow's zygote allow-lists it) and was
    re-parented away from the tree is still found by its AIRFLOW_HOME.

    SIGTERM to the leaders' process groups first, then waits up to ``grace_seconds`` for the whole snapshot
    to exit, then SIGKILLs whatever is left (re-scanning for new descendants and marked strays, twice).
    Returns descriptions of processes still alive at the end (an empty list means clean). Never raises.
    """
    leaders = []
    for popen in popens:
        try:
            leaders.append(psutil.Process(popen.pid))
        except psutil.Error:
            continue
    members = tree(leaders) + marked_processes(markers)
    for leader in leaders:
        try:
            if leader.is_running():
                os.killpg(leader.pid, signal.SIGTERM)
        except (OSError, psutil.Error):
            continue
    deadline = time.monotonic() + grace_seconds
    while time.monotonic() < deadline:
        members = _alive(members + tree(leaders))
        if not members:
            break
        time.sleep(0.2)
    for _ in range(2):
        left = _alive(members + tree(leaders) + marked_processes(markers))
        if not left:
            break
        for leader in leaders:
            try:
                os.killpg(leader.pid, signal.SIGKILL)
            except OSError:
                pass
        _signal(left, signal.SIGKILL)
        psutil.wait_procs(left, timeout=5)
        members = left
    for popen in popens:
        try:
            popen.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
    left = _alive(members + marked_processes(markers))
    descriptions = []
    for proc in left:
        try:
            descriptions.append(f"pid {proc.pid}: {' '.join(proc.cmdline())[:200]}")
        except psutil.Error:
            continue
    return descriptions
