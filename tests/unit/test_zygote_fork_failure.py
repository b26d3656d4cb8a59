"""A real zygote whose forks fail (issue 8, hole 8): it runs inside a v1 ``pids`` cgroup whose ``pids.max``
is its own process count, so ``fork()`` fails with EAGAIN exactly as under systemd ``TasksMax`` or a
container's pids limit. The failed launch goes back to the executor as a *retryable* ``launch_failed`` and
the launches behind it stay held (not drained into more failed forks) until forks work again."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
import uuid

import pytest

from zygote_client import ZygoteClient

PIDS_ROOT = "/sys/fs/cgroup/pids"

# the zygote moves itself into the test's pids cgroup first, then serves (no Task SDK preload: its agents
# exit at once, which is all this test needs of them)
ZYGOTE = textwrap.dedent("""
    import os, sys
    cgroup, sock, backoff = sys.argv[1], sys.argv[2], float(sys.argv[3])
    with open(os.path.join(cgroup, "cgroup.procs"), "w") as fh:
        fh.write(str(os.getpid()))
    from leoflow_agent import handoff
    from leoflow_agent.zygote import Zygote
    if backoff:  # a test that must see launches held, whatever the machine's load, pauses for longer
        handoff.fork_backoff = lambda failures, **_: backoff
    sys.exit(Zygote(sock, preload=False).serve())
""")


def start_zygote(tmp_path, cgroup: str, backoff: float = 0.0) -> tuple[subprocess.Popen, ZygoteClient]:
    """A zygote in ``cgroup``, its hello read, every fork failing from now on (``pids.max`` = its count)."""
    sock_path = str(tmp_path / "zygote.sock")
    zygote = subprocess.Popen([sys.executable, "-c", ZYGOTE, cgroup, sock_path, str(backoff)])
    conn = ZygoteClient(sock_path)
    assert conn.next()["ev"] == "hello"
    current = open(os.path.join(cgroup, "pids.current")).read().strip()
    _write(os.path.join(cgroup, "pids.max"), current)
    return zygote, conn


def launch(n: int) -> dict:
    return {"op": "launch", "launch_id": f"l{n}", "workload": "{}", "server": "http://127.0.0.1:9"}


def _write(path: str, value: str) -> None:
    with open(path, "w") as fh:
        fh.write(value)


@pytest.fixture
def pids_cgroup():
    if not os.access(PIDS_ROOT, os.W_OK):
        pytest.skip("no writable cgroup v1 pids hierarchy")
    path = os.path.join(PIDS_ROOT, f"leoflow-test-{uuid.uuid4().hex[:12]}")
    os.mkdir(path)
    yield path
    for pid in open(os.path.join(path, "cgroup.procs")).read().split():
        try:
            os.kill(int(pid), 9)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 10
    while True:
        try:
            os.rmdir(path)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def test_a_failed_fork_is_retryable_and_the_launches_behind_it_stay_held(tmp_path, pids_cgroup):
    """Three held launches are released at once (what a raised limit or a freed slot does). Before the fix
    the first failed fork freed its place for the next and all three failed in one burst, each through
    Airflow's killed-externally path. Now only the first comes back, retryable; the others are still held,
    as a ``kill`` of each shows ("killed before it was forked")."""
    zygote, conn = start_zygote(tmp_path, pids_cgroup, backoff=3600.0)
    try:
        conn.send({"op": "limit", "max_agents": 0})
        for n in (1, 2, 3):
            conn.send(launch(n))
        conn.send({"op": "limit", "max_agents": 3})
        first = conn.next()
        assert first["ev"] == "launch_failed" and first["launch_id"] == "l1", first
        assert first["retryable"] is True and "fork failed" in first["error"], first
        for n in (2, 3):
            conn.send({"op": "kill", "launch_id": f"l{n}"})
            event, _ = conn.until(f"l{n}", ("launch_failed", "launched"))
            assert event["ev"] == "launch_failed" and event["error"] == "killed before it was forked", event
            assert event["retryable"] is False
    finally:
        zygote.kill()
        zygote.wait(timeout=10)


def test_held_launches_are_forked_once_forks_work_again(tmp_path, pids_cgroup):
    """With the real back-off: once the pids limit is lifted, the held launches are forked by the zygote
    itself (no new message needed). Every fork failure on the way is retryable, never a task failure."""
    zygote, conn = start_zygote(tmp_path, pids_cgroup)
    try:
        conn.send({"op": "limit", "max_agents": 0})
        for n in (1, 2, 3):
            conn.send(launch(n))
        conn.send({"op": "limit", "max_agents": 3})
        _, seen = conn.until("l1", ("launch_failed",))
        _write(os.path.join(pids_cgroup, "pids.max"), "max")  # the limit is lifted
        conn.send(launch(4))  # arrives during (or after) the pause: held, then forked at the retry
        _, more = conn.until("l4", ("launched",))
        failed = [e for e in seen + more if e["ev"] == "launch_failed"]
        assert failed and all(e["retryable"] is True and "fork failed" in e["error"] for e in failed), failed
        launched = {e["launch_id"] for e in more if e["ev"] == "launched"}
        assert launched | {e["launch_id"] for e in failed} >= {"l1", "l2", "l3", "l4"}, (seen, more)
    finally:
        zygote.kill()
        zygote.wait(timeout=10)
