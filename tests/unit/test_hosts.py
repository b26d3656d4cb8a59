"""More than one scheduler (issue 8 hole 14), below the real-Airflow test: the pure decision on another host's
attempts, the Lite runtime's answer for them on real processes, the lifecycle acting on that answer, and the
per-scheduler zygote directory on real processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from datetime import datetime, timedelta, timezone

import pytest
import sqlalchemy as sa

from leoflow_agent import proc
from leoflow_airflow import hosts
from leoflow_airflow import settings as leoflow_settings
from leoflow_airflow.ledger.models import metadata
from leoflow_airflow.ledger.states import AttemptRef, AttemptState, Resolution
from leoflow_airflow.ledger.store import LedgerStore
from leoflow_airflow.lifecycle.runtime import Presence, Started, launch_id
from leoflow_airflow.runtime.lite import LiteRuntime, ZygoteClient
from leoflow_airflow.runtime.lite.zygote_client import zygote_dir_for
from test_lifecycle import World

NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=timezone.utc)
REF = AttemptRef("ti", 1, 1)
HERE, THERE = "node-a/boot-1", "node-b/boot-2"


# --- the pure decision -----------------------------------------------------------------------------------
@pytest.mark.parametrize(("ti_state", "silent", "owner_alive", "settled"), [
    ("running", 61, False, True),    # silent past the threshold, owner dead: settle from the DB
    ("running", 61, True, False),    # its owner lives: it reaps its own agents
    ("running", 59, False, False),   # still heartbeating
    ("queued", 600, False, False),   # never reached /run: Airflow's stuck-in-queued timeout
    ("success", 600, False, False),  # moved on
    (None, 600, False, False),       # the TI row is gone
])
def test_another_hosts_attempt_is_settled_only_after_heartbeat_silence_and_owner_death(ti_state, silent, owner_alive,
                                                                                      settled):
    view = hosts.ForeignView(REF, ti_state, NOW - timedelta(seconds=silent), owner_alive)
    decisions = hosts.decide_foreign([view], NOW, agent_lost_threshold=60)
    assert [d.ref for d in decisions] == ([REF] if settled else [])


def test_a_running_ti_that_never_heartbeat_is_left_alone():
    assert hosts.decide_foreign([hosts.ForeignView(REF, "running", None, False)], NOW, 60) == []


def test_host_stamps():
    assert hosts.is_foreign(THERE, HERE)
    assert not hosts.is_foreign(HERE, HERE)
    assert not hosts.is_foreign(None, HERE)  # a row from before ledger revision 0003 is this host's
    assert not hosts.is_foreign(THERE, None)  # a runtime that stamps nothing judges every row as its own
    name, boot = hosts.this_host().split("/", 1)
    assert name and boot and hosts.this_host("test-host") == "test-host"


# --- the Lite runtime on real processes ---------------------------------------------------------------
@pytest.fixture
def lite(tmp_path):
    """A real SQLite ledger and a Lite runtime (zygote never started) whose host is ``HERE``."""
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'ledger.db'}")
    metadata.create_all(engine)
    conf = {"runtime_dir": str(tmp_path / "rt"), "test_fault_injection": "True", "test_host": HERE}
    settings = leoflow_settings.load(get=lambda s, k, f: conf.get(k, f))
    runtime = LiteRuntime(settings, parallelism=2, mint=lambda w, t: "{}", server=lambda: "http://x/")
    yield LedgerStore(engine), runtime
    engine.dispose()


def _dispatched(ledger: LedgerStore, host: str | None, pid: int):
    attempt = ledger.claim_epoch(ti_id=str(uuid.uuid4()), try_number=1, dag_id="d", task_id="t", run_id="r",
                                 map_index=-1, runtime="lite", workload_json="{}", scheduler_job_id=7, host=host)
    ident = proc.identity(pid)
    start_time = ident.start_time if ident is not None else 1
    assert ledger.transition(attempt.ref, expected=[AttemptState.CLAIMED], to=AttemptState.DISPATCHED, pid=pid,
                             proc_start_time=start_time)
    return ledger.get(attempt.ref)


def test_lite_never_judges_or_kills_another_hosts_attempt_by_local_pids(lite):
    ledger, runtime = lite
    assert runtime.host == HERE
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    try:
        live_there = _dispatched(ledger, THERE, sleeper.pid)
        dead_there = _dispatched(ledger, THERE, dead.pid)
        dead_here = _dispatched(ledger, HERE, dead.pid)
        dead_unstamped = _dispatched(ledger, None, dead.pid)
        assert runtime.observe([live_there, dead_there, dead_here, dead_unstamped]) == {
            live_there.ref: Presence.UNKNOWN, dead_there.ref: Presence.UNKNOWN,
            dead_here.ref: Presence.GONE, dead_unstamped.ref: Presence.GONE,
        }
        assert runtime.locate(live_there) is None
        assert runtime.kill(live_there, grace=0) == Presence.UNKNOWN
        assert runtime.kill(live_there, grace=30) == Presence.UNKNOWN
        assert sleeper.poll() is None  # its pid named a process of this host: never signalled
    finally:
        sleeper.kill()
        sleeper.wait()


def test_claim_stamps_the_runtimes_host(tmp_path):
    world = World(tmp_path)
    world.runtime.host = HERE
    _, ref = world.dispatched()
    assert world.row(ref).host == HERE


# --- the lifecycle on that answer ---------------------------------------------------------------------
def _foreign_running(world: World, *, silent: float, owner: int = 7):
    """Another host's DISPATCHED attempt of a RUNNING TI, seen UNKNOWN (as Lite answers), heartbeat ``silent``
    seconds old."""
    w = world.queued()
    ti_id = str(w.ti.id)
    attempt = world.ledger.claim_epoch(ti_id=ti_id, try_number=1, dag_id="dag", task_id=w.ti.task_id, run_id="run",
                                       map_index=-1, runtime="lite", workload_json=w.model_dump_json(exclude={"token"}),
                                       scheduler_job_id=owner, host=THERE)
    world.ledger.transition(attempt.ref, expected=[AttemptState.CLAIMED], to=AttemptState.DISPATCHED, pid=4242,
                            proc_start_time=77)
    world.airflow.set_state(ti_id, "running")
    world.runtime.presence[attempt.ref] = Presence.UNKNOWN
    world.airflow.ti_liveness = lambda ids: {
        i: ("running", world.clock.utcnow() - timedelta(seconds=silent)) for i in ids}
    return attempt.ref


@pytest.mark.parametrize(("silent", "owner_alive", "redriven"), [(120, False, True), (120, True, False),
                                                                  (30, False, False)])
def test_another_hosts_silent_attempt_is_redriven_only_when_its_scheduler_is_dead(tmp_path, silent, owner_alive,
                                                                                  redriven):
    world = World(tmp_path, agent_lost_threshold="60")
    world.runtime.host = HERE
    ref = _foreign_running(world, silent=silent)
    if owner_alive:
        world.airflow.alive_jobs.add(7)
    world.life.cycle()
    world.life.cycle()
    assert world.runtime.killed == []  # never killed from here, whatever the decision
    if redriven:
        assert world.airflow.redrives == [ref.ti_id]
        assert world.row(ref).resolution == Resolution.INFRA_REDRIVE
    else:
        assert world.airflow.redrives == []
        assert world.row(ref).state == AttemptState.DISPATCHED


def test_terminate_kills_only_this_schedulers_attempts(tmp_path):
    world = World(tmp_path)
    _, mine = world.dispatched()  # claimed by this lifecycle (owner unset: it counts as ours)
    world.life.job_id = 1
    peer = _foreign_running(world, silent=0, owner=2)  # a peer scheduler's live attempt
    world.runtime.presence[peer] = Presence.LIVE
    world.airflow.alive_jobs.add(2)
    orphan = _foreign_running(world, silent=0, owner=3)  # its scheduler is gone: this one would adopt it
    world.life.terminate()
    assert world.runtime.killed == [mine, orphan]


# --- one zygote per scheduler, on real processes ------------------------------------------------------
def _sleeper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])


def _pidfile(directory: str, zygote: subprocess.Popen, owner: subprocess.Popen) -> None:
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "zygote.pid"), "w") as fh:
        json.dump({"pid": zygote.pid, "start_time": proc.start_time(zygote.pid),
                   "owner_pid": owner.pid, "owner_start_time": proc.start_time(owner.pid)}, fh)


def test_each_scheduler_starts_its_own_zygote_and_stops_only_a_dead_owners(tmp_path):
    """A peer scheduler's zygote (its owner alive) survives our start; once its owner is dead, our next start
    removes it. Stand-ins for the peer are real processes named by a real pidfile."""
    root = str(tmp_path / "rt")
    settings = leoflow_settings.load(get=lambda s, k, f: {"runtime_dir": root}.get(k, f))
    peer_owner, peer_zygote = _sleeper(), _sleeper()
    client = ZygoteClient(settings)
    try:
        _pidfile(zygote_dir_for(root, peer_owner.pid), peer_zygote, peer_owner)
        client.start()
        assert client.paths.socket == os.path.join(zygote_dir_for(root, os.getpid()), "zygote.sock")
        assert client.paths.record_path("ti", 1) == os.path.join(root, "attempts", "ti", "1", "record.json")
        assert peer_zygote.poll() is None, "a live peer scheduler's zygote was stopped"
        assert proc.is_alive(proc.identity(client.pid))
        peer_owner.kill()
        peer_owner.wait()
        client.kill()
        client.restart()
        assert peer_zygote.wait(timeout=30) is not None  # its owner is dead: a stale zygote, removed
    finally:
        client.kill()
        for p in (peer_owner, peer_zygote):
            p.kill()
            p.wait()


# --- a peer scheduler's claim in flight on this host ------------------------------------------------
def test_a_live_peers_claim_in_flight_is_left_to_it_even_once_its_agent_runs(tmp_path):
    """Seen in the two-scheduler test: the peer's zygote forked the agent, the TI went RUNNING, but the peer
    had not recorded its ``Started`` yet. This scheduler must not record (and adopt) the agent it finds by
    title: the peer's ``Started`` then found the row moved on and killed its own agent (an infra re-drive)."""
    world = World(tmp_path)
    world.life.job_id = 1
    w = world.queued()
    peer = world.claim_only(w)
    with world.engine.begin() as conn:  # claimed by the peer scheduler's job 2, which heartbeats
        conn.execute(sa.text("update leoflow_attempt set scheduler_job_id = 2"))
    world.airflow.alive_jobs.add(2)
    world.airflow.set_state(str(w.ti.id), "running")
    world.runtime.located[peer.ref] = {"pid": 4242, "proc_start_time": 77}
    world.life.cycle()
    assert world.row(peer.ref).state == AttemptState.CLAIMED
    assert world.runtime.adopted == [] and world.runtime.killed == []


def test_a_started_agent_recorded_already_is_kept(tmp_path):
    """The other half of that race: the owner's ``Started`` for an agent someone recorded (same pid and start
    time) keeps it running instead of killing it."""
    world = World(tmp_path)
    w = world.queued()
    assert world.life.dispatch_task(w).disposition.value == "dispatched"
    ref = world.runtime.launched[-1].ref
    facts = {"pid": 4242, "proc_start_time": 77}
    assert world.ledger.transition(ref, expected=[AttemptState.CLAIMED], to=AttemptState.DISPATCHED, **facts)
    world.runtime.events.append(Started(launch_id(ref), facts))
    world.life.cycle()
    assert world.runtime.killed_launches == []
    assert world.row(ref).state == AttemptState.DISPATCHED
