"""The zygote's report pipes (``leoflow_agent.zygote``): a pipe closed at its end of stream is never closed or
read again when its agent's exit is handled later, because by then its fd number may be another launch's pipe.

Found by the Lite chaos loop with file workers on: a warm agent's exit is reported by its file worker after
the agent's pipe reached its end, a new launch's pipe had taken the freed fd number meanwhile, and closing it
again cut the new agent's ``started`` line off (``BrokenPipeError`` in the agent, a launch never reported)."""

from __future__ import annotations

import os

from leoflow_agent import protocol
from leoflow_agent.zygote import Zygote


def test_an_agents_late_exit_never_touches_the_pipe_that_reused_its_fd_number(tmp_path):
    zygote = Zygote(str(tmp_path / "z.sock"), preload=False)
    r_old, w_old = os.pipe2(os.O_CLOEXEC)
    old = zygote._track({"launch_id": "old:1:1"}, r_old, worker=None)
    old["pid"] = 999_999  # known (a started agent): its end of stream is not a launch to fork again
    zygote.agents[old["pid"]] = old
    os.close(w_old)
    zygote._read_report(r_old)  # end of stream: the pipe is closed, fd number r_old is free
    assert r_old not in zygote.report_fds

    r_new, w_new = os.pipe2(os.O_CLOEXEC)
    assert r_new == r_old, "the kernel hands out the lowest free fd number: the new pipe reuses it"
    new = zygote._track({"launch_id": "new:1:1"}, r_new, worker=None)
    os.write(w_new, protocol.encode(protocol.ev_message(protocol.Ev.STARTED, launch_id="new:1:1", pid=4242,
                                                        start_time=1)))
    zygote._agent_ended(old, 0)  # the old agent's exit, handled late (its file worker said so)

    assert zygote.report_fds.get(r_new) is new
    os.fstat(r_new)  # still open
    zygote._read_report(r_new)
    assert new["pid"] == 4242 and zygote.agents[4242] is new  # its started line was read, by its own record
    os.close(w_new)
    zygote._read_report(r_new)
    assert r_new not in zygote.report_fds
