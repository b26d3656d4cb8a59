"""The warm pools' targets read from Airflow's database (``warmpods.airflow_versions``), on SQLite with Airflow's own
models: a version keeps a pool while a dag run of it is queued or running (the run's ``created_dag_version_id``, and
the version its task instances are on: an unversioned bundle's re-parsed DAG), and with prewarm while it is its
unpaused, not stale DAG's latest version; each with its bundle, bundle version and DAG file for the pod's env."""

from __future__ import annotations

import contextlib
import uuid
from datetime import datetime, timezone

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from leoflow_airflow.runtime.kubernetes.warmpods import airflow_versions

NOW = datetime.now(timezone.utc)


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    from airflow.models import Base, import_all_models

    import_all_models()
    eng = sa.create_engine(f"sqlite:///{tmp_path_factory.mktemp('afdb') / 'airflow.db'}")
    Base.metadata.create_all(eng)
    yield eng
    eng.dispose()


@pytest.fixture
def db(engine, monkeypatch):
    """Airflow's ``create_session`` on the test engine."""

    @contextlib.contextmanager
    def create_session(scoped: bool = True):
        with Session(engine) as session, session.begin():
            yield session

    monkeypatch.setattr("airflow.utils.session.create_session", create_session)
    return engine


def _dag(s: Session, dag_id: str, *, paused: bool = False, stale: bool = False, fileloc: str = "") -> None:
    from airflow.models.dag import DagModel

    s.execute(sa.insert(DagModel.__table__).values(
        dag_id=dag_id, bundle_name="dags", relative_fileloc=fileloc or f"{dag_id}.py", is_paused=paused,
        is_stale=stale, max_active_tasks=16, max_consecutive_failed_dag_runs=0, has_task_concurrency_limits=False))


def _version(s: Session, dag_id: str, n: int, bundle_version: str | None = None) -> uuid.UUID:
    from airflow.models.dag_version import DagVersion

    vid = uuid.uuid4()
    s.execute(sa.insert(DagVersion.__table__).values(id=vid, dag_id=dag_id, version_number=n, bundle_name="dags",
                                                     bundle_version=bundle_version, created_at=NOW, last_updated=NOW))
    return vid


def _run(s: Session, dag_id: str, state: str, created: uuid.UUID, ti_version: uuid.UUID | None = None) -> None:
    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import TaskInstance

    run_id = f"r-{uuid.uuid4().hex[:8]}"
    s.execute(sa.insert(DagRun.__table__).values(dag_id=dag_id, run_id=run_id, run_type="manual", run_after=NOW,
                                                 state=state, created_dag_version_id=created))
    s.execute(sa.insert(TaskInstance.__table__).values(
        id=uuid.uuid4(), dag_id=dag_id, run_id=run_id, task_id="t", map_index=-1, try_number=1, max_tries=0,
        pool="default_pool", pool_slots=1, state="queued", dag_version_id=ti_version or created))


def test_active_runs_versions_and_with_prewarm_the_current_version_of_unpaused_dags(db):
    with Session(db) as s, s.begin():
        _dag(s, "etl", fileloc="etl/daily.py")
        etl1, etl2 = _version(s, "etl", 1, "v41"), _version(s, "etl", 2, "v42")
        _run(s, "etl", "running", etl1)
        _dag(s, "rep")
        rep1, rep2 = _version(s, "rep", 1), _version(s, "rep", 2)
        _run(s, "rep", "queued", rep1, ti_version=rep2)  # an unversioned bundle: the TI runs the re-parsed one
        _dag(s, "paused", paused=True)
        _version(s, "paused", 1)
        _dag(s, "gone", stale=True)
        _version(s, "gone", 1)
        _dag(s, "done")
        done1 = _version(s, "done", 1)
        _run(s, "done", "success", done1)

    cold = {v.version: v for v in airflow_versions(prewarm=False)}
    assert set(cold) == {str(etl1), str(rep1), str(rep2)}
    assert all(v.active_run for v in cold.values())
    assert (cold[str(etl1)].dag_id, cold[str(etl1)].bundle, cold[str(etl1)].bundle_version,
            cold[str(etl1)].dag_file) == ("etl", "dags", "v41", "etl/daily.py")
    assert cold[str(rep1)].bundle_version == ""  # unversioned

    warm = {v.version: v for v in airflow_versions(prewarm=True)}
    assert set(warm) == {str(etl1), str(etl2), str(rep1), str(rep2), str(done1)}
    assert warm[str(etl2)].current and not warm[str(etl2)].active_run
    assert warm[str(rep2)].current and warm[str(rep2)].active_run
    assert warm[str(done1)].current and not warm[str(done1)].active_run
    assert not warm[str(etl1)].current
