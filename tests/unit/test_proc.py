"""Process identity and tree control on real Linux processes (DESIGN §3: pid + start time, zombies are dead,
a subtree is killed even where members started their own session)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from leoflow_agent import proc

PY = sys.executable


def wait_for(predicate, timeout: float = 10.0, what: str = "condition"):
    """Poll ``predicate`` until it returns a truthy value; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    pytest.fail(f"timed out waiting for {what}")


def stat_state(pid: int) -> str | None:
    """The one-letter state of ``pid`` from /proc, or None when it is gone."""
    st = proc._read_stat(pid)
    return None if st is None else st[0]


@pytest.fixture
def sleeper():
    """A plain child process sleeping 600 s, killed and reaped after the test."""
    p = subprocess.Popen(["sleep", "600"])
    yield p
    p.kill()
    p.wait()


def test_identity_of_a_live_process(sleeper):
    """identity() reads pid + kernel start time; start_time agrees; is_alive holds."""
    ident = proc.identity(sleeper.pid)
    assert ident is not None and ident.pid == sleeper.pid
    assert ident.start_time == proc.start_time(sleeper.pid) > 0
    assert proc.is_alive(ident)
    me = proc.identity(os.getpid())
    assert me is not None and me.start_time <= ident.start_time


def test_pid_reuse_is_guarded_by_start_time(sleeper):
    """An identity with the same pid but another start time is NOT alive, and kill_tree leaves the
    process that now owns the pid alone."""
    real = proc.identity(sleeper.pid)
    assert real is not None
    for other in (proc.ProcessIdentity(sleeper.pid, real.start_time - 1),
                  proc.ProcessIdentity(sleeper.pid, real.start_time + 1)):
        assert not proc.is_alive(other)
        assert proc.kill_tree(other, timeout=0.5) is True  # nothing of *that* process is left
    time.sleep(0.1)
    assert sleeper.poll() is None and proc.is_alive(real)


def test_gone_pid_is_dead():
    """A reaped process is dead; its stale identity stays dead; start_time is None."""
    p = subprocess.Popen(["true"])
    ident = wait_for(lambda: proc.identity(p.pid) or (p.poll() is not None and "gone"), what="start")
    p.wait()
    assert proc.start_time(p.pid) is None or proc.identity(p.pid) != ident
    if isinstance(ident, proc.ProcessIdentity):
        assert not proc.is_alive(ident)


def test_zombie_counts_as_dead():
    """A child that exited but was not reaped (state Z) is dead for identity() and is_alive()."""
    p = subprocess.Popen([PY, "-c", "import time; time.sleep(0.3)"])
    ident = proc.identity(p.pid)
    assert ident is not None and proc.is_alive(ident)
    wait_for(lambda: stat_state(p.pid) == "Z", what="the child to become a zombie")
    try:
        assert proc.start_time(p.pid) == ident.start_time  # still in /proc ...
        assert proc.identity(p.pid) is None                # ... but dead
        assert not proc.is_alive(ident)
        assert proc.kill_tree(ident) is True
    finally:
        p.wait()


def test_descendants_and_children():
    """descendants() follows parent links through grandchildren; children() only one level."""
    p = subprocess.Popen(["sh", "-c", "sleep 600 & sleep 600 & wait"])
    try:
        kids = wait_for(lambda: c if len(c := proc.children(p.pid)) == 2 else None, what="two children")
        assert set(proc.descendants(p.pid)) == set(kids)
        assert proc.descendants(kids[0]) == []
    finally:
        proc.kill_tree(p.pid)
        p.wait()


def test_children_include_zombies_and_match_the_proc_scan_without_scanning():
    """children() lists the same pids as a /proc scan, zombies (exited, not yet reaped) included, and on a kernel
    that keeps each thread's children list (the bench and CI hosts) it reads that instead of scanning /proc: the
    zygote asks after every agent's exit."""
    if not os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children"):
        pytest.skip("this kernel has no /proc/<pid>/task/<tid>/children (CONFIG_PROC_CHILDREN)")
    p = subprocess.Popen(["sh", "-c", "sleep 600 & true & sleep 600 & kill -STOP $$"])
    try:
        # the exited `true` stays a zombie: its parent is stopped and cannot reap it
        kids = wait_for(lambda: c if len(c := proc.children(p.pid)) == 3 and any(stat_state(k) == "Z" for k in c)
                        else None, what="three children, one of them a zombie")
        scans = proc.scan_count()
        assert sorted(proc.children(p.pid)) == sorted(kids) == sorted(proc._children_map()[p.pid])
        assert proc.scan_count() == scans + 1  # the one scan is the comparison's own
    finally:
        proc.kill_tree(p.pid)
        p.wait()


def test_kill_tree_kills_a_child_that_called_setsid():
    """A member in its own session (as BashOperator's bash) dies with the tree."""
    p = subprocess.Popen(["sh", "-c", "setsid sleep 600 & wait"])
    try:
        child = wait_for(lambda: next(iter(proc.children(p.pid)), None), what="the setsid child")
        wait_for(lambda: os.getsid(child) == child, what="the child to lead its own session")
        assert os.getsid(child) != os.getsid(p.pid)
        child_ident = proc.identity(child)
        assert proc.kill_tree(p.pid) is True
        p.wait(timeout=5)
        assert p.returncode == -signal.SIGKILL
        assert not proc.is_alive(child_ident)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


SUBREAPER_AGENT = textwrap.dedent("""
    import os, subprocess, sys, time
    from leoflow_agent import proc
    proc.become_subreaper()
    # like BashOperator: a shell that puts its work in a new session and exits at once
    subprocess.run(["sh", "-c", "setsid sleep 600 > /dev/null 2>&1 < /dev/null &"], check=True)
    print("ready", flush=True)
    time.sleep(600)
""")


def test_kill_tree_reaches_an_orphan_reparented_to_a_subreaper():
    """The orphan of a setsid'd grandchild reparents to the subreaper (the agent), so kill_tree(agent)
    still finds and kills it: nothing of the attempt is left."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")]))
    agent = subprocess.Popen([PY, "-c", SUBREAPER_AGENT], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert agent.stdout.readline().strip() == "ready"
        orphan = wait_for(
            lambda: next((c for c in proc.children(agent.pid) if stat_state(c) not in ("Z", None)
                          and open(f"/proc/{c}/cmdline", "rb").read().startswith(b"sleep\0")), None),
            what="the setsid'd sleep to reparent to the subreaper",
        )
        orphan_ident = proc.identity(orphan)
        assert os.getsid(orphan) == orphan != os.getsid(agent.pid)
        assert proc.kill_tree(proc.identity(agent.pid)) is True
        agent.wait(timeout=5)
        assert not proc.is_alive(orphan_ident)
    finally:
        if agent.poll() is None:
            proc.kill_tree(agent.pid)
            agent.wait()


def test_kill_tree_without_root_keeps_the_root():
    """include_root=False kills only the descendants (the zygote's orphan sweep)."""
    p = subprocess.Popen(["sh", "-c", "sleep 600 & sleep 600 & wait; sleep 600"])
    try:
        kids = wait_for(lambda: c if len(c := proc.children(p.pid)) == 2 else None, what="two children")
        idents = [proc.identity(k) for k in kids]
        assert proc.kill_tree(p.pid, include_root=False) is True
        assert not any(proc.is_alive(i) for i in idents)
        assert p.poll() is None and proc.identity(p.pid) is not None
    finally:
        proc.kill_tree(p.pid)
        p.wait()


def session_members(sid: int) -> list[int]:
    """Live (non-zombie) pids whose session id is ``sid``."""
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.getsid(int(name)) == sid and stat_state(int(name)) not in (None, "Z", "X"):
                    out.append(int(name))
            except ProcessLookupError:
                continue
    return out


def test_kill_tree_catches_a_forking_tree():
    """A tree that keeps forking as fast as it can is frozen before it is killed: nothing escapes (checked
    by its session: no live process of it is left, not even one reparented to init)."""
    p = subprocess.Popen(["sh", "-c", "while true; do sleep 600 & done"], start_new_session=True)
    try:
        wait_for(lambda: len(proc.descendants(p.pid)) >= 20, what="a busy tree")
        assert proc.kill_tree(p.pid) is True
        p.wait(timeout=5)
        time.sleep(0.2)
        assert session_members(p.pid) == []
    finally:
        for pid in session_members(p.pid):
            os.kill(pid, signal.SIGKILL)
        if p.poll() is None:
            p.kill()
            p.wait()


def test_die_with_parent():
    """PR_SET_PDEATHSIG: a process that asked for it gets the signal when its parent dies."""
    code = textwrap.dedent("""
        import os, subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c",
            "import signal, time; from leoflow_agent import proc; proc.die_with_parent(signal.SIGKILL); "
            "print('armed', flush=True); time.sleep(600)"], stdout=subprocess.PIPE, text=True)
        assert child.stdout.readline().strip() == "armed"
        print(child.pid, flush=True)
        os._exit(0)
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([PY, "-c", code], capture_output=True, text=True, env=env, timeout=30)
    pid = int(out.stdout.strip())
    wait_for(lambda: stat_state(pid) in (None, "Z"), what="the child to die with its parent")


def test_find_by_title_finds_a_process_by_its_setproctitle_marker():
    """A restarted executor finds an agent its dead zygote never reported by the agent's title marker."""
    import subprocess
    import sys
    import time

    from leoflow_agent import proc as _proc

    code = ("from setproctitle import setproctitle; import time; "
            "setproctitle('leoflow agent 0190abcd:1:1 dag.task'); time.sleep(30)")
    child = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not _proc.find_by_title("leoflow agent 0190abcd:1:1"):
            time.sleep(0.05)
        assert _proc.find_by_title("leoflow agent 0190abcd:1:1") == [child.pid]
        assert _proc.find_by_title("leoflow agent 0190abcd:1:12") == []  # epoch 12 is another attempt
        assert _proc.find_by_title("leoflow agent 0190abcd:1") == []
    finally:
        child.kill()
        child.wait()
    assert _proc.find_by_title("leoflow agent 0190abcd:1:1") == []


# An "agent" that, like the Task SDK supervisor's ActivitySubprocess.wait(), forwards SIGTERM to its task
# process; the task's SIGTERM handler is its on_kill (Airflow's task_runner installs one that calls
# ti.task.on_kill() and carries on), which writes a marker and keeps running, so only SIGKILL ends it.
FORWARDING_AGENT = textwrap.dedent("""
    import os, signal, sys, time
    marker, ready = sys.argv[1], sys.argv[2]
    task = os.fork()
    if task == 0:
        signal.signal(signal.SIGTERM, lambda *_: open(marker, "w").write("on_kill ran"))
        open(ready, "w").close()
        while True:
            time.sleep(1)
    signal.signal(signal.SIGTERM, lambda *_: os.kill(task, signal.SIGTERM))
    while True:
        time.sleep(1)
""")


@pytest.mark.parametrize("grace", [0.0, 2.0])
def test_kill_tree_with_a_grace_lets_the_task_run_on_kill_first(tmp_path, grace):
    """Issue 8 hole 16: with ``grace`` the root gets SIGTERM first, which reaches the task's on_kill, and the
    whole subtree is SIGKILLed after the grace even though the task ignores the SIGTERM. Without one (the
    default, unchanged) on_kill never runs."""
    marker, ready = tmp_path / "marker", tmp_path / "ready"
    p = subprocess.Popen([PY, "-c", FORWARDING_AGENT, str(marker), str(ready)])
    try:
        wait_for(ready.exists, what="the task process")
        (task,) = proc.children(p.pid)
        task_ident = proc.identity(task)
        assert proc.kill_tree(p.pid, grace=grace) is True
        assert not proc.is_alive(task_ident)
        assert marker.exists() is (grace > 0)
    finally:
        proc.kill_tree(p.pid)
        p.wait()


def test_pid_0_and_init_are_never_a_process_identity_or_a_kill_target() -> None:
    """A made-up identity of pid 0 once made proof of death take every session-0 process on the host as an
    attempt's leftovers, and its kill reached init's subtree: both are refused outright."""
    for pid in (0, 1):
        with pytest.raises(ValueError):
            proc.ProcessIdentity(pid, 1)
        with pytest.raises(ValueError):
            proc.kill_tree(pid)
        assert proc.identity(pid) is None
