"""What leoflow reads of a task pod's status: a :class:`PodView`, and from it the attempt's evidence.

A pod's status is read from its JSON (the camelCase API dict a watch event or a raw LIST carries), never from a
deserialized ``V1Pod``: the informer builds one view per event for up to thousands of pods, and a plain dict
read is cheap. Every reader here is total: a malformed or partial object gives a view with ``None`` fields (or
no view at all when it has no name/UID), never an exception.

Evidence follows the facts file's requirement 12, in this order (DESIGN §2 "Evidence", "Pod ends"):

1. the agent container's ``state.terminated.message``: the outcome record (``leoflow_agent.outcome.decode``);
2. the containers' terminated ``reason`` (``OOMKilled``, ``Error``) and exit code;
3. the pod's ``status.reason`` (``Evicted``, ``DeadlineExceeded``, ...) and the ``DisruptionTarget`` reason;
4. the phase.

:func:`pod_evidence` gives the lifecycle (1) as the record with the agent's exit code, and (2)-(3) as the
:class:`~leoflow_airflow.lifecycle.runtime.EndCause` :func:`end_cause` classifies (an infra loss, an OOM kill,
``DeadlineExceeded``); the reconciler lets the record win over the cause (``reconcile.decide``). (4) classifies
nothing: a pod that ended with no record and no cause is the table's "no record" row. :func:`describe_end` names
(2)-(4) in logs. Pure module: no I/O, no Kubernetes client.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from leoflow_agent import outcome
from leoflow_airflow.ledger.states import AttemptRef
from leoflow_airflow.lifecycle.runtime import MAX_DETAIL_CHARS, EndCause, EndKind, Evidence
from leoflow_airflow.runtime.kubernetes.identity import IDENTITY_ANNOTATION, parse_identity_annotation
from leoflow_airflow.runtime.kubernetes.pod import AGENT_CONTAINER

__all__ = ["INFRA_DISRUPTIONS", "INFRA_POD_REASONS", "TERMINAL_PHASES", "ContainerEnd", "PodView", "describe_end",
           "end_cause", "pod_evidence", "pod_view"]

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
    :param ended: every init and regular container that has terminated, ``(name, ContainerEnd)`` in status order
        (init containers first; ``state.terminated`` only; ephemeral debug containers are left out: their end
        says nothing of the task's). :func:`end_cause` looks for an OOM kill among them.
    :param finalizers: ``metadata.finalizers`` in order (strings only), ``()`` for none; the runtime releases
        ``pod.OUTCOME_FINALIZER`` by its index here.
    :param agent_started_at: the agent container's ``state.running.startedAt`` (aware UTC) or None: the agent
        process runs since then (the dispatch-lost clock's start, :func:`.decide.start_progress`).
    :param agent_running: the agent container's ``state.running`` is set (with or without ``startedAt``).
    :param agent_image: the agent container's ``spec`` image or None (named when it cannot be pulled).
    :param unschedulable: the message of condition ``PodScheduled`` status ``"False"`` reason ``Unschedulable``
        (the scheduler's "0/3 nodes are available: …"; the reason itself when it has none), None otherwise.
    :param unschedulable_since: that condition's ``lastTransitionTime`` (aware UTC) or None.
    :param labels: ``metadata.labels`` as sorted ``(key, value)`` pairs (:meth:`label` reads one).
    :param created_at: ``metadata.creationTimestamp`` (aware UTC) or None.
    :param deletion_grace: ``metadata.deletionGracePeriodSeconds`` (seconds the kubelet was given to stop the
        pod) while it is being deleted, else None.
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
    ended: tuple[tuple[str, ContainerEnd], ...] = ()
    finalizers: tuple[str, ...] = ()
    agent_started_at: datetime | None = None
    agent_running: bool = False
    agent_image: str | None = None
    unschedulable: str | None = None
    unschedulable_since: datetime | None = None
    deletion_grace: int | None = None
    labels: tuple[tuple[str, str], ...] = ()
    created_at: datetime | None = None

    def label(self, key: str) -> str | None:
        """The value of label ``key``, or None."""
        for k, v in self.labels:
            if k == key:
                return v
        return None

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


def _container_end(terminated: Mapping[str, Any]) -> ContainerEnd:
    """The :class:`ContainerEnd` of one ``state.terminated`` mapping."""
    return ContainerEnd(exit_code=_int(terminated.get("exitCode")), reason=_str(terminated.get("reason")),
                        message=_str(terminated.get("message")))


def _ended(status: Mapping[str, Any]) -> tuple[tuple[str, ContainerEnd], ...]:
    """``(name, end)`` of every init and regular container whose ``state.terminated`` is set, in status order."""
    out: list[tuple[str, ContainerEnd]] = []
    for key in ("initContainerStatuses", "containerStatuses"):
        statuses = status.get(key)
        for entry in statuses if isinstance(statuses, list) else ():
            if not isinstance(entry, Mapping):
                continue
            name, terminated = _str(entry.get("name")), _map(entry.get("state")).get("terminated")
            if name is not None and isinstance(terminated, Mapping):
                out.append((name, _container_end(terminated)))
    return tuple(out)


def _disruption(status: Mapping[str, Any]) -> str | None:
    """The reason of the ``DisruptionTarget`` condition whose status is ``"True"`` ("" reason: the type)."""
    conditions = status.get("conditions")
    if isinstance(conditions, list):
        for cond in conditions:
            if isinstance(cond, Mapping) and cond.get("type") == DISRUPTION_TARGET and cond.get("status") == "True":
                return _str(cond.get("reason")) or DISRUPTION_TARGET
    return None


UNSCHEDULABLE = "Unschedulable"
"""The reason of condition ``PodScheduled`` (status ``"False"``) the scheduler writes when no node fits the pod
(``k8s:pkg/apis/core/types.go`` ``PodReasonUnschedulable``)."""


def _unschedulable(status: Mapping[str, Any]) -> tuple[str | None, datetime | None]:
    """(message, lastTransitionTime) of condition ``PodScheduled`` False ``Unschedulable``, else (None, None)."""
    conditions = status.get("conditions")
    for cond in conditions if isinstance(conditions, list) else ():
        if isinstance(cond, Mapping) and cond.get("type") == "PodScheduled" and cond.get("status") == "False" \
                and cond.get("reason") == UNSCHEDULABLE:
            return _str(cond.get("message")) or UNSCHEDULABLE, _time(cond.get("lastTransitionTime"))
    return None, None


def _agent_image(spec: Mapping[str, Any]) -> str | None:
    """The image of the agent container in ``spec.containers``, or None."""
    containers = spec.get("containers")
    for entry in containers if isinstance(containers, list) else ():
        if isinstance(entry, Mapping) and entry.get("name") == AGENT_CONTAINER:
            return _str(entry.get("image"))
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
        terminated, waiting, running = state.get("terminated"), _map(state.get("waiting")), state.get("running")
        unschedulable, unschedulable_since = _unschedulable(status)
        agent = None
        if isinstance(terminated, Mapping):
            agent = _container_end(terminated)
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
            ended=_ended(status),
            finalizers=tuple(f for f in meta["finalizers"] if isinstance(f, str))
            if isinstance(meta.get("finalizers"), list) else (),
            agent_started_at=_time(running.get("startedAt")) if isinstance(running, Mapping) else None,
            agent_running=isinstance(running, Mapping),
            agent_image=_agent_image(spec),
            unschedulable=unschedulable,
            unschedulable_since=unschedulable_since,
            deletion_grace=_int(meta.get("deletionGracePeriodSeconds")),
            labels=tuple(sorted((k, v) for k, v in _map(meta.get("labels")).items()
                                if isinstance(k, str) and isinstance(v, str))),
            created_at=_time(meta.get("creationTimestamp")),
        )
    except Exception:  # noqa: BLE001 - the contract: a malformed object is "no view", whatever it is
        return None


def _same_attempt(ref: AttemptRef, expect: outcome.AttemptIdentity) -> bool:
    """The pod's annotated attempt is ``expect``."""
    return (ref.ti_id, ref.try_number, ref.attempt_epoch) == (expect.ti_id.lower(), expect.try_number,
                                                              expect.attempt_epoch)


def pod_evidence(view: PodView | None, expect: outcome.AttemptIdentity) -> Evidence:
    """The evidence a pod left for attempt ``expect``: its outcome record, its exit code and its end's cause.

    ``record`` is ``outcome.decode(agent.message, expect=expect)``, also past a kubelet runtime-message prefix
    (None for no message, a cut message, or another attempt's record); ``exit_code`` is the agent container's;
    ``cause`` is :func:`end_cause` of the view (set whether or not there is a record: the reconciler lets the
    record win). A view of no pod, or of a pod whose identity annotation names another attempt, is
    ``Evidence(None)``: nothing of another attempt is ever evidence for this one. Never raises.
    """
    if view is None or (view.ref is not None and not _same_attempt(view.ref, expect)):
        return Evidence(None)
    cause = end_cause(view)
    if view.agent is None:
        return Evidence(None, None, cause)
    return Evidence(_decode_message(view.agent.message, expect), view.agent.exit_code, cause)


OOM_KILLED = "OOMKilled"
"""A container's ``state.terminated.reason`` after the kernel's OOM killer ended it (set by the container runtime;
the kubelet tests for this string: facts §6.6). Its exit code is typically 137 (SIGKILL)."""
DEADLINE_EXCEEDED = "DeadlineExceeded"
"""The pod ``status.reason`` the kubelet sets when ``activeDeadlineSeconds`` (counted from ``status.startTime``;
leoflow sets it to at most ``[leoflow] credential_ceiling_seconds``) ran out (facts §6.6)."""

NO_ROOM_PREFIX = "OutOf"
"""How the pod ``status.reason`` of a pod the kubelet refused at admission for lack of a resource begins
(``OutOfcpu``, ``OutOfmemory``, ``OutOfpods``, ``OutOf<extended resource>``: ``k8s:pkg/kubelet/lifecycle/
predicate.go``): the pod ends ``Failed`` before any container starts. A scheduler never places a pod past a node's
allocatable, but a pod bound by ``nodeName`` (or raced past the scheduler's view) meets it (found on the real node,
issue 35: a warm pool's pods holding the CPU a cold pod requested)."""

INFRA_POD_REASONS: Mapping[str, str] = {
    "Evicted": "evicted by the kubelet (node pressure)",
    "Terminated": "terminated by its node's shutdown",
    "NodeShutdown": "refused by a node shutting down",
    "NodeLost": "its node was lost",
}
"""Pod ``status.reason`` values that mean the platform took the pod away, with what each means for the log:
``Evicted`` (``k8s:pkg/kubelet/eviction/helpers.go:44``), ``Terminated`` and ``NodeShutdown`` (graceful node
shutdown, ``pkg/kubelet/nodeshutdown/nodeshutdown_manager.go``), ``NodeLost`` (``pkg/util/node/node.go:30``)."""

INFRA_DISRUPTIONS: Mapping[str, str] = {
    "EvictionByEvictionAPI": "evicted through the Eviction API (a drain, an autoscaler)",
    "PreemptionByScheduler": "preempted by the scheduler for a higher-priority pod",
    "DeletionByTaintManager": "deleted by the taint manager (its node is not ready or unreachable)",
    "DeletionByPodGC": "deleted by PodGC (its node no longer exists)",
    "TerminationByKubelet": "terminated by the kubelet (node pressure or node shutdown)",
}
"""The ``DisruptionTarget`` condition's reasons (facts §6.6), with what each means for the log. Any other reason
of that condition (a later Kubernetes) is an infra loss too: the condition exists to say Kubernetes disrupted the
pod."""


def end_cause(view: PodView) -> EndCause | None:
    """What the pod's status says ended it, past the record (requirement 12's steps 2 and 3), or None.

    In this order, the first that applies:

    1. an init or regular container terminated ``OOMKilled`` (the agent container first) → ``OOM_KILLED``,
       ``"OOMKilled, exit 137, container base (pod <name>)"``: an OOM kill is the end the container runtime
       itself recorded, so it comes before the pod-level reasons (a node-pressure eviction that OOM-killed it
       too is still an OOM kill);
    2. pod reason ``DeadlineExceeded`` → ``DEADLINE_EXCEEDED``, ``"DeadlineExceeded: <the kubelet's message>"``.
       The pod reason is the end the kubelet recorded, while ``DisruptionTarget`` says a disruption began: a pod
       that was being evicted when its deadline ran out ended on its deadline, a task failure;
    3. a pod reason starting :data:`NO_ROOM_PREFIX` → ``NO_ROOM``, ``"pod p-1 was refused by its node for lack of
       room (pod reason OutOfcpu: <the kubelet's message>)"``;
    4. a pod reason of :data:`INFRA_POD_REASONS`, or a ``DisruptionTarget`` condition (status True) → ``INFRA_LOSS``
       naming both, e.g. ``"pod p-1 evicted through the Eviction API (DisruptionTarget EvictionByEvictionAPI)"``.

    ``Error`` and other exit codes classify nothing (an agent that exits without a record is the table's "no
    record" row), nor does the phase. The reason is one line of at most ``MAX_DETAIL_CHARS`` characters.
    """
    pod = f"pod {view.name}"
    oom = _oom_killed(view)
    if oom is not None:
        name, end = oom
        code = "?" if end.exit_code is None else str(end.exit_code)
        return EndCause(EndKind.OOM_KILLED, _line(f"OOMKilled, exit {code}, container {name} ({pod})"))
    if view.reason == DEADLINE_EXCEEDED:
        said = view.message or "the pod ran past its activeDeadlineSeconds"
        return EndCause(EndKind.DEADLINE_EXCEEDED,
                        _line(f"DeadlineExceeded: {said} ({pod}, activeDeadlineSeconds: [leoflow] "
                              f"credential_ceiling_seconds)"))
    if view.reason and view.reason.startswith(NO_ROOM_PREFIX):
        said = f": {view.message}" if view.message else ""
        return EndCause(EndKind.NO_ROOM, _line(f"{pod} was refused by its node for lack of room "
                                               f"(pod reason {view.reason}{said})"))
    parts: list[str] = []
    if view.reason in INFRA_POD_REASONS:
        tail = f": {view.message}" if view.message else ""
        parts.append(f"{INFRA_POD_REASONS[view.reason]} (pod reason {view.reason}{tail})")
    if view.disruption is not None:
        what = INFRA_DISRUPTIONS.get(view.disruption, "disrupted by Kubernetes")
        parts.append(f"{what} ({DISRUPTION_TARGET} {view.disruption})" if not parts
                     else f"{DISRUPTION_TARGET} {view.disruption}")
    if parts:
        return EndCause(EndKind.INFRA_LOSS, _line(f"{pod} " + "; ".join(parts)))
    return None


def unconfirmed_cause(view: PodView, *, waited: float, valve: float) -> EndCause:
    """Why an attempt whose pod never reported its end counts as ended (issue 10 item 3, the confirmation valve):
    ``INFRA_LOSS`` naming the pod, its node, how long past its deletion grace period it went without a terminated
    status (``waited`` seconds) and ``[leoflow] pod_termination_valve`` (``valve`` seconds), plus what its status
    says beyond that (:func:`end_cause`: e.g. the taint manager's ``DisruptionTarget``). One line of at most
    ``MAX_DETAIL_CHARS`` characters. Pure."""
    node = f"node {view.node_name}" if view.node_name else "no node"
    said = end_cause(view)
    extra = f"; {said.reason}" if said is not None else ""
    return EndCause(EndKind.INFRA_LOSS, _line(
        f"pod {view.name} on {node} was deleted and reported no end {waited:.0f} s past its grace period (its "
        f"node is unreachable or lost): its record could not be read ([leoflow] pod_termination_valve "
        f"{valve:g} s){extra}"))


def _oom_killed(view: PodView) -> tuple[str, ContainerEnd] | None:
    """The first OOM-killed container, the agent container before any other; None when there is none."""
    if view.agent is not None and view.agent.reason == OOM_KILLED:
        return AGENT_CONTAINER, view.agent
    for name, end in view.ended:
        if end.reason == OOM_KILLED:
            return name, end
    return None


def _line(text: str) -> str:
    """``text`` as one line, cut to :data:`MAX_DETAIL_CHARS` characters."""
    line = " ".join(text.split())
    return line if len(line) <= MAX_DETAIL_CHARS else line[: MAX_DETAIL_CHARS - 1] + "…"


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
