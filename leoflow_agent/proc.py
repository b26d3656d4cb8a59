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

    def __post_init__(self) -> None:
        # pid 0 is no process and pid 1 is init: a session id or subtree of either covers the whole host,
        # so an identity naming them would make proof of death or a kill reach every process
        if self.pid <= 1:
            raise ValueError(f"refusing a process identity for pid {self.pid}")


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


def attempt_leftovers(agent: ProcessIdentity, launch_id: str, *, use_cgroup: bool = True) -> list[int]:
    """Pids of live processes left over from the attempt whose agent ``agent`` is dead, found without any
    parent link (its orphans reparent to init when no zygote was there to reap them, e.g. while the scheduler
    was down).

    When the attempt has a cgroup (:func:`join_attempt_cgroup`, issue 8 hole 13) its member list is the
    answer: no process leaves a cgroup by changing its session or environment. An empty attempt cgroup is
    removed here (the attempt is over). Otherwise, or with ``use_cgroup=False``, the scan of ``/proc`` finds
    members of the agent's session that started after it (the task child) and processes whose environment
    carries ``ATTEMPT_ENV=launch_id`` (an exec'd descendant in a new session, e.g. ``bash``); it misses a
    descendant that started its own session *and* replaced its environment (``BashOperator(env=...)``).

    The session test is skipped while any process holds the agent's pid: Linux never reuses a pid still used
    as a session id, so a live holder means the old session is empty and the id belongs to someone else.
    """
    if use_cgroup:
        groups = attempt_cgroups(launch_id)
        if groups:
            members = sorted({p for path in groups for p in cgroup_members(path)} - {os.getpid()})
            members = [p for p in members if not (p == agent.pid and is_alive(agent))]
            if not members:
                for path in groups:
                    remove_cgroup(path)
            return members
    return _scan_leftovers(agent, launch_id)


def _scan_leftovers(agent: ProcessIdentity, launch_id: str) -> list[int]:
    """The ``/proc`` scan of :func:`attempt_leftovers` (session members and marker carriers)."""
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


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Ask the kernel to send ``sig`` to this process when its parent dies (``PR_SET_PDEATHSIG``)."""
    _prctl(PR_SET_PDEATHSIG, int(sig))
