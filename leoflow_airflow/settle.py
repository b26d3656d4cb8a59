"""Settle calls to Airflow's Execution API (DESIGN §2 "Settle mechanics").

The reconciler replays a recorded terminal ``PATCH /task-instances/{id}/state`` body with the
``airflow-api-version`` header it was first sent with, authenticated by an execution token minted for that
``ti_id`` (``sub=ti_id``, ``scope=execution``), with a short timeout and never inside a DB transaction.
200/204 = settled (200: it already was), 409 = someone settled first, 404 = the id is archived.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx

from leoflow_agent.outcome import OutcomeRecord


@dataclass(frozen=True)
class SettleResult:
    """``settled``: nothing more to do for this attempt; ``applied``: our call changed Airflow's row."""

    settled: bool
    applied: bool
    detail: str


def classify(status: int) -> SettleResult:
    """Map an Execution API status code to a :class:`SettleResult` (pure)."""
    if status == 204:
        return SettleResult(True, True, "204: the recorded state was applied")
    if status == 200:
        return SettleResult(True, False, "200: Airflow already had that state")
    if status == 409:
        return SettleResult(True, False, "409: someone settled the task instance first")
    if status in (404, 410):
        return SettleResult(True, False, f"{status}: the attempt's ti_id is archived")
    return SettleResult(False, False, f"HTTP {status}")


def replay_state(record: OutcomeRecord, *, jwt_generator: Any, server: str, timeout: float) -> SettleResult:
    """PATCH the recorded ``/state`` body for ``record.ti_id``.

    :param jwt_generator: Airflow's ``JWTGenerator`` (``BaseExecutor.jwt_generator``).
    :param server: the Execution API base URL (``.../execution/``).
    :param timeout: seconds for the whole call.
    :returns: a :class:`SettleResult`; transport errors give ``settled=False`` (retried next ``sync()``).
    """
    if record.ti_id is None or record.payload is None:
        return SettleResult(False, False, "the record carries no replayable payload")
    token = jwt_generator.generate(extras={"sub": record.ti_id, "scope": "execution"})
    headers = {"authorization": f"Bearer {token}", "content-type": "application/json"}
    if record.api_version:
        headers["airflow-api-version"] = record.api_version
    url = server.rstrip("/") + f"/task-instances/{record.ti_id}/state"
    try:
        response = httpx.patch(url, json=record.payload, headers=headers, timeout=timeout)
    except httpx.HTTPError as exc:
        return SettleResult(False, False, f"transport error: {type(exc).__name__}")
    return classify(response.status_code)
