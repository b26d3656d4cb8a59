"""``proc.attempt_leftovers`` finds what is left of an attempt whose agent died with nobody to reap its
orphans (real processes): its session's members and exec'd descendants carrying the attempt's marker."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

from leoflow_agent import proc


def _wait(pred, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return False


def test_marker_in_environment_and_session_members_are_found_and_killed(tmp_path):
    pidfile = tmp_path / "pids"
    # an "agent": new session, one forked member in its session, one exec'd marker carrier in a new session;
    # the agent then exits, leaving both orphaned
    script = textwrap.dedent(f"""
        import os, subprocess, sys, time
        os.setsid()
        member = os.fork()
        if member == 0:
            time.sleep(60); os._exit(0)
        env = dict(os.environ, {proc.ATTEMPT_ENV}="launch-1")
        carrier = subprocess.Popen(["sleep", "60"], env=env, start_new_session=True).pid
        open({str(pidfile)!r}, "w").write(f"{{os.getpid()}} {{member}} {{carrier}}")
        time.sleep(0.5)
        os._exit(0)
    """)
    agent_proc = subprocess.Popen([sys.executable, "-c", script])
    assert _wait(lambda: pidfile.exists() and len(pidfile.read_text().split()) == 3)
    agent_pid, member, carrier = map(int, pidfile.read_text().split())
    start = proc.start_time(agent_pid)
    agent_proc.wait(timeout=10)
    agent = proc.ProcessIdentity(agent_pid, start or 0)
    try:
        left = proc.attempt_leftovers(agent, "launch-1")
        assert member in left and carrier in left, (left, member, carrier)
        assert proc.attempt_leftovers(agent, "launch-2") == [member]  # another attempt's marker: session only
        for pid in left:
            assert proc.kill_tree(pid)
        assert _wait(lambda: not proc.attempt_leftovers(agent, "launch-1"))
    finally:
        for pid in (member, carrier):
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
