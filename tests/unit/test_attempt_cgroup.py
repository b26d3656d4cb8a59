"""Proof of death with per-attempt cgroups (issue 8, hole 13), on real processes and the host's real cgroup
hierarchies: a grandchild that starts its own session *and* replaces its environment (what
``BashOperator(env=...)``'s ``bash`` does) escapes the ``/proc`` scan but never its attempt's cgroup."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import uuid

import pytest

from leoflow_agent import proc
from test_proc import wait_for

HIERARCHIES = proc.cgroup_hierarchies()

AGENT = textwrap.dedent("""
    import os, sys, time
    from leoflow_agent import proc
    version, root, launch_id, pidfile = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    # as a forked agent does: join the attempt's cgroup first, then a new session and the attempt marker
    assert proc.join_attempt_cgroup(proc.CgroupHierarchy(version, root), launch_id)
    os.setsid()
    os.environ[proc.ATTEMPT_ENV] = launch_id
    task = os.fork()
    if task == 0:  # the task process, in the agent's session, carrying the marker
        r, w = os.pipe()
        bash = os.fork()
        if bash == 0:  # BashOperator(env=...): start_new_session=True and a replaced environment
            os.setsid()
            os.execve("/bin/sleep", ["sleep", "600"], {"ONLY": "this"})
        time.sleep(600)
        os._exit(0)
    # wait for the grandchild to exist, then report the tree and die as an OOM-killed agent would
    while True:
        kids = [int(p) for p in open(f"/proc/{task}/task/{task}/children").read().split()]
        if kids and open(f"/proc/{kids[0]}/cmdline", "rb").read().startswith(b"sleep"):
            break
        time.sleep(0.02)
    with open(pidfile + ".tmp", "w") as fh:
        fh.write(f"{os.getpid()} {task} {kids[0]}")
    os.rename(pidfile + ".tmp", pidfile)
    time.sleep(600)
""")


def start_attempt(tmp_path, hierarchy: proc.CgroupHierarchy, launch_id: str) -> tuple[subprocess.Popen, list[int]]:
    """Start the AGENT script for ``launch_id`` on ``hierarchy``; return it and ``[agent, task, bash]``."""
    pidfile = tmp_path / "pids"
    agent_proc = subprocess.Popen([sys.executable, "-c", AGENT, str(hierarchy.version), hierarchy.root, launch_id,
                                   str(pidfile)])
    wait_for(lambda: pidfile.exists() or agent_proc.poll() is not None, what="the agent's process tree")
    assert agent_proc.poll() is None, "the agent could not build its tree"
    return agent_proc, list(map(int, pidfile.read_text().split()))


@pytest.mark.skipif(not HIERARCHIES, reason="no cgroup2 or v1 pids hierarchy mounted here")
@pytest.mark.parametrize("hierarchy", HIERARCHIES, ids=[f"v{h.version}" for h in HIERARCHIES])
def test_a_grandchild_in_a_new_session_with_a_clean_environment_is_found_only_by_the_cgroup(tmp_path, hierarchy):
    if not os.access(os.path.dirname(hierarchy.root), os.W_OK):
        pytest.skip(f"{hierarchy.root} is not writable here")
    launch_id = f"{uuid.uuid4()}:1:1"
    agent_proc, (agent_pid, task, bash) = start_attempt(tmp_path, hierarchy, launch_id)
    try:
        agent = proc.identity(agent_pid)
        assert agent is not None
        cgroup = os.path.join(hierarchy.root, launch_id)
        assert sorted(proc.cgroup_members(cgroup)) == sorted([agent_pid, task, bash])
        # the agent's process group is SIGKILLed (an OOM kill of the agent and its task process, or a kill of
        # the group by hand); the grandchild, in a session and group of its own, lives on as an orphan of init
        os.killpg(agent_pid, signal.SIGKILL)
        agent_proc.wait(timeout=10)
        wait_for(lambda: proc.identity(task) is None, what="the task process to die")

        # today's /proc scan: no session link, no marker, no parent link: the grandchild is not found
        assert bash not in proc.attempt_leftovers(agent, launch_id, use_cgroup=False)
        # the attempt's cgroup still has it
        assert proc.attempt_leftovers(agent, launch_id) == [bash]

        for pid in proc.attempt_leftovers(agent, launch_id):
            assert proc.kill_tree(pid)
        wait_for(lambda: not proc.cgroup_members(cgroup), what="the attempt's cgroup to empty")
        assert proc.attempt_leftovers(agent, launch_id) == []  # dead, and the empty cgroup is removed
        assert not os.path.exists(cgroup)
    finally:
        for path in proc.attempt_cgroups(launch_id):
            proc.kill_cgroup(path)
        agent_proc.kill()
        agent_proc.wait(timeout=10)


def test_kill_cgroup_kills_every_member_and_removes_it(tmp_path):
    """What the zygote does once an agent is gone: every member dies (even a new-session one) and the cgroup
    directory goes away."""
    hierarchy = proc.probe_cgroup()
    if hierarchy is None:
        pytest.skip("no usable cgroup hierarchy here")
    launch_id = f"{uuid.uuid4()}:1:1"
    agent_proc, pids = start_attempt(tmp_path, hierarchy, launch_id)
    try:
        (cgroup,) = proc.attempt_cgroups(launch_id)
        assert proc.kill_cgroup(cgroup)
        agent_proc.wait(timeout=10)
        assert not os.path.exists(cgroup)
        wait_for(lambda: all(proc.identity(p) is None for p in pids), what="every member to be gone")
    finally:
        for path in proc.attempt_cgroups(launch_id):
            proc.kill_cgroup(path)
        agent_proc.kill()
        agent_proc.wait(timeout=10)


def test_a_launch_id_that_cannot_name_a_directory_is_refused_and_has_no_cgroup():
    hierarchy = proc.CgroupHierarchy(2, "/nonexistent/leoflow")
    for bad in ("", ".", "..", "a/b"):
        with pytest.raises(ValueError):
            proc.join_attempt_cgroup(hierarchy, bad)
        assert proc.attempt_cgroups(bad) == []


def test_a_sweep_removes_only_empty_attempt_cgroups(tmp_path):
    """Agents that died while no zygote ran leave empty attempt cgroups; the next zygote's sweep removes
    those and never one with a live member."""
    hierarchy = proc.probe_cgroup()
    if hierarchy is None:
        pytest.skip("no usable cgroup hierarchy here")
    empty = os.path.join(hierarchy.root, f"{uuid.uuid4()}:1:1")
    os.makedirs(empty)
    launch_id = f"{uuid.uuid4()}:1:1"
    agent_proc, pids = start_attempt(tmp_path, hierarchy, launch_id)
    try:
        proc.sweep_attempt_cgroups(hierarchy)  # its count is not asserted: a zygote starting beside this test
        assert not os.path.exists(empty)       # (another test's stack on this host) may sweep the empty one first
        (live,) = proc.attempt_cgroups(launch_id)
        assert sorted(proc.cgroup_members(live)) == sorted(pids)
    finally:
        for path in proc.attempt_cgroups(launch_id):
            proc.kill_cgroup(path)
        agent_proc.kill()
        agent_proc.wait(timeout=10)
        proc.remove_cgroup(empty)
