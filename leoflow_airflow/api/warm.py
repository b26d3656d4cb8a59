"""Warm pods' three endpoints on the plugin app (issue 11; DESIGN "Warm pools"; routes in
:mod:`leoflow_airflow.api.app`).

A warm pod is started before any attempt exists for it (``leoflow.io/warm=true``, one DAG version per pod,
``leoflow.io/dag-version``); its agent registers once, then long-polls for an attempt the scheduler assigned to
it in the ledger (:class:`~leoflow_airflow.ledger.warm.WarmLedger`), runs it, POSTs its outcome record and polls
again. The ledger is the only channel between the scheduler and the api-server: no call goes between them.

1. ``POST /v1/warm/register`` ``{"token": <projected ServiceAccount token>}`` (the exchange's body): the
   exchange's TokenReview and pod checks (:func:`~leoflow_airflow.api.exchange.authenticate_pod`), then the pod
   has no ``deletionTimestamp`` (``pod_deleting``) and is a warm pod leoflow made (``not_warm_pod``,
   :func:`warm_pod_problem`: labels, name, no identity annotation, its anchor as controller owner; k8s review
   §1). 200 ``{"credential", "pod_uid", "dag_version_id", "await_seconds"}``. The credential is
   ``secrets.token_urlsafe(32)`` (43 characters, 256 random bits), stored only as its SHA-256 hex, and found
   again by looking that hash up (no secret is compared in Python). A pod whose row holds an attempt is refused
   (``holds_attempt``); one holding nothing gets a new credential and the old one stops working.
2. ``POST /v1/warm/await`` (``Authorization: Bearer <credential>``, body ``{"taken": <the attempt last handed
   to the worker, or null>}``; ``{}`` from an older agent): a ``busy`` row goes back to ``idle`` only when its
   attempt's outcome is known or nothing of it is left (:func:`judge_busy`; k8s review §3), is handed again with
   a fresh token when the worker says it never got it (the 200 was lost; k8s review §4), and is kept busy
   otherwise; ``last_seen_at`` is set, then the row is read every
   :data:`POLL_INTERVAL_SECONDS` for up to ``await_seconds`` (the DB calls in a worker thread, never on the event
   loop; the loop ends at the first read after the client went away). An ``assigned`` row is judged by
   :func:`judge_assignment`: a stale epoch, an attempt no longer ``dispatched`` or of another pod is unassigned
   and the wait goes on; an attempt still ``claimed`` (its scheduler has not recorded the launch yet) is waited
   for; a current ``dispatched`` one is minted a fresh workload token exactly as the exchange mints one
   (:func:`~leoflow_airflow.api.exchange.airflow_minter`), taken (guarded), and marked exchanged with credential
   id ``warm:<pod_uid>`` (``LedgerStore.record_exchange``: the same attempt is never delivered twice, by a warm
   pod or a cold one); 200 ``{"ti_id", "try_number", "attempt_epoch", "workload": {ExecuteTask JSON, token
   set}}``. Nothing by then: 204. When ``record_exchange`` changes nothing (exchanged before, or moved on) the row
   stays ``busy`` and the answer is 204: the runtime sees the busy row never report, and the worker's next await
   releases it.
3. ``POST /v1/outcome`` (bearer credential, body the outcome record exactly as :mod:`leoflow_agent.outcome`
   encodes it, with ``ti_id``/``try_number``/``attempt_epoch``): decoded (``bad_record``, 400), the worker's row
   must be ``busy`` with that attempt (``not_held``, 409), stored first-write-wins
   (``WarmLedger.store_outcome``): 200 ``{"stored": true|false}``.

Errors are ``{"error": <reason>, "error_id": <hex>}`` (reasons from the closed sets :data:`WARM_REFUSALS` and the
exchange's; the detail only in the log, under the ``error_id``): 400 ``malformed_request``/``bad_record``, 401
``unknown_credential`` (the worker exits: its row was forgotten, its pod retired), 403 for registration
refusals, 409 ``not_held``, 503 (``Retry-After``) when Kubernetes or the ledger cannot answer. Unlike the
exchange's answers these name the reason: the agent acts on it (exit on 401), and the reasons reveal nothing a
caller holding a valid credential or token does not know.

Why an opaque credential rather than a JWT: it is revoked by deleting its row (``WarmLedger.forget``), with no
expiry to choose and no key to share, and it is valid nowhere but on these two routes (a JWT signed with the
api-server's key could be mistaken for a workload token).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import re
import secrets
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from leoflow_agent import outcome as outcome_record
from leoflow_agent.warmpod import OUTCOME_PATH, WARM_AWAIT_PATH, WARM_REGISTER_PATH
from leoflow_airflow import metrics
from leoflow_airflow.api.exchange import (
    REFUSALS,
    RETRY_AFTER_SECONDS,
    Answer,
    ExchangeService,
    Minter,
    Refused,
    Unavailable,
    authenticate_pod,
    parse_json_object,
    parse_request,
)
from leoflow_airflow.ledger.states import AttemptRef, AttemptState
from leoflow_airflow.runtime.kubernetes.identity import IDENTITY_ANNOTATION
from leoflow_airflow.runtime.kubernetes.warmdecide import JOB_LABEL, WARM_LABEL
from leoflow_airflow.runtime.kubernetes.warmdecide import VERSION_LABEL as DAG_VERSION_LABEL
from leoflow_airflow.runtime.kubernetes.warmpods import anchor_name, is_warm_name

if TYPE_CHECKING:
    from leoflow_airflow.ledger.warm import WarmLedger, WarmWorker
    from leoflow_airflow.runtime.kubernetes.review import KubeReader, PodFacts
    from leoflow_airflow.settings import KubernetesSettings

__all__ = [
    "AWAIT_SECONDS",
    "MAX_AWAIT_BYTES",
    "OUTCOME_PATH",
    "POLL_INTERVAL_SECONDS",
    "WARM_AWAIT_PATH",
    "WARM_REFUSALS",
    "WARM_REGISTER_PATH",
    "WarmPods",
    "WarmRefused",
    "WarmService",
    "credential_sha256",
    "from_exchange",
    "judge_assignment",
    "warm_pod_problem",
]

log = logging.getLogger(__name__)

AWAIT_SECONDS = 20.0
"""How long one ``await`` holds the request when nothing is assigned, in seconds (told to the agent at
registration as ``await_seconds``): well under the 60 s idle timeouts of common proxies and load balancers."""
POLL_INTERVAL_SECONDS = 0.25
"""How often a held ``await`` reads its worker row, in seconds: an assignment is delivered within this (plus a
DB read) of the scheduler's write; one indexed primary-key read per waiting worker per interval."""
MAX_OUTCOME_BYTES = outcome_record.MAX_RECORD_BYTES
"""Largest ``outcome`` body read, in bytes: the largest record :mod:`leoflow_agent.outcome` ever encodes."""
MAX_AWAIT_BYTES = MAX_OUTCOME_BYTES + 1024
"""Largest ``await`` body read, in bytes: ``{"taken": …, "record": …}``, the record of the last attempt as its
worker holds it (:func:`await_record`)."""

WARM_REFUSALS: frozenset[str] = frozenset({
    "not_warm_pod",        # register: the pod is no warm pod leoflow made (warm_pod_problem)
    "pod_deleting",        # register: the pod has a deletionTimestamp
    "holds_attempt",       # register: the pod's row holds an attempt (assigned or busy)
    "unknown_credential",  # await/outcome: no worker row has that credential (401)
    "not_held",            # outcome: the worker does not hold that attempt (409)
    "bad_record",          # outcome: the body is no outcome record naming its attempt (400)
})
"""Why a warm pod's request was refused, besides the exchange's :data:`~leoflow_airflow.api.exchange.REFUSALS`."""

_STATUS = {"malformed_request": 400, "bad_record": 400, "unknown_credential": 401, "not_held": 409}
"""The HTTP status of a refusal (every other one: 403)."""

_CREDENTIAL = re.compile(r"[A-Za-z0-9_-]{43}")
_NO_STORE = {"Cache-Control": "no-store"}


class WarmRefused(Refused):
    """A warm pod's request refused for good: :class:`~leoflow_airflow.api.exchange.Refused` with the reasons
    of :data:`WARM_REFUSALS` too."""

    reasons = REFUSALS | WARM_REFUSALS


class AttemptLedger(Protocol):
    """The attempt ledger calls of the warm endpoints (``LedgerStore`` is one)."""

    def current(self, ti_id: str) -> Any:
        """The highest-epoch ``Attempt`` of ``ti_id``, or None."""
        ...

    def record_exchange(self, ref: AttemptRef, *, credential_id: str | None) -> bool:
        """The guarded "exchanged" write; whether it changed the row."""
        ...


def credential_sha256(credential: str) -> str:
    """The SHA-256 hex of ``credential``: what the ledger stores and looks a credential up by."""
    return hashlib.sha256(credential.encode("ascii")).hexdigest()


def bearer_credential(authorization: str | None) -> str:
    """The credential of an ``Authorization: Bearer <credential>`` header.

    :raises WarmRefused: ``unknown_credential`` when the header is absent, not ``Bearer``, or not a 43-character
        base64url credential (such a value is in no row: answered as an unknown one, without a DB read).
    """
    scheme, _, value = (authorization or "").strip().partition(" ")
    value = value.strip()
    if scheme.lower() != "bearer" or not _CREDENTIAL.fullmatch(value):
        raise WarmRefused("unknown_credential", "no bearer credential of the right shape")
    return value


def parse_await(body: bytes) -> None:
    """Check an ``await`` body: a JSON object (``{}``; keys are ignored), at most :data:`MAX_AWAIT_BYTES`.

    :raises WarmRefused: ``malformed_request``.
    """
    parse_json_object(body, MAX_AWAIT_BYTES, WarmRefused)


def parse_outcome(body: bytes) -> tuple[AttemptRef, str]:
    """The attempt an ``outcome`` body is of and the record's text (as sent, surrounding blanks stripped).

    :raises WarmRefused: ``bad_record`` when the body is larger than :data:`MAX_OUTCOME_BYTES`, not UTF-8, or not
        a record :func:`leoflow_agent.outcome.decode` reads, or the record lacks any of ``ti_id``,
        ``try_number``, ``attempt_epoch``.
    """
    if len(body) > MAX_OUTCOME_BYTES:
        raise WarmRefused("bad_record", f"body of {len(body)} bytes")
    try:
        text = body.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise WarmRefused("bad_record", "body is not UTF-8") from None
    record = outcome_record.decode(text)
    if record is None:
        raise WarmRefused("bad_record", "not an outcome record")
    ident = record.attempt()
    if ident is None:
        raise WarmRefused("bad_record", "the record does not name its attempt")
    return AttemptRef(ident.ti_id, ident.try_number, ident.attempt_epoch), text


def warm_pod_problem(pod: PodFacts) -> str | None:
    """Why ``pod`` (as the pod GET read it) is not a warm pod leoflow made, or None when it is one
    (:func:`leoflow_airflow.runtime.kubernetes.warmpods.build_warm_pod`): labels ``leoflow.io/warm=true``, a
    ``leoflow.io/dag-version`` that is a UUID and a ``leoflow.io/scheduler-job``; a warm pod name
    (``lfw-<job>-<12 hex of that version>-<8 hex>``); no identity annotation ``leoflow.io/attempt`` (a task pod's);
    and exactly one controller ownerReference, to the ``v1`` ConfigMap ``leoflow-warm-<job>-<version>`` (its
    anchor) of that job and version.

    Labels alone are claims any pod can make; these are what a task pod can never have: leoflow pins its name
    and identity annotation, and its own labels, which a ``pod_override`` may not set (k8s review §1). Pure.
    """
    if pod.labels.get(WARM_LABEL) != "true":
        return f"no {WARM_LABEL}=true label"
    version = pod.labels.get(DAG_VERSION_LABEL) or ""
    try:
        canonical = len(version) == 36 and str(uuid.UUID(version)) == version
    except ValueError:
        canonical = False
    if not canonical:
        return f"{DAG_VERSION_LABEL} {version[:64]!r} is not a DAG version id"
    job = pod.labels.get(JOB_LABEL) or ""
    if not is_warm_name(pod.name) or not pod.name.startswith(f"lfw-{job}-{uuid.UUID(version).hex[:12]}-"):
        return f"name {pod.name!r} is not a warm pod's of job {job[:20]!r} and version {version}"
    if IDENTITY_ANNOTATION in pod.annotations:
        return f"it carries the attempt identity annotation {IDENTITY_ANNOTATION}"
    controllers = [o for o in pod.owner_references if o.controller]
    anchor = anchor_name(job, version)
    if [(o.api_version, o.kind, o.name) for o in controllers] != [("v1", "ConfigMap", anchor)]:
        return f"its controller ownerReference is not the anchor ConfigMap {anchor}"
    return None


TAKE, WAIT, UNASSIGN = "take", "wait", "unassign"


def judge_assignment(attempt: Any, ref: AttemptRef, pod_uid: str) -> tuple[str, str]:
    """What to do with a worker row ``assigned`` ``ref``, given ``attempt``, the ledger's current attempt of
    ``ref.ti_id`` (or None): ``(TAKE | WAIT | UNASSIGN, why)``.

    - no attempt, a later epoch current (``ref`` is stale), another try, not a Kubernetes attempt, a state other
      than ``claimed``/``dispatched``, already exchanged, or recorded with another pod's UID: UNASSIGN (the
      worker goes back to idle; the scheduler's presence check sees the row let go of the attempt);
    - ``claimed``: WAIT (the scheduler assigns, then records the launch ``dispatched`` when ``launch()``
      returns: the same race as the exchange's ``not_yet_dispatched``);
    - else TAKE.
    """
    if attempt is None:
        return UNASSIGN, "the ledger has no attempt of that ti_id"
    if attempt.ref != ref:
        return UNASSIGN, f"stale: the ledger's current attempt is {attempt.ref}"
    if attempt.runtime != "kubernetes":
        return UNASSIGN, f"runtime {attempt.runtime}"
    if attempt.exchanged_at is not None:
        return UNASSIGN, f"exchanged before, with credential {attempt.exchange_credential_id}"
    if attempt.state is AttemptState.CLAIMED:
        return WAIT, "the attempt is still claimed"
    if attempt.state is not AttemptState.DISPATCHED:
        return UNASSIGN, f"state {attempt.state.value}"
    if attempt.pod_uid is not None and attempt.pod_uid != pod_uid:
        return UNASSIGN, f"the ledger recorded pod uid {attempt.pod_uid}"
    return TAKE, ""


UNSAID = object()
"""The ``taken`` of an ``await`` whose body does not say which attempt the worker took last (an older agent)."""
RELEASE, HOLD, REDELIVER = "release", "hold", "redeliver"


def await_taken(body: bytes) -> AttemptRef | None | object:
    """The attempt an ``await`` body says its worker took last: ``{"taken": {"ti_id", "try_number",
    "attempt_epoch"}}`` → that ref, ``{"taken": null}`` → None (it took none since it registered), anything else
    (no ``taken`` key, a malformed one, a body that is no JSON object) → :data:`UNSAID`. Never raises: the body
    is checked by :func:`parse_await`."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        return UNSAID
    if not isinstance(data, dict) or "taken" not in data:
        return UNSAID
    taken = data["taken"]
    if taken is None:
        return None
    if not isinstance(taken, dict):
        return UNSAID
    ti_id, try_number, epoch = taken.get("ti_id"), taken.get("try_number"), taken.get("attempt_epoch")
    if not isinstance(ti_id, str) or not ti_id or any(
            isinstance(v, bool) or not isinstance(v, int) for v in (try_number, epoch)):
        return UNSAID
    return AttemptRef(ti_id, try_number, epoch)


def await_record(body: bytes) -> tuple[AttemptRef, str] | None:
    """The outcome record an ``await`` body carries (``{"record": "<record JSON>"}``: the worker's copy of its last
    attempt's record, sent again on every await until its row is released, k8s review §3) as ``(the attempt it
    names, its text)``; None when the body carries none, or one :mod:`leoflow_agent.outcome` does not read or
    that names no attempt. Never raises: the body is checked by :func:`parse_await`."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        return None
    text = data.get("record") if isinstance(data, dict) else None
    if not isinstance(text, str) or not text.strip():
        return None
    record = outcome_record.decode(text.strip())
    ident = None if record is None else record.attempt()
    if ident is None:
        return None
    return AttemptRef(ident.ti_id, ident.try_number, ident.attempt_epoch), text.strip()


def judge_busy(attempt: Any, ref: AttemptRef, pod_uid: str, *, outcome_stored: bool,
               taken: AttemptRef | None | object) -> tuple[str, str]:
    """What an ``await`` does with its worker's ``busy`` row holding ``ref``, given ``attempt`` (the ledger's
    current attempt of ``ref.ti_id``, or None), whether ``ref``'s outcome record is stored, and ``taken`` (what
    the worker says it took last, :func:`await_taken`): ``(RELEASE | HOLD | REDELIVER, why)``.

    - RELEASE (the row goes back to idle): the attempt moved on (none, a newer epoch, a state past
      ``dispatched``: its report landed or it was settled), its outcome record is stored, or it was never
      delivered to this worker (not exchanged as ``warm:<pod_uid>``): nothing of it is left to lose here;
    - REDELIVER (the same attempt handed again, with a fresh workload token): the worker says it took another
      attempt, or none, so the answer that delivered ``ref`` was lost on its way (k8s review §4);
    - HOLD (the row stays busy, so the scheduler keeps reading the attempt as live, never GONE): the outcome is
      unknown and the worker ran it, or does not say (k8s review §3: releasing would read GONE, and an attempt
      whose body completed would be re-driven). It is released once the record lands or the attempt moves on.
    """
    if attempt is None or attempt.ref != ref:
        return RELEASE, "the attempt moved on"
    if attempt.state is not AttemptState.DISPATCHED:
        return RELEASE, f"state {attempt.state.value}"
    if outcome_stored:
        return RELEASE, "its outcome record is stored"
    if attempt.exchanged_at is None or attempt.exchange_credential_id != f"warm:{pod_uid}":
        return RELEASE, "it was never delivered to this worker"
    if taken is UNSAID:
        return HOLD, "its outcome is unknown and the worker does not say what it took"
    if taken == ref:
        return HOLD, "its outcome is unknown (the worker ran it; its record did not land)"
    return REDELIVER, f"the worker took {taken} last: the answer that delivered it was lost"


@dataclass(frozen=True)
class _Stop:
    """A poll that ends the await with 204 (the assignment was taken, but its exchange write changed nothing)."""

    why: str


class WarmPods:
    """The three endpoints' decisions over their seams (Kubernetes, the worker rows, the attempt ledger, the
    minter); blocking, thread-safe as its seams are, no state of its own.

    :param config: the ``[leoflow]`` Kubernetes group (namespace, ServiceAccount, exchange audience).
    :param kube: TokenReview and pod GET.
    :param workers: the worker rows (:class:`~leoflow_airflow.ledger.warm.WarmLedger`).
    :param attempts: the attempt ledger (:class:`AttemptLedger`).
    :param mint: rebuilds an attempt's stored workload with a fresh workload token (the exchange's minter).
    :param new_credential: makes a credential (default ``secrets.token_urlsafe(32)``).
    """

    def __init__(self, *, config: KubernetesSettings, kube: KubeReader, workers: WarmLedger,
                 attempts: AttemptLedger, mint: Minter,
                 new_credential: Callable[[], str] = lambda: secrets.token_urlsafe(32)) -> None:
        """Keep the seams; nothing is called yet."""
        self.config = config
        self.kube = kube
        self.workers = workers
        self.attempts = attempts
        self.mint = mint
        self.new_credential = new_credential

    def register(self, token: str, *, await_seconds: float) -> dict[str, Any]:
        """Register the warm pod ``token`` is bound to; the 200 body.

        :raises Refused: the exchange's review and pod refusals, ``pod_deleting``, ``not_warm_pod`` (no warm pod
            leoflow made, :func:`warm_pod_problem`; no worker row is written), ``holds_attempt``.
        :raises Unavailable: ``kube_unavailable``, ``ledger_unavailable``.
        """
        bound = authenticate_pod(self.config, self.kube, token)
        pod, where = bound.pod, bound.where
        if pod.deletion_timestamp is not None:
            raise WarmRefused("pod_deleting", f"{where}: deletionTimestamp {pod.deletion_timestamp.isoformat()}")
        if (problem := warm_pod_problem(pod)) is not None:
            raise WarmRefused("not_warm_pod", f"{where}: {problem}")
        version = pod.labels[DAG_VERSION_LABEL]
        credential = self.new_credential()
        changed = _ledger(where, lambda: self.workers.register(
            pod_uid=pod.uid, pod_name=pod.name, namespace=self.config.namespace, dag_version_id=version,
            credential_sha256=credential_sha256(credential)))
        if not changed:
            raise WarmRefused("holds_attempt", f"{where}: its worker row holds an attempt")
        log.info("warm pod %s/%s (uid %s, DAG version %s) registered", self.config.namespace, pod.name, pod.uid,
                 version)
        seconds = int(await_seconds) if float(await_seconds).is_integer() else await_seconds
        return {"credential": credential, "pod_uid": pod.uid, "dag_version_id": version, "await_seconds": seconds}

    def worker(self, credential: str) -> WarmWorker:
        """The worker row of ``credential``.

        :raises WarmRefused: ``unknown_credential``.
        :raises Unavailable: ``ledger_unavailable``.
        """
        found = _ledger("credential lookup", lambda: self.workers.by_credential(credential_sha256(credential)))
        if found is None:
            raise WarmRefused("unknown_credential", "no worker row has that credential")
        return found

    def begin_await(self, credential: str, *, taken: AttemptRef | None | object = UNSAID,
                    record: tuple[AttemptRef, str] | None = None) -> WarmWorker:
        """The first step of an ``await``: the worker of ``credential``, marked seen; a ``record`` the body carries
        (:func:`await_record`) of the attempt the row holds is stored first (first write wins), so an in-band
        record whose own POST was lost still lands; then a ``busy`` row is released only when :func:`judge_busy`
        says RELEASE (its attempt's outcome is known, or nothing of it is left here; k8s review §3), else kept
        (:meth:`redeliver` then decides whether to hand it again). ``taken``: :func:`await_taken` of the body.
        Returns the row as read before any release. Raises as :meth:`worker`."""
        worker = self.worker(credential)
        where = f"warm pod {worker.namespace}/{worker.pod_name} (uid {worker.pod_uid})"
        if record is not None and worker.state in ("busy", "killing") and worker.ref == record[0]:
            if _ledger(where, lambda: self.workers.store_outcome(record[0], record[1])):
                log.info("%s: outcome record of %s stored from its await", where, record[0])
        if worker.state == "busy" and worker.ref is not None:
            verdict, why = self._judge_busy(worker.pod_uid, worker.ref, taken, where)
            if verdict != RELEASE:
                log.info("%s keeps attempt %s (%s)", where, worker.ref, why)
            elif _ledger(where, lambda: self.workers.release(worker.pod_uid)):
                log.info("%s released attempt %s (%s)", where, worker.ref, why)
        _ledger(where, lambda: self.workers.seen(worker.pod_uid))
        return worker

    def _judge_busy(self, pod_uid: str, ref: AttemptRef, taken: AttemptRef | None | object,
                    where: str) -> tuple[str, str]:
        """:func:`judge_busy` of ``pod_uid``'s busy row holding ``ref``, over the ledger (two reads)."""
        attempt = _ledger(where, lambda: self.attempts.current(ref.ti_id))
        stored = ref in _ledger(where, lambda: self.workers.outcomes([ref]))
        return judge_busy(attempt, ref, pod_uid, outcome_stored=stored, taken=taken)

    def redeliver(self, pod_uid: str, taken: AttemptRef | None | object) -> dict[str, Any] | None:
        """The 200 body handing ``pod_uid``'s busy attempt again, with a workload token minted now, when
        :func:`judge_busy` says REDELIVER (the answer that delivered it was lost: k8s review §4); None
        otherwise (the row is not busy, or the verdict is another). A stored workload that cannot be rebuilt is
        logged and None (the row stays busy: the runtime settles the attempt).

        :raises Unavailable: ``ledger_unavailable``.
        """
        where = f"warm pod uid {pod_uid}"
        worker = _ledger(where, lambda: self.workers.get(pod_uid))
        if worker is None or worker.state != "busy" or worker.ref is None:
            return None
        ref = worker.ref
        where = f"warm pod {worker.namespace}/{worker.pod_name} (uid {pod_uid}) busy {ref}"
        verdict, why = self._judge_busy(pod_uid, ref, taken, where)
        if verdict != REDELIVER:
            return None
        attempt = _ledger(where, lambda: self.attempts.current(ref.ti_id))
        try:
            workload = json.loads(self.mint(attempt))
        except ValueError as exc:
            log.error("%s: the stored workload cannot be rebuilt (%s: %s)", where, type(exc).__name__, exc)
            return None
        log.warning("%s: delivered again (%s)", where, why)
        return {"ti_id": ref.ti_id, "try_number": ref.try_number, "attempt_epoch": ref.attempt_epoch,
                "workload": workload}

    def poll(self, pod_uid: str) -> dict[str, Any] | _Stop | None:
        """One read of the worker row ``pod_uid`` during an ``await``: the 200 body when an assignment was
        delivered (:func:`judge_assignment` said TAKE, the take and the exchange write both changed their rows),
        a ``_Stop`` when the take changed but the exchange write did not (answer 204), None to keep waiting.

        :raises WarmRefused: ``unknown_credential`` when the row was forgotten meanwhile.
        :raises Unavailable: ``ledger_unavailable``.
        """
        where = f"warm pod uid {pod_uid}"
        worker = _ledger(where, lambda: self.workers.get(pod_uid))
        if worker is None:
            raise WarmRefused("unknown_credential", f"{where}: the worker row was deleted")
        if worker.state != "assigned" or worker.ref is None:
            return None
        ref = worker.ref
        where = f"warm pod {worker.namespace}/{worker.pod_name} (uid {pod_uid}) assigned {ref}"
        attempt = _ledger(where, lambda: self.attempts.current(ref.ti_id))
        verdict, why = judge_assignment(attempt, ref, pod_uid)
        if verdict == WAIT:
            return None
        if verdict == UNASSIGN:
            if _ledger(where, lambda: self.workers.unassign(pod_uid, ref)):
                log.warning("%s: unassigned (%s)", where, why)
            return None
        try:
            workload = json.loads(self.mint(attempt))
        except ValueError as exc:
            log.error("%s: the stored workload cannot be rebuilt (%s: %s); unassigned", where, type(exc).__name__,
                      exc)
            _ledger(where, lambda: self.workers.unassign(pod_uid, ref))
            return None
        if not _ledger(where, lambda: self.workers.take(pod_uid, ref)):
            return None  # unassigned meanwhile, or taken by a concurrent await of this worker
        if not _ledger(where, lambda: self.attempts.record_exchange(ref, credential_id=f"warm:{pod_uid}")):
            return _Stop(f"{where}: taken, but the attempt was exchanged before or moved on")
        log.info("%s: delivered", where)
        return {"ti_id": ref.ti_id, "try_number": ref.try_number, "attempt_epoch": ref.attempt_epoch,
                "workload": workload}

    def outcome(self, credential: str, ref: AttemptRef, text: str) -> bool:
        """Store the outcome record ``text`` of ``ref`` sent by the worker of ``credential``; whether it was
        stored (False: a record was stored before).

        :raises WarmRefused: ``unknown_credential``; ``not_held`` when the worker is not ``busy`` with ``ref``
            (or ``killing`` it: an attempt that ended within its kill's grace still delivers its record).
        :raises Unavailable: ``ledger_unavailable``.
        """
        worker = self.worker(credential)
        where = f"warm pod {worker.namespace}/{worker.pod_name} (uid {worker.pod_uid})"
        if worker.state not in ("busy", "killing") or worker.ref != ref:
            raise WarmRefused("not_held", f"{where}: {worker.state} {worker.ref}, record of {ref}")
        stored = _ledger(where, lambda: self.workers.store_outcome(ref, text))
        log.info("%s: outcome record of %s %s", where, ref, "stored" if stored else "already stored (kept)")
        return stored


def _ledger(where: str, call: Callable[[], Any]) -> Any:
    """``call()``; any database error is :class:`Unavailable` ``ledger_unavailable`` (undecided, never a
    refusal)."""
    try:
        return call()
    except Exception as exc:  # noqa: BLE001 - any database error
        raise Unavailable("ledger_unavailable", f"{where}: {type(exc).__name__}: {str(exc)[:200]}") from None


class WarmService:
    """What the routes call: request in, :class:`~leoflow_airflow.api.exchange.Answer` out. Every refusal and
    undecided request is logged under a fresh ``error_id`` with its reason and detail; the answer carries the
    reason and that id.

    :param pods: the decisions, or None when this api-server serves no warm pods (``off``: ``(reason,
        detail)``, the exchange's).
    :param await_seconds: how long an ``await`` is held (:data:`AWAIT_SECONDS`).
    :param poll_interval: the row read interval of a held ``await`` (:data:`POLL_INTERVAL_SECONDS`).
    """

    def __init__(self, pods: WarmPods | None, *, off: tuple[str, str] = ("disabled", ""),
                 await_seconds: float = AWAIT_SECONDS, poll_interval: float = POLL_INTERVAL_SECONDS) -> None:
        """Keep ``pods`` (or the reason there is none) and the await timing."""
        if await_seconds <= 0 or poll_interval <= 0:
            raise ValueError("await_seconds and poll_interval must be > 0")
        self.pods = pods
        self.off = off
        self.await_seconds = await_seconds
        self.poll_interval = poll_interval

    def _serving(self) -> WarmPods:
        if self.pods is None:
            reason, detail = self.off
            if reason in REFUSALS:
                raise Refused(reason, detail)
            raise Unavailable(reason, detail)
        return self.pods

    def register(self, body: bytes) -> Answer:
        """Answer a ``register`` body (blocking). Never raises."""
        def run() -> Answer:
            token = parse_request(body)
            return Answer(200, self._serving().register(token, await_seconds=self.await_seconds), dict(_NO_STORE))
        return self._answer("register", run)

    def outcome(self, authorization: str | None, body: bytes) -> Answer:
        """Answer an ``outcome`` request (blocking). Never raises."""
        def run() -> Answer:
            credential = bearer_credential(authorization)
            pods = self._serving()
            ref, text = parse_outcome(body)
            return Answer(200, {"stored": pods.outcome(credential, ref, text)}, dict(_NO_STORE))
        return self._answer("outcome", run)

    async def await_(self, authorization: str | None, body: bytes,
                     disconnected: Callable[[], Awaitable[bool]], *,
                     to_thread: Callable[..., Awaitable[Any]] | None = None,
                     sleep: Callable[[float], Awaitable[None]] | None = None,
                     monotonic: Callable[[], float] = time.monotonic) -> Answer:
        """Answer an ``await`` (the long poll; see the module docstring). Every ledger call runs through
        ``to_thread`` (default ``anyio.to_thread.run_sync``), the waits through ``sleep`` (``anyio.sleep``); the
        loop ends when ``disconnected()`` says the client went away (checked before each wait), answering 204
        to nobody. Never raises but for cancellation."""
        import anyio

        to_thread = to_thread or anyio.to_thread.run_sync
        sleep = sleep or anyio.sleep
        error_id = uuid.uuid4().hex
        try:
            credential = bearer_credential(authorization)
            parse_await(body)
            taken = await_taken(body)
            pods = self._serving()
            worker = await to_thread(functools.partial(pods.begin_await, credential, taken=taken,
                                                       record=await_record(body)))
            if worker.state == "busy":
                again = await to_thread(pods.redeliver, worker.pod_uid, taken)
                if again is not None:
                    metrics.incr("leoflow.warm.await.delivered")
                    return Answer(200, again, dict(_NO_STORE))
            deadline = monotonic() + self.await_seconds
            while True:
                got = await to_thread(pods.poll, worker.pod_uid)
                if isinstance(got, _Stop):
                    log.warning("warm await: %s", got.why)
                    metrics.incr("leoflow.warm.await.lost")
                    return Answer(204, {}, dict(_NO_STORE))
                if got is not None:
                    metrics.incr("leoflow.warm.await.delivered")
                    return Answer(200, got, dict(_NO_STORE))
                if monotonic() >= deadline:
                    return Answer(204, {}, dict(_NO_STORE))
                if await disconnected():
                    log.debug("warm await of pod uid %s: the client went away", worker.pod_uid)
                    return Answer(204, {}, dict(_NO_STORE))
                await sleep(self.poll_interval)
        except (Refused, Unavailable) as exc:
            return _error("await", error_id, exc)
        except Exception:  # noqa: BLE001 - a defect: logged in full, answered as undecided
            log.exception("warm await failed unexpectedly: error_id=%s", error_id)
            return Answer(503, {"error": "unexpected", "error_id": error_id},
                          {**_NO_STORE, "Retry-After": str(RETRY_AFTER_SECONDS)})

    @staticmethod
    def _answer(what: str, run: Callable[[], Answer]) -> Answer:
        error_id = uuid.uuid4().hex
        try:
            answer = run()
        except (Refused, Unavailable) as exc:
            return _error(what, error_id, exc)
        except Exception:  # noqa: BLE001 - a defect: logged in full, answered as undecided
            log.exception("warm %s failed unexpectedly: error_id=%s", what, error_id)
            return Answer(503, {"error": "unexpected", "error_id": error_id},
                          {**_NO_STORE, "Retry-After": str(RETRY_AFTER_SECONDS)})
        metrics.incr(f"leoflow.warm.{what}.ok")
        return answer


def _error(what: str, error_id: str, exc: Refused | Unavailable) -> Answer:
    """The error answer of ``exc`` (logged under ``error_id``)."""
    if isinstance(exc, Refused):
        status = 403 if what == "register" and exc.reason == "malformed_request" else _STATUS.get(exc.reason, 403)
        log.warning("warm %s refused: error_id=%s reason=%s %s", what, error_id, exc.reason, exc.detail)
        metrics.incr(f"leoflow.warm.{what}.denied.{exc.reason}")
        return Answer(status, {"error": exc.reason, "error_id": error_id}, dict(_NO_STORE))
    log.error("warm %s undecided: error_id=%s reason=%s %s", what, error_id, exc.reason, exc.detail)
    metrics.incr(f"leoflow.warm.{what}.undecided.{exc.reason}")
    return Answer(503, {"error": exc.reason, "error_id": error_id},
                  {**_NO_STORE, "Retry-After": str(RETRY_AFTER_SECONDS)})


def from_exchange(service: ExchangeService, *, await_seconds: float = AWAIT_SECONDS,
                  poll_interval: float = POLL_INTERVAL_SECONDS) -> WarmService:
    """The warm endpoints of this api-server worker, on the exchange's own parts (the plugin app's lifespan):
    its settings, Kubernetes client and minter, and a :class:`~leoflow_airflow.ledger.warm.WarmLedger` on its
    ledger store's engine (one pool per worker). Off for the exchange's reason when the exchange is off, and
    ``not_configured`` when its ledger has no engine. Never raises."""
    exchange = service.exchange
    if exchange is None:
        return WarmService(None, off=service.off, await_seconds=await_seconds, poll_interval=poll_interval)
    engine = getattr(exchange.ledger, "engine", None)
    if engine is None:
        log.error("leoflow warm pods off: the exchange's ledger %r has no engine", exchange.ledger)
        return WarmService(None, off=("not_configured", "the exchange's ledger has no engine"),
                           await_seconds=await_seconds, poll_interval=poll_interval)
    from leoflow_airflow.ledger.warm import WarmLedger

    pods = WarmPods(config=exchange.config, kube=exchange.kube, workers=WarmLedger(engine),
                    attempts=exchange.ledger, mint=exchange.mint)
    return WarmService(pods, await_seconds=await_seconds, poll_interval=poll_interval)
