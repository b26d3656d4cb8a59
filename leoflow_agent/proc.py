"""Process identity and process-tree control from ``/proc`` (Linux), standard library only.

Liveness in leoflow is always *pid + process start time*, never a bare pid (DESIGN §3): a pid can be reused
by an unrelated process, the start time cannot. A zombie counts as dead. Start times are the kernel's
``starttime`` field of ``/proc/<pid>/stat``: clock ticks since boot (an integer, not seconds).
"""

from __future__ import annotations

import ctypes
import os
import signal
import time
from dataclasses import dataclass

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36


@dataclass(frozen=True)
class ProcessIdentity:
    """A process named so that pid reuse cannot fool us: ``pid`` plus kernel ``start_time`` (clock ticks)."""

    pid: int
    start_time: int


def _read_stat(pid: int) -> tuple[str, int, int] | None:
    """Return ``(state, ppid, starttime)`` of ``pid`` or ``None`` when it does not exist.

    The ``comm`` field may contain spaces and parentheses, so fields are split after the last ``)``.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            raw = fh.read()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    except OSError:
        return None
    try:
        rest = raw[raw.rindex(b")") + 2 :].split()
        return rest[0].decode(), int(rest[1]), int(rest[19])
    except (ValueError, IndexError):
        return None


def start_time(pid: int) -> int | None:
    """Return the kernel start time of ``pid`` in clock ticks since boot, or ``None`` if there is no such pid."""
    stat = _read_stat(pid)
    return None if stat is None else stat[2]


def identity(pid: int) -> ProcessIdentity | None:
    """Return the :class:`ProcessIdentity` of a live ``pid``, or ``None`` if it is gone or a zombie."""
    stat = _read_stat(pid)
    if stat is None or stat[0] in ("Z", "X"):
        return None
    return ProcessIdentity(pid, stat[2])


def is_alive(ident: ProcessIdentity) -> bool:
    """True when the process ``ident`` names still runs: same pid, same start time, not a zombie."""
    stat = _read_stat(ident.pid)
    return stat is not None and stat[2] == ident.start_time and stat[0] not in ("Z", "X")


def _children_map() -> dict[int, list[int]]:
    """Return ``{ppid: [pid, ...]}`` for every process visible in ``/proc`` (zombies included)."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        stat = _read_stat(int(name))
        if stat is not None:
            children.setdefault(stat[1], []).append(int(name))
    return children


def descendants(pid: int) -> list[int]:
    """Return the pids of every descendant of ``pid`` (by parent links; not ``pid`` itself), parents first."""
    children = _children_map()
    out: list[int] = []
    stack = list(children.get(pid, []))
    while stack:
        child = stack.pop()
        out.append(child)
        stack.extend(children.get(child, []))
    return out


def children(pid: int) -> list[int]:
    """Return the pids whose parent is ``pid`` (zombies included)."""
    return list(_children_map().get(pid, []))


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _wait_stopped(pids: list[int], timeout: float = 1.0) -> None:
    """Wait (bounded) until each of ``pids`` is stopped, a zombie or gone: SIGSTOP is not synchronous."""
    deadline = time.monotonic() + timeout
    pending = list(pids)
    while pending and time.monotonic() < deadline:
        pending = [p for p in pending if (st := _read_stat(p)) is not None and st[0] not in ("T", "t", "Z", "X")]
        if pending:
            time.sleep(0.002)


ATTEMPT_ENV = "LEOFLOW_ATTEMPT"
"""Set by an agent to its launch id before it runs the task, so every exec'd descendant carries it in
``/proc/<pid>/environ`` (a forked child shows its exec-time environment only: the session test covers it)."""


def attempt_leftovers(agent: ProcessIdentity, launch_id: str) -> list[int]:
    """Pids of live processes left over from the attempt whose agent ``agent`` is dead, found without any
    parent link (its orphans reparent to init when no zygote was there to reap them, e.g. while the scheduler
    was down): members of the agent's session that started after it (the task child) and processes whose
    environment carries ``ATTEMPT_ENV=launch_id`` (an exec'd descendant in a new session, e.g. ``bash``).

    The session test is skipped while any process holds the agent's pid: Linux never reuses a pid still used
    as a session id, so a live holder means the old session is empty and the id belongs to someone else.
    """
    wanted = f"{ATTEMPT_ENV}={launch_id}".encode()
    session_free = _read_stat(agent.pid) is None
    found: list[int] = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in (os.getpid(), agent.pid):
            continue
        pid = int(name)
        stat = _read_stat(pid)
        if stat is None or stat[0] in ("Z", "X") or stat[2] < agent.start_time:
            continue
        try:
            if session_free and os.getsid(pid) == agent.pid:
                found.append(pid)
                continue
            with open(f"/proc/{pid}/environ", "rb") as fh:
                environ = fh.read()
        except OSError:
            continue
        if wanted in environ.split(b"\0"):
            found.append(pid)
    return found


def find_by_title(title: str) -> list[int]:
    """Pids of live processes whose command line (as ``setproctitle`` leaves it) is ``title`` or starts with
    ``title`` followed by a space. A forked agent sets its title to a marker first thing, so a restarted
    executor can find an agent whose zygote died before reporting it."""
    wanted = title.encode()
    found: list[int] = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as fh:
                cmdline = fh.read().replace(b"\0", b" ").strip()
        except OSError:
            continue
        if (cmdline == wanted or cmdline.startswith(wanted + b" ")) and identity(int(name)) is not None:
            found.append(int(name))
    return found


def kill_tree(root: ProcessIdentity | int, *, include_root: bool = True, timeout: float = 5.0) -> bool:
    """SIGKILL a whole process subtree, including members that started their own session.

    The tree is frozen first (SIGSTOP on every member, repeated until no new member appears) so nothing can
    fork past us, then every member gets SIGKILL. ``root`` is a :class:`ProcessIdentity` (checked against pid
    reuse: a different process under the same pid is left alone) or a pid whose identity is read now.

    :param include_root: also kill ``root`` itself (False: only its descendants, e.g. a zygote's orphans).
    :param timeout: seconds to wait for the members to disappear.
    :returns: True when no member is left alive (zombies awaiting their parent's wait count as gone).
    """
    ident = identity(root) if isinstance(root, int) else root
    if ident is None or not is_alive(ident):
        return True
    members: list[int] = [ident.pid] if include_root else []
    if include_root:
        _signal(ident.pid, signal.SIGSTOP)  # first: a running root would fork past every scan
        _wait_stopped([ident.pid])
    seen: set[int] = set()
    for _ in range(100):
        # every member found so far is stopped (or dead), so a scan that finds nothing new is final
        new = [p for p in descendants(ident.pid) if p not in seen]
        if not new:
            break
        for p in new:
            seen.add(p)
            _signal(p, signal.SIGSTOP)
        _wait_stopped(new)
        members.extend(new)
    for p in members:
        _signal(p, signal.SIGKILL)
        _signal(p, signal.SIGCONT)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(identity(p) is not None for p in members):
            return True
        time.sleep(0.02)
    return not any(identity(p) is not None for p in members)


def _prctl(option: int, arg: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, arg, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def become_subreaper() -> None:
    """Make this process a child subreaper (``PR_SET_CHILD_SUBREAPER``): orphaned descendants reparent to it.

    Raises :class:`OSError` when the kernel refuses.
    """
    _prctl(PR_SET_CHILD_SUBREAPER, 1)


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Ask the kernel to send ``sig`` to this process when its parent dies (``PR_SET_PDEATHSIG``)."""
    _prctl(PR_SET_PDEATHSIG, int(sig))
