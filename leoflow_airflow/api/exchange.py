"""The token exchange: a task pod trades its projected ServiceAccount token for its attempt's workload with a
workload token minted at that moment (DESIGN §3 "Start" and "The token exchange, as built"). The wire contract
is :mod:`leoflow_agent.exchange`; the route is in :mod:`leoflow_airflow.api.app`.

The checks, in this order (:meth:`Exchange.exchange`); the first that fails refuses:

1. the request is a JSON object with a JWT-shaped ``token`` (no Kubernetes call for garbage);
1b. the token's claims, read WITHOUT checking its signature (:func:`check_unverified_claims`), look like a
   projected token of our ServiceAccount for our audience (and of one of ``[leoflow] exchange_issuers`` when set):
   a cheap local filter, so unauthenticated garbage never
   costs a TokenReview (k8s review §10); then at most :data:`MAX_CONCURRENT_REVIEWS` requests of this process
   are past this point at once (:class:`ReviewGate`), the others are answered 503 at once (``busy``);
2. TokenReview with ``spec.audiences = [[leoflow] exchange_audience]``;
3. ``authenticated``, the audience echoed back, ``username == system:serviceaccount:<namespace>:<service_account>``;
4. the review's ``extra`` names one pod name and one pod UID;
5. GET that pod in the namespace: it exists with that UID (a pod recreated under the name is another pod) and
   has no ``deletionTimestamp`` (Kubernetes still authenticates a terminating pod's token for its grace period
   + 60 s: this check is what closes that window);
6. the pod's identity annotation names the ledger's CURRENT epoch of its ``ti_id``, a Kubernetes attempt in
   state ``dispatched``, not exchanged yet, and (where the ledger recorded them) this pod's name and UID; an
   attempt still ``claimed`` (the pod asked before the scheduler recorded its create) is undecided, 503. An
   attempt exchanged before is granted again only to the pod the ledger recorded for it (same name and UID,
   :func:`may_exchange_again`): its first answer was lost (a read timeout, a proxy), and the second token allows
   nothing the first did not (k8s review §4);
7. the stored workload is rebuilt with a token minted now, exactly as Airflow mints one
   (``ExecuteTask.generate_token`` with a ``JWTGenerator`` built like ``BaseExecutor.jwt_generator``);
8. one guarded ledger write marks the attempt exchanged with the review's credential id (``JTI=…``); only if it
   changed the row is the workload returned, so two pods' exchanges of one attempt, on any api-server worker or
   replica, never both succeed (a repeated exchange by the recorded pod: ``LedgerStore.record_exchange_again``,
   guarded on that pod's UID).

A refusal is :class:`Refused` (HTTP 403), an undecidable exchange :class:`Unavailable` (HTTP 503, try again):
both carry a reason from a closed set and a server-side detail that the answer never shows (it carries only an
``error_id`` under which :class:`ExchangeService` logs them). No database transaction is open while Kubernetes
is called (the ledger is read after both calls, in short transactions of its own), each Kubernetes call is
bounded by ``[leoflow] exchange_timeout_seconds``, and all state lives in the ledger.
"""

from __future__ import annotations

import configparser
import json
import logging
import os
import re
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import jwt

from leoflow_agent.exchange import MAX_REQUEST_BYTES, Grant, encode_grant
from leoflow_airflow import metrics
from leoflow_airflow.errors import ConfigError
from leoflow_airflow.ledger.states import AttemptRef, AttemptState
from leoflow_airflow.runtime.kubernetes.identity import IDENTITY_ANNOTATION, parse_identity_annotation
from leoflow_airflow.runtime.kubernetes.review import (
    EXTRA_CREDENTIAL_ID,
    EXTRA_POD_NAME,
    EXTRA_POD_UID,
    KubeReader,
    KubeRejected,
    KubeUnavailable,
    PodFacts,
)

if TYPE_CHECKING:
    from leoflow_airflow.settings import KubernetesSettings

__all__ = [
    "BUSY_RETRY_AFTER_SECONDS",
    "CLAIMS_LEEWAY_SECONDS",
    "MAX_CONCURRENT_REVIEWS",
    "REFUSALS",
    "REVIEW_GATE",
    "NOT_YET_DISPATCHED_RETRY_AFTER_SECONDS",
    "RETRY_AFTER_SECONDS",
    "UNAVAILABLE",
    "Answer",
    "BoundPod",
    "Exchange",
    "ExchangeLedger",
    "ExchangeService",
    "Refused",
    "ReviewGate",
    "Unavailable",
    "airflow_minter",
    "authenticate_pod",
    "build_generator",
    "check_can_mint",
    "check_unverified_claims",
    "from_airflow",
    "may_exchange_again",
    "parse_json_object",
    "parse_request",
    "signing_configured",
]

log = logging.getLogger(__name__)

REFUSALS: frozenset[str] = frozenset({
    "disabled",               # this api-server serves no exchange ([leoflow] runtime is not kubernetes)
    "malformed_request",      # not a JSON object with a string "token", or too large
    "malformed_token",        # not shaped like a JWT: never sent to Kubernetes
    "implausible_token",      # its unverified claims are no projected token of ours: never sent to Kubernetes
    "review_rejected",        # the apiserver refused the TokenReview request as invalid
    "unauthenticated",        # TokenReview: not valid (expired, wrong audience, bound object gone, garbage)
    "audience_mismatch",      # authenticated, but our audience not echoed back
    "wrong_service_account",  # another ServiceAccount (or namespace), or not a ServiceAccount at all
    "not_pod_bound",          # the token is not bound to exactly one pod
    "pod_gone",               # the bound pod does not exist any more
    "pod_replaced",           # a pod of that name exists with another UID
    "pod_terminating",        # the pod has a deletionTimestamp
    "no_identity",            # the pod carries no valid identity annotation
    "unknown_attempt",        # the ledger has no attempt of that ti_id
    "stale_epoch",            # the annotation names another attempt than the ledger's current one
    "not_kubernetes",         # the current attempt is not a Kubernetes one
    "not_dispatched",         # the current attempt is not in state dispatched
    "already_exchanged",      # the attempt was exchanged before (a second exchange, or a lost race)
    "pod_not_recorded",       # the ledger recorded another pod name or UID for the attempt
    "bad_workload",           # the stored workload cannot be rebuilt (logged as an error: a leoflow defect)
    "vetoed",                 # a plugin's leoflow_exchange hook denied it (its reason is in the detail)
})
"""Why an exchange was refused (403). Logged with the ``error_id``; never sent to the caller."""

UNAVAILABLE: frozenset[str] = frozenset({
    "kube_unavailable",   # TokenReview or the pod GET gave no usable answer in time
    "ledger_unavailable",  # the ledger could not be read or written
    "cannot_mint",        # no JWT generator: [api_auth] jwt_secret / jwt_private_key_path missing or unusable
    "not_configured",     # runtime = kubernetes, but the exchange's settings or Kubernetes client are unusable
    "not_yet_dispatched",  # the attempt is still claimed: its pod asked before the scheduler recorded it dispatched
    "plugin_error",       # a plugin's leoflow_exchange hook raised: fail-closed, the agent asks again
    "busy",               # MAX_CONCURRENT_REVIEWS requests of this process are being reviewed: ask again soon
})
"""Why an exchange could not be decided (503). Logged with the ``error_id``; never sent to the caller."""

RETRY_AFTER_SECONDS = 5
"""``Retry-After`` of a 503 answer, in seconds."""
NOT_YET_DISPATCHED_RETRY_AFTER_SECONDS = 1
"""``Retry-After`` of a 503 ``not_yet_dispatched``, in seconds: a pod that asks before its scheduler recorded the
create (pod creation is asynchronous) is answered at the scheduler's next loop, about a second later; measured on
the e2e DAG set, 30 of 167 exchanges met that race and each lost 5 s with the general value."""

BUSY_RETRY_AFTER_SECONDS = 2
"""``Retry-After`` of a 503 ``busy``, in seconds (every review slot of this api-server worker was taken)."""
MAX_CONCURRENT_REVIEWS = 16
"""Requests of one api-server worker process that may be between the local checks and the end of their
TokenReview and pod GET at once (the exchange and the warm registration together): each holds one thread of the
pool Airflow's own sync routes share (40 by default) for up to two ``exchange_timeout_seconds``, so a flood of
plausible tokens never takes more than this many of them (k8s review §10)."""
CLAIMS_LEEWAY_SECONDS = 30
"""Clock skew allowed when the unverified ``exp`` is compared with this host's clock, in seconds."""

_JWT = re.compile(r"[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+")
_MAX_TOKEN_LEN = 8192


class Refused(Exception):
    """The exchange is refused for good. ``reason``: one of :attr:`reasons` (:data:`REFUSALS`; a subclass widens
    it: :class:`leoflow_airflow.api.warm.WarmRefused`); ``detail``: for the log only."""

    reasons: frozenset[str] = REFUSALS

    def __init__(self, reason: str, detail: str = "") -> None:
        assert reason in self.reasons, reason
        self.reason, self.detail = reason, detail
        super().__init__(f"{reason}: {detail}" if detail else reason)


class Unavailable(Exception):
    """The exchange could not be decided; the same request may succeed later. ``reason``: one of
    :data:`UNAVAILABLE`; ``detail``: for the log only."""

    def __init__(self, reason: str, detail: str = "") -> None:
        assert reason in UNAVAILABLE, reason
        self.reason, self.detail = reason, detail
        super().__init__(f"{reason}: {detail}" if detail else reason)


class ExchangeLedger(Protocol):
    """The two ledger calls of an exchange (``LedgerStore`` is one)."""

    def current(self, ti_id: str) -> Any:
        """The highest-epoch ``Attempt`` of ``ti_id``, or None."""
        ...

    def record_exchange(self, ref: AttemptRef, *, credential_id: str | None) -> bool:
        """The guarded "exchanged" write; whether it changed the row."""
        ...

    def record_exchange_again(self, ref: AttemptRef, *, pod_uid: str, credential_id: str | None) -> bool:
        """The guarded write of a repeated exchange by the recorded pod ``pod_uid``; whether it changed the row."""
        ...


Minter = Callable[[Any], str]
"""``mint(attempt) -> workload JSON`` with a workload token minted now for ``attempt.ref.ti_id``. Raises
``ValueError`` (pydantic's ``ValidationError`` is one) when the stored workload cannot be rebuilt."""


def parse_json_object(body: bytes, limit: int, refused: type[Refused] = Refused) -> dict[str, Any]:
    """``body`` as a JSON object (a request body of the plugin app's routes).

    :raises Refused: (``refused``, a :class:`Refused` class) ``malformed_request`` when ``body`` is larger than
        ``limit`` bytes, not UTF-8 JSON, or not an object.
    """
    if len(body) > limit:
        raise refused("malformed_request", f"body of {len(body)} bytes")
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        raise refused("malformed_request", "body is not JSON") from None
    if not isinstance(data, dict):
        raise refused("malformed_request", f"body is a JSON {type(data).__name__}, not an object")
    return data


def parse_request(body: bytes) -> str:
    """The token of an exchange request body (see :mod:`leoflow_agent.exchange`).

    :raises Refused: ``malformed_request`` when ``body`` is larger than ``MAX_REQUEST_BYTES``, not UTF-8 JSON,
        not an object, or has no string ``token``; ``malformed_token`` when the token is not shaped like a JWT
        (three base64url parts, at most 8192 characters).
    """
    data = parse_json_object(body, MAX_REQUEST_BYTES)
    token = data.get("token")
    if not isinstance(token, str):
        raise Refused("malformed_request", "no string 'token'")
    token = token.strip()
    if len(token) > _MAX_TOKEN_LEN or not _JWT.fullmatch(token):
        raise Refused("malformed_token", f"token of {len(token)} characters is not a JWT")
    return token


def check_unverified_claims(token: str, *, audience: str, namespace: str, service_account: str,
                            issuers: Sequence[str] = (), now: float | None = None) -> None:
    """Refuse a JWT-shaped ``token`` whose claims, read WITHOUT checking the signature (pyjwt), cannot be a
    projected ServiceAccount token of ``namespace``/``service_account`` bound to a pod for ``audience``: a local
    filter before any TokenReview, so garbage costs no Kubernetes call (k8s review §10). It decides nothing in
    the token's favour: TokenReview still authenticates every token it lets through.

    Checked: at most 8192 characters in three segments that decode to a JSON object; ``aud`` (a string or a
    list) contains ``audience``; ``exp`` is a number later than ``now`` (seconds since the epoch; default the
    wall clock) minus :data:`CLAIMS_LEEWAY_SECONDS`; ``iss`` is one of ``issuers`` when any are given
    (``[leoflow] exchange_issuers``; empty: not checked); the ``kubernetes.io`` claim names ``namespace``, a ``serviceaccount`` named ``service_account`` and
    a ``pod`` with a non-empty ``name`` and ``uid`` (Kubernetes' bound-token claims).

    :raises Refused: ``malformed_token`` (size, segments, undecodable), ``implausible_token`` (a claim check
        failed; the detail names which, never a claim's value but the audience's and the accepted issuers).
    """
    if len(token) > _MAX_TOKEN_LEN or token.count(".") != 2:
        raise Refused("malformed_token", f"token of {len(token)} characters is not a JWT")
    try:
        claims = jwt.decode(token, options={"verify_signature": False})
    except jwt.PyJWTError as exc:
        raise Refused("malformed_token", f"unverified decode: {type(exc).__name__}") from None
    aud = claims.get("aud")
    audiences = [aud] if isinstance(aud, str) else aud if isinstance(aud, list) else []
    if audience not in audiences:
        raise Refused("implausible_token", f"aud does not contain {audience!r}")
    exp = claims.get("exp")
    if isinstance(exp, bool) or not isinstance(exp, (int, float)):
        raise Refused("implausible_token", "no numeric exp")
    if exp <= (time.time() if now is None else now) - CLAIMS_LEEWAY_SECONDS:
        raise Refused("implausible_token", "exp has passed")
    if issuers and claims.get("iss") not in issuers:
        raise Refused("implausible_token", f"iss is none of [leoflow] exchange_issuers {list(issuers)[:4]}")
    kube = claims.get("kubernetes.io")
    kube = kube if isinstance(kube, dict) else {}
    pod, sa = kube.get("pod"), kube.get("serviceaccount")
    if not (isinstance(pod, dict) and isinstance(pod.get("name"), str) and pod["name"]
            and isinstance(pod.get("uid"), str) and pod["uid"]):
        raise Refused("implausible_token", "no kubernetes.io pod claim")
    if kube.get("namespace") != namespace or not isinstance(sa, dict) or sa.get("name") != service_account:
        raise Refused("implausible_token", "kubernetes.io names another namespace or ServiceAccount")


class ReviewGate:
    """At most ``limit`` holders at once, and no waiting: :meth:`hold` enters or raises :class:`Unavailable`
    ``busy`` at once (answered 503 with ``Retry-After``), so requests past the bound never hold a thread of the
    api-server's shared pool while they wait for Kubernetes (k8s review §10). Thread-safe.

    :raises ValueError: ``limit`` < 1.
    """

    def __init__(self, limit: int) -> None:
        """A gate of ``limit`` slots."""
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit!r}")
        self.limit = limit
        self._slots = threading.BoundedSemaphore(limit)

    def hold(self, where: str) -> _Held:
        """A context manager holding one slot; ``where`` names the request in the ``busy`` detail.

        :raises Unavailable: ``busy`` when every slot is held.
        """
        if not self._slots.acquire(blocking=False):
            raise Unavailable("busy", f"{where}: {self.limit} reviews in flight in this process")
        return _Held(self._slots)


class _Held:
    """One slot of a :class:`ReviewGate`, given back on exit."""

    def __init__(self, slots: threading.BoundedSemaphore) -> None:
        self._slots = slots

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        self._slots.release()


REVIEW_GATE = ReviewGate(MAX_CONCURRENT_REVIEWS)
"""The gate every exchange and warm registration of this process passes (:func:`authenticate_pod`)."""


def _one(extra: Mapping[str, tuple[str, ...]], key: str) -> str | None:
    values = extra.get(key) or ()
    if len(values) != 1 or not values[0]:
        return None
    return values[0]


@dataclass(frozen=True)
class BoundPod:
    """Who presented a projected token (:func:`authenticate_pod`): the pod it is bound to as Kubernetes reads it
    now, the review's ``credential-id`` (``JTI=…``; None when the review named none) and ``where``, a log
    phrase naming the pod, its UID and the credential."""

    pod: PodFacts
    credential_id: str | None
    where: str


def authenticate_pod(cfg: KubernetesSettings, kube: KubeReader, token: str, *,
                     gate: ReviewGate | None = None) -> BoundPod:
    """Checks 1b-5 of the module docstring but the ``deletionTimestamp`` one (each caller names that refusal its
    own way): the unverified claims (:func:`check_unverified_claims`), then, holding a slot of ``gate`` (default
    :data:`REVIEW_GATE`), TokenReview of the JWT-shaped ``token`` with ``[cfg.exchange_audience]``, authenticated, the
    audience echoed, ``cfg``'s ServiceAccount, bound to exactly one pod, and that pod read from ``cfg.namespace``
    with the bound UID. Shared by the exchange and the warm pods' registration (:mod:`leoflow_airflow.api.warm`).

    :raises Refused: ``malformed_token``, ``implausible_token``, ``review_rejected``, ``unauthenticated``,
        ``audience_mismatch``, ``wrong_service_account``, ``not_pod_bound``, ``pod_gone``, ``pod_replaced``.
    :raises Unavailable: ``busy`` (every slot of ``gate`` held), ``kube_unavailable`` (TokenReview or the pod GET
        gave no usable answer in time).
    """
    check_unverified_claims(token, audience=cfg.exchange_audience, namespace=cfg.namespace,
                            service_account=cfg.service_account, issuers=cfg.exchange_issuers)
    with (REVIEW_GATE if gate is None else gate).hold("token review"):
        return _review_pod(cfg, kube, token)


def _review_pod(cfg: KubernetesSettings, kube: KubeReader, token: str) -> BoundPod:
    """The Kubernetes half of :func:`authenticate_pod` (TokenReview, then the pod GET); raises as it does."""
    try:
        review = kube.review(token, [cfg.exchange_audience])
    except KubeRejected as exc:
        raise Refused("review_rejected", str(exc)) from None
    except KubeUnavailable as exc:
        raise Unavailable("kube_unavailable", str(exc)) from None
    if not review.authenticated:
        raise Refused("unauthenticated", review.error[:300])
    if cfg.exchange_audience not in review.audiences:
        raise Refused("audience_mismatch", f"audiences {list(review.audiences)[:5]}")
    if review.username != cfg.service_account_username:
        raise Refused("wrong_service_account", f"user {review.username[:300]!r}")
    credential_id = _one(review.extra, EXTRA_CREDENTIAL_ID)
    pod_name, pod_uid = _one(review.extra, EXTRA_POD_NAME), _one(review.extra, EXTRA_POD_UID)
    if pod_name is None or pod_uid is None:
        raise Refused("not_pod_bound", f"credential {credential_id}")
    where = f"pod {cfg.namespace}/{pod_name} uid {pod_uid} credential {credential_id}"
    try:
        pod = kube.read_pod(cfg.namespace, pod_name)
    except KubeUnavailable as exc:
        raise Unavailable("kube_unavailable", f"{where}: {exc}") from None
    if pod is None:
        raise Refused("pod_gone", where)
    if pod.uid != pod_uid:
        raise Refused("pod_replaced", f"{where}: the pod of that name now has uid {pod.uid}")
    return BoundPod(pod=pod, credential_id=credential_id, where=where)


def may_exchange_again(attempt: Any, pod: PodFacts) -> str | None:
    """Whether ``attempt`` (a ledger ``Attempt`` exchanged before) may be exchanged again by ``pod`` (the pod the
    presented token is bound to, read now, not deleting): None when it may, else why not (for the log).

    It may when the attempt is still ``dispatched`` and the ledger recorded exactly this pod for it (its name and
    its UID, written when the scheduler recorded the create): the first answer was lost, and the same pod asks
    again with the same principal, so the second workload token allows nothing the first did not (k8s review §4).
    An attempt delivered to a warm pod (credential ``warm:…``) is never re-granted here: its pod did not exchange.
    """
    if attempt.state is not AttemptState.DISPATCHED:
        return f"state {attempt.state.value}"
    if (attempt.exchange_credential_id or "").startswith("warm:"):
        return f"delivered to a warm pod ({attempt.exchange_credential_id})"
    if attempt.pod_uid is None or attempt.pod_name is None:
        return "the ledger recorded no pod for it"
    if attempt.pod_uid != pod.uid or attempt.pod_name != pod.name:
        return f"the ledger recorded pod {attempt.pod_name} uid {attempt.pod_uid}"
    return None


class Exchange:
    """The exchange's check order over its three seams (Kubernetes, the ledger, the minter). Thread-safe as
    its seams are; holds no state of its own.

    :param config: the ``[leoflow]`` Kubernetes group the pod builder read too; the exchange checks against its
        ``exchange_audience``, ``namespace`` and ``service_account`` (:attr:`~leoflow_airflow.settings.
        KubernetesSettings.service_account_username`).
    :param kube: TokenReview and pod GET (:class:`~leoflow_airflow.runtime.kubernetes.review.KubeReader`).
    :param ledger: the attempt ledger (:class:`ExchangeLedger`).
    :param mint: rebuilds an attempt's stored workload with a fresh workload token (:data:`Minter`).
    :param gate: bounds the concurrent TokenReviews (default :data:`REVIEW_GATE`, shared with the warm pods'
        registration).
    """

    def __init__(self, *, config: KubernetesSettings, kube: KubeReader, ledger: ExchangeLedger, mint: Minter,
                 gate: ReviewGate | None = None) -> None:
        """Keep the seams; nothing is called yet."""
        self.config = config
        self.kube = kube
        self.ledger = ledger
        self.mint = mint
        self.gate = gate

    def exchange(self, token: str) -> Grant:
        """Run the checks (module docstring) on a JWT-shaped ``token`` and return the attempt's :class:`Grant`.

        :raises Refused: a check failed (its reason names which).
        :raises Unavailable: Kubernetes or the ledger gave no usable answer.
        """
        cfg = self.config
        bound = authenticate_pod(cfg, self.kube, token, gate=self.gate)
        pod, credential_id, where = bound.pod, bound.credential_id, bound.where
        if pod.deletion_timestamp is not None:
            raise Refused("pod_terminating", f"{where}: deletionTimestamp {pod.deletion_timestamp.isoformat()}")
        ident = parse_identity_annotation(pod.annotations.get(IDENTITY_ANNOTATION))
        if ident is None:
            raise Refused("no_identity", f"{where}: no valid {IDENTITY_ANNOTATION} annotation")
        where = f"attempt {ident} {where}"

        try:
            attempt = self.ledger.current(ident.ti_id)
        except Exception as exc:  # noqa: BLE001 - any database error: undecided, never a refusal
            raise Unavailable("ledger_unavailable", f"{where}: {type(exc).__name__}: {str(exc)[:200]}") from None
        if attempt is None:
            raise Refused("unknown_attempt", where)
        if attempt.ref != ident:
            raise Refused("stale_epoch", f"{where}: the ledger's current attempt is {attempt.ref}")
        if attempt.runtime != "kubernetes":
            raise Refused("not_kubernetes", f"{where}: runtime {attempt.runtime}")
        again = attempt.exchanged_at is not None
        if again and (why := may_exchange_again(attempt, pod)) is not None:
            raise Refused("already_exchanged", f"{where}: exchanged at {attempt.exchanged_at.isoformat()} "
                                               f"with credential {attempt.exchange_credential_id}; {why}")
        if attempt.state is AttemptState.CLAIMED:
            # the scheduler created the pod and has not yet recorded it dispatched (pod creation is asynchronous,
            # so a fast pod can ask first): undecided, the agent asks again
            raise Unavailable("not_yet_dispatched", f"{where}: state claimed")
        if attempt.state is not AttemptState.DISPATCHED:
            raise Refused("not_dispatched", f"{where}: state {attempt.state.value}")
        if (attempt.pod_name is not None and attempt.pod_name != pod.name) or (
                attempt.pod_uid is not None and attempt.pod_uid != pod.uid):
            raise Refused("pod_not_recorded", f"{where}: the ledger recorded pod {attempt.pod_name} uid "
                                              f"{attempt.pod_uid}")

        annotations = self._ask_plugins(attempt, pod.name, pod.uid, credential_id, where)
        try:
            workload = self.mint(attempt)
        except ValueError as exc:
            log.error("exchange: the stored workload of attempt %s cannot be rebuilt: %s", attempt.ref, exc)
            raise Refused("bad_workload", f"{where}: {type(exc).__name__}") from None
        try:
            # a first exchange that loses its write to a concurrent one (of this pod, or of its own retry) is
            # granted like a repeated one when the ledger recorded this pod for the attempt
            changed = (not again and self.ledger.record_exchange(attempt.ref, credential_id=credential_id)) or (
                attempt.pod_uid == pod.uid
                and self.ledger.record_exchange_again(attempt.ref, pod_uid=pod.uid, credential_id=credential_id))
        except Exception as exc:  # noqa: BLE001 - any database error: undecided (the token minted is dropped)
            raise Unavailable("ledger_unavailable", f"{where}: {type(exc).__name__}: {str(exc)[:200]}") from None
        if not changed:
            raise Refused("already_exchanged", f"{where}: the guarded write changed nothing (a concurrent "
                                               "exchange, or the attempt moved on)")
        log.info("exchange: attempt %s %sexchanged by pod %s/%s (uid %s, credential %s)%s", attempt.ref,
                 "re-" if again else "", cfg.namespace, pod.name, pod.uid, credential_id, annotations)
        ref = attempt.ref
        return Grant(workload=workload, ti_id=ref.ti_id, try_number=ref.try_number, attempt_epoch=ref.attempt_epoch)

    def _ask_plugins(self, attempt: Any, pod_name: str, pod_uid: str, credential_id: str | None,
                     where: str) -> str:
        """Ask the plugins' ``leoflow_exchange`` hooks (:mod:`leoflow_airflow.hookspecs`) about an exchange
        that passed every check; returns their log fields as `` key=value`` text for the grant's log line.

        :raises Refused: ``vetoed``, when a hook answered a ``deny`` (the plugin and its text in the detail).
        :raises Unavailable: ``plugin_error``, when a hook raised or answered something else (fail-closed,
            retryable: a policy that could not decide never grants).
        """
        from leoflow_airflow import hooks
        from leoflow_airflow.hookspecs import AttemptInfo

        if not hooks.has_implementations("leoflow_exchange"):
            return ""
        ref = attempt.ref
        info = AttemptInfo(ref.ti_id, ref.try_number, ref.attempt_epoch, attempt.dag_id, attempt.task_id,
                           attempt.run_id, attempt.map_index, attempt.runtime)
        try:
            verdicts = hooks.exchange_verdicts(info, pod_name=pod_name, pod_uid=pod_uid,
                                               namespace=self.config.namespace, credential_id=credential_id)
        except Exception as exc:  # noqa: BLE001 - any plugin error: undecided, never a grant
            notes = "; ".join(getattr(exc, "__notes__", ()))
            raise Unavailable("plugin_error", f"{where}: {type(exc).__name__}: {str(exc)[:200]} ({notes})") from None
        for plugin, verdict in verdicts:
            if verdict.deny:
                raise Refused("vetoed", f"{where}: plugin {plugin}: {str(verdict.deny)[:200]}")
        fields = {f"{k}"[:64]: f"{v}"[:200] for _, verdict in verdicts for k, v in dict(verdict.log_fields).items()}
        return "".join(f" {k}={v!r}" for k, v in sorted(fields.items()))


@dataclass(frozen=True)
class Answer:
    """An HTTP answer of the exchange route: ``status`` (200, 403 or 503), JSON ``body``, extra ``headers``."""

    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)


_NO_STORE = {"Cache-Control": "no-store"}


class ExchangeService:
    """What the route calls: request body in, :class:`Answer` out; every refusal and undecided exchange is
    logged under a fresh ``error_id`` with its reason and detail, and the answer carries only that id.

    :param exchange: the check order, or None when this api-server serves no exchange; then every request is
        answered from ``off`` (``(reason, detail)``: a reason of :data:`REFUSALS` answers 403, one of
        :data:`UNAVAILABLE` 503).
    :param closers: called once by :meth:`close` (the Kubernetes client, the ledger's engine).
    """

    def __init__(self, exchange: Exchange | None, *, off: tuple[str, str] = ("disabled", ""),
                 closers: tuple[Callable[[], None], ...] = ()) -> None:
        """Keep ``exchange`` (or the reason there is none) and what to close."""
        self.exchange = exchange
        self.off = off
        self._closers = closers

    def handle(self, body: bytes) -> Answer:
        """Answer one request body (blocking: Kubernetes and the ledger are called; run it in a thread).

        200 with :func:`~leoflow_agent.exchange.encode_grant` and ``Cache-Control: no-store``; 403 or 503 with
        ``{"error_id": …}`` (503 adds ``Retry-After``). Never raises for a bad request; an unexpected error is
        logged with its traceback and answered 503.
        """
        error_id = uuid.uuid4().hex
        try:
            token = parse_request(body)
            if self.exchange is None:
                reason, detail = self.off
                if reason in REFUSALS:
                    raise Refused(reason, detail)
                raise Unavailable(reason, detail)
            grant = self.exchange.exchange(token)
        except Refused as exc:
            log.warning("exchange refused: error_id=%s reason=%s %s", error_id, exc.reason, exc.detail)
            metrics.incr(f"leoflow.exchange.denied.{exc.reason}")
            return Answer(403, {"error_id": error_id}, dict(_NO_STORE))
        except Unavailable as exc:
            # a pod that asks before its scheduler recorded the create is an expected race, not a fault; a full
            # review gate is load, not a fault either
            race, busy = exc.reason == "not_yet_dispatched", exc.reason == "busy"
            level = logging.INFO if race else logging.WARNING if busy else logging.ERROR
            log.log(level, "exchange undecided: error_id=%s reason=%s %s", error_id, exc.reason, exc.detail)
            # the race ends at the scheduler's next loop (about a second): ask again soon
            retry_after = (NOT_YET_DISPATCHED_RETRY_AFTER_SECONDS if race else BUSY_RETRY_AFTER_SECONDS if busy
                           else RETRY_AFTER_SECONDS)
            metrics.incr(f"leoflow.exchange.undecided.{exc.reason}")
            return Answer(503, {"error_id": error_id}, {**_NO_STORE, "Retry-After": str(retry_after)})
        except Exception:  # noqa: BLE001 - a defect: logged in full, answered like an undecided exchange
            log.exception("exchange failed unexpectedly: error_id=%s", error_id)
            metrics.incr("leoflow.exchange.undecided.unexpected")
            return Answer(503, {"error_id": error_id}, {**_NO_STORE, "Retry-After": str(RETRY_AFTER_SECONDS)})
        metrics.incr("leoflow.exchange.ok")
        return Answer(200, encode_grant(grant), dict(_NO_STORE))

    def close(self) -> None:
        """Run the closers once each (errors logged, not raised)."""
        closers, self._closers = self._closers, ()
        for close in closers:
            try:
                close()
            except Exception:  # noqa: BLE001 - shutting down
                log.warning("exchange: closing %r failed", close, exc_info=True)


# ---------------------------------------------------------------------------------------------- Airflow glue


def build_generator() -> Any:
    """A ``JWTGenerator`` built exactly like ``BaseExecutor.jwt_generator`` (Airflow 3.3.2
    ``executors/base_executor.py``; the execution API's own ``_jwt_generator`` is the same):
    ``valid_for=[execution_api] jwt_expiration_time``, ``audience=`` the first ``[execution_api] jwt_audience``,
    ``issuer=[api_auth] jwt_issuer``, ``**get_signing_args(make_secret_key_if_needed=False)``.

    Called in the plugin app's lifespan (never at import). Raises ``ValueError`` when neither ``[api_auth]
    jwt_private_key_path`` nor ``jwt_secret`` is set (Airflow's own message), ``OSError`` when the key file
    cannot be read.
    """
    from airflow.api_fastapi.auth.tokens import JWTGenerator, get_signing_args
    from airflow.configuration import conf

    return JWTGenerator(
        valid_for=conf.getint("execution_api", "jwt_expiration_time"),
        audience=conf.get_mandatory_list_value("execution_api", "jwt_audience")[0],
        issuer=conf.get("api_auth", "jwt_issuer", fallback=None),
        **get_signing_args(make_secret_key_if_needed=False),
    )


def airflow_minter(generator: Any) -> Minter:
    """A :data:`Minter` over ``generator``: the attempt's stored workload (token stripped at dispatch) as an
    ``ExecuteTask`` with ``token = ExecuteTask.generate_token(ti_id, generator)`` (``sub=ti_id``,
    ``scope=workload``, valid ``[scheduler] task_queued_timeout``: Airflow's own workload token), dumped to
    JSON. The rebuild raises ``ValueError`` when the stored JSON is not an ``ExecuteTask`` of that ``ti_id``.
    """
    from airflow.executors.workloads import ExecuteTask

    def mint(attempt: Any) -> str:
        ti_id = attempt.ref.ti_id
        stored = json.loads(attempt.workload_json)
        if not isinstance(stored, dict):
            raise ValueError("the stored workload is not a JSON object")
        token = ExecuteTask.generate_token(ti_id, generator)
        workload = ExecuteTask.model_validate({**stored, "token": token})
        if str(workload.ti.id) != ti_id:
            raise ValueError(f"the stored workload is of ti {workload.ti.id}, not {ti_id}")
        return workload.model_dump_json()

    return mint


def from_airflow(*, ledger: ExchangeLedger | None = None, kube: KubeReader | None = None,
                 get: Callable[[str, str, str], str] | None = None) -> ExchangeService:
    """The exchange this api-server worker serves, built from Airflow's config (the plugin app's lifespan).

    ``[leoflow] runtime`` other than ``kubernetes``: no exchange, every request refused (``disabled``).
    Otherwise the settings (:func:`leoflow_airflow.settings.load_exchange`: the same ``[leoflow]`` Kubernetes
    group the scheduler builds pods from), a JWT generator (:func:`build_generator`), a Kubernetes client
    (``[leoflow] in_cluster``, else ``kube_config``) and a ledger
    store on Airflow's metadata DB; when one of them cannot be built the reason is logged as an error and
    every request is answered 503 (``not_configured`` / ``cannot_mint``), so the api-server itself still
    starts. ``ledger``, ``kube`` and ``get`` replace the real ones (tests). Never raises.
    """
    from leoflow_airflow import settings as leoflow_settings

    try:
        cfg = leoflow_settings.load_exchange(get)
    except ConfigError as exc:
        log.error("leoflow token exchange off: %s", exc)
        return ExchangeService(None, off=("not_configured", str(exc)))
    if cfg is None:
        return ExchangeService(None, off=("disabled", "[leoflow] runtime is not kubernetes"))
    try:
        mint = airflow_minter(build_generator())
    except Exception as exc:  # noqa: BLE001 - logged; the api-server keeps serving everything else
        log.error("leoflow token exchange cannot mint workload tokens: %s: %s (set [api_auth] jwt_secret or "
                  "[api_auth] jwt_private_key_path, the same as the scheduler's)", type(exc).__name__, exc)
        return ExchangeService(None, off=("cannot_mint", f"{type(exc).__name__}: {exc}"))
    closers: list[Callable[[], None]] = []
    try:
        if kube is None:
            from leoflow_airflow.runtime.kubernetes.review import KubeClient

            client = KubeClient.from_config(in_cluster=cfg.in_cluster, kube_config=cfg.kube_config,
                                            timeout=cfg.exchange_timeout_seconds)
            closers.append(client.close)
            kube = client
        if ledger is None:
            from leoflow_airflow.ledger.store import LedgerStore

            store = LedgerStore.from_airflow()
            closers.append(store.dispose)
            ledger = store
    except Exception as exc:  # noqa: BLE001 - logged; the api-server keeps serving everything else
        log.error("leoflow token exchange off: %s: %s", type(exc).__name__, exc)
        for close in closers:
            close()
        return ExchangeService(None, off=("not_configured", f"{type(exc).__name__}: {exc}"))
    log.info("leoflow token exchange serving %s (audience %s)", cfg.service_account_username, cfg.exchange_audience)
    return ExchangeService(Exchange(config=cfg, kube=kube, ledger=ledger, mint=mint), closers=tuple(closers))


# ------------------------------------------------------------------------- the scheduler's start() check

_SIGNING_KEYS = ("jwt_secret", "jwt_private_key_path")
_SOURCE_SUFFIXES = ("", "_cmd", "_secret")


def signing_configured(environ: Mapping[str, str], config_file: str | None) -> bool:
    """Whether the operator configured a signing key Airflow shares between processes: ``[api_auth]
    jwt_secret`` or ``jwt_private_key_path``, directly or as its ``_cmd``/``_secret`` form, non-empty, in the
    environment (``AIRFLOW__API_AUTH__…``) or in the config file ``config_file`` (None or unreadable: not
    there).

    Asked of the sources rather than of ``conf``: ``BaseExecutor.__init__`` makes up a random per-process
    ``jwt_secret`` when none is configured and sets it into ``conf``, so ``conf`` always has one in a scheduler.
    """
    for key in _SIGNING_KEYS:
        for suffix in _SOURCE_SUFFIXES:
            if environ.get(f"AIRFLOW__API_AUTH__{(key + suffix).upper()}", "").strip():
                return True
    if not config_file:
        return False
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    try:
        parser.read(config_file, encoding="utf-8")
    except (OSError, configparser.Error, UnicodeDecodeError):
        return False
    if not parser.has_section("api_auth"):
        return False
    return any(parser.get("api_auth", key + suffix, fallback="").strip()
               for key in _SIGNING_KEYS for suffix in _SOURCE_SUFFIXES)


def check_can_mint(*, environ: Mapping[str, str] | None = None, config_file: str | None = None) -> None:
    """Refuse a scheduler whose api-servers could not mint tokens the Execution API accepts (issue 9 item 3).

    The Kubernetes runtime's tokens are minted by the api-server at exchange time and validated by every
    api-server worker and replica, so all of them and the scheduler must share ``[api_auth] jwt_secret`` or
    ``[api_auth] jwt_private_key_path``. Checked in the executor's ``start()`` when ``[leoflow] runtime =
    kubernetes``. ``environ`` defaults to ``os.environ``, ``config_file`` to Airflow's ``AIRFLOW_CONFIG``.

    :raises ConfigError: neither key is configured (the message names both), or the configured one cannot
        build a ``JWTGenerator`` (an unreadable key file, for instance).
    """
    if environ is None:
        environ = os.environ
    if config_file is None:
        from airflow.configuration import AIRFLOW_CONFIG

        config_file = AIRFLOW_CONFIG
    if not signing_configured(environ, config_file):
        raise ConfigError(
            "api_auth.jwt_secret", "<not set>",
            "runtime = kubernetes needs a signing key shared by the scheduler and every api-server worker and "
            "replica, because the api-server mints each pod's workload token at exchange time: set [api_auth] "
            "jwt_secret (AIRFLOW__API_AUTH__JWT_SECRET) or [api_auth] jwt_private_key_path "
            "(AIRFLOW__API_AUTH__JWT_PRIVATE_KEY_PATH) to the same value everywhere; without one, each process "
            "makes up its own secret and the tokens one mints fail validation in another")
    try:
        build_generator()
    except Exception as exc:  # noqa: BLE001 - reported with what failed
        raise ConfigError("api_auth.jwt_secret", "<configured>",
                          "the configured [api_auth] jwt_secret or jwt_private_key_path cannot mint tokens: "
                          f"{type(exc).__name__}: {exc}") from None
