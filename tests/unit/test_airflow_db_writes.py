"""leoflow's guarded writes to Airflow's own rows, on SQLite with Airflow 3.3.2's real models (issue 8 holes 7b
and 16a): the purge hold-off (``airflow_db.hold_off_purge``) and the infra budget's reset on a dag-run clear
(``redrive.charge_budget``), plus their pure decisions (``purge_holdoff_allowed``, ``budget_decision``).
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from leoflow_airflow.airflow_db import hold_off_purge, purge_holdoff_allowed
from leoflow_airflow.redrive import budget_decision, charge_budget

T0 = datetime(2026, 12, 1, 4, 0, tzinfo=timezone.utc)


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    """A SQLite file with Airflow's whole metadata schema and leoflow's ledger tables."""
    from airflow.models import Base, import_all_models

    from leoflow_airflow.ledger.models import metadata as ledger_metadata

    import_all_models()
    eng = sa.create_engine(f"sqlite:///{tmp_path_factory.mktemp('afdb') / 'airflow.db'}")
    Base.metadata.create_all(eng)
    ledger_metadata.create_all(eng)
    yield eng
    eng.dispose()


def _add_run(session: Session, run_id: str, clear_number: int = 0) -> None:
    from airflow.models.dagrun import DagRun

    session.execute(sa.insert(DagRun.__table__).values(
        dag_id="d", run_id=run_id, run_type="manual", run_after=T0, clear_number=clear_number))


def _add_ti(session: Session, run_id: str, *, state: str = "running", max_tries: int = 0,
            heartbeat: datetime | None = T0, task_id: str = "t") -> str:
    from airflow.models.taskinstance import TaskInstance

    ti_id = uuid.uuid4()
    session.execute(sa.insert(TaskInstance.__table__).values(
        id=ti_id, dag_id="d", run_id=run_id, task_id=task_id, map_index=-1, try_number=1, max_tries=max_tries,
        pool="default_pool", pool_slots=1, state=state, last_heartbeat_at=heartbeat))
    return str(ti_id)


def _heartbeat(session: Session, ti_id: str):
    from airflow.models.taskinstance import TaskInstance

    return session.scalar(sa.select(TaskInstance.last_heartbeat_at).where(TaskInstance.id == uuid.UUID(ti_id)))


# --- hold_off_purge ---------------------------------------------------------------------------------------

def test_hold_off_refreshes_a_running_tis_heartbeat_and_says_so(engine):
    """The RUNNING TI's ``last_heartbeat_at`` moves to now, so Airflow's purge (``last_heartbeat_at <
    now - task_instance_heartbeat_timeout``) passes it over; the call reports that it changed a row."""
    with Session(engine) as session:
        _add_run(session, "r-hold")
        ti_id = _add_ti(session, "r-hold", heartbeat=T0)
        other = _add_ti(session, "r-hold", heartbeat=T0, task_id="other")
        session.commit()
        later = T0 + timedelta(seconds=400)
        assert hold_off_purge(ti_id, now=later, session=session) is True
        session.commit()
        assert _heartbeat(session, ti_id).replace(tzinfo=timezone.utc) == later
        assert _heartbeat(session, other).replace(tzinfo=timezone.utc) == T0  # only that row


@pytest.mark.parametrize("state", ["success", "failed", "up_for_retry", "restarting", "queued"])
def test_hold_off_leaves_a_ti_that_is_not_running_alone(engine, state):
    """Guarded: a TI that moved on (or a user cleared: RESTARTING) is not touched, and the call says so."""
    run_id = f"r-{state}"
    with Session(engine) as session:
        _add_run(session, run_id)
        ti_id = _add_ti(session, run_id, state=state, heartbeat=T0)
        session.commit()
        assert hold_off_purge(ti_id, now=T0 + timedelta(seconds=400), session=session) is False
        session.commit()
        assert _heartbeat(session, ti_id).replace(tzinfo=timezone.utc) == T0


def test_hold_off_of_an_unknown_or_malformed_ti_id(engine):
    with Session(engine) as session:
        assert hold_off_purge(str(uuid.uuid4()), now=T0, session=session) is False
        with pytest.raises(ValueError, match="not-a-uuid"):
            hold_off_purge("not-a-uuid", now=T0, session=session)


def test_purge_holdoff_is_bounded():
    """Held off for at most ``[leoflow] replay_holdoff_max_seconds`` after the attempt exited; 0 never;
    an unknown exit time gives no bound, so no hold-off."""
    assert purge_holdoff_allowed(since=T0, now=T0 + timedelta(seconds=3600), max_seconds=3600)
    assert not purge_holdoff_allowed(since=T0, now=T0 + timedelta(seconds=3601), max_seconds=3600)
    assert not purge_holdoff_allowed(since=T0, now=T0, max_seconds=0)
    assert not purge_holdoff_allowed(since=None, now=T0, max_seconds=3600)


# --- the infra budget and a dag-run clear -----------------------------------------------------------------

def _charge(session: Session, ti_id: str, limit: int = 2) -> bool:
    """What ``infra_redrive`` does with the decision: charge, then write ``max_tries + 1``."""
    from airflow.models.taskinstance import TaskInstance

    ti = session.get(TaskInstance, uuid.UUID(ti_id))
    decision = charge_budget(session, ti, limit=limit)
    if decision.allowed:
        ti.max_tries += 1
    session.commit()
    return decision.allowed


def _clear(session: Session, ti_id: str, *, try_number: int, retries: int, bump_clear_number: bool) -> None:
    """What Airflow's ``clear_task_instances`` writes (``models/taskinstance.py``): ``max_tries = try_number +
    retries``, and ``clear_number + 1`` on the dag run unless the clear leaves dag runs alone
    (``reset_dag_runs=False`` in the REST API, ``dag.test()``)."""
    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import TaskInstance

    ti = session.get(TaskInstance, uuid.UUID(ti_id))
    ti.max_tries = try_number + retries
    if bump_clear_number:
        session.execute(sa.update(DagRun).where(DagRun.dag_id == ti.dag_id, DagRun.run_id == ti.run_id)
                        .values(clear_number=DagRun.clear_number + 1))
    session.commit()


def test_a_clear_resets_the_budget_even_when_max_tries_comes_out_the_same(engine):
    """Review 13a: retries=3 and two re-drives give max_tries 5; the user lowers retries to 2 and clears at
    try 3: 3 + 2 = 5 again. The dag run's clear_number changed, so the budget starts over."""
    with Session(engine) as session:
        _add_run(session, "r-13a")
        ti_id = _add_ti(session, "r-13a", max_tries=3)
        session.commit()
        assert _charge(session, ti_id) and _charge(session, ti_id)
        assert not _charge(session, ti_id)  # spent: Airflow's own failure path takes over
        _clear(session, ti_id, try_number=3, retries=2, bump_clear_number=True)
        assert _charge(session, ti_id), "the clear must give the task a fresh infra budget"


def test_a_clear_that_leaves_the_dag_run_alone_falls_back_to_max_tries(engine):
    """A clear with ``reset_dag_runs=False`` keeps clear_number: a changed max_tries still resets."""
    with Session(engine) as session:
        _add_run(session, "r-nodr")
        ti_id = _add_ti(session, "r-nodr", max_tries=1)
        session.commit()
        assert _charge(session, ti_id) and _charge(session, ti_id) and not _charge(session, ti_id)
        _clear(session, ti_id, try_number=4, retries=1, bump_clear_number=False)
        assert _charge(session, ti_id)


def test_the_budget_row_records_the_clear_number(engine):
    from leoflow_airflow.ledger.models import infra_budget_table as budget

    with Session(engine) as session:
        _add_run(session, "r-rec", clear_number=7)
        ti_id = _add_ti(session, "r-rec", max_tries=0)
        session.commit()
        assert _charge(session, ti_id)
        row = session.execute(sa.select(budget.c.spent, budget.c.seen_max_tries, budget.c.clear_number)
                              .where(budget.c.run_id == "r-rec")).one()
        assert tuple(row) == (1, 1, 7)


def test_budget_decision_table():
    """The pure rule: the clear_number decides where the row has one; max_tries only as the fallback."""
    fresh = budget_decision(spent=None, seen_max_tries=None, max_tries=0, limit=2, seen_clear_number=None,
                            clear_number=0)
    assert (fresh.allowed, fresh.spent) == (True, 1)
    # same clear, same max_tries: counts on
    assert budget_decision(spent=1, seen_max_tries=4, max_tries=4, limit=2, seen_clear_number=0,
                           clear_number=0).spent == 2
    assert not budget_decision(spent=2, seen_max_tries=5, max_tries=5, limit=2, seen_clear_number=0,
                               clear_number=0).allowed
    # the 13a collision: max_tries equal, clear_number moved on
    d = budget_decision(spent=2, seen_max_tries=5, max_tries=5, limit=2, seen_clear_number=0, clear_number=1)
    assert (d.allowed, d.spent) == (True, 1)
    # a clear that left the dag run alone: max_tries differs
    d = budget_decision(spent=2, seen_max_tries=5, max_tries=4, limit=2, seen_clear_number=0, clear_number=0)
    assert (d.allowed, d.spent) == (True, 1)
    # a row written before clear_number was stored: max_tries alone, as before
    assert not budget_decision(spent=2, seen_max_tries=5, max_tries=5, limit=2, seen_clear_number=None,
                               clear_number=3).allowed
    assert not budget_decision(spent=None, seen_max_tries=None, max_tries=0, limit=0, seen_clear_number=None,
                               clear_number=0).allowed


# --- load_running_tis: the orphan-run reaper's keyset page of Airflow's RUNNING rows ------------------------------

def test_running_tis_pages_airflows_running_rows_by_id(engine):
    """Only RUNNING task instances, each with its dag run's state and start, ascending id, strictly after the
    cursor, at most ``limit`` per page; paging on with the last ``ti_id`` visits each exactly once. Timestamps
    come back tz-aware UTC (what the pure decision compares with)."""
    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import TaskInstance

    from leoflow_airflow.airflow_db import load_running_tis

    with Session(engine) as session:
        session.execute(sa.delete(TaskInstance.__table__))
        session.execute(sa.insert(DagRun.__table__).values(
            dag_id="d", run_id="r-page", run_type="manual", run_after=T0, state="running", start_date=T0))
        running = [_add_ti(session, "r-page", task_id=f"t{i}", heartbeat=T0 + timedelta(seconds=i)) for i in range(5)]
        _add_ti(session, "r-page", state="success", task_id="done")
        _add_ti(session, "r-page", state="queued", task_id="waiting")
        session.execute(sa.update(TaskInstance.__table__).where(TaskInstance.task_id == "t0").values(
            executor="CeleryExecutor", queued_dttm=T0, start_date=T0))
        session.commit()

        seen, after = [], None
        while True:
            page = load_running_tis(after, 2, session=session)
            assert len(page) <= 2
            seen += page
            if len(page) < 2:
                break
            after = page[-1].ti_id
        assert sorted(running) == [r.ti_id for r in seen]  # each once, in id order
        by_id = {r.ti_id: r for r in seen}
        first = by_id[running[0]]
        assert (first.state, first.run_state, first.executor, first.task_id) == (
            "running", "running", "CeleryExecutor", "t0")
        assert first.run_start_date == T0 and first.start_date == T0 and first.queued_dttm == T0
        assert by_id[running[3]].last_heartbeat_at == T0 + timedelta(seconds=3)
        assert by_id[running[3]].executor is None
        assert by_id[running[3]].last_heartbeat_at.tzinfo is not None
        assert load_running_tis(sorted(running)[-1], 5, session=session) == []
        with pytest.raises(ValueError):
            load_running_tis(None, 0, session=session)


# --- the batch reads of task-instance rows ------------------------------------------------------------------

def test_rows_are_read_by_logical_key_and_by_id_in_one_query_each(engine, monkeypatch):
    """The settle pass's read (``load_ti_rows``: the live row of each logical TI, whatever its id now) and the
    dispatch's (``load_ti_rows_by_id``) return the guard's five columns for the rows that exist and leave out
    the rest (a missing TI, an id that is not a UUID); 250 keys take two statements, one id list one."""
    from airflow import settings

    from leoflow_airflow import airflow_db

    monkeypatch.setattr(settings, "NonScopedSession", lambda: Session(engine))
    with Session(engine) as session:
        _add_run(session, "r-read")
        ids = [_add_ti(session, "r-read", state="success" if i % 2 else "queued", max_tries=i % 3, task_id=f"t{i}")
               for i in range(250)]
        session.commit()
    statements: list[str] = []

    def count(conn, cursor, statement, *args):
        statements.append(statement)

    sa.event.listen(engine, "before_cursor_execute", count)
    try:
        keys = [("d", "r-read", f"t{i}", -1) for i in range(250)] + [("d", "r-read", "missing", -1)]
        rows = airflow_db.load_ti_rows(keys)
        by_id = airflow_db.load_ti_rows_by_id([ids[0], ids[1], "not-a-uuid", str(uuid.uuid4())])
    finally:
        sa.event.remove(engine, "before_cursor_execute", count)
    assert len(rows) == 250 and ("d", "r-read", "missing", -1) not in rows
    row = rows[("d", "r-read", "t1", -1)]
    assert (row.id, row.state, row.try_number, row.max_tries, row.queued_by_job_id) == (ids[1], "success", 1, 1, None)
    assert rows[("d", "r-read", "t0", -1)].state == "queued"
    assert set(by_id) == {ids[0], ids[1]} and by_id[ids[0]] == rows[("d", "r-read", "t0", -1)]
    assert len([s for s in statements if s.lstrip().upper().startswith("SELECT")]) == 3
    assert airflow_db.load_ti_row("d", "r-read", "t7", -1) == rows[("d", "r-read", "t7", -1)]
    assert airflow_db.load_ti_row("d", "r-read", "missing", -1) is None


def test_liveness_names_a_try_a_newer_one_archived_superseded_since_its_archive(engine, monkeypatch):
    """Airflow 3.3 gives a cleared or retried task instance a new id at once (``prepare_db_for_next_try``, run here
    on the real model) and moves the old one to ``task_instance_history``: the reapers and the presence pass read
    the old id as ``superseded`` with the archive time as its last sign of life, so an execution left running
    under it is reaped once that is older than ``agent_lost_threshold`` (the moved-on reaper), never kept for ever.
    An id in neither table stays absent."""
    from airflow import settings
    from airflow.models.taskinstance import TaskInstance

    from leoflow_airflow import airflow_db
    from leoflow_airflow.reap.lost import SUPERSEDED

    monkeypatch.setattr(settings, "NonScopedSession", lambda: Session(engine))
    with Session(engine) as session:
        _add_run(session, "r-archive")
        old = _add_ti(session, "r-archive", heartbeat=T0)
        live = _add_ti(session, "r-archive", heartbeat=T0 + timedelta(seconds=5), task_id="other")
        session.commit()
    with Session(engine) as session:
        ti = session.get(TaskInstance, uuid.UUID(old))
        ti.end_date = T0 + timedelta(seconds=9)
        ti.prepare_db_for_next_try(session)
        session.commit()
        new = str(ti.id)
    nowhere = str(uuid.uuid4())
    found = airflow_db.load_ti_liveness([old, live, new, nowhere, "not-a-uuid"])
    assert found[old] == (SUPERSEDED, T0 + timedelta(seconds=9))
    assert found[live] == ("running", T0 + timedelta(seconds=5)) and found[new][0] == "running"
    assert nowhere not in found and "not-a-uuid" not in found
