"""Ledger guarded writes under real concurrency on PostgreSQL (issue 2 acceptance, DESIGN §2 Invariant 1).

Needs a server: ``scripts/pg start --dir /tmp/leoflow-pg`` then
``export LEOFLOW_TEST_PG_URL=$(cat /tmp/leoflow-pg/url)``. Each test module works in its own throwaway
database on that server, dropped at the end.
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest
import sqlalchemy as sa

from leoflow_airflow.ledger.models import metadata
from leoflow_airflow.ledger.states import AttemptRef, AttemptState, Resolution
from leoflow_airflow.ledger.store import LedgerStore, Move

S = AttemptState
PG_URL = os.environ.get("LEOFLOW_TEST_PG_URL")
ROUNDS = 150

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.skipif(
        not PG_URL,
        reason="LEOFLOW_TEST_PG_URL is unset: run `scripts/pg start --dir DIR` and export "
        "LEOFLOW_TEST_PG_URL=$(cat DIR/url)",
    ),
]


@pytest.fixture(scope="module")
def db_url():
    """A fresh database with the ledger tables, dropped after the module."""
    server = sa.make_url(PG_URL)
    name = f"leoflow_ledger_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(server.set(database="postgres"), isolation_level="AUTOCOMMIT", poolclass=sa.NullPool)
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    url = server.set(database=name)
    engine = sa.create_engine(url, poolclass=sa.NullPool)
    metadata.create_all(engine)
    engine.dispose()
    yield url
    with admin.connect() as conn:
        conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


@pytest.fixture
def stores(db_url):
    """Two stores on two separate engines, so each writer has its own connection and transaction."""
    engines = [sa.create_engine(db_url, pool_size=1, max_overflow=0) for _ in range(2)]
    yield [LedgerStore(e) for e in engines]
    for e in engines:
        e.dispose()


def claim(store: LedgerStore, ti_id: str, **kw: object):
    return store.claim_epoch(
        ti_id=ti_id,
        try_number=1,
        dag_id="race",
        task_id="t",
        run_id="r",
        map_index=-1,
        runtime="lite",
        workload_json="{}",
        scheduler_job_id=1,
        **kw,
    )


def race(fns: list[Callable[[], object]]) -> list[object]:
    """Run each fn in its own thread, all released at once by a barrier; return their results in order."""
    barrier = threading.Barrier(len(fns))

    def run(fn):
        barrier.wait(timeout=30)
        return fn()

    with ThreadPoolExecutor(len(fns)) as pool:
        return [f.result(timeout=60) for f in [pool.submit(run, fn) for fn in fns]]


def test_two_writers_racing_one_guarded_transition_exactly_one_wins(stores):
    a, b = stores
    for rnd in range(ROUNDS):
        ref = claim(a, str(uuid.uuid4())).ref
        if rnd % 2:
            # the same move from both sides
            results = race(
                [
                    lambda: a.transition(ref, expected=[S.CLAIMED], to=S.DISPATCHED, pid=1),
                    lambda: b.transition(ref, expected=[S.CLAIMED], to=S.DISPATCHED, pid=2),
                ]
            )
        else:
            # conflicting moves: dispatch vs. close-as-launch-failed
            results = race(
                [
                    lambda: a.transition(ref, expected=[S.CLAIMED], to=S.DISPATCHED, pid=1),
                    lambda: b.transition(ref, expected=[S.CLAIMED], to=S.CLOSED, resolution=Resolution.LAUNCH_FAILED),
                ]
            )
        assert results.count(True) == 1, (rnd, results)
        row = a.get(ref)
        if results[0]:
            assert (row.state, row.pid, row.resolution) == (S.DISPATCHED, 1, None)
        elif rnd % 2:
            assert (row.state, row.pid) == (S.DISPATCHED, 2)
        else:
            assert (row.state, row.pid, row.resolution) == (S.CLOSED, None, Resolution.LAUNCH_FAILED)


@pytest.mark.parametrize("hint", [{}, {"known_top": 0}], ids=["read-top", "given-top"])
def test_two_claimers_on_one_ti_get_epochs_one_and_two(stores, hint):
    """Also when both were handed the same highest epoch by a batch read (a dispatch's ``current_many``)."""
    a, b = stores
    for _ in range(ROUNDS // 2):
        ti = str(uuid.uuid4())
        got = race([lambda: claim(a, ti, **hint), lambda: claim(b, ti, **hint)])
        assert sorted(x.ref.attempt_epoch for x in got) == [1, 2]
        assert a.current(ti).ref.attempt_epoch == 2


def test_stale_epoch_writer_never_changes_the_current_epoch(stores):
    a, b = stores
    for _ in range(ROUNDS // 3):
        ti = str(uuid.uuid4())
        old = claim(a, ti).ref
        assert a.transition(old, expected=[S.CLAIMED], to=S.DISPATCHED, pid=10)
        assert a.transition(old, expected=[S.DISPATCHED], to=S.CLOSED, resolution=Resolution.REDISPATCHED)
        new = claim(a, ti).ref
        stale_ref = AttemptRef(ti, old.try_number, old.attempt_epoch)
        results = race(
            [
                lambda: b.transition(stale_ref, expected=[S.DISPATCHED, S.CLAIMED], to=S.CLOSED, resolution="moved_on", detail="stale"),
                lambda: a.transition(new, expected=[S.CLAIMED], to=S.DISPATCHED, pid=20),
            ]
        )
        assert results == [False, True]
        assert not b.record_facts(stale_ref, expected=[S.DISPATCHED], pid=666)
        current = a.current(ti)
        assert current.ref == new
        assert (current.state, current.pid, current.detail) == (S.DISPATCHED, 20, None)
        assert a.get(old).resolution is Resolution.REDISPATCHED


def test_forked_child_gets_its_own_connection(db_url):
    """The store's pool is disposed in a forked child: the child never reuses the parent's socket."""
    engine = sa.create_engine(db_url, pool_size=1, max_overflow=0)
    store = LedgerStore(engine)
    backend_pid = sa.text("SELECT pg_backend_pid()")
    with store.engine.connect() as conn:  # leaves one connection pooled in the parent
        parent_backend = conn.execute(backend_pid).scalar_one()
    read_fd, write_fd = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the child
        code = 1
        try:
            with store.engine.connect() as conn:
                child_backend = conn.execute(backend_pid).scalar_one()
            os.write(write_fd, str(child_backend).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write_fd)
    _, status = os.waitpid(child, 0)
    child_backend = int(os.read(read_fd, 64) or b"0")
    os.close(read_fd)
    assert os.waitstatus_to_exitcode(status) == 0
    assert child_backend not in (0, parent_backend)
    with store.engine.connect() as conn:  # the parent's pooled connection still works
        assert conn.execute(backend_pid).scalar_one() == parent_backend
    engine.dispose()


def test_keyset_pages_walk_live_rows_once_on_the_state_id_index(db_url):
    """Issue 10 item 1: ``open_page`` pages a ledger of 600 LIVE attempts among 20,400 CLOSED ones by id, each
    LIVE row once; PostgreSQL answers a page by a range scan of the ``(state, id)`` index, without sorting
    the state's rows, for a page small beside them (its cost does not grow with the running attempts or the
    history)."""
    engine = sa.create_engine(db_url, poolclass=sa.NullPool)
    store = LedgerStore(engine)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text("DELETE FROM leoflow_attempt"))
            conn.execute(sa.text(
                "INSERT INTO leoflow_attempt (ti_id, try_number, attempt_epoch, dag_id, task_id, run_id, map_index, "
                "state, runtime, workload_json, created_at, updated_at) "
                "SELECT 'page-' || g, 1, 1, 'page', 't', 'r', -1, "
                "CASE WHEN g % 70 = 0 THEN 'dispatched' WHEN g % 70 = 1 THEN 'reported' ELSE 'closed' END, "
                "'lite', '{}', now(), now() FROM generate_series(1, 21000) AS g"))
            conn.execute(sa.text("ANALYZE leoflow_attempt"))
        live_ids = [r[0] for r in engine.connect().execute(sa.text(
            "SELECT id FROM leoflow_attempt WHERE state IN ('dispatched', 'reported') ORDER BY id"))]
        assert len(live_ids) == 600
        seen, after = [], 0
        while True:
            page = store.open_page(states=[S.DISPATCHED, S.REPORTED], after_id=after, limit=250, runtime="lite")
            seen += [a.id for a in page]
            if len(page) < 250:
                break
            after = page[-1].id
        assert seen == live_ids
        with engine.connect() as conn:
            plan = "\n".join(r[0] for r in conn.execute(sa.text(
                "EXPLAIN SELECT * FROM leoflow_attempt WHERE state = 'dispatched' AND id > :after "
                "AND runtime = 'lite' ORDER BY id LIMIT 21"), {"after": live_ids[0]}))
        assert "Index Scan using ix_leoflow_attempt_state_id" in plan and "Sort" not in plan, plan
    finally:
        with engine.begin() as conn:
            conn.execute(sa.text("DELETE FROM leoflow_attempt WHERE dag_id = 'page'"))
        engine.dispose()


def test_two_schedulers_racing_assign_on_one_idle_warm_worker_exactly_one_wins(stores):
    """Issue 11: two schedulers (or one scheduler's two launches) read one idle warm worker at the same row
    version and assign it two different attempts: exactly one assignment lands, and the row holds the winner's
    attempt; then two concurrent ``take``s of that assignment (two polls of one worker on two api-server
    workers): exactly one takes it, and the worker counts one attempt taken."""
    import hashlib

    from leoflow_airflow.ledger.warm import WarmLedger

    a, b = (WarmLedger(s.engine) for s in stores)
    for rnd in range(ROUNDS):
        uid = str(uuid.uuid4())
        assert a.register(pod_uid=uid, pod_name=f"w-{rnd}", namespace="ns", dag_version_id=str(uuid.uuid4()),
                          credential_sha256=hashlib.sha256(uid.encode()).hexdigest())
        version = a.get(uid).row_version
        refs = [AttemptRef(str(uuid.uuid4()), 1, 1), AttemptRef(str(uuid.uuid4()), 1, 1)]
        results = race([lambda: a.assign(uid, refs[0], row_version=version),
                        lambda: b.assign(uid, refs[1], row_version=version)])
        assert results.count(True) == 1, (rnd, results)
        winner = refs[results.index(True)]
        row = b.get(uid)
        assert (row.state, row.ref) == ("assigned", winner)
        taken = race([lambda: a.take(uid, winner), lambda: b.take(uid, winner)])
        assert taken.count(True) == 1, (rnd, taken)
        row = a.get(uid)
        assert (row.state, row.ref, row.attempts_taken) == ("busy", winner, 1)


@pytest.fixture
def autocommit_stores(db_url):
    """Two stores as ``LedgerStore.from_airflow`` builds them on PostgreSQL: a transactional engine and an
    autocommit one, each with a pool of one connection."""
    engines = []
    for _ in range(2):
        engines += [sa.create_engine(db_url, pool_size=1, max_overflow=0),
                    sa.create_engine(db_url, pool_size=1, max_overflow=0, isolation_level="AUTOCOMMIT")]
    yield [LedgerStore(engines[i], autocommit_engine=engines[i + 1]) for i in (0, 2)]
    for e in engines:
        e.dispose()


def test_a_pinned_block_writes_and_claims_in_autocommit(autocommit_stores):
    """One ``sync()``'s ledger calls on PostgreSQL: the calls of a ``pinned()`` block, the epoch claim too,
    share its one connection and run in autocommit (no BEGIN/COMMIT round trips, no second checkout), each
    seen by another connection the moment it returns; two claimers racing inside pinned blocks still get
    distinct epochs (the unique key decides, not a transaction)."""
    a, b = autocommit_stores
    ti = str(uuid.uuid4())
    with a.pinned():
        ref = claim(a, ti).ref
        raw = a._local.conn.connection.dbapi_connection
        assert raw.autocommit is True
        assert a.transition(ref, expected=[S.CLAIMED], to=S.DISPATCHED, pid=7)
        assert b.get(ref).state == S.DISPATCHED  # visible at once: nothing left open
        assert [x.ref for x in a.open_page(states=[S.DISPATCHED], after_id=0, limit=10) if x.ref == ref] == [ref]
        assert raw.autocommit is True
        second = claim(a, ti).ref
    assert a.engine.pool.checkedin() + a.engine.pool.checkedout() == 0  # the claim took no transaction
    assert (second.attempt_epoch, b.current(ti).ref) == (2, second)
    a.dispose()  # both engines' connections closed; the store opens new ones
    assert a.get(second).state == S.CLAIMED
    for _ in range(ROUNDS // 3):
        ti = str(uuid.uuid4())

        def pinned_claim(store: LedgerStore) -> int:
            with store.pinned():
                return claim(store, ti).ref.attempt_epoch

        assert sorted(race([lambda: pinned_claim(a), lambda: pinned_claim(b)])) == [1, 2]


def test_transition_many_is_one_statement_per_kind_of_move_and_each_row_stays_guarded(autocommit_stores):
    """A loop's events of 16 attempts (Started, Reported, Exited) are three ``UPDATE … FROM (VALUES …)``
    statements on PostgreSQL, each attempt's moves in order; racing a single writer that closes the same
    attempts, every attempt is moved by exactly one side (the per-row ``state IN`` guard still decides)."""
    a, b = autocommit_stores
    refs = [claim(a, str(uuid.uuid4())).ref for _ in range(16)]
    statements: list[str] = []

    def count(conn, cursor, statement, *args):
        statements.append(statement)

    moves = [Move(r, (S.CLAIMED,), S.DISPATCHED, {"pid": i, "proc_start_time": None if i % 2 else i})
             for i, r in enumerate(refs)]
    moves += [Move(r, (S.DISPATCHED,), S.REPORTED, {"reported_state": "success"}) for r in refs]
    moves += [Move(r, (S.DISPATCHED, S.REPORTED), S.EXITED, {"exit_status": 0 if i % 3 else None})
              for i, r in enumerate(refs)]
    sa.event.listen(a._single, "before_cursor_execute", count)
    try:
        with a.pinned():
            assert a.transition_many(moves) == [True] * len(moves)
    finally:
        sa.event.remove(a._single, "before_cursor_execute", count)
    assert [s.split()[0] for s in statements] == ["UPDATE"] * 3
    for i, r in enumerate(refs):
        row = b.get(r)
        assert (row.state, row.pid, row.proc_start_time, row.reported_state, row.exit_status, row.row_version) == (
            S.EXITED, i, None if i % 2 else i, "success", 0 if i % 3 else None, 3)

    for _ in range(ROUNDS // 5):
        refs = [claim(a, str(uuid.uuid4())).ref for _ in range(8)]
        batch = [Move(r, (S.CLAIMED,), S.DISPATCHED, {"pid": 1}) for r in refs]

        def close_all() -> list[bool]:
            return [b.transition(r, expected=[S.CLAIMED], to=S.CLOSED, resolution=Resolution.REVOKED) for r in refs]

        many, single = race([lambda: a.transition_many(batch), close_all])
        assert [m != s for m, s in zip(many, single)] == [True] * len(refs), (many, single)
        for r, moved in zip(refs, many):
            assert b.get(r).state == (S.DISPATCHED if moved else S.CLOSED)
