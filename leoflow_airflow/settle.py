"""Settle calls to Airflow's Execution API (DESIGN §2 "Settle mechanics").

The reconciler replays a recorded terminal ``PATCH /task-instances/{id}/state`` body with the
``airflow-api-version`` header it was first sent with, authenticated by an execution token minted for that
``ti_id`` (``sub=ti_id``, ``scope=execution``), over the TLS settings the Task SDK's own client uses, with a
short timeout and never inside a DB transaction. 200/204 = settled (200: it already was), 409 = someone
settled first, 404/410 = the id is archived; an answer no retry can change (401, 403, 422, ...) is final and
not retried (:attr:`SettleResult.retryable`). The replay names the recorded attempt in the ``Leoflow-Attempt``
header, as its agent did, so the api-server's fence lets it through exactly while that attempt is its
``ti_id``'s current one (the reconciler replays only the current epoch, DESIGN §2); a fence refusal is a 409
(someone moved the ``ti_id`` on) whose detail names the fence.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import httpx

from leoflow_agent import fencing
from leoflow_agent.outcome import OutcomeRecord

_HEADER_VALUE = re.compile(r"[\x21-\x7e]+(?:[ \t]+[\x21-\x7e]+)*")
"""A header field value the replay can send: visible ASCII, inner spaces or tabs (RFC 9110 §5.5, without the
obsolete non-ASCII ``obs-text``). Airflow's API versions are dates such as ``2025-09-23``."""

RETRYABLE_4XX = frozenset({408, 425, 429})
"""4xx answers that may differ on a later try of the same request: Request Timeout, Too Early, Too Many
Requests (RFC 9110 §15.5.9, RFC 8470 §5.2, RFC 6585 §4)."""


@dataclass(frozen=True)
class SettleResult:
    """What one settle call achieved.

    ``settled``: nothing more to do for this attempt; ``applied``: our call changed Airflow's row;
    ``detail``: a short human-readable reason (status code and, for a failure, the start of the body);
    ``retryable``: only meaningful when not settled. True: the same call may succeed later (a transport
    error, 5xx, 408/425/429), so retry it on a later ``sync()``. False: no retry of the same body and token
    can change the answer (401, 403, 422 and every other such 4xx, an unexpected 1xx/2xx/3xx, a record with
    no payload); the caller takes the infra re-drive path (DB-only, on the budget) with ``detail``.
    """

    settled: bool
    applied: bool
    detail: str
    retryable: bool = False


def classify(status: int) -> SettleResult:
    """Map an Execution API status code of ``PATCH /task-instances/{id}/state`` to a :class:`SettleResult`.

    Pure. The route's documented answers (``airflow/api_fastapi/execution_api/routes/task_instances.py``,
    ``ti_update_state``): 204 applied, 200 already in that state, 404 not found, 409 not in a valid state
    for the transition, 422 invalid payload; 410 is archived too. 5xx is retryable, as the Task SDK retries
    it (``sdk/api/client.py`` ``_should_retry_api_request``), and so are :data:`RETRYABLE_4XX`. Any other
    status is final and not retryable (see :class:`SettleResult`).
    """
    if status == 204:
        return SettleResult(True, True, "204: the recorded state was applied")
    if status == 200:
        return SettleResult(True, False, "200: Airflow already had that state")
    if status == 409:
        return SettleResult(True, False, "409: someone settled the task instance first")
    if status in (404, 410):
        return SettleResult(True, False, f"{status}: the attempt's ti_id is archived")
    if status >= 500 or status in RETRYABLE_4XX:
        return SettleResult(False, False, f"HTTP {status}", retryable=True)
    return SettleResult(False, False, f"HTTP {status}: a retry cannot change this answer", retryable=False)


def sdk_tls_options() -> dict[str, Any]:
    """The ``verify`` (and, for mutual TLS, ``cert``) arguments the Task SDK's client would use.

    Follows ``airflow/sdk/api/client.py`` ``Client.__init__``: ``verify`` is the SDK's cached SSL context
    built from ``[api] ssl_ca_file`` and ``[api] ssl_cert`` (plus certifi when ``[api]
    client_use_public_certs``), ``cert`` is ``([api] client_ssl_cert, [api] client_ssl_key)`` when both are
    set. The SDK reads these options once at import; so does this, through the SDK module's own values.

    :raises ValueError: when only one of ``client_ssl_cert`` / ``client_ssl_key`` is set (as the SDK does).
    :raises OSError, ssl.SSLError: when a configured CA or certificate file cannot be loaded.
    """
    from airflow.sdk.api import client as sdk_client

    options: dict[str, Any] = {
        "verify": sdk_client.Client._get_ssl_context_cached(sdk_client.API_SSL_CA_FILE_PATH,
                                                            sdk_client.API_SSL_CERT_PATH),
    }
    cert, key = sdk_client.API_CLIENT_SSL_CERT, sdk_client.API_CLIENT_SSL_KEY
    if cert or key:
        if not (cert and key):
            raise ValueError("[api] client_ssl_cert and client_ssl_key must be set together")
        options["cert"] = (cert, key)
    return options


def api_reachable(*, server: str, timeout: float) -> bool:
    """Whether the Execution API answers now: ``GET {server}/health`` returns 2xx within ``timeout`` seconds.

    Issue 8 hole 4: an agent that dies before ``/run`` while the api-server is down says nothing about the
    workload, so its re-dispatch waits until this is True instead of spending ``[leoflow] redispatch_limit``
    inside the outage. The route is Airflow's own (``execution_api/routes/health.py``), over the Task SDK's
    TLS settings (:func:`sdk_tls_options`). Never raises: any transport error, unusable TLS settings or a
    non-2xx answer is False.

    :param server: the Execution API base URL (``.../execution/``).
    :param timeout: seconds, httpx's per-phase timeout.
    """
    try:
        response = httpx.get(server.rstrip("/") + "/health", timeout=timeout, **sdk_tls_options())
    except (httpx.HTTPError, OSError, ValueError):
        return False
    return response.is_success


def replay_state(record: OutcomeRecord, *, jwt_generator: Any, server: str, timeout: float) -> SettleResult:
    """PATCH the recorded ``/state`` body for ``record.ti_id``.

    :param jwt_generator: Airflow's ``JWTGenerator`` (``BaseExecutor.jwt_generator``).
    :param server: the Execution API base URL (``.../execution/``), ``http`` or ``https``.
    :param timeout: seconds, httpx's timeout: it bounds each phase (connect, write, read, pool), not the sum.
    :returns: a :class:`SettleResult`. A transport error (TLS verification included) gives ``settled=False,
        retryable=True``, and so do unusable TLS settings (a CA file that cannot be read, half a client
        certificate pair; see :func:`sdk_tls_options`): a configuration error the operator can fix, which
        breaks the agents' own reports too, so it never crashes the scheduler loop nor re-runs the task. A
        record without a replayable payload, or whose ``api_version`` is no valid header value (httpx would
        raise ``UnicodeEncodeError`` or refuse it locally), gives ``settled=False, retryable=False``: no
        retry can send it. Nothing in a record's contents makes this raise: an exception here ends
        Airflow's scheduler loop, and the successor would replay the same record (issue 8 hole 6).
    """
    if record.ti_id is None or record.payload is None:
        return SettleResult(False, False, "the record carries no replayable payload")
    if record.api_version and not _HEADER_VALUE.fullmatch(record.api_version):
        return SettleResult(False, False, f"the record's airflow-api-version {record.api_version!r:.60} "
                                          "is not a valid header value")
    token = jwt_generator.generate(extras={"sub": record.ti_id, "scope": "execution"})
    headers = {"authorization": f"Bearer {token}", "content-type": "application/json"}
    if record.api_version:
        headers["airflow-api-version"] = record.api_version
    attempt = record.attempt()
    if attempt is not None:
        try:
            headers[fencing.ATTEMPT_HEADER] = fencing.format_attempt(attempt)
        except ValueError:
            pass  # not a UUID ti_id: no ledger row names it, so the fence does not judge this replay
    url = server.rstrip("/") + f"/task-instances/{record.ti_id}/state"
    try:
        tls = sdk_tls_options()
    except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
        return SettleResult(False, False, f"the Task SDK's TLS settings are unusable: {exc}"[:300], retryable=True)
    try:
        response = httpx.patch(url, json=record.payload, headers=headers, timeout=timeout, **tls)
    except httpx.HTTPError as exc:
        return SettleResult(False, False, f"transport error: {type(exc).__name__}: {exc}"[:300], retryable=True)
    result = classify(response.status_code)
    if response.status_code == 409 and _fence_reason(response):
        result = SettleResult(True, False, f"409: leoflow's fence refused it ({_fence_reason(response)}): "
                                           "the record's attempt is no longer current")
    if not result.settled:
        body = response.text.strip().replace("\n", " ")[:200]
        result = SettleResult(False, False, f"{result.detail}; {body}" if body else result.detail, result.retryable)
    return result


def _fence_reason(response: httpx.Response) -> str | None:
    """The fence's reason when ``response`` is its refusal (:func:`leoflow_agent.fencing.fence_reason`)."""
    try:
        return fencing.fence_reason(response.json())
    except ValueError:
        return None
