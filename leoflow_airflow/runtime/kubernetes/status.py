"""What leoflow reads of a task pod's status: a :class:`PodView`, and from it the attempt's evidence.

A pod's status is read from its JSON (the camelCase API dict a watch event or a raw LIST carries), never from a
deserialized ``V1Pod``: the informer builds one view per event for up to thousands of pods, and a plain dict
read is cheap. Every reader here is total: a malformed or partial object gives a view with ``None`` fields (or
no view at all when it has no name/UID), never an exception.

Evidence follows the facts file's requirement 12, in this order (DESIGN §2 "Evidence"):

1. the agent container's ``state.terminated.message``: the outcome record (``leoflow_agent.outcome.decode``);
2. the agent container's terminated ``reason`` (``OOMKilled``, ``Error``) and exit code;
3. the pod's ``status.reason`` (``Evicted``, ``DeadlineExceeded``) and the ``DisruptionTarget`` reason;
4. the phase.

Only (1) and the exit code feed the lifecycle's table (:func:`pod_evidence`, the same :class:`Evidence` Lite
produces); (2)-(4) are named in logs (:func:`describe_end`). Pure module: no I/O, no Kubernetes client.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from leoflow_agent import outcome
from leoflow_airflow.ledger.states import AttemptRef
from leoflow_airflow.lifecycle.runtime import MAX_DETAIL_CHARS, Evidence
from leoflow_airflow.runtime.kubernetes.identity import IDENTITY_ANNOTATION, parse_identity_annotation
from leoflow_airflow.runtime.kubernetes.pod import AGENT_CONTAINER

__all__ = ["TERMINAL_PHASES", "ContainerEnd", "PodView", "describe_end", "pod_evidence", "pod_view"]

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
"""Pod phases a pod never leaves (``restartPolicy: Never``): its containers have all terminated."""

DISRUPTION_TARGET = "DisruptionTarget"
"""The pod condition type Kubernetes sets (status True) before it disrupts a pod; its ``reason`` says why
(``EvictionByEvictionAPI``, ``PreemptionByScheduler``, ``DeletionByTaintManager``, ``DeletionByPodGC``,
``TerminationByKubelet``)."""


@dataclass(frozen=True, slots=True)
class ContainerEnd:
    """The agent container's ``state.terminated``: ``exit_code`` (``exitCode``), ``reason`` (``OOMKilled``,
    ``Error``, ``Completed``, ...) and ``message`` (the termination message: the outcome record, possibly with a
    runtime prefix or cut), each ``None`` when absent or of the wrong type."""

    exit_code: int | None
    reason: str | None
    message: str | None


@dataclass(frozen=True, slots=True)
class PodView:
    """What leoflow needs of one pod, read from its JSON by :func:`pod_view`. Immutable: the informer hands
    the same object to every reader.

    :param name: ``metadata.name``.
    :param uid: ``metadata.uid``.
    :param namespace: ``metadata.namespace`` ("" when the object carried none).
    :param ref: the attempt of the identity annotation (``identity.parse_identity_annotation``), None when
        the pod carries no valid one.
    :param phase: ``status.phase`` (Pending/Running/Succeeded/Failed/Unknown) or None.
    :param deleting: ``metadata.deletionTimestamp`` is set (graceful deletion under way).
    :param node_name: ``spec.nodeName`` or None (not bound yet).
    :param reason: ``status.reason`` (``Evicted``, ``DeadlineExceeded``, ...) or None.
    :param disruption: the reason of condition ``DisruptionTarget`` whose status is ``"True"``, or None.
    :param agent: the agent container's (:data:`~leoflow_airflow.runtime.kubernetes.pod.AGENT_CONTAINER`)
        ``state.terminated``, None while it has not terminated (or has no status).
    :param waiting_reason: the agent container's ``state.waiting.reason`` (``ErrImagePull``,
        ``ImagePullBackOff``, ``CreateContainerConfigError``, ...) or None.
    :param waiting_message: its ``state.waiting.message`` or None.
    :param started_at: ``status.startTime`` (aware UTC) or None; ``activeDeadlineSeconds`` counts from it.
    :param finished_at: the agent container's ``terminated.finishedAt`` (aware UTC) or None; pod retention
        counts from it.
    :param resource_version: ``metadata.resourceVersion`` (opaque: never compared) or None.
    :param message: ``status.message`` (e.g. the kubelet's eviction or deadline text) or None.
    :param finalizers: ``metadata.finalizers`` in order (strings only), ``()`` for none; the runtime releases
        ``pod.OUTCOME_FINALIZER`` by its index here.
    """

    name: str
    uid: str
    namespace: str
    ref: AttemptRef | None
    phase: str | None
    deleting: bool
    node_name: str | None
    reason: str | None
    disruption: str | None
    agent: ContainerEnd | None
    waiting_reason: str | None
    waiting_message: str | None
    started_at: datetime | None
    finished_at: datetime | None
    resource_version: str | None
    message: str | None = None
    finalizers: tuple[str, ...] = ()

    @property
    def terminal(self) -> bool:
        """The phase is Succeeded or Failed: nothing of the pod runs any more (proof of death by status)."""
        return self.phase in TERMINAL_PHASES


def _map(value: Any) -> Mapping[str, Any]:
    """``value`` when it is a mapping, else an empty one."""
    return value if isinstance(value, Mapping) else {}


def _str(value: Any) -> str | None:
    """``value`` when it is a non-empty string, else None."""
    return value if isinstance(value, str) and value else None


def _int(value: Any) -> int | None:
    """``value`` when it is an int (not a bool), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _time(value: Any) -> datetime | None:
    """An RFC3339 API timestamp as aware UTC, None for anything else (``outcome.parse_rfc3339``)."""
    return outcome.parse_rfc3339(value) if isinstance(value, str) else None


def _agent_status(status: Mapping[str, Any]) -> Mapping[str, Any]:
    """The ``containerStatuses`` entry of the agent container, or an empty mapping."""
    statuses = status.get("containerStatuses")
    if isinstance(statuses, list):
        for entry in statuses:
            if isinstance(entry, Mapping) and entry.get("name") == AGENT_CONTAINER:
                return entry
    return {}


def _disruption(status: Mapping[str, Any]) -> str | None:
    """The reason of the ``DisruptionTarget`` condition whose status is ``"True"`` ("" reason: the type)."""
    conditions = status.get("conditions")
    if isinstance(conditions, list):
        for cond in conditions:
            if isinstance(cond, Mapping) and cond.get("type") == DISRUPTION_TARGET and cond.get("status") == "True":
                return _str(cond.get("reason")) or DISRUPTION_TARGET
    return None


def pod_view(obj: Mapping[str, Any]) -> PodView | None:
    """The :class:`PodView` of a pod given as its JSON dict (camelCase keys, as the API serves it).

    None when ``obj`` is not a mapping or lacks a string ``metadata.name`` or ``metadata.uid`` (nothing can
    be keyed on it); any other missing or ill-typed field reads as None/False. Never raises.
    """
    try:
        if not isinstance(obj, Mapping):
            return None
        meta = _map(obj.get("metadata"))
        name, uid = _str(meta.get("name")), _str(meta.get("uid"))
        if name is None or uid is None:
            return None
        status, spec = _map(obj.get("status")), _map(obj.get("spec"))
        state = _map(_agent_status(status).get("state"))
        terminated, waiting = state.get("terminated"), _map(state.get("waiting"))
        agent = None
        if isinstance(terminated, Mapping):
            agent = ContainerEnd(exit_code=_int(terminated.get("exitCode")), reason=_str(terminated.get("reason")),
                                 message=_str(terminated.get("message")))
        return PodView(
            name=name,
            uid=uid,
            namespace=_str(meta.get("namespace")) or "",
            ref=parse_identity_annotation(_map(meta.get("annotations")).get(IDENTITY_ANNOTATION)),
            phase=_str(status.get("phase")),
            deleting=meta.get("deletionTimestamp") is not None,
            node_name=_str(spec.get("nodeName")),
            reason=_str(status.get("reason")),
            disruption=_disruption(status),
            agent=agent,
            waiting_reason=_str(waiting.get("reason")),
            waiting_message=_str(waiting.get("message")),
            started_at=_time(status.get("startTime")),
            finished_at=_time(terminated.get("finishedAt")) if isinstance(terminated, Mapping) else None,
            resource_version=_str(meta.get("resourceVersion")),
            message=_str(status.get("message")),
            finalizers=tuple(f for f in meta["finalizers"] if isinstance(f, str))
            if isinstance(meta.get("finalizers"), list) else (),
        )
    except Exception:  # noqa: BLE001 - the contract: a malformed object is "no view", whatever it is
        return None


def _same_attempt(ref: AttemptRef, expect: outcome.AttemptIdentity) -> bool:
    """The pod's annotated attempt is ``expect``."""
    return (ref.ti_id, ref.try_number, ref.attempt_epoch) == (expect.ti_id.lower(), expect.try_number,
                                                              expect.attempt_epoch)


def pod_evidence(view: PodView | None, expect: outcome.AttemptIdentity) -> Evidence:
    """The evidence a pod left for attempt ``expect``: its outcome record and its exit code.

    ``record`` is ``outcome.decode(agent.message, expect=expect)``, also past a kubelet runtime-message prefix
    (None for no message, a cut message, or another attempt's record); ``exit_code`` is the agent container's. A view of
    no pod, or of a pod whose identity annotation names another attempt, is ``Evidence(None)``: nothing of
    another attempt is ever evidence for this one. Never raises.
    """
    if view is None or (view.ref is not None and not _same_attempt(view.ref, expect)):
        return Evidence(None)
    if view.agent is None:
        return Evidence(None)
    return Evidence(_decode_message(view.agent.message, expect), view.agent.exit_code)


_RUNTIME_PREFIX_END = ': {"v":'
"""Where a kubelet's runtime-message prefix ends: it writes ``"<runtime message>: <file content>"`` (facts §6.1)
and every record starts ``{"v":`` (``outcome.encode``)."""


def _decode_message(message: str | None, expect: outcome.AttemptIdentity) -> outcome.OutcomeRecord | None:
    """``outcome.decode`` of a termination message, retried past a runtime-message prefix when the whole
    message is no record (issue 9 item 4 moves this tolerance into ``decode`` itself; then this retry finds
    nothing more). Never raises."""
    record = outcome.decode(message, expect=expect)
    if record is None and message:
        at = message.find(_RUNTIME_PREFIX_END)
        if at >= 0:
            record = outcome.decode(message[at + 2:], expect=expect)
    return record


def describe_end(view: PodView) -> str:
    """One log line naming what a pod's status says of its end, in requirement 12's order.

    E.g. ``pod p-1 (uid 1234): container base OOMKilled exit 137; phase Failed`` or ``pod p-2 (uid …):
    container base waiting ErrImagePull: <message>; pod reason Evicted: <message>; DisruptionTarget
    TerminationByKubelet; phase Failed; deleting``. The record itself is named only by its presence (the
    lifecycle logs what it decoded). Cut to :data:`~leoflow_airflow.lifecycle.runtime.MAX_DETAIL_CHARS`.
    """
    parts: list[str] = []
    if view.agent is not None:
        end = view.agent
        what = end.reason or "terminated"
        code = "exit ?" if end.exit_code is None else f"exit {end.exit_code}"
        record = "; termination message present" if end.message else ""
        parts.append(f"container {AGENT_CONTAINER} {what} {code}{record}")
    elif view.waiting_reason:
        tail = f": {view.waiting_message}" if view.waiting_message else ""
        parts.append(f"container {AGENT_CONTAINER} waiting {view.waiting_reason}{tail}")
    else:
        parts.append(f"container {AGENT_CONTAINER} not terminated")
    if view.reason:
        tail = f": {view.message}" if view.message else ""
        parts.append(f"pod reason {view.reason}{tail}")
    if view.disruption:
        parts.append(f"{DISRUPTION_TARGET} {view.disruption}")
    parts.append(f"phase {view.phase or 'unknown'}")
    if view.deleting:
        parts.append("deleting")
    line = f"pod {view.name} (uid {view.uid}): " + "; ".join(parts)
    line = " ".join(line.split())  # one line, whatever the messages held
    return line if len(line) <= MAX_DETAIL_CHARS else line[: MAX_DETAIL_CHARS - 1] + "…"
