"""The attempt lifecycle, written once over the Runtime seam (DESIGN §2, §3).

dispatch -> events -> evidence -> reconcile -> settle -> adopt -> reap. :class:`Lifecycle` reads the ledger,
asks the :class:`~leoflow_airflow.lifecycle.runtime.Runtime` what runs, asks Airflow (through
:class:`~leoflow_airflow.lifecycle.airflow.AirflowPort`) what it knows, and returns
:mod:`~leoflow_airflow.lifecycle.actions` for the executor to perform; it never calls the executor.

Rules it keeps (``docs/DESIGN.md`` §2 "Lifecycle seam"):

* **Dispatch never settles.** A previous epoch that is not CLOSED makes a dispatch DEFERRED; the cycle settles
  it, and a re-dispatch is a ``Reoffer`` the next ``trigger_tasks`` dispatches through the normal path.
* **UNKNOWN is never settled or reaped**; an attempt without a handle is looked up (``Runtime.locate``).
* A SETTLING row not being settled by this process (its settler died) is settled again: the replay is
  idempotent (200 = already so, 409 = moved on). A row stays SETTLING while its replay is retried, so SETTLING
  means "a replay of ours was sent and may have landed": when Airflow already holds the recorded report, that
  replay landed after its caller gave up (a timeout, a dead settler) and the row closes ``replayed``.
* Settling stops for the pass at ``[leoflow] settle_budget`` settles, after ``[leoflow] settle_timeout``
  seconds of wall clock, or after the first replay that did not settle.
* **Kills** (issue 8 hole 16). A kill of an agent whose task may be doing the user's work is graceful: the
  task gets SIGTERM (its operator's ``on_kill`` runs, as under Airflow's own supervisor) and ``[core]
  killed_task_cleanup_time`` seconds before the runtime SIGKILLs what is left; that is the agent-lost reaper
  (``reap_kill_grace``, kept inside the recovery window by ``ladder.reap_kill_grace``) and ``terminate()``.
  A kill of a launch that must not run at all is immediate (grace 0): a ``Started`` nobody knows, a held
  launch never started, ``revoke`` (Airflow revokes QUEUED TIs: stuck in queued) and the dispatch-lost reaper
  (the agent never reached ``/run``, so no body runs). A kill is signalled once per attempt (the in-flight
  kill set) and never waited for in a ``sync()``: it ends through the normal path, ``Exited`` / GONE ->
  evidence -> settle.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from leoflow_agent.outcome import OutcomeRecord, Reason
from leoflow_agent.protocol import callback_launch_id
from leoflow_airflow import airflow_db, hooks, hosts, metrics, reconcile
from leoflow_airflow.dispatch.disposition import Disposition, DispatchResult
from leoflow_airflow.dispatch.guard import guard
from leoflow_airflow.hookspecs import AttemptInfo
from leoflow_airflow.ledger.states import (
    LIVE_STATES,
    OPEN_STATES,
    SETTLE_STATES,
    AttemptRef,
    AttemptState,
    Resolution,
)
from leoflow_airflow.ledger.store import Move
from leoflow_airflow.lifecycle.actions import (
    ChangeState,
    Fail,
    Occupy,
    Release,
    Reoffer,
    SchedulerAction,
    SendCallback,
    Succeed,
    TaskEvent,
)
from leoflow_airflow.lifecycle.airflow import AirflowPort
from leoflow_airflow.lifecycle.launches import Launch, LaunchTable
from leoflow_airflow.lifecycle.runtime import (
    MAX_DETAIL_CHARS,
    CallbackDone,
    EndKind,
    Evidence,
    Exited,
    LaunchFailed,
    LaunchSpec,
    LedgerRow,
    Presence,
    Reported,
    Runtime,
    RuntimeEvent,
    Started,
    launch_id,
)
from leoflow_airflow.reap import lost as reapers
from leoflow_airflow.reap import orphan
from leoflow_airflow.reap.gate import SettlingGate

if TYPE_CHECKING:
    from leoflow_airflow.ledger.store import Attempt, LedgerStore
    from leoflow_airflow.settings import LeoflowSettings

log = logging.getLogger(__name__)

_UNREAD: Any = object()
"""Not read ahead (:meth:`Lifecycle._read_ahead`): read it now."""

RECOVERIES = frozenset({Resolution.REPLAYED, Resolution.INFRA_REDRIVE, Resolution.OOM_REDRIVE,
                        Resolution.REDISPATCHED})
"""Resolutions that are a recovery leoflow made (``leoflow.recovery.<resolution>``)."""

_S = AttemptState

ACT_STATES: frozenset[AttemptState] = frozenset({_S.CLAIMED, *SETTLE_STATES})
"""States read whole every ``sync()``: rows that need action now (looked up, settled) and are few."""


@dataclass(frozen=True)
class LivePage:
    """One keyset page of LIVE attempts (:meth:`Lifecycle.next_page`): ``rows`` have ids in ``(after, upto]``
    (``upto`` None: to the end of the table); ``wrapped``: this page ended a sweep (the next one starts over)."""

    rows: list[Attempt]
    after: int
    upto: int | None
    wrapped: bool

    def covers(self, row_id: int | None) -> bool:
        """True when a row with this id, were it LIVE, would be in this page."""
        return row_id is not None and row_id > self.after and (self.upto is None or row_id <= self.upto)


class Lifecycle:
    """One executor's attempt lifecycle.

    :param ledger: the attempt ledger.
    :param runtime: where attempts run.
    :param airflow: Airflow's rows and APIs.
    :param settings: the parsed ``[leoflow]`` section (seconds for durations).
    :param job_id: the scheduler job id (the pre-launch guard's ``queued_by_job_id``), or None.
    :param monotonic: ``monotonic() -> float`` seconds (injected by tests).
    :param utcnow: ``utcnow() -> datetime`` tz-aware (injected by tests; the reapers' clock).
    :param fault_for: TEST ONLY ``fault_for(workload, attempt_epoch) -> str | None``.
    :param kill_grace: seconds a graceful kill gives the task between SIGTERM and SIGKILL (``[core]
        killed_task_cleanup_time``); ``terminate()`` uses it.
    :param reap_kill_grace: the agent-lost reaper's grace, seconds (``None``: ``kill_grace``); the executor
        sets it at ``start()`` from :func:`leoflow_airflow.ladder.reap_kill_grace`, which keeps the kill inside
        the recovery window.
    """

    def __init__(self, *, ledger: LedgerStore, runtime: Runtime, airflow: AirflowPort, settings: LeoflowSettings,
                 job_id: int | None = None, monotonic: Callable[[], float] = time.monotonic,
                 utcnow: Callable[[], Any] | None = None,
                 fault_for: Callable[[Any, int], str | None] | None = None,
                 kill_grace: float = 0.0, reap_kill_grace: float | None = None) -> None:
        from datetime import datetime, timezone

        self.ledger, self.runtime, self.airflow, self.settings = ledger, runtime, airflow, settings
        self._waiting_for_api: set[AttemptRef] = set()  # re-dispatches waiting for the Execution API (hole 4)
        self.job_id = job_id
        self.monotonic = monotonic
        self.utcnow = utcnow or (lambda: datetime.now(timezone.utc))
        self.fault_for = fault_for
        self.table = LaunchTable()
        self.gate = SettlingGate(grace=settings.reap_grace)
        self.gate.reset(monotonic())
        self._out: list[SchedulerAction] = []
        self._settling: set[AttemptRef] = set()  # settles in flight in this process
        # monotonic time of each attempt's last replay that did not land: a pass tries the others first, so one
        # TI whose PATCH keeps hanging cannot starve every other lost report (issue 8 hole 11)
        self._replay_stalled_at: dict[AttemptRef, float] = {}
        self._later: list[tuple[float, Reoffer]] = []  # (due, re-offer): backed-off re-dispatches
        self.draining = False  # end(): nothing new is dispatched
        self.kill_grace = float(kill_grace)
        self.reap_kill_grace = self.kill_grace if reap_kill_grace is None else float(reap_kill_grace)
        # reaper kills signalled and not yet over: ref -> monotonic time past which a still-live attempt is
        # killed once more, at once (the runtime lost the kill: e.g. its zygote died mid-grace)
        self._killing: dict[AttemptRef, float] = {}
        # attempts a reaper killed because they cannot start: ref -> (what follows once gone, why). In memory: a
        # restarted scheduler re-dispatches such an attempt, and the new one is judged again (issue 10 item 1)
        self._start_ends: dict[AttemptRef, tuple[reapers.After, str]] = {}
        self._kill_ids: dict[AttemptRef, int | None] = {}  # the ledger id of each ``_killing`` entry's row
        # the LIVE page :meth:`reconcile` last observed and its TIs' (state, last_heartbeat_at), for :meth:`reap`
        self._page_liveness: tuple[LivePage, dict[str, tuple[str | None, Any]]] | None = None
        self._evidence: dict[AttemptRef, Evidence] = {}  # what _settle read, while it acts (the settled hook)
        self._unwritten: list[Move] = []  # ledger moves of runtime events not written yet (apply)
        # what one reconcile pass read ahead for its settles (_read_ahead): logical TI -> row, ti_id -> current
        self._ahead_rows: dict[tuple[str, str, str, int], Any] = {}
        self._ahead_current: dict[str, Attempt | None] = {}
        # keyset cursors (issue 10 item 1): the last ledger id of the LIVE page read last (0: a new sweep starts),
        # and the last task instance id of the orphan-run reaper's page of Airflow's RUNNING rows (None: start)
        self._live_after = 0
        self._orphan_after: str | None = None
        # monotonic time from which the next sync() makes a presence pass ([leoflow] sweep_interval apart)
        self._presence_due = float("-inf")
        # which task instances this executor queued (the orphan-run reaper's candidates); the executor sets it
        # at start() from its name. Until then nothing is taken for this executor's
        self.ownership = orphan.Ownership(frozenset(), default=False)

    # --- output -----------------------------------------------------------------------------------------
    def take(self) -> list[SchedulerAction]:
        """The actions produced since the last call, in order, for the executor to perform."""
        out, self._out = self._out, []
        return out

    def key_of(self, attempt: Attempt) -> Any:
        """Airflow's ``TaskInstanceKey`` of ``attempt``."""
        return self.airflow.task_key(attempt.dag_id, attempt.task_id, attempt.run_id, attempt.ref.try_number,
                                     attempt.map_index)

    def running_ages(self) -> list[float]:
        """Seconds each slot-holding launch has run (for the runtime's queue-ahead)."""
        now = self.monotonic()
        return [now - l.launched_at for l in self.table.holders() if l.launched_at is not None]

    def busy(self) -> bool:
        """True while any launch of this process has not exited."""
        return any(not launch.exited for launch in self.table.launches.values())

    # --- dispatch ---------------------------------------------------------------------------------------
    def dispatch_task(self, workload: Any) -> DispatchResult:
        """Dispatch one ``ExecuteTask``: :meth:`dispatch_tasks` of one."""
        return next(self.dispatch_tasks([workload]))

    def dispatch_tasks(self, workloads: Sequence[Any]) -> Iterator[DispatchResult]:
        """Dispatch ``ExecuteTask`` workloads in order (DESIGN §3 "Dispatch"), yielding one result each as it is
        decided, so a caller acts on every launch made before an error: guard, clear the previous epoch (never
        settling it), claim an epoch, launch. DISPATCHED: its key holds a slot.

        The guard's ``task_instance`` rows and the ledger's current epochs of the whole batch are read up front,
        one query each, instead of two per workload: the scheduler hands over a batch (up to ``[scheduler]
        max_tis_per_query`` at a time) inside its loop, and under load each statement is a round trip that waits
        for a CPU, so per-workload reads delayed the loop's next batch (issue 11's fan-out at parallelism 32).
        A row read up front is as good as one read just before the launch: the guard is a point-in-time check
        either way, and the fence that matters is the Execution API's (a stale attempt cannot start). A ti_id
        seen twice in one batch is read again for its second workload, after its first one's claim.

        :raises sqlalchemy.exc.SQLAlchemyError: from the reads or a claim (the scheduler loop logs it; workloads
            not reached stay queued and are offered again).
        """
        if self.draining:
            for _ in workloads:
                yield DispatchResult(Disposition.DEFERRED, "the executor is shutting down")
            return
        ids = [str(w.ti.id) for w in workloads]
        rows, currents = self.airflow.ti_rows_by_id(ids), self.ledger.current_many(ids)
        seen: set[str] = set()
        for workload, ti_id in zip(workloads, ids, strict=True):
            if ti_id in seen:  # its earlier workload may have claimed: read it again
                row, previous = self.airflow.ti_row_by_id(ti_id), self.ledger.current(ti_id)
            else:
                row, previous = rows.get(ti_id), currents.get(ti_id)
            seen.add(ti_id)
            yield self._dispatch_one(workload, row, previous)

    def _dispatch_one(self, workload: Any, row: Any, previous: Attempt | None) -> DispatchResult:
        """One workload of :meth:`dispatch_tasks`, given its ``task_instance`` row and current ledger row."""
        if (refused := self.runtime.admit()) is not None:
            return refused
        ti = workload.ti
        ti_id = str(ti.id)
        if reason := guard(row, ti_id=ti_id, try_number=ti.try_number, job_id=self.job_id):
            return DispatchResult(Disposition.STALE, reason)
        if previous is not None and previous.state != _S.CLOSED:
            if (wait := self._clear_previous(previous)) is not None:
                return wait
        attempt = self.ledger.claim_epoch(
            ti_id=ti_id, try_number=ti.try_number, dag_id=ti.dag_id, task_id=ti.task_id, run_id=ti.run_id,
            map_index=ti.map_index, runtime=self.runtime.kind,
            workload_json=workload.model_dump_json(exclude={"token"}), scheduler_job_id=self.job_id,
            record_path_for=lambda epoch: self.runtime.record_path(ti_id, epoch), host=self.runtime.host,
            known_top=previous.ref.attempt_epoch if previous is not None else 0,
        )
        ref = attempt.ref
        fault = self.fault_for(workload, ref.attempt_epoch) if self.fault_for is not None else None
        lid = launch_id(ref)
        result = self.runtime.launch(LaunchSpec(lid, ref, workload, attempt.record_path, fault))
        if result.disposition != Disposition.DISPATCHED:
            if self.ledger.transition(ref, expected=[_S.CLAIMED], to=_S.CLOSED, resolution=Resolution.LAUNCH_FAILED,
                                      detail=result.reason[:MAX_DETAIL_CHARS]):
                self._settled(attempt, Resolution.LAUNCH_FAILED, result.reason)
            return result
        self.table.add(lid, Launch(workload.key, workload, ref))
        return result

    def _clear_previous(self, previous: Attempt) -> DispatchResult | None:
        """None once the previous epoch of the ti_id is CLOSED; else DEFERRED (the cycle settles it)."""
        ref = previous.ref
        if previous.state == _S.CLAIMED:
            launch = self.table.get(launch_id(ref))
            if launch is not None and not launch.adopted:
                return DispatchResult(Disposition.DEFERRED, f"epoch {ref.attempt_epoch} is on its way to the runtime")
            if self.runtime.observe([previous]).get(ref) != Presence.GONE:  # found running, or another host's
                return DispatchResult(Disposition.DEFERRED, f"epoch {ref.attempt_epoch}'s agent runs unrecorded")
            if not self._close(previous, Resolution.ABANDONED, "never launched", expected=[_S.CLAIMED]):
                return DispatchResult(Disposition.DEFERRED, f"epoch {ref.attempt_epoch} moved on; retrying")
            return None
        if previous.state in LIVE_STATES:
            if self.runtime.observe([previous]).get(ref) != Presence.GONE:
                return DispatchResult(Disposition.DEFERRED, f"epoch {ref.attempt_epoch} of {ref.ti_id} is still alive")
            self.ledger.transition(ref, expected=LIVE_STATES, to=_S.EXITED)
        return DispatchResult(Disposition.DEFERRED, f"epoch {ref.attempt_epoch} of {ref.ti_id} awaits settlement")

    def dispatch_callback(self, workload: Any) -> DispatchResult:
        """Dispatch one ``ExecuteCallback``; its result comes back as a ``ChangeState``."""
        if self.draining:
            return DispatchResult(Disposition.DEFERRED, "the executor is shutting down")
        lid = callback_launch_id(workload.callback.id, time.monotonic_ns())
        result = self.runtime.launch_callback(lid, workload)
        if result.disposition == Disposition.DISPATCHED:
            self.table.add(lid, Launch(workload.key, workload, None))
        return result

    # --- one sync() -----------------------------------------------------------------------------------
    def cycle(self) -> list[SchedulerAction]:
        """One ``sync()``: apply the runtime's events, reconcile (every row that needs action; on a presence
        pass also one page of LIVE ones), and on a presence pass reap that page and one page of Airflow's
        RUNNING task instances behind the settling gate; collect. The gate counts a sweep when the LIVE cursor
        wraps: every LIVE row was looked at once.

        A presence pass comes at most every ``[leoflow] sweep_interval`` seconds (0: every cycle): the scheduler
        calls ``sync()`` on every loop, several times a second while tasks start and end, and a pass's reads (the
        ledger's LIVE rows, Airflow's liveness of their task instances and its RUNNING rows) are most of a
        cycle's statements and grow with the page (14-26 ms of CPU at 10,000 running pods, ``bench.kube_reap``),
        while every reaper threshold is tens of seconds. Events (a report, an exit) and the rows
        that need action are still handled on every cycle, so a slot is freed and a lost report settled without
        waiting for the next pass."""
        self.apply(self.runtime.poll())
        self._release_later()
        now = self.monotonic()
        presence_pass = now >= self._presence_due
        if presence_pass:
            self._presence_due = now + self.settings.sweep_interval
        page, presence = self.reconcile(presence_pass=presence_pass)
        if page.wrapped:
            self.gate.swept()
        if presence_pass and self.gate.is_open(self.monotonic()):
            self.reap(page, presence)
            try:
                self.reap_orphans()
            except Exception:  # noqa: BLE001 - a failed read of Airflow's rows waits for the next cycle
                log.exception("leoflow orphan-run reaper failed; trying again next cycle")
        try:
            removed = self.runtime.collect(self._is_closed, self._workload_of)
        except Exception:  # noqa: BLE001 - GC must never break the scheduler loop
            log.exception("leoflow record GC failed")
        else:
            if removed:
                log.info("leoflow GC removed %d settled attempts' record directories", removed)
        return self.take()

    def _is_closed(self, ti_id: str, epoch: int) -> LedgerRow:
        """:meth:`Runtime.collect`'s ``is_closed``: CLOSED, OPEN, or ABSENT (no such row: truthy, but never proof
        for a runtime that shares its namespace; k8s review §5)."""
        row = self.ledger.get_epoch(ti_id, epoch)
        if row is None:
            return LedgerRow.ABSENT
        return LedgerRow.CLOSED if row.state == _S.CLOSED else LedgerRow.OPEN

    def _workload_of(self, ti_id: str, epoch: int) -> str | None:
        """:meth:`Runtime.collect`'s ``workload_of``: the attempt's ledger ``workload_json``, None without a row."""
        row = self.ledger.get_epoch(ti_id, epoch)
        return None if row is None else row.workload_json

    # --- events -----------------------------------------------------------------------------------------
    def apply(self, events: Sequence[RuntimeEvent]) -> None:
        """Turn runtime facts into guarded ledger writes and slot changes (facts only; nothing settles).

        The slot and launch-table changes happen event by event, in order; the ledger moves the events call for
        are written together at the end (:meth:`LedgerStore.transition_many`: one statement per kind of move on
        PostgreSQL, each attempt's moves in order), and a Started whose move changed nothing is then checked
        (:meth:`_start_refused`). Nothing of this cycle reaches Airflow before the writes are done.

        The events are the runtime's to give once, so moves that were not written (a database error, or the
        ``SystemExit`` Airflow's SIGTERM handler raises wherever the scheduler's thread is, after which
        ``end()`` still runs) are kept and written first by the next call (``end()``'s drain makes one): a
        guarded move written twice changes nothing the second time."""
        moves: list[Move] = list(self._unwritten)
        self._unwritten = moves  # until transition_many returns
        started: list[tuple[int, Started, Launch]] = []
        for event in events:
            launch = self.table.get(event.launch_id)
            if isinstance(event, Started):
                if launch is None:
                    log.warning("launch %s started but this executor does not know it; killing it", event.launch_id)
                    self.runtime.kill_launch(event.launch_id)
                    continue
                launch.launched_at = self.monotonic()
                if launch.ref is not None:
                    started.append((len(moves), event, launch))
                    moves.append(Move(launch.ref, (_S.CLAIMED,), _S.DISPATCHED, dict(event.facts)))
            elif launch is None:
                log.debug("event for an unknown launch: %r", event)
            elif isinstance(event, LaunchFailed):
                self._launch_failed(event, launch, moves)
            elif isinstance(event, Reported):
                if launch.ref is not None:
                    moves.append(Move(launch.ref, (_S.DISPATCHED,), _S.REPORTED, {"reported_state": event.state}))
                self._free(event.launch_id, launch)  # the slot is freed at the terminal report
            elif isinstance(event, Exited):
                launch.exited = True
                if launch.ref is not None:
                    moves.append(Move(launch.ref, tuple(LIVE_STATES), _S.EXITED, {"exit_status": event.exit_code}))
            elif isinstance(event, CallbackDone):
                self._free(event.launch_id, launch)
                self.table.pop(event.launch_id)
                state = launch.workload.success_state if event.ok else launch.workload.failure_state
                if event.ok is None:
                    log.warning("callback launch %s: its outcome is unknown; reporting it failed", event.launch_id)
                self._out.append(ChangeState(launch.key, state))
        if not moves:
            return
        changed = self.ledger.transition_many(moves)
        self._unwritten = []
        for index, event, launch in started:
            if not changed[index]:
                self._start_refused(event, launch)

    def _start_refused(self, event: Started, launch: Launch) -> None:
        """A Started whose CLAIMED -> DISPATCHED move changed nothing: the very agent already recorded (found by
        its title marker after a scheduler restart) runs on; any other was revoked or closed while its launch
        was in flight and is killed, unless an Exited event of the same cycle says it is gone already."""
        if launch.exited:
            return
        row = self.ledger.get(launch.ref)
        if row is not None and row.state in LIVE_STATES and event.facts and \
                (row.pid, row.proc_start_time) == (event.facts.get("pid"), event.facts.get("proc_start_time")):
            return  # this very agent was recorded already (found by its title marker): it runs on
        log.info("attempt %s was closed before its agent started; killing it", launch.ref)
        self.runtime.kill_launch(event.launch_id)

    def _launch_failed(self, event: LaunchFailed, launch: Launch, moves: list[Move]) -> None:
        self._free(event.launch_id, launch)
        self.table.pop(event.launch_id)
        if launch.ref is not None:
            moves.append(Move(launch.ref, (_S.CLAIMED,), _S.CLOSED, {
                "resolution": Resolution.LAUNCH_FAILED, "detail": event.error[:MAX_DETAIL_CHARS]}))
        if event.retryable and launch.workload is not None:
            log.warning("launch %s failed transiently (%s); re-offering it", event.launch_id, event.error)
            self._out.append(Reoffer(launch.key, launch.workload, callback=launch.ref is None))
        else:
            log.error("the runtime could not launch %s: %s", event.launch_id, event.error)
            self._out.append(Fail(launch.key, f"leoflow could not launch the workload: {event.error}",
                                  log_path=getattr(launch.workload, "log_path", None)))

    def _free(self, lid: str, launch: Launch) -> None:
        actions, held_for = self.table.free(lid, launch, self.monotonic())
        self._out.extend(actions)
        if held_for is not None:
            self.runtime.slot_freed(held_for)

    # --- reconcile --------------------------------------------------------------------------------------
    def next_page(self) -> LivePage:
        """Read the next keyset page of this runtime's LIVE attempts (``[leoflow] reap_page_size`` rows at most,
        ascending ledger id after the cursor) and move the cursor on; after the last page it wraps to the start.
        One read of ``reap_page_size + 1`` rows per LIVE state: the extra row tells whether the page is the last."""
        size = self.settings.reap_page_size
        after = self._live_after
        rows = self.ledger.open_page(states=LIVE_STATES, after_id=after, limit=size + 1, runtime=self.runtime.kind)
        if len(rows) > size:
            rows = rows[:size]
            self._live_after = rows[-1].id or 0
            return LivePage(rows, after, rows[-1].id, wrapped=False)
        self._live_after = 0
        return LivePage(rows, after, None, wrapped=True)

    def reconcile(self, *, presence_pass: bool = True) -> tuple[LivePage, dict[AttemptRef, Presence]]:
        """Turn presence into attempt states and settle dead attempts within the pass's budget.

        Reads every row that needs action now (:data:`ACT_STATES`: CLAIMED, EXITED, SETTLING) and, when
        ``presence_pass``, one keyset page of LIVE rows (:meth:`next_page`), so its cost does not grow with the
        number of running attempts: only the page is observed, and a LIVE row found GONE is moved to EXITED and
        settled at once. Returns the page (without ``presence_pass``: an empty one that covers no row and ends
        no sweep) and its presence (the reapers act on that same page).

        The page's task instances' heartbeats are read first (``AirflowPort.ti_liveness``, one query, which
        :meth:`reap` reuses) and handed to ``Runtime.observe``: an attempt whose TI heartbeats is alive whatever
        its pod object says (DESIGN §2 "proof of death"; k8s review §14)."""
        acting = self.ledger.in_states(ACT_STATES, runtime=self.runtime.kind)
        page = self.next_page() if presence_pass else LivePage([], self._live_after, self._live_after, wrapped=False)
        live = page.rows
        by_ref = {a.ref: a for a in acting}
        by_ref.update((a.ref, a) for a in live)  # read last: a row in both moved on in between
        attempts = self._not_a_live_peers(sorted(by_ref.values(), key=lambda a: a.id or 0))
        presence: dict[AttemptRef, Presence] = {}
        if live:
            tis = self.airflow.ti_liveness([a.ref.ti_id for a in live])
            self._page_liveness = (page, tis)
            presence = dict(self.runtime.observe(live, heartbeat_ages(live, tis, self.utcnow())))
        for ref in self._silent_foreign(live, presence):
            presence[ref] = Presence.GONE  # settled from DB-only evidence below
        budget = _Budget(self.settings.settle_budget, self.monotonic() + self.settings.settle_timeout, self.monotonic)
        stalled = self._replay_stalled_at
        ordered = sorted(attempts, key=lambda a: stalled.get(a.ref, float("-inf")))  # stable: ledger order
        self._read_ahead([a for a in ordered if a.state in SETTLE_STATES
                          or (a.state in LIVE_STATES and presence.get(a.ref) == Presence.GONE)]
                         [:self.settings.settle_budget])
        try:
            for attempt in ordered:
                if attempt.state == _S.CLAIMED:
                    self._claimed(attempt)
                    continue
                if attempt.state in LIVE_STATES and presence.get(attempt.ref) == Presence.GONE:
                    if self.ledger.transition(attempt.ref, expected=LIVE_STATES, to=_S.EXITED):
                        attempt = self.ledger.get(attempt.ref) or attempt
                if attempt.state in SETTLE_STATES and attempt.ref not in self._settling and budget.take():
                    self._settle(attempt, budget)
        finally:
            self._forget_ahead()
        return page, presence

    def _read_ahead(self, attempts: list[Attempt]) -> None:
        """Read, in one query each, what settling ``attempts`` (the pass's first ``[leoflow] settle_budget``
        candidates: no more can be settled in it) will read one by one: their logical task
        instances' rows (``AirflowPort.ti_rows``) and their current epochs (``LedgerStore.current_many``).
        :meth:`_settle_one` takes each once; any act of the pass other than a ledger-only close drops the rest
        (it may have changed Airflow's rows or the epochs), so no decision rests on a read older than the pass's
        last outside act. py-spy of a ``bench_fanout`` at parallelism 32: 0.8 s of the scheduler's wall in the
        per-attempt read of 50 settles, each an ORM load through its own Airflow session."""
        if len(attempts) < 2:
            return
        keys = sorted({(a.dag_id, a.run_id, a.task_id, a.map_index) for a in attempts})
        rows = self.airflow.ti_rows(keys)
        self._ahead_rows.update((k, rows.get(k)) for k in keys)
        ti_ids = sorted({a.ref.ti_id for a in attempts})
        current = self.ledger.current_many(ti_ids)
        self._ahead_current.update((ti_id, current.get(ti_id)) for ti_id in ti_ids)

    def _forget_ahead(self) -> None:
        """Drop what :meth:`_read_ahead` read and no settle took yet."""
        self._ahead_rows.clear()
        self._ahead_current.clear()

    def _not_a_live_peers(self, attempts: list[Attempt]) -> list[Attempt]:
        """``attempts`` without the rows another scheduler owns (``scheduler_job_id``) while its job is alive (one
        query), CLAIMED rows excepted (:meth:`_claimed` judges those itself). Their owner moves them to EXITED and
        settles them, and must: closing a row is what frees the owner's executor slot for it. Settled by a peer,
        the owner's slot stayed taken for good (issue 10 item 5: two schedulers on Kubernetes each dispatched
        nothing more once ``[core] parallelism`` of their rows had been closed by the other). A dead owner's rows
        are settled here. The reapers still see every row of the page (``page``, ``presence``)."""
        peers = {a.scheduler_job_id for a in attempts
                 if a.state != _S.CLAIMED and a.scheduler_job_id is not None and a.scheduler_job_id != self.job_id}
        if not peers:
            return attempts
        alive = self.airflow.jobs_alive(peers)
        return [a for a in attempts if a.state == _S.CLAIMED or a.scheduler_job_id not in alive]

    def _silent_foreign(self, live: Sequence[Attempt], presence: dict[AttemptRef, Presence]) -> list[AttemptRef]:
        """Another host's live attempts that may be settled here (``hosts.decide_foreign``: TI heartbeat silent
        past ``agent_lost_threshold`` and owner scheduler job not alive); only once the settling gate is open."""
        foreign = [a for a in live if presence.get(a.ref) == Presence.UNKNOWN
                   and hosts.is_foreign(a.host, self.runtime.host)]
        if not foreign or not self.gate.is_open(self.monotonic()):
            return []
        tis = self.airflow.ti_liveness([a.ref.ti_id for a in foreign])
        alive = self.airflow.jobs_alive({a.scheduler_job_id for a in foreign if a.scheduler_job_id is not None})
        views = [hosts.ForeignView(a.ref, *tis.get(a.ref.ti_id, (None, None)), owner_alive=a.scheduler_job_id in alive)
                 for a in foreign]
        decisions = hosts.decide_foreign(views, self.utcnow(), self.settings.agent_lost_threshold)
        for decision in decisions:
            log.warning("attempt %s: %s; settling it from the database", decision.ref, decision.why)
        return [decision.ref for decision in decisions]

    def _claimed(self, attempt: Attempt) -> None:
        """A CLAIMED row: ours and in flight is left alone; anything else is looked up, never presumed dead."""
        lid = launch_id(attempt.ref)
        launch = self.table.get(lid)
        if launch is not None and not launch.adopted:
            return  # ours, on its way: Started or LaunchFailed follows
        if launch is None:
            # not ours and not offered to adoption: another scheduler's claim in flight, or a leak; act only once
            # its owner scheduler is not alive (its ``Started`` may be on its way: issue 8 hole 14) and Airflow no
            # longer wants exactly this attempt queued
            owner = attempt.scheduler_job_id
            if owner is not None and owner != self.job_id and owner in self.airflow.jobs_alive({owner}):
                return
            row = self.airflow.ti_row_by_id(attempt.ref.ti_id)
            if row is not None and row.state == "queued" and row.try_number == attempt.ref.try_number:
                return
        facts = self.runtime.locate(attempt)
        if facts:
            if self.ledger.transition(attempt.ref, expected=[_S.CLAIMED], to=_S.DISPATCHED, **facts):
                log.warning("attempt %s: found its agent (%s) running unrecorded; adopting it", attempt.ref, facts)
                refreshed = self.ledger.get(attempt.ref)
                if refreshed is not None:
                    self.runtime.adopt(refreshed)
            return
        if self.runtime.observe([attempt]).get(attempt.ref) != Presence.GONE:
            return  # no agent, but something of it may still run: looked at again next cycle
        row = self.airflow.ti_row_by_id(attempt.ref.ti_id)
        if row is None or row.state != "queued" or row.try_number != attempt.ref.try_number:
            # Airflow no longer holds exactly this attempt queued: its agent may have run (reached /run, even
            # written its record) before it died unrecorded, e.g. a scheduler killed right after the fork. Its
            # evidence decides, through DESIGN §2's table, never a close that drops it
            if self.ledger.transition(attempt.ref, expected=[_S.CLAIMED], to=_S.EXITED):
                log.warning("attempt %s: its agent ran unrecorded and is gone; settling it from its evidence",
                            attempt.ref)
            return
        # adopted, and Airflow holds exactly this attempt QUEUED: its agent never reached /run
        if self._close(attempt, Resolution.ABANDONED, "the previous scheduler never started its agent",
                       expected=[_S.CLAIMED]):
            self._reoffer_stored(attempt, "the previous scheduler never started its agent")

    def _settle(self, attempt: Attempt, budget: _Budget) -> None:
        """Act on DESIGN §2's table for one dead attempt (EXITED, or SETTLING whose settler died); the evidence
        read is kept while it acts, for the ``leoflow_attempt_settled`` hook of the close."""
        try:
            self._settle_one(attempt, budget)
        finally:
            self._evidence.pop(attempt.ref, None)

    def _settle_one(self, attempt: Attempt, budget: _Budget) -> None:
        ref = attempt.ref
        current = self._ahead_current.pop(ref.ti_id, _UNREAD)
        if current is _UNREAD:
            current = self.ledger.current(ref.ti_id)
        if current is None or current.ref != ref:
            self._close(attempt, Resolution.MOVED_ON, "a newer epoch exists")
            return
        evidence = self.runtime.evidence(attempt)
        if not evidence.known:  # the runtime cannot read it yet: no guess, asked again next cycle (k8s review §2)
            log.debug("settling %s: its evidence is not known yet", ref)
            return
        self._evidence[ref] = evidence
        record, cause = evidence.record, evidence.cause
        logical = (attempt.dag_id, attempt.run_id, attempt.task_id, attempt.map_index)
        ti = self._ahead_rows.pop(logical, _UNREAD)
        if ti is _UNREAD:
            ti = self.airflow.ti_row(*logical)
        action = reconcile.decide(ti_id=ref.ti_id, try_number=ref.try_number, record=record, ti=ti,
                                  reported=attempt.reported_state is not None, cause=cause,
                                  oom_redriven=((cause is not None and cause.kind is EndKind.OOM_KILLED)
                                                or (record is not None and record.reason == Reason.OOM_KILLED))
                                  and self._oom_redriven(attempt))
        key = self.key_of(attempt)
        log.debug("settling %s: %s (%s)", ref, action.act, action.why)
        if action.act != reconcile.Act.CLOSE:  # it may change Airflow's rows or the epochs: read afresh
            self._forget_ahead()
        if action.act == reconcile.Act.CLOSE:
            launch = self.table.get(launch_id(ref))
            if attempt.state == _S.SETTLING and action.resolution == Resolution.REPORTED and record is not None:
                # a SETTLING row's agent never reported (it would not have been replayed), so the report Airflow
                # holds is a replay of ours that landed after its caller gave up: close it as replayed and do
                # what the task child could not (issue 8 hole 6)
                closed = self._replayed(attempt, record, key, f"an earlier replay landed (the TI is now {ti.state})")
            else:
                closed = self._close(attempt, action.resolution, action.why)
            if closed and launch is not None and launch.adopted:
                self._dispatch_stranded(attempt, ti)
        elif action.act == reconcile.Act.RESTARTING_SUCCESS:
            if self._close(attempt, action.resolution, action.why):
                self._out.append(Succeed(key))
        elif action.act == reconcile.Act.REPLAY:
            assert record is not None
            if not budget.replays_allowed:
                self._hold_off_purge(attempt)  # not tried this pass: still keep the purge off its TI
                return
            self._replay(attempt, record, key, budget)
        elif action.act == reconcile.Act.INFRA_REDRIVE:
            self._infra_redrive(attempt, key, action.why, resolution=action.resolution)
        elif action.act == reconcile.Act.REDISPATCH:
            if ref in self._start_ends:
                self._start_ended(attempt, key, *self._start_ends[ref])
            elif action.resolution == Resolution.LAUNCH_FAILED:
                self._no_room(attempt, key, action.why)
            else:
                self._redispatch(attempt, key, action.why)
        elif action.act == reconcile.Act.TASK_FAIL:
            self._task_failed(attempt, key, action.why)

    def _oom_redriven(self, attempt: Attempt) -> bool:
        """This try is the one re-drive of an OOM kill (:func:`reconcile.was_oom_redrive` of the ledger's
        latest earlier try of the logical TI): durable, so a restarted scheduler counts the same."""
        previous = self.ledger.previous_try(attempt.dag_id, attempt.run_id, attempt.task_id, attempt.map_index,
                                            attempt.ref.try_number)
        return reconcile.was_oom_redrive(previous.resolution if previous is not None else None)

    def _task_failed(self, attempt: Attempt, key: Any, why: str) -> None:
        """The runtime's status says the task itself failed (``DeadlineExceeded``, an OOM kill of the try that
        was re-driven for one): close the row (guarded), then a Log row naming the reason and
        ``executor.fail(key, why)``, Airflow's own failure path (failure callback, the user's retries)."""
        if self._close(attempt, Resolution.EXECUTOR_FAILED, why):
            log.warning("attempt %s: %s; failing the task through Airflow", attempt.ref, why)
            self._out.append(TaskEvent(key, "leoflow task failed", why))
            self._out.append(Fail(key, why))

    def _dispatch_stranded(self, attempt: Attempt, ti: Any) -> None:
        """An adopted attempt closed while Airflow holds its TI QUEUED at the same ti_id and try (it handed off:
        deferred, rescheduled, awaiting input): no executor will dispatch it, so re-offer its stored workload
        rather than leave it to the stuck-in-queued timeout."""
        ref = attempt.ref
        if ti is not None and ti.id == ref.ti_id and ti.state == "queued" and ti.try_number == ref.try_number:
            self._reoffer_stored(attempt, "its TI is queued again after a hand-off")

    def _reoffer_stored(self, attempt: Attempt, why: str) -> None:
        log.warning("attempt %s: %s; re-offering its stored workload", attempt.ref, why)
        self._out.append(Reoffer(self.key_of(attempt), self.airflow.workload_from_json(attempt.workload_json)))

    def _hold_off_purge(self, attempt: Attempt) -> None:
        """Keep Airflow's heartbeat purge off the RUNNING TI of ``attempt``, whose recorded report waits for a
        replay, for at most ``[leoflow] replay_holdoff_max_seconds`` after the attempt was found dead (issue 8
        hole 7; :func:`leoflow_airflow.airflow_db.purge_holdoff_allowed`); past that Airflow's own path applies."""
        if airflow_db.purge_holdoff_allowed(since=attempt.exited_at, now=self.utcnow(),
                                            max_seconds=self.settings.replay_holdoff_max_seconds):
            self.airflow.hold_off_purge(attempt.ref.ti_id)

    def _replay(self, attempt: Attempt, record: OutcomeRecord, key: Any, budget: _Budget) -> None:
        """Replay a lost terminal report (settling mark committed first, no transaction across the call). The row
        stays SETTLING until it closes: a replay that failed may still land later (a timeout on a slow
        api-server), and the next settle must know that one was sent."""
        ref = attempt.ref
        sent_before = attempt.state == _S.SETTLING
        if not sent_before and not self.ledger.transition(ref, expected=[_S.EXITED], to=_S.SETTLING):
            return
        self._settling.add(ref)
        try:
            result = self.airflow.replay(record)
        finally:
            self._settling.discard(ref)
        if not result.settled:
            if not result.retryable:  # 401/403/422: the same body will never land
                log.warning("replay of %s was refused (%s); re-driving it as an infra loss", ref, result.detail)
                self._infra_redrive(attempt, key, f"its recorded report was refused ({result.detail})",
                                    expected=[_S.SETTLING])
                return
            budget.replays_allowed = False  # one stalled api-server call per pass at most
            self._replay_stalled_at[ref] = self.monotonic()  # the next pass tries the other lost reports first
            log.warning("replay of %s failed (%s); will retry", ref, result.detail)
            self.ledger.record_facts(ref, expected=[_S.SETTLING], detail=result.detail[:MAX_DETAIL_CHARS])
            self._hold_off_purge(attempt)  # the record is good: keep Airflow's purge from failing it
            return
        if not result.applied and result.detail[:3] in ("404", "410"):
            ti = self.airflow.ti_row(attempt.dag_id, attempt.run_id, attempt.task_id, attempt.map_index)
            if ti is not None and ti.state == "restarting" and ti.try_number == ref.try_number:
                if self._close(attempt, Resolution.RESTARTING, "a user cleared the task while its report was replayed",
                               expected=[_S.SETTLING]):
                    self._out.append(Succeed(key))
                return
        if result.applied or (sent_before and result.detail[:3] == "200"):  # 200 after a sent one: ours landed
            self._replayed(attempt, record, key, result.detail)
        else:
            log.info("replay of %s: %s; closing it moved on", ref, result.detail)
            self._close(attempt, Resolution.MOVED_ON, result.detail, expected=[_S.SETTLING])

    def _replayed(self, attempt: Attempt, record: OutcomeRecord, key: Any, detail: str) -> bool:
        """Close the SETTLING row of ``attempt``, whose recorded report Airflow now holds through a replay of
        ours, as REPLAYED, and make up for the callbacks the task child could not run (DESIGN §2
        "Callbacks"): a Log row for a success, a retry callback request for an up_for_retry; none when the agent
        reported the state itself (``reported_state``: a late call overwrote its landed report, and its task
        child went on to its callbacks as usual). True when this call closed the row (the callbacks follow only
        then)."""
        ref = attempt.ref
        log.warning("leoflow recovered the lost report of %s: %s (%s)", ref, reconcile.outcome_summary(record), detail)
        if record.assets_dropped:
            log.warning("the record of %s had its asset events dropped to fit its size budget", ref)
        if not self._close(attempt, Resolution.REPLAYED, detail, expected=[_S.SETTLING]):
            return False
        if attempt.reported_state is not None:
            return True
        where = dict(dag_id=attempt.dag_id, run_id=attempt.run_id, task_id=attempt.task_id,
                     map_index=attempt.map_index)
        if record.state == "success":
            self.airflow.lost_success_callback(ti_id=ref.ti_id, **where)
        elif record.state == "up_for_retry" and record.callbacks_pending:
            request = self.airflow.retry_callback(
                msg=f"leoflow replayed the lost up_for_retry report of attempt {ref}", **where)
            if request is not None:
                self._out.append(SendCallback(request))
        return True

    def _infra_redrive(self, attempt: Attempt, key: Any, why: str,
                       expected: Sequence[AttemptState] = tuple(SETTLE_STATES),
                       resolution: Resolution = Resolution.INFRA_REDRIVE) -> None:
        """No usable evidence (or an infra loss the runtime named) and the TI is RUNNING: a new try on the infra
        budget, closed with ``resolution`` (``OOM_REDRIVE`` marks an OOM kill's one re-drive), else Airflow's
        own path."""
        from leoflow_airflow.redrive import RedriveResult

        result = self.airflow.infra_redrive(attempt.ref.ti_id, why)
        if result == RedriveResult.REDRIVEN:
            log.warning("attempt %s: %s; re-driven as a new try on the infra budget", attempt.ref, why)
            self._close(attempt, resolution, why, expected=expected)
        elif result == RedriveResult.BUDGET_SPENT:
            if self._close(attempt, Resolution.EXECUTOR_FAILED, f"{why}; infra budget spent", expected=expected):
                log.warning("attempt %s: %s and the infra budget is spent; failing it through Airflow",
                            attempt.ref, why)
                self._out.append(Fail(key, f"{why}; leoflow's infra re-run budget is spent"))
        else:
            self._close(attempt, Resolution.MOVED_ON, "the task instance moved on before the re-drive",
                        expected=expected)

    def _redispatch(self, attempt: Attempt, key: Any, why: str) -> None:
        """The agent died before /run (TI still QUEUED): close the epoch and re-offer the stored workload; the
        next ``trigger_tasks`` dispatches it as epoch + 1 (never from inside a dispatch). ``[leoflow]
        redispatch_limit`` counts the re-dispatches in a row of this dispatch cycle (an epoch that ran and handed
        off starts a new cycle); the n-th one in a row waits ``redispatch_backoff(n)`` seconds."""
        ref = attempt.ref
        if not self.airflow.api_reachable():
            # an agent that died before /run while the Execution API is down says nothing about the workload:
            # leave the epoch EXITED (settled again next pass) and spend nothing of redispatch_limit (hole 4)
            if ref not in self._waiting_for_api:
                log.warning("attempt %s: %s; the Execution API does not answer, so its re-dispatch waits", ref, why)
                self._waiting_for_api.add(ref)
            return
        self._waiting_for_api.discard(ref)
        done = self._redispatches_in_a_row(ref)
        if done >= self.settings.redispatch_limit:
            if self._close(attempt, Resolution.EXECUTOR_FAILED, f"{why}; re-dispatched {done} times already"):
                self._out.append(Fail(key, f"{why}; leoflow re-dispatched it {done} times already"))
            return
        if self._close(attempt, Resolution.REDISPATCHED, why):
            delay = redispatch_backoff(done)
            log.warning("attempt %s: %s; re-dispatching the same ti_id as epoch %d in %.0f s", ref, why,
                        ref.attempt_epoch + 1, delay)
            reoffer = Reoffer(key, self.airflow.workload_from_json(attempt.workload_json))
            if delay > 0:
                self._later.append((self.monotonic() + delay, reoffer))
            else:
                self._out.append(reoffer)

    def _no_room(self, attempt: Attempt, key: Any, why: str) -> None:
        """The node refused the attempt before it started, for lack of room (``EndKind.NO_ROOM``; TI still
        QUEUED): backpressure. Close it ``LAUNCH_FAILED`` (no ``redispatch_limit`` spent, never a failure) and
        re-offer its workload :data:`NO_ROOM_BACKOFF_SECONDS` later, so a full node is not asked again at once."""
        if self._close(attempt, Resolution.LAUNCH_FAILED, why):
            log.warning("attempt %s: %s (in %.0f s)", attempt.ref, why, NO_ROOM_BACKOFF_SECONDS)
            reoffer = Reoffer(key, self.airflow.workload_from_json(attempt.workload_json))
            self._later.append((self.monotonic() + NO_ROOM_BACKOFF_SECONDS, reoffer))

    def _start_ended(self, attempt: Attempt, key: Any, after: reapers.After, why: str) -> None:
        """An attempt a reaper killed because it could not start is gone, its TI still QUEUED at its try.
        ``REJECT``: close it ``EXECUTOR_FAILED``, a ``Fail`` with ``why`` that also writes it into the TI's task
        log (the workload's ``log_path``; no agent ever wrote one). ``BACKPRESSURE``: close it
        ``LAUNCH_FAILED`` (it never started; no ``redispatch_limit`` spent) and re-offer its workload."""
        lid = launch_id(attempt.ref)
        launch = self.table.get(lid)
        workload = launch.workload if launch is not None and launch.workload is not None else \
            self.airflow.workload_from_json(attempt.workload_json)
        if after is reapers.After.REJECT:
            if self._close(attempt, Resolution.EXECUTOR_FAILED, why):
                log.warning("attempt %s cannot start: %s; failing the task through Airflow", attempt.ref, why)
                self._out.append(Fail(key, why, log_path=getattr(workload, "log_path", None)))
        elif self._close(attempt, Resolution.LAUNCH_FAILED, why):
            log.warning("attempt %s: %s", attempt.ref, why)
            self._out.append(Reoffer(key, workload))

    def _redispatches_in_a_row(self, ref: AttemptRef) -> int:
        """How many epochs right before ``ref`` ended REDISPATCHED (counting stops past the limit)."""
        count = 0
        for epoch in range(ref.attempt_epoch - 1, 0, -1):
            row = self.ledger.get_epoch(ref.ti_id, epoch)
            if row is None or row.resolution != Resolution.REDISPATCHED or count > self.settings.redispatch_limit:
                break
            count += 1
        return count

    def _release_later(self) -> None:
        """Emit the delayed re-offers that are due."""
        now = self.monotonic()
        due = [item for item in self._later if item[0] <= now]
        self._later = [item for item in self._later if item[0] > now]
        self._out.extend(reoffer for _, reoffer in due)

    def _close(self, attempt: Attempt, resolution: Resolution, why: str, *,
               expected: Sequence[AttemptState] = tuple(SETTLE_STATES)) -> bool:
        """Guarded close; frees the attempt's slot and forgets its launch either way. True if a row changed."""
        changed = self.ledger.transition(attempt.ref, expected=expected, to=_S.CLOSED, resolution=resolution,
                                         detail=why[:MAX_DETAIL_CHARS])
        if changed:
            self._settled(attempt, resolution, why)
        lid = launch_id(attempt.ref)
        launch = self.table.get(lid)
        if launch is not None:
            self._free(lid, launch)
            self.table.pop(lid)
        self.runtime.forget(attempt.ref)
        self._waiting_for_api.discard(attempt.ref)
        self._replay_stalled_at.pop(attempt.ref, None)
        self._killing.pop(attempt.ref, None)
        self._kill_ids.pop(attempt.ref, None)
        self._start_ends.pop(attempt.ref, None)
        return changed

    def _settled(self, attempt: Attempt, resolution: Resolution, why: str) -> None:
        """An attempt this process closed: count it (``leoflow.attempt.settled.*``, ``leoflow.recovery.*``) and
        tell the plugins (``leoflow_attempt_settled``, with the evidence :meth:`_settle` read, if any). Never
        raises: metrics and observe hooks stay off settlement's failure modes."""
        metrics.incr(f"leoflow.attempt.settled.{resolution.value}")
        if resolution in RECOVERIES:
            metrics.incr(f"leoflow.recovery.{resolution.value}")
        evidence = self._evidence.get(attempt.ref)
        record = evidence.record if evidence is not None else None
        cause = evidence.cause if evidence is not None else None
        ref = attempt.ref
        info = AttemptInfo(ref.ti_id, ref.try_number, ref.attempt_epoch, attempt.dag_id, attempt.task_id,
                           attempt.run_id, attempt.map_index, attempt.runtime)
        hooks.attempt_settled(info, evidence={
            "record_state": record.state if record is not None else None,
            "exit_code": evidence.exit_code if evidence is not None else None,
            "cause": getattr(getattr(cause, "kind", None), "value", None),
        }, resolution=resolution.value, detail=why[:MAX_DETAIL_CHARS])

    # --- reap -------------------------------------------------------------------------------------------
    def reap(self, page: LivePage, presence: Mapping[AttemptRef, Presence]) -> None:
        """Run the lost-agent reapers (pure decisions) on the dispatched attempts of this cycle's LIVE ``page``
        (its ``presence`` as :meth:`reconcile` observed it; rows found GONE were moved to EXITED there) and kill
        what they name. Every LIVE row comes round once per sweep, so none hides behind the others.

        Each attempt is killed once (logged, a ``TaskEvent``, one signal): the agent-lost reaper with
        ``reap_kill_grace`` (its task's ``on_kill`` runs), the dispatch-lost reapers at once (no body started).
        The runtime's :meth:`~leoflow_airflow.lifecycle.runtime.Runtime.start_progress` decides where the
        dispatch-lost clock starts; an attempt killed because it cannot start (``start-rejected``) or has no room
        (``start-backpressure``) is remembered, and once gone its TI fails with the reason or its workload is
        re-offered (:meth:`_start_ended`) instead of being re-dispatched.
        The kill is never waited for here; it ends as ``Exited`` / GONE and the attempt is settled from its
        evidence. An attempt still named :data:`KILL_ESCALATION_SLACK` seconds past its grace is killed once
        more, at once (the runtime lost the first kill)."""
        live = [a for a in page.rows if a.state == _S.DISPATCHED and presence.get(a.ref) != Presence.GONE]
        still = {a.ref for a in live}
        for ref in [r for r in self._killing if r not in still and page.covers(self._kill_ids.get(r))]:
            self._killing.pop(ref)  # its row left DISPATCHED: the kill is over
            self._kill_ids.pop(ref, None)
        if not live:
            return
        kept = self._page_liveness
        self._page_liveness = None
        tis = kept[1] if kept is not None and kept[0] is page else self.airflow.ti_liveness([a.ref.ti_id for a in live])
        unknown = (None, None)
        seen = [(a, presence.get(a.ref, Presence.UNKNOWN), tis.get(a.ref.ti_id, unknown)) for a in live]
        progress = self.runtime.start_progress([a for a, p, ti in seen if p is Presence.LIVE and ti[0] == "queued"])
        snapshot = [reapers.AttemptView(ref=a.ref, presence=p, ti_state=ti[0], last_heartbeat_at=ti[1],
                                        dispatched_at=a.dispatched_at, start=progress.get(a.ref) if progress else None)
                    for a, p, ti in seen]
        settings = reapers.ReapSettings(self.settings.agent_lost_threshold, self.settings.dispatch_lost_threshold)
        by_ref = {a.ref: a for a in live}
        now = self.monotonic()
        for action in reapers.decide(snapshot, self.utcnow(), settings):
            attempt = by_ref[action.ref]
            due = self._killing.get(action.ref)
            if due is not None:
                if now >= due:
                    log.warning("attempt %s still lives %.0f s past its kill grace; killing it at once",
                                action.ref, KILL_ESCALATION_SLACK)
                    self._killing[action.ref] = float("inf")
                    self.runtime.kill(attempt, grace=0.0)
                continue  # signalled already: its end comes through the runtime's events and presence
            grace = self.reap_kill_grace if action.reaper in ("agent-lost", "moved-on") else 0.0
            self._killing[action.ref] = now + grace + KILL_ESCALATION_SLACK
            self._kill_ids[action.ref] = attempt.id
            if action.after is not reapers.After.SETTLE:
                self._start_ends[action.ref] = (action.after, action.why)
            log.warning("leoflow %s reaper: killing attempt %s (SIGTERM, then SIGKILL after %.0f s): %s",
                        action.reaper, action.ref, grace, action.why)
            metrics.incr(f"leoflow.reaper.{action.reaper}")
            self._out.append(TaskEvent(self.key_of(attempt), f"leoflow {action.reaper}", action.why))
            self.runtime.kill(attempt, grace=grace)

    def reap_orphans(self) -> list[tuple[str, Any]]:
        """The orphan-run reaper (:mod:`leoflow_airflow.reap.orphan`) on one keyset page of Airflow's RUNNING
        task instances (``[leoflow] reap_page_size`` at most, after its own cursor, wrapping after the last
        page): each one of this executor's with no open attempt in the ledger and silent past ``[leoflow]
        orphan_run_threshold`` is re-driven through the infra path (``AirflowPort.infra_redrive``: a new try on
        the infra budget, no user retry spent, a Log row ``leoflow orphan-run: <why>``), except one whose latest
        attempt's success report had landed, which is restored (:meth:`_restore`, ``orphan.Restore``: a late call
        of that execution overwrote the success; its body never runs twice). The dag run is never touched.

        Each act re-checks: the ledger once more (an attempt claimed since the page was read wins), then the
        re-drive's own guarded transaction (the row locked ``FOR UPDATE`` only while it is still that ``ti_id``
        in RUNNING), or for a restore the Execution API (it applies a success only to a RUNNING TI; the fence
        admits only the ti_id's current epoch). Returns ``[(ti_id, result)]`` of the acts tried: a re-drive's
        ``RedriveResult`` (``REDRIVEN`` changed the row; ``MOVED_ON`` and ``BUDGET_SPENT`` changed nothing: with
        the budget spent Airflow's own heartbeat purge fails the task, through the user's retries), a restore's
        ``settle.SettleResult`` (one that stalls on the api-server ends this pass's restores)."""
        size = self.settings.reap_page_size
        rows = self.airflow.running_tis(self._orphan_after, size + 1)
        if len(rows) > size:
            rows = rows[:size]
            self._orphan_after = rows[-1].ti_id
        else:
            self._orphan_after = None
        settings = orphan.OrphanSettings(self.settings.orphan_run_threshold, self.ownership)
        now = self.utcnow()
        rows = orphan.candidates(rows, now, settings)  # a page of live task instances reads no ledger row
        if not rows:
            return []
        opened = self.ledger.open_ti_ids([r.ti_id for r in rows])
        latest = self.ledger.current_many([r.ti_id for r in rows if r.ti_id not in opened])
        views = [orphan.OrphanView(r, r.ti_id in opened, _landed(latest.get(r.ti_id))) for r in rows]
        results: list[tuple[str, Any]] = []
        restores = True  # until one stalls: one unanswered api-server call per pass at most
        for action in orphan.decide(views, now, settings):
            current = self.ledger.current(action.ti_id)
            if current is not None and current.state != _S.CLOSED:
                continue  # claimed since the page was read: watched again
            if isinstance(action, orphan.Restore):
                if restores and current is not None and current.ref.attempt_epoch == action.attempt_epoch:
                    result = self._restore(action, current)
                    restores = result.settled or not result.retryable
                    results.append((action.ti_id, result))
                continue
            result = self.airflow.infra_redrive(action.ti_id, f"leoflow {action.reaper}: {action.why}")
            log.warning("leoflow %s reaper: %s; re-drive: %s", action.reaper, action.why, result)
            metrics.incr(f"leoflow.reaper.{action.reaper}")
            if getattr(result, "name", "") == "REDRIVEN":
                metrics.incr("leoflow.recovery.orphan_redrive")
            results.append((action.ti_id, result))
        return results

    def _restore(self, action: orphan.Restore, attempt: Attempt) -> Any:
        """PATCH the landed terminal state of ``attempt`` again (``orphan.Restore``: success, failed, skipped or
        removed): the body of its first report is gone with the agent, so it is rebuilt as Airflow's terminal
        payload, ``end_date`` the time it was first reported, and for a success no asset events (Airflow
        registered them with the report that landed); the Execution API fence admits it as the ti_id's current
        epoch. Returns the ``settle.SettleResult``; an applied restore writes a Log row. No callback is made up:
        the agent's task child ran its callbacks after the report landed."""
        from leoflow_agent.outcome import AttemptIdentity, format_rfc3339, record_for_state

        at = action.at or self.utcnow()
        body: dict[str, Any] = {"state": action.state, "end_date": format_rfc3339(at)}
        if action.state == "success":
            body.update(task_outlets=[], outlet_events=[])
        record = record_for_state(action.state, body, api_version=None,
                                  attempt=AttemptIdentity(action.ti_id, action.try_number, action.attempt_epoch))
        result = self.airflow.replay(record)
        log.warning("leoflow %s reaper: %s; restore: %s", action.reaper, action.why, result.detail)
        if result.applied:
            metrics.incr(f"leoflow.reaper.{action.reaper}")
            metrics.incr("leoflow.recovery.orphan_restore")
            self._out.append(TaskEvent(self.key_of(attempt), f"leoflow {action.reaper}", action.why))
        return result

    # --- adoption, revoke, shutdown ---------------------------------------------------------------------
    def adopt(self, tis: Sequence[Any], now: Any) -> tuple[list[Any], list[Any]]:
        """Adopt a predecessor's attempts from the ledger (DESIGN §3 "Adoption").

        Returns ``(not_adopted, lost)``: the TIs not adopted, and those of them whose attempt died RUNNING with
        no record (``lost``, a subset: the executor charges them to the infra budget in Airflow's transaction).

        Makes no HTTP call (Airflow holds the TI rows ``FOR UPDATE``). A LIVE or UNKNOWN attempt is adopted and
        keeps running; a CLAIMED one is adopted and looked up by the next cycle (never presumed dead). A GONE
        one with an outcome record, a cause of its end (``Evidence.cause``: a pod's OOM kill or deadline must be
        settled by the table, not reset as an infra loss), evidence the runtime cannot read yet
        (``Evidence.known`` False: a pod cache not synced; k8s review §2), a report, or a TI not RUNNING is
        adopted with ``last_heartbeat_at = now`` (the ORM row is changed in Airflow's transaction) so the purge
        waits for the next ``sync()`` to settle it. A GONE RUNNING one with none of these is returned, for the
        executor to charge the infra budget.
        """
        self.gate.reset(self.monotonic())  # no reaping from a half-built picture
        self._live_after = 0  # the sweep the gate waits for starts now, at the first LIVE row
        self._presence_due = float("-inf")  # and the next cycle observes
        not_adopted: list[Any] = []
        lost: list[Any] = []
        for ti in tis:
            attempt = self.ledger.current(str(ti.id))
            if attempt is None or attempt.state == _S.CLOSED or attempt.ref.try_number != ti.try_number:
                not_adopted.append(ti)
                continue
            lid = launch_id(attempt.ref)
            if lid in self.table.launches:
                continue  # already ours (a stalled scheduler adopting its own tasks): nothing changes
            if attempt.state == _S.CLAIMED:
                self.table.add(lid, Launch(ti.key, None, attempt.ref, adopted=True))
                self._out.append(Occupy(ti.key))
                continue
            beats = heartbeat_ages([attempt], {attempt.ref.ti_id: (None, getattr(ti, "last_heartbeat_at", None))},
                                   now) if isinstance(now, datetime) else None  # k8s review §14
            presence = self.runtime.observe([attempt], beats).get(attempt.ref, Presence.UNKNOWN) \
                if attempt.state in LIVE_STATES else Presence.GONE
            if presence != Presence.GONE:
                self.table.add(lid, Launch(ti.key, None, attempt.ref, adopted=True))
                self.runtime.adopt(attempt)
                self._out.append(Occupy(ti.key))
                continue
            evidence = self.runtime.evidence(attempt)
            if not evidence.known or evidence.record is not None or evidence.cause is not None \
                    or attempt.reported_state is not None or str(ti.state) != "running":
                ti.last_heartbeat_at = now
                self.table.add(lid, Launch(ti.key, None, attempt.ref, adopted=True), owns_slot=False)
                continue
            not_adopted.append(ti)
            lost.append(ti)
        return not_adopted, lost

    def revoke(self, ti_id: str, key: Any) -> None:
        """Kill exactly that ti_id's attempts at once and forget them; never an Airflow state change. Airflow
        revokes a TI it holds QUEUED (stuck in queued) before it queues it again: that attempt must not run at
        all, so the kill has no grace."""
        for attempt in self.ledger.open_attempts(runtime=self.runtime.kind, ti_id=ti_id):
            gone = self.runtime.kill(attempt, grace=0.0) == Presence.GONE
            lid = launch_id(attempt.ref)
            launch = self.table.get(lid)
            if launch is not None:
                self._free(lid, launch)
                if not gone:
                    self._out.append(Occupy(attempt.ref))  # still holds resources until it is gone
            if gone:
                if self.ledger.transition(attempt.ref, expected=OPEN_STATES, to=_S.CLOSED,
                                          resolution=Resolution.REVOKED, detail="revoked by the scheduler"):
                    self._settled(attempt, Resolution.REVOKED, "revoked by the scheduler")
                self.table.pop(lid)
                self.runtime.forget(attempt.ref)
        self._out.append(Release(key))

    def terminate(self, sleep: Callable[[float], None] = time.sleep) -> None:
        """Kill every live attempt of this scheduler: its own (``scheduler_job_id``), those it adopted, unowned
        rows, and those whose owner job is no longer alive (orphans this scheduler would adopt); never a live
        peer scheduler's (issue 8 hole 14). Another host's attempt is never signalled (the runtime answers
        UNKNOWN for it).

        Graceful: each task gets SIGTERM and ``kill_grace`` seconds (its ``on_kill`` runs). No scheduler loop
        follows ``terminate()`` and the runtime is stopped right after it, so this call (the last one) waits,
        polling the runtime, until nothing of those attempts is left or the grace (plus 2 s for the runtime's
        own escalation to be seen) is over, then SIGKILLs whatever still lives.

        A launch of this process still CLAIMED (handed over, its agent not seen started: held in the zygote,
        being forked, a pod being created) is killed too: the runtime drops what it holds. One whose ``Started``
        arrives while this call waits is DISPATCHED by then, with its handle, and gets its own graceful kill;
        what is still CLAIMED at the end is killed by its launch's marker (:meth:`Runtime.kill_launch`), as the
        runtime stopped right after this call would otherwise leave an agent it was forking running.
        """
        self.apply(self.runtime.poll())  # Started events owed: those rows leave CLAIMED with their handle
        deadline = self.monotonic() + self.kill_grace + 2.0
        signalled: set[tuple[AttemptRef, int | None]] = set()  # (ref, pid): a handle seen later is signalled anew
        pending: dict[AttemptRef, Attempt] = {}
        while True:
            for attempt in self._terminable():
                if (attempt.ref, attempt.pid) in signalled:
                    continue
                signalled.add((attempt.ref, attempt.pid))
                if self.runtime.kill(attempt, grace=self.kill_grace) == Presence.LIVE:
                    pending[attempt.ref] = attempt
            if not pending or self.monotonic() >= deadline:
                break
            sleep(0.2)
            self.apply(self.runtime.poll())  # the runtime's escalation and the zygote's ``exited`` events
            presence = self.runtime.observe(list(pending.values()))
            pending = {ref: a for ref, a in pending.items() if presence.get(ref) != Presence.GONE}
        for attempt in pending.values():
            log.warning("attempt %s outlived its kill grace at terminate(); SIGKILL", attempt.ref)
            self.runtime.kill(attempt, grace=0.0)
        for attempt in self._terminable():
            if attempt.state == _S.CLAIMED:
                log.warning("launch of attempt %s never reported its start by terminate(); killing it by its "
                            "marker", attempt.ref)
                self.runtime.kill_launch(launch_id(attempt.ref))

    def _terminable(self) -> list[Attempt]:
        """What :meth:`terminate` kills, from the ledger now: open rows in ``LIVE_STATES`` and this process's
        launches still CLAIMED, less a live peer scheduler's (unless this process launched or adopted it)."""
        ours = self.table.launches
        live = [a for a in self.ledger.open_attempts(runtime=self.runtime.kind)
                if a.state in LIVE_STATES or (a.state == _S.CLAIMED and launch_id(a.ref) in ours)]
        owners = {a.scheduler_job_id for a in live} - {None, self.job_id}
        peers = self.airflow.jobs_alive(owners) if owners else set()
        return [a for a in live if a.scheduler_job_id not in peers or launch_id(a.ref) in ours]

    def drain(self, timeout: float, sleep: Callable[[float], None] = time.sleep) -> list[SchedulerAction]:
        """``end()``: dispatch nothing new, run cycles while launches run (at most ``timeout`` seconds), then
        hang up on the runtime and apply the events it still owed (a ``Started`` records its agent's handle, so
        a successor adopts it instead of guessing)."""
        self.draining = True
        deadline = self.monotonic() + timeout
        try:
            while self.monotonic() < deadline and self.busy():
                self.cycle()
                sleep(0.2)
            self.cycle()
        finally:  # a cycle that raised (a DB error mid-settle) still hangs up and records what the runtime owed
            self.apply(self.runtime.stop(timeout=max(1.0, self.settings.settle_timeout)))
        return self.take()


KILL_ESCALATION_SLACK = 30.0
"""Seconds past a reaper kill's grace after which an attempt the reaper still names (its agent lives) is killed
once more, at once: the runtime lost the first kill (Lite: the zygote died before it escalated)."""

REDISPATCH_BACKOFF_SECONDS = 5.0
"""The first back-off of a re-dispatch in a row, in seconds; doubled per further one, at most 60 s."""


def heartbeat_ages(attempts: Sequence[Attempt], tis: Mapping[str, tuple[str | None, Any]],
                   now: datetime) -> dict[AttemptRef, float | None]:
    """Seconds since each attempt's TI last heartbeat (``tis``: ``AirflowPort.ti_liveness``'s ``{ti_id: (state,
    last_heartbeat_at)}``, aware UTC; ``now`` aware UTC), None where the TI or its heartbeat is unknown: what
    ``Runtime.observe`` weighs against a pod object's word (k8s review §14). Pure."""
    out: dict[AttemptRef, float | None] = {}
    for attempt in attempts:
        beat = tis.get(attempt.ref.ti_id, (None, None))[1]
        out[attempt.ref] = (now - beat).total_seconds() if isinstance(beat, datetime) else None
    return out


NO_ROOM_BACKOFF_SECONDS = 5.0
"""Seconds before the workload of an attempt its node refused for lack of room is offered again
(:meth:`Lifecycle._no_room`): about one cold pod's start, in which the pods holding the room may end."""


def redispatch_backoff(in_a_row: int) -> float:
    """Seconds to wait before the re-dispatch that follows ``in_a_row`` re-dispatches in a row: 0 for the first,
    then 5, 10, 20, 40, 60, 60, … (a dispatch that keeps dying before ``/run`` is not retried in a tight loop)."""
    if in_a_row <= 0:
        return 0.0
    return min(60.0, REDISPATCH_BACKOFF_SECONDS * 2 ** (in_a_row - 1))


def _landed(attempt: Attempt | None) -> orphan.Landed | None:
    """``attempt`` (a ti_id's latest) as :class:`orphan.Landed` when it closed after its agent's terminal report
    landed (closed ``reported`` or ``replayed`` with a ``reported_state``), else None."""
    if attempt is None or attempt.state != _S.CLOSED or attempt.reported_state is None \
            or attempt.resolution not in (Resolution.REPORTED, Resolution.REPLAYED):
        return None
    at = attempt.reported_at
    if at is not None and at.tzinfo is None:
        at = at.replace(tzinfo=timezone.utc)
    return orphan.Landed(attempt.ref.try_number, attempt.ref.attempt_epoch, attempt.reported_state, at)


class _Budget:
    """One reconcile pass's settle budget: ``count`` settles and a ``deadline`` (``monotonic`` seconds)."""

    def __init__(self, count: int, deadline: float, monotonic: Callable[[], float]) -> None:
        self.count, self.deadline, self.monotonic = count, deadline, monotonic
        self.replays_allowed = True

    def take(self) -> bool:
        """True (and one settle spent) while both the count and the wall clock allow another settle."""
        if self.count <= 0 or self.monotonic() >= self.deadline:
            return False
        self.count -= 1
        return True
