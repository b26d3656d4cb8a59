"""``LedgerStore``: every read and guarded write of leoflow's attempt ledger.

DESIGN §2 Invariant 1 (fencing): each write names the exact attempt (ti_id, try_number, attempt_epoch) and
the states it expects, runs as ONE ``UPDATE … WHERE`` and returns whether a row changed (``transition_many``
puts the moves of many attempts in one statement and still answers for each). ``False`` means
someone else moved the attempt on; callers log at debug and do nothing destructive. Epochs are claimed
atomically through the unique key (ti_id, attempt_epoch). The store owns its engine and short
transactions: no transaction outlives a method call, so none is ever held across an HTTP call.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine, RowMapping
from sqlalchemy.exc import IntegrityError

from leoflow_airflow.ledger.models import CREDENTIAL_ID_LEN, attempt_table
from leoflow_airflow.ledger.states import (
    AttemptRef,
    OPEN_STATES,
    AttemptState,
    Resolution,
    check_transition,
)

__all__ = ["FACT_COLUMNS", "Attempt", "LedgerConflict", "LedgerStore", "Move"]

log = logging.getLogger(__name__)

_AUTOCOMMIT_DIALECTS = frozenset({"postgresql", "mysql"})
"""Databases on which a one-statement call runs in autocommit (:meth:`LedgerStore._tx`)."""

FACT_COLUMNS: frozenset[str] = frozenset(
    {
        "scheduler_job_id",
        "pid",
        "proc_start_time",
        "record_path",
        "pod_name",
        "pod_uid",
        "reported_state",
        "exit_status",
        "resolution",
        "detail",
    }
)
"""Columns a guarded write may set as ``**facts``. Identity, state and timestamps are the store's own."""

_STATE_TIMESTAMP: Mapping[AttemptState, str] = {
    AttemptState.DISPATCHED: "dispatched_at",
    AttemptState.REPORTED: "reported_at",
    AttemptState.EXITED: "exited_at",
    AttemptState.CLOSED: "closed_at",
}

_OPEN_STATES = tuple(sorted(s.value for s in OPEN_STATES))
_PAGE_FETCH_CHUNK = 500
"""Ids per ``id IN (…)`` statement when :meth:`LedgerStore.open_page` reads whole rows (bounded parameters)."""

CLAIM_ATTEMPTS = 8
"""How many times ``claim_epoch`` re-reads and retries after losing a race before ``LedgerConflict``."""


@dataclass(frozen=True, slots=True)
class Move:
    """One guarded move for :meth:`LedgerStore.transition_many`: ``ref`` to ``to`` if its state is one of
    ``expected``, setting ``facts`` (names from ``FACT_COLUMNS``), exactly as :meth:`LedgerStore.transition`."""

    ref: AttemptRef
    expected: tuple[AttemptState, ...]
    to: AttemptState
    facts: Mapping[str, Any] = field(default_factory=dict)


class LedgerConflict(RuntimeError):
    """``claim_epoch`` lost the race for a new epoch ``CLAIM_ATTEMPTS`` times in a row."""


@dataclass(frozen=True, slots=True)
class Attempt:
    """One ledger row, read-only. Timestamps are timezone-aware UTC; ``proc_start_time`` is the agent's kernel
    start time (``/proc/<pid>/stat`` starttime, clock ticks since boot: pid + start time is its identity); ``workload_json`` never holds a token.
    ``host`` is ``<hostname>/<boot id>`` of the claiming scheduler (``leoflow_airflow.hosts``), None in rows
    written before ledger revision 0003 (treated as this host's)."""

    ref: AttemptRef
    dag_id: str
    task_id: str
    run_id: str
    map_index: int
    state: AttemptState
    runtime: str
    workload_json: str
    scheduler_job_id: int | None
    host: str | None
    pid: int | None
    proc_start_time: int | None
    record_path: str | None
    pod_name: str | None
    pod_uid: str | None
    reported_state: str | None
    exit_status: int | None
    resolution: Resolution | None
    detail: str | None
    created_at: datetime
    dispatched_at: datetime | None
    reported_at: datetime | None
    exited_at: datetime | None
    closed_at: datetime | None
    updated_at: datetime
    exchanged_at: datetime | None = None
    """When the attempt's pod exchanged its token (revision 0004; None: not exchanged, or Lite)."""
    exchange_credential_id: str | None = None
    """The TokenReview ``credential-id`` of the exchanged token (``JTI=…``), when the review named one."""
    id: int | None = None
    """The row's surrogate key (``leoflow_attempt.id``, ascending in insert order): the keyset cursor of
    :meth:`LedgerStore.open_page`. None only for an ``Attempt`` built by hand (tests)."""
    row_version: int = 0
    """How many guarded writes changed the row since its insert (revision 0006): a row read at one version is
    the same row at that version, so :meth:`LedgerStore.open_page` rebuilds only the rows whose version moved."""

    @classmethod
    def from_row(cls, row: RowMapping) -> Attempt:
        """Build from a ``leoflow_attempt`` row mapping. Raises ``ValueError`` on an unknown state."""
        return cls(
            ref=AttemptRef(row["ti_id"], row["try_number"], row["attempt_epoch"]),
            dag_id=row["dag_id"],
            task_id=row["task_id"],
            run_id=row["run_id"],
            map_index=row["map_index"],
            state=AttemptState(row["state"]),
            runtime=row["runtime"],
            workload_json=row["workload_json"],
            scheduler_job_id=row["scheduler_job_id"],
            host=row["host"],
            pid=row["pid"],
            proc_start_time=row["proc_start_time"],
            record_path=row["record_path"],
            pod_name=row["pod_name"],
            pod_uid=row["pod_uid"],
            reported_state=row["reported_state"],
            exit_status=row["exit_status"],
            resolution=Resolution(row["resolution"]) if row["resolution"] is not None else None,
            detail=row["detail"],
            created_at=row["created_at"],
            dispatched_at=row["dispatched_at"],
            reported_at=row["reported_at"],
            exited_at=row["exited_at"],
            closed_at=row["closed_at"],
            updated_at=row["updated_at"],
            exchanged_at=row["exchanged_at"],
            exchange_credential_id=row["exchange_credential_id"],
            id=row["id"],
            row_version=row["row_version"],
        )


def _utcnow() -> datetime:
    return datetime.now(timezone.utc)


def _dispose_after_fork(store_ref: weakref.ref[LedgerStore]) -> None:
    store = store_ref()
    if store is not None:
        # close=False: the parent still owns those sockets; the child just forgets them.
        store.dispose(close=False)


class LedgerStore:
    """Reads and guarded writes of ``leoflow_attempt`` over one SQLAlchemy engine.

    Thread-safe (each call checks out its own connection, or uses its thread's :meth:`pinned` one).
    ``clock`` returns the aware UTC "now" used for
    every timestamp the store writes (tests inject one). After ``os.fork()`` the child disposes the
    engine's pool without closing the parent's connections (issue 2: any engine leoflow owns is disposed
    after a fork).
    """

    def __init__(self, engine: Engine, *, clock: Callable[[], datetime] = _utcnow,
                 autocommit_engine: Engine | None = None) -> None:
        """Wrap ``engine`` (whose database already has the ledger tables; see ``LeoflowDBManager``).

        ``autocommit_engine``: an engine to the same database with ``isolation_level="AUTOCOMMIT"`` and a pool
        of its own (:meth:`from_airflow` makes one on PostgreSQL and MySQL), for the calls that are one
        statement (:meth:`_tx`); None: every call is a transaction on ``engine``."""
        self.engine = engine
        # one statement needs no transaction of its own on a client-server database: in autocommit it is
        # atomic by itself and the driver sends neither BEGIN nor COMMIT, two of a guarded write's three round
        # trips (seen on PostgreSQL with log_statement = all). A pool of its own, set to autocommit once per
        # connection: switching one pool's connections back and forth costs a SET at every check-in.
        self._single = autocommit_engine if autocommit_engine is not None else engine
        self._clock = clock
        self._local = threading.local()
        self._page_cache: dict[int, Attempt] = {}  # open_page: id -> the row as last read (its row_version)
        self._page_seen: set[int] = set()  # ids open_page returned since its last page from the start
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=lambda ref=weakref.ref(self): _dispose_after_fork(ref))

    def dispose(self, *, close: bool = True) -> None:
        """Drop every pooled connection of the store's engines (the transactional one and, when there is one,
        the autocommit one); the store may be used again (new connections are opened). ``close=False`` forgets
        them without closing (a forked child: the parent still owns the sockets)."""
        self.engine.dispose(close=close)
        if self._single is not self.engine:
            self._single.dispose(close=close)

    @classmethod
    def from_airflow(cls) -> LedgerStore:
        """A store on its own small engine to Airflow's metadata DB (``airflow.settings.SQL_ALCHEMY_CONN``).

        Takes Airflow's ``[database] sql_alchemy_connect_args`` and pool recycle; pool of 2 (+2 overflow,
        none for in-memory SQLite), ``pool_pre_ping``; on PostgreSQL and MySQL a second engine alike in
        autocommit for the one-statement calls (``autocommit_engine``); SQLite gets a 30 s busy timeout
        unless the connect args set one, and MySQL READ COMMITTED like Airflow's own engine. Raises
        ``RuntimeError`` if Airflow has no DB URL.
        """
        from airflow import settings
        from airflow.configuration import conf

        url = settings.SQL_ALCHEMY_CONN
        if not url:
            raise RuntimeError("airflow.settings.SQL_ALCHEMY_CONN is not set; cannot open the leoflow ledger")
        connect_args: dict[str, Any] = {}
        if conf.has_option("database", "sql_alchemy_connect_args"):
            connect_args = dict(conf.getimport("database", "sql_alchemy_connect_args") or {})
        engine_args: dict[str, Any] = {"pool_pre_ping": True}
        parsed = sa.make_url(url)
        backend = parsed.get_backend_name()
        if backend == "sqlite":
            connect_args.setdefault("timeout", 30)
            connect_args["check_same_thread"] = False
        if not (backend == "sqlite" and (not parsed.database or ":memory:" in parsed.database)):
            # in-memory SQLite uses a SingletonThreadPool, which has no size or overflow
            engine_args.update(
                pool_size=2,
                max_overflow=2,
                pool_recycle=conf.getint("database", "sql_alchemy_pool_recycle", fallback=1800),
            )
        autocommit = None
        if backend in _AUTOCOMMIT_DIALECTS:
            autocommit = sa.create_engine(url, connect_args=connect_args, **engine_args, isolation_level="AUTOCOMMIT")
        if backend == "mysql":
            engine_args["isolation_level"] = "READ COMMITTED"
        engine = sa.create_engine(url, connect_args=connect_args, **engine_args)
        return cls(engine, autocommit_engine=autocommit)

    @contextmanager
    def pinned(self) -> Iterator[None]:
        """Within the block, this thread's reads and writes share one pooled connection, checked out (and
        pre-pinged) once instead of once per call; each call is still its own unit, done before it returns
        (one statement in autocommit where the store has an ``autocommit_engine``, else a short transaction).
        Nested blocks reuse the outer connection. Used around one ``sync()`` or one batch of dispatches: a
        scheduler loop makes ~10 ledger calls per attempt, and a checkout with its ping is a DB round trip each
        (measured with py-spy on bench_fanout). Errors from the database propagate as from any call; the
        connection goes back to the pool (or is invalidated by SQLAlchemy) when the block exits.
        """
        if getattr(self._local, "conn", None) is not None:
            yield
            return
        with self._single.connect() as conn:
            self._local.conn = conn
            try:
                yield
            finally:
                self._local.conn = None

    @contextmanager
    def _tx(self) -> Iterator[Connection]:
        """One statement's unit, on the pinned connection if there is one, else on a fresh checkout: in
        autocommit with an ``autocommit_engine`` (the statement is atomic by itself), else a transaction."""
        conn = getattr(self._local, "conn", None)
        if conn is None:
            with self._single.begin() as fresh:
                yield fresh
            return
        if conn.in_transaction():  # a failed call's leftovers must not leak into this one
            conn.rollback()
        with conn.begin():
            yield conn

    # ------------------------------------------------------------------ writes

    def claim_epoch(
        self,
        *,
        ti_id: str,
        try_number: int,
        dag_id: str,
        task_id: str,
        run_id: str,
        map_index: int,
        runtime: str,
        workload_json: str,
        scheduler_job_id: int | None,
        record_path_for: Callable[[int], str] | None = None,
        host: str | None = None,
        known_top: int | None = None,
    ) -> Attempt:
        """Claim the next epoch of ``ti_id`` (its highest epoch + 1, or 1) and insert it as CLAIMED.

        ``known_top``: the highest epoch the caller has just read (:meth:`current` or :meth:`current_many`; 0:
        no row), so the first try inserts ``known_top + 1`` without reading it again; None reads it. A stale
        hint costs nothing but a retry: the insert then fails on the unique key like any lost race.

        ``record_path_for(epoch)``, when given, names the attempt's record file, stored in the same insert
        (the path depends on the epoch, which is only known inside the claim). ``host``: where the attempt
        will run (``leoflow_airflow.hosts.this_host()``; None leaves it unstamped).

        Atomic through the unique key (ti_id, attempt_epoch), not through a transaction: the claim is a read
        of the highest epoch and an ``INSERT … RETURNING`` (where the dialect has it; else a read of the
        inserted row), each in autocommit where the store has an ``autocommit_engine``. Under READ COMMITTED a
        transaction would not stop two claimers reading the same highest epoch either; the key does: the
        later insert fails, and this method then re-reads and retries, up to ``CLAIM_ATTEMPTS`` times, then
        raises ``LedgerConflict``. Two concurrent claimers therefore get distinct epochs.
        ``workload_json`` must already have its token stripped (DESIGN §3 Dispatch). Any other integrity
        error propagates as ``sqlalchemy.exc.IntegrityError``. Returns the inserted row.
        """
        t = attempt_table
        top = known_top
        for _ in range(CLAIM_ATTEMPTS):
            now = self._clock()
            if top is None:
                with self._tx() as conn:
                    top = conn.execute(
                        sa.select(sa.func.max(t.c.attempt_epoch)).where(t.c.ti_id == ti_id)
                    ).scalar_one()
            epoch = (top or 0) + 1
            top = None  # a retry reads it
            insert = t.insert().values(
                ti_id=ti_id,
                try_number=try_number,
                attempt_epoch=epoch,
                dag_id=dag_id,
                task_id=task_id,
                run_id=run_id,
                map_index=map_index,
                state=AttemptState.CLAIMED.value,
                runtime=runtime,
                workload_json=workload_json,
                scheduler_job_id=scheduler_job_id,
                host=host,
                record_path=record_path_for(epoch) if record_path_for is not None else None,
                created_at=now,
                updated_at=now,
                row_version=0,
            )
            try:
                with self._tx() as conn:
                    if conn.dialect.insert_returning:
                        row = conn.execute(insert.returning(*t.c)).mappings().first()
                    else:
                        conn.execute(insert)
                        row = conn.execute(
                            sa.select(t).where(t.c.ti_id == ti_id, t.c.attempt_epoch == epoch)
                        ).mappings().first()
            except IntegrityError:
                if self.get_epoch(ti_id, epoch) is None:
                    raise  # not a lost race: a real constraint violation
                log.debug("lost the race for epoch %d of ti %s; retrying", epoch, ti_id)
                continue
            if row is None:  # pragma: no cover - the row was inserted just above, by this call
                raise LedgerConflict(f"claimed epoch {epoch} of ti {ti_id} vanished")
            return Attempt.from_row(row)
        raise LedgerConflict(f"could not claim an epoch for ti {ti_id} after {CLAIM_ATTEMPTS} tries")

    def transition(
        self,
        ref: AttemptRef,
        *,
        expected: Iterable[AttemptState],
        to: AttemptState,
        **facts: Any,
    ) -> bool:
        """Move ``ref`` to ``to`` if it is in one of ``expected``; return whether a row changed.

        One guarded ``UPDATE … WHERE ti_id AND try_number AND attempt_epoch AND state IN expected`` that
        sets ``state``, the given ``facts`` (names from ``FACT_COLUMNS``), ``updated_at`` and, for
        DISPATCHED/REPORTED/EXITED/CLOSED, ``dispatched_at``/``reported_at``/``exited_at``/``closed_at``
        (kept if already set, so it is the first time the attempt got there). Raises ``IllegalTransition``
        if any expected -> to is not in ``TRANSITIONS``, ``ValueError`` for an empty ``expected``, a bad
        ``resolution``, or a move to CLOSED without a ``resolution``, and ``TypeError`` for unknown facts.
        """
        move = Move(ref, self._expected(expected), AttemptState(to), self._fact_values(facts))
        self._check_move(move)
        return self._guarded_update(ref, move.expected, {**move.facts, **self._move_values(move.to, self._clock())})

    def transition_many(self, moves: Sequence[Move]) -> list[bool]:
        """Apply ``moves`` as :meth:`transition` would one by one, in order; return whether each changed a row
        (a list as long as ``moves``).

        Every move is checked before anything is written (the errors of :meth:`transition`), so a bad move
        writes nothing. Moves of one attempt keep their order; moves of different attempts are independent
        guarded writes, so they are grouped: wave *k* holds each attempt's *k*-th move, and within a wave the
        moves with the same expected states, target state and fact names are one statement. On PostgreSQL
        that is one ``UPDATE … FROM (VALUES …) RETURNING`` (every row still guarded by its own ``state IN``,
        which PostgreSQL re-checks on a row a concurrent writer changed), so a scheduler loop's Started,
        Reported and Exited events of many attempts cost a few statements, not one each: py-spy put 1.2 s of
        a 6 s ``bench_fanout`` at parallelism 32 in those single writes, mostly waiting for a CPU while the
        attempts ran. Elsewhere each move is its own ``UPDATE``, all in one unit (one transaction, one commit
        on SQLite). Errors from the database propagate; with autocommit the writes before the failing
        statement stay done.
        """
        checked = [Move(m.ref, self._expected(m.expected), AttemptState(m.to), self._fact_values(m.facts))
                   for m in moves]
        for move in checked:
            self._check_move(move)
        results = [False] * len(checked)
        if not checked:
            return results
        waves: list[dict[tuple[Any, ...], list[int]]] = []
        wave_of: dict[AttemptRef, int] = {}
        for i, move in enumerate(checked):
            wave = wave_of.get(move.ref, -1) + 1
            wave_of[move.ref] = wave
            if wave == len(waves):
                waves.append({})
            waves[wave].setdefault((move.expected, move.to, tuple(sorted(move.facts))), []).append(i)
        batched = self._single.dialect.name == "postgresql"
        now = self._clock()
        with self._tx() as conn:
            for groups in waves:
                for (states, to_state, names), indexes in groups.items():
                    if batched and len(indexes) > 1:
                        changed = self._update_from_values(conn, [checked[i] for i in indexes], states, to_state,
                                                           names, now)
                        for i in indexes:
                            results[i] = checked[i].ref in changed
                    else:
                        for i in indexes:
                            move = checked[i]
                            stmt = self._guarded_stmt(move.ref, states, {**move.facts,
                                                                         **self._move_values(to_state, now)})
                            results[i] = conn.execute(stmt).rowcount == 1
        for move, changed in zip(checked, results):
            if not changed:
                log.debug("guarded write on attempt %s expecting %s changed nothing", move.ref,
                          [s.value for s in move.expected])
        return results

    def _update_from_values(self, conn: Connection, moves: list[Move], states: tuple[AttemptState, ...],
                            to_state: AttemptState, names: tuple[str, ...], now: datetime) -> set[AttemptRef]:
        """One PostgreSQL ``UPDATE … FROM (VALUES …) RETURNING`` for ``moves`` (distinct attempts, the same
        expected states, target and fact names); the refs of the rows it changed. Each VALUES column is cast to
        its ledger column's type (a column of NULLs would otherwise be text)."""
        t = attempt_table
        keys = ("ti_id", "try_number", "attempt_epoch", *names)
        rows = [(m.ref.ti_id, m.ref.try_number, m.ref.attempt_epoch, *(m.facts[n] for n in names)) for m in moves]
        v = sa.values(*(sa.column(k, t.c[k].type) for k in keys), name="leoflow_move").data(rows)
        values = {n: sa.cast(v.c[n], t.c[n].type) for n in names}
        values.update(self._move_values(to_state, now))
        stmt = (
            t.update()
            .where(
                t.c.ti_id == sa.cast(v.c.ti_id, t.c.ti_id.type),
                t.c.try_number == sa.cast(v.c.try_number, t.c.try_number.type),
                t.c.attempt_epoch == sa.cast(v.c.attempt_epoch, t.c.attempt_epoch.type),
                t.c.state.in_([s.value for s in states]),
            )
            .values(**values, row_version=t.c.row_version + 1)
            .returning(t.c.ti_id, t.c.try_number, t.c.attempt_epoch)
        )
        return {AttemptRef(r.ti_id, r.try_number, r.attempt_epoch) for r in conn.execute(stmt)}

    @staticmethod
    def _check_move(move: Move) -> None:
        for frm in move.expected:
            check_transition(frm, move.to)
        if move.to is AttemptState.CLOSED and move.facts.get("resolution") is None:
            raise ValueError(f"closing attempt {move.ref} needs a resolution")

    @staticmethod
    def _move_values(to_state: AttemptState, now: datetime) -> dict[str, Any]:
        """What a move to ``to_state`` sets besides its facts: the state, ``updated_at`` and the state's first
        timestamp (``coalesce``: kept if already set)."""
        values: dict[str, Any] = {"state": to_state.value, "updated_at": now}
        stamp = _STATE_TIMESTAMP.get(to_state)
        if stamp is not None:
            col = attempt_table.c[stamp]
            values[stamp] = sa.func.coalesce(col, sa.bindparam(f"{stamp}_now", now, type_=col.type))
        return values

    def record_facts(self, ref: AttemptRef, *, expected: Iterable[AttemptState], **facts: Any) -> bool:
        """Set ``facts`` on ``ref`` if it is in one of ``expected``, state unchanged; return whether a row
        changed. Background work records facts; only reconciliation settles (DESIGN §2 Invariant 2).
        Raises ``TypeError`` for no facts or unknown names, ``ValueError`` for an empty ``expected``
        or a bad ``resolution``.
        """
        states = self._expected(expected)
        if not facts:
            raise TypeError("record_facts needs at least one fact")
        values = self._fact_values(facts)
        values["updated_at"] = self._clock()
        return self._guarded_update(ref, states, values)

    def record_exchange(self, ref: AttemptRef, *, credential_id: str | None) -> bool:
        """Mark ``ref`` exchanged (its pod's token was traded for the workload); return whether a row changed.

        One guarded ``UPDATE … WHERE ti_id AND try_number AND attempt_epoch AND state = 'dispatched' AND
        exchanged_at IS NULL`` that sets ``exchanged_at`` (now), ``exchange_credential_id`` (the TokenReview's
        ``credential-id``, cut to ``CREDENTIAL_ID_LEN``; None when the review named none) and ``updated_at``.
        The state stays DISPATCHED: the exchange records a fact, only reconciliation moves attempts (DESIGN §2
        Invariant 2). ``False``: the attempt is not DISPATCHED any more, or was exchanged already (by a
        concurrent request on another api-server worker, too): the caller refuses the exchange.
        """
        now = self._clock()
        if credential_id is not None:
            credential_id = credential_id[:CREDENTIAL_ID_LEN]
        values = {"exchanged_at": now, "exchange_credential_id": credential_id, "updated_at": now}
        return self._guarded_update(ref, (AttemptState.DISPATCHED,), values, attempt_table.c.exchanged_at.is_(None))

    def record_exchange_again(self, ref: AttemptRef, *, pod_uid: str, credential_id: str | None) -> bool:
        """Record a repeated exchange of ``ref`` by its own pod (its first answer was lost: k8s review §4); return
        whether a row changed.

        One guarded ``UPDATE … WHERE ti_id AND try_number AND attempt_epoch AND state = 'dispatched' AND
        exchanged_at IS NOT NULL AND pod_uid = :pod_uid`` and the credential is no warm pod's (``warm:…``: a warm
        pod's await took it), that sets ``exchange_credential_id`` (the latest review's, cut to
        ``CREDENTIAL_ID_LEN``) and ``updated_at``; ``exchanged_at`` keeps the first exchange's time. ``False``: the
        attempt moved on, was never exchanged, was delivered to a warm pod, or the ledger recorded another pod (or
        none): the caller refuses the repeated exchange.

        :raises ValueError: ``pod_uid`` is empty.
        """
        if not pod_uid:
            raise ValueError("pod_uid must be non-empty")
        if credential_id is not None:
            credential_id = credential_id[:CREDENTIAL_ID_LEN]
        t = attempt_table
        values = {"exchange_credential_id": credential_id, "updated_at": self._clock()}
        delivered_warm = t.c.exchange_credential_id.startswith("warm:")  # a warm pod's await took it: not ours
        return self._guarded_update(ref, (AttemptState.DISPATCHED,), values, t.c.exchanged_at.is_not(None),
                                    t.c.pod_uid == pod_uid,
                                    sa.or_(t.c.exchange_credential_id.is_(None), sa.not_(delivered_warm)))

    # ------------------------------------------------------------------ reads

    def get(self, ref: AttemptRef) -> Attempt | None:
        """The row of exactly this attempt (all three of ti_id, try_number, epoch must match), or None."""
        t = attempt_table
        return self._one(
            sa.select(t).where(
                t.c.ti_id == ref.ti_id,
                t.c.try_number == ref.try_number,
                t.c.attempt_epoch == ref.attempt_epoch,
            )
        )

    def get_epoch(self, ti_id: str, attempt_epoch: int) -> Attempt | None:
        """The row of ``ti_id`` at ``attempt_epoch`` whatever its try_number, or None."""
        t = attempt_table
        return self._one(sa.select(t).where(t.c.ti_id == ti_id, t.c.attempt_epoch == attempt_epoch))

    def current(self, ti_id: str) -> Attempt | None:
        """The highest-epoch row of ``ti_id`` (the only one allowed to act, DESIGN §2), or None."""
        t = attempt_table
        return self._one(
            sa.select(t).where(t.c.ti_id == ti_id).order_by(t.c.attempt_epoch.desc()).limit(1)
        )

    def current_many(self, ti_ids: Iterable[str]) -> dict[str, Attempt]:
        """``{ti_id: its highest-epoch row}`` for the ids among ``ti_ids`` that have one: :meth:`current` for a
        batch of dispatches in one query (the ``(ti_id, attempt_epoch)`` unique key serves both the ``IN`` and
        the per-id ``MAX``)."""
        wanted = sorted(set(ti_ids))
        if not wanted:
            return {}
        t = attempt_table
        top = (
            sa.select(t.c.ti_id, sa.func.max(t.c.attempt_epoch).label("top"))
            .where(t.c.ti_id.in_(wanted))
            .group_by(t.c.ti_id)
            .subquery()
        )
        query = sa.select(t).join(top, sa.and_(t.c.ti_id == top.c.ti_id, t.c.attempt_epoch == top.c.top))
        return {a.ref.ti_id: a for a in self._many(query)}

    def previous_try(self, dag_id: str, run_id: str, task_id: str, map_index: int, try_number: int) -> Attempt | None:
        """The latest attempt of the logical TI (dag_id, run_id, task_id, map_index) from a try before
        ``try_number``: the highest ``try_number`` below it, then its highest epoch; None when the ledger holds
        none (the first try, or rows the ledger GC removed). ``reconcile.was_oom_redrive`` reads its resolution."""
        t = attempt_table
        return self._one(
            sa.select(t)
            .where(t.c.dag_id == dag_id, t.c.run_id == run_id, t.c.task_id == task_id, t.c.map_index == map_index,
                   t.c.try_number < try_number)
            .order_by(t.c.try_number.desc(), t.c.attempt_epoch.desc())
            .limit(1)
        )

    def attempts_of_task(self, dag_id: str, run_id: str, task_id: str, map_index: int, *,
                         limit: int = 500) -> list[Attempt]:
        """Every attempt of the logical TI (dag_id, run_id, task_id, map_index), open or closed, ordered by
        (try_number, attempt_epoch, id), at most ``limit``: the UI's attempt timeline (issue 12 item 5). One
        range read of the (dag_id, run_id, task_id, map_index) index; rows the ledger GC removed are gone."""
        t = attempt_table
        return self._many(
            sa.select(t)
            .where(t.c.dag_id == dag_id, t.c.run_id == run_id, t.c.task_id == task_id, t.c.map_index == map_index)
            .order_by(t.c.try_number, t.c.attempt_epoch, t.c.id)
            .limit(limit)
        )

    def current_ref(self, ti_id: str) -> AttemptRef | None:
        """The identity of :meth:`current`'s row, or None, without reading the rest of the row (the stored
        workload): one read on the unique key (ti_id, attempt_epoch)."""
        found = self.current_ref_and(ti_id, sa.true())
        return None if found is None else found[0]

    def current_ref_and(self, ti_id: str, condition: sa.ColumnElement[bool]) -> tuple[AttemptRef, bool] | None:
        """:meth:`current_ref` and the truth of ``condition`` (a SQL boolean, e.g. an ``EXISTS`` on another table
        of the same database) in ONE statement, or None when the ledger has no row of ``ti_id``: the Execution
        API fence asks both on every request of a task's execution (``leoflow_airflow.api.execution_fence``).

        :raises sqlalchemy.exc.SQLAlchemyError: on a DB failure.
        """
        t = attempt_table
        query = (
            sa.select(t.c.ti_id, t.c.try_number, t.c.attempt_epoch, condition.label("condition"))
            .where(t.c.ti_id == ti_id)
            .order_by(t.c.attempt_epoch.desc())
            .limit(1)
        )
        with self._tx() as conn:
            row = conn.execute(query).first()
        if row is None:
            return None
        return AttemptRef(row.ti_id, int(row.try_number), int(row.attempt_epoch)), bool(row.condition)

    def count_resolution(self, ti_id: str, resolution: Resolution) -> int:
        """How many CLOSED rows of ``ti_id`` ended with ``resolution`` (e.g. leoflow's re-dispatches)."""
        t = attempt_table
        query = sa.select(sa.func.count()).select_from(t).where(
            t.c.ti_id == ti_id, t.c.resolution == Resolution(resolution).value
        )
        with self._tx() as conn:
            return int(conn.execute(query).scalar_one())

    def open_attempts(self, *, runtime: str | None = None, ti_id: str | None = None) -> list[Attempt]:
        """Every attempt not CLOSED (optionally only of ``runtime``: "lite"/"kubernetes", and only of ``ti_id``),
        oldest id first. Without ``ti_id`` it reads every running attempt: for a command or a shutdown, never a
        scheduler loop (that pages: :meth:`in_states`, :meth:`open_page`)."""
        t = attempt_table
        query = sa.select(t).where(t.c.state.in_(_OPEN_STATES)).order_by(t.c.id)
        if runtime is not None:
            query = query.where(t.c.runtime == runtime)
        if ti_id is not None:
            query = query.where(t.c.ti_id == ti_id)
        return self._many(query)

    def in_states(self, states: Iterable[AttemptState], *, runtime: str | None = None) -> list[Attempt]:
        """Every attempt in one of ``states`` (optionally only of ``runtime``), oldest id first: one query on the
        ``(state, id)`` index. The lifecycle reads the rows that need action now this way (CLAIMED, EXITED,
        SETTLING: few, and each settled within a pass or two), never the LIVE ones (:meth:`open_page`).

        :raises ValueError: ``states`` is empty or names an unknown state.
        """
        names = [s.value for s in self._expected(states)]
        t = attempt_table
        query = sa.select(t).where(t.c.state.in_(names)).order_by(t.c.id)
        if runtime is not None:
            query = query.where(t.c.runtime == runtime)
        return self._many(query)

    def open_page(self, *, states: Iterable[AttemptState], after_id: int, limit: int,
                  runtime: str | None = None) -> list[Attempt]:
        """One keyset page: up to ``limit`` attempts in one of ``states`` (optionally only of ``runtime``) whose
        ``id`` is above ``after_id``, ascending ``id``. Page on with the last row's ``id``; ``after_id=0``
        starts at the beginning. A page shorter than ``limit`` is the last one.

        One statement per state (``SELECT id, row_version … WHERE state = :s AND id > :after ORDER BY id LIMIT
        :limit``), each a bounded range scan of the ``(state, id)`` index, merged here: the cost of a page is
        ``len(states) * limit`` index entries whatever the number of rows (a single ``state IN (…)`` would make
        PostgreSQL and MySQL gather and sort every matching row for the ``ORDER BY``). Whole rows are then read
        (one ``id IN (…)`` statement) only for the page's ids this store has not read at that ``row_version``;
        the others are the :class:`Attempt` read before, unchanged since (every guarded write moves the
        version). A page of running attempts that did not change costs its ids, not its rows (issue 10,
        "Benchmark"). Each statement on its own (in autocommit where the store has an ``autocommit_engine``:
        under READ COMMITTED one transaction would not make them see one snapshot either); a row whose whole
        read finds it moved on is returned as it is now; one gone meanwhile (purged) is left out.

        :raises ValueError: ``limit`` below 1, ``after_id`` below 0, or an empty/unknown ``states``.
        """
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        if after_id < 0:
            raise ValueError(f"after_id must be >= 0, got {after_id}")
        t = attempt_table
        keys: list[tuple[int, int, str, int]] = []  # (id, row_version, ti_id, attempt_epoch)
        with self._tx() as conn:
            for state in self._expected(states):
                query = sa.select(t.c.id, t.c.row_version, t.c.ti_id, t.c.attempt_epoch).where(
                    t.c.state == state.value, t.c.id > after_id)
                if runtime is not None:
                    query = query.where(t.c.runtime == runtime)
                keys.extend((int(r[0]), int(r[1]), str(r[2]), int(r[3]))
                            for r in conn.execute(query.order_by(t.c.id).limit(limit)))
            keys.sort()
            keys = keys[:limit]
            cache = self._page_cache
            stale = [rid for rid, version, ti_id, epoch in keys if (hit := cache.get(rid)) is None
                     or (hit.row_version, hit.ref.ti_id, hit.ref.attempt_epoch) != (version, ti_id, epoch)]
            for chunk in range(0, len(stale), _PAGE_FETCH_CHUNK):
                query = sa.select(t).where(t.c.id.in_(stale[chunk:chunk + _PAGE_FETCH_CHUNK]))
                for row in conn.execute(query).mappings():
                    attempt = Attempt.from_row(row)
                    cache[attempt.id or 0] = attempt
        if after_id == 0:  # a new sweep: forget the rows the last one did not page (closed, or of other states)
            self._page_cache = cache = {rid: cache[rid] for rid in self._page_seen | {k[0] for k in keys}
                                        if rid in cache}
            self._page_seen = set()
        self._page_seen.update(k[0] for k in keys)
        return [cache[k[0]] for k in keys if k[0] in cache]

    def open_ti_ids(self, ti_ids: Iterable[str]) -> set[str]:
        """The ids among ``ti_ids`` that have an attempt not CLOSED, of any runtime (one query on the unique
        key's leading ``ti_id``): what the orphan-run reaper asks of a page of Airflow's RUNNING task
        instances (:mod:`leoflow_airflow.reap.orphan`)."""
        wanted = sorted(set(ti_ids))
        if not wanted:
            return set()
        t = attempt_table
        query = sa.select(t.c.ti_id).where(t.c.ti_id.in_(wanted), t.c.state.in_(_OPEN_STATES)).distinct()
        with self._tx() as conn:
            return {str(r[0]) for r in conn.execute(query)}

    def closed_before(self, cutoff: datetime, *, limit: int) -> list[Attempt]:
        """Up to ``limit`` CLOSED attempts with ``closed_at < cutoff`` (aware), oldest close first (for GC).

        Raises ``ValueError`` for a naive ``cutoff`` or a ``limit`` below 1.
        """
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        if cutoff.tzinfo is None or cutoff.utcoffset() is None:
            raise ValueError("closed_before needs a timezone-aware cutoff")
        t = attempt_table
        query = (
            sa.select(t)
            .where(t.c.state == AttemptState.CLOSED.value, t.c.closed_at < cutoff)
            .order_by(t.c.closed_at, t.c.id)
            .limit(limit)
        )
        return self._many(query)

    # ------------------------------------------------------------------ helpers

    @staticmethod
    def _expected(expected: Iterable[AttemptState]) -> tuple[AttemptState, ...]:
        if isinstance(expected, str):  # a bare state would iterate as characters
            expected = (expected,)  # type: ignore[assignment]
        states = tuple(dict.fromkeys(AttemptState(s) for s in expected))
        if not states:
            raise ValueError("a guarded write needs at least one expected state")
        return states

    @staticmethod
    def _fact_values(facts: Mapping[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(facts) - FACT_COLUMNS)
        if unknown:
            raise TypeError(f"unknown ledger fact(s): {', '.join(unknown)}")
        values = dict(facts)
        if values.get("resolution") is not None:
            values["resolution"] = Resolution(values["resolution"]).value
        return values

    @staticmethod
    def _guarded_stmt(ref: AttemptRef, states: tuple[AttemptState, ...], values: dict[str, Any],
                      *guards: Any) -> sa.Update:
        """The ``UPDATE`` of exactly ``ref``'s row, only while its state is one of ``states`` and every extra
        ``guards`` clause holds."""
        t = attempt_table
        return (
            t.update()
            .where(
                t.c.ti_id == ref.ti_id,
                t.c.try_number == ref.try_number,
                t.c.attempt_epoch == ref.attempt_epoch,
                t.c.state.in_([s.value for s in states]),
                *guards,
            )
            .values(**values, row_version=t.c.row_version + 1)
        )

    def _guarded_update(
        self, ref: AttemptRef, states: tuple[AttemptState, ...], values: dict[str, Any], *guards: Any
    ) -> bool:
        """Run :meth:`_guarded_stmt` as its own unit; whether it changed the row."""
        stmt = self._guarded_stmt(ref, states, values, *guards)
        with self._tx() as conn:
            changed = conn.execute(stmt).rowcount == 1
        if not changed:
            log.debug("guarded write on attempt %s expecting %s%s changed nothing", ref, [s.value for s in states],
                      f" and {len(guards)} more guard(s)" if guards else "")
        return changed

    def _one(self, query: sa.Select) -> Attempt | None:
        with self._tx() as conn:
            row = conn.execute(query).mappings().first()
        return Attempt.from_row(row) if row is not None else None

    def _many(self, query: sa.Select) -> list[Attempt]:
        with self._tx() as conn:
            rows = conn.execute(query).mappings().all()
        return [Attempt.from_row(r) for r in rows]
