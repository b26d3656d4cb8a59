"""A workload re-offered from the ledger keeps its ``executor_config`` (issue 9): Airflow excludes
``ti.executor_config`` from a workload's JSON, so ``lifecycle.airflow.rebuild_workload`` re-attaches it from
Airflow's own ``task_instance.executor_config`` column (dill-pickled), read here on SQLite with Airflow 3.3.2's
real models; a re-dispatched pod then keeps its ``pod_override``."""

from __future__ import annotations

import uuid
from datetime import datetime, timezone

import pytest
import sqlalchemy as sa
from kubernetes.client import models as k8s
from sqlalchemy.orm import Session

from leoflow_airflow.airflow_db import load_executor_config
from leoflow_airflow.lifecycle.airflow import rebuild_workload

OVERRIDE = k8s.V1Pod(spec=k8s.V1PodSpec(containers=[k8s.V1Container(
    name="base", resources=k8s.V1ResourceRequirements(requests={"cpu": "2", "memory": "3Gi"}))]))


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    from airflow.models import Base, import_all_models

    import_all_models()
    eng = sa.create_engine(f"sqlite:///{tmp_path_factory.mktemp('afdb') / 'airflow.db'}")
    Base.metadata.create_all(eng)
    yield eng
    eng.dispose()


def _ti(session: Session, executor_config) -> uuid.UUID:
    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import TaskInstance

    run_id = f"r-{uuid.uuid4().hex[:8]}"
    session.execute(sa.insert(DagRun.__table__).values(dag_id="d", run_id=run_id, run_type="manual",
                                                       run_after=datetime.now(timezone.utc)))
    ti_id = uuid.uuid4()
    session.execute(sa.insert(TaskInstance.__table__).values(
        id=ti_id, dag_id="d", run_id=run_id, task_id="t", map_index=-1, try_number=1, max_tries=0,
        pool="default_pool", pool_slots=1, state="queued", executor_config=executor_config))
    return ti_id


def _stored_json(ti_id: uuid.UUID, executor_config) -> str:
    """The workload JSON the ledger stores for ``ti_id`` (what ``Lifecycle.dispatch_task`` writes)."""
    from airflow.executors.workloads import BundleInfo, ExecuteTask
    from airflow.executors.workloads.task import TaskInstanceDTO

    ti = TaskInstanceDTO(id=ti_id, task_id="t", dag_id="d", run_id="r", try_number=1, dag_version_id=uuid.uuid4(),
                         map_index=-1, pool_slots=1, priority_weight=1, queue="default",
                         executor_config=executor_config)
    workload = ExecuteTask(token="secret", dag_rel_path="d.py", bundle_info=BundleInfo(name="dags"),
                           log_path="x.log", ti=ti)
    return workload.model_dump_json(exclude={"token"})


def test_the_stored_json_loses_executor_config_and_the_rebuild_restores_it(engine):
    with Session(engine) as session, session.begin():
        ti_id = _ti(session, {"pod_override": OVERRIDE})
        stored = _stored_json(ti_id, {"pod_override": OVERRIDE})
        assert "pod_override" not in stored and "3Gi" not in stored  # what Airflow's exclude does
        workload = rebuild_workload(stored, lambda tid: load_executor_config(tid, session=session))
    assert workload.token == ""
    assert workload.ti.executor_config == {"pod_override": OVERRIDE}


def test_the_rebuilt_workloads_pod_keeps_its_override(engine):
    from leoflow_airflow import settings
    from leoflow_airflow.runtime.kubernetes.pod import PodAttempt, build_pod

    kube = settings.load_kubernetes(lambda s, k, f: {"image": "img:1", "exchange_url": "http://x/leoflow"}.get(k, f))
    with Session(engine) as session, session.begin():
        ti_id = _ti(session, {"pod_override": OVERRIDE})
        workload = rebuild_workload(_stored_json(ti_id, None), lambda tid: load_executor_config(tid, session=session))
    ti = workload.ti
    pod = build_pod(PodAttempt(str(ti.id), ti.try_number, 2, ti.dag_id, ti.task_id, ti.run_id, ti.map_index), kube,
                    executor_config=ti.executor_config)
    assert pod.spec.containers[0].resources.requests == {"cpu": "2", "memory": "3Gi"}


def test_no_config_no_row_or_a_failed_read_leave_the_workload_as_stored(engine):
    with Session(engine) as session, session.begin():
        plain = _ti(session, None)
        assert load_executor_config(str(plain), session=session) is None
        assert load_executor_config(str(uuid.uuid4()), session=session) is None
        assert load_executor_config("not-a-uuid", session=session) is None
        assert rebuild_workload(_stored_json(plain, None),
                                lambda tid: load_executor_config(tid, session=session)).ti.executor_config is None

    def broken(_tid: str):
        raise sa.exc.OperationalError("SELECT", {}, Exception("database is locked"))

    assert rebuild_workload(_stored_json(plain, None), broken).ti.executor_config is None
