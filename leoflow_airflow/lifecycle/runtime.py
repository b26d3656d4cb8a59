"""The seam between the attempt lifecycle and a runtime (DESIGN §1 "Runtimes").

The lifecycle (:mod:`leoflow_airflow.lifecycle.core`) is written once against :class:`Runtime`;
``leoflow_airflow.runtime.lite`` implements it structurally (Kubernetes is next). No method may block a
scheduler loop on the network: ``observe``, ``locate`` and ``evidence`` answer from what the runtime already
holds (Lite: the process table and the record file) and say UNKNOWN / "no record" otherwise. Events record
facts; only the lifecycle's reconcile turns facts into settled attempts (DESIGN §2 Invariant 2).

Pure module: standard library plus leoflow's own pure vocabulary; it imports no runtime and no Airflow.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol, TypedDict

from leoflow_agent.outcome import OutcomeRecord
from leoflow_agent.protocol import launch_id_for
from leoflow_airflow.dispatch.disposition import DispatchResult
from leoflow_airflow.ledger.states import AttemptRef

if TYPE_CHECKING:
    from leoflow_airflow.ledger.store import Attempt

__all__ = [
    "MAX_DETAIL_CHARS",
    "CallbackDone",
    "EndCause",
    "EndKind",
    "Evidence",
    "Exited",
    "LaunchFailed",
    "LaunchSpec",
    "LedgerRow",
    "Presence",
    "Reported",
    "Runtime",
    "RuntimeEvent",
    "RuntimeFacts",
    "StartProgress",
    "StartState",
    "Started",
    "launch_id",
]

MAX_DETAIL_CHARS = 500
"""Untrusted text (an error, an HTTP detail) is cut to this many characters before it reaches the ledger."""


def launch_id(ref: AttemptRef) -> str:
    """The launch id of task attempt ``ref``: the one builder (``leoflow_agent.protocol.launch_id_for``)."""
    return launch_id_for(ref.ti_id, ref.try_number, ref.attempt_epoch)


class Presence(enum.StrEnum):
    """What is known of an attempt's execution right now. Unlike ``AttemptState`` (what the ledger recorded),
    presence is observed."""

    LIVE = "live"
    """Something of it may still run: never settle it, never claim a new epoch of its ti_id."""
    GONE = "gone"
    """Proven dead. Lite: no process of its subtree is left (the agent by pid + start time, and its leftovers
    found by session and ``LEOFLOW_ATTEMPT`` marker)."""
    UNKNOWN = "unknown"
    """Cannot tell yet (the runtime has not reported the exit of its own launch; a launch still in flight).
    Never settled, never reaped; adoption keeps it."""


class RuntimeFacts(TypedDict, total=False):
    """Ledger fact columns a runtime may set (a subset of ``ledger.store.FACT_COLUMNS``)."""

    pid: int
    proc_start_time: int
    record_path: str
    pod_name: str
    pod_uid: str


@dataclass(frozen=True, slots=True)
class LaunchSpec:
    """One task attempt to start.

    :param launch_id: ``leoflow_agent.protocol.launch_id_for(*ref)``.
    :param ref: the claimed attempt.
    :param workload: the Airflow ``ExecuteTask`` (its token is re-minted by the runtime at hand-off).
    :param record_path: where the attempt's outcome record goes (the ledger row's ``record_path``), or None.
    :param fault: TEST ONLY fault point (``leoflow_agent.protocol.FAULT_POINTS``) or None.
    """

    launch_id: str
    ref: AttemptRef
    workload: Any
    record_path: str | None = None
    fault: str | None = None


class EndKind(enum.StrEnum):
    """What the runtime's own status says ended an attempt, beyond its outcome record (issue 10 item 2;
    ``docs/DESIGN.md`` §2 "Pod ends"). The reconciler reads it only where the record decides nothing."""

    INFRA_LOSS = "infra_loss"
    """The platform took the execution away (an eviction, a preemption, a taint-manager or PodGC deletion, a
    node shut down or lost): re-driven on the infra budget, never a user retry, never a task failure."""
    OOM_KILLED = "oom_killed"
    """A container of the attempt was OOM-killed: re-driven once on the infra budget (node pressure can cause
    it); the same again on the re-driven try is a task failure."""
    DEADLINE_EXCEEDED = "deadline_exceeded"
    """The runtime's time limit ended it (a pod's ``activeDeadlineSeconds``): a task failure, never an infra
    loss."""
    NO_ROOM = "no_room"
    """The node refused the attempt before it started, for lack of room (the kubelet's admission: ``OutOfcpu``,
    ``OutOfmemory``, ``OutOfpods``): backpressure, re-offered after a pause, never a failure and no
    ``redispatch_limit`` spent (issue 35, found on the real node)."""


@dataclass(frozen=True, slots=True)
class EndCause:
    """Why a runtime says an attempt ended: ``kind`` and ``reason``, the one line the TI's log row names (e.g.
    ``"OOMKilled, exit 137, container base"``), at most :data:`MAX_DETAIL_CHARS` characters."""

    kind: EndKind
    reason: str


@dataclass(frozen=True, slots=True)
class Evidence:
    """What a dead attempt left: its outcome record decoded against its identity (``None``: no usable record;
    reading never raises), its exit code when the runtime knows it, and ``cause``, what the runtime's status
    says ended it (``None``: nothing beyond the record and exit code; always for Lite). A record wins over the
    cause (``reconcile.decide``)."""

    record: OutcomeRecord | None
    exit_code: int | None = None
    cause: EndCause | None = None
    known: bool = True
    """False: the runtime cannot read what the attempt left yet (Kubernetes: its pod cache has not synced since
    the scheduler started), so "no record" would be a guess. The lifecycle then neither settles the attempt nor
    resets its task instance as lost; it asks again on a later cycle (k8s review §2). Lite: always True."""

    @classmethod
    def unknown(cls) -> Evidence:
        """The evidence of an attempt whose runtime cannot read it yet (``known`` False, nothing else)."""
        return cls(None, None, None, known=False)


class LedgerRow(enum.IntEnum):
    """What the ledger holds of one attempt, as :meth:`Runtime.collect`'s ``is_closed`` answers it.

    Truthy (CLOSED, ABSENT) where a runtime may remove what the attempt left: Lite's record directory of a row the
    ledger's retention already deleted; a Kubernetes pod of this installation (its informer lists only pods
    labelled with ``[leoflow] instance``, so another installation's never reach ``collect``; k8s review §5)."""

    OPEN = 0
    CLOSED = 1
    ABSENT = 2


class StartState(enum.StrEnum):
    """How far a LIVE attempt got toward running its agent, as its runtime tells (issue 10 item 1,
    ``docs/DESIGN.md`` §3 "Reap"). The dispatch-lost reaper reads it; a runtime that says nothing (Lite) is
    judged from the dispatch, as before."""

    STARTED = "started"
    """The agent runs, since ``since``: the dispatch-lost clock counts from there (not from the dispatch)."""
    STARTING = "starting"
    """The runtime is still bringing it up (placed, its image being pulled, its container being created):
    progress. The dispatch-lost reaper leaves it alone; Airflow's ``[scheduler] task_queued_timeout`` still
    bounds a task instance stuck in QUEUED (its revoke kills the attempt)."""
    NO_ROOM = "no_room"
    """The runtime has no room for it now (Kubernetes: the pod is unschedulable), since ``since``: backpressure,
    waited for until ``until``; then its execution is removed and the workload re-offered, never a user retry
    and never a failure."""
    REJECTED = "rejected"
    """It can never start as asked (an image that cannot be pulled or is no valid name, a container that
    cannot be configured): once ``until`` passed (at once when None), its execution is removed and the task
    instance fails through Airflow's path with ``reason``, which also goes into its task log."""


@dataclass(frozen=True, slots=True)
class StartProgress:
    """One attempt's :class:`StartState`. ``since``/``until``: aware UTC or None; ``reason``: one line of at
    most :data:`MAX_DETAIL_CHARS` characters, what the operator reads (``REJECTED``: the task's failure
    reason, e.g. ``image "x" cannot be pulled: <kubelet message>``; ``NO_ROOM``: why it cannot be placed)."""

    state: StartState
    since: datetime | None = None
    until: datetime | None = None
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Started:
    """The runtime started launch ``launch_id`` (Lite: the agent was forked); ``facts`` identify it."""

    launch_id: str
    facts: RuntimeFacts


@dataclass(frozen=True, slots=True)
class Reported:
    """The agent's terminal ``PATCH …/state`` returned 2xx with ``state`` (the attempt's slot frees here)."""

    launch_id: str
    state: str


@dataclass(frozen=True, slots=True)
class Exited:
    """The launch's process is gone and the runtime killed what was left of it (proof of death)."""

    launch_id: str
    exit_code: int | None


@dataclass(frozen=True, slots=True)
class LaunchFailed:
    """The runtime never started the launch. ``retryable``: a transient infra fault (a fork's EAGAIN/ENOMEM, a
    runtime that died before it started the launch): the workload is re-offered and never failed."""

    launch_id: str
    error: str
    retryable: bool


@dataclass(frozen=True, slots=True)
class CallbackDone:
    """A callback launch ended: ``ok`` True/False from its exit code, ``None`` when its outcome is unknown
    (the runtime lost sight of it)."""

    launch_id: str
    ok: bool | None


RuntimeEvent = Started | Reported | Exited | LaunchFailed | CallbackDone
"""Facts a runtime reports from :meth:`Runtime.poll`, oldest first."""


class Runtime(Protocol):
    """Where attempts run. Implementations: ``leoflow_airflow.runtime.lite.LiteRuntime``; tests:
    ``tests.fakes.runtime.FakeRuntime``. Every method returns promptly and never raises for a runtime fault
    (it answers DEFERRED, UNKNOWN, or an event instead)."""

    kind: str
    """The ledger's ``runtime`` column value (``"lite"``)."""

    host: str | None
    """The host stamp written on every attempt claimed for this runtime (``leoflow_airflow.hosts.this_host``;
    ``None``: unstamped). ``observe`` answers UNKNOWN for an attempt stamped with another host."""

    def start(self) -> None:
        """Begin bringing the runtime up; returns at once. Until it is up, :meth:`admit` answers DEFERRED."""

    def stop(self, timeout: float) -> Sequence[RuntimeEvent]:
        """Stop launching, hang up, and return the events still owed (read until the runtime's EOF or
        ``timeout`` seconds). Started attempts keep running for a successor scheduler to adopt."""

    def terminate(self) -> None:
        """Kill the runtime itself at once (its attempts are killed by the lifecycle first)."""

    def admit(self) -> DispatchResult | None:
        """``None`` when a launch may be handed over now, else why not (DEFERRED/BACKPRESSURE)."""

    def record_path(self, ti_id: str, attempt_epoch: int) -> str | None:
        """Where this attempt's outcome record will be written, or None when the runtime keeps none."""

    def launch(self, spec: LaunchSpec) -> DispatchResult:
        """Hand one task attempt over. DISPATCHED: a ``Started`` or ``LaunchFailed`` event follows."""

    def launch_callback(self, launch_id: str, workload: Any) -> DispatchResult:
        """Hand one callback workload over. DISPATCHED: a ``CallbackDone`` event follows."""

    def poll(self) -> Sequence[RuntimeEvent]:
        """Every fact since the last call; never blocks. Also does the runtime's own upkeep (Lite: restart a
        dead zygote, its busy limit, re-minting held tokens)."""

    def observe(self, attempts: Sequence[Attempt],
                heartbeats: Mapping[AttemptRef, float | None] | None = None) -> Mapping[AttemptRef, Presence]:
        """The presence of each open attempt, batched, from what the runtime holds.

        ``heartbeats``: seconds since each attempt's TI ``last_heartbeat_at`` (None or absent: unknown, or no
        heartbeat). An attempt whose heartbeat is at most ``[leoflow] agent_lost_threshold`` old is alive whatever
        a runtime's object says, so it is never GONE on that word alone (DESIGN §2 "proof of death"; k8s review
        §14). Lite ignores it: a pid on this machine is proof either way."""

    def start_progress(self, attempts: Sequence[Attempt]) -> Mapping[AttemptRef, StartProgress]:
        """How far each of these LIVE attempts (the reaper passes those whose TI is QUEUED) got toward running its
        agent, from what the runtime holds (never the network). An attempt left out: the runtime cannot tell
        (Lite: always), and the dispatch-lost reaper counts from its dispatch."""

    def locate(self, attempt: Attempt) -> RuntimeFacts | None:
        """Look up an attempt that has no recorded handle (a CLAIMED row not in flight here): its facts when
        something of it runs, else None."""

    def evidence(self, attempt: Attempt) -> Evidence:
        """What a GONE attempt left (never raises); :meth:`Evidence.unknown` while the runtime cannot read it yet
        (for a bounded time after :meth:`start`; k8s review §2)."""

    def kill(self, attempt: Attempt, *, grace: float) -> Presence:
        """Start killing everything of the attempt and return at once (never waits out ``grace``).

        :param grace: seconds the task gets between SIGTERM and SIGKILL, as Airflow's supervisor gives a
            killed task ``[core] killed_task_cleanup_time`` so the operator's ``on_kill`` runs. The runtime
            escalates to a SIGKILL of everything left once it is over, on its own (Lite: the zygote's loop, or
            :meth:`poll` for an agent no zygote of ours owns). 0: SIGKILL now, for a launch that must not run
            at all.
        :returns: GONE once nothing of the attempt is left (an immediate kill that worked, or nothing there);
            LIVE while something of it may run (a graceful kill in its grace: the end comes as ``Exited`` /
            GONE through :meth:`poll` and :meth:`observe`); UNKNOWN when it cannot be signalled from here
            (another host's attempt).
        """

    def kill_launch(self, launch_id: str) -> None:
        """Kill a launch the lifecycle does not know (a ``Started`` for a closed or unknown attempt) at once:
        it must not run at all, so no grace."""

    def forget(self, ref: AttemptRef) -> None:
        """The lifecycle closed ``ref``: drop whatever the runtime remembers of it."""

    def adopt(self, attempt: Attempt) -> None:
        """A predecessor's attempt that still runs: watch it (it counts against this runtime's capacity)."""

    def collect(self, is_closed: Callable[[str, int], bool],
                workload_of: Callable[[str, int], str | None] | None = None) -> int:
        """Remove what settled attempts left behind; the count removed. ``is_closed(ti_id, epoch)`` answers a
        :class:`LedgerRow` (truthy: closed or absent); ``workload_of(ti_id, epoch)`` the attempt's ledger
        ``workload_json`` (None: no such row), for what a runtime keeps before it removes (a pod's log)."""

    def extra_capacity(self, parallelism: int, running_ages: Sequence[float]) -> int:
        """Workloads the runtime can hold beyond free slots right now (Lite: the adaptive queue-ahead)."""

    def slot_freed(self, held_for: float) -> None:
        """An attempt held its slot for ``held_for`` seconds (feeds :meth:`extra_capacity`)."""
