"""The Execution API fence's decision, pure (DESIGN §2 Invariant 1, "Fencing at the Execution API").

A request to Airflow's Execution API (``/execution/...``) is judged from three things the middleware
(:mod:`leoflow_airflow.api.execution_fence`) gathers: the ``ti_id`` its bearer token names (``sub``, read
without verifying the signature: :func:`token_subject`), the attempt its ``Leoflow-Attempt`` header names
(:mod:`leoflow_agent.fencing`), the ledger's current attempt of that ``ti_id`` (its highest epoch), and whether
that ``ti_id`` is a superseded try (a clear, a retry or an infra re-drive gives the next try a new id and moves the
old one to the history table; once that newer try is past ``up_for_retry``/``restarting``, the old execution has
nothing left to do: :func:`leoflow_airflow.api.execution_fence.superseded_try`). It
passes when the token names no ``ti_id``, when the ``ti_id`` has no leoflow attempt (another executor's task,
a callback or a connection test: their tokens' ``sub`` is no ledger ``ti_id``), or when the ``ti_id`` is its
task instance's current try and the header names exactly the current attempt; otherwise it is refused with 409
and a leoflow reason, on every route and method: Airflow itself refuses a superseded try's heartbeat (410) and
state (404), but not its XCom, Variable or asset-event writes (k8s review; DESIGN §2 Invariant 1). The fence only ever
refuses: what passes is then authenticated and authorised by Airflow's own ``JWTBearer`` on the route.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from dataclasses import dataclass
from typing import Any, NamedTuple

from leoflow_agent.fencing import ATTEMPT_HEADER, STALE, SUPERSEDED, UNIDENTIFIED, parse_attempt
from leoflow_agent.outcome import AttemptIdentity

EXECUTION_PREFIX = "/execution"
"""Where Airflow mounts its Execution API on the api-server's root app (``airflow/api_fastapi/app.py``)."""

MAX_TOKEN_CHARS = 16384
"""A longer ``Authorization`` value is not looked into (Airflow's execution tokens are well under 1 KiB)."""

_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")


@dataclass(frozen=True)
class Verdict:
    """The fence's answer for one request.

    ``allowed``: pass it on to Airflow. Otherwise ``reason`` is one of :data:`leoflow_agent.fencing.FENCE_REASONS`
    and ``message`` says, for the agent's and the api-server's logs, which execution was refused and which one
    is current. ``ti_id``, ``sent`` (the attempt the header named, ``None`` without a readable one) and
    ``current`` (the ledger's ``(try_number, attempt_epoch)``) are filled for a refusal.
    """

    allowed: bool
    reason: str | None = None
    message: str = ""
    ti_id: str | None = None
    sent: AttemptIdentity | None = None
    current: tuple[int, int] | None = None


PASS = Verdict(True)


class Current(NamedTuple):
    """What the fence's ledger read returns for a ``ti_id`` leoflow ran: the ledger's current attempt of it
    (``try_number``, ``attempt_epoch``: its highest epoch, whatever its state) and ``superseded``, whether the
    ``ti_id`` is a superseded try of its task instance (:func:`~leoflow_airflow.api.execution_fence.superseded_try`)."""

    try_number: int
    attempt_epoch: int
    superseded: bool = False


def is_execution_path(path: str, root_path: str = "") -> bool:
    """Whether ``path`` (an ASGI ``scope["path"]``) is under the Execution API: ``/execution`` or below it,
    after removing the app's ``root_path`` (``[api] base_url``'s path) when the server left it on."""
    if root_path and (path == root_path or path.startswith(root_path.rstrip("/") + "/")):
        path = path[len(root_path.rstrip("/")):]
    return path == EXECUTION_PREFIX or path.startswith(EXECUTION_PREFIX + "/")


def token_subject(authorization: str | None) -> str | None:
    """The ``sub`` claim of a ``Bearer`` JWT, lower-cased, when it is a UUID (a ``ti_id``); else ``None``.

    The signature is NOT verified, and need not be: the subject only chooses which ledger row the request is
    compared with, and the fence can only refuse. A forged ``sub`` can get the forger's own request refused,
    or passed on to Airflow's ``JWTBearer``, which rejects a token that is not validly signed (403) and, on
    task-instance routes, one whose ``sub`` is not the path's id. A validly signed token's ``sub`` is the
    ``ti_id`` Airflow minted it for. Never raises.
    """
    if not authorization or len(authorization) > MAX_TOKEN_CHARS:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    parts = token.strip().split(".")
    if len(parts) != 3:
        return None
    try:
        claims = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except (binascii.Error, ValueError, UnicodeDecodeError):
        return None
    sub = claims.get("sub") if isinstance(claims, dict) else None
    if not isinstance(sub, str) or not _UUID.fullmatch(sub):
        return None
    return sub.lower()


def decide(*, ti_id: str, header: str | None, current: tuple[int, int] | None, superseded: bool = False) -> Verdict:
    """Judge one Execution API request of task instance ``ti_id`` (from :func:`token_subject`).

    :param header: the request's ``Leoflow-Attempt`` value, ``None`` when absent.
    :param current: the ledger's current attempt of ``ti_id`` as ``(try_number, attempt_epoch)`` (its
        highest epoch, whatever its state), ``None`` when leoflow has no attempt of it.
    :param superseded: ``ti_id`` is a superseded try of its task instance (archived, and its newer try is past
        ``up_for_retry``/``restarting``).
    :returns: :data:`PASS` when ``current`` is ``None`` (not leoflow's task) or the ``ti_id`` is current and
        the header names exactly ``(ti_id, *current)``; a refusal with reason ``leoflow_superseded_try`` when
        ``superseded`` (whatever the header: every execution of that ``ti_id`` is over);
        ``leoflow_unidentified_execution`` when the header is missing, malformed or names another ``ti_id``
        (every leoflow agent sends it, so a request without one cannot be told from a stale execution's);
        ``leoflow_stale_execution`` when it names another try or epoch of this ``ti_id``, older (the usual
        case: an execution leoflow re-dispatched past) or not.
    """
    if current is None:
        return PASS
    sent = parse_attempt(header)
    try_number, epoch = current
    now = f"the current one is epoch {epoch} of try {try_number}"
    if superseded:
        return Verdict(False, SUPERSEDED,
                       f"leoflow refused this request: task instance id {ti_id} (try {try_number}) is no longer its "
                       "task's current try: a newer try (a clear, a retry or leoflow's re-run after an "
                       "infrastructure loss) replaced it. This execution must stop; it cannot act on the newer try.",
                       ti_id, sent, current)
    if sent is None or sent.ti_id != ti_id.lower():
        what = ("names no leoflow execution (no " + ATTEMPT_HEADER + " header)" if header is None
                else "names no leoflow execution of this task instance (" + ATTEMPT_HEADER + " header "
                + ("for another task instance" if sent is not None else "malformed") + ")")
        return Verdict(False, UNIDENTIFIED,
                       f"leoflow refused this request: task instance {ti_id} runs under leoflow and the request "
                       f"{what}; {now}.", ti_id, sent, current)
    if (sent.try_number, sent.attempt_epoch) != current:
        return Verdict(False, STALE,
                       f"leoflow refused this request: execution epoch {sent.attempt_epoch} of try "
                       f"{sent.try_number} of task instance {ti_id} is no longer current; {now}. This execution "
                       "must stop; it cannot act on the current one.", ti_id, sent, current)
    return PASS


def refusal_body(verdict: Verdict, error_id: str) -> dict[str, Any]:
    """The JSON body of the fence's 409, in the shape of Airflow's own 409s (``{"detail": {"reason",
    "message"}}``, which the Task SDK client logs) plus what an operator needs to match it to the api-server's
    log line: ``ti_id``, ``sent`` and ``current`` (``{"try_number", "attempt_epoch"}``, ``sent`` ``null``
    without a readable header) and ``error_id``. Raises ``ValueError`` for a verdict that allows."""
    if verdict.allowed or verdict.current is None:
        raise ValueError("only a refusal has a body")
    sent = None if verdict.sent is None else {"ti_id": verdict.sent.ti_id, "try_number": verdict.sent.try_number,
                                               "attempt_epoch": verdict.sent.attempt_epoch}
    return {"detail": {
        "reason": verdict.reason,
        "message": verdict.message,
        "ti_id": verdict.ti_id,
        "sent": sent,
        "current": {"try_number": verdict.current[0], "attempt_epoch": verdict.current[1]},
        "error_id": error_id,
    }}
