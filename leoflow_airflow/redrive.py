"""Infra re-drive (DESIGN §2, the "no record / TI RUNNING" row): DB-only, so it works while the api-server
is down.

One guarded transaction on Airflow's own session: the TI row must still be that ``ti_id`` and RUNNING
(``SELECT … FOR UPDATE``); then exactly what Airflow's orphan reset does (``prepare_db_for_next_try``, state
None, ``queued_by_job_id``/``external_executor_id`` cleared, next-method args cleared) plus
``max_tries + 1`` (the re-run does not spend a user retry), leoflow's per-logical-TI budget and a Log row.
"""

from __future__ import annotations

import enum
import uuid
from dataclasses import dataclass
from typing import Any


class RedriveResult(enum.StrEnum):
    """What :func:`infra_redrive` did."""

    REDRIVEN = "redriven"          # reset for a new try on the infra budget
    BUDGET_SPENT = "budget_spent"  # nothing changed: the caller hands the TI to Airflow (executor.fail)
    MOVED_ON = "moved_on"          # nothing changed: the row is no longer that ti_id in RUNNING


@dataclass(frozen=True)
class BudgetDecision:
    """``allowed``: may re-drive; ``spent``: the budget's spent count to store if it does."""

    allowed: bool
    spent: int


def budget_decision(
    *, spent: int | None, seen_max_tries: int | None, max_tries: int, limit: int,
    seen_clear_number: int | None = None, clear_number: int | None = None,
) -> BudgetDecision:
    """Pure budget rule (DESIGN §2, the "no record / RUNNING" row; issue 8 hole 16a, review 13a).

    The count starts over when the user cleared the task since leoflow last charged it:

    - the dag run's ``clear_number`` differs from the one stored with the budget row. Airflow's
      ``clear_task_instances`` (``models/taskinstance.py``) adds 1 to it on every clear that resets dag runs
      (the UI's and the REST API's default). This decides whenever both values are known.
    - otherwise (equal clear numbers, or a row stored before clear numbers were) the TI's ``max_tries``
      differs from the value leoflow last saw or wrote. This fallback is needed for clears that leave the dag
      run alone and so keep ``clear_number`` (REST ``clearTaskInstances`` with ``reset_dag_runs=false``,
      ``dag.test()``): such a clear still rewrites ``max_tries = try_number + retries``. It can miss a clear
      that comes out at the same ``max_tries``; only the clear_number catches that.

    A re-drive is allowed while fewer than ``limit`` (``[leoflow] infra_retry_budget``) were spent.
    ``spent``, ``seen_*``: the stored row (``None`` when there is none); ``max_tries``, ``clear_number``: now.
    Returns the decision and the count to store if the caller re-drives.
    """
    cleared = (
        spent is None
        or (seen_clear_number is not None and clear_number is not None and seen_clear_number != clear_number)
        or seen_max_tries != max_tries
    )
    used = 0 if cleared else spent
    if used >= limit:
        return BudgetDecision(False, used)
    return BudgetDecision(True, used + 1)


def charge_budget(session: Any, ti: Any, *, limit: int) -> BudgetDecision:
    """Charge one infra re-run to ``ti``'s logical budget inside ``session``'s transaction (Airflow's own,
    so the charge commits or rolls back with the TI change). Returns the decision; nothing is written when
    ``allowed`` is False. Stored with the count: ``seen_max_tries = ti.max_tries + 1`` (the value the caller
    writes next) and the dag run's ``clear_number`` (:func:`budget_decision`). ``ti``: an ORM
    ``TaskInstance`` of ``session``. Raises ``sqlalchemy.exc.SQLAlchemyError`` on a DB failure."""
    from sqlalchemy import select

    from airflow.models.dagrun import DagRun

    from leoflow_airflow.ledger.models import infra_budget_table as budget
    from leoflow_airflow.ledger.store import _utcnow

    where = (
        (budget.c.dag_id == ti.dag_id) & (budget.c.run_id == ti.run_id)
        & (budget.c.task_id == ti.task_id) & (budget.c.map_index == ti.map_index)
    )
    row = session.execute(select(budget.c.spent, budget.c.seen_max_tries, budget.c.clear_number).where(where)).first()
    clear_number = session.scalar(
        select(DagRun.clear_number).where(DagRun.dag_id == ti.dag_id, DagRun.run_id == ti.run_id))
    decision = budget_decision(
        spent=row.spent if row else None, seen_max_tries=row.seen_max_tries if row else None,
        max_tries=ti.max_tries, limit=limit,
        seen_clear_number=row.clear_number if row else None, clear_number=clear_number,
    )
    if not decision.allowed:
        return decision
    values = {"spent": decision.spent, "seen_max_tries": ti.max_tries + 1, "clear_number": clear_number,
              "updated_at": _utcnow()}
    if row is None:
        session.execute(budget.insert().values(
            dag_id=ti.dag_id, run_id=ti.run_id, task_id=ti.task_id, map_index=ti.map_index, **values))
    else:
        session.execute(budget.update().where(where).values(**values))
    return decision


def infra_redrive(*, ti_id: str, reason: str, limit: int) -> RedriveResult:
    """Reset the RUNNING TI ``ti_id`` for a new try that does not spend a user retry.

    :param reason: a short classification for the Log row (e.g. "the agent died with no outcome record").
    :param limit: ``[leoflow] infra_retry_budget``.
    :raises sqlalchemy.exc.SQLAlchemyError: on a DB failure (nothing committed).
    """
    from sqlalchemy import select

    from airflow.models.log import Log
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session
    from airflow.utils.state import TaskInstanceState

    with create_session(scoped=False) as session:
        ti = session.scalars(
            select(TaskInstance)
            .where(TaskInstance.id == uuid.UUID(ti_id), TaskInstance.state == TaskInstanceState.RUNNING)
            .with_for_update()
        ).one_or_none()
        if ti is None:
            return RedriveResult.MOVED_ON
        decision = charge_budget(session, ti, limit=limit)
        if not decision.allowed:
            return RedriveResult.BUDGET_SPENT
        new_max_tries = ti.max_tries + 1
        session.add(Log(event="leoflow infra re-drive", task_instance=ti,
                        extra=f"{reason}; re-run as a new try without spending a retry "
                              f"(infra budget {decision.spent}/{limit}, max_tries {ti.max_tries} -> {new_max_tries})"))
        ti.prepare_db_for_next_try(session)
        ti.max_tries = new_max_tries
        ti.state = None
        ti.queued_by_job_id = None
        ti.external_executor_id = None
        ti.clear_next_method_args()
        return RedriveResult.REDRIVEN
