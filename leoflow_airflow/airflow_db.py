"""Reads of Airflow's own metadata rows that the executor needs, on a fresh non-scoped session.

A non-scoped session never shares the scheduler thread's scoped session, so committing or closing it can
never end a transaction the scheduler loop has open.
"""

from __future__ import annotations

from leoflow_airflow.dispatch.guard import TIRow


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
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    import uuid

    try:
        key = uuid.UUID(str(ti_id))
    except ValueError:
        return None
    with create_session(scoped=False) as session:
        return _row(session.get(TaskInstance, key))


def load_ti_row(dag_id: str, run_id: str, task_id: str, map_index: int) -> TIRow | None:
    """Return the live ``task_instance`` row of one logical TI (its current id may differ), or ``None``."""
    from sqlalchemy import select

    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    with create_session(scoped=False) as session:
        ti = session.scalars(
            select(TaskInstance).where(
                TaskInstance.dag_id == dag_id,
                TaskInstance.run_id == run_id,
                TaskInstance.task_id == task_id,
                TaskInstance.map_index == map_index,
            )
        ).one_or_none()
        return _row(ti)


def load_ti_liveness(ti_ids: list[str]) -> dict[str, tuple[str | None, object]]:
    """Return ``{ti_id: (state, last_heartbeat_at)}`` for the live rows among ``ti_ids`` (one query)."""
    import uuid

    from sqlalchemy import select

    from airflow.models.taskinstance import TaskInstance
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
    return {str(r.id): (None if r.state is None else str(r.state), r.last_heartbeat_at) for r in rows}
