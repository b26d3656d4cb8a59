"""WarmLedger on SQLite: every transition of a warm worker row and every refusal (issue 11, DESIGN "Warm
pools"); the in-band outcome records. The race of two assigns runs on PostgreSQL in
tests/integration/test_ledger_postgres.py."""

from __future__ import annotations

import hashlib
import uuid
from datetime import datetime, timedelta, timezone

import pytest
import sqlalchemy as sa

from leoflow_airflow.ledger.models import metadata
from leoflow_airflow.ledger.states import AttemptRef
from leoflow_airflow.ledger.store import LedgerStore
from leoflow_airflow.ledger.warm import WarmLedger

T0 = datetime(2026, 12, 3, 12, 0, 0, tzinfo=timezone.utc)
VERSION = "0199aaaa-0000-7000-8000-00000000dada"


class Clock:
    """A manual clock: aware UTC, advanced by the test."""

    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now

    def tick(self, seconds: float = 1.0) -> datetime:
        self.now += timedelta(seconds=seconds)
        return self.now


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def engine(tmp_path):
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'ledger.db'}")
    metadata.create_all(engine)
    yield engine
    engine.dispose()


@pytest.fixture
def warm(engine, clock) -> WarmLedger:
    return WarmLedger(engine, clock=clock)


def register(warm: WarmLedger, uid: str = "uid-1", credential: str = "c1", **kw) -> bool:
    args = dict(pod_uid=uid, pod_name=f"pod-{uid}", namespace="ns", dag_version_id=VERSION,
                credential_sha256=sha(credential))
    args.update(kw)
    return warm.register(**args)


def ref(epoch: int = 1, ti_id: str = "0199bbbb-0000-7000-8000-000000000001") -> AttemptRef:
    return AttemptRef(ti_id, 1, epoch)


def test_register_inserts_an_idle_worker_found_by_its_credential_hash_only(warm, clock):
    assert register(warm)
    w = warm.get("uid-1")
    assert (w.pod_name, w.namespace, w.dag_version_id, w.state, w.ref) == ("pod-uid-1", "ns", VERSION, "idle", None)
    assert (w.registered_at, w.last_seen_at, w.attempts_taken, w.row_version) == (T0, None, 0, 0)
    assert warm.by_credential(sha("c1")) == w
    assert warm.by_credential(sha("other")) is None
    assert warm.by_credential("c1") is None  # the credential itself is never a key
    assert warm.get("uid-2") is None


def test_re_register_of_an_idle_worker_replaces_its_credential(warm, clock):
    register(warm, credential="old")
    clock.tick(5)
    assert register(warm, credential="new")
    assert warm.by_credential(sha("old")) is None
    w = warm.by_credential(sha("new"))
    assert w.pod_uid == "uid-1" and w.registered_at == clock.now and w.state == "idle"


@pytest.mark.parametrize("held", ["assigned", "busy"])
def test_re_register_of_a_worker_holding_an_attempt_is_refused(warm, held):
    register(warm, credential="old")
    assert warm.assign("uid-1", ref(), row_version=0)
    if held == "busy":
        assert warm.take("uid-1", ref())
    assert not register(warm, credential="new")
    assert warm.by_credential(sha("new")) is None
    w = warm.by_credential(sha("old"))
    assert (w.state, w.ref) == (held, ref())


def test_register_refuses_a_malformed_hash_or_empty_identity(warm):
    with pytest.raises(ValueError, match="SHA-256"):
        register(warm, credential_sha256="not-a-hash")
    with pytest.raises(ValueError, match="non-empty"):
        register(warm, dag_version_id="")
    assert warm.get("uid-1") is None


def test_the_full_cycle_assign_take_release_then_again(warm, clock):
    register(warm)
    clock.tick()
    assert warm.assign("uid-1", ref(1), row_version=0)
    w = warm.get("uid-1")
    assert (w.state, w.ref, w.assigned_at, w.taken_at, w.row_version) == ("assigned", ref(1), clock.now, None, 1)
    clock.tick()
    assert warm.take("uid-1", ref(1))
    w = warm.get("uid-1")
    assert (w.state, w.ref, w.taken_at, w.attempts_taken, w.row_version) == ("busy", ref(1), clock.now, 1, 2)
    assert warm.release("uid-1")
    w = warm.get("uid-1")
    assert (w.state, w.ref, w.assigned_at, w.taken_at, w.attempts_taken) == ("idle", None, None, None, 1)
    assert warm.assign("uid-1", ref(2), row_version=w.row_version)
    assert warm.take("uid-1", ref(2))
    assert warm.get("uid-1").attempts_taken == 2


def test_assign_is_guarded_on_state_and_row_version(warm):
    register(warm)
    assert not warm.assign("uid-1", ref(), row_version=7)  # read at another version: someone moved it
    assert warm.assign("uid-1", ref(1), row_version=0)
    assert not warm.assign("uid-1", ref(2), row_version=1)  # not idle any more
    assert warm.get("uid-1").ref == ref(1)
    assert not warm.assign("nobody", ref(), row_version=0)


def test_seen_moves_last_seen_but_not_the_row_version(warm, clock):
    register(warm)
    clock.tick(3)
    assert warm.seen("uid-1")
    w = warm.get("uid-1")
    assert (w.last_seen_at, w.row_version) == (clock.now, 0)
    assert warm.assign("uid-1", ref(), row_version=0)  # a poll never makes an assignment lose
    assert not warm.seen("nobody")


def test_take_and_unassign_need_exactly_the_assigned_attempt(warm):
    register(warm)
    assert not warm.take("uid-1", ref())  # idle: nothing to take
    assert not warm.unassign("uid-1", ref())
    warm.assign("uid-1", ref(2), row_version=0)
    assert not warm.take("uid-1", ref(1))  # another epoch of the same ti
    assert not warm.take("uid-1", AttemptRef(ref().ti_id, 2, 2))  # another try
    assert not warm.unassign("uid-1", ref(1))
    assert warm.unassign("uid-1", ref(2))
    w = warm.get("uid-1")
    assert (w.state, w.ref, w.assigned_at) == ("idle", None, None)
    assert not warm.take("uid-1", ref(2))  # unassigned: the agent can no longer take it


def test_unassign_does_not_touch_a_busy_worker_and_release_needs_busy(warm):
    register(warm)
    assert not warm.release("uid-1")
    warm.assign("uid-1", ref(), row_version=0)
    assert not warm.release("uid-1")  # assigned is not busy
    warm.take("uid-1", ref())
    assert not warm.unassign("uid-1", ref())  # the agent has it: only its next await lets go
    assert not warm.take("uid-1", ref())  # a second take of one assignment
    assert warm.get("uid-1").state == "busy"


def test_forget_deletes_the_row_and_its_credential(warm):
    register(warm)
    assert warm.forget("uid-1")
    assert warm.get("uid-1") is None and warm.by_credential(sha("c1")) is None
    assert not warm.forget("uid-1")
    assert register(warm, credential="c2")  # a pod registering after being forgotten is a new row


def test_workers_of_a_namespace(warm, clock):
    register(warm, "uid-b")
    clock.tick()
    register(warm, "uid-a", credential="c2")
    register(warm, "uid-x", credential="c3", namespace="other")
    assert [w.pod_uid for w in warm.workers("ns")] == ["uid-b", "uid-a"]
    assert [w.pod_uid for w in warm.workers("other")] == ["uid-x"]
    assert warm.workers("none") == []


def test_store_outcome_first_write_wins_and_outcomes_reads_exact_refs(engine, warm, clock):
    store = LedgerStore(engine, clock=clock)
    ti = str(uuid.uuid4())
    a1 = store.claim_epoch(ti_id=ti, try_number=1, dag_id="d", task_id="t", run_id="r", map_index=-1,
                           runtime="kubernetes", workload_json="{}", scheduler_job_id=1)
    a2 = store.claim_epoch(ti_id=ti, try_number=1, dag_id="d", task_id="t", run_id="r", map_index=-1,
                           runtime="kubernetes", workload_json="{}", scheduler_job_id=1)
    assert warm.outcomes([a1.ref, a2.ref]) == {}
    assert warm.store_outcome(a1.ref, '{"v":1,"outcome":"success"}')
    assert not warm.store_outcome(a1.ref, '{"v":1,"outcome":"failed"}')
    assert not warm.store_outcome(AttemptRef(ti, 1, 9), '{"v":1,"outcome":"failed"}')  # no such attempt
    assert warm.outcomes([a1.ref, a2.ref, AttemptRef(ti, 2, 1)]) == {a1.ref: '{"v":1,"outcome":"success"}'}
    assert warm.outcomes([]) == {}
    assert store.get(a1.ref).row_version == a1.row_version + 1  # a cached read of the attempt refreshes
    with pytest.raises(ValueError):
        warm.store_outcome(a2.ref, "")


def test_a_kill_marks_only_the_attempt_the_row_holds_and_the_marked_pod_takes_no_other(warm):
    """k8s review §7: the scheduler deletes a warm pod for a kill only when ``mark_killing`` changed its row. A
    row that let the attempt go (or holds another) is not marked; a marked one is never released to idle nor
    assigned again, so no newer attempt reaches the pod being deleted."""
    register(warm)
    warm.assign("uid-1", ref(1), row_version=0)
    assert not warm.mark_killing("uid-1", ref(1))  # assigned, not taken: the kill unassigns it instead
    warm.take("uid-1", ref(1))
    assert not warm.mark_killing("uid-1", ref(2))  # another epoch
    assert warm.mark_killing("uid-1", ref(1))
    assert warm.mark_killing("uid-1", ref(1))  # a repeated kill (a shorter grace) may delete again
    w = warm.get("uid-1")
    assert (w.state, w.ref) == ("killing", ref(1))
    assert not warm.release("uid-1")  # the worker's next await does not free it
    assert not warm.assign("uid-1", ref(2), row_version=w.row_version)
    assert warm.get("uid-1").state == "killing"


def test_the_pools_retire_of_an_idle_worker_and_a_schedulers_assign_exactly_one_wins(warm):
    """k8s review §16g: the pool deletes an idle warm pod only when ``retire_idle`` (guarded on ``idle`` and the
    ``row_version`` it read) deleted the row. An assign since that read wins and keeps the pod; after a retire,
    the assign finds no row and loses, and the pod's credential no longer names a worker."""
    register(warm)
    read = warm.get("uid-1")
    assert warm.assign("uid-1", ref(1), row_version=read.row_version)  # the scheduler won the race
    assert not warm.retire_idle("uid-1", row_version=read.row_version)
    assert warm.get("uid-1").state == "assigned"
    register(warm, "uid-2", "c2")
    read = warm.get("uid-2")
    warm.seen("uid-2")  # a worker's polling does not make the pool's retire lose
    assert warm.retire_idle("uid-2", row_version=read.row_version)
    assert not warm.assign("uid-2", ref(2), row_version=read.row_version)
    assert warm.get("uid-2") is None and warm.by_credential(sha("c2")) is None
    assert not warm.retire_idle("uid-2", row_version=read.row_version)  # once
