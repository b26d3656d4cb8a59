"""LedgerStore on SQLite: epoch claims, guarded writes and reads (DESIGN §2 Invariant 1)."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone

import pytest
import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

from leoflow_airflow.ledger.models import metadata
from leoflow_airflow.ledger.states import AttemptRef, AttemptState, IllegalTransition, Resolution
from leoflow_airflow.ledger.store import LedgerStore, Move

S = AttemptState
T0 = datetime(2025, 11, 29, 12, 0, 0, tzinfo=timezone.utc)


class Clock:
    """A manual clock: aware UTC, advanced by the test."""

    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now

    def tick(self, seconds: float = 1.0) -> datetime:
        self.now += timedelta(seconds=seconds)
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def store(tmp_path, clock) -> LedgerStore:
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'ledger.db'}")
    metadata.create_all(engine)
    yield LedgerStore(engine, clock=clock)
    engine.dispose()


def claim(store: LedgerStore, ti_id: str | None = None, *, try_number: int = 1, runtime: str = "lite", **kw):
    args = dict(
        ti_id=ti_id or str(uuid.uuid4()),
        try_number=try_number,
        dag_id="dag",
        task_id="task",
        run_id="run",
        map_index=-1,
        runtime=runtime,
        workload_json='{"ti": "x"}',
        scheduler_job_id=7,
    )
    args.update(kw)
    return store.claim_epoch(**args)


def test_claim_starts_at_epoch_one_and_stores_the_workload(store):
    a = claim(store, try_number=3)
    assert a.ref.attempt_epoch == 1 and a.ref.try_number == 3
    assert a.state is S.CLAIMED
    assert a.workload_json == '{"ti": "x"}' and a.scheduler_job_id == 7 and a.runtime == "lite"
    assert a.created_at == T0 == a.updated_at
    assert a.created_at.tzinfo is not None
    assert a.dispatched_at is None and a.closed_at is None and a.resolution is None
    assert store.get(a.ref) == a


def test_each_claim_of_the_same_ti_raises_the_epoch(store):
    ti = str(uuid.uuid4())
    epochs = [claim(store, ti).ref.attempt_epoch for _ in range(3)]
    assert epochs == [1, 2, 3]
    assert claim(store).ref.attempt_epoch == 1  # another ti_id starts over
    assert store.current(ti).ref.attempt_epoch == 3


def test_current_ref_names_the_highest_epoch_as_current_does(store):
    ti = str(uuid.uuid4())
    assert store.current_ref(ti) is None
    for _ in range(2):
        claim(store, ti, try_number=4)
    assert store.current_ref(ti) == store.current(ti).ref == AttemptRef(ti, 4, 2)


def test_the_fence_read_tells_a_superseded_try_from_the_current_one(store):
    """The Execution API fence's one statement (:func:`leoflow_airflow.api.execution_fence.superseded_try`) on
    Airflow's own tables: a ``ti_id`` whose ``task_instance`` row is still there is current; once a newer try took a
    new id and the old one went to ``task_instance_history``, the old one reads superseded as soon as the newer try
    is past ``up_for_retry``/``restarting`` (while it waits there, the old execution's retry callbacks may still
    read and write); an id in neither table is left to Airflow; a ``ti_id`` leoflow never ran reads None."""
    from airflow.models.taskinstance import TaskInstance
    from airflow.models.taskinstancehistory import TaskInstanceHistory

    from leoflow_airflow.api.execution_fence import superseded_try

    narrow = sa.MetaData()  # the columns the statement reads, typed as Airflow stores them

    def table(model, key):
        cols = model.__table__.c
        return sa.Table(model.__table__.name, narrow, sa.Column(key, cols[key].type, primary_key=True),
                        *(sa.Column(c, cols[c].type) for c in ("dag_id", "run_id", "task_id", "map_index", "state")))

    ti, tih = table(TaskInstance, "id"), table(TaskInstanceHistory, "task_instance_id")
    narrow.create_all(store.engine)
    old, new, lost = str(uuid.uuid4()), str(uuid.uuid4()), str(uuid.uuid4())
    logical = {"dag_id": "d", "run_id": "r", "task_id": "t", "map_index": -1}
    for ti_id in (old, lost):
        claim(store, ti_id, try_number=1)
    claim(store, old, try_number=1)
    with store.engine.begin() as conn:
        conn.execute(ti.insert().values(id=uuid.UUID(old), state="running", **logical))
    assert store.current_ref_and(old, superseded_try(old)) == (AttemptRef(old, 1, 2), False)

    def newer_try(state):
        with store.engine.begin() as conn:
            conn.execute(sa.update(ti).values(id=uuid.UUID(new), state=state))

    with store.engine.begin() as conn:  # prepare_db_for_next_try: archived, the row takes the next try's id
        conn.execute(tih.insert().values(task_instance_id=uuid.UUID(old), state="up_for_retry", **logical))
    for state, superseded in (("up_for_retry", False), ("restarting", False), (None, True), ("scheduled", True),
                              ("queued", True), ("running", True), ("success", True)):
        newer_try(state)
        assert store.current_ref_and(old, superseded_try(old)) == (AttemptRef(old, 1, 2), superseded), state
    assert store.current_ref_and(lost, superseded_try(lost)) == (AttemptRef(lost, 1, 1), False)
    assert store.current_ref_and(new, superseded_try(new)) is None


@pytest.mark.parametrize("returning", [True, False], ids=["insert-returning", "no-returning (MySQL)"])
def test_a_claimer_that_lost_the_race_claims_the_next_epoch(store, returning, monkeypatch):
    """The claim reads the highest epoch and inserts the next in two statements; a rival that inserts that epoch
    in between (here: from the claimer's own ``record_path_for``, called between the two) wins through the unique
    key, and the loser claims the epoch after it, with that epoch's record path. The same on a dialect without
    ``INSERT … RETURNING``, which reads the inserted row back."""
    monkeypatch.setattr(store.engine.dialect, "insert_returning", returning)
    ti = str(uuid.uuid4())
    rival: list[int] = []

    def path_for(epoch: int) -> str:
        if not rival:
            rival.append(claim(store, ti).ref.attempt_epoch)
        return f"/records/{epoch}"

    mine = claim(store, ti, record_path_for=path_for)
    assert rival == [1]
    assert (mine.ref.attempt_epoch, mine.record_path, mine.state) == (2, "/records/2", S.CLAIMED)
    assert store.current(ti) == mine


def test_a_claim_given_the_top_epoch_inserts_the_next_and_a_stale_hint_only_costs_a_retry(store):
    """``known_top`` (the highest epoch the dispatch just read) saves the claim's read; when a rival claimed in
    between, the hint is stale, the insert loses on the unique key, and the claim re-reads and takes the next."""
    ti = str(uuid.uuid4())
    assert claim(store, ti, known_top=0).ref.attempt_epoch == 1
    assert claim(store, ti, known_top=1).ref.attempt_epoch == 2
    stale = claim(store, ti, known_top=0, record_path_for=lambda e: f"/records/{e}")
    assert (stale.ref.attempt_epoch, stale.record_path) == (3, "/records/3")
    assert [a.ref.attempt_epoch for a in store.attempts_of_task("dag", "run", "task", -1)] == [1, 2, 3]


def test_current_many_names_each_tis_highest_epoch_in_one_read(store):
    one, two, none = (str(uuid.uuid4()) for _ in range(3))
    claim(store, one)
    claim(store, two)
    latest = claim(store, two, try_number=2)
    assert store.current_many([]) == {}
    got = store.current_many([one, two, none, two])
    assert set(got) == {one, two}
    assert got[two] == latest == store.current(two) and got[one] == store.current(one)


def test_a_real_constraint_violation_is_not_mistaken_for_a_lost_race(store):
    with pytest.raises(IntegrityError):
        claim(store, dag_id=None)


def test_normal_path_sets_facts_and_timestamps(store, clock):
    a = claim(store)
    t1 = clock.tick()
    assert store.transition(a.ref, expected=[S.CLAIMED], to=S.DISPATCHED, pid=4242, proc_start_time=170000000025)
    t2 = clock.tick()
    assert store.transition(a.ref, expected=[S.DISPATCHED], to=S.REPORTED, reported_state="success")
    t3 = clock.tick()
    assert store.transition(a.ref, expected=[S.REPORTED, S.DISPATCHED], to=S.EXITED, exit_status=0)
    t4 = clock.tick()
    assert store.transition(a.ref, expected=[S.EXITED], to=S.CLOSED, resolution=Resolution.REPORTED)

    got = store.get(a.ref)
    assert got.state is S.CLOSED and got.resolution is Resolution.REPORTED
    assert (got.pid, got.proc_start_time, got.reported_state, got.exit_status) == (4242, 170000000025, "success", 0)
    assert (got.dispatched_at, got.reported_at, got.exited_at, got.closed_at) == (t1, t2, t3, t4)
    assert got.updated_at == t4 and got.created_at == T0


def test_transition_many_moves_each_attempt_in_order_and_says_which_moves_changed_a_row(store, clock):
    """A scheduler loop's events of several attempts in one call: Started, Reported and Exited of one attempt
    land in order even when other attempts' moves come between them; a move whose guard fails is False."""
    a, b, c, d = (claim(store) for _ in range(4))
    t1 = clock.tick()
    got = store.transition_many([
        Move(a.ref, (S.CLAIMED,), S.DISPATCHED, {"pid": 11, "proc_start_time": 5}),
        Move(b.ref, (S.CLAIMED,), S.DISPATCHED, {"pid": 12, "proc_start_time": None}),
        Move(a.ref, (S.DISPATCHED,), S.REPORTED, {"reported_state": "success"}),
        Move(c.ref, (S.DISPATCHED,), S.REPORTED, {"reported_state": "success"}),  # c is only CLAIMED
        Move(b.ref, (S.DISPATCHED,), S.REPORTED, {"reported_state": "failed"}),
        Move(a.ref, (S.DISPATCHED, S.REPORTED), S.EXITED, {"exit_status": 0}),
        Move(b.ref, (S.DISPATCHED, S.REPORTED), S.EXITED, {"exit_status": None}),
        Move(d.ref, (S.CLAIMED,), S.CLOSED, {"resolution": Resolution.LAUNCH_FAILED, "detail": "fork: EAGAIN"}),
        Move(d.ref, (S.CLAIMED,), S.DISPATCHED, {"pid": 13}),  # after its close: refused
    ])
    assert got == [True, True, True, False, True, True, True, True, False]
    ra, rb, rc, rd = (store.get(x.ref) for x in (a, b, c, d))
    assert (ra.state, ra.pid, ra.proc_start_time, ra.reported_state, ra.exit_status) == (S.EXITED, 11, 5, "success", 0)
    assert (rb.state, rb.pid, rb.reported_state, rb.exit_status) == (S.EXITED, 12, "failed", None)
    assert (ra.dispatched_at, ra.reported_at, ra.exited_at, ra.row_version) == (t1, t1, t1, 3)
    assert rc.state is S.CLAIMED and rc.row_version == 0
    assert (rd.state, rd.resolution, rd.detail, rd.pid, rd.closed_at) == (S.CLOSED, Resolution.LAUNCH_FAILED,
                                                                         "fork: EAGAIN", None, t1)
    assert store.transition_many([]) == []


def test_transition_many_checks_every_move_before_writing_any(store):
    a, b = claim(store), claim(store)
    for bad, error in (
        (Move(b.ref, (S.CLAIMED,), S.REPORTED), IllegalTransition),
        (Move(b.ref, (S.CLAIMED,), S.CLOSED), ValueError),  # no resolution
        (Move(b.ref, (S.CLAIMED,), S.DISPATCHED, {"no_such_fact": 1}), TypeError),
        (Move(b.ref, (), S.DISPATCHED), ValueError),
    ):
        with pytest.raises(error):
            store.transition_many([Move(a.ref, (S.CLAIMED,), S.DISPATCHED, {"pid": 1}), bad])
    assert store.get(a.ref).state is S.CLAIMED and store.get(b.ref).state is S.CLAIMED


def test_guarded_write_changes_nothing_for_another_epoch_try_or_state(store, clock):
    a = claim(store)
    before = store.get(a.ref)
    clock.tick()
    ti, t, e = a.ref.ti_id, a.ref.try_number, a.ref.attempt_epoch
    assert not store.transition(AttemptRef(ti, t, e + 1), expected=[S.CLAIMED], to=S.DISPATCHED, pid=1)
    assert not store.transition(AttemptRef(ti, t + 1, e), expected=[S.CLAIMED], to=S.DISPATCHED, pid=1)
    assert not store.transition(a.ref, expected=[S.DISPATCHED], to=S.EXITED, pid=1)
    assert not store.record_facts(a.ref, expected=[S.DISPATCHED], pid=1)
    assert store.get(a.ref) == before


def test_second_identical_transition_loses(store):
    a = claim(store)
    assert store.transition(a.ref, expected=[S.CLAIMED], to=S.DISPATCHED) is True
    assert store.transition(a.ref, expected=[S.CLAIMED], to=S.DISPATCHED) is False


def test_stale_epoch_cannot_touch_the_current_epoch(store):
    ti = str(uuid.uuid4())
    old = claim(store, ti)
    assert store.transition(old.ref, expected=[S.CLAIMED], to=S.DISPATCHED)
    assert store.transition(old.ref, expected=[S.DISPATCHED], to=S.CLOSED, resolution="redispatched")
    new = claim(store, ti)
    assert store.transition(new.ref, expected=[S.CLAIMED], to=S.DISPATCHED, pid=2)
    current_before = store.current(ti)

    assert not store.transition(old.ref, expected=[S.DISPATCHED], to=S.EXITED)
    assert not store.record_facts(old.ref, expected=[S.DISPATCHED], pid=999)
    assert store.current(ti) == current_before
    assert store.get(old.ref).state is S.CLOSED


def test_illegal_transitions_raise_before_writing(store):
    a = claim(store)
    with pytest.raises(IllegalTransition):
        store.transition(a.ref, expected=[S.CLAIMED], to=S.REPORTED)
    # one bad edge among several expected states is still a programming error
    with pytest.raises(IllegalTransition):
        store.transition(a.ref, expected=[S.CLAIMED, S.CLOSED], to=S.DISPATCHED)
    with pytest.raises(IllegalTransition):
        store.transition(a.ref, expected=[S.CLAIMED], to=S.CLAIMED)
    assert store.get(a.ref).state is S.CLAIMED


def test_bad_arguments_are_rejected(store):
    a = claim(store)
    with pytest.raises(TypeError, match="bogus"):
        store.transition(a.ref, expected=[S.CLAIMED], to=S.DISPATCHED, bogus=1)
    with pytest.raises(TypeError, match="attempt_epoch"):
        store.record_facts(a.ref, expected=[S.CLAIMED], attempt_epoch=5)
    with pytest.raises(TypeError):
        store.record_facts(a.ref, expected=[S.CLAIMED])
    with pytest.raises(ValueError, match="expected"):
        store.transition(a.ref, expected=[], to=S.DISPATCHED)
    with pytest.raises(ValueError, match="resolution"):
        store.transition(a.ref, expected=[S.CLAIMED], to=S.CLOSED)
    with pytest.raises(ValueError):
        store.transition(a.ref, expected=[S.CLAIMED], to=S.CLOSED, resolution="gone")
    assert store.get(a.ref).state is S.CLAIMED


def test_record_facts_keeps_the_state(store, clock):
    a = claim(store)
    store.transition(a.ref, expected=[S.CLAIMED], to=S.DISPATCHED)
    t = clock.tick()
    assert store.record_facts(a.ref, expected=[S.DISPATCHED], record_path="/r/a.json", pod_name="p", pod_uid="u")
    got = store.get(a.ref)
    assert got.state is S.DISPATCHED
    assert (got.record_path, got.pod_name, got.pod_uid, got.updated_at) == ("/r/a.json", "p", "u", t)


def test_failed_settle_returns_to_exited_keeping_time_of_death(store, clock):
    a = claim(store)
    store.transition(a.ref, expected=[S.CLAIMED], to=S.DISPATCHED)
    died = clock.tick()
    store.transition(a.ref, expected=[S.DISPATCHED], to=S.EXITED)
    clock.tick()
    assert store.transition(a.ref, expected=[S.EXITED], to=S.SETTLING)
    clock.tick()
    assert store.transition(a.ref, expected=[S.SETTLING], to=S.EXITED, detail="settle timed out")
    got = store.get(a.ref)
    assert got.state is S.EXITED and got.exited_at == died and got.detail == "settle timed out"


def test_current_and_get(store):
    assert store.current("no-such-ti") is None
    a = claim(store)
    assert store.get(AttemptRef(a.ref.ti_id, a.ref.try_number, 2)) is None
    assert store.current(a.ref.ti_id) == a


def test_open_attempts_lists_unclosed_by_id_and_filters_runtime(store):
    lite1 = claim(store)
    k8s = claim(store, runtime="kubernetes")
    done = claim(store)
    store.transition(done.ref, expected=[S.CLAIMED], to=S.CLOSED, resolution="launch_failed")
    lite2 = claim(store)
    store.transition(lite2.ref, expected=[S.CLAIMED], to=S.DISPATCHED)

    assert [a.ref for a in store.open_attempts()] == [lite1.ref, k8s.ref, lite2.ref]
    assert [a.ref for a in store.open_attempts(runtime="lite")] == [lite1.ref, lite2.ref]
    assert [a.ref for a in store.open_attempts(runtime="kubernetes")] == [k8s.ref]


def _live(store: LedgerStore, state: AttemptState = S.DISPATCHED, **kw):
    """A claimed attempt moved to ``state`` (DISPATCHED, REPORTED, EXITED …); its current row."""
    a = claim(store, **kw)
    path = {S.DISPATCHED: [S.DISPATCHED], S.REPORTED: [S.DISPATCHED, S.REPORTED],
            S.EXITED: [S.DISPATCHED, S.EXITED], S.CLOSED: [S.CLOSED], S.CLAIMED: []}[state]
    frm = S.CLAIMED
    for to in path:
        extra = {"resolution": "launch_failed"} if to is S.CLOSED else {}
        assert store.transition(a.ref, expected=[frm], to=to, **extra)
        frm = to
    return store.get(a.ref)


def test_open_page_walks_live_rows_by_id_after_a_cursor(store):
    """Keyset pages (issue 10 item 1): LIVE rows of the runtime, ascending id, strictly after the cursor, at most
    ``limit``; rows of another state or runtime are never in a page, and paging on with the last id visits each
    LIVE row exactly once."""
    rows = [_live(store, S.DISPATCHED), _live(store, S.CLAIMED), _live(store, S.REPORTED),
            _live(store, S.DISPATCHED, runtime="kubernetes"), _live(store, S.EXITED), _live(store, S.CLOSED),
            _live(store, S.DISPATCHED), _live(store, S.REPORTED), _live(store, S.DISPATCHED)]
    live = [a for a in rows if a.state in (S.DISPATCHED, S.REPORTED) and a.runtime == "lite"]
    assert [a.id for a in rows] == sorted(a.id for a in rows)  # ids ascend in claim order
    states = [S.DISPATCHED, S.REPORTED]

    seen, after, pages = [], 0, 0
    while True:
        page = store.open_page(states=states, after_id=after, limit=2, runtime="lite")
        assert len(page) <= 2 and [a.id for a in page] == sorted(a.id for a in page)
        assert all(a.id > after for a in page)
        seen += page
        pages += 1
        if len(page) < 2:
            break
        after = page[-1].id
    assert [a.ref for a in seen] == [a.ref for a in live]  # each once, in ledger order
    assert pages == 3  # 5 LIVE lite rows: 2 + 2 + 1

    assert [a.ref for a in store.open_page(states=states, after_id=0, limit=10)] == \
        [a.ref for a in rows if a.state in (S.DISPATCHED, S.REPORTED)]  # no runtime: every runtime's
    assert store.open_page(states=states, after_id=rows[-1].id, limit=5, runtime="lite") == []
    for bad in ({"limit": 0, "after_id": 0}, {"limit": 1, "after_id": -1}):
        with pytest.raises(ValueError):
            store.open_page(states=states, **bad)


def test_every_guarded_write_that_changes_a_row_moves_its_row_version_and_a_refused_one_does_not(store):
    """Revision 0006: ``row_version`` counts the writes that changed the row (transition, facts, exchange); a
    guarded write that changed nothing leaves it, so a reader holding the row at that version holds it as is."""
    a = claim(store, runtime="kubernetes")
    assert a.row_version == 0
    assert store.transition(a.ref, expected=[S.CLAIMED], to=S.DISPATCHED, pod_name="p")
    assert store.get(a.ref).row_version == 1
    assert not store.transition(a.ref, expected=[S.CLAIMED], to=S.DISPATCHED)  # refused: nothing moves
    assert store.record_facts(a.ref, expected=[S.DISPATCHED], pod_uid="u")
    assert store.record_exchange(a.ref, credential_id="JTI=x")
    assert not store.record_exchange(a.ref, credential_id="JTI=y")
    assert store.get(a.ref).row_version == 3


def test_open_page_rereads_only_the_rows_another_writer_changed(tmp_path, clock):
    """Issue 10, "Benchmark": a page of running attempts reads whole rows only for what changed since this store
    last read them, and what it returns is always the row as it is now, also when another scheduler's store
    (a second engine on the same database) wrote it."""
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    engines = [sa.create_engine(url), sa.create_engine(url)]
    metadata.create_all(engines[0])
    ours, peer = LedgerStore(engines[0], clock=clock), LedgerStore(engines[1], clock=clock)
    whole: list[str] = []
    sa.event.listen(engines[0], "before_cursor_execute",
                    lambda conn, cur, statement, *rest: whole.append(statement) if " IN (" in statement else None)
    try:
        rows = [_live(peer, S.DISPATCHED) for _ in range(4)]
        states = [S.DISPATCHED, S.REPORTED]
        first = ours.open_page(states=states, after_id=0, limit=10)
        assert [a.ref for a in first] == [a.ref for a in rows] and len(whole) == 1
        assert ours.open_page(states=states, after_id=0, limit=10) == first and len(whole) == 1  # nothing moved
        assert peer.transition(rows[1].ref, expected=[S.DISPATCHED], to=S.REPORTED, reported_state="success")
        assert peer.record_facts(rows[2].ref, expected=[S.DISPATCHED], pod_uid="u-2")
        again = ours.open_page(states=states, after_id=0, limit=10)
        assert len(whole) == 2 and whole[-1].count("?") == 2  # the two changed rows, and only them
        assert [(a.state, a.pod_uid) for a in again] == [
            (S.DISPATCHED, None), (S.REPORTED, None), (S.DISPATCHED, "u-2"), (S.DISPATCHED, None)]
        assert again[0] is first[0] and again == [peer.get(a.ref) for a in rows]
        assert peer.transition(rows[3].ref, expected=[S.DISPATCHED], to=S.EXITED)
        assert [a.ref for a in ours.open_page(states=states, after_id=rows[0].id, limit=10)] == \
            [rows[1].ref, rows[2].ref]  # left LIVE: no longer paged
    finally:
        for engine in engines:
            engine.dispose()


def test_in_states_reads_only_the_rows_that_need_action(store):
    """``in_states``: every row in the given states (CLAIMED, EXITED, SETTLING for the lifecycle), ledger order,
    runtime filtered; LIVE and CLOSED rows are not read."""
    claimed = _live(store, S.CLAIMED)
    _live(store, S.DISPATCHED)
    exited = _live(store, S.EXITED)
    _live(store, S.CLOSED)
    _live(store, S.EXITED, runtime="kubernetes")
    settling = _live(store, S.EXITED)
    assert store.transition(settling.ref, expected=[S.EXITED], to=S.SETTLING)
    got = store.in_states([S.CLAIMED, S.EXITED, S.SETTLING], runtime="lite")
    assert [(a.ref, a.state) for a in got] == [(claimed.ref, S.CLAIMED), (exited.ref, S.EXITED),
                                               (settling.ref, S.SETTLING)]
    with pytest.raises(ValueError):
        store.in_states([])


def test_open_ti_ids_names_the_task_instances_with_an_open_attempt(store):
    """Any runtime, any open state; a ti_id whose every epoch is CLOSED has none."""
    open_lite = _live(store, S.DISPATCHED)
    open_k8s = _live(store, S.CLAIMED, runtime="kubernetes")
    closed = _live(store, S.CLOSED)
    unknown = str(uuid.uuid4())
    asked = [open_lite.ref.ti_id, open_k8s.ref.ti_id, closed.ref.ti_id, unknown]
    assert store.open_ti_ids(asked) == {open_lite.ref.ti_id, open_k8s.ref.ti_id}
    assert store.open_ti_ids([]) == set()
    assert [a.ref for a in store.open_attempts(ti_id=open_lite.ref.ti_id)] == [open_lite.ref]
    assert store.open_attempts(ti_id=closed.ref.ti_id) == []


def test_closed_before_pages_oldest_first(store, clock):
    closed = []
    for _ in range(4):
        a = claim(store)
        clock.tick(60)
        store.transition(a.ref, expected=[S.CLAIMED], to=S.CLOSED, resolution="moved_on")
        closed.append(a.ref)
    claim(store)  # open: never listed
    cutoff = T0 + timedelta(seconds=180)  # the first three closed at +60, +120, +180 -> two strictly before

    assert [a.ref for a in store.closed_before(cutoff, limit=10)] == closed[:2]
    assert [a.ref for a in store.closed_before(cutoff + timedelta(hours=1), limit=3)] == closed[:3]
    with pytest.raises(ValueError):
        store.closed_before(datetime(2030, 1, 1), limit=1)
    with pytest.raises(ValueError):
        store.closed_before(cutoff, limit=0)


def test_timestamps_round_trip_as_utc_from_other_zones(store, clock):
    clock.now = datetime(2025, 11, 29, 14, 0, tzinfo=timezone(timedelta(hours=2)))
    a = claim(store)
    assert a.created_at == datetime(2025, 11, 29, 12, 0, tzinfo=timezone.utc)
    assert a.created_at.utcoffset() == timedelta(0)


def test_record_path_is_stored_with_the_claim(store):
    """``record_path_for(epoch)`` names the claimed epoch's record file in the same insert."""
    ti_id = str(uuid.uuid4())
    first = claim(store, ti_id, record_path_for=lambda epoch: f"/rt/{ti_id}/{epoch}.json")
    second = claim(store, ti_id, record_path_for=lambda epoch: f"/rt/{ti_id}/{epoch}.json")
    assert (first.record_path, second.record_path) == (f"/rt/{ti_id}/1.json", f"/rt/{ti_id}/2.json")
    assert store.get(second.ref).record_path == f"/rt/{ti_id}/2.json"
    assert claim(store).record_path is None


def test_pinned_calls_commit_each_and_survive_a_failed_one(store, tmp_path):
    """Inside ``pinned()`` every write is committed when its call returns (another connection sees it at
    once), one connection serves every call, and a call that failed (a real constraint violation) leaves
    the next call working."""
    other = sa.create_engine(f"sqlite:///{tmp_path / 'ledger.db'}")
    seen_connections = set()
    sa.event.listen(store.engine, "checkout", lambda dbapi, rec, proxy: seen_connections.add(id(rec)))
    try:
        with store.pinned():
            attempt = claim(store)
            with other.connect() as conn:
                assert conn.execute(sa.text("select state from leoflow_attempt")).scalar_one() == "claimed"
            with pytest.raises(IntegrityError):
                claim(store, try_number=None)
            assert store.transition(attempt.ref, expected=[S.CLAIMED], to=S.DISPATCHED, pid=1, proc_start_time=2)
            with store.pinned():  # nested: the same connection
                assert store.get(attempt.ref).state == S.DISPATCHED
            with other.connect() as conn:
                assert conn.execute(sa.text("select state from leoflow_attempt")).scalar_one() == "dispatched"
        assert len(seen_connections) == 1
        assert store.get(attempt.ref).state == S.DISPATCHED  # and unpinned again afterwards
    finally:
        other.dispose()


# --- the token exchange's guarded write (revision 0004) ------------------------------------------------

def test_record_exchange_marks_a_dispatched_attempt_once(store, clock):
    """Only a DISPATCHED attempt not yet exchanged is marked; the state stays DISPATCHED; a second call
    (another worker, a replay) changes nothing and keeps the first credential id."""
    a = claim(store, runtime="kubernetes")
    assert store.record_exchange(a.ref, credential_id="JTI=1") is False  # still CLAIMED
    assert store.transition(a.ref, expected=[S.CLAIMED], to=S.DISPATCHED)
    clock.tick()
    assert store.record_exchange(a.ref, credential_id="JTI=1") is True
    row = store.get(a.ref)
    assert row.state is S.DISPATCHED and row.exchanged_at == clock.now and row.exchange_credential_id == "JTI=1"
    clock.tick()
    assert store.record_exchange(a.ref, credential_id="JTI=2") is False
    assert store.get(a.ref).exchange_credential_id == "JTI=1" and store.get(a.ref).exchanged_at == row.exchanged_at


def test_record_exchange_is_fenced_by_the_whole_attempt_identity(store):
    a = claim(store, runtime="kubernetes")
    assert store.transition(a.ref, expected=[S.CLAIMED], to=S.DISPATCHED)
    for wrong in (AttemptRef(a.ref.ti_id, 2, 1), AttemptRef(a.ref.ti_id, 1, 2), AttemptRef(str(uuid.uuid4()), 1, 1)):
        assert store.record_exchange(wrong, credential_id=None) is False
    assert store.get(a.ref).exchanged_at is None
    assert store.record_exchange(a.ref, credential_id=None) is True
    assert store.get(a.ref).exchange_credential_id is None


def test_record_exchange_cuts_a_long_credential_id(store):
    a = claim(store, runtime="kubernetes")
    assert store.transition(a.ref, expected=[S.CLAIMED], to=S.DISPATCHED)
    assert store.record_exchange(a.ref, credential_id="J" * 1000)
    assert store.get(a.ref).exchange_credential_id == "J" * 256


def test_an_exchanged_attempt_still_moves_through_the_table(store):
    """Exchanged is a fact on a DISPATCHED row, not a state: the lifecycle moves it on as before."""
    a = claim(store, runtime="kubernetes")
    assert store.transition(a.ref, expected=[S.CLAIMED], to=S.DISPATCHED)
    assert store.record_exchange(a.ref, credential_id="JTI=1")
    assert store.transition(a.ref, expected=[S.DISPATCHED], to=S.REPORTED)
    assert store.record_exchange(a.ref, credential_id="JTI=2") is False
    assert store.get(a.ref).state is S.REPORTED
