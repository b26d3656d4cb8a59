"""What one pod create's answer means for the attempt: a pure mapping of the API server's reply (status code,
Status message, ``Retry-After``) or of a transport error to a :class:`Verdict` (DESIGN §3 "Dispatch" and
"Classifying a create"). The 403 messages are the API server's own: ``exceeded quota`` and ``status unknown for
quota`` from k8s.io/apiserver ``pkg/admission/plugin/resourcequota/controller.go``, ``must specify`` from
kubernetes ``pkg/quota/v1/evaluator/core/pods.go``, ``violates PodSecurity`` from
``pod-security-admission/admission/admission.go``.

========================================================  ====================================================
reply                                                     verdict
========================================================  ====================================================
201/200                                                   ``dispatched``
429 (API Priority and Fairness)                           ``backpressure``, ``Retry-After`` honoured
403 ``exceeded quota`` while the quota has other use      ``backpressure`` (frees when other pods end)
403 ``exceeded quota`` with nothing used yet              ``refused``: this pod alone is over the quota
403 ``status unknown for quota``                          ``backpressure`` (the quota is not computed yet)
403 ``failed quota: …: must specify …``                   ``refused``, naming the quota
403 ``violates PodSecurity``                              ``refused``, with the violations
any other 403 (RBAC, LimitRange, a terminating namespace) ``refused``
409 ``AlreadyExists`` on this attempt's own pod name       ``check_existing``: read that pod; it is this
                                                          attempt's only if its identity annotation matches
400, 404, 413, 422 and other 4xx                          ``refused`` (this spec or this namespace cannot be)
401, 408, any 5xx, a transport error or timeout           ``deferred`` (nothing known to have happened;
                                                          retry with backoff; a create that did land meets
                                                          its own name next time: 409)
========================================================  ====================================================

An ``exceeded quota`` is backpressure, with one refinement: one whose ``used`` is zero for every resource can
never pass, so it is ``refused`` instead of left to backpressure forever.

Pure: it reads only what it is given; it imports neither the Kubernetes client nor Airflow.
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime

from leoflow_airflow.dispatch.disposition import Disposition, DispatchResult

__all__ = ["CreateReply", "Verdict", "VerdictKind", "classify_create", "classify_exception", "retry_after_seconds"]

MAX_REASON_CHARS = 500
"""A Status message is cut to this many characters before it becomes a reason (the ledger keeps 500)."""

_TRANSPORT_MODULES = ("urllib3", "http.client", "ssl", "socket", "h11", "httpcore", "httpx")
_USED = re.compile(r"used: (.*?), limited:")


class VerdictKind(enum.StrEnum):
    """What to do next with the attempt whose pod create got this reply."""

    DISPATCHED = "dispatched"
    BACKPRESSURE = "backpressure"
    REFUSED = "refused"
    DEFERRED = "deferred"
    CHECK_EXISTING = "check_existing"
    """409 on this attempt's own name: a create of ours may have landed earlier (its reply lost). Read the pod:
    when its identity annotation is this attempt's, it is ours (``dispatched``, with its UID); otherwise someone
    else holds the name (``refused``)."""


@dataclass(frozen=True, slots=True)
class Verdict:
    """A classified create reply.

    :param kind: what to do next.
    :param reason: short operator-facing text (what the API server said, cut to :data:`MAX_REASON_CHARS`;
        empty for ``dispatched``).
    :param retry_after: seconds to wait before the next create, from ``Retry-After`` (``None``: not given, use
        the caller's backoff).
    """

    kind: VerdictKind
    reason: str = ""
    retry_after: float | None = None

    def dispatch_result(self) -> DispatchResult:
        """The :class:`DispatchResult` of this verdict. :raises ValueError: for ``check_existing``, which needs
        a read of the pod before it becomes one."""
        if self.kind is VerdictKind.CHECK_EXISTING:
            raise ValueError("check_existing has no disposition until the existing pod is read")
        return DispatchResult(Disposition(self.kind.value), self.reason)


@dataclass(frozen=True, slots=True)
class CreateReply:
    """The API server's answer to one pod create, as the caller saw it.

    :param status: the HTTP status code.
    :param body: the response body (a JSON ``Status`` for errors), or empty.
    :param headers: the response headers (any case), or empty.
    """

    status: int
    body: str = ""
    headers: Mapping[str, str] | None = None


def retry_after_seconds(value: str | None, *, now: datetime | None = None) -> float | None:
    """Parse a ``Retry-After`` header: delay seconds or an HTTP date (RFC 9110 §10.2.3). Returns seconds (≥ 0)
    or ``None`` when absent or unreadable. ``now`` (aware) is for the date form; default: the clock."""
    if value is None:
        return None
    text = value.strip()
    if text.isdigit():
        return float(text)
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return max(0.0, (when - (now or datetime.now(timezone.utc))).total_seconds())


def _status(body: str) -> tuple[str, str, str]:
    """``(message, reason, details.name)`` of a JSON ``Status`` body; the raw body as message otherwise."""
    try:
        data = json.loads(body) if body else {}
    except ValueError:
        return body.strip(), "", ""
    if not isinstance(data, dict):
        return body.strip(), "", ""
    details = data.get("details") if isinstance(data.get("details"), dict) else {}
    return (str(data.get("message") or ""), str(data.get("reason") or ""), str(details.get("name") or ""))


def _header(headers: Mapping[str, str] | None, name: str) -> str | None:
    for key, value in (headers or {}).items():
        if key.lower() == name.lower():
            return value
    return None


def _cut(text: str) -> str:
    return text if len(text) <= MAX_REASON_CHARS else text[: MAX_REASON_CHARS - 1] + "…"


def _nothing_used(message: str) -> bool:
    """Whether an ``exceeded quota`` message says every resource it lists has zero use (``used: cpu=0,pods=0``)."""
    match = _USED.search(message)
    if match is None:
        return False
    pairs = [p.split("=", 1) for p in match.group(1).split(",") if p]
    return bool(pairs) and all(len(p) == 2 and p[1].strip() == "0" for p in pairs)


def classify_create(reply: CreateReply, *, pod_name: str, now: datetime | None = None) -> Verdict:
    """Classify the answer to creating pod ``pod_name`` (module docstring, table).

    :param reply: status, body and headers of the answer.
    :param pod_name: the name the create asked for (a 409 about any other name is not ours to check).
    :param now: the clock for an HTTP-date ``Retry-After``.
    """
    status = reply.status
    if 200 <= status < 300:
        return Verdict(VerdictKind.DISPATCHED)
    message, reason, name = _status(reply.body)
    text = _cut(message or reason or f"HTTP {status}")
    retry = retry_after_seconds(_header(reply.headers, "Retry-After"), now=now)
    if status == 429:
        return Verdict(VerdictKind.BACKPRESSURE, text, retry)
    if status == 403:
        if "exceeded quota" in message:
            if _nothing_used(message):
                return Verdict(VerdictKind.REFUSED, _cut("this pod alone is over the namespace's quota: " + message))
            return Verdict(VerdictKind.BACKPRESSURE, text, retry)
        if "status unknown for quota" in message:
            return Verdict(VerdictKind.BACKPRESSURE, text, retry)
        return Verdict(VerdictKind.REFUSED, text)
    if status == 409:
        if reason == "AlreadyExists" and name == pod_name:
            return Verdict(VerdictKind.CHECK_EXISTING, text)
        return Verdict(VerdictKind.DEFERRED, text, retry)
    if status in (401, 408) or status >= 500:
        return Verdict(VerdictKind.DEFERRED, text, retry)
    return Verdict(VerdictKind.REFUSED, text)


def classify_exception(exc: BaseException, *, pod_name: str, now: datetime | None = None) -> Verdict:
    """Classify what a create raised: an API error carrying ``status``/``body``/``headers`` (the client's
    ``ApiException``) goes through :func:`classify_create`; a transport error (``OSError``, ``TimeoutError``,
    an ``urllib3``/``ssl``/``http.client`` error) is ``deferred``; anything else is ``refused`` with its type
    and text (the client refused the object before sending it, e.g. a required field missing)."""
    status = getattr(exc, "status", None)
    if isinstance(status, int) and status > 0:
        headers = getattr(exc, "headers", None)
        body = getattr(exc, "body", None)
        return classify_create(CreateReply(status, body if isinstance(body, str) else "",
                                           headers if isinstance(headers, Mapping) else None),
                               pod_name=pod_name, now=now)
    module = type(exc).__module__
    if isinstance(exc, (OSError, TimeoutError)) or any(module == m or module.startswith(m + ".")
                                                       for m in _TRANSPORT_MODULES):
        return Verdict(VerdictKind.DEFERRED, _cut(f"{type(exc).__name__}: {exc}"))
    if isinstance(status, int) and status == 0:  # the client's own ApiException without a reply
        return Verdict(VerdictKind.DEFERRED, _cut(f"{type(exc).__name__}: {exc}"))
    return Verdict(VerdictKind.REFUSED, _cut(f"{type(exc).__name__}: {exc}"))
