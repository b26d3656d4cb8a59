"""Process identity and process-tree control from ``/proc`` (Linux), standard library only.

Liveness in leoflow is always *pid + process start time*, never a bare pid (DESIGN §3): a pid can be reused
by an unrelated process, the start time cannot. A zombie counts as dead. Start times are the kernel's
``starttime`` field of ``/proc/<pid>/stat``: clock ticks since boot (an integer, not seconds).
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import time
from dataclasses import dataclass
from typing import Callable, NoReturn

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36


@dataclass(frozen=True)
class ProcessIdentity:
    """A process named so that pid reuse cannot fool us: ``pid`` plus kernel ``start_time`` (clock ticks)."""

    pid: int
    start_time: int

    def __post_init__(self) -> None:
        # pid 0 is no process and pid 1 is init: a session id or subtree of either covers the whole host,
        # so an identity naming them would make proof of death or a kill reach every process
        if self.pid <= 1:
            raise ValueError(f"refusing a process identity for pid {self.pid}")


def _parse_stat(raw: bytes) -> tuple[str, int, int, int] | None:
    """``(state, ppid, session, starttime)`` from the bytes of a ``/proc/<pid>/stat`` file (``proc(5)``).

    The ``comm`` field may contain spaces and parentheses, so fields are split after the last ``)``.
    """
    try:
        rest = raw[raw.rindex(b")") + 2 :].split()
        return rest[0].decode(), int(rest[1]), int(rest[3]), int(rest[19])
    except (ValueError, IndexError):
        return None


def _read_stat(pid: int) -> tuple[str, int, int] | None:
    """Return ``(state, ppid, starttime)`` of ``pid`` or ``None`` when it does not exist."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            raw = fh.read()
    except OSError:
        return None
    stat = _parse_stat(raw)
    return None if stat is None else (stat[0], stat[1], stat[3])


_scans = 0


def scan_count() -> int:
    """How many full scans of ``/proc`` (listings of every pid) this process has made so far. Only ever grows.

    A statistic, and the seam tests count scans through: an observation pass of the Lite runtime takes at most
    one (:class:`ProcessTable`), whatever the number of attempts it looks at (issue 8's seam)."""
    return _scans


def _list_pids() -> list[int]:
    """Every pid listed in ``/proc`` right now (the one place a full scan starts; counted by :func:`scan_count`)."""
    global _scans
    _scans += 1
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def start_time(pid: int) -> int | None:
    """Return the kernel start time of ``pid`` in clock ticks since boot, or ``None`` if there is no such pid."""
    stat = _read_stat(pid)
    return None if stat is None else stat[2]


def identity(pid: int) -> ProcessIdentity | None:
    """Return the :class:`ProcessIdentity` of a live ``pid``, or ``None`` if it is gone or a zombie."""
    if pid <= 1:
        return None  # never name pid 0 or init (see ProcessIdentity)
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
    for pid in _list_pids():
        stat = _read_stat(pid)
        if stat is not None:
            children.setdefault(stat[1], []).append(pid)
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
    """Return the pids whose parent is ``pid`` (zombies included).

    Read from the kernel's own list, ``/proc/<pid>/task/<tid>/children`` of each of ``pid``'s threads
    (``proc(5)``, Linux 3.5+ with ``CONFIG_PROC_CHILDREN``): a few small reads instead of a ``/proc`` scan that
    opens every process's ``stat`` (the zygote asks after every agent's exit; on the bench machine that scan
    was half the zygote's CPU). Like the scan, it is a snapshot: a child forked or reparented while it is read
    may be missed, which is why callers that must catch every process of an attempt also empty its cgroup.
    Where the kernel has no such file, or ``pid`` is gone, it falls back to the scan (:func:`_children_map`)."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
        found: list[int] = []
        for tid in tids:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as fh:
                found.extend(int(p) for p in fh.read().split())
    except (OSError, ValueError):
        return list(_children_map().get(pid, []))
    return found


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


@dataclass(frozen=True)
class ProcessEntry:
    """One live (not zombie) process of a :class:`ProcessTable`, as its scan read it from ``stat``.

    :param ident: pid + kernel start time (clock ticks since boot).
    :param ppid: its parent's pid at the scan.
    :param session: its session id at the scan (``getsid``).
    """

    ident: ProcessIdentity
    ppid: int
    session: int


class ProcessTable:
    """A snapshot of this host's processes: one scan of ``/proc`` at first use, shared by every lookup made
    through the same table (issue 8's seam: an observation pass of the Lite runtime scans ``/proc`` once,
    whatever the number of attempts it looks at). Constructing one reads nothing; a caller that needs no
    lookup pays nothing.

    The scan reads each pid's ``stat`` (identity, state, parent, session). Titles (``cmdline``, as
    ``setproctitle`` leaves it) and the :data:`ATTEMPT_ENV` marker (from ``environ``) are read lazily, once per
    process and only when a lookup needs them, through a descriptor of that process's ``/proc/<pid>``
    directory whose ``stat`` must still show the snapshot's start time: a pid reused since the scan never lends
    its title or environment to the process the snapshot saw.

    The module's safety rules hold: pid 0 and 1 are never entries (:class:`ProcessIdentity` refuses them; a
    made-up pid-0 identity once made proof of death take every session-0 process for a leftover); zombies are
    dead and never entries, though they hold their pid (:meth:`holds`); the scanning process is left out; a
    process whose title or environment cannot be read (gone, another user's, a kernel thread) is never
    matched, never presumed ours.

    Staleness: it answers as of its scan, which is safe for proof of death and lookups: an identity absent
    from it is dead for good; one present may have died since (the caller answers LIVE one pass longer); an
    attempt none of whose processes is in it can only gain one by a fork of a process of it (which would have
    been in it) or by a zygote still forking its launch (which the caller knows as in flight). After killing
    processes, take a new table: what this one lists has changed.
    """

    def __init__(self) -> None:
        self._entries: dict[int, ProcessEntry] | None = None
        self._held: frozenset[int] = frozenset()
        self._titles: dict[int, bytes | None] = {}
        self._markers: dict[int, str | None] = {}
        self._by_marker: dict[str, list[ProcessIdentity]] | None = None

    @property
    def scanned(self) -> bool:
        """True once the scan was taken (by the first lookup)."""
        return self._entries is not None

    def _table(self) -> dict[int, ProcessEntry]:
        if self._entries is None:
            me = os.getpid()
            entries: dict[int, ProcessEntry] = {}
            held: set[int] = set()
            for pid in _list_pids():
                try:
                    with open(f"/proc/{pid}/stat", "rb") as fh:
                        stat = _parse_stat(fh.read())
                except OSError:
                    continue  # gone since the listing
                if stat is None:
                    continue
                held.add(pid)
                if pid <= 1 or pid == me or stat[0] in ("Z", "X"):
                    continue
                entries[pid] = ProcessEntry(ProcessIdentity(pid, stat[3]), stat[1], stat[2])
            self._entries, self._held = entries, frozenset(held)
        return self._entries

    def entries(self) -> list[ProcessEntry]:
        """Every live process of the snapshot (not pid 0 or 1, not the scanning process), by pid."""
        return [self._table()[pid] for pid in sorted(self._table())]

    def get(self, pid: int) -> ProcessEntry | None:
        """The live process the snapshot saw at ``pid``, or ``None``."""
        return self._table().get(pid)

    def holds(self, pid: int) -> bool:
        """True when some process (a zombie, init and the scanning process included) held ``pid`` at the scan."""
        self._table()
        return pid in self._held

    def _read(self, ident: ProcessIdentity, name: str) -> bytes | None:
        """``/proc/<pid>/<name>`` of exactly the process ``ident`` names, or ``None`` when it is gone, a zombie,
        another process now holds its pid, or the file cannot be read."""
        try:
            dirfd = os.open(f"/proc/{ident.pid}", os.O_RDONLY | os.O_DIRECTORY)
        except OSError:
            return None

        def opener(path: str, flags: int) -> int:
            return os.open(path, flags, dir_fd=dirfd)

        try:
            with open("stat", "rb", opener=opener) as fh:
                stat = _parse_stat(fh.read())
            if stat is None or stat[3] != ident.start_time or stat[0] in ("Z", "X"):
                return None
            with open(name, "rb", opener=opener) as fh:
                return fh.read()
        except OSError:
            return None
        finally:
            os.close(dirfd)

    def title(self, ident: ProcessIdentity) -> bytes | None:
        """The process's command line with NULs as spaces, stripped (its ``setproctitle`` title), or ``None``
        when it cannot be read. Read once per process per table."""
        if ident.pid not in self._titles:
            raw = self._read(ident, "cmdline")
            self._titles[ident.pid] = None if raw is None else raw.replace(b"\0", b" ").strip()
        return self._titles[ident.pid]

    def marker(self, ident: ProcessIdentity) -> str | None:
        """The value of :data:`ATTEMPT_ENV` in the process's exec-time environment (``/proc/<pid>/environ``),
        or ``None`` when it has none or it cannot be read. Read once per process per table."""
        if ident.pid not in self._markers:
            value = None
            raw = self._read(ident, "environ")
            prefix = ATTEMPT_ENV.encode() + b"="
            for item in (raw or b"").split(b"\0"):
                if item.startswith(prefix):
                    value = item[len(prefix):].decode(errors="replace")
                    break
            self._markers[ident.pid] = value
        return self._markers[ident.pid]

    def by_title(self, title: str) -> list[ProcessIdentity]:
        """Live processes whose title is ``title`` or starts with ``title`` and a space, oldest first. An empty
        ``title`` names nothing (a kernel thread's command line is empty)."""
        if not title.strip():
            return []
        wanted = title.encode()
        found = [e.ident for e in self.entries()
                 if (t := self.title(e.ident)) is not None and (t == wanted or t.startswith(wanted + b" "))]
        return sorted(found, key=lambda i: (i.start_time, i.pid))

    def by_marker(self, launch_id: str) -> list[ProcessIdentity]:
        """Live processes whose environment carries exactly ``ATTEMPT_ENV=launch_id``, oldest first (an agent's
        exec'd descendants: a forked process shows its exec-time environment only). The first lookup reads
        every process's environment once; later ones answer from that."""
        if not launch_id:
            return []
        if self._by_marker is None:
            index: dict[str, list[ProcessIdentity]] = {}
            for entry in self.entries():
                value = self.marker(entry.ident)
                if value:
                    index.setdefault(value, []).append(entry.ident)
            self._by_marker = index
        return sorted(self._by_marker.get(launch_id, []), key=lambda i: (i.start_time, i.pid))

    def leftovers(self, agent: ProcessIdentity, launch_id: str) -> list[ProcessIdentity]:
        """Live processes left over from the attempt ``launch_id`` whose agent ``agent`` is dead, found without
        parent links: members of the agent's session that started after it (the task child), and processes
        that started after it whose environment carries ``ATTEMPT_ENV=launch_id`` (an exec'd descendant in a
        new session, e.g. ``bash``). Oldest first.

        The session test is skipped while any process (a zombie included) holds the agent's pid: Linux never
        reuses a pid still used as a session id, so a holder means the old session is empty and the id is
        someone else's. A session id of 0 or 1 never matches (``agent`` cannot name either).
        """
        session_free = not self.holds(agent.pid)
        found: list[ProcessIdentity] = []
        for entry in self.entries():
            if entry.ident.pid == agent.pid or entry.ident.start_time < agent.start_time:
                continue
            if session_free and agent.pid > 1 and entry.session == agent.pid:
                found.append(entry.ident)
            elif self.marker(entry.ident) == launch_id:
                found.append(entry.ident)
        return sorted(found, key=lambda i: (i.start_time, i.pid))


def attempt_leftovers(agent: ProcessIdentity, launch_id: str, *, use_cgroup: bool = True,
                      table: ProcessTable | None = None) -> list[int]:
    """Pids of live processes left over from the attempt whose agent ``agent`` is dead, found without any
    parent link (its orphans reparent to init when no zygote was there to reap them, e.g. while the scheduler
    was down). The pids of :func:`leftover_processes` (same parameters)."""
    return [i.pid for i in leftover_processes(agent, launch_id, use_cgroup=use_cgroup, table=table)]


def leftover_processes(agent: ProcessIdentity, launch_id: str, *, use_cgroup: bool = True,
                       table: ProcessTable | None = None) -> list[ProcessIdentity]:
    """The live processes left over from the attempt whose agent ``agent`` is dead, by identity (so a caller
    that kills them later never hits a reused pid).

    When the attempt has a cgroup (:func:`join_attempt_cgroup`, issue 8 hole 13) its member list is the
    answer: no process leaves a cgroup by changing its session or environment. An empty attempt cgroup is
    removed here (the attempt is over). Otherwise, or with ``use_cgroup=False``, ``table`` (a fresh
    :class:`ProcessTable` when ``None``) answers (:meth:`ProcessTable.leftovers`: session members and marker
    carriers); it misses a descendant that started its own session *and* replaced its environment
    (``BashOperator(env=...)``).
    """
    if use_cgroup:
        groups = attempt_cgroups(launch_id)
        if groups:
            members = sorted({p for path in groups for p in cgroup_members(path)} - {os.getpid()})
            found = [i for p in members if (i := identity(p)) is not None and i != agent]
            if not found:
                for path in groups:
                    remove_cgroup(path)
            return found
    return (table or ProcessTable()).leftovers(agent, launch_id)


# --- per-attempt cgroups (issue 8, hole 13) ---------------------------------------------------------------
CGROUP_DIR = "leoflow"
"""Name of the directory, in the cgroup of the process that computes it (the scheduler and its zygote share
one), that holds one cgroup per attempt, named by launch id: ``<hierarchy>/<own cgroup>/leoflow/<launch id>``."""


@dataclass(frozen=True)
class CgroupHierarchy:
    """Where attempt cgroups live on one cgroup hierarchy.

    :param version: 2 (the unified hierarchy) or 1 (the v1 ``pids`` controller's hierarchy).
    :param root: the directory holding attempt cgroups (``.../leoflow``), absolute.
    """

    version: int
    root: str


def _read_text(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except OSError:
        return None


def cgroup_hierarchies() -> list[CgroupHierarchy]:
    """The places attempt cgroups may live for this process, best first: the cgroup2 (unified) hierarchy,
    then the cgroup v1 ``pids`` hierarchy, each at ``<mount point>/<this process's cgroup>/leoflow``. Read from
    ``/proc/self/mountinfo`` and ``/proc/self/cgroup`` (``proc(5)``, ``cgroups(7)``); nothing is created.
    Empty when neither is mounted or this process's cgroup there lies outside the mount (another namespace).
    """
    own: dict[str, str] = {}  # "v2" or a v1 controller -> this process's cgroup path
    for line in (_read_text("/proc/self/cgroup") or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            own["v2"] = parts[2]
        for controller in parts[1].split(","):
            if controller:
                own.setdefault(controller, parts[2])
    found: dict[str, CgroupHierarchy] = {}
    for line in (_read_text("/proc/self/mountinfo") or "").splitlines():
        pre, sep, post = line.partition(" - ")
        fields, tail = pre.split(), post.split()
        if not sep or len(fields) < 5 or len(tail) < 3:
            continue
        mount_root, mount_point = fields[3], fields[4].replace("\\040", " ")
        if tail[0] == "cgroup2":
            key, version = "v2", 2
        elif tail[0] == "cgroup" and "pids" in tail[2].split(","):
            key, version = "pids", 1
        else:
            continue
        path = own.get(key)
        if key in found or path is None:
            continue
        if mount_root != "/" and not (path == mount_root or path.startswith(mount_root.rstrip("/") + "/")):
            continue
        rel = path[len(mount_root):] if mount_root != "/" else path
        found[key] = CgroupHierarchy(version, os.path.join(mount_point, rel.lstrip("/"), CGROUP_DIR))
    return [found[k] for k in ("v2", "pids") if k in found]


def _cgroup_name(launch_id: str) -> str:
    if not launch_id or "/" in launch_id or launch_id in (".", "..") or "\0" in launch_id:
        raise ValueError(f"a launch id cannot name a cgroup: {launch_id!r}")
    return launch_id


def probe_cgroup() -> CgroupHierarchy | None:
    """Pick the hierarchy attempt cgroups go to (called once at zygote start): the first of
    :func:`cgroup_hierarchies` where a freshly forked process can create an attempt cgroup and move itself
    into it, else ``None`` (proof of death then falls back to the ``/proc`` scan). Leaves nothing behind."""
    for hierarchy in cgroup_hierarchies():
        probe = os.path.join(hierarchy.root, f"probe-{os.getpid()}")
        try:
            os.makedirs(probe, exist_ok=True)
        except OSError:
            continue
        try:
            pid = os.fork()
            if pid == 0:
                ok = join_cgroup(probe)
                os._exit(0 if ok else 1)
            _, status = os.waitpid(pid, 0)
            joined = os.waitstatus_to_exitcode(status) == 0
        except OSError:
            joined = False
        remove_cgroup(probe)
        if joined:
            return hierarchy
    return None


def join_cgroup(path: str) -> bool:
    """Move the calling process into the cgroup directory ``path`` (creating it); True when it worked.
    Its children forked afterwards start there too, whatever they do with sessions and environments."""
    for _ in range(3):  # a sweep (:func:`sweep_attempt_cgroups`) may remove it between mkdir and the move
        try:
            os.makedirs(path, exist_ok=True)
        except OSError:
            return False
        try:
            with open(os.path.join(path, "cgroup.procs"), "w") as fh:
                fh.write(str(os.getpid()))
            return True
        except FileNotFoundError:
            continue
        except OSError:
            break
    remove_cgroup(path)  # an empty attempt cgroup would read as "nothing left": never leave one behind
    return False


def sweep_attempt_cgroups(hierarchy: CgroupHierarchy) -> int:
    """Remove every empty attempt cgroup under ``hierarchy`` (left by agents that died while no zygote was
    there to remove theirs); return how many went. Ones with a member are left alone. Called at zygote
    start: an empty attempt cgroup holds nothing that proof of death needs."""
    try:
        names = os.listdir(hierarchy.root)
    except OSError:
        return 0
    removed = 0
    for name in names:
        path = os.path.join(hierarchy.root, name)
        if os.path.isdir(path) and not cgroup_members(path) and remove_cgroup(path):
            removed += 1
    return removed


def join_attempt_cgroup(hierarchy: CgroupHierarchy, launch_id: str) -> str | None:
    """Move the calling process (an agent, before it forks its task) into ``launch_id``'s attempt cgroup on
    ``hierarchy``; return the cgroup's path, or ``None`` when the kernel refused (the ``/proc`` scan remains).

    :raises ValueError: when ``launch_id`` cannot name a directory.
    """
    path = os.path.join(hierarchy.root, _cgroup_name(launch_id))
    return path if join_cgroup(path) else None


def attempt_cgroups(launch_id: str) -> list[str]:
    """The existing attempt cgroups of ``launch_id`` (at most one per hierarchy of :func:`cgroup_hierarchies`).
    A launch id that cannot name a directory has none."""
    try:
        name = _cgroup_name(launch_id)
    except ValueError:
        return []
    return [p for h in cgroup_hierarchies() if os.path.isdir(p := os.path.join(h.root, name))]


def cgroup_members(path: str) -> list[int]:
    """Pids of the live (not zombie) processes in the cgroup directory ``path``; empty when it is gone."""
    text = _read_text(os.path.join(path, "cgroup.procs")) or ""
    return [int(p) for p in text.split() if p.isdigit() and identity(int(p)) is not None]


def remove_cgroup(path: str) -> bool:
    """Remove the cgroup directory ``path`` if it has no member; True when it is gone (or never existed)."""
    try:
        os.rmdir(path)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True


def kill_cgroup(path: str, timeout: float = 5.0) -> bool:
    """SIGKILL every process in the cgroup directory ``path`` and remove it once empty; True when nothing of
    it is left alive. Uses cgroup2's ``cgroup.kill`` (atomic: nothing forks past it) where the kernel has it,
    else SIGKILL of the member list until it stays empty (a v1 pids cgroup)."""
    kill_file = os.path.join(path, "cgroup.kill")
    deadline = time.monotonic() + timeout
    while True:
        members = cgroup_members(path)
        if not members:
            # the kernel may call the cgroup busy for a moment after its last member exited
            while not remove_cgroup(path) and time.monotonic() < deadline:
                time.sleep(0.02)
            return True
        if time.monotonic() >= deadline:
            return False
        try:
            with open(kill_file, "w") as fh:
                fh.write("1")
        except OSError:
            for pid in members:
                _signal(pid, signal.SIGKILL)
        time.sleep(0.02)


def find_by_title(title: str, table: ProcessTable | None = None) -> list[int]:
    """Pids of live processes whose command line (as ``setproctitle`` leaves it) is ``title`` or starts with
    ``title`` followed by a space, oldest first, from ``table`` (a fresh :class:`ProcessTable` when ``None``).
    A forked agent sets its title to a marker first thing, so a restarted executor can find an agent whose
    zygote died before reporting it."""
    return [i.pid for i in (table or ProcessTable()).by_title(title)]


def find_by_marker(launch_id: str, table: ProcessTable | None = None) -> list[int]:
    """Pids of live processes whose environment carries exactly ``ATTEMPT_ENV=launch_id``, oldest first, from
    ``table`` (a fresh :class:`ProcessTable` when ``None``); see :meth:`ProcessTable.by_marker`."""
    return [i.pid for i in (table or ProcessTable()).by_marker(launch_id)]


def kill_tree(root: ProcessIdentity | int, *, include_root: bool = True, timeout: float = 5.0,
              grace: float = 0.0) -> bool:
    """SIGKILL a whole process subtree, including members that started their own session.

    The tree is frozen first (SIGSTOP on every member, repeated until no new member appears) so nothing can
    fork past us, then every member gets SIGKILL. ``root`` is a :class:`ProcessIdentity` (checked against pid
    reuse: a different process under the same pid is left alone) or a pid whose identity is read now.

    :param include_root: also kill ``root`` itself (False: only its descendants, e.g. a zygote's orphans).
    :param timeout: seconds to wait for the members to disappear.
    :param grace: seconds (0: none, the default) to give ``root`` after a SIGTERM before the SIGKILL, as
        Airflow's supervisor gives a task ``[core] killed_task_cleanup_time`` so its ``on_kill`` runs (an
        agent forwards SIGTERM to its task process). Blocks the caller up to ``grace`` seconds; members of the
        subtree that outlive ``root`` (reparented elsewhere once it exited) are still killed.
    :returns: True when no member is left alive (zombies awaiting their parent's wait count as gone).
    """
    if (root.pid if isinstance(root, ProcessIdentity) else root) <= 1:
        raise ValueError("refusing to kill the subtree of pid 0 or 1 (that is every process on the host)")
    ident = identity(root) if isinstance(root, int) else root
    if ident is None or not is_alive(ident):
        return True
    if grace > 0 and include_root:
        before = [m for p in descendants(ident.pid) if (m := identity(p)) is not None]
        _signal(ident.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while is_alive(ident) and time.monotonic() < deadline:
            time.sleep(0.05)
        root_gone = kill_tree(ident, timeout=timeout)  # first: a live root would fork past the sweep below
        return all([kill_tree(m, timeout=timeout) for m in before if is_alive(m)]) and root_gone
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


def exit_child(body: Callable[[], int], what: str) -> NoReturn:
    """In a freshly forked child: run ``body``, flush stdout and stderr, and ``os._exit`` with its return code
    (1 when it raised: logged with ``what`` and the traceback). Never returns: a forked child must never unwind
    into its parent's code (the zygote's event loop, a file worker's)."""
    code = 1
    try:
        code = body()
    except BaseException:  # noqa: BLE001 - a forked child always exits with a code
        logging.getLogger("leoflow.proc").exception("%s failed", what)
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Ask the kernel to send ``sig`` to this process when its parent dies (``PR_SET_PDEATHSIG``)."""
    _prctl(PR_SET_PDEATHSIG, int(sig))
