"""The attempt lifecycle through ``FakeRuntime`` + the real SQLite ledger + an injected clock.

Every row of DESIGN §2's table end to end: dispatch -> Started -> Exited -> evidence -> settle -> what Airflow is
told; then the lifecycle holes of issue 8 (10, 1, 6, 9, 11, 8, 16, 2) as a user would notice them: epochs
claimed, rows closed, and the actions the executor performs.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone

import pytest
import sqlalchemy as sa

from fakes.runtime import FakeAirflow, FakeRuntime
from leoflow_agent import outcome
from leoflow_airflow import settings as leoflow_settings
from leoflow_airflow.dispatch.disposition import Disposition, DispatchResult
from leoflow_airflow.ledger.models import metadata
from leoflow_airflow.ledger.states import AttemptState, Resolution
from leoflow_airflow.ledger.store import LedgerStore
from leoflow_airflow.lifecycle.actions import (
    ChangeState, Fail, Occupy, Release, Reoffer, SendCallback, Succeed, TaskEvent,
)
from leoflow_airflow.lifecycle.core import Lifecycle, launch_id
from leoflow_airflow.lifecycle.runtime import CallbackDone, Exited, LaunchFailed, Presence, Reported, Started
from leoflow_airflow.redrive import RedriveResult
from leoflow_airflow.settle import SettleResult

S = AttemptState
T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=timezone.utc)

PAYLOADS = {
    "success": {"state": "success", "end_date": "2025-01-01T00:00:00Z", "task_outlets": [], "outlet_events": []},
    "up_for_retry": {"state": "up_for_retry", "end_date": "2025-01-01T00:00:00Z"},
    "deferred": {"state": "deferred", "classpath": "x.Trigger", "trigger_kwargs": {}, "next_method": "resume"},
}


class Clock:
    """Monotonic seconds and aware-UTC wall time, advanced together by the test."""

    def __init__(self) -> None:
        self.t = 1000.0

    def monotonic(self) -> float:
        return self.t

    def utcnow(self) -> datetime:
        return T0 + timedelta(seconds=self.t)

    def tick(self, seconds: float) -> None:
        self.t += seconds


class World:
    """One lifecycle with its fakes, and helpers that play the scheduler's part."""

    def __init__(self, tmp_path, **options: str) -> None:
        self.clock = Clock()
        self.engine = sa.create_engine(f"sqlite:///{tmp_path / 'ledger.db'}")
        metadata.create_all(self.engine)
        self.ledger = LedgerStore(self.engine, clock=self.clock.utcnow)
        # a presence pass on every cycle unless a test asks otherwise: the fake clock moves only when told
        conf = {"runtime_dir": str(tmp_path / "rt"), "reap_grace": "0", "sweep_interval": "0", **options}
        self.settings = leoflow_settings.load(get=lambda section, key, fallback: conf.get(key, fallback))
        self.runtime = FakeRuntime()
        self.airflow = FakeAirflow()
        self.life = self.new_lifecycle()

    def new_lifecycle(self) -> Lifecycle:
        return Lifecycle(ledger=self.ledger, runtime=self.runtime, airflow=self.airflow, settings=self.settings,
                         job_id=None, monotonic=self.clock.monotonic, utcnow=self.clock.utcnow)

    def workload(self, ti_id: str | None = None, *, try_number: int = 1, task_id: str = "task"):
        from airflow.executors.workloads import BundleInfo, ExecuteTask
        from airflow.executors.workloads.task import TaskInstanceDTO

        ti = TaskInstanceDTO(id=uuid.UUID(ti_id) if ti_id else uuid.uuid4(), task_id=task_id, dag_id="dag",
                             run_id="run", try_number=try_number, dag_version_id=uuid.uuid4(), map_index=-1,
                             pool_slots=1, priority_weight=1, queue="default")
        return ExecuteTask(token="", dag_rel_path="dag.py", bundle_info=BundleInfo(name="dags"), log_path="x.log",
                           ti=ti)

    def queued(self, **kw):
        """A workload whose TI Airflow holds QUEUED."""
        w = self.workload(**kw)
        self.airflow.put(str(w.ti.id), "queued", try_number=w.ti.try_number, logical=("dag", "run", w.ti.task_id, -1))
        return w

    def dispatched(self, **kw):
        """Dispatch a queued workload and start its agent; returns (workload, ref)."""
        w = self.queued(**kw)
        assert self.life.dispatch_task(w).disposition == Disposition.DISPATCHED
        ref = self.runtime.launched[-1].ref
        self.runtime.events.append(Started(launch_id(ref), {"pid": 4242, "proc_start_time": 77}))
        self.life.cycle()
        return w, ref

    def record(self, ref, state: str) -> outcome.OutcomeRecord:
        ident = outcome.AttemptIdentity(ref.ti_id, ref.try_number, ref.attempt_epoch)
        if state == "heartbeat_lost":
            rec = outcome.heartbeat_lost(ident)
        else:
            rec = outcome.record_for_state(state, PAYLOADS[state], attempt=ident, api_version="2025-09-23")
        self.runtime.records[ref] = rec
        return rec

    def exit(self, ref, code: int = 0) -> list:
        """The agent is gone: the runtime reports the exit; one cycle runs; its actions."""
        self.runtime.presence[ref] = Presence.GONE
        self.runtime.events.append(Exited(launch_id(ref), code))
        return self.life.cycle()

    def row(self, ref):
        return self.ledger.get(ref)

    def claim_only(self, w):
        """A CLAIMED epoch of ``w`` that no launch of this process carries (a predecessor's, or another
        scheduler's)."""
        return self.ledger.claim_epoch(ti_id=str(w.ti.id), try_number=w.ti.try_number, dag_id="dag",
                                       task_id=w.ti.task_id, run_id="run", map_index=-1, runtime="lite",
                                       workload_json=w.model_dump_json(exclude={"token"}), scheduler_job_id=1)

    @staticmethod
    def adoptable(w, state: str):
        """The ORM TaskInstance Airflow offers to ``try_adopt_task_instances`` (the fields adoption reads)."""
        from types import SimpleNamespace

        return SimpleNamespace(id=w.ti.id, try_number=w.ti.try_number, key=w.key, state=state,
                               last_heartbeat_at=None)

    def epochs(self, ti_id: str) -> list:
        with self.engine.connect() as conn:
            return conn.execute(sa.text("select attempt_epoch, state from leoflow_attempt where ti_id = :t "
                                        "order by attempt_epoch"), {"t": ti_id}).all()


@pytest.fixture
def world(tmp_path) -> World:
    w = World(tmp_path)
    yield w
    w.engine.dispose()


# --- DESIGN §2's table ------------------------------------------------------------------------------------
def test_normal_path_reported_then_exited_closes_reported_and_tells_airflow_nothing(world):
    w, ref = world.dispatched()
    assert world.row(ref).state == S.DISPATCHED and world.row(ref).pid == 4242
    world.runtime.events.append(Reported(launch_id(ref), "success"))
    actions = world.life.cycle()
    assert Release(w.key) in actions  # the slot frees at the terminal report
    world.airflow.set_state(ref.ti_id, "success")
    actions = world.exit(ref)
    row = world.row(ref)
    assert (row.state, row.resolution) == (S.CLOSED, Resolution.REPORTED)
    assert not [a for a in actions if isinstance(a, (Fail, Succeed, Reoffer))]
    assert world.airflow.replays == []


def test_lost_success_report_is_replayed_and_the_lost_callback_logged(world):
    w, ref = world.dispatched()
    world.airflow.set_state(ref.ti_id, "running")
    world.record(ref, "success")
    world.exit(ref)
    row = world.row(ref)
    assert (row.state, row.resolution) == (S.CLOSED, Resolution.REPLAYED)
    assert [r.state for r in world.airflow.replays] == ["success"]
    assert world.airflow.lost_success == [ref.ti_id]


def test_a_landed_success_a_late_run_call_overwrote_is_replayed_without_a_lost_callback_row(world):
    """The agent's success PATCH was answered 204, then a retried ``PATCH /run`` of the same execution that had
    waited on SQLite's write lock set the TI RUNNING again (Lite chaos loop): the record is replayed, so the
    success stands, and no "callback lost" row is written (the task child ran its callbacks)."""
    w, ref = world.dispatched()
    world.record(ref, "success")
    world.runtime.events.append(Reported(launch_id(ref), "success"))
    world.life.cycle()
    world.airflow.set_state(ref.ti_id, "running")  # the late /run wrote over the success
    world.exit(ref)
    row = world.row(ref)
    assert (row.state, row.resolution, row.reported_state) == (S.CLOSED, Resolution.REPLAYED, "success")
    assert [r.state for r in world.airflow.replays] == ["success"]
    assert world.airflow.lost_success == []


def test_a_pass_settles_many_attempts_from_one_read_of_airflow_and_reads_afresh_after_a_replay(world):
    """A reconcile pass reads the task instances of every attempt it will settle in one query; once it has
    acted outside the ledger (a replay PATCHed Airflow), the attempts after it are read one by one again."""
    (lost, l_ref), (b, b_ref), (c, c_ref) = (world.dispatched(task_id=n) for n in ("lost", "b", "c"))
    world.airflow.set_state(l_ref.ti_id, "running")
    world.record(l_ref, "success")  # its report never landed: replayed
    for ref in (b_ref, c_ref):
        world.runtime.events.append(Reported(launch_id(ref), "success"))
        world.airflow.set_state(ref.ti_id, "success")
    world.life.cycle()
    world.airflow.logical_reads.clear()
    for ref in (l_ref, b_ref, c_ref):
        world.runtime.presence[ref] = Presence.GONE
        world.runtime.events.append(Exited(launch_id(ref), 0))
    world.life.cycle()
    assert [(world.row(r).state, world.row(r).resolution) for r in (l_ref, b_ref, c_ref)] == [
        (S.CLOSED, Resolution.REPLAYED), (S.CLOSED, Resolution.REPORTED), (S.CLOSED, Resolution.REPORTED)]
    keys = {r: ("dag", "run", name, -1) for r, name in ((l_ref, "lost"), (b_ref, "b"), (c_ref, "c"))}
    assert world.airflow.logical_reads == [sorted(keys.values()), [keys[b_ref]], [keys[c_ref]]]
    assert [r.state for r in world.airflow.replays] == ["success"]


def test_replayed_up_for_retry_sends_the_retry_callback(world):
    w, ref = world.dispatched()
    world.airflow.set_state(ref.ti_id, "running")
    world.record(ref, "up_for_retry")
    actions = world.exit(ref)
    assert world.row(ref).resolution == Resolution.REPLAYED
    assert [a for a in actions if isinstance(a, SendCallback)]


@pytest.mark.parametrize("evidence", ["heartbeat_lost", None])
def test_running_ti_without_usable_record_is_redriven_on_the_infra_budget(world, evidence):
    w, ref = world.dispatched()
    world.airflow.set_state(ref.ti_id, "running")
    if evidence:
        world.record(ref, evidence)
    actions = world.exit(ref, code=-9)
    assert world.airflow.redrives == [ref.ti_id]
    assert world.row(ref).resolution == Resolution.INFRA_REDRIVE
    assert not [a for a in actions if isinstance(a, Fail)]


def test_spent_infra_budget_fails_through_airflow(world):
    w, ref = world.dispatched()
    world.airflow.set_state(ref.ti_id, "running")
    world.airflow.redrive_result = RedriveResult.BUDGET_SPENT
    actions = world.exit(ref, code=-9)
    assert world.row(ref).resolution == Resolution.EXECUTOR_FAILED
    assert [a.key for a in actions if isinstance(a, Fail)] == [w.key]


def test_agent_dead_before_run_is_reoffered_then_dispatched_as_the_next_epoch(world):
    w, ref = world.dispatched()
    actions = world.exit(ref, code=1)  # TI still queued, no record
    assert world.row(ref).resolution == Resolution.REDISPATCHED
    (reoffer,) = [a for a in actions if isinstance(a, Reoffer)]
    assert reoffer.key == w.key and str(reoffer.workload.ti.id) == ref.ti_id
    assert world.life.dispatch_task(reoffer.workload).disposition == Disposition.DISPATCHED
    assert world.epochs(ref.ti_id) == [(1, "closed"), (2, "claimed")]


def test_a_pod_its_node_had_no_room_for_is_reoffered_later_without_spending_the_redispatch_limit(tmp_path):
    """Issue 35, the real node: the kubelet refused the pod for lack of room (``OutOfcpu``) before it started. That
    is backpressure: closed ``launch_failed``, no Fail even at ``redispatch_limit`` 0, and the workload offered
    again only once ``NO_ROOM_BACKOFF_SECONDS`` passed (the node is not asked again at once)."""
    from leoflow_airflow.lifecycle.core import NO_ROOM_BACKOFF_SECONDS
    from leoflow_airflow.lifecycle.runtime import EndCause, EndKind

    world = World(tmp_path, redispatch_limit="0")
    w, ref = world.dispatched()
    world.runtime.causes[ref] = EndCause(EndKind.NO_ROOM, "pod p was refused by its node for lack of room "
                                                          "(pod reason OutOfcpu)")
    actions = world.exit(ref, code=None)
    assert world.row(ref).resolution == Resolution.LAUNCH_FAILED
    assert not [a for a in actions if isinstance(a, (Fail, Reoffer))]
    world.clock.t += NO_ROOM_BACKOFF_SECONDS
    (reoffer,) = [a for a in world.life.cycle() if isinstance(a, Reoffer)]
    assert reoffer.key == w.key and str(reoffer.workload.ti.id) == ref.ti_id


def test_redispatch_limit_fails_through_airflow(tmp_path):
    world = World(tmp_path, redispatch_limit="0")
    w, ref = world.dispatched()
    actions = world.exit(ref, code=1)
    assert world.row(ref).resolution == Resolution.EXECUTOR_FAILED
    assert [a.key for a in actions if isinstance(a, Fail)] == [w.key]


def test_redispatch_waits_while_the_execution_api_does_not_answer(tmp_path):
    """Hole 4: agents that die before /run during an api-server outage spend no re-dispatch; the epoch waits
    EXITED (nothing re-offered, nothing failed) and is re-dispatched once the Execution API answers."""
    world = World(tmp_path, redispatch_limit="0")
    w, ref = world.dispatched()
    world.airflow.api_up = False
    actions = world.exit(ref, code=1)
    assert [a for a in actions if isinstance(a, (Reoffer, Fail))] == []
    for _ in range(3):
        world.clock.tick(30)
        assert [a for a in world.life.cycle() if isinstance(a, (Reoffer, Fail))] == []
    assert world.row(ref).state == S.EXITED
    world.airflow.api_up = True
    world.clock.tick(30)
    actions = world.life.cycle()
    assert [a.key for a in actions if isinstance(a, Fail)] == [w.key], "redispatch_limit 0 applies once it answers"


def test_cleared_running_task_gets_success_once(world):
    w, ref = world.dispatched()
    new_id = str(uuid.uuid4())
    world.airflow.put(new_id, "restarting")  # a clear gives the logical TI a new id
    actions = world.exit(ref, code=-9)
    assert world.row(ref).resolution == Resolution.RESTARTING
    assert [a for a in actions if isinstance(a, Succeed)] == [Succeed(w.key)]
    assert [a for a in world.life.cycle() if isinstance(a, Succeed)] == []


def test_terminal_ti_is_closed_moved_on(world):
    w, ref = world.dispatched()
    world.airflow.set_state(ref.ti_id, "failed")
    actions = world.exit(ref, code=1)
    assert world.row(ref).resolution == Resolution.MOVED_ON
    assert not [a for a in actions if isinstance(a, (Fail, Succeed, Reoffer))]


def test_unknown_presence_is_never_settled_or_reaped(tmp_path):
    world = World(tmp_path, agent_lost_threshold="1")
    w, ref = world.dispatched()
    world.airflow.set_state(ref.ti_id, "running")
    world.runtime.presence[ref] = Presence.UNKNOWN
    world.clock.tick(3600)
    world.life.cycle()
    assert world.row(ref).state == S.DISPATCHED
    assert world.runtime.killed == []


def test_callback_result_is_the_workloads_own_state(world):
    class Callback:
        key = "cb-key"
        success_state, failure_state = "success", "failed"

        class callback:  # noqa: N801 - the shape of ExecuteCallback.callback
            id = "c1"

    assert world.life.dispatch_callback(Callback()).disposition == Disposition.DISPATCHED
    lid = world.runtime.callbacks[-1][0]
    world.runtime.events.append(CallbackDone(lid, False))
    actions = world.life.cycle()
    assert ChangeState("cb-key", "failed") in actions and Release("cb-key") in actions


# --- hole 10: dispatch never settles ----------------------------------------------------------------------
def test_reoffer_of_a_ti_whose_previous_epoch_is_dead_claims_one_epoch(world):
    """A re-offered workload whose previous epoch is dead and unsettled: dispatch answers DEFERRED (never
    settling inline); the cycle settles and re-offers; exactly one new epoch is claimed."""
    w, ref = world.dispatched()
    world.runtime.presence[ref] = Presence.GONE  # dead, but no Exited event yet
    result = world.life.dispatch_task(w)
    assert result.disposition == Disposition.DEFERRED
    assert world.airflow.replays == [] and world.epochs(ref.ti_id) == [(1, "exited")]
    actions = world.life.cycle()
    (reoffer,) = [a for a in actions if isinstance(a, Reoffer)]
    assert world.life.dispatch_task(reoffer.workload).disposition == Disposition.DISPATCHED
    assert world.epochs(ref.ti_id) == [(1, "closed"), (2, "claimed")]


def test_a_batch_dispatches_each_queued_ti_once_from_one_read_of_airflow_and_the_ledger(world, monkeypatch):
    """The scheduler hands over a batch: its task-instance rows and current epochs are read once for the batch,
    a TI Airflow no longer holds queued is skipped, a re-offer whose previous epoch is closed claims the next
    epoch from the batch read, and a TI offered twice in one batch launches once (its second offer sees the
    first's claim)."""
    reads = {"rows": 0, "row": 0, "current_many": 0, "current": 0}
    for name, target in (("rows", world.airflow.ti_rows_by_id), ("row", world.airflow.ti_row_by_id)):
        monkeypatch.setattr(world.airflow, f"ti_{name}_by_id",
                            lambda *a, _n=name, _t=target: (reads.__setitem__(_n, reads[_n] + 1), _t(*a))[1])
    for name in ("current_many", "current"):
        original = getattr(world.ledger, name)
        monkeypatch.setattr(world.ledger, name,
                            lambda *a, _n=name, _o=original: (reads.__setitem__(_n, reads[_n] + 1), _o(*a))[1])
    first, second, moved_on = world.queued(), world.queued(), world.queued()
    world.airflow.set_state(str(moved_on.ti.id), "running")
    redo = world.queued()
    old = world.ledger.claim_epoch(ti_id=str(redo.ti.id), try_number=1, dag_id="dag", task_id="task", run_id="run",
                                   map_index=-1, runtime="fake", workload_json="{}", scheduler_job_id=None)
    assert world.ledger.transition(old.ref, expected=[S.CLAIMED], to=S.CLOSED, resolution=Resolution.ABANDONED)
    got = [r.disposition for r in world.life.dispatch_tasks([first, second, moved_on, redo, first])]
    assert got == [Disposition.DISPATCHED, Disposition.DISPATCHED, Disposition.STALE, Disposition.DISPATCHED,
                   Disposition.DEFERRED]
    assert [spec.ref.ti_id for spec in world.runtime.launched] == [str(w.ti.id) for w in (first, second, redo)]
    assert world.epochs(str(redo.ti.id)) == [(1, "closed"), (2, "claimed")]
    assert world.epochs(str(first.ti.id)) == [(1, "claimed")] and world.epochs(str(moved_on.ti.id)) == []
    assert reads == {"rows": 1, "row": 1, "current_many": 1, "current": 1}  # the repeat alone is read again


# --- hole 1: an unrecorded launch is looked up, never presumed dead ----------------------------------------
def test_adopted_claimed_attempt_whose_agent_runs_is_recorded_not_redispatched(world):
    w = world.queued()
    attempt = world.claim_only(w)
    world.runtime.located[attempt.ref] = {"pid": 5151, "proc_start_time": 9}

    ti = world.adoptable(w, "queued")
    not_adopted, lost = world.life.adopt([ti], now=T0)
    assert (not_adopted, lost) == ([], [])
    actions = world.life.cycle()
    row = world.row(attempt.ref)
    assert (row.state, row.pid) == (S.DISPATCHED, 5151)
    assert not [a for a in actions if isinstance(a, Reoffer)] and world.runtime.launched == []
    assert world.runtime.adopted == [attempt.ref]


def test_adopted_claimed_attempt_without_agent_is_reoffered_without_spending_a_redispatch(world):
    w = world.queued()
    ti_id = str(w.ti.id)
    attempt = world.claim_only(w)

    ti = world.adoptable(w, "queued")
    world.life.adopt([ti], now=T0)
    actions = world.life.cycle()
    assert world.row(attempt.ref).resolution == Resolution.ABANDONED
    assert [a.key for a in actions if isinstance(a, Reoffer)] == [w.key]
    assert world.ledger.count_resolution(ti_id, Resolution.REDISPATCHED) == 0


def test_claimed_attempt_the_runtime_cannot_see_yet_is_left_alone(world):
    w = world.queued()
    attempt = world.claim_only(w)
    world.runtime.presence[attempt.ref] = Presence.UNKNOWN
    world.life.adopt([world.adoptable(w, "queued")], now=T0)
    actions = world.life.cycle()
    assert world.row(attempt.ref).state == S.CLAIMED
    assert not [a for a in actions if isinstance(a, Reoffer)]


def test_started_event_for_an_unknown_launch_kills_that_agent(world):
    world.runtime.events.append(Started("stranger:1:1", {"pid": 1, "proc_start_time": 1}))
    world.life.cycle()
    assert world.runtime.killed_launches == ["stranger:1:1"]


def test_one_cycles_events_of_several_attempts_land_in_order_and_a_start_after_a_close_is_killed(world):
    """The ledger moves of one cycle's events are written together (``LedgerStore.transition_many``): an
    attempt that started, reported and exited within one cycle is settled in it with its facts; an agent that
    starts after its attempt was closed (revoked while the launch was in flight) is killed; an agent already
    recorded with the same pid and start time (re-found after a restart) runs on."""
    fast, slow, gone = (world.queued(task_id=name) for name in ("fast", "slow", "gone"))
    refs = []
    for w in (fast, slow, gone):
        assert world.life.dispatch_task(w).disposition == Disposition.DISPATCHED
        refs.append(world.runtime.launched[-1].ref)
    fast_ref, slow_ref, gone_ref = refs
    assert world.ledger.transition(gone_ref, expected=[S.CLAIMED], to=S.CLOSED, resolution=Resolution.REVOKED)
    world.runtime.events += [
        Started(launch_id(fast_ref), {"pid": 1, "proc_start_time": 10}),
        Started(launch_id(slow_ref), {"pid": 2, "proc_start_time": 20}),
        Started(launch_id(gone_ref), {"pid": 3, "proc_start_time": 30}),
        Reported(launch_id(fast_ref), "success"),
        Exited(launch_id(fast_ref), 0),
    ]
    world.airflow.set_state(fast_ref.ti_id, "success")
    world.runtime.presence[fast_ref] = Presence.GONE
    actions = world.life.cycle()
    row = world.row(fast_ref)  # settled in the same cycle: its moves landed in order before reconcile
    assert (row.state, row.resolution, row.pid, row.reported_state, row.exit_status) == (
        S.CLOSED, Resolution.REPORTED, 1, "success", 0)
    assert (world.row(slow_ref).state, world.row(slow_ref).pid) == (S.DISPATCHED, 2)
    assert world.runtime.killed_launches == [launch_id(gone_ref)]
    assert Release(fast.key) in actions
    world.runtime.events.append(Started(launch_id(slow_ref), {"pid": 2, "proc_start_time": 20}))
    world.life.cycle()
    assert world.runtime.killed_launches == [launch_id(gone_ref)]


def test_end_still_records_what_the_runtime_owed_when_a_cycle_raises(world):
    """A cycle of ``end()`` that raises (a database error mid-settle) still hangs up on the runtime and records
    the agents it reports, so a successor adopts them rather than guessing; the error is not swallowed."""
    w = world.queued()
    assert world.life.dispatch_task(w).disposition == Disposition.DISPATCHED
    ref = world.runtime.launched[-1].ref
    world.runtime.owed_at_stop = [Started(launch_id(ref), {"pid": 6262, "proc_start_time": 4})]

    def broken() -> list:
        raise RuntimeError("database is locked")

    world.runtime.poll = broken  # the cycle's first call, at the runtime seam
    with pytest.raises(RuntimeError, match="database is locked"):
        world.life.drain(timeout=0, sleep=lambda s: None)
    assert world.runtime.stopped
    assert (world.row(ref).state, world.row(ref).pid) == (S.DISPATCHED, 6262)


def test_agents_whose_start_a_sigterm_cut_off_are_still_recorded_by_end(world, monkeypatch):
    """Airflow's SIGTERM handler raises ``SystemExit`` wherever the scheduler's thread is, then its ``finally``
    calls ``executor.end()``. Cut off after the runtime gave a cycle's Started events and before their ledger
    moves were written, the agents are still recorded (DISPATCHED with their pid) by ``end()``'s drain, so a
    ``terminate()`` or a successor finds them; a move written twice changes nothing the second time."""
    refs = []
    for name in ("a", "b", "c"):
        assert world.life.dispatch_task(world.queued(task_id=name)).disposition == Disposition.DISPATCHED
        refs.append(world.runtime.launched[-1].ref)
    world.runtime.events += [Started(launch_id(r), {"pid": 100 + i, "proc_start_time": i}) for i, r in enumerate(refs)]
    real = world.ledger.transition_many

    def sigterm_midway(moves):
        real(moves[:1])  # one landed (on PostgreSQL a statement per kind commits by itself)
        raise SystemExit(0)

    monkeypatch.setattr(world.ledger, "transition_many", sigterm_midway)
    with pytest.raises(SystemExit):
        world.life.cycle()
    monkeypatch.setattr(world.ledger, "transition_many", real)
    assert [world.row(r).state for r in refs] == [S.DISPATCHED, S.CLAIMED, S.CLAIMED]
    world.life.drain(timeout=0, sleep=lambda s: None)
    assert [(world.row(r).state, world.row(r).pid) for r in refs] == [(S.DISPATCHED, 100 + i) for i in range(3)]
    assert world.runtime.killed_launches == []


def test_end_dispatches_nothing_and_records_the_agents_the_runtime_still_reports(world):
    w = world.queued()
    assert world.life.dispatch_task(w).disposition == Disposition.DISPATCHED
    ref = world.runtime.launched[-1].ref
    world.runtime.owed_at_stop = [Started(launch_id(ref), {"pid": 6161, "proc_start_time": 3})]
    world.life.drain(timeout=0, sleep=lambda s: None)
    assert world.runtime.stopped
    assert (world.row(ref).state, world.row(ref).pid) == (S.DISPATCHED, 6161)
    later = world.queued()
    assert world.life.dispatch_task(later).disposition == Disposition.DEFERRED
    assert len(world.runtime.launched) == 1


# --- hole 6: a SETTLING row has a way out -----------------------------------------------------------------
def test_settling_row_left_by_a_dead_settler_is_settled_again(world):
    w, ref = world.dispatched()
    world.airflow.set_state(ref.ti_id, "running")
    world.record(ref, "success")
    world.runtime.presence[ref] = Presence.GONE
    assert world.ledger.transition(ref, expected=[S.DISPATCHED], to=S.EXITED)
    assert world.ledger.transition(ref, expected=[S.EXITED], to=S.SETTLING)  # then the scheduler died
    fresh = world.new_lifecycle()  # a new scheduler process
    fresh.cycle()
    row = world.row(ref)
    assert (row.state, row.resolution) == (S.CLOSED, Resolution.REPLAYED)
    assert len(world.airflow.replays) == 1


def test_replay_that_raises_leaves_a_row_that_end_settles_again(world):
    """Hole 6, "the replay raises": an exception out of the settle path (a DB error, say) leaves ``sync()``
    and ends Airflow's scheduler loop, whose ``finally`` calls ``executor.end()``. The row is SETTLING and no
    settle holds it any more, so the drain's cycle settles it again (and a successor would, see above)."""
    w, ref = world.dispatched()
    world.airflow.set_state(ref.ti_id, "running")
    world.record(ref, "success")
    calls = []

    def fail_once() -> None:
        calls.append(1)
        if len(calls) == 1:
            raise sa.exc.OperationalError("UPDATE leoflow_attempt", {}, Exception("database is locked"))

    world.airflow.on_replay = fail_once
    with pytest.raises(sa.exc.OperationalError):
        world.exit(ref)
    assert world.row(ref).state == S.SETTLING
    world.life.drain(timeout=0, sleep=lambda _: None)  # Airflow's ``finally: executor.end()``
    row = world.row(ref)
    assert (row.state, row.resolution) == (S.CLOSED, Resolution.REPLAYED)
    assert len(world.airflow.replays) == 2 and world.airflow.lost_success == [ref.ti_id]


def test_settling_row_whose_replay_landed_before_its_settler_died_is_closed_replayed(world):
    """Hole 6: the dead settler's PATCH landed, so Airflow already holds the recorded success. That is no
    report of the agent (a SETTLING row's agent never reported): the row closes ``replayed`` and the lost
    on_success_callback is logged, with no second replay."""
    w, ref = world.dispatched()
    world.record(ref, "success")
    world.runtime.presence[ref] = Presence.GONE
    assert world.ledger.transition(ref, expected=[S.DISPATCHED], to=S.EXITED)
    assert world.ledger.transition(ref, expected=[S.EXITED], to=S.SETTLING)
    world.airflow.set_state(ref.ti_id, "success")  # its PATCH landed; then the scheduler died
    world.life = world.new_lifecycle()
    world.life.cycle()
    row = world.row(ref)
    assert (row.state, row.resolution) == (S.CLOSED, Resolution.REPLAYED)
    assert world.airflow.replays == [] and world.airflow.lost_success == [ref.ti_id]


def test_replay_that_timed_out_but_landed_is_closed_replayed_with_the_lost_callback(world):
    """A replay whose caller timed out while the api-server still applied it (a slow api-server): the row
    stays SETTLING, so the next pass knows that the success Airflow now holds is that replay's, not the agent's
    report. Before: closed ``reported`` and the lost on_success_callback never logged."""
    w, ref = world.dispatched()
    world.airflow.set_state(ref.ti_id, "running")
    world.record(ref, "success")
    world.airflow.on_replay = lambda: world.airflow.set_state(ref.ti_id, "success")  # applied after all
    world.airflow.replay_result = lambda r: SettleResult(False, False, "transport error: ReadTimeout", retryable=True)
    world.exit(ref)
    assert world.row(ref).state == S.SETTLING
    world.life.cycle()
    row = world.row(ref)
    assert (row.state, row.resolution) == (S.CLOSED, Resolution.REPLAYED)
    assert len(world.airflow.replays) == 1 and world.airflow.lost_success == [ref.ti_id]


def test_up_for_retry_replay_that_timed_out_but_landed_still_sends_the_retry_callback(world):
    """The same for up_for_retry: the landed replay moved the TI on to its next try (a new ti_id); the retry
    callback the task child could not run is still sent, once. Before: never sent."""
    w, ref = world.dispatched()
    world.airflow.set_state(ref.ti_id, "running")
    world.record(ref, "up_for_retry")

    def landed() -> None:
        world.airflow.set_state(ref.ti_id, "up_for_retry")
        world.airflow.put(str(uuid.uuid4()), "scheduled", try_number=2, logical=("dag", "run", "task", -1))

    world.airflow.on_replay = landed
    world.airflow.replay_result = lambda r: SettleResult(False, False, "transport error: ReadTimeout", retryable=True)
    assert not [a for a in world.exit(ref) if isinstance(a, SendCallback)]
    actions = world.life.cycle()
    assert world.row(ref).resolution == Resolution.REPLAYED
    assert len([a for a in actions if isinstance(a, SendCallback)]) == 1 and len(world.airflow.replays) == 1
    assert not [a for a in world.life.cycle() if isinstance(a, SendCallback)]


def test_a_second_replay_answered_200_counts_as_replayed(world):
    """A retried replay answered 200 ("already in that state"): the earlier one landed meanwhile."""
    w, ref = world.dispatched()
    world.airflow.set_state(ref.ti_id, "running")
    world.record(ref, "success")
    world.airflow.replay_result = lambda r: SettleResult(False, False, "transport error: ReadTimeout", retryable=True)
    world.exit(ref)
    world.airflow.replay_result = lambda r: SettleResult(True, False, "200: Airflow already had that state")
    world.life.cycle()
    row = world.row(ref)
    assert (row.state, row.resolution) == (S.CLOSED, Resolution.REPLAYED)
    assert len(world.airflow.replays) == 2 and world.airflow.lost_success == [ref.ti_id]


# --- hole 9: adoption of a QUEUED TI whose last epoch handed off -----------------------------------------
def test_adopted_queued_ti_whose_epoch_deferred_is_dispatched_again(world):
    w, ref = world.dispatched()
    world.record(ref, "deferred")  # it deferred; the trigger fired; Airflow queued the same ti_id again
    world.runtime.presence[ref] = Presence.GONE
    fresh_runtime = world.runtime
    world.life = world.new_lifecycle()  # the scheduler restarted

    ti = world.adoptable(w, "queued")
    not_adopted, _ = world.life.adopt([ti], now=T0)
    assert not_adopted == []
    actions = world.life.cycle()
    assert world.row(ref).resolution == Resolution.REPORTED
    (reoffer,) = [a for a in actions if isinstance(a, Reoffer)]
    assert reoffer.key == w.key
    assert world.life.dispatch_task(reoffer.workload).disposition == Disposition.DISPATCHED
    assert fresh_runtime.launched[-1].ref.attempt_epoch == 2


# --- hole 11: the settle budget is wall-clock time -------------------------------------------------------
def _lost_successes(world, n: int) -> list:
    """``n`` RUNNING TIs whose agents wrote a success record and are GONE: each waits for a replay."""
    refs = []
    for i in range(n):
        _, ref = world.dispatched(task_id=f"t{i}")
        world.airflow.set_state(ref.ti_id, "running")
        world.record(ref, "success")
        refs.append(ref)
    for ref in refs:  # only now: dispatching the next one runs a cycle
        world.runtime.presence[ref] = Presence.GONE
    return refs


def test_one_stalled_replay_stops_replaying_for_the_pass(tmp_path):
    world = World(tmp_path, settle_timeout="10")
    refs = _lost_successes(world, 3)
    world.airflow.replay_result = lambda r: SettleResult(False, False, "transport error: ReadTimeout", retryable=True)
    world.airflow.on_replay = lambda: world.clock.tick(10)
    world.life.cycle()
    assert len(world.airflow.replays) == 1
    assert sorted(world.row(r).state for r in refs) == [S.EXITED, S.EXITED, S.SETTLING]  # one replay was sent
    world.airflow.replay_result = lambda r: SettleResult(True, True, "204: applied")
    world.airflow.on_replay = lambda: world.clock.tick(1)
    world.life.cycle()
    world.life.cycle()
    assert {world.row(r).resolution for r in refs} == {Resolution.REPLAYED}


def test_a_replay_that_keeps_stalling_does_not_starve_the_other_lost_reports(tmp_path):
    """One TI's PATCH hangs on every pass; the other lost reports are still replayed, one pass each."""
    world = World(tmp_path, settle_timeout="10")
    refs = _lost_successes(world, 3)
    stuck = refs[0]  # first in ledger order: the pass always met it first before the fix

    def answer(record):
        if record.ti_id == stuck.ti_id:
            world.clock.tick(10)
            return SettleResult(False, False, "transport error: ReadTimeout", retryable=True)
        world.clock.tick(1)
        return SettleResult(True, True, "204: applied")

    world.airflow.replay_result = answer
    for _ in range(4):
        world.life.cycle()
    assert [world.row(r).resolution for r in refs[1:]] == [Resolution.REPLAYED, Resolution.REPLAYED]
    assert world.row(stuck).state == S.SETTLING  # still retried, never given up on


# --- hole 8: a transient fork failure re-offers ----------------------------------------------------------
@pytest.mark.parametrize("retryable", [True, False])
def test_launch_failure_reoffers_when_retryable_and_fails_otherwise(world, retryable):
    w = world.queued()
    world.life.dispatch_task(w)
    ref = world.runtime.launched[-1].ref
    error = "fork failed: Resource temporarily unavailable" if retryable else "malformed launch message"
    world.runtime.events.append(LaunchFailed(launch_id(ref), error, retryable))
    actions = world.life.cycle()
    assert world.row(ref).resolution == Resolution.LAUNCH_FAILED
    assert [a.key for a in actions if isinstance(a, Reoffer)] == ([w.key] if retryable else [])
    assert [a.key for a in actions if isinstance(a, Fail)] == ([] if retryable else [w.key])
    assert world.life.table.launches == {}  # hole 16: the launch is popped, no leak


# --- hole 16 -------------------------------------------------------------------------------------------
def test_claimed_row_never_offered_to_adoption_is_closed_once_the_ti_moved_on(world):
    w = world.queued()
    ti_id = str(w.ti.id)
    attempt = world.claim_only(w)
    world.life.cycle()
    assert world.row(attempt.ref).state == S.CLAIMED  # queued at that try: its owner or adoption decides
    world.airflow.set_state(ti_id, "success")
    world.life.cycle()  # not queued at that try any more: settled through DESIGN §2's table
    world.life.cycle()
    assert world.row(attempt.ref).state == S.CLOSED
    assert world.row(attempt.ref).resolution in (Resolution.MOVED_ON, Resolution.REPORTED)
    assert world.airflow.redrives == []


def test_claimed_row_whose_agent_ran_unrecorded_is_settled_from_its_record(world):
    """A scheduler killed right after the fork leaves a CLAIMED row whose agent reached /run (TI RUNNING),
    wrote its success record and died: the row is settled from that record (replayed), never closed as
    "never launched" (which let Airflow reset the TI as a new try, spending a user retry: chaos, CI)."""
    w = world.queued()
    ti_id = str(w.ti.id)
    attempt = world.claim_only(w)
    world.airflow.set_state(ti_id, "running")
    world.record(attempt.ref, "success")
    world.life.cycle()
    world.life.cycle()
    row = world.row(attempt.ref)
    assert (row.state, row.resolution) == (S.CLOSED, Resolution.REPLAYED)
    assert world.airflow.redrives == []


def test_claimed_row_whose_agent_ran_without_a_record_is_redriven_on_the_infra_budget(world):
    w = world.queued()
    ti_id = str(w.ti.id)
    attempt = world.claim_only(w)
    world.airflow.set_state(ti_id, "running")
    world.life.cycle()
    world.life.cycle()
    row = world.row(attempt.ref)
    assert (row.state, row.resolution) == (S.CLOSED, Resolution.INFRA_REDRIVE)
    assert world.airflow.redrives == [ti_id]


def test_replay_404_while_a_user_cleared_the_task_gives_success_once(world):
    w, ref = world.dispatched()
    world.airflow.set_state(ref.ti_id, "running")
    world.record(ref, "success")
    new_id = str(uuid.uuid4())

    def cleared_meanwhile(record):
        world.airflow.put(new_id, "restarting")
        return SettleResult(True, False, "404: the attempt's ti_id is archived")

    world.airflow.replay_result = cleared_meanwhile
    actions = world.exit(ref)
    assert world.row(ref).resolution == Resolution.RESTARTING
    assert [a for a in actions if isinstance(a, Succeed)] == [Succeed(w.key)]


def test_reaper_kills_a_live_agent_whose_heartbeat_went_silent(tmp_path):
    world = World(tmp_path, agent_lost_threshold="60")
    w, ref = world.dispatched()
    world.airflow.set_state(ref.ti_id, "running")
    world.airflow.ti_liveness = lambda ids: {i: ("running", world.clock.utcnow() - timedelta(seconds=120)) for i in ids}
    actions = world.life.cycle()
    assert world.runtime.killed == [ref]
    assert [a.event for a in actions if isinstance(a, TaskEvent)] == ["leoflow agent-lost"]


# --- hole 16: kills give the task its SIGTERM and grace, once, and end through the normal path ---------------
def _silent(world, ref, seconds: float = 120) -> None:
    """Make ``ref``'s TI RUNNING with a heartbeat ``seconds`` old at every later look."""
    world.airflow.set_state(ref.ti_id, "running")
    world.airflow.ti_liveness = lambda ids: {i: ("running", world.clock.utcnow() - timedelta(seconds=seconds))
                                             for i in ids}


def test_agent_lost_kill_is_graceful_signalled_once_and_ends_through_settle(tmp_path):
    """The agent-lost reaper kills with the grace (the task's on_kill runs), and only once: the cycles of
    that grace neither signal again, nor log or tell Airflow again. The kill ends the normal way: the
    runtime's ``Exited``, GONE, no record -> an infra re-drive, no user retry."""
    world = World(tmp_path, agent_lost_threshold="60")
    world.life.reap_kill_grace = 8.0
    w, ref = world.dispatched()
    _silent(world, ref)
    events = []
    for _ in range(5):  # cycles within the grace: the agent still lives
        events += [a for a in world.life.cycle() if isinstance(a, TaskEvent)]
        world.clock.tick(1)
    assert (world.runtime.killed, world.runtime.kill_graces) == ([ref], [8.0])
    assert [e.event for e in events] == ["leoflow agent-lost"]
    assert world.row(ref).state == S.DISPATCHED and world.airflow.redrives == []
    world.exit(ref, code=-9)  # the runtime escalated after the grace: nothing of it is left
    assert world.row(ref).resolution == Resolution.INFRA_REDRIVE
    assert world.airflow.redrives == [ref.ti_id]
    assert world.runtime.killed == [ref]


def test_a_failure_refused_after_the_kill_is_redriven_not_replayed(tmp_path):
    """The task's on_kill stopped its work and the task failed; the agent refused that report and recorded
    ``killed``. The attempt is re-driven on the infra budget; the failure is never replayed."""
    world = World(tmp_path, agent_lost_threshold="60")
    world.life.reap_kill_grace = 8.0
    w, ref = world.dispatched()
    _silent(world, ref)
    world.life.cycle()
    world.runtime.records[ref] = outcome.killed(outcome.AttemptIdentity(ref.ti_id, ref.try_number,
                                                                        ref.attempt_epoch))
    world.exit(ref)
    assert world.airflow.replays == [] and world.airflow.redrives == [ref.ti_id]
    assert world.row(ref).resolution == Resolution.INFRA_REDRIVE


def test_a_kill_the_runtime_lost_is_repeated_at_once_past_its_grace(tmp_path):
    """The agent still lives well past its grace (Lite: the zygote died before it escalated): the reaper
    kills it once more, at once, without a second TaskEvent; then never again."""
    from leoflow_airflow.lifecycle.core import KILL_ESCALATION_SLACK

    world = World(tmp_path, agent_lost_threshold="60")
    world.life.reap_kill_grace = 8.0
    w, ref = world.dispatched()
    _silent(world, ref)
    events = [a for a in world.life.cycle() if isinstance(a, TaskEvent)]
    world.clock.tick(8.0 + KILL_ESCALATION_SLACK - 1)
    world.life.cycle()
    assert world.runtime.kill_graces == [8.0]
    world.clock.tick(2)
    events += [a for a in world.life.cycle() if isinstance(a, TaskEvent)]
    world.clock.tick(600)
    events += [a for a in world.life.cycle() if isinstance(a, TaskEvent)]
    assert (world.runtime.killed, world.runtime.kill_graces) == ([ref, ref], [8.0, 0.0])
    assert len(events) == 1


def test_dispatch_lost_kill_is_immediate(tmp_path):
    """The agent never reached /run, so no body runs: no grace (DESIGN §3 "Kills")."""
    world = World(tmp_path, dispatch_lost_threshold="60")
    world.life.reap_kill_grace = 8.0
    w, ref = world.dispatched()
    world.clock.tick(120)
    world.life.cycle()
    assert (world.runtime.killed, world.runtime.kill_graces) == ([ref], [0.0])


def test_revoke_is_immediate(world):
    """Airflow revokes a TI stuck in queued: its attempt must not run at all."""
    world.life.kill_grace = world.life.reap_kill_grace = 8.0
    w, ref = world.dispatched()
    world.life.revoke(ref.ti_id, w.key)
    assert world.runtime.kill_graces == [0.0]


def test_terminate_gives_the_grace_and_waits_until_nothing_is_left(world):
    """terminate() is the executor's last call: each task gets SIGTERM and the grace, and the call returns
    once the runtime shows nothing of the attempts left; no SIGKILL from here."""
    world.life.kill_grace = 8.0
    _, first = world.dispatched()
    _, second = world.dispatched()
    slept = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        world.clock.tick(seconds)
        if len(slept) == 3:  # the tasks ran their on_kill and exited
            world.runtime.presence[first] = world.runtime.presence[second] = Presence.GONE

    world.life.terminate(sleep=sleep)
    assert world.runtime.killed == [first, second] and world.runtime.kill_graces == [8.0, 8.0]
    assert len(slept) == 3


def test_terminate_sigkills_what_outlives_the_grace(world):
    world.life.kill_grace = 8.0
    _, ref = world.dispatched()
    world.life.terminate(sleep=world.clock.tick)
    assert world.runtime.kill_graces == [8.0, 0.0]
    assert world.clock.t >= 1000.0 + 8.0


def test_terminate_kills_a_launch_whose_agent_starts_while_it_waits(world):
    """A launch handed over but not yet started when terminate() begins (held in the zygote, being forked) is
    killed too; its Started arriving during the wait gives it a handle, and that agent gets its own graceful
    kill instead of outliving the scheduler."""
    world.life.kill_grace = 8.0
    _, running = world.dispatched()
    forking = world.queued()
    assert world.life.dispatch_task(forking).disposition == Disposition.DISPATCHED
    late = world.runtime.launched[-1].ref
    slept = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        world.clock.tick(seconds)
        if len(slept) == 1:  # the zygote finished forking it
            world.runtime.events.append(Started(launch_id(late), {"pid": 5151, "proc_start_time": 88}))
        if len(slept) == 3:
            world.runtime.presence[running] = world.runtime.presence[late] = Presence.GONE

    world.life.terminate(sleep=sleep)
    assert world.runtime.killed == [running, late, late]
    assert world.runtime.kill_graces == [8.0, 8.0, 8.0]
    assert world.row(late).pid == 5151
    assert world.runtime.killed_launches == []


def test_terminate_kills_a_launch_still_claimed_at_the_end_by_its_marker(world):
    """A launch that never reported its start by the end of terminate() is killed by its launch's marker: the
    runtime stopped right after would otherwise leave an agent it was forking running. A CLAIMED row this
    process never launched (a predecessor's claim) is left alone."""
    world.life.kill_grace = 8.0
    w = world.queued()
    assert world.life.dispatch_task(w).disposition == Disposition.DISPATCHED
    ref = world.runtime.launched[-1].ref
    foreign = world.claim_only(world.queued())
    world.life.terminate(sleep=world.clock.tick)
    assert world.runtime.killed == [ref]
    assert world.runtime.killed_launches == [launch_id(ref)]
    assert launch_id(foreign.ref) not in world.runtime.killed_launches


# --- hole 2 (part): adopting what this process already runs changes nothing ----------------------------
def test_adopting_an_attempt_this_process_runs_changes_nothing(world):
    w, ref = world.dispatched()

    ti = world.adoptable(w, "running")

    not_adopted, _ = world.life.adopt([ti], now=T0)
    assert not_adopted == []
    assert world.life.take() == []
    assert not world.life.table.get(launch_id(ref)).adopted
    assert world.runtime.launched[-1].ref == ref and len(world.runtime.launched) == 1


def test_revoke_kills_closes_and_releases(world):
    w, ref = world.dispatched()
    world.life.take()
    world.life.revoke(ref.ti_id, w.key)
    actions = world.life.take()
    assert world.runtime.killed == [ref]
    assert world.row(ref).resolution == Resolution.REVOKED
    assert Release(w.key) in actions and not [a for a in actions if isinstance(a, (Fail, Occupy))]


def test_dispatch_answers_deferred_while_the_runtime_is_not_up(world):
    world.runtime.admit_result = DispatchResult(Disposition.DEFERRED, "the zygote is not running")
    w = world.queued()
    assert world.life.dispatch_task(w).disposition == Disposition.DEFERRED
    assert world.epochs(str(w.ti.id)) == []


# --- hole 4: re-dispatch backs off, and its limit counts per dispatch cycle ---------------------------------
def test_a_second_redispatch_in_a_row_waits_its_backoff(tmp_path):
    world = World(tmp_path, redispatch_limit="3")
    w, ref = world.dispatched()
    (first,) = [a for a in world.exit(ref, code=1) if isinstance(a, Reoffer)]  # the first: at once
    world.life.dispatch_task(first.workload)
    ref2 = world.runtime.launched[-1].ref
    world.runtime.events.append(Started(launch_id(ref2), {"pid": 4243, "proc_start_time": 78}))
    assert not [a for a in world.exit(ref2, code=1) if isinstance(a, Reoffer)]
    world.clock.tick(4)
    assert not [a for a in world.life.cycle() if isinstance(a, Reoffer)]
    world.clock.tick(1)
    assert [a.key for a in world.life.cycle() if isinstance(a, Reoffer)] == [w.key]


def test_redispatch_limit_counts_per_dispatch_cycle_not_over_the_ti_ids_life(tmp_path):
    world = World(tmp_path, redispatch_limit="1")
    w, ref = world.dispatched()
    (reoffer,) = [a for a in world.exit(ref, code=1) if isinstance(a, Reoffer)]  # one re-dispatch: the limit
    world.life.dispatch_task(reoffer.workload)
    ref2 = world.runtime.launched[-1].ref
    world.runtime.events.append(Started(launch_id(ref2), {"pid": 4243, "proc_start_time": 78}))
    world.life.cycle()
    world.record(ref2, "deferred")  # epoch 2 ran and deferred; the trigger fired; the same ti_id is queued again
    world.runtime.events.append(Reported(launch_id(ref2), "deferred"))
    world.exit(ref2)
    assert world.row(ref2).resolution == Resolution.REPORTED
    world.life.dispatch_task(w)
    ref3 = world.runtime.launched[-1].ref
    world.runtime.events.append(Started(launch_id(ref3), {"pid": 4244, "proc_start_time": 79}))
    world.life.cycle()
    actions = world.exit(ref3, code=1)  # a new dispatch cycle: its first re-dispatch is allowed
    assert world.row(ref3).resolution == Resolution.REDISPATCHED
    assert [a.key for a in actions if isinstance(a, Reoffer)] == [w.key]
    assert not [a for a in actions if isinstance(a, Fail)]


# --- Task D's interfaces: a refused replay is re-driven; an unreplayable current record holds the purge off --
def test_replay_refused_for_good_is_redriven_with_its_detail(world):
    from dataclasses import dataclass

    @dataclass(frozen=True)
    class Refused:
        settled: bool = False
        applied: bool = False
        detail: str = "HTTP 422"
        retryable: bool = False

    w, ref = world.dispatched()
    world.airflow.set_state(ref.ti_id, "running")
    world.record(ref, "success")
    world.airflow.replay_result = lambda r: Refused()
    world.exit(ref)
    row = world.row(ref)
    assert (row.state, row.resolution) == (S.CLOSED, Resolution.INFRA_REDRIVE)
    assert "HTTP 422" in row.detail and world.airflow.redrives == [ref.ti_id]


def test_replay_that_cannot_land_yet_holds_off_airflows_purge(world):
    w, ref = world.dispatched()
    world.airflow.set_state(ref.ti_id, "running")
    world.record(ref, "success")
    world.airflow.replay_result = lambda r: SettleResult(False, False, "transport error: ConnectError", retryable=True)
    world.exit(ref)
    assert world.row(ref).state == S.SETTLING  # a replay was sent; it is retried
    assert world.airflow.held_off == [ref.ti_id]


def test_purge_hold_off_ends_after_replay_holdoff_max_seconds(tmp_path):
    """The hold-off is bounded: past ``[leoflow] replay_holdoff_max_seconds`` after the attempt was found dead,
    Airflow's own purge applies again (a replay that never lands cannot keep a TI RUNNING for ever)."""
    world = World(tmp_path, replay_holdoff_max_seconds="100")
    w, ref = world.dispatched()
    world.airflow.set_state(ref.ti_id, "running")
    world.record(ref, "success")
    world.airflow.replay_result = lambda r: SettleResult(False, False, "transport error: ConnectError", retryable=True)
    world.exit(ref)
    assert world.airflow.held_off == [ref.ti_id]
    world.clock.tick(60)
    world.life.cycle()
    assert world.airflow.held_off == [ref.ti_id] * 2
    world.clock.tick(60)
    world.life.cycle()
    assert world.airflow.held_off == [ref.ti_id] * 2, "held off past replay_holdoff_max_seconds"
    assert world.row(ref).state == S.SETTLING
    world.engine.dispose()


# --- issue 10 item 1: keyset-paged candidates; live rows never hide a lost one -------------------------------
def _paged_world(tmp_path, n: int, **options: str):
    """``n`` dispatched attempts (their TIs RUNNING with a fresh heartbeat) under ``reap_page_size = 2``, and a
    fresh lifecycle over them (a restarted scheduler: its LIVE cursor at the start, its gate closed)."""
    world = World(tmp_path, reap_page_size="2", **options)
    refs = [world.dispatched()[1] for _ in range(n)]
    for ref in refs:
        world.airflow.set_state(ref.ti_id, "running")
        world.airflow.heartbeats[ref.ti_id] = world.clock.utcnow()
    world.life = world.new_lifecycle()
    world.runtime.observed.clear()
    return world, refs


def test_a_gone_attempt_behind_live_ones_is_settled_within_one_sweep_of_pages(tmp_path):
    """Page size 2, four LIVE attempts first and a GONE one (its pod confirmed absent: no ``Exited`` event)
    last: each cycle observes at most 2 LIVE attempts, the GONE one is reached on the 3rd cycle =
    ceil(5 / 2) and settled from its record there, and not before."""
    world, refs = _paged_world(tmp_path, 5)
    lost = refs[-1]
    world.runtime.presence[lost] = Presence.GONE
    world.record(lost, "success")
    for _ in range(2):
        world.life.cycle()
        assert world.row(lost).state == S.DISPATCHED
    world.life.cycle()
    assert world.row(lost).state == S.CLOSED and world.row(lost).resolution == Resolution.REPLAYED
    assert [len(refs_seen) for refs_seen in world.runtime.observed] == [2, 2, 1]
    assert [r for seen in world.runtime.observed for r in seen] == refs  # each once, in ledger order
    assert [world.row(r).state for r in refs[:-1]] == [S.DISPATCHED] * 4


def test_a_silent_attempt_past_the_page_is_reaped_within_one_sweep(tmp_path):
    """After a first full sweep opened the gate, the last of five attempts goes heartbeat-silent: the reaper,
    which sees one page of two per cycle, kills it within ceil(5 / 2) = 3 cycles, and no other."""
    world, refs = _paged_world(tmp_path, 5, agent_lost_threshold="60")
    for _ in range(3):  # the first sweep: the gate opens as the cursor wraps
        world.life.cycle()
    assert world.life.gate.is_open(world.clock.monotonic()) and world.runtime.killed == []
    world.clock.tick(120)
    for ref in refs[:-1]:
        world.airflow.heartbeats[ref.ti_id] = world.clock.utcnow()  # the others keep heartbeating
    cycles = 0
    while world.runtime.killed == [] and cycles < 3:
        world.life.cycle()
        cycles += 1
    assert world.runtime.killed == [refs[-1]]


def test_the_settling_gate_opens_only_after_every_live_row_was_looked_at(tmp_path):
    """With 5 LIVE attempts and pages of 2 the gate (reap_grace 0) stays closed for the first two cycles and
    opens at the end of the third, when the cursor wraps; an adoption restarts the sweep it waits for."""
    world, refs = _paged_world(tmp_path, 5)
    gate = world.life.gate
    world.life.cycle()
    world.life.cycle()
    assert not gate.is_open(world.clock.monotonic())
    world.life.cycle()
    assert gate.is_open(world.clock.monotonic())
    world.life.cycle()  # a page in the middle of the next sweep
    world.life.adopt([], world.clock.utcnow())
    for _ in range(2):
        world.life.cycle()
        assert not gate.is_open(world.clock.monotonic())
    world.life.cycle()
    assert gate.is_open(world.clock.monotonic())


def test_rows_that_need_action_are_read_whole_every_cycle(tmp_path):
    """CLAIMED and EXITED rows are not paged: an exited attempt behind a full page of LIVE ones is settled in
    the very next cycle."""
    world, refs = _paged_world(tmp_path, 4)
    world.record(refs[-1], "success")
    world.runtime.presence[refs[-1]] = Presence.GONE
    assert world.ledger.transition(refs[-1], expected=[S.DISPATCHED], to=S.EXITED)  # the runtime said so
    world.life.cycle()
    assert world.row(refs[-1]).resolution == Resolution.REPLAYED
    assert world.runtime.observed == [refs[:2]]


# --- issue 10 item 1: the orphan-run reaper ------------------------------------------------------------------
def _running_ti(ti_id: str, silent_since: datetime, **kw):
    from leoflow_airflow.reap.orphan import RunningTI

    values = dict(ti_id=ti_id, dag_id="dag", run_id="run", task_id="task", map_index=-1, try_number=1,
                  state="running", executor=None, run_state="running", start_date=silent_since,
                  last_heartbeat_at=silent_since, run_start_date=silent_since - timedelta(seconds=5))
    values.update(kw)
    return RunningTI(**values)


def _ours(world) -> None:
    from leoflow_airflow.reap.orphan import Ownership

    world.life.ownership = Ownership(frozenset({"LeoflowExecutor"}), default=True)


def test_orphan_run_is_redriven_through_the_infra_path_and_watched_ones_are_not(tmp_path):
    """A RUNNING TI of this executor with no open attempt, silent past ``orphan_run_threshold``, is re-driven
    on the infra budget with a reason naming the reaper; one with an open attempt, or silent for less, is left
    alone. The re-drive happens once: after it the TI is no longer RUNNING."""
    world = World(tmp_path, orphan_run_threshold="100")
    _ours(world)
    w, watched = world.dispatched()
    now = world.clock.utcnow()
    orphan_id, recent_id = str(uuid.uuid4()), str(uuid.uuid4())
    world.airflow.running = [_running_ti(orphan_id, now - timedelta(seconds=150)),
                             _running_ti(recent_id, now - timedelta(seconds=50)),
                             _running_ti(watched.ti_id, now - timedelta(seconds=150))]
    world.life.cycle()
    assert world.airflow.redrives == [orphan_id]
    reason = world.airflow.redrive_reasons[0]
    assert reason.startswith("leoflow orphan-run: ") and "no open leoflow attempt" in reason and "150 s" in reason
    world.airflow.running = [r for r in world.airflow.running if r.ti_id != orphan_id]  # reset by the re-drive
    world.life.cycle()
    assert world.airflow.redrives == [orphan_id]


def _reported_and_closed(world, state: str, **kw):
    """Dispatch a workload whose agent reports ``state`` (Airflow takes it) and exits: its attempt closes
    ``reported``. Returns its ref."""
    _, ref = world.dispatched(**kw)
    world.runtime.events.append(Reported(launch_id(ref), state))
    world.life.cycle()
    world.airflow.set_state(ref.ti_id, state)
    world.exit(ref)
    assert (world.row(ref).state, world.row(ref).resolution) == (S.CLOSED, Resolution.REPORTED)
    return ref


def test_a_success_overwritten_after_its_settle_is_restored_by_the_orphan_run_reaper_not_rerun(tmp_path):
    """The agent's success landed and its attempt closed ``reported``; then a late ``PATCH /run`` of the same
    execution set the TI RUNNING again (SQLite). 30 s of silence later the orphan-run reaper PATCHes the success
    again from the ledger (that attempt's identity, its report time as ``end_date``) and writes a Log row; it
    re-drives nothing, so the body never runs twice. A restore that stalls on the api-server ends the pass's
    restores."""
    world = World(tmp_path, orphan_run_threshold="240")
    _ours(world)
    ref = _reported_and_closed(world, "success")
    reported_at = world.row(ref).reported_at
    now = world.clock.utcnow()
    world.airflow.set_state(ref.ti_id, "running")  # the late /run
    world.airflow.running = [_running_ti(ref.ti_id, now - timedelta(seconds=20))]
    world.life.reap_orphans()
    assert world.airflow.replays == [] and world.airflow.redrives == []  # not silent for 30 s yet
    world.airflow.running = [_running_ti(ref.ti_id, now - timedelta(seconds=31))]
    results = world.life.reap_orphans()
    assert world.airflow.redrives == []
    (record,) = world.airflow.replays
    assert (record.ti_id, record.try_number, record.attempt_epoch, record.state) == (ref.ti_id, 1, 1, "success")
    assert record.payload["state"] == "success" and record.payload["end_date"].startswith(
        reported_at.strftime("%Y-%m-%dT%H:%M:%S"))
    assert [r.applied for _, r in results] == [True]
    events = [a for a in world.life.take() if isinstance(a, TaskEvent)]
    assert [e.event for e in events] == ["leoflow orphan-run"] and "restoring it" in events[0].extra

    # two such orphans while the api-server does not answer: one call, then the pass stops restoring
    world.airflow.running = []
    ref2 = _reported_and_closed(world, "success", task_id="t2")
    world.airflow.replays.clear()
    world.airflow.replay_result = lambda r: SettleResult(False, False, "timed out", retryable=True)
    world.airflow.running = [_running_ti(i, now - timedelta(seconds=31)) for i in (ref.ti_id, ref2.ti_id)]
    world.life.reap_orphans()
    assert len(world.airflow.replays) == 1 and world.airflow.redrives == []


def test_a_failure_overwritten_after_its_settle_is_restored_as_airflows_terminal_payload(tmp_path):
    """The same race after a landed ``failed`` report: the restore PATCHes ``failed`` again with Airflow's
    terminal payload (state and end_date, no asset fields), re-drives nothing (a failed task must not run again
    on the infra budget) and makes up no callback (the task child ran its failure callback)."""
    world = World(tmp_path, orphan_run_threshold="240")
    _ours(world)
    ref = _reported_and_closed(world, "failed")
    world.life.take()
    world.airflow.set_state(ref.ti_id, "running")  # the late /run
    world.airflow.running = [_running_ti(ref.ti_id, world.clock.utcnow() - timedelta(seconds=31))]
    world.life.reap_orphans()
    assert world.airflow.redrives == []
    (record,) = world.airflow.replays
    assert (record.state, sorted(record.payload)) == ("failed", ["end_date", "state"])
    assert not record.callbacks_pending
    actions = world.life.take()
    assert [a.event for a in actions if isinstance(a, TaskEvent)] == ["leoflow orphan-run"]
    assert not [a for a in actions if isinstance(a, SendCallback)]


def test_orphan_run_reaper_pages_airflows_running_rows_with_its_own_cursor(tmp_path):
    """Page size 2: each cycle reads one page of 2 (+1 to see the end) after the last id; the orphan last in id
    order is reached on the 3rd cycle, then the cursor wraps to the start."""
    world = World(tmp_path, orphan_run_threshold="100", reap_page_size="2")
    _ours(world)
    old = world.clock.utcnow() - timedelta(seconds=500)
    watched = sorted(world.claim_only(world.queued()).ref.ti_id for _ in range(4))  # each has an open attempt
    ids = watched + [watched[-1][:-1] + "z"]  # the orphan sorts last
    world.airflow.running = [_running_ti(ti_id, old) for ti_id in ids]
    for _ in range(2):
        world.life.reap_orphans()
    assert world.airflow.redrives == []
    world.life.reap_orphans()
    assert world.airflow.redrives == [ids[-1]]
    assert world.airflow.running_reads == [(None, 3), (ids[1], 3), (ids[3], 3)]
    world.life.reap_orphans()
    assert world.airflow.running_reads[-1] == (None, 3)  # wrapped


def test_orphan_run_reaper_waits_for_the_settling_gate(tmp_path):
    """Behind the gate like the other reapers: with ``reap_grace`` not yet over nothing is re-driven."""
    world = World(tmp_path, orphan_run_threshold="100", reap_grace="60")
    _ours(world)
    world.airflow.running = [_running_ti(str(uuid.uuid4()), world.clock.utcnow() - timedelta(seconds=500))]
    world.life.cycle()
    assert world.airflow.redrives == [] and world.airflow.running_reads == []
    world.clock.tick(61)
    world.life.cycle()
    assert len(world.airflow.redrives) == 1


def test_a_failed_read_of_airflows_running_rows_does_not_break_the_cycle(tmp_path):
    """The orphan-run reaper's read fails (a DB hiccup): the cycle still settles and collects, and the next
    cycle tries again."""
    world = World(tmp_path, orphan_run_threshold="100")
    _ours(world)
    w, ref = world.dispatched()
    world.record(ref, "success")
    calls = []

    def broken(after, limit):
        calls.append(after)
        raise RuntimeError("database is locked")

    world.airflow.running_tis = broken
    world.exit(ref)
    assert world.row(ref).state == S.CLOSED and len(calls) == 1
    world.life.cycle()
    assert len(calls) == 2


def test_a_live_peers_exited_row_is_left_to_it_so_its_slot_is_freed_and_a_dead_peers_is_settled(world):
    """Issue 10 item 5: two schedulers share the ledger. Attempts of scheduler job 1 exit; scheduler job 2
    (alive beside it) leaves the rows to their owner, whose close frees its executor slots (``Release``). Before,
    the peer closed them and the owner's slots stayed taken for good. Once the owner's job is dead, its rows are
    the survivor's to settle."""

    def scheduler(job_id: int) -> Lifecycle:
        return Lifecycle(ledger=world.ledger, runtime=world.runtime, airflow=world.airflow, settings=world.settings,
                         job_id=job_id, monotonic=world.clock.monotonic, utcnow=world.clock.utcnow)

    owner, peer = scheduler(1), scheduler(2)
    world.airflow.alive_jobs = {1, 2}

    def running(task_id: str):
        """An attempt ``owner`` dispatched and started."""
        w = world.workload(task_id=task_id)
        world.airflow.put(str(w.ti.id), "queued", logical=("dag", "run", task_id, -1), queued_by_job_id=1)
        assert owner.dispatch_task(w).disposition == Disposition.DISPATCHED
        ref = world.runtime.launched[-1].ref
        world.runtime.events.append(Started(launch_id(ref), {"pid": 4242, "proc_start_time": 77}))
        owner.cycle()
        return w, ref

    def exit_with_success(ref) -> None:
        """Its agent is gone, its success landed: the row is EXITED, to be closed REPORTED."""
        world.airflow.set_state(ref.ti_id, "success")
        world.record(ref, "success")
        world.runtime.presence[ref] = Presence.GONE
        assert world.ledger.transition(ref, expected=[S.DISPATCHED], to=S.EXITED)

    (w1, ref1), (w2, ref2) = running("t1"), running("t2")
    exit_with_success(ref1)
    exit_with_success(ref2)
    peer.cycle()
    assert [world.row(ref1).state, world.row(ref2).state] == [S.EXITED, S.EXITED]  # the owner's to settle
    actions = owner.cycle()
    assert (world.row(ref1).state, world.row(ref1).resolution) == (S.CLOSED, Resolution.REPORTED)
    assert world.row(ref2).state == S.CLOSED
    assert Release(w1.ti.key) in actions and Release(w2.ti.key) in actions

    _, ref3 = running("t3")
    exit_with_success(ref3)
    world.airflow.alive_jobs = {2}  # the owner's scheduler died
    peer.cycle()
    assert (world.row(ref3).state, world.row(ref3).resolution) == (S.CLOSED, Resolution.REPORTED)


# --- [leoflow] sweep_interval: presence passes are paced, events and rows that need action are not --------------
def test_presence_passes_come_sweep_interval_apart_and_catch_a_silent_death(tmp_path):
    """``sweep_interval`` 2: an agent that died without an ``Exited`` event (its presence GONE) is left
    DISPATCHED by the cycles inside the interval (no LIVE page observed, no page of Airflow's RUNNING rows read)
    and settled from its record by the first cycle past it, which also runs the orphan-run reaper's page."""
    world = World(tmp_path, sweep_interval="2")
    _w, ref = world.dispatched()  # its cycle was the first presence pass
    world.airflow.set_state(ref.ti_id, "running")
    world.record(ref, "success")
    world.runtime.presence[ref] = Presence.GONE
    observed, reads = len(world.runtime.observed), len(world.airflow.running_reads)
    for _ in range(3):
        world.clock.tick(0.5)
        world.life.cycle()
    assert world.row(ref).state == S.DISPATCHED
    assert (len(world.runtime.observed), len(world.airflow.running_reads)) == (observed, reads)
    world.clock.tick(0.5)  # 2 s after the first pass
    world.life.cycle()
    assert world.row(ref).state == S.CLOSED and world.row(ref).resolution == Resolution.REPLAYED
    assert len(world.runtime.observed) == observed + 1 and len(world.airflow.running_reads) == reads + 1


def test_an_exit_event_is_settled_at_once_between_presence_passes(tmp_path):
    """``sweep_interval`` 60 (and ``maintenance_interval`` 60): the runtime's ``Exited`` event moves the attempt on and the row, now one that
    needs action, is settled from its record by that same cycle, long before the next presence pass."""
    world = World(tmp_path, sweep_interval="60", maintenance_interval="60")
    _w, ref = world.dispatched()
    world.airflow.set_state(ref.ti_id, "running")
    world.record(ref, "success")
    observed = len(world.runtime.observed)
    world.clock.tick(1)
    world.exit(ref)
    assert world.row(ref).state == S.CLOSED and world.row(ref).resolution == Resolution.REPLAYED
    assert len(world.runtime.observed) == observed  # settled without a presence pass


# --- k8s review §2: adoption never reads an unsynced pod cache as "no record" -----------------------------------
class _SyncingInformer:
    """A pod informer whose first LIST has not finished (``synced`` False, nothing cached) until the test says."""

    last_error = None

    def __init__(self, *args) -> None:
        self.synced = False
        self.pods: dict = {}

    def start(self) -> None:
        pass

    def stop(self, timeout: float) -> None:
        pass

    def get(self, name):
        return self.pods.get(name)

    def tombstone(self, name, uid):
        return None

    def views(self):
        return list(self.pods.values())

    def ending(self):
        return [v for v in self.pods.values() if v.terminal or v.deleting]

    def has_uid(self, uid):
        return any(v.uid == uid for v in self.pods.values())

    def take_changed(self):
        return set(self.pods)


def test_adoption_before_the_pod_cache_synced_does_not_reset_a_settling_attempt(world, monkeypatch):
    """A pod ended Succeeded with its success record while its report was lost; the scheduler died with the row
    SETTLING (its replay stalled) and restarts. Airflow adopts in the same loop iteration as ``start()``, before
    the pod informer's first LIST ends: the attempt is adopted with its heartbeat renewed, not reset as lost
    (which would run the finished body again on a new try), and once the cache syncs its record is replayed."""
    from types import SimpleNamespace

    from leoflow_airflow.runtime.kubernetes.identity import IDENTITY_ANNOTATION, identity_annotation
    from leoflow_airflow.runtime.kubernetes.pod import AGENT_CONTAINER, OUTCOME_FINALIZER
    from leoflow_airflow.runtime.kubernetes.runtime import KubernetesRuntime
    from leoflow_airflow.runtime.kubernetes.status import pod_view

    core = SimpleNamespace(list_namespaced_pod=lambda *a, **k: SimpleNamespace(items=[]),
                           read_namespace=lambda *a, **k: None, read_namespaced_service_account=lambda *a, **k: None)
    monkeypatch.setattr("kubernetes.client.CoreV1Api", lambda api: core)
    conf = {"runtime": "kubernetes", "image": "img:1", "exchange_url": "http://x/leoflow"}
    informers: list[_SyncingInformer] = []
    rt = KubernetesRuntime(leoflow_settings.load(lambda section, key, fallback: conf.get(key, fallback)),
                           api_client_factory=lambda: SimpleNamespace(),
                           informer_factory=lambda *a: informers.append(_SyncingInformer()) or informers[-1],
                           mutation_hook=False)
    w = world.queued()
    ti_id = str(w.ti.id)
    attempt = world.ledger.claim_epoch(ti_id=ti_id, try_number=1, dag_id="dag", task_id="task", run_id="run",
                                       map_index=-1, runtime="kubernetes", scheduler_job_id=1,
                                       workload_json=w.model_dump_json(exclude={"token"}))
    ref, name, uid = attempt.ref, "leoflow-pod-1", "uid-1"
    assert world.ledger.transition(ref, expected=[S.CLAIMED], to=S.DISPATCHED, pod_name=name, pod_uid=uid)
    assert world.ledger.transition(ref, expected=[S.DISPATCHED], to=S.EXITED)
    assert world.ledger.transition(ref, expected=[S.EXITED], to=S.SETTLING)  # then the scheduler died
    world.airflow.set_state(ti_id, "running")
    world.runtime = rt
    life = world.new_lifecycle()
    rt.start()
    try:
        ti = world.adoptable(w, "running")
        assert life.adopt([ti], now=T0) == ([], [])  # adopted, not lost: no infra budget, no reset
        assert ti.last_heartbeat_at == T0  # Airflow's purge waits for the settle
        life.cycle()
        assert world.row(ref).state == S.SETTLING and world.airflow.replays == []  # still cannot tell: waits

        ident = outcome.AttemptIdentity(ref.ti_id, ref.try_number, ref.attempt_epoch)
        record = outcome.record_for_state("success", PAYLOADS["success"], attempt=ident, api_version="2025-09-23")
        ended = {"terminated": {"exitCode": 0, "reason": "Completed", "message": outcome.encode(record)}}
        informers[0].pods[name] = pod_view({
            "metadata": {"name": name, "uid": uid, "namespace": "default", "finalizers": [OUTCOME_FINALIZER],
                         "annotations": {IDENTITY_ANNOTATION: identity_annotation(ref)}},
            "status": {"phase": "Succeeded", "containerStatuses": [{"name": AGENT_CONTAINER, "state": ended}]}})
        informers[0].synced = True
        life.cycle()
        row = world.row(ref)
        assert (row.state, row.resolution) == (S.CLOSED, Resolution.REPLAYED)
        assert [r.state for r in world.airflow.replays] == ["success"]
    finally:
        rt.terminate()


def test_a_presence_pass_weighs_each_tis_heartbeat_and_reads_it_once_for_the_reapers(tmp_path):
    """k8s review §14: the runtime is told how old each LIVE attempt's TI heartbeat is (so a pod object alone
    cannot make a heartbeating attempt GONE), and the reapers act on the same read: one ``ti_liveness`` per page."""
    world = World(tmp_path, agent_lost_threshold="60")
    w, ref = world.dispatched()
    world.airflow.set_state(ref.ti_id, "running")
    reads: list[list[str]] = []

    def liveness(ids):
        reads.append(list(ids))
        return {i: ("running", world.clock.utcnow() - timedelta(seconds=3)) for i in ids}

    world.airflow.ti_liveness = liveness
    world.runtime.heartbeats_seen.clear()
    world.life.cycle()
    assert world.runtime.heartbeats_seen[-1] == {ref: pytest.approx(3.0)}
    assert reads == [[ref.ti_id]]
    assert world.runtime.killed == []
