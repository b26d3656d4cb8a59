"""How many processes the kernel's OOM killer ended in the agent's own memory cgroup (its container's, on a node).

Why (issue 35, found on the real node): on a node whose kernel kills one process at a memory limit (cgroup v1, or
cgroup v2 without ``memory.oom.group``), the OOM killer ends the largest process of the container, not the whole
container. The container runtime still names the container ``OOMKilled`` (with the agent's own exit code, 0),
which the reconciler settles as an OOM kill. When the killed process is the task process itself, the Task SDK's
supervisor sends no state ("Process terminated by signal. Likely out of memory error"), so that settlement decides.
When it is a process the task started (a Bash command, a tool it runs), the task fails on its own and the
supervisor reports ``failed``: that report would spend a user retry on what the memory limit did. The agent
compares this count at the attempt's start and at its terminal report (``leoflow_agent.transport``): a ``failed``
or ``up_for_retry`` report after an OOM kill is refused, and the reconciler settles the attempt as an OOM kill
(DESIGN §2: re-driven once on the infra budget, failed if OOM-killed again).

Sources: the kernel's cgroup documentation, ``memory.oom_control``'s ``oom_kill`` (cgroup v1, kernel 4.13+) and
``memory.events``' ``oom_kill`` (cgroup v2). Inside a container the agent sees its own cgroup at the mount's root;
on a machine (Lite) at its path under the mount. The root cgroup is never read: a count there would be the whole
machine's, not the attempt's.
"""

from __future__ import annotations

from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def oom_kills(proc_cgroup: Path = Path("/proc/self/cgroup"), root: Path = CGROUP_ROOT) -> int | None:
    """The ``oom_kill`` count of this process's memory cgroup, or None when there is none to read (no memory
    controller, the root cgroup, a kernel without the counter, an unreadable file). Never raises.

    ``proc_cgroup``: ``/proc/<pid>/cgroup``'s text source; ``root``: where the cgroup hierarchies are mounted.
    """
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None
    candidates: list[Path] = []
    for line in lines:
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        path = path.strip().lstrip("/")
        if hierarchy == "0" and controllers == "":  # cgroup v2: the root cgroup has no memory.events
            candidates += [root / path / "memory.events", root / "memory.events"]
        elif "memory" in controllers.split(",") and path:  # cgroup v1, never the root cgroup
            candidates += [root / "memory" / path / "memory.oom_control", root / "memory" / "memory.oom_control"]
    for candidate in candidates:
        count = _oom_kill_count(candidate)
        if count is not None:
            return count
    return None


def _oom_kill_count(path: Path) -> int | None:
    """The value of the ``oom_kill`` line of ``path`` (``memory.events`` or ``memory.oom_control``), or None."""
    try:
        text = path.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill":
            try:
                return int(value)
            except ValueError:
                return None
    return None


class OomWatch:
    """Whether the OOM killer ended a process of this attempt's memory cgroup since :meth:`__init__`.

    ``count``: the reader (:func:`oom_kills`). Reading never raises; without a count at the start or now, the
    answer is False (no evidence of an OOM kill)."""

    def __init__(self, count=oom_kills) -> None:
        self._count = count
        self.start = count()

    def __call__(self) -> bool:
        """True when the count grew since the attempt began."""
        if self.start is None:
            return False
        now = self._count()
        return now is not None and now > self.start
