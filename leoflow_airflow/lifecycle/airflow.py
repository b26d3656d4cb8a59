"""What the lifecycle reads from and writes to Airflow, behind one small seam (:class:`AirflowPort`).

:class:`AirflowIO` is the real thing (Airflow's metadata DB on non-scoped sessions, the Execution API for
replays); unit tests pass a fake holding task-instance rows in a dict. Every method is synchronous I/O bounded
by its own timeout; none runs inside a ledger transaction.
"""

from __future__ import annotations

import json
import logging
from typing import Any, Protocol

from leoflow_agent.outcome import OutcomeRecord
from leoflow_airflow.dispatch.guard import TIRow

log = logging.getLogger(__name__)



API_PROBE_SECONDS = 5.0
"""Seconds a health probe of the Execution API is reused before the next one."""

class AirflowPort(Protocol):
    """The Airflow calls the lifecycle makes (DESIGN §2 "Settle mechanics", §3)."""

    def ti_row_by_id(self, ti_id: str) -> TIRow | None:
        """The ``task_instance`` row whose id is ``ti_id``, or None."""

    def ti_rows_by_id(self, ti_ids: list[str]) -> dict[str, TIRow]:
        """``{ti_id: row}`` for the ``task_instance`` rows among ``ti_ids`` that exist (one query)."""

    def ti_row(self, dag_id: str, run_id: str, task_id: str, map_index: int) -> TIRow | None:
        """The live row of one logical TI (its id may differ from the attempt's), or None."""

    def ti_rows(self, keys: list[tuple[str, str, str, int]]) -> dict[tuple[str, str, str, int], TIRow]:
        """``{(dag_id, run_id, task_id, map_index): row}`` for the logical TIs among ``keys`` that have a live
        row (one query)."""

    def ti_liveness(self, ti_ids: list[str]) -> dict[str, tuple[str | None, Any]]:
        """``{ti_id: (state, last_heartbeat_at)}`` for the live rows among ``ti_ids`` (one query)."""

    def running_tis(self, after: str | None, limit: int) -> list[Any]:
        """One keyset page of Airflow's RUNNING task instances after ``ti_id`` ``after`` (None: from the start),
        ascending id, at most ``limit``: ``reap.orphan.RunningTI`` rows (one query)."""

    def jobs_alive(self, job_ids: set[int]) -> set[int]:
        """The ids among ``job_ids`` whose Airflow ``Job`` row is alive (``Job.is_alive``: state running and a
        heartbeat within the job type's health-check threshold); a missing row is not alive (one query)."""

    def replay(self, record: OutcomeRecord) -> Any:
        """PATCH the recorded terminal body; a ``settle.SettleResult`` (``settled``, ``applied``, ``detail``)."""

    def infra_redrive(self, ti_id: str, reason: str) -> Any:
        """Reset a RUNNING TI as a new try on the infra budget; a ``redrive.RedriveResult``."""

    def lost_success_callback(self, *, ti_id: str, dag_id: str, run_id: str, task_id: str, map_index: int) -> None:
        """Write the Log row saying a replayed success's on_success_callback was lost."""

    def retry_callback(self, *, dag_id: str, run_id: str, task_id: str, map_index: int, msg: str) -> Any | None:
        """The retry callback request for a replayed ``up_for_retry``, or None."""

    def api_reachable(self) -> bool:
        """Whether the Execution API answers now (a re-dispatch waits while it does not)."""

    def hold_off_purge(self, ti_id: str) -> bool:
        """Refresh a RUNNING TI's ``last_heartbeat_at`` (guarded) while its recorded report cannot be replayed
        yet, so Airflow's heartbeat purge does not fail it meanwhile; True if a row changed."""

    def workload_from_json(self, workload_json: str) -> Any:
        """Rebuild the ``ExecuteTask`` a ledger row stores (token stripped: one is minted at launch)."""

    def task_key(self, dag_id: str, task_id: str, run_id: str, try_number: int, map_index: int) -> Any:
        """Airflow's ``TaskInstanceKey``."""


class AirflowIO:
    """:class:`AirflowPort` on a real Airflow.

    :param jwt_generator: ``BaseExecutor.jwt_generator`` (mints the replay's execution token).
    :param server: ``server() -> str``, the Execution API URL.
    :param settle_timeout: seconds for one replay call (``[leoflow] settle_timeout``).
    :param infra_retry_budget: ``[leoflow] infra_retry_budget``.
    """

    def __init__(self, *, jwt_generator: Any, server: Any, settle_timeout: float, infra_retry_budget: int) -> None:
        self._jwt, self._server = jwt_generator, server
        self._timeout, self._budget = settle_timeout, infra_retry_budget
        self._probed: tuple[float, bool] | None = None  # (monotonic seconds, answer) of the last health probe

    def ti_row_by_id(self, ti_id: str) -> TIRow | None:
        """See :class:`AirflowPort`."""
        from leoflow_airflow.airflow_db import load_ti_row_by_id

        return load_ti_row_by_id(ti_id)

    def ti_rows_by_id(self, ti_ids: list[str]) -> dict[str, TIRow]:
        """See :class:`AirflowPort`."""
        from leoflow_airflow.airflow_db import load_ti_rows_by_id

        return load_ti_rows_by_id(ti_ids)

    def ti_row(self, dag_id: str, run_id: str, task_id: str, map_index: int) -> TIRow | None:
        """See :class:`AirflowPort`."""
        from leoflow_airflow.airflow_db import load_ti_row

        return load_ti_row(dag_id, run_id, task_id, map_index)

    def ti_rows(self, keys: list[tuple[str, str, str, int]]) -> dict[tuple[str, str, str, int], TIRow]:
        """See :class:`AirflowPort`: :func:`leoflow_airflow.airflow_db.load_ti_rows`."""
        from leoflow_airflow.airflow_db import load_ti_rows

        return load_ti_rows(keys)

    def ti_liveness(self, ti_ids: list[str]) -> dict[str, tuple[str | None, Any]]:
        """See :class:`AirflowPort`."""
        from leoflow_airflow.airflow_db import load_ti_liveness

        return load_ti_liveness(ti_ids)

    def running_tis(self, after: str | None, limit: int) -> list[Any]:
        """See :class:`AirflowPort`: :func:`leoflow_airflow.airflow_db.load_running_tis`."""
        from leoflow_airflow.airflow_db import load_running_tis

        return list(load_running_tis(after, limit))

    def jobs_alive(self, job_ids: set[int]) -> set[int]:
        """See :class:`AirflowPort`."""
        from sqlalchemy import select

        from airflow.jobs.job import Job
        from airflow.utils.session import create_session

        if not job_ids:
            return set()
        with create_session(scoped=False) as session:
            return {job.id for job in session.scalars(select(Job).where(Job.id.in_(sorted(job_ids)))) if job.is_alive()}

    def replay(self, record: OutcomeRecord) -> Any:
        """See :class:`AirflowPort`."""
        from leoflow_airflow.settle import replay_state

        return replay_state(record, jwt_generator=self._jwt, server=self._server(), timeout=self._timeout)

    def infra_redrive(self, ti_id: str, reason: str) -> Any:
        """See :class:`AirflowPort`."""
        from leoflow_airflow.redrive import infra_redrive

        return infra_redrive(ti_id=ti_id, reason=reason, limit=self._budget)

    def lost_success_callback(self, *, ti_id: str, dag_id: str, run_id: str, task_id: str, map_index: int) -> None:
        """See :class:`AirflowPort`."""
        from leoflow_airflow.callbacks import log_lost_success_callback

        log_lost_success_callback(ti_id=ti_id, dag_id=dag_id, run_id=run_id, task_id=task_id, map_index=map_index)

    def retry_callback(self, *, dag_id: str, run_id: str, task_id: str, map_index: int, msg: str) -> Any | None:
        """See :class:`AirflowPort`."""
        from leoflow_airflow.callbacks import retry_callback_request

        return retry_callback_request(dag_id=dag_id, run_id=run_id, task_id=task_id, map_index=map_index, msg=msg)

    def api_reachable(self) -> bool:
        """See :class:`AirflowPort`: :func:`leoflow_airflow.settle.api_reachable`, at most one probe per
        ``API_PROBE_SECONDS`` (its answer is reused in between, so a scheduler loop never waits on it twice)."""
        import time

        from leoflow_airflow.settle import api_reachable

        now = time.monotonic()
        if self._probed is None or now - self._probed[0] >= API_PROBE_SECONDS:
            self._probed = (now, api_reachable(server=self._server(), timeout=min(self._timeout, 2.0)))
        return self._probed[1]

    def hold_off_purge(self, ti_id: str) -> bool:
        """See :class:`AirflowPort`: :func:`leoflow_airflow.airflow_db.hold_off_purge`."""
        from leoflow_airflow import airflow_db

        return airflow_db.hold_off_purge(ti_id)

    def workload_from_json(self, workload_json: str) -> Any:
        """See :class:`AirflowPort`: :func:`rebuild_workload` with the task instance's ``executor_config`` read
        from Airflow's ``task_instance`` row (:func:`leoflow_airflow.airflow_db.load_executor_config`)."""
        from leoflow_airflow.airflow_db import load_executor_config

        return rebuild_workload(workload_json, load_executor_config)

    def task_key(self, dag_id: str, task_id: str, run_id: str, try_number: int, map_index: int) -> Any:
        """See :class:`AirflowPort`."""
        from airflow.models.taskinstancekey import TaskInstanceKey

        return TaskInstanceKey(dag_id, task_id, run_id, try_number, map_index)


def rebuild_workload(workload_json: str, executor_config: Any) -> Any:
    """The ``ExecuteTask`` a ledger row stores, token stripped (one is minted at launch), with
    ``ti.executor_config`` re-attached: Airflow excludes it from the workload's JSON, and the Kubernetes runtime
    builds the pod's ``pod_override`` from it, so a re-offered workload must carry it as the first offer did.

    :param executor_config: ``executor_config(ti_id) -> dict | None``, Airflow's stored value; a read that
        raises is logged and the workload goes without it (a re-offer must not break the scheduler loop).
    """
    from airflow.executors.workloads import ExecuteTask

    workload = ExecuteTask.model_validate({**json.loads(workload_json), "token": ""})
    try:
        config = executor_config(str(workload.ti.id))
    except Exception:  # noqa: BLE001 - a DB hiccup: the re-offer goes on without it (logged)
        log.exception("could not read the executor_config of task instance %s; re-offered without it",
                      workload.ti.id)
        return workload
    if config:
        workload = workload.model_copy(update={"ti": workload.ti.model_copy(update={"executor_config": config})})
    return workload
