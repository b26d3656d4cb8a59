"""The attempt header: how an agent names its execution to the Execution API's fence (DESIGN §2 Invariant 1).

Wire contract (standard library only; the control plane's fence, ``leoflow_airflow.api.fence``, imports it
from here). Every request leoflow sends to Airflow's Execution API on behalf of one attempt carries::

    Leoflow-Attempt: ti_id=<uuid>; try_number=<int >= 1>; attempt_epoch=<int >= 1>

the agent's transport (:class:`leoflow_agent.transport.RecordingTransport`) on each request of the Task SDK
supervisor, and the reconciler's replay of a recorded report (``leoflow_airflow.settle``). The api-server's
fence refuses, with 409 and a body in Airflow's own ``{"detail": {"reason", "message"}}`` shape, a request of
an execution that is no longer the ledger's current epoch of its ``ti_id``, or whose ``ti_id`` is no longer its
task instance's current try; :data:`FENCE_REASONS` are the reasons it gives. The header names an execution, it
proves nothing: the request's execution token, which Airflow validates on the route, is what authorises it. A
forged header can only get its own request refused.
"""

from __future__ import annotations

import re
from typing import Any

from leoflow_agent.outcome import AttemptIdentity

ATTEMPT_HEADER = "Leoflow-Attempt"
"""The header's name (HTTP header names are case-insensitive; ASGI servers hand them over lower-cased)."""

STALE = "leoflow_stale_execution"
"""Fence reason: the header names an attempt of the ``ti_id`` that is not the ledger's current one."""

UNIDENTIFIED = "leoflow_unidentified_execution"
"""Fence reason: the ``ti_id`` has a leoflow attempt but the request names none (no header, a malformed one, or
one naming another ``ti_id`` than the request's token)."""

SUPERSEDED = "leoflow_superseded_try"
"""Fence reason: the request's ``ti_id`` is no longer its task instance's current try. A newer try of the same
task instance (a user's clear, Airflow's retry, leoflow's infra re-drive) gave the task instance a new ``ti_id``,
so this execution belongs to a try that has been superseded, whatever its header says."""

FENCE_REASONS = frozenset({STALE, UNIDENTIFIED, SUPERSEDED})
"""Every ``detail.reason`` the fence answers 409 with."""

MAX_HEADER_CHARS = 200
"""A longer header value is malformed (the longest valid one is about 110 characters)."""

_VALUE = re.compile(
    r"ti_id=(?P<ti_id>[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12})"
    r";[ \t]*try_number=(?P<try_number>[1-9][0-9]{0,8})"
    r";[ \t]*attempt_epoch=(?P<attempt_epoch>[1-9][0-9]{0,8})"
)


def format_attempt(attempt: AttemptIdentity) -> str:
    """The header value naming ``attempt``: ``ti_id=<uuid>; try_number=<n>; attempt_epoch=<e>`` (the ``ti_id``
    lower-cased, as Airflow prints a UUID). Raises ``ValueError`` for an identity :func:`parse_attempt` would
    not read back (a ``ti_id`` that is no UUID, a try or epoch below 1)."""
    value = f"ti_id={attempt.ti_id.lower()}; try_number={int(attempt.try_number)}; attempt_epoch={int(attempt.attempt_epoch)}"
    if parse_attempt(value) is None:
        raise ValueError(f"not a valid attempt identity for the {ATTEMPT_HEADER} header: {attempt!r}")
    return value


def parse_attempt(value: str | None) -> AttemptIdentity | None:
    """The attempt a header value names, or ``None`` when it is absent or malformed (never raises). Surrounding
    whitespace is ignored; the ``ti_id`` comes back lower-cased."""
    if not value or len(value) > MAX_HEADER_CHARS:
        return None
    match = _VALUE.fullmatch(value.strip())
    if match is None:
        return None
    return AttemptIdentity(match["ti_id"].lower(), int(match["try_number"]), int(match["attempt_epoch"]))


def fence_reason(body: Any) -> str | None:
    """The fence's reason when ``body`` (a decoded JSON answer) is a refusal by leoflow's fence, else ``None``:
    ``{"detail": {"reason": <one of FENCE_REASONS>, ...}}``. Never raises."""
    detail = body.get("detail") if isinstance(body, dict) else None
    reason = detail.get("reason") if isinstance(detail, dict) else None
    return reason if reason in FENCE_REASONS else None
