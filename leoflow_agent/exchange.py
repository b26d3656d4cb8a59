"""The token exchange's wire contract: ``POST /leoflow/v1/exchange`` (DESIGN §3 "Start"). Standard library only.

A task pod's agent trades its projected ServiceAccount token (audience ``[leoflow] exchange_audience``) for its
attempt's workload with a workload token minted at that moment.

Request: ``POST {exchange_url}/v1/exchange``, body ``{"token": "<the projected token file's content>"}`` (JSON,
at most :data:`MAX_REQUEST_BYTES`). The token travels only in the body: never in the URL (the api-server's access
log records query strings) and never in a pod's spec or environment.

Answers:
  200  ``{"workload": "<ExecuteTask JSON, token included>", "ti_id": str, "try_number": int,
       "attempt_epoch": int}`` (:class:`Grant`); ``Cache-Control: no-store``.
  403  ``{"error_id": "<hex>"}``: refused for good (a foreign, stale, replayed, expired or malformed token; a
       deleted, terminating or replaced pod; a second exchange of one attempt). No detail: the api-server logs
       the reason under that id. The agent stops and leaves its attempt to the reconciler.
  503  ``{"error_id": "<hex>"}`` with ``Retry-After`` (seconds): the exchange could not decide (Kubernetes or
       the database did not answer, the api-server cannot mint, or the pod asked before the scheduler recorded
       its attempt dispatched). The agent tries again (:mod:`leoflow_agent.podmain`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

__all__ = ["EXCHANGE_PATH", "MAX_REQUEST_BYTES", "Grant", "GrantError", "decode_grant", "encode_grant",
           "request_body"]

EXCHANGE_PATH = "/v1/exchange"
"""The route under the plugin's mount point (``/leoflow``): ``POST /leoflow/v1/exchange``."""

MAX_REQUEST_BYTES = 16 * 1024
"""Largest request body the exchange reads, in bytes (a projected token is about 1 KiB); larger is refused."""


class GrantError(ValueError):
    """A 200 answer whose body is not a valid :class:`Grant`."""


@dataclass(frozen=True)
class Grant:
    """A granted exchange: the attempt it is for and its workload.

    ``workload`` is the Airflow ``ExecuteTask`` JSON, with a workload token (``sub=ti_id``,
    ``scope=workload``) minted by the api-server at exchange time; ``ti_id``/``try_number``/``attempt_epoch``
    name the attempt (DESIGN §2), which the agent stamps on its outcome record.
    """

    workload: str
    ti_id: str
    try_number: int
    attempt_epoch: int

    def __repr__(self) -> str:
        """Never print the workload: it carries a credential."""
        return f"Grant(ti_id={self.ti_id!r}, try_number={self.try_number}, attempt_epoch={self.attempt_epoch})"


def request_body(token: str) -> bytes:
    """The JSON request body carrying ``token`` (the projected token file's content, stripped)."""
    return json.dumps({"token": token.strip()}).encode()


def encode_grant(grant: Grant) -> dict[str, Any]:
    """The 200 body of ``grant`` as a JSON-ready dict."""
    return {"workload": grant.workload, "ti_id": grant.ti_id, "try_number": grant.try_number,
            "attempt_epoch": grant.attempt_epoch}


def decode_grant(body: bytes | str) -> Grant:
    """Parse a 200 body. Raises :class:`GrantError` when it is not a JSON object with a string ``workload`` and
    ``ti_id`` and integers >= 1 ``try_number`` and ``attempt_epoch``."""
    try:
        data = json.loads(body)
    except ValueError:
        raise GrantError("exchange answer is not JSON") from None
    if not isinstance(data, dict):
        raise GrantError("exchange answer is not a JSON object")
    workload, ti_id = data.get("workload"), data.get("ti_id")
    try_number, epoch = data.get("try_number"), data.get("attempt_epoch")
    if not isinstance(workload, str) or not workload or not isinstance(ti_id, str) or not ti_id:
        raise GrantError("exchange answer lacks workload or ti_id")
    for n in (try_number, epoch):
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise GrantError("exchange answer lacks try_number or attempt_epoch")
    return Grant(workload=workload, ti_id=ti_id, try_number=try_number, attempt_epoch=epoch)
