"""The Kubernetes runtime's pure decisions (DESIGN §3 "Dispatch"; issue 9 items 2 and 5), apart from its I/O:

* :func:`create_event`: what one pod create (and, where its answer left it open, the live read of the pod by
  its name) means for the lifecycle: a ``Started`` with the pod's UID, or a ``LaunchFailed`` that is retried
  (backpressure, deferred: the workload is re-offered, never failed) or not (refused: the TI fails at once).
* :class:`CreateWindow`: the back-off window the create answers open. While it is open ``admit()`` answers
  BACKPRESSURE (a 429 or a quota 403, for its ``Retry-After`` or the back-off) or DEFERRED (a 5xx, a transport
  error), so the scheduler loop re-offers without calling the API server.
* :func:`presence`: an attempt's presence from the pod cache and the last confirming read of its pod: the cache
  is trusted to say LIVE or terminal, never to prove a pod gone by its absence.
* :func:`retention_due`: whether a terminal pod of a closed attempt has been kept long enough (``[leoflow]
  pod_retention_success`` / ``pod_retention_failure``).
* :func:`release_due` and :func:`release_patch`: when leoflow's finalizer (``pod.OUTCOME_FINALIZER``) comes
  off a pod, and the JSON patch that takes it off exactly that pod (issue 10 item 4).
* :func:`deletion_deadline` and :func:`valve_open`: the confirmation valve (issue 10 item 3): a deleted pod
  that goes ``[leoflow] pod_termination_valve`` seconds past its deletion grace period without a terminated
  status (its node is unreachable: no kubelet reports its end) counts as GONE with no record, once its task
  instance's heartbeat is silent too (:func:`heartbeat_silent`, k8s review §14).
* :func:`start_progress`: how far a live pod got toward running its agent (issue 10 item 1), for the
  dispatch-lost reaper (``reap.lost``): the clock starts when the agent container runs, a pod still being
  started is progress, an unschedulable one waits as backpressure for ``[leoflow] pod_unschedulable_timeout``,
  and one whose agent container can never start is rejected with the kubelet's reason.

Pure: no I/O, no clock of its own (every ``now`` is passed in), no Kubernetes client.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Protocol

from leoflow_airflow.dispatch.disposition import Disposition, DispatchResult
from leoflow_airflow.ledger.states import AttemptRef
from leoflow_airflow.lifecycle.runtime import (
    MAX_DETAIL_CHARS,
    LaunchFailed,
    Presence,
    RuntimeEvent,
    Started,
    StartProgress,
    StartState,
)
from leoflow_airflow.runtime.kubernetes.classify import Verdict, VerdictKind
from leoflow_airflow.runtime.kubernetes.pod import AGENT_CONTAINER, OUTCOME_FINALIZER

__all__ = [
    "BACKOFF_MAX_SECONDS",
    "BACKOFF_SECONDS",
    "IMAGE_PULL_GRACE_SECONDS",
    "PULL_REASONS",
    "REJECT_REASONS",
    "STUCK_REASONS",
    "RETRY_AFTER_MAX_SECONDS",
    "CreateResult",
    "CreateWindow",
    "Lookup",
    "create_event",
    "deletion_deadline",
    "finalizer_index",
    "heartbeat_silent",
    "presence",
    "release_due",
    "release_patch",
    "retention_due",
    "start_key",
    "start_progress",
    "valve_open",
]

BACKOFF_SECONDS = 1.0
"""The first back-off after a create answered backpressure or deferred without ``Retry-After``; doubled per
further one in a row, at most :data:`BACKOFF_MAX_SECONDS`."""
BACKOFF_MAX_SECONDS = 30.0
RETRY_AFTER_MAX_SECONDS = 300.0
"""A ``Retry-After`` longer than this is cut to it (a broken header must not stop dispatch for hours)."""


class Lookup(enum.StrEnum):
    """What the live read of a pod by its deterministic name found, after a create that may have landed."""

    OURS = "ours"
    """A pod of that name whose identity annotation names this attempt: the create (or an earlier one) landed."""
    ABSENT = "absent"
    """404: no pod of that name; the create did not land."""
    OTHER = "other"
    """A pod of that name that is not this attempt's (its identity annotation names another, or none)."""
    FAILED = "failed"
    """The read itself got no answer."""


@dataclass(frozen=True, slots=True)
class CreateResult:
    """One pod create as the worker pool saw it.

    :param launch_id: the launch it was for.
    :param pod_name: the pod's deterministic name.
    :param verdict: the create's classified answer (:mod:`.classify`).
    :param uid: the created pod's UID (``dispatched``), or the UID of the pod found by the read (``OURS``).
    :param lookup: what the live read found, for a ``check_existing`` or ``deferred`` verdict (None: no read).
    :param detail: what the read said when it failed or found another pod (operator-facing text).
    """

    launch_id: str
    pod_name: str
    verdict: Verdict
    uid: str | None = None
    lookup: Lookup | None = None
    detail: str = ""


def create_event(result: CreateResult) -> RuntimeEvent:
    """The lifecycle event of one create (module docstring).

    ``dispatched``, or a read that found our pod → ``Started(facts={pod_name, pod_uid})``; ``backpressure`` and
    ``deferred`` (the read found no pod, or failed) → ``LaunchFailed(retryable=True)``; ``refused``, or a name
    held by another pod → ``LaunchFailed(retryable=False)`` with the reason. A ``check_existing`` without a
    read counts as a failed read.
    """
    kind, reason = result.verdict.kind, result.verdict.reason
    if kind is VerdictKind.DISPATCHED or result.lookup is Lookup.OURS:
        if result.uid:
            return Started(result.launch_id, {"pod_name": result.pod_name, "pod_uid": result.uid})
        return LaunchFailed(result.launch_id, f"pod {result.pod_name}: created without a UID in the answer",
                            retryable=True)
    if kind is VerdictKind.REFUSED:
        return LaunchFailed(result.launch_id, f"pod {result.pod_name} refused: {reason}", retryable=False)
    if kind is VerdictKind.BACKPRESSURE:
        return LaunchFailed(result.launch_id, f"backpressure creating pod {result.pod_name}: {reason}",
                            retryable=True)
    if result.lookup is Lookup.OTHER:
        return LaunchFailed(result.launch_id, f"pod name {result.pod_name} is held by a pod that is not this "
                            f"attempt's: {result.detail or reason}", retryable=False)
    why = f"{reason}; no pod of that name" if result.lookup is Lookup.ABSENT else \
        f"{reason}; its pod could not be read ({result.detail or 'no read'})"
    return LaunchFailed(result.launch_id, f"creating pod {result.pod_name} deferred: {why}", retryable=True)


class CreateWindow:
    """The back-off window of pod creates: closed by a backpressure or deferred answer, for its
    ``Retry-After`` (at most :data:`RETRY_AFTER_MAX_SECONDS`) or :data:`BACKOFF_SECONDS` doubled per answer
    in a row (at most :data:`BACKOFF_MAX_SECONDS`); reopened at once by a create that landed. Times are
    ``monotonic()`` seconds passed in."""

    def __init__(self) -> None:
        self.until = 0.0
        self.in_a_row = 0
        self.disposition = Disposition.DEFERRED
        self.reason = ""

    def note(self, verdict: Verdict, now: float) -> None:
        """Record one create's verdict seen at ``now``. ``check_existing`` (a 409 on our name) changes nothing:
        the API server answered and took no load from it."""
        kind = verdict.kind
        if kind is VerdictKind.DISPATCHED:
            self.in_a_row, self.until = 0, 0.0
            return
        if kind not in (VerdictKind.BACKPRESSURE, VerdictKind.DEFERRED):
            return
        self.in_a_row += 1
        wait = min(BACKOFF_MAX_SECONDS, BACKOFF_SECONDS * 2 ** (self.in_a_row - 1))
        if verdict.retry_after is not None:
            wait = min(RETRY_AFTER_MAX_SECONDS, max(0.0, verdict.retry_after))
        self.until = max(self.until, now + wait)
        self.disposition = Disposition.BACKPRESSURE if kind is VerdictKind.BACKPRESSURE else Disposition.DEFERRED
        self.reason = verdict.reason

    def admit(self, now: float) -> DispatchResult | None:
        """None while the window is open at ``now``; else BACKPRESSURE/DEFERRED with the seconds left and why."""
        if now >= self.until:
            return None
        return DispatchResult(self.disposition, f"pod creates wait {self.until - now:.1f} s more after: "
                              f"{self.reason}"[:500])


def _when(value: object) -> datetime | None:
    """An aware datetime of ``value`` (a datetime, or an RFC 3339 string such as ``2026-12-01T14:00:00Z``)."""
    if isinstance(value, datetime):
        return value if value.tzinfo is not None else value.replace(tzinfo=timezone.utc)
    if isinstance(value, str) and value:
        try:
            return _when(datetime.fromisoformat(value.replace("Z", "+00:00")))
        except ValueError:
            return None
    return None


def retention_due(*, phase: str | None, finished_at: object, first_seen_terminal: datetime, now: datetime,
                  success_seconds: float, failure_seconds: float) -> bool:
    """Whether a terminal pod may be deleted now: ``now`` is at least its retention past its end.

    :param phase: the pod's phase; ``Succeeded`` keeps it ``success_seconds``, anything else (``Failed``, a pod
        that vanished into an unknown phase) ``failure_seconds``.
    :param finished_at: when its agent container ended (a datetime or RFC 3339 text), or None.
    :param first_seen_terminal: when this runtime first saw it terminal (aware): the end when ``finished_at``
        is missing or unreadable.
    :param now: aware UTC.
    """
    keep = success_seconds if phase == "Succeeded" else failure_seconds
    ended = _when(finished_at) or first_seen_terminal
    return (now - ended).total_seconds() >= keep


def finalizer_index(finalizers: Sequence[str]) -> int | None:
    """The index of leoflow's finalizer (``pod.OUTCOME_FINALIZER``) in a pod's ``metadata.finalizers``, or None
    when the pod does not hold it."""
    try:
        return list(finalizers).index(OUTCOME_FINALIZER)
    except ValueError:
        return None


def release_due(*, finalizers: Sequence[str], terminal: bool, deleting: bool, closed: bool) -> bool:
    """Whether leoflow's finalizer may come off a pod now: the pod holds it, its status can change no more or it
    is on its way out (``terminal``: phase Succeeded/Failed; ``deleting``: ``deletionTimestamp`` set by a user,
    PodGC, the taint manager or a kill), and its attempt is settled (``closed``: the ledger row of the pod's
    (ti_id, epoch) is CLOSED, or there is none). The row closes only after the reconciler read the pod's terminal
    status (its termination message: the outcome record), so the record is never taken away unread; a running
    pod keeps the finalizer even when its attempt is closed (its status may still change), until it is deleted.
    Issue 10 item 4; the Job controller's ``batch.kubernetes.io/job-tracking`` precedent."""
    return closed and (terminal or deleting) and finalizer_index(finalizers) is not None


_PATCH_OP = "op"
"""The member naming an RFC 6902 operation. Not leoflow's agent wire ``op`` (``leoflow_agent.protocol.Op``): kept
in a name so the wire lint (tests/unit/test_protocol.py) still finds every hand-written wire message."""


def _operation(kind: str, path: str, **value: Any) -> dict[str, Any]:
    """One JSON-patch operation ``{"op": kind, "path": path[, "value": ...]}``."""
    return {_PATCH_OP: kind, "path": path, **value}


def release_patch(uid: str, index: int) -> list[dict[str, Any]]:
    """The JSON patch (RFC 6902, ``application/json-patch+json``) that removes leoflow's finalizer at ``index``
    from the pod whose UID is ``uid``, and from nothing else: ``test`` the UID (a pod re-created under the name
    is another), ``test`` that the finalizer is still at ``index`` (the list may have changed since it was read),
    then ``remove`` it. A failed ``test`` is answered 422 by the API server and changes nothing."""
    path = f"/metadata/finalizers/{int(index)}"
    return [_operation("test", "/metadata/uid", value=uid),
            _operation("test", path, value=OUTCOME_FINALIZER),
            _operation("remove", path)]


class _View(Protocol):
    """What :func:`presence` reads of a pod view (``status.PodView``)."""

    uid: str
    ref: AttemptRef | None
    terminal: bool
    deleting: bool
    node_name: str | None
    deletion_grace: int | None
    agent: Any


def heartbeat_silent(heartbeat_age: float | None, *, silent_after: float) -> bool:
    """Whether an attempt's task instance stopped heartbeating: no heartbeat known (``heartbeat_age`` None: no
    ``last_heartbeat_at``, or the caller does not know it) or its age (seconds since Airflow's
    ``last_heartbeat_at``) above ``silent_after`` (``[leoflow] agent_lost_threshold``, which the boot ladder keeps
    above ``task_success_overtime + min_heartbeat_interval + socket_cleanup_timeout``, and above the agent's
    lease plus its kill's grace: an agent cut off from the API server has killed its task by then).

    A heartbeat is a body's own word that it runs; a pod object is the API server's word about a node that may
    not act on it (a partitioned node keeps running a pod the API server deleted or PodGC marked Failed). So a
    pod object alone proves no death while the heartbeat is fresh (DESIGN §2 "proof of death"; k8s review §14).
    Pure."""
    return heartbeat_age is None or heartbeat_age > silent_after


def _dead(view: _View, silent: bool) -> bool:
    """Nothing of the attempt runs or ever will: its agent container terminated (the kubelet's word), whatever the
    pod's phase: a sidecar or an injected container may keep the pod ``Running`` after the agent ended (k8s review
    §12), and task pods never restart a container (``restartPolicy: Never``); a terminal pod whose agent container
    reported no end (PodGC marks an unreachable node's pods ``Failed`` without any kubelet) only once the heartbeat
    is ``silent`` (k8s review §14); or it is being deleted while bound to no node (the API server binds no pod that
    has a ``deletionTimestamp``, so it never starts; a finalizer may keep it)."""
    return view.agent is not None or (view.terminal and silent) or (view.deleting and not view.node_name)


class _ReadLike(Protocol):
    """What :func:`presence` reads of a confirming read: when it answered and what (None: 404)."""

    at: float
    view: Any


def presence(cached: _View | None, read: _ReadLike | None, *, uid: str | None, ref: AttemptRef, now: float,
             read_reuse: float, heartbeat_age: float | None = None,
             silent_after: float = 0.0) -> tuple[Presence, Any, bool]:
    """The presence of attempt ``ref``'s pod, the view it was decided from, and whether a confirming read of
    the pod by name must be sent.

    A pod is the attempt's when its UID is ``uid`` (recorded) or, without one, its identity annotation names
    ``ref``. In the cache: terminal (also while being deleted: a finalizer keeps it), or deleting and bound to no
    node (it can never start) → GONE, else LIVE. Not in the cache: the last confirming read decides:
    404, or another pod under the name → GONE (for good when ``uid`` is known: a UID never comes back; for
    ``read_reuse`` seconds otherwise); the attempt's pod, terminal → GONE, else LIVE (a fresh read is asked
    for once it is ``read_reuse`` seconds old). No read yet → UNKNOWN, and one is asked for.

    The pod object alone proves no death while the task instance heartbeats (:func:`heartbeat_silent` of
    ``heartbeat_age`` and ``silent_after``; k8s review §14): a terminal pod whose agent container reported no
    end, or a pod gone from the API server, reads LIVE until the heartbeat is silent too. The kubelet's
    terminated status of the agent container, and a deleted pod never bound to a node, stay proof at once.

    :param now: ``monotonic()`` seconds, the clock of ``read.at``.
    :param heartbeat_age: seconds since the attempt's TI last heartbeat; None when unknown (the pod object
        decides alone, as before).
    :param silent_after: ``[leoflow] agent_lost_threshold`` seconds.
    """
    silent = heartbeat_silent(heartbeat_age, silent_after=silent_after)

    def ours(view: Any) -> bool:
        return view is not None and (view.uid == uid if uid else view.ref == ref)

    if ours(cached):
        assert cached is not None
        return (Presence.GONE if _dead(cached, silent) else Presence.LIVE), cached, False
    if read is None:
        return Presence.UNKNOWN, None, True
    stale = now - read.at >= read_reuse
    if not ours(read.view):
        if not silent:
            return Presence.LIVE, None, stale  # its pod object is gone, but its body still heartbeats
        if uid is not None or not stale:
            return Presence.GONE, None, False
        return Presence.UNKNOWN, None, True
    if _dead(read.view, silent):
        return Presence.GONE, read.view, False
    return Presence.LIVE, read.view, stale


def deletion_deadline(view: _View, *, seen: float, earlier: float | None) -> float | None:
    """When a pod being deleted should have stopped: ``seen`` (``monotonic()`` seconds, when this view was read)
    plus its ``deletion_grace`` (0 when unknown), or ``earlier`` (the deadline already noted for that pod) when
    that comes first: a second delete can only shorten the grace (the API server keeps the shorter one). None
    for a pod that is not being deleted or is terminal (nothing to confirm). Pure."""
    if not view.deleting or view.terminal:
        return None
    deadline = seen + max(0, view.deletion_grace or 0)
    return deadline if earlier is None else min(earlier, deadline)


def valve_open(deadline: float | None, *, now: float, valve: float, heartbeat_age: float | None = None,
               silent_after: float = 0.0) -> bool:
    """Whether a deleted pod's end stays unconfirmed for too long: ``valve`` seconds (``[leoflow]
    pod_termination_valve``; 0: never) past its :func:`deletion_deadline` (None: not being deleted), and its
    task instance's heartbeat is silent (:func:`heartbeat_silent`: ``heartbeat_age``, seconds since Airflow's
    ``last_heartbeat_at`` or None when unknown, above ``silent_after``, ``[leoflow] agent_lost_threshold``). The
    seed's confirmation valve (ADR 0052 amendment): the reconciler waits for the terminated status to read a
    record before anything re-runs, but not for ever; and never while the body still heartbeats (a partitioned
    node runs a pod on after its deletion; k8s review §14). Pure; ``now`` is ``monotonic()`` seconds."""
    return deadline is not None and valve > 0 and now >= deadline + valve \
        and heartbeat_silent(heartbeat_age, silent_after=silent_after)


PULL_REASONS = frozenset({"ErrImagePull", "ImagePullBackOff"})
"""Waiting reasons of a container whose image pull failed; the kubelet retries it (back-off 10 s doubling to
300 s), so a short registry hiccup may pass: rejected once they lasted :data:`IMAGE_PULL_GRACE_SECONDS`."""
REJECT_REASONS = frozenset({"InvalidImageName", "CreateContainerConfigError", "CreateContainerError"})
"""Waiting reasons that do not pass by themselves (a malformed image reference; a missing Secret/ConfigMap key
or an invalid container config; a container the runtime refuses to create): rejected at once."""
STUCK_REASONS = PULL_REASONS | REJECT_REASONS
"""Every waiting reason of the agent container that means it cannot start as asked."""
IMAGE_PULL_GRACE_SECONDS = 60.0
"""Seconds an agent container may stay in :data:`PULL_REASONS` before its attempt is rejected: the kubelet's
first retries (10 s, 20 s) fit in it."""


class _StartView(Protocol):
    """What :func:`start_progress` reads of a pod view (``status.PodView``)."""

    name: str
    deleting: bool
    node_name: str | None
    agent: Any
    agent_running: bool
    agent_started_at: datetime | None
    agent_image: str | None
    started_at: datetime | None
    waiting_reason: str | None
    waiting_message: str | None
    unschedulable: str | None
    unschedulable_since: datetime | None


def start_key(view: _StartView) -> str:
    """The start step a pod is in, as a key: ``"started"``, ``"pull"`` (either of :data:`PULL_REASONS`, so the
    kubelet's ErrImagePull/ImagePullBackOff alternation is one step), a reason of :data:`REJECT_REASONS`,
    ``"unschedulable"`` or ``"starting"``. The runtime remembers when it first saw a pod at its current key:
    the ``first_seen`` of :func:`start_progress`."""
    if view.agent_running or view.agent is not None:
        return "started"
    if view.deleting:
        return "starting"
    if view.waiting_reason in PULL_REASONS:
        return "pull"
    if view.waiting_reason in REJECT_REASONS:
        return view.waiting_reason or "starting"
    if view.unschedulable is not None and view.node_name is None:
        return "unschedulable"
    return "starting"


def start_progress(view: _StartView, *, first_seen: datetime, unschedulable_timeout: float,
                   pull_grace: float = IMAGE_PULL_GRACE_SECONDS) -> StartProgress:
    """How far a live (non-terminal) pod got toward running its agent, for the dispatch-lost reaper.

    :param first_seen: when the runtime first saw the pod at its :func:`start_key` (aware UTC): the waiting
        reasons carry no time of their own.
    :param unschedulable_timeout: ``[leoflow] pod_unschedulable_timeout`` seconds; 0: no bound.
    :param pull_grace: seconds an image-pull failure may last (:data:`IMAGE_PULL_GRACE_SECONDS`).

    ================================================  ============================================================
    agent container running (or ended)                ``STARTED`` since its ``startedAt`` (else the pod's
                                                      ``startTime``, else ``first_seen``)
    deleting                                          ``STARTING`` (whoever deletes it, its end settles it)
    waiting ``ErrImagePull``/``ImagePullBackOff``     ``REJECTED`` until ``first_seen + pull_grace``:
                                                      ``image "<image>" cannot be pulled: <message>``
    waiting ``InvalidImageName``                      ``REJECTED`` at once: ``image "<image>" is not a valid image
                                                      name: <message>``
    waiting ``CreateContainerConfigError``            ``REJECTED`` at once: ``container base cannot be
                                                      configured: <message>``
    waiting ``CreateContainerError``                  ``REJECTED`` at once: ``container base cannot be created:
                                                      <message>``
    not bound, ``PodScheduled`` False                 ``NO_ROOM`` since the condition's ``lastTransitionTime``
    ``Unschedulable``                                 (else ``first_seen``), until ``unschedulable_timeout`` later
                                                      (no bound at 0)
    anything else (not scheduled yet, scheduled,      ``STARTING``: progress
    ``ContainerCreating``, ``PodInitializing``,
    pulling)
    ================================================  ============================================================

    Every reason names the pod and the waiting reason, e.g. ``image "r/x:1" cannot be pulled: <message>
    (ErrImagePull, pod p-1)``; one line, at most ``MAX_DETAIL_CHARS`` characters.
    """
    key = start_key(view)
    if key == "started":
        return StartProgress(StartState.STARTED, since=view.agent_started_at or view.started_at or first_seen)
    waiting, said = view.waiting_reason, view.waiting_message or view.waiting_reason
    tail = f" ({waiting}, pod {view.name})"
    image = view.agent_image or "?"
    if key == "pull":
        return StartProgress(StartState.REJECTED, since=first_seen, until=first_seen + timedelta(seconds=pull_grace),
                             reason=_line(f'image "{image}" cannot be pulled: {said}{tail}'))
    if key in REJECT_REASONS:
        what = {"InvalidImageName": f'image "{image}" is not a valid image name',
                "CreateContainerConfigError": f"container {AGENT_CONTAINER} cannot be configured",
                "CreateContainerError": f"container {AGENT_CONTAINER} cannot be created"}[key]
        return StartProgress(StartState.REJECTED, since=first_seen, reason=_line(f"{what}: {said}{tail}"))
    if key == "unschedulable":
        since = view.unschedulable_since or first_seen
        until = since + timedelta(seconds=unschedulable_timeout) if unschedulable_timeout > 0 else None
        return StartProgress(StartState.NO_ROOM, since=since, until=until,
                             reason=_line(f"pod {view.name} is unschedulable: {view.unschedulable} "
                                          f"([leoflow] pod_unschedulable_timeout {unschedulable_timeout:g} s)"))
    return StartProgress(StartState.STARTING, since=first_seen,
                         reason=_line(f"pod {view.name}: " + (f"waiting {waiting}" if waiting else
                                                             "scheduled" if view.node_name else "not scheduled yet")))


def _line(text: str) -> str:
    """``text`` as one line, cut to :data:`MAX_DETAIL_CHARS` characters."""
    line = " ".join(text.split())
    return line if len(line) <= MAX_DETAIL_CHARS else line[: MAX_DETAIL_CHARS - 1] + "…"
