"""A plain ``airflow db migrate`` creates leoflow's ledger tables through the provider's DB manager.

Runs the real ``airflow`` CLI of this venv in a throwaway AIRFLOW_HOME (the leoflow distribution must be
installed, e.g. ``pip install -e . --no-deps``, so its provider info is discovered). SQLite always; the
PostgreSQL variant needs ``LEOFLOW_TEST_PG_URL`` (see test_ledger_postgres.py).

The SQLite tests of one revision's upgrade path start from a copy of one database a plain ``airflow db migrate``
brought to head once per module (:func:`migrated_sqlite`) instead of each running that ~4 s migrate first; the
``airflow db migrate`` each of them checks is still a real run of the CLI on its own copy.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from leoflow_airflow.ledger.db_manager import LeoflowDBManager
from leoflow_airflow.ledger.models import metadata

AIRFLOW = str(Path(sys.executable).with_name("airflow"))
HEAD = list(LeoflowDBManager.revision_heads_map.values())[-1]
PG_URL = os.environ.get("LEOFLOW_TEST_PG_URL")

CLAIM_SCRIPT = """
from leoflow_airflow.ledger.store import LedgerStore
a = LedgerStore.from_airflow().claim_epoch(
    ti_id="0199aaaa-0000-7000-8000-000000000001", try_number=1, dag_id="d", task_id="t", run_id="r",
    map_index=-1, runtime="lite", workload_json="{}", scheduler_job_id=None)
print(a.ref.attempt_epoch)
"""


def airflow_env(home: Path, db_url: str) -> dict[str, str]:
    """The caller's environment minus any Airflow settings, pointed at ``home`` and ``db_url``.

    The async URL is blanked: migrations use only the sync engine, and Airflow would otherwise derive a
    ``postgresql+asyncpg`` engine (a driver the api-server needs, ``db migrate`` does not).
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env.update(
        AIRFLOW_HOME=str(home),
        AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=db_url,
        AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC="",
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
    )
    return env


def run(args: list[str], env: dict[str, str]) -> str:
    """Run ``args`` in ``env``, assert it exited 0, and return its stdout and stderr together."""
    proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout + proc.stderr


def ledger_state(db_url: str) -> tuple[set[str], list[str], list[tuple]]:
    """(leoflow tables present, version rows, attempt rows) as a user would inspect them."""
    engine = sa.create_engine(db_url, poolclass=sa.NullPool)
    try:
        with engine.connect() as conn:
            tables = {t for t in sa.inspect(conn).get_table_names() if t.startswith("leoflow_")}
            versions = [r[0] for r in conn.execute(sa.text("SELECT version_num FROM leoflow_alembic_version"))]
            attempts = conn.execute(sa.text("SELECT ti_id, attempt_epoch, state FROM leoflow_attempt")).all()
        return tables, versions, [tuple(r) for r in attempts]
    finally:
        engine.dispose()


def schema_diff(db_url: str) -> list:
    """Differences between the migrated database and the models (empty when they agree)."""
    engine = sa.create_engine(db_url, poolclass=sa.NullPool)
    try:
        with engine.connect() as conn:
            ctx = MigrationContext.configure(
                conn,
                opts={
                    "compare_type": True,
                    "include_object": lambda obj, name, type_, *_: type_ != "table" or name in metadata.tables,
                },
            )
            return compare_metadata(ctx, metadata)
    finally:
        engine.dispose()


def check_migrate_twice(tmp_path: Path, db_url: str, *, first_args: tuple[str, ...] = ()) -> None:
    """``airflow db migrate *first_args`` on the empty database ``db_url`` leaves the ledger at head matching the
    models, the store can claim an attempt in it, and a second plain ``airflow db migrate`` changes nothing."""
    env = airflow_env(tmp_path, db_url)
    run([AIRFLOW, "db", "migrate", *first_args], env)
    assert ledger_state(db_url) == (
        {"leoflow_attempt", "leoflow_infra_budget", "leoflow_warm_worker", "leoflow_alembic_version"},
        [HEAD],
        [],
    )
    assert schema_diff(db_url) == []

    # the store finds the tables through Airflow's own configuration
    assert run([sys.executable, "-c", CLAIM_SCRIPT], env).strip().splitlines()[-1] == "1"

    out = run([AIRFLOW, "db", "migrate"], env)
    assert "Creating LeoflowDBManager tables" not in out and "Running upgrade" not in out
    tables, versions, attempts = ledger_state(db_url)
    assert versions == [HEAD]
    assert attempts == [("0199aaaa-0000-7000-8000-000000000001", 1, "claimed")]  # nothing lost


@pytest.mark.airflow
def test_db_migrate_creates_ledger_on_sqlite_and_rerun_is_a_noop(tmp_path):
    """A fresh database: the tables come from the models, stamped at head (the path most users take)."""
    check_migrate_twice(tmp_path, f"sqlite:///{tmp_path / 'airflow.db'}")


@pytest.mark.airflow
@pytest.mark.postgres
@pytest.mark.skipif(not PG_URL, reason="LEOFLOW_TEST_PG_URL is unset: run `scripts/pg start --dir DIR`")
def test_db_migrate_with_migration_files_on_postgres_then_rerun_is_a_noop(tmp_path):
    """The migration files (not the models) build the tables here, and must match the models exactly."""
    server = sa.make_url(PG_URL)
    name = f"leoflow_migrate_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(server.set(database="postgres"), isolation_level="AUTOCOMMIT", poolclass=sa.NullPool)
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    try:
        db_url = server.set(database=name).render_as_string(hide_password=False)
        check_migrate_twice(tmp_path, db_url, first_args=("--use-migration-files",))
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture(scope="module")
def migrated_sqlite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite database file a plain ``airflow db migrate`` (the real CLI, default arguments) brought to head,
    made once per module; a test copies it into its own directory rather than run that first migrate itself (the
    test of that migrate, :func:`test_db_migrate_creates_ledger_on_sqlite_and_rerun_is_a_noop`, runs its own)."""
    home = tmp_path_factory.mktemp("migrated-sqlite")
    db_url = f"sqlite:///{home / 'airflow.db'}"
    run([AIRFLOW, "db", "migrate"], airflow_env(home, db_url))
    assert ledger_state(db_url)[1:] == ([HEAD], [])
    assert sorted(p.name for p in home.glob("airflow.db*")) == ["airflow.db"]  # no journal left beside it
    return home / "airflow.db"


DOWNGRADE_SCRIPT = """
import sys
from airflow.utils.session import create_session
from leoflow_airflow.ledger.db_manager import LeoflowDBManager
with create_session() as session:
    LeoflowDBManager(session).downgrade(sys.argv[1])
"""


def column_migration_round_trip(tmp_path: Path, template: Path, *, before: str, table: str, columns: set[str],
                                insert: str, upgraded: tuple[str, list[tuple]],
                                downgraded: tuple[str, list[tuple]]) -> str:
    """One revision that adds ``columns`` to ``table``, up and down on SQLite with a row kept throughout.

    A copy of ``template`` (a fresh ledger a plain ``airflow db migrate`` brought to head: :func:`migrated_sqlite`)
    is downgraded to revision ``before`` (``columns`` absent, the ledger at ``before``); ``insert`` adds a row as a
    ledger of that revision holds it; a plain ``airflow db migrate`` brings it to the models' schema at head, where
    the query ``upgraded[0]`` gives the rows ``upgraded[1]``; downgrading to ``before`` again drops ``columns``, and
    ``downgraded[0]`` gives ``downgraded[1]``. Returns the output of that ``airflow db migrate``."""
    shutil.copyfile(template, tmp_path / "airflow.db")
    db_url = f"sqlite:///{tmp_path / 'airflow.db'}"
    env = airflow_env(tmp_path, db_url)
    run([sys.executable, "-c", DOWNGRADE_SCRIPT, before], env)
    engine = sa.create_engine(db_url, poolclass=sa.NullPool)

    def version() -> list[str]:
        with engine.connect() as conn:
            return [r[0] for r in conn.execute(sa.text("SELECT version_num FROM leoflow_alembic_version"))]

    def present() -> set[str]:
        with engine.connect() as conn:
            return columns & {c["name"] for c in sa.inspect(conn).get_columns(table)}

    def rows(query: str) -> list[tuple]:
        with engine.connect() as conn:
            return [tuple(r) for r in conn.execute(sa.text(query)).all()]

    try:
        assert present() == set() and version() == [before]
        with engine.begin() as conn:
            conn.execute(sa.text(insert))
        out = run([AIRFLOW, "db", "migrate"], env)
        assert schema_diff(db_url) == [] and version() == [HEAD]
        assert rows(upgraded[0]) == upgraded[1]
        run([sys.executable, "-c", DOWNGRADE_SCRIPT, before], env)
        assert present() == set() and version() == [before]
        assert rows(downgraded[0]) == downgraded[1]
        return out
    finally:
        engine.dispose()


@pytest.mark.airflow
def test_budget_clear_number_migration_up_and_down_on_sqlite(tmp_path, migrated_sqlite):
    """Revision 0002 (issue 8 hole 16a): a ledger at 0.1.0 holding a budget row is upgraded by a plain
    ``airflow db migrate`` to the models' schema with the row kept (``clear_number`` NULL, so the old rule
    judges it); downgrading drops the column and keeps the row."""
    out = column_migration_round_trip(
        tmp_path, migrated_sqlite, before=LeoflowDBManager.revision_heads_map["0.1.0"],
        table="leoflow_infra_budget", columns={"clear_number"},
        insert="INSERT INTO leoflow_infra_budget (dag_id, run_id, task_id, map_index, spent, seen_max_tries, "
               "updated_at) VALUES ('d', 'r', 't', -1, 2, 5, '2026-12-01 00:00:00')",
        upgraded=("SELECT spent, seen_max_tries, clear_number FROM leoflow_infra_budget", [(2, 5, None)]),
        downgraded=("SELECT spent, seen_max_tries FROM leoflow_infra_budget", [(2, 5)]))
    assert "8c3d2e4f6a71" in out or "Running upgrade" in out, out[-2000:]


@pytest.mark.airflow
def test_attempt_host_migration_up_and_down_on_sqlite(tmp_path, migrated_sqlite):
    """Revision 0003 (issue 8 hole 14): a ledger at 0.2.0's first head holding an open attempt is upgraded by a
    plain ``airflow db migrate`` to the models' schema with the row kept and ``host`` NULL (judged as this
    host's); downgrading drops the column and keeps the row."""
    column_migration_round_trip(
        tmp_path, migrated_sqlite, before="8c3d2e4f6a71", table="leoflow_attempt", columns={"host"},
        insert="INSERT INTO leoflow_attempt (ti_id, try_number, attempt_epoch, dag_id, task_id, run_id, map_index, "
               "state, runtime, workload_json, pid, created_at, updated_at) VALUES ('t1', 1, 1, 'd', 't', 'r', -1, "
               "'dispatched', 'lite', '{}', 42, '2026-12-01 00:00:00', '2026-12-01 00:00:00')",
        upgraded=("SELECT ti_id, state, pid, host FROM leoflow_attempt", [("t1", "dispatched", 42, None)]),
        downgraded=("SELECT ti_id, state, pid FROM leoflow_attempt", [("t1", "dispatched", 42)]))


@pytest.mark.airflow
def test_attempt_exchange_migration_up_and_down_on_sqlite(tmp_path, migrated_sqlite):
    """Revision 0004 (issue 9 item 3): a ledger at revision 0003 holding a dispatched attempt is upgraded by a
    plain ``airflow db migrate`` to the models' schema with the row kept and not exchanged (``exchanged_at``
    and ``exchange_credential_id`` NULL); downgrading drops both columns and keeps the row."""
    column_migration_round_trip(
        tmp_path, migrated_sqlite, before="3b7e9d1c4f20", table="leoflow_attempt",
        columns={"exchanged_at", "exchange_credential_id"},
        insert="INSERT INTO leoflow_attempt (ti_id, try_number, attempt_epoch, dag_id, task_id, run_id, map_index, "
               "state, runtime, workload_json, pod_name, created_at, updated_at) VALUES ('t1', 1, 1, 'd', 't', 'r', "
               "-1, 'dispatched', 'kubernetes', '{}', 'p', '2026-12-01 00:00:00', '2026-12-01 00:00:00')",
        upgraded=("SELECT ti_id, state, pod_name, exchanged_at, exchange_credential_id FROM leoflow_attempt",
                  [("t1", "dispatched", "p", None, None)]),
        downgraded=("SELECT ti_id, state, pod_name FROM leoflow_attempt", [("t1", "dispatched", "p")]))


@pytest.mark.airflow
def test_attempt_state_id_index_migration_up_and_down_on_sqlite(tmp_path, migrated_sqlite):
    """Revision 0005 (issue 10 item 1): a ledger at revision 0004 (an index on ``state`` alone) holding a
    dispatched attempt is upgraded by a plain ``airflow db migrate`` to the models' schema: the ``(state, id)``
    index the keyset pages read replaces it, and the row is kept; downgrading puts the ``state`` index back."""
    shutil.copyfile(migrated_sqlite, tmp_path / "airflow.db")
    db_url = f"sqlite:///{tmp_path / 'airflow.db'}"
    env = airflow_env(tmp_path, db_url)
    run([sys.executable, "-c", DOWNGRADE_SCRIPT, "6d1f0a8e2c93"], env)
    engine = sa.create_engine(db_url, poolclass=sa.NullPool)

    def indexes() -> dict[str, list[str]]:
        with engine.connect() as conn:
            return {ix["name"]: ix["column_names"] for ix in sa.inspect(conn).get_indexes("leoflow_attempt")
                    if "state" in ix["column_names"]}

    def rows() -> list[tuple]:
        with engine.connect() as conn:
            return [tuple(r) for r in conn.execute(sa.text("SELECT ti_id, state FROM leoflow_attempt")).all()]

    try:
        assert indexes() == {"ix_leoflow_attempt_state": ["state"]}
        with engine.begin() as conn:
            conn.execute(sa.text(
                "INSERT INTO leoflow_attempt (ti_id, try_number, attempt_epoch, dag_id, task_id, run_id, map_index, "
                "state, runtime, workload_json, created_at, updated_at) VALUES ('t1', 1, 1, 'd', 't', 'r', -1, "
                "'dispatched', 'lite', '{}', '2026-12-01 00:00:00', '2026-12-01 00:00:00')"))
        out = run([AIRFLOW, "db", "migrate"], env)
        assert "9a4c7e2b5d18" in out or "Running upgrade" in out, out[-2000:]
        assert schema_diff(db_url) == []
        assert indexes() == {"ix_leoflow_attempt_state_id": ["state", "id"]}
        assert rows() == [("t1", "dispatched")]
        run([sys.executable, "-c", DOWNGRADE_SCRIPT, "6d1f0a8e2c93"], env)
        assert indexes() == {"ix_leoflow_attempt_state": ["state"]}
        assert rows() == [("t1", "dispatched")]
    finally:
        engine.dispose()


@pytest.mark.airflow
def test_attempt_row_version_migration_up_and_down_on_sqlite(tmp_path, migrated_sqlite):
    """Revision 0006 (issue 10, "Benchmark"): a ledger at revision 0005 holding a dispatched attempt is upgraded
    by a plain ``airflow db migrate`` to the models' schema with the row kept at ``row_version`` 0 (a page reads
    it whole once, then only when a guarded write moves the version); downgrading drops the column and keeps the
    row."""
    out = column_migration_round_trip(
        tmp_path, migrated_sqlite, before="9a4c7e2b5d18", table="leoflow_attempt", columns={"row_version"},
        insert="INSERT INTO leoflow_attempt (ti_id, try_number, attempt_epoch, dag_id, task_id, run_id, map_index, "
               "state, runtime, workload_json, pod_name, created_at, updated_at) VALUES ('t1', 1, 1, 'd', 't', 'r', "
               "-1, 'dispatched', 'kubernetes', '{}', 'p', '2026-12-01 00:00:00', '2026-12-01 00:00:00')",
        upgraded=("SELECT ti_id, state, pod_name, row_version FROM leoflow_attempt", [("t1", "dispatched", "p", 0)]),
        downgraded=("SELECT ti_id, state, pod_name FROM leoflow_attempt", [("t1", "dispatched", "p")]))
    assert "4f2b8d6e1a37" in out or "Running upgrade" in out, out[-2000:]


@pytest.mark.airflow
def test_warm_worker_migration_up_and_down_on_sqlite(tmp_path, migrated_sqlite):
    """Revision 0007 (issue 11, warm pods): a ledger at revision 0006 holding a dispatched attempt is upgraded by
    a plain ``airflow db migrate`` to the models' schema: the ``leoflow_warm_worker`` table exists (empty) and the
    attempt is kept with no in-band outcome record (``outcome_json`` NULL); downgrading drops the column and the
    table and keeps the row."""
    out = column_migration_round_trip(
        tmp_path, migrated_sqlite, before="4f2b8d6e1a37", table="leoflow_attempt", columns={"outcome_json"},
        insert="INSERT INTO leoflow_attempt (ti_id, try_number, attempt_epoch, dag_id, task_id, run_id, map_index, "
               "state, runtime, workload_json, pod_name, created_at, updated_at) VALUES ('t1', 1, 1, 'd', 't', 'r', "
               "-1, 'dispatched', 'kubernetes', '{}', 'p', '2026-12-01 00:00:00', '2026-12-01 00:00:00')",
        upgraded=("SELECT ti_id, state, outcome_json, (SELECT count(*) FROM leoflow_warm_worker) FROM leoflow_attempt",
                  [("t1", "dispatched", None, 0)]),
        downgraded=("SELECT ti_id, state, pod_name FROM leoflow_attempt", [("t1", "dispatched", "p")]))
    assert "7c1e5a9d3b42" in out or "Running upgrade" in out, out[-2000:]
    tables, versions, _ = ledger_state(f"sqlite:///{tmp_path / 'airflow.db'}")
    assert "leoflow_warm_worker" not in tables and versions == ["4f2b8d6e1a37"]
