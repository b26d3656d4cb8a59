"""Helpers shared by the Lite integration tests: a stack on ``tests/dags`` with LeoflowExecutor, and
``/proc`` scans (the tests run as root, so every process is readable)."""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from devtools import procs
from devtools.stack import REPO_ROOT, AirflowStack

TEST_DAGS = REPO_ROOT / "tests" / "dags"
EXECUTOR = "leoflow_airflow.executor.LeoflowExecutor"
AGENT_TITLE = b"leoflow agent "
ZYGOTE_ARGV = b"leoflow_agent\0serve"


def lite_stack(home: Path, *, parallelism: int = 4, extra_env: dict[str, str] | None = None,
               dags_folder: Path = TEST_DAGS) -> AirflowStack:
    """An AirflowStack on ``dags_folder`` (default ``tests/dags``) with LeoflowExecutor (Lite).

    The stack's marker variable is passed through to the zygote (``[leoflow] agent_env_passthrough``) so
    the stack's cleanup finds agents that outlive their zygote.
    """
    env = {"AIRFLOW__LEOFLOW__AGENT_ENV_PASSTHROUGH": procs.MARKER_VAR}
    env.update(extra_env or {})
    return AirflowStack(home, executor=EXECUTOR, parallelism=parallelism, dags_folder=dags_folder, extra_env=env)


@dataclass(frozen=True)
class Proc:
    """One process as read from ``/proc``: pid, parent, session, raw cmdline and environ (NUL-separated)."""

    pid: int
    ppid: int
    sid: int
    state: str
    cmdline: bytes
    environ: bytes

    @property
    def alive(self) -> bool:
        """Not a zombie."""
        return self.state not in ("Z", "X")


def read_proc(pid: int) -> Proc | None:
    """Read one process, or ``None`` when it vanished."""
    base = f"/proc/{pid}"
    try:
        with open(f"{base}/stat", "rb") as fh:
            raw = fh.read()
        rest = raw[raw.rindex(b")") + 2:].split()
        with open(f"{base}/cmdline", "rb") as fh:
            cmdline = fh.read()
        with open(f"{base}/environ", "rb") as fh:
            environ = fh.read()
    except (OSError, ValueError):
        return None
    return Proc(pid, int(rest[1]), int(rest[3]), rest[0].decode(), cmdline, environ)


def all_procs() -> list[Proc]:
    """Every process on the machine (except vanished ones)."""
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit() and (p := read_proc(int(name))) is not None:
            out.append(p)
    return out


def descendants(pid: int, table: list[Proc] | None = None) -> list[Proc]:
    """Every live descendant of ``pid`` by parent links."""
    table = all_procs() if table is None else table
    kids: dict[int, list[Proc]] = {}
    for p in table:
        kids.setdefault(p.ppid, []).append(p)
    out, stack = [], list(kids.get(pid, []))
    while stack:
        p = stack.pop()
        out.append(p)
        stack.extend(kids.get(p.pid, []))
    return [p for p in out if p.alive]


def stack_procs(stack: AirflowStack) -> list[Proc]:
    """Live processes that carry this stack's marker variable."""
    marker = f"{procs.MARKER_VAR}={stack.stack_id}".encode()
    return [p for p in all_procs() if p.alive and marker in p.environ.split(b"\0")]


def agents(stack: AirflowStack) -> list[Proc]:
    """Live leoflow agents (process title ``leoflow agent <launch id> ...``) under this stack's running zygote.

    Found through the zygote: ``setproctitle`` reuses the agent's environ area for its title, so an agent's
    ``/proc/<pid>/environ`` no longer shows the stack marker. Agents that outlived their zygote are not
    listed: track those by the identities taken while the zygote ran.
    """
    table = all_procs()
    return [p for z in zygotes(stack) for p in descendants(z.pid, table) if p.cmdline.startswith(AGENT_TITLE)]


def zygotes(stack: AirflowStack) -> list[Proc]:
    """Live zygotes of this stack (``python -m leoflow_agent serve``). A file worker (a fork of its zygote,
    :mod:`leoflow_agent.warm`) shows the zygote's command line until it sets its title a moment later: a match
    whose parent is a match is one, not a zygote."""
    found = [p for p in stack_procs(stack) if ZYGOTE_ARGV in p.cmdline]
    pids = {p.pid for p in found}
    return [p for p in found if p.ppid not in pids]


def scheduler(stack: AirflowStack) -> Proc:
    """The stack's scheduler process (``airflow scheduler``)."""
    found = [p for p in stack_procs(stack) if p.cmdline.endswith(b"\0airflow\0scheduler\0")]
    assert len(found) == 1, [p.cmdline for p in found]
    return found[0]


def zygote_file(stack: AirflowStack, name: str, scheduler_pid: int | None = None) -> Path:
    """``name`` (``zygote.log``, ``zygote.pid``, ``zygote.sock``) in the zygote directory of the stack's
    scheduler (``runtime_dir/zygotes/<scheduler pid>``, the default ``runtime_dir``); ``scheduler_pid`` picks
    one scheduler when the stack runs several."""
    pid = scheduler(stack).pid if scheduler_pid is None else scheduler_pid
    return stack.home / "leoflow" / "zygotes" / str(pid) / name


def wait_for(predicate, timeout: float, what: str, poll: float = 0.5):
    """Poll until ``predicate()`` is truthy and return it; ``AssertionError`` naming ``what`` on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(poll)


def spawn_in_stack(stack: AirflowStack, name: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen:
    """Start one more process under the stack's ownership (log ``process-logs/<name>.log``; stopped by
    ``stack.stop()`` like the stack's own)."""
    popen = procs.spawn(argv, env=env, log_path=stack.process_logs / f"{name}.log", cwd=stack.home)
    stack._popens.append(popen)  # noqa: SLF001 - devtools is ours; stop() then covers this process too
    stack._names.append(name)  # noqa: SLF001
    return popen


def log_text(stack: AirflowStack, name: str) -> str:
    """The text of ``process-logs/<name>.log`` (empty if missing)."""
    path = stack.process_logs / f"{name}.log"
    return path.read_text(errors="replace") if path.exists() else ""
