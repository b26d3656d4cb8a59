"""``LiteRuntime.observe`` answers from one process-table snapshot per pass (issue 8's seam: "one ``/proc`` scan
per cycle"), and a CLAIMED attempt's agent is located by its title marker or, untitled, by its
``LEOFLOW_ATTEMPT`` environment marker: never another attempt's process, never an unrelated one. Real
processes throughout; scans are counted through ``proc.scan_count()``, the statistic every full ``/proc`` listing
bumps. The zygote is never started, and observing never signals a process found by a marker."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import uuid

import pytest
import sqlalchemy as sa

from leoflow_agent import proc
from leoflow_agent.protocol import agent_title_marker
from leoflow_airflow import settings as leoflow_settings
from leoflow_airflow.ledger.models import metadata
from leoflow_airflow.ledger.states import AttemptState
from leoflow_airflow.ledger.store import LedgerStore
from leoflow_airflow.lifecycle.runtime import Presence, launch_id
from leoflow_airflow.runtime.lite import LiteRuntime


class _World:
    """A SQLite ledger, a Lite runtime that never launched anything, and the real processes a test starts."""

    def __init__(self, tmp_path):
        self.engine = sa.create_engine(f"sqlite:///{tmp_path / 'ledger.db'}")
        metadata.create_all(self.engine)
        self.ledger = LedgerStore(self.engine)
        settings = leoflow_settings.load(get=lambda s, k, f: {"runtime_dir": str(tmp_path / "rt")}.get(k, f))
        self.runtime = LiteRuntime(settings, parallelism=2, mint=lambda w, t: "{}", server=lambda: "http://x/")
        self.procs: list[subprocess.Popen] = []

    def claimed(self):
        """A new CLAIMED attempt (no pid) of a new ti_id, stamped with no host (this host's)."""
        return self.ledger.claim_epoch(ti_id=str(uuid.uuid4()), try_number=1, dag_id="d", task_id="t", run_id="r",
                                       map_index=-1, runtime="lite", workload_json="{}", scheduler_job_id=1)

    def dispatched(self, agent: proc.ProcessIdentity):
        """A new DISPATCHED attempt whose recorded agent is ``agent``."""
        attempt = self.claimed()
        assert self.ledger.transition(attempt.ref, expected=[AttemptState.CLAIMED], to=AttemptState.DISPATCHED,
                                      pid=agent.pid, proc_start_time=agent.start_time)
        return self.ledger.get(attempt.ref)

    def spawn(self, *, title: str | None = None, env: dict[str, str] | None = None,
              args: tuple[str, ...] = ()) -> proc.ProcessIdentity:
        """A sleeping Python process, titled ``title`` (``setproctitle``) or left untitled, with ``env`` added
        to its exec-time environment; returns once it runs (and carries its title)."""
        code = textwrap.dedent(f"""
            import sys, time
            if {title!r} is not None:
                from setproctitle import setproctitle
                setproctitle({title!r})
            print("ready", flush=True)
            time.sleep(120)
        """)
        child = subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE, text=True,
                                 env=dict(os.environ, **(env or {})))
        self.procs.append(child)
        assert child.stdout.readline().strip() == "ready", child.poll()
        ident = proc.identity(child.pid)
        assert ident is not None
        return ident

    def dead_agent(self) -> proc.ProcessIdentity:
        """The identity of a process that ran and was reaped (no session of its own, nothing left of it)."""
        ident = self.spawn()
        child = self.procs.pop()
        child.kill()
        child.wait()
        return ident

    def all_running(self) -> bool:
        return all(p.poll() is None for p in self.procs)

    def close(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        self.engine.dispose()


@pytest.fixture
def world(tmp_path):
    w = _World(tmp_path)
    yield w
    w.close()


def test_one_observe_over_many_attempts_scans_proc_once(world):
    """Titled agents, untitled ones (environment marker only), CLAIMED rows with nothing running, dead agents
    with nothing left and live agents, three of each: one pass answers all of them from one ``/proc`` scan
    (before the snapshot, each CLAIMED lookup and each dead agent's leftover search was a scan of its own)."""
    titled = [world.claimed() for _ in range(3)]
    for a in titled:
        world.spawn(title=f"{agent_title_marker(launch_id(a.ref))} dag.task map_index=-1")
    untitled = [world.claimed() for _ in range(3)]
    for a in untitled:
        world.spawn(env={proc.ATTEMPT_ENV: launch_id(a.ref)})
    nothing = [world.claimed() for _ in range(3)]
    dead = [world.dispatched(world.dead_agent()) for _ in range(3)]
    live = [world.dispatched(world.spawn()) for _ in range(3)]

    before = proc.scan_count()
    presence = world.runtime.observe(titled + untitled + nothing + dead + live)
    assert proc.scan_count() - before == 1

    assert presence == {**{a.ref: Presence.LIVE for a in titled + untitled + live},
                        **{a.ref: Presence.GONE for a in nothing + dead}}
    assert world.all_running()  # looked at, never signalled

    before = proc.scan_count()
    assert world.runtime.observe(live) == {a.ref: Presence.LIVE for a in live}
    assert proc.scan_count() == before  # answered by pid + start time alone: no scan at all


def test_env_marker_locates_an_untitled_agent_never_another_attempts_or_an_unrelated_process(world):
    """An agent forked but not titled yet carries no title marker; a process whose exec-time environment holds
    exactly ``LEOFLOW_ATTEMPT=<its launch id>`` is found instead. Another attempt's carrier, a launch id that
    merely starts with it, a look-alike variable name, the marker text on a command line, and a process with no
    marker are never taken for it."""
    mine, other, lonely = world.claimed(), world.claimed(), world.claimed()
    lid, other_lid, lonely_lid = (launch_id(a.ref) for a in (mine, other, lonely))
    agent = world.spawn(env={proc.ATTEMPT_ENV: lid})
    others = world.spawn(env={proc.ATTEMPT_ENV: other_lid})
    world.spawn(env={proc.ATTEMPT_ENV: lonely_lid + "2"})  # "...:1:12" is not "...:1:1"
    world.spawn(env={proc.ATTEMPT_ENV + "S": lonely_lid, "X" + proc.ATTEMPT_ENV: lonely_lid})
    world.spawn(args=(f"{proc.ATTEMPT_ENV}={lonely_lid}", f"{agent_title_marker(lonely_lid)}x"))
    world.spawn()  # unrelated, no marker

    assert proc.find_by_marker(lid) == [agent.pid]
    assert proc.find_by_title(agent_title_marker(lid)) == []  # untitled: only the marker finds it
    assert world.runtime.locate(mine) == {"pid": agent.pid, "proc_start_time": agent.start_time}
    assert world.runtime.locate(other) == {"pid": others.pid, "proc_start_time": others.start_time}
    assert world.runtime.locate(lonely) is None
    assert world.runtime.observe([mine, other, lonely]) == {
        mine.ref: Presence.LIVE, other.ref: Presence.LIVE, lonely.ref: Presence.GONE}
    assert world.all_running()


def test_locate_prefers_the_titled_agent_over_its_marked_descendants(world):
    """Once titled, the agent itself is reported, not an exec'd process of its attempt carrying the marker."""
    attempt = world.claimed()
    lid = launch_id(attempt.ref)
    world.spawn(env={proc.ATTEMPT_ENV: lid})  # e.g. the task's bash, started first here
    agent = world.spawn(title=agent_title_marker(lid))
    assert world.runtime.locate(attempt) == {"pid": agent.pid, "proc_start_time": agent.start_time}


def test_a_process_gone_after_the_scan_is_never_matched(world):
    """A snapshot reads titles and environments lazily; a process that died since the scan cannot be read
    (its ``/proc`` directory is checked against the snapshot's start time) and is never taken for ours."""
    lid = launch_id(world.claimed().ref)
    carrier = world.spawn(env={proc.ATTEMPT_ENV: lid}, title=agent_title_marker(lid))
    table = proc.ProcessTable()
    assert table.get(carrier.pid) is not None and table.get(carrier.pid).ident == carrier  # scanned now
    child = world.procs[-1]
    child.kill()
    child.wait()
    assert table.by_marker(lid) == [] and table.by_title(agent_title_marker(lid)) == []
    assert proc.ProcessTable().get(carrier.pid) is None


def test_the_table_never_names_pid_0_or_1_or_the_scanning_process():
    """Init and the caller are never entries: a lookup or proof of death could otherwise reach the whole host
    (pid 1's subtree) or the scheduler itself."""
    table = proc.ProcessTable()
    pids = {e.ident.pid for e in table.entries()}
    assert not pids & {0, 1, os.getpid()}
    assert table.holds(os.getpid())  # it ran, it just is not an entry
    assert proc.ProcessIdentity(os.getpid(), proc.start_time(os.getpid())) not in table.leftovers(
        proc.ProcessIdentity(2 ** 22 + 7, 0), "no-such-launch")
