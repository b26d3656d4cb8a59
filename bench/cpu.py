"""CPU accounting for whole process trees, from ``/proc`` (Linux only).

Method. The CPU time of a process tree at an instant is the sum, over every process of the tree that still
exists (zombies included), of ``utime + stime + cutime + cstime`` from ``/proc/<pid>/stat``. ``cutime`` and
``cstime`` hold the CPU of every descendant that has already exited *and been waited for*, so a task process
that came and went is still counted: by the LocalExecutor worker that waited for it, or by the leoflow agent
(a subreaper) and then the zygote that waited for the agent. The benchmark takes one snapshot before a DAG
run is triggered and one after it has ended and no attempt process is left in the tree (idle pool processes,
which live on between runs by design, are not waited for: ``bench.compare.Meter.attempt_processes``); the
difference is that run's CPU. The same rule covers both executors: LocalExecutor's task processes are descendants of
the scheduler (scheduler -> worker -> task child), leoflow's too (scheduler -> zygote -> agent -> task
child). What is *not* in a tree's figure: a process that left the tree (re-parented past a subreaper) is
counted under ``orphans`` once it is re-parented to the benchmark process (which makes itself a subreaper),
and the small window where a process exits and is reaped between two ``/proc`` reads can count it once
twice or not at all (the snapshots are taken when the tree is quiet, so this is rare and tiny).

All figures are seconds of CPU (user + system).
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass

_CLK_TCK = os.sysconf("SC_CLK_TCK")
_PR_SET_CHILD_SUBREAPER = 36


@dataclass(frozen=True)
class ProcStat:
    """One process's ``/proc/<pid>/stat`` fields we use; times in seconds."""

    pid: int
    ppid: int
    state: str
    own: float
    children: float

    @property
    def total(self) -> float:
        """Own CPU plus the CPU of its exited, waited-for descendants (seconds)."""
        return self.own + self.children


def read_stat(pid: int) -> ProcStat | None:
    """Parse ``/proc/<pid>/stat``; ``None`` when the process is gone or unreadable."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            raw = fh.read().decode("ascii", "replace")
    except OSError:
        return None
    # comm (field 2) is in parentheses and may contain spaces or ')' itself: split after the LAST ')'.
    fields = raw[raw.rfind(")") + 2 :].split()
    try:
        utime, stime, cutime, cstime = (int(x) for x in fields[11:15])
        return ProcStat(
            pid=pid,
            ppid=int(fields[1]),
            state=fields[0],
            own=(utime + stime) / _CLK_TCK,
            children=(cutime + cstime) / _CLK_TCK,
        )
    except (IndexError, ValueError):
        return None


def snapshot() -> dict[int, ProcStat]:
    """``{pid: ProcStat}`` of every process readable in ``/proc`` right now."""
    table: dict[int, ProcStat] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            stat = read_stat(int(name))
            if stat is not None:
                table[stat.pid] = stat
    return table


def subtree(table: dict[int, ProcStat], root: int) -> list[ProcStat]:
    """``root`` and all its descendants found in ``table`` (empty when ``root`` is not there)."""
    if root not in table:
        return []
    kids: dict[int, list[int]] = {}
    for stat in table.values():
        kids.setdefault(stat.ppid, []).append(stat.pid)
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(table[pid])
        todo.extend(kids.get(pid, ()))
    return out


def tree_cpu(table: dict[int, ProcStat], root: int) -> float:
    """CPU seconds of ``root``'s whole tree (live members plus everything they have reaped)."""
    return sum(s.total for s in subtree(table, root))


def tree_size(table: dict[int, ProcStat], root: int) -> int:
    """Number of processes (zombies included) in ``root``'s tree."""
    return len(subtree(table, root))


def make_subreaper() -> bool:
    """Make this process a child subreaper (``PR_SET_CHILD_SUBREAPER``); returns whether it worked.

    Orphans from the trees below are then re-parented here rather than to init, so their CPU stays
    visible (counted as ``orphans``) and is added to our ``RUSAGE_CHILDREN`` once :func:`reap_orphans`
    waits for them.
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def orphans_cpu(table: dict[int, ProcStat], known_children: set[int]) -> float:
    """CPU seconds of the trees of our direct children that we did not start (re-parented orphans)."""
    me = os.getpid()
    return sum(
        tree_cpu(table, s.pid) for s in table.values() if s.ppid == me and s.pid not in known_children
    )


def reap_orphans(known_children: set[int]) -> int:
    """Wait for exited re-parented orphans (never for ``known_children``); returns how many were reaped."""
    me, reaped = os.getpid(), 0
    for stat in snapshot().values():
        if stat.ppid == me and stat.pid not in known_children and stat.state == "Z":
            try:
                os.waitpid(stat.pid, os.WNOHANG)
                reaped += 1
            except ChildProcessError:
                pass
    return reaped
