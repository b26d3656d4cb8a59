"""``WarmLedger``: the warm-pod worker rows (``leoflow_warm_worker``) and the in-band outcome records.

Issue 11 / DESIGN "Warm pools": the ledger is the only channel between the scheduler (which assigns an
attempt to an idle registered worker) and the api-server (which hands the assigned attempt to the pod's agent on
its long poll, and stores the outcome record the agent POSTs). A row moves

``idle --assign--> assigned --take--> busy --release--> idle``, and ``assigned --unassign--> idle``;

``register`` inserts it (or, for a pod that holds nothing, replaces its credential) and ``forget`` deletes it.
As :class:`~leoflow_airflow.ledger.store.LedgerStore` does for attempts (DESIGN §2 Invariant 1), every write is
ONE guarded statement (``UPDATE … WHERE pod_uid AND state AND …``) and returns whether it changed a row;
``False`` means someone else moved the row on, and the caller does nothing destructive. ``row_version`` counts the
state changes, and ``assign`` is guarded on it: of two schedulers (or one scheduler's two launches) that read one
idle row and assign it, exactly one changes it. ``seen`` is not a state change and leaves ``row_version`` alone,
so a worker's polling never makes a scheduler's assignment lose. No transaction outlives a method call.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine, RowMapping
from sqlalchemy.exc import IntegrityError

from leoflow_airflow.ledger.models import attempt_table, warm_worker_table
from leoflow_airflow.ledger.states import AttemptRef

__all__ = ["ASSIGNED", "BUSY", "IDLE", "KILLING", "WORKER_STATES", "WarmLedger", "WarmWorker"]

log = logging.getLogger(__name__)

IDLE = "idle"
"""Registered, holds nothing: the scheduler may assign it an attempt of its ``dag_version_id``."""
ASSIGNED = "assigned"
"""A scheduler assigned it an attempt; its agent has not taken it yet."""
BUSY = "busy"
"""Its agent took the attempt (the api-server handed it the workload) and runs it."""
KILLING = "killing"
"""The scheduler is killing the attempt it holds (its pod is being deleted): never released, never assigned again
(:meth:`WarmLedger.mark_killing`; k8s review §7)."""
WORKER_STATES: frozenset[str] = frozenset({IDLE, ASSIGNED, BUSY, KILLING})

_OUTCOME_CHUNK = 500
"""ti_ids per ``ti_id IN (…)`` statement of :meth:`WarmLedger.outcomes` (bounded parameters)."""


def _utcnow() -> datetime:
    return datetime.now(timezone.utc)


@dataclass(frozen=True)
class WarmWorker:
    """One ``leoflow_warm_worker`` row, read-only. Timestamps are timezone-aware UTC.

    ``ref`` is the attempt the worker holds while ``assigned`` or ``busy``, None while ``idle``;
    ``attempts_taken`` counts the attempts it took (``busy`` transitions); ``row_version`` the state changes (the
    guard of :meth:`WarmLedger.assign`). The credential hash is not part of it: only :meth:`WarmLedger.by_credential`
    looks rows up by it.
    """

    pod_uid: str
    pod_name: str
    namespace: str
    dag_version_id: str
    state: str
    ref: AttemptRef | None
    assigned_at: datetime | None
    taken_at: datetime | None
    registered_at: datetime
    last_seen_at: datetime | None
    attempts_taken: int
    row_version: int

    @classmethod
    def from_row(cls, row: RowMapping) -> WarmWorker:
        """Build from a ``leoflow_warm_worker`` row mapping."""
        ref = None
        if row["ti_id"] is not None and row["try_number"] is not None and row["attempt_epoch"] is not None:
            ref = AttemptRef(row["ti_id"], int(row["try_number"]), int(row["attempt_epoch"]))
        return cls(pod_uid=row["pod_uid"], pod_name=row["pod_name"], namespace=row["namespace"],
                   dag_version_id=row["dag_version_id"], state=row["state"], ref=ref,
                   assigned_at=row["assigned_at"], taken_at=row["taken_at"], registered_at=row["registered_at"],
                   last_seen_at=row["last_seen_at"], attempts_taken=int(row["attempts_taken"]),
                   row_version=int(row["row_version"]))


def _check_sha256(value: str) -> str:
    if not isinstance(value, str) or len(value) != 64 or any(c not in "0123456789abcdef" for c in value):
        raise ValueError("credential_sha256 must be 64 lowercase hex characters (a SHA-256 hexdigest)")
    return value


class WarmLedger:
    """Reads and guarded writes of ``leoflow_warm_worker`` (and ``leoflow_attempt.outcome_json``) over one
    SQLAlchemy engine, with :class:`~leoflow_airflow.ledger.store.LedgerStore`'s conventions: thread-safe (each
    call checks out its own connection and runs one short transaction), ``clock`` the aware UTC "now" of every
    timestamp written (tests inject one)."""

    def __init__(self, engine: Engine, *, clock: Callable[[], datetime] = _utcnow) -> None:
        """Wrap ``engine`` (whose database has the ledger at revision 0007 or later)."""
        self.engine = engine
        self._clock = clock
        self._engine_owner: object | None = None

    @classmethod
    def from_airflow(cls) -> WarmLedger:
        """A warm ledger on its own small engine to Airflow's metadata DB, built exactly as
        :meth:`LedgerStore.from_airflow` builds its engine. Raises ``RuntimeError`` if Airflow has no DB URL."""
        from leoflow_airflow.ledger.store import LedgerStore

        store = LedgerStore.from_airflow()
        ledger = cls(store.engine)
        ledger._engine_owner = store  # keeps the store's after-fork disposal of the engine registered
        return ledger

    # ------------------------------------------------------------------ writes

    def register(self, *, pod_uid: str, pod_name: str, namespace: str, dag_version_id: str,
                 credential_sha256: str) -> bool:
        """Register the warm pod ``pod_uid`` as an ``idle`` worker holding credential hash ``credential_sha256``;
        whether a row was written.

        A pod seen for the first time is inserted (``registered_at`` = now, ``last_seen_at`` None: a worker
        registers before it parses its DAG file, and counts as ready only once it awaits, :meth:`seen`). A pod
        already registered that holds nothing (``idle``) gets the new credential (the old one stops working), its
        name/namespace/version refreshed, ``registered_at`` reset and ``last_seen_at`` cleared, in one guarded ``UPDATE … WHERE pod_uid AND
        state = 'idle'``. ``False``: its row holds an attempt (``assigned`` or ``busy``): a re-register is refused.

        :raises ValueError: ``credential_sha256`` is not a SHA-256 hexdigest, or an identity field is empty.
        """
        _check_sha256(credential_sha256)
        if not (pod_uid and pod_name and namespace and dag_version_id):
            raise ValueError("pod_uid, pod_name, namespace and dag_version_id must all be non-empty")
        t = warm_worker_table
        now = self._clock()
        fields = dict(pod_name=pod_name, namespace=namespace, dag_version_id=dag_version_id,
                      credential_sha256=credential_sha256, registered_at=now, last_seen_at=None, updated_at=now)
        try:
            with self.engine.begin() as conn:
                conn.execute(t.insert().values(pod_uid=pod_uid, state=IDLE, attempts_taken=0, row_version=0,
                                               **fields))
            return True
        except IntegrityError:
            pass  # registered before (or the credential hash collides: then the update below fails the same way)
        return self._update(pod_uid, (t.c.state == IDLE,), fields, bump=True)

    def seen(self, pod_uid: str) -> bool:
        """Set ``last_seen_at`` of ``pod_uid`` to now (a state-neutral write: ``row_version`` unchanged);
        whether the row exists."""
        now = self._clock()
        return self._update(pod_uid, (), {"last_seen_at": now}, bump=False)

    def assign(self, pod_uid: str, ref: AttemptRef, *, row_version: int) -> bool:
        """``idle -> assigned(ref)``, guarded on ``row_version`` (the version the caller read the idle row at):
        ``assigned_at`` = now, ``taken_at`` cleared. Of concurrent assigns of one idle row exactly one changes it
        (the others find the state or the version moved); ``False`` for them, and for a row gone or not idle."""
        t = warm_worker_table
        values = {"state": ASSIGNED, "ti_id": ref.ti_id, "try_number": ref.try_number,
                  "attempt_epoch": ref.attempt_epoch, "assigned_at": self._clock(), "taken_at": None}
        return self._update(pod_uid, (t.c.state == IDLE, t.c.row_version == row_version), values, bump=True)

    def take(self, pod_uid: str, ref: AttemptRef) -> bool:
        """``assigned(ref) -> busy``: ``taken_at`` = now, ``attempts_taken + 1``. ``False`` when the row is not
        assigned exactly ``ref`` (unassigned meanwhile, or taken by a concurrent poll)."""
        t = warm_worker_table
        values = {"state": BUSY, "taken_at": self._clock(), "attempts_taken": t.c.attempts_taken + 1}
        return self._update(pod_uid, (t.c.state == ASSIGNED, *self._holds(ref)), values, bump=True)

    def unassign(self, pod_uid: str, ref: AttemptRef) -> bool:
        """``assigned(ref) -> idle`` (the attempt is stale, or the scheduler revoked it before the agent took
        it): the attempt fields and ``assigned_at`` cleared. ``False`` when the row is not assigned ``ref``."""
        t = warm_worker_table
        return self._update(pod_uid, (t.c.state == ASSIGNED, *self._holds(ref)), self._cleared(), bump=True)

    def release(self, pod_uid: str) -> bool:
        """``busy -> idle`` (the worker finished its attempt and asks for the next): the attempt fields,
        ``assigned_at`` and ``taken_at`` cleared. ``False`` when the row is not busy."""
        t = warm_worker_table
        return self._update(pod_uid, (t.c.state == BUSY,), self._cleared(), bump=True)

    def mark_killing(self, pod_uid: str, ref: AttemptRef) -> bool:
        """``busy(ref) -> killing(ref)`` (also ``killing(ref)`` again, a kill repeated with a shorter grace): the
        scheduler may delete the pod only when this changed a row, the proof that the pod still runs ``ref``
        (k8s review §7). A ``killing`` row is never released (``release`` wants ``busy``) and never assigned
        (``assign`` wants ``idle``), so no newer attempt reaches the pod before its delete lands. ``False``: the
        row holds no ``ref`` (released, so the attempt's child ended; or another attempt): delete nothing."""
        t = warm_worker_table
        return self._update(pod_uid, (t.c.state.in_((BUSY, KILLING)), *self._holds(ref)), {"state": KILLING},
                            bump=True)

    def retire_idle(self, pod_uid: str, *, row_version: int) -> bool:
        """Delete the row of ``pod_uid`` only while it is ``idle`` at ``row_version`` (the version the caller read
        it at): the pool's delete of an idle warm pod goes ahead only when this changed a row (k8s review §16g).
        A scheduler that assigned the row since the read moved ``row_version`` on: ``False``, and the pod is kept;
        one that assigns after this finds no row, so its guarded ``assign`` loses cleanly. The pod's credential
        stops working with the row (its agent's next ``await`` answers 401: retired, it exits 0)."""
        t = warm_worker_table
        stmt = t.delete().where(t.c.pod_uid == pod_uid, t.c.state == IDLE, t.c.row_version == row_version)
        with self.engine.begin() as conn:
            return conn.execute(stmt).rowcount == 1

    def forget(self, pod_uid: str) -> bool:
        """Delete the row of ``pod_uid`` (its pod is gone or retired; its credential stops working); whether a
        row was deleted."""
        t = warm_worker_table
        with self.engine.begin() as conn:
            return conn.execute(t.delete().where(t.c.pod_uid == pod_uid)).rowcount == 1

    def store_outcome(self, ref: AttemptRef, record_json: str) -> bool:
        """Store ``record_json`` (an outcome record, :mod:`leoflow_agent.outcome`) as ``ref``'s
        ``leoflow_attempt.outcome_json``, first write wins: one ``UPDATE … WHERE ti_id AND try_number AND
        attempt_epoch AND outcome_json IS NULL`` (``row_version`` + 1, so a cached read of the attempt is
        refreshed). ``False``: a record was stored before, or the attempt is not in the ledger.

        :raises ValueError: ``record_json`` is empty.
        """
        if not record_json:
            raise ValueError("an empty outcome record")
        t = attempt_table
        stmt = (t.update()
                .where(t.c.ti_id == ref.ti_id, t.c.try_number == ref.try_number,
                       t.c.attempt_epoch == ref.attempt_epoch, t.c.outcome_json.is_(None))
                .values(outcome_json=record_json, updated_at=self._clock(), row_version=t.c.row_version + 1))
        with self.engine.begin() as conn:
            return conn.execute(stmt).rowcount == 1

    # ------------------------------------------------------------------ reads

    def by_credential(self, credential_sha256: str) -> WarmWorker | None:
        """The worker whose credential hashes to ``credential_sha256`` (a lookup on the unique index), or None.
        A malformed hash is None (never a database error)."""
        try:
            _check_sha256(credential_sha256)
        except ValueError:
            return None
        t = warm_worker_table
        return self._one(sa.select(t).where(t.c.credential_sha256 == credential_sha256))

    def get(self, pod_uid: str) -> WarmWorker | None:
        """The worker row of ``pod_uid``, or None."""
        t = warm_worker_table
        return self._one(sa.select(t).where(t.c.pod_uid == pod_uid))

    def workers(self, namespace: str) -> list[WarmWorker]:
        """Every worker row of ``namespace``, oldest registration first (then by ``pod_uid``)."""
        t = warm_worker_table
        query = sa.select(t).where(t.c.namespace == namespace).order_by(t.c.registered_at, t.c.pod_uid)
        with self.engine.connect() as conn:
            return [WarmWorker.from_row(r) for r in conn.execute(query).mappings().all()]

    def outcomes(self, refs: Iterable[AttemptRef]) -> dict[AttemptRef, str]:
        """The stored outcome records of those of ``refs`` that have one: ``{ref: record_json}`` (one
        ``ti_id IN (…)`` read per 500 ti_ids; exact refs matched here)."""
        wanted = {AttemptRef(r.ti_id, r.try_number, r.attempt_epoch) for r in refs}
        if not wanted:
            return {}
        t = attempt_table
        ti_ids = sorted({r.ti_id for r in wanted})
        found: dict[AttemptRef, str] = {}
        with self.engine.connect() as conn:
            for i in range(0, len(ti_ids), _OUTCOME_CHUNK):
                query = sa.select(t.c.ti_id, t.c.try_number, t.c.attempt_epoch, t.c.outcome_json).where(
                    t.c.ti_id.in_(ti_ids[i:i + _OUTCOME_CHUNK]), t.c.outcome_json.is_not(None))
                for row in conn.execute(query):
                    ref = AttemptRef(str(row[0]), int(row[1]), int(row[2]))
                    if ref in wanted:
                        found[ref] = str(row[3])
        return found

    # ------------------------------------------------------------------ helpers

    @staticmethod
    def _holds(ref: AttemptRef) -> tuple[Any, ...]:
        t = warm_worker_table
        return (t.c.ti_id == ref.ti_id, t.c.try_number == ref.try_number, t.c.attempt_epoch == ref.attempt_epoch)

    @staticmethod
    def _cleared() -> dict[str, Any]:
        return {"state": IDLE, "ti_id": None, "try_number": None, "attempt_epoch": None, "assigned_at": None,
                "taken_at": None}

    def _update(self, pod_uid: str, guards: tuple[Any, ...], values: dict[str, Any], *, bump: bool) -> bool:
        """One ``UPDATE`` of ``pod_uid``'s row while every ``guards`` clause holds; ``bump``: a state change
        (``row_version + 1``, ``updated_at`` = now). Whether it changed the row."""
        t = warm_worker_table
        values = dict(values)
        if bump:
            values.setdefault("updated_at", self._clock())
            values["row_version"] = t.c.row_version + 1
        stmt = t.update().where(t.c.pod_uid == pod_uid, *guards).values(**values)
        with self.engine.begin() as conn:
            changed = conn.execute(stmt).rowcount == 1
        if not changed:
            log.debug("warm worker %s: guarded write %s changed nothing", pod_uid, sorted(values))
        return changed

    def _one(self, query: sa.Select) -> WarmWorker | None:
        with self.engine.connect() as conn:
            row = conn.execute(query).mappings().first()
        return WarmWorker.from_row(row) if row is not None else None
