"""What the reconciler does about task callbacks a dead agent could not run (DESIGN §2 "Callbacks").

For success and up_for_retry the supervisor PATCHes *before* the task child runs its callbacks; when the
agent dies the child cannot finish them. So, after a replay:

* up_for_retry with ``callbacks_pending``: a ``TaskCallbackRequest(UP_FOR_RETRY)`` through
  ``executor.send_callback`` (the DAG processor runs on_retry_callback);
* success: nothing can run on_success_callback later (the DAG processor runs only failure/retry
  callbacks), so a Log row on the TI says it was lost.
"""

from __future__ import annotations

from typing import Any


def _live_ti(session: Any, dag_id: str, run_id: str, task_id: str, map_index: int) -> Any:
    from sqlalchemy import select

    from airflow.models.taskinstance import TaskInstance

    return session.scalars(
        select(TaskInstance).where(
            TaskInstance.dag_id == dag_id, TaskInstance.run_id == run_id,
            TaskInstance.task_id == task_id, TaskInstance.map_index == map_index,
        )
    ).one_or_none()


def retry_callback_request(*, dag_id: str, run_id: str, task_id: str, map_index: int, msg: str) -> Any | None:
    """Build a ``TaskCallbackRequest(UP_FOR_RETRY)`` for the live TI (the next try's row), or ``None`` when
    the TI is gone. Mirrors how Airflow's scheduler builds the same request in its heartbeat purge."""
    from airflow.api_fastapi.execution_api.datamodels.taskinstance import DagRun as DRDataModel, TIRunContext
    from airflow.callbacks.callback_requests import TaskCallbackRequest
    from airflow.utils.session import create_session
    from airflow.utils.state import TaskInstanceState

    with create_session(scoped=False) as session:
        ti = _live_ti(session, dag_id, run_id, task_id, map_index)
        if ti is None:
            return None
        bundle_name = ti.dag_version.bundle_name if ti.dag_version else ti.dag_model.bundle_name
        bundle_version = (
            ti.dag_version.bundle_version
            if ti.dag_version and ti.dag_run.bundle_version is not None
            else ti.dag_run.bundle_version
        )
        return TaskCallbackRequest(
            filepath=ti.dag_model.relative_fileloc or "",
            bundle_name=bundle_name,
            bundle_version=bundle_version,
            ti=ti,
            msg=msg,
            task_callback_type=TaskInstanceState.UP_FOR_RETRY,
            context_from_server=TIRunContext(
                dag_run=DRDataModel.model_validate(ti.dag_run, from_attributes=True),
                max_tries=ti.max_tries,
                variables=[],
                connections=[],
                xcom_keys_to_clear=[],
            ),
        )


def log_lost_success_callback(*, dag_id: str, run_id: str, task_id: str, map_index: int, ti_id: str) -> bool:
    """Write a Log row on the TI saying its on_success_callback was lost; True when the TI was found."""
    from airflow.models.log import Log
    from airflow.utils.session import create_session

    with create_session(scoped=False) as session:
        ti = _live_ti(session, dag_id, run_id, task_id, map_index)
        if ti is None:
            return False
        session.add(Log(
            event="leoflow lost on_success_callback",
            task_instance=ti,
            extra=f"attempt {ti_id}: the success report was recovered from its outcome record after the agent "
                  "died; the task's on_success_callback (if it has one) could not run and cannot be run later",
        ))
        return True
