"""Reads of Airflow's own metadata rows that the executor needs, and the one guarded heartbeat refresh it
makes (:func:`hold_off_purge`), on a fresh non-scoped session.

A non-scoped session never shares the scheduler thread's scoped session, so committing or closing it can
never end a transaction the scheduler loop has open.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from leoflow_airflow.dispatch.guard import TIRow
from leoflow_airflow.reap.lost import SUPERSEDED
from leoflow_airflow.reap.orphan import RunningTI


def _row(ti: object | None) -> TIRow | None:
    if ti is None:
        return None
    return TIRow(
        id=str(ti.id),  # type: ignore[attr-defined]
        state=None if ti.state is None else str(ti.state),  # type: ignore[attr-defined]
        try_number=int(ti.try_number),  # type: ignore[attr-defined]
        max_tries=int(ti.max_tries or 0),  # type: ignore[attr-defined]
        queued_by_job_id=ti.queued_by_job_id,  # type: ignore[attr-defined]
    )


def load_ti_row_by_id(ti_id: str) -> TIRow | None:
    """Return the live ``task_instance`` row whose primary key is ``ti_id``, or ``None``."""
    return load_ti_rows_by_id([ti_id]).get(str(ti_id))


def load_ti_rows_by_id(ti_ids: list[str]) -> dict[str, TIRow]:
    """Return ``{ti_id: row}`` for the live ``task_instance`` rows among ``ti_ids`` (one query on the primary
    key, the guard's columns only); an id that is not a UUID or has no row is absent.

    :raises sqlalchemy.exc.SQLAlchemyError: on a DB failure.
    """
    from sqlalchemy import select

    from airflow.models.taskinstance import TaskInstance as TI
    from airflow.utils.session import create_session

    keys = set()
    for ti_id in ti_ids:
        try:
            keys.add(uuid.UUID(str(ti_id)))
        except ValueError:
            continue
    if not keys:
        return {}
    with create_session(scoped=False) as session:
        rows = session.execute(
            select(TI.id, TI.state, TI.try_number, TI.max_tries, TI.queued_by_job_id).where(TI.id.in_(sorted(keys)))
        ).all()
    return {str(r.id): _row(r) for r in rows}  # type: ignore[misc]


LogicalKey = tuple[str, str, str, int]
"""``(dag_id, run_id, task_id, map_index)``: one logical task instance, whose row id changes with each try."""

_LOGICAL_CHUNK = 200
"""Logical keys per ``(dag_id, run_id, task_id, map_index) IN (…)`` statement (bounded parameters)."""


def load_ti_row(dag_id: str, run_id: str, task_id: str, map_index: int) -> TIRow | None:
    """Return the live ``task_instance`` row of one logical TI (its current id may differ), or ``None``."""
    key = (dag_id, run_id, task_id, map_index)
    return load_ti_rows([key]).get(key)


def load_ti_rows(keys: list[LogicalKey]) -> dict[LogicalKey, TIRow]:
    """Return ``{(dag_id, run_id, task_id, map_index): row}`` for the logical TIs among ``keys`` that have a live
    ``task_instance`` row: the guard's five columns, one query per 200 keys on Airflow's unique key of those four
    columns (the settle pass reads every attempt it settles this way, not through one ORM load each).

    :raises sqlalchemy.exc.SQLAlchemyError: on a DB failure.
    """
    from sqlalchemy import select, tuple_

    from airflow.models.taskinstance import TaskInstance as TI
    from airflow.utils.session import create_session

    wanted = sorted(set(keys))
    found: dict[LogicalKey, TIRow] = {}
    if not wanted:
        return found
    with create_session(scoped=False) as session:
        for start in range(0, len(wanted), _LOGICAL_CHUNK):
            chunk = wanted[start:start + _LOGICAL_CHUNK]
            where = (TI.dag_id == chunk[0][0], TI.run_id == chunk[0][1], TI.task_id == chunk[0][2],
                     TI.map_index == chunk[0][3]) if len(chunk) == 1 else (
                tuple_(TI.dag_id, TI.run_id, TI.task_id, TI.map_index).in_(chunk),)
            rows = session.execute(
                select(TI.dag_id, TI.run_id, TI.task_id, TI.map_index, TI.id, TI.state, TI.try_number, TI.max_tries,
                       TI.queued_by_job_id).where(*where)
            ).all()
            for r in rows:
                found[(r.dag_id, r.run_id, r.task_id, int(r.map_index))] = _row(r)  # type: ignore[assignment]
    return found


def load_ti_liveness(ti_ids: list[str]) -> dict[str, tuple[str | None, object]]:
    """Return ``{ti_id: (state, last_heartbeat_at)}`` for the live rows among ``ti_ids`` (one query), and
    ``(SUPERSEDED, end_date)`` for the ids a newer try archived to ``task_instance_history`` (a second query, only
    for the ids the first did not find): Airflow 3.3 gives a clear, a retry and an infra re-drive a new id at once
    (``prepare_db_for_next_try``), stamping the archived row's ``end_date`` then if it had none, so that date is
    when the execution stopped being its task's current one. An id in neither table is absent."""
    from sqlalchemy import select

    from airflow.models.taskinstance import TaskInstance
    from airflow.models.taskinstancehistory import TaskInstanceHistory
    from airflow.utils.session import create_session

    keys = []
    for ti_id in ti_ids:
        try:
            keys.append(uuid.UUID(ti_id))
        except ValueError:
            continue
    if not keys:
        return {}
    with create_session(scoped=False) as session:
        rows = session.execute(
            select(TaskInstance.id, TaskInstance.state, TaskInstance.last_heartbeat_at).where(TaskInstance.id.in_(keys))
        ).all()
        found: dict[str, tuple[str | None, object]] = {
            str(r.id): (None if r.state is None else str(r.state), r.last_heartbeat_at) for r in rows}
        missing = [k for k in keys if str(k) not in found]
        if missing:
            archived = session.execute(
                select(TaskInstanceHistory.task_instance_id, TaskInstanceHistory.end_date)
                .where(TaskInstanceHistory.task_instance_id.in_(missing))
            ).all()
            found.update({str(r.task_instance_id): (SUPERSEDED, r.end_date) for r in archived})
    return found


def _aware(value: Any) -> datetime | None:
    """A timestamp read from Airflow as tz-aware UTC (SQLite hands back naive UTC through a Core select)."""
    from datetime import timezone

    if value is None:
        return None
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)


def load_running_tis(after: str | None, limit: int, *, session: Any = None) -> list[RunningTI]:
    """One keyset page of Airflow's RUNNING task instances, for the orphan-run reaper
    (:mod:`leoflow_airflow.reap.orphan`): up to ``limit`` rows of ``task_instance`` in state RUNNING whose ``id``
    is above ``after`` (None: from the start), ascending ``id``, each joined with its ``dag_run`` (state and
    start). Page on with the last row's ``ti_id``; a page shorter than ``limit`` is the last.

    One query through Airflow's ORM models (the ``ti_state`` index picks the RUNNING rows): its cost is the
    number of RUNNING task instances at most, never the table's history, and a ``sync()`` makes one such read.

    :param session: read in this SQLAlchemy session; default a fresh non-scoped session.
    :raises ValueError: ``limit`` below 1 or an ``after`` that is not a UUID.
    :raises sqlalchemy.exc.SQLAlchemyError: on a DB failure.
    """
    from sqlalchemy import and_, select

    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import TaskInstance as TI
    from airflow.utils.session import create_session
    from airflow.utils.state import TaskInstanceState

    if limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    query = (
        select(TI.id, TI.dag_id, TI.run_id, TI.task_id, TI.map_index, TI.try_number, TI.state, TI.executor,
               TI.queued_dttm, TI.start_date, TI.last_heartbeat_at, TI.updated_at,
               DagRun.state.label("run_state"), DagRun.start_date.label("run_start_date"))
        .join(DagRun, and_(DagRun.dag_id == TI.dag_id, DagRun.run_id == TI.run_id))
        .where(TI.state == TaskInstanceState.RUNNING)
        .order_by(TI.id)
        .limit(limit)
    )
    if after is not None:
        query = query.where(TI.id > uuid.UUID(str(after)))
    if session is not None:
        rows = session.execute(query).all()
    else:
        with create_session(scoped=False) as own:
            rows = own.execute(query).all()
    return [RunningTI(ti_id=str(r.id), dag_id=r.dag_id, run_id=r.run_id, task_id=r.task_id,
                      map_index=int(r.map_index), try_number=int(r.try_number),
                      state=None if r.state is None else str(r.state), executor=r.executor,
                      run_state=None if r.run_state is None else str(r.run_state),
                      queued_dttm=_aware(r.queued_dttm), start_date=_aware(r.start_date),
                      last_heartbeat_at=_aware(r.last_heartbeat_at), updated_at=_aware(r.updated_at),
                      run_start_date=_aware(r.run_start_date))
            for r in rows]


def load_executor_config(ti_id: str, *, session: Any = None) -> dict | None:
    """The ``executor_config`` of task instance ``ti_id`` as Airflow stores it (``task_instance.executor_config``,
    an ``ExecutorConfigType`` column pickled with dill, unpickled here by the ORM), or None (no row, no config,
    a ``ti_id`` that is not a UUID).

    Airflow excludes ``ti.executor_config`` from a workload's JSON (``TaskInstanceDTO``, ``exclude=True``), so a
    workload rebuilt from the ledger's stored JSON lacks it; this is where it comes back from, so a re-dispatched
    pod keeps its ``pod_override``.

    :param session: read in this SQLAlchemy session; default a fresh non-scoped session.
    :raises sqlalchemy.exc.SQLAlchemyError: on a DB failure.
    """
    from sqlalchemy import select

    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    try:
        key = uuid.UUID(str(ti_id))
    except ValueError:
        return None
    query = select(TaskInstance.executor_config).where(TaskInstance.id == key)
    if session is not None:
        value = session.scalar(query)
    else:
        with create_session(scoped=False) as own:
            value = own.scalar(query)
    return value or None


def purge_holdoff_allowed(*, since: datetime | None, now: datetime, max_seconds: float) -> bool:
    """Whether Airflow's heartbeat purge may still be held off for an attempt whose report awaits a replay.

    Pure. ``since``: when the attempt was found dead (the ledger's ``exited_at``), aware UTC; ``None`` gives
    no bound, so no hold-off. ``max_seconds``: ``[leoflow] replay_holdoff_max_seconds`` (0: never). True while
    ``now - since <= max_seconds``; past it Airflow's own purge takes over (review finding 8: the hold-off
    must be bounded, so a replay that never lands cannot keep a TI RUNNING for ever).

    Why the default is 3600 s: without a hold-off Airflow fails the TI ``[scheduler]
    task_instance_heartbeat_timeout`` (300 s) after its last heartbeat. Api-server outages that end on their
    own (a restart or rolling deploy: seconds to minutes; a DB failover or a lost node: tens of minutes) fit
    in an hour, twelve default heartbeat timeouts. A replay that can never land but is not recognised as
    final (a persistent 5xx) hands the TI back to Airflow's own path within that hour, where the user's
    retries and failure callback apply. Holding off costs no slot (the agent is dead); the TI only shows
    RUNNING, so its downstream tasks wait.
    """
    if since is None or max_seconds <= 0:
        return False
    return (now - since).total_seconds() <= max_seconds


def hold_off_purge(ti_id: str, *, now: datetime | None = None, session: Any = None) -> bool:
    """Refresh ``last_heartbeat_at`` of the RUNNING TI ``ti_id`` so Airflow's heartbeat purge passes it over.

    Issue 8 hole 7, review finding 8: while a current epoch's recorded terminal report cannot be replayed
    (the api-server is down), Airflow's DB-only purge (``scheduler_job_runner.py``
    ``_find_task_instances_without_heartbeats``: RUNNING/RESTARTING with ``last_heartbeat_at`` older than
    ``[scheduler] task_instance_heartbeat_timeout``) would fail a task whose success is on disk. One guarded
    ``UPDATE task_instance SET last_heartbeat_at = :now WHERE id = :ti_id AND state = 'running'``, the same
    refresh adoption does (DESIGN §3 "Adoption"). The caller bounds it with :func:`purge_holdoff_allowed`.

    :param ti_id: the TI's primary key (a UUID string).
    :param now: the new heartbeat time, aware UTC; default ``airflow.utils.timezone.utcnow()``.
    :param session: run inside this SQLAlchemy session's transaction (the caller commits); default a fresh
        non-scoped session, committed here.
    :returns: True when a row changed; False when the TI is gone or no longer RUNNING (then leave it alone).
    :raises ValueError: ``ti_id`` is not a UUID (nothing written).
    :raises sqlalchemy.exc.SQLAlchemyError: on a DB failure (nothing committed).
    """
    from sqlalchemy import update

    from airflow.models.taskinstance import TaskInstance
    from airflow.utils import timezone
    from airflow.utils.session import create_session
    from airflow.utils.state import TaskInstanceState

    try:
        key = uuid.UUID(str(ti_id))
    except ValueError:
        raise ValueError(f"hold_off_purge: ti_id {ti_id!r} is not a UUID") from None
    stmt = (
        update(TaskInstance)
        .where(TaskInstance.id == key, TaskInstance.state == TaskInstanceState.RUNNING)
        .values(last_heartbeat_at=now or timezone.utcnow())
        .execution_options(synchronize_session=False)
    )
    if session is not None:
        return session.execute(stmt).rowcount == 1
    with create_session(scoped=False) as fresh:
        return fresh.execute(stmt).rowcount == 1
