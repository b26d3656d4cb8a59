"""The pre-launch attempt guard (DESIGN §3 "Dispatch"; the k8s provider's
``_should_create_pod_for_execute_task`` pattern): launch only if Airflow still wants exactly this attempt.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TIRow:
    """The fields of Airflow's ``task_instance`` row the guard and the reconciler read."""

    id: str
    state: str | None
    try_number: int
    max_tries: int
    queued_by_job_id: int | None


def guard(row: TIRow | None, *, ti_id: str, try_number: int, job_id: int | None) -> str | None:
    """Return ``None`` when the workload may launch, else the reason it is stale.

    The row must exist with the same ``ti_id`` (a new try or a clear gives a new id), be QUEUED, carry the
    same ``try_number`` and, when the executor runs inside a scheduler job, have been queued by that job.
    """
    if row is None or row.id != ti_id:
        return "the task instance row is gone or has a new id"
    if row.state != "queued":
        return f"the task instance is {row.state}, not queued"
    if row.try_number != try_number:
        return f"try_number moved on to {row.try_number}"
    if job_id is not None and row.queued_by_job_id != job_id:
        return f"queued by job {row.queued_by_job_id}, not this scheduler's job {job_id}"
    return None
