"""``LeoflowExecutor``: an Airflow 3 ``BaseExecutor`` that runs every task attempt under an attempt epoch,
records its outcome durably and reconciles what was lost (DESIGN §1-§3).

Enable it with ``[core] executor = leoflow_airflow.executor.LeoflowExecutor``; DAGs do not change.

The scheduler calls, per loop: ``heartbeat()`` → ``trigger_tasks`` → :meth:`_process_workloads` (dispatch),
then :meth:`sync` (events, zygote health, reconcile). The api-server builds the executor without starting it,
only to call :meth:`get_task_log`; nothing expensive happens in ``__init__``.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow.executors.base_executor import BaseExecutor, get_execution_api_server_url
from airflow.executors.workloads import ExecuteCallback, ExecuteTask

from leoflow_agent import outcome, proc
from leoflow_agent.protocol import FAULT_POINTS, launch_id_for
from leoflow_agent.runner import agent_title_marker
from leoflow_airflow import ladder
from leoflow_airflow import settings as leoflow_settings
from leoflow_airflow.airflow_db import load_ti_row, load_ti_row_by_id
from leoflow_airflow.dispatch.ahead import QueueAhead, retoken_due
from leoflow_airflow.dispatch.disposition import Disposition, DispatchResult
from leoflow_airflow.dispatch.guard import guard
from leoflow_airflow.errors import ZygoteError
from leoflow_airflow.ledger.states import AttemptRef, AttemptState, Resolution
from leoflow_airflow.reap.gate import SettlingGate
from leoflow_airflow.reconcile import Act, decide, outcome_summary
from leoflow_airflow.callbacks import log_lost_success_callback, retry_callback_request
from leoflow_airflow.settle import replay_state

if TYPE_CHECKING:
    from airflow.models.taskinstance import TaskInstance
    from airflow.models.taskinstancekey import TaskInstanceKey

    from leoflow_airflow.ledger.store import Attempt, LedgerStore
    from leoflow_airflow.runtime.lite import LiteRuntime

_S = AttemptState
LIVE_STATES = (_S.DISPATCHED, _S.REPORTED)


def _token_lifetime() -> float:
    """Seconds a workload token is valid: ``[scheduler] task_queued_timeout`` (Airflow 3.3
    ``BaseWorkloadSchema.generate_token``), 600 when unset or malformed."""
    from airflow.configuration import conf

    try:
        value = conf.getfloat("scheduler", "task_queued_timeout", fallback=600.0)
    except (ValueError, TypeError):
        return 600.0
    return value if value > 0 else 600.0


def _launch_id(ref: AttemptRef) -> str:
    return launch_id_for(ref.ti_id, ref.try_number, ref.attempt_epoch)


@dataclass
class _Launch:
    """What the executor remembers of one launch it sent to the zygote (in memory only)."""

    key: Any  # TaskInstanceKey or CallbackKey
    workload: Any
    ref: AttemptRef | None  # None for callbacks
    exited: bool = False
    exit_code: int | None = None
    adopted: bool = False  # started by a predecessor's zygote: no events come for it, liveness is polled
    agent: proc.ProcessIdentity | None = None  # from the ``launched`` event
    handed_at: float = 0.0  # time.monotonic() when its launch (or its last retoken) was sent
    launched_at: float | None = None  # time.monotonic() of its ``launched`` event (the agent was forked)


class LeoflowExecutor(BaseExecutor):
    """Runs each attempt as a Lite agent process forked by a pre-imported zygote (``[leoflow] runtime = lite``).

    Slots are accounted per attempt ``(ti_id, try_number, attempt_epoch)``: ``running`` holds the
    ``TaskInstanceKey`` of the attempt that currently owns the slot plus an :class:`AttemptRef` for every
    other attempt still alive (one being killed), so two epochs of one key never share a slot.

    :raises leoflow_airflow.errors.ConfigError: from :meth:`start` for a malformed ``[leoflow]`` value.
    :raises leoflow_airflow.errors.LadderViolation: from :meth:`start` when the recovery window is broken.
    """

    supports_callbacks = True
    supports_connection_test = False
    is_local = True
    serve_logs = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._settings: leoflow_settings.LeoflowSettings | None = None
        self._ledger: LedgerStore | None = None
        self._runtime: LiteRuntime | None = None
        self._launches: dict[str, _Launch] = {}
        self._slot_owner: dict[Any, str] = {}  # key -> launch_id holding its slot
        self._gate: SettlingGate | None = None
        self._next_gc = 0.0
        self._zygote_limit: int | None = None  # the busy-agent limit last sent to the zygote
        self._ahead: QueueAhead | None = None  # the adaptive queue-ahead depth, built in start()
        self._retoken_after = 60.0  # seconds a held launch's token may age before it is replaced

    # --- lazily built parts ---------------------------------------------------------------------------
    @property
    def settings(self) -> leoflow_settings.LeoflowSettings:
        """The parsed ``[leoflow]`` section (read once). Raises ``ConfigError`` for a malformed value."""
        if self._settings is None:
            self._settings = leoflow_settings.load()
        return self._settings

    @property
    def ledger(self) -> LedgerStore:
        """The attempt ledger in Airflow's metadata DB, on leoflow's own engine."""
        if self._ledger is None:
            from leoflow_airflow.ledger.store import LedgerStore

            self._ledger = LedgerStore.from_airflow()
        return self._ledger

    # --- lifecycle ------------------------------------------------------------------------------------
    def start(self) -> None:
        """Validate config, enforce the resilience ladder, start the zygote.

        :raises ConfigError: a malformed ``[leoflow]`` value (key and value named).
        :raises LadderViolation: the recovery window is broken (keys and values named).
        :raises ZygoteError: the zygote did not come up.
        """
        from leoflow_airflow.runtime.lite import LiteRuntime

        settings = self.settings
        report = ladder.evaluate(ladder.read_values(settings))
        ladder.enforce(report, self._warn_rung)
        self._runtime = LiteRuntime(settings)
        self._runtime.start()
        token_lifetime = _token_lifetime()
        self._retoken_after = min(60.0, token_lifetime / 4)
        cap = settings.queue_ahead if settings.queue_ahead >= 0 else 4 * self.parallelism
        self._ahead = QueueAhead(cap, horizon=min(60.0, token_lifetime / 10))
        self._gate = SettlingGate(grace=settings.reap_grace)
        self._gate.reset(time.monotonic())
        self.log.info(
            "leoflow started: runtime=lite, zygote pid=%s, runtime_dir=%s, parallelism=%d",
            self._runtime._proc.pid if self._runtime._proc else None,
            settings.runtime_dir,
            self.parallelism,
        )

    def _warn_rung(self, rung: ladder.Rung) -> None:
        self.log.warning("leoflow resilience ladder: %s (%s)", rung.message, rung.values, extra={"rung": rung.rung})

    def end(self) -> None:
        """Stop the zygote. Running agents are left for a successor scheduler (or drained within
        ``[leoflow] end_drain_timeout`` seconds)."""
        if self._runtime is None:
            return
        deadline = time.monotonic() + self.settings.end_drain_timeout
        while time.monotonic() < deadline and any(not launch.exited for launch in self._launches.values()):
            self.sync()
            time.sleep(0.2)
        self.sync()
        self._runtime.stop()
        self._runtime = None
        self.log.info("leoflow zygote stopped; %d agents left running", sum(not l.exited for l in self._launches.values()))

    def terminate(self) -> None:
        """Kill everything: every live attempt's whole subtree, then the zygote."""
        for attempt in self.ledger.open_attempts(runtime="lite"):
            if attempt.state in LIVE_STATES and attempt.pid:
                self._kill_attempt(attempt)
        if self._runtime is not None:
            self._runtime.kill()
            self._runtime = None

    # --- slots ----------------------------------------------------------------------------------------
    def _queue_ahead(self) -> int:
        """Workloads accepted beyond free slots right now (:class:`~leoflow_airflow.dispatch.ahead.QueueAhead`:
        as many as recent attempt durations let start within its horizon, at most ``[leoflow]
        queue_ahead``); 0 before ``start()`` (the api-server's log reader: plain BaseExecutor accounting)."""
        if self._ahead is None:
            return 0
        now = time.monotonic()
        ages = [now - launch.launched_at for launch in self._slot_holders() if launch.launched_at is not None]
        return self._ahead.depth(self.parallelism, ages)

    def _slot_holders(self) -> list[_Launch]:
        """The launches that own their key's slot right now (held, running, or adopted and not reported)."""
        return [launch for lid, launch in self._launches.items() if self._slot_owner.get(launch.key) == lid]

    def _workload_json(self, workload: ExecuteTask, ti_id: str) -> str:
        """``workload`` as JSON with a workload token minted now for ``ti_id`` (DESIGN §3: never a token
        that waited in a queue)."""
        token = ExecuteTask.generate_token(ti_id, self.jwt_generator)
        return workload.model_copy(update={"token": token}).model_dump_json()

    @property
    def slots_available(self) -> int:
        """Workloads the scheduler may still hand over: free attempt slots plus the queue-ahead room
        (``[leoflow] queue_ahead``). Workloads held ahead launch in ``sync()`` the moment a slot frees, so a
        finished attempt's slot never waits for the scheduler's next loop (LocalExecutor queues ahead too)."""
        return super().slots_available + self._queue_ahead()

    @property
    def slots_occupied(self) -> int:
        """What the scheduler counts against ``[core] parallelism``: live attempts plus held workloads, less
        the queue-ahead room, so the scheduler keeps up to ``[leoflow] queue_ahead`` workloads queued here
        while every slot is busy (the bound on the whole is ``parallelism + queue_ahead``)."""
        return max(0, super().slots_occupied - self._queue_ahead())

    def _launch_held(self) -> None:
        """Hand the zygote every workload held here, up to ``parallelism + queue_ahead`` in all: it forks
        at most ``parallelism`` busy agents and starts each held one in-band the moment a busy agent
        reports (:mod:`leoflow_agent.handoff`), without waiting for the scheduler's next loop."""
        free = self.parallelism + self._queue_ahead() - len(self.running)
        if free > 0 and (self.queued_tasks or self.queued_callbacks):
            self.trigger_tasks(free)

    def _update_zygote_limit(self) -> None:
        """Keep the zygote's busy-agent limit at ``parallelism`` less the slots of a predecessor zygote's
        agents still running (adopted: the current zygote does not count them)."""
        assert self._runtime is not None
        adopted = sum(1 for launch in self._slot_holders() if launch.adopted and not launch.exited)
        limit = max(0, self.parallelism - adopted) if self.parallelism else None
        if limit != self._zygote_limit and self._runtime.set_limit(limit):
            self._zygote_limit = limit

    def _retoken_held(self) -> None:
        """Replace the token of every task launch the zygote still holds once it is ``_retoken_after``
        seconds old, so no workload token waits long enough to expire (it is valid for ``[scheduler]
        task_queued_timeout``; DESIGN §3 wants a token fresh at launch)."""
        assert self._runtime is not None
        now = time.monotonic()
        held = [
            (launch_id, launch.handed_at) for launch_id, launch in self._launches.items()
            if launch.ref is not None and launch.agent is None and not launch.exited and not launch.adopted
        ]
        for launch_id in retoken_due(held, now, self._retoken_after):
            launch = self._launches[launch_id]
            assert launch.ref is not None
            if self._runtime.retoken(launch_id, self._workload_json(launch.workload, launch.ref.ti_id)):
                launch.handed_at = now

    # --- dispatch -------------------------------------------------------------------------------------
    def _process_workloads(self, workloads: Any) -> None:
        """Dispatch each workload and act on its :class:`Disposition` (DESIGN §3 "Dispatch")."""
        with self.ledger.pinned():
            self._dispatch_all(workloads)

    def _dispatch_all(self, workloads: Any) -> None:
        for workload in workloads:
            if isinstance(workload, ExecuteTask):
                result = self._dispatch_task(workload)
            elif isinstance(workload, ExecuteCallback):
                result = self._dispatch_callback(workload)
            else:
                result = DispatchResult(Disposition.REFUSED, f"{type(workload).__name__} is not supported")
            self._apply(workload, result)

    def _apply(self, workload: Any, result: DispatchResult) -> None:
        key = workload.key
        queue = self.queued_callbacks if isinstance(workload, ExecuteCallback) else self.queued_tasks
        if result.disposition in (Disposition.DEFERRED, Disposition.BACKPRESSURE):
            self.log.debug("dispatch of %s %s: %s", key, result.disposition, result.reason)
            return  # stays queued: re-offered on the next heartbeat
        queue.pop(key, None)
        if result.disposition == Disposition.DISPATCHED:
            self.running.add(key)
        elif result.disposition == Disposition.STALE:
            self.log.info("not launching %s: %s", key, result.reason)
        else:
            self.log.error("dispatch of %s %s: %s", key, result.disposition, result.reason)
            self.fail(key, result.reason)

    def _dispatch_task(self, workload: ExecuteTask) -> DispatchResult:
        runtime = self._runtime
        if runtime is None or not runtime.alive():
            return DispatchResult(Disposition.DEFERRED, "the zygote is not running")
        if len(runtime.pending) >= self.settings.launch_queue_size:
            return DispatchResult(Disposition.DEFERRED, "the zygote's launch queue is full")
        ti = workload.ti
        ti_id = str(ti.id)
        if reason := guard(load_ti_row_by_id(ti_id), ti_id=ti_id, try_number=ti.try_number, job_id=self.job_id):
            return DispatchResult(Disposition.STALE, reason)
        previous = self.ledger.current(ti_id)
        if previous is not None and previous.state != _S.CLOSED:
            if not self._prove_dead_and_close(previous):
                return DispatchResult(Disposition.DEFERRED, f"epoch {previous.ref.attempt_epoch} of {ti_id} is still alive")
        attempt = self.ledger.claim_epoch(
            ti_id=ti_id,
            try_number=ti.try_number,
            dag_id=ti.dag_id,
            task_id=ti.task_id,
            run_id=ti.run_id,
            map_index=ti.map_index,
            runtime="lite",
            workload_json=workload.model_dump_json(exclude={"token"}),
            scheduler_job_id=self.job_id,
            record_path_for=lambda epoch: runtime.paths.record_path(ti_id, epoch),
        )
        ref = attempt.ref
        record_path = attempt.record_path
        assert record_path is not None
        os.makedirs(os.path.dirname(record_path), mode=0o700, exist_ok=True)
        # the token is minted now, at hand-off to the zygote, never one that waited in the scheduler's queue
        # (DESIGN §3); if the zygote holds the launch for a slot, _retoken_held replaces it while it waits
        launch_id = launch_id_for(ti_id, ti.try_number, ref.attempt_epoch)
        message = {
            "launch_id": launch_id,
            "attempt_epoch": ref.attempt_epoch,
            "workload": self._workload_json(workload, ti_id),
            "server": get_execution_api_server_url(),
            "record_path": record_path,
            "fault": self._fault_for(workload, ref.attempt_epoch),
        }
        if not runtime.launch(message):
            self.ledger.transition(ref, expected=[_S.CLAIMED], to=_S.CLOSED, resolution=Resolution.LAUNCH_FAILED,
                                   detail="the zygote connection broke")
            return DispatchResult(Disposition.DEFERRED, "the zygote connection broke")
        self._launches[launch_id] = _Launch(workload.key, workload, ref, handed_at=time.monotonic())
        self._slot_owner[workload.key] = launch_id
        return DispatchResult(Disposition.DISPATCHED)

    def _prove_dead_and_close(self, previous: Attempt) -> bool:
        """Before a same-``ti_id`` re-dispatch: True once the previous epoch is dead and its row CLOSED."""
        if previous.state == _S.CLAIMED:
            if _launch_id(previous.ref) in self._launches:
                return False  # still on its way to the zygote
            return self.ledger.transition(previous.ref, expected=[_S.CLAIMED], to=_S.CLOSED,
                                          resolution=Resolution.ABANDONED, detail="never launched")
        if previous.state in LIVE_STATES:
            if not self._is_dead(previous):
                return False
            self.ledger.transition(previous.ref, expected=LIVE_STATES, to=_S.EXITED)
        refreshed = self.ledger.get(previous.ref)
        if refreshed is not None and refreshed.state == _S.EXITED:
            self._settle(refreshed)
            refreshed = self.ledger.get(previous.ref)
        return refreshed is None or refreshed.state == _S.CLOSED

    def _fault_for(self, workload: ExecuteTask, attempt_epoch: int) -> str | None:
        """TEST ONLY: the fault point for this attempt, from ``[leoflow] test_fault_plan`` (key
        ``dag_id/run_id/task_id/try_number/attempt_epoch``) or the task's
        ``executor_config={"leoflow": {"fault": ...}}`` (first epoch only). ``None`` unless
        ``[leoflow] test_fault_injection`` is on."""
        if not self.settings.test_fault_injection:
            return None
        ti = workload.ti
        fault = None
        if self.settings.test_fault_plan:
            import json

            try:
                with open(self.settings.test_fault_plan) as fh:
                    plan = json.load(fh)
            except (OSError, ValueError):
                plan = {}
            key = f"{ti.dag_id}/{ti.run_id}/{ti.task_id}/{ti.try_number}/{attempt_epoch}"
            fault = plan.get(key) if isinstance(plan, dict) else None
        if fault is None and attempt_epoch == 1:
            config = getattr(ti, "executor_config", None) or {}
            fault = (config.get("leoflow") or {}).get("fault") if isinstance(config, dict) else None
        if fault is not None:
            self.log.warning("TEST fault injection: attempt %s/%s epoch %d will be killed at %s",
                             ti.dag_id, ti.task_id, attempt_epoch, fault)
        return fault if fault in FAULT_POINTS else None

    def _dispatch_callback(self, workload: ExecuteCallback) -> DispatchResult:
        runtime = self._runtime
        if runtime is None or not runtime.alive():
            return DispatchResult(Disposition.DEFERRED, "the zygote is not running")
        launch_id = f"callback:{workload.callback.id}:{time.monotonic_ns()}"
        message = {
            "launch_id": launch_id,
            "attempt_epoch": 0,
            "workload": workload.model_dump_json(),
            "server": get_execution_api_server_url(),
            "record_path": None,
            "fault": None,
        }
        if not runtime.launch(message):
            return DispatchResult(Disposition.DEFERRED, "the zygote connection broke")
        self._launches[launch_id] = _Launch(workload.key, workload, None)
        self._slot_owner[workload.key] = launch_id
        return DispatchResult(Disposition.DISPATCHED)

    # --- sync: events, zygote health, reconcile ---------------------------------------------------------
    def sync(self) -> None:
        """Read zygote events, restart a dead zygote, then reconcile finished attempts (DESIGN §3)."""
        if self._runtime is None:
            return
        with self.ledger.pinned():
            self._sync()

    def _sync(self) -> None:
        assert self._runtime is not None
        for event in self._runtime.events():
            self._on_event(event)
        if not self._runtime.alive():
            self._restart_zygote()
        if self._runtime.alive():
            self._update_zygote_limit()
        self._launch_held()
        if self._runtime.alive():
            self._retoken_held()
        self._poll_adopted_callbacks()
        self._reconcile()
        if self._gate is not None:
            self._gate.swept()
            if self._gate.is_open(time.monotonic()):
                self._reap()
        if time.monotonic() >= self._next_gc:
            self._next_gc = time.monotonic() + 60.0
            self._collect_garbage()

    def _poll_adopted_callbacks(self) -> None:
        """Callbacks whose zygote died: no ``exited`` event will come, so poll their agent (pid + start time)
        and, once it is gone, report the callback failed (its outcome is unknown) to free the slot."""
        for launch_id, launch in list(self._launches.items()):
            if launch.ref is not None or not launch.adopted or launch.exited:
                continue
            if launch.agent is not None and proc.is_alive(launch.agent):
                continue
            self.log.warning("callback launch %s ran under a zygote that died; its outcome is unknown", launch_id)
            self._free_slot(launch, launch_id)
            self.change_state(launch.key, launch.workload.failure_state)
            del self._launches[launch_id]

    def _reap(self) -> None:
        """Run the Lite reapers (pure decisions) on a snapshot of live dispatched attempts and act."""
        from datetime import datetime, timezone

        from leoflow_airflow.airflow_db import load_ti_liveness
        from leoflow_airflow.reap.lite import AttemptView, Presence, ReapSettings, decide as decide_reaps

        live = [a for a in self.ledger.open_attempts(runtime="lite") if a.state == _S.DISPATCHED]
        if not live:
            return
        tis = load_ti_liveness([a.ref.ti_id for a in live])
        snapshot = [
            AttemptView(
                ref=a.ref,
                presence=Presence.DEAD if self._is_dead(a) else Presence.LIVE,
                ti_state=tis.get(a.ref.ti_id, (None, None))[0],
                last_heartbeat_at=tis.get(a.ref.ti_id, (None, None))[1],
                dispatched_at=a.dispatched_at,
            )
            for a in live
        ]
        settings = ReapSettings(self.settings.agent_lost_threshold, self.settings.dispatch_lost_threshold)
        by_ref = {a.ref: a for a in live}
        for action in decide_reaps(snapshot, datetime.now(timezone.utc), settings):
            attempt = by_ref[action.ref]
            self.log.warning("leoflow %s reaper: killing attempt %s: %s", action.reaper, action.ref, action.why)
            self.log_task_event(event=f"leoflow {action.reaper}", extra=action.why, ti_key=self._key_of(attempt))
            self._kill_attempt(attempt)

    def _collect_garbage(self) -> None:
        """Remove record files of closed attempts past ``[leoflow] record_retention`` (bounded)."""
        from leoflow_airflow import gc

        if self._runtime is None:
            return

        def is_closed(ti_id: str, epoch: int) -> bool:
            row = self.ledger.get_epoch(ti_id, epoch)
            return row is None or row.state == _S.CLOSED

        try:
            removed = gc.collect(self._runtime.paths.root, retention=self.settings.record_retention, is_closed=is_closed)
        except Exception:  # noqa: BLE001 - GC must never break the scheduler loop
            self.log.exception("leoflow record GC failed")
            return
        if removed:
            self.log.info("leoflow GC removed %d settled attempts' record directories", removed)

    def _on_event(self, event: dict[str, Any]) -> None:
        kind = event.get("ev")
        launch = self._launches.get(event.get("launch_id", ""))
        if launch is None:
            self.log.debug("event for an unknown launch: %r", event)
            return
        if kind == "launched":
            launch.launched_at = time.monotonic()
            if event.get("pid") and event.get("start_time") is not None:
                launch.agent = proc.ProcessIdentity(int(event["pid"]), int(event["start_time"]))
            if launch.ref is not None:
                changed = self.ledger.transition(
                    launch.ref, expected=[_S.CLAIMED], to=_S.DISPATCHED,
                    pid=event.get("pid"), proc_start_time=event.get("start_time"),
                )
                if not changed:  # revoked (or closed) while the launch was in flight: it must not run
                    self.log.info("attempt %s was closed before its agent started; killing it", event["launch_id"])
                    self._runtime.kill_launch(event["launch_id"])  # type: ignore[union-attr]
        elif kind == "launch_failed":
            self.log.error("the zygote could not launch %s: %s", event["launch_id"], event.get("error"))
            launch.exited = True
            if launch.ref is not None:
                self.ledger.transition(launch.ref, expected=[_S.CLAIMED], to=_S.CLOSED,
                                       resolution=Resolution.LAUNCH_FAILED, detail=str(event.get("error"))[:500])
            self._free_slot(launch, event["launch_id"])
            self.fail(launch.key, f"leoflow could not launch the workload: {event.get('error')}")
        elif kind == "reported":
            if launch.ref is not None:
                self.ledger.transition(launch.ref, expected=[_S.DISPATCHED], to=_S.REPORTED,
                                       reported_state=str(event.get("state")))
            self._free_slot(launch, event["launch_id"])  # the slot is freed at the terminal report
        elif kind == "exited":
            launch.exited = True
            launch.exit_code = event.get("exit_code")
            if launch.ref is None:  # a callback: its executor event is the workload's own result
                self._free_slot(launch, event["launch_id"])
                state = launch.workload.success_state if launch.exit_code == 0 else launch.workload.failure_state
                self.change_state(launch.key, state)
                del self._launches[event["launch_id"]]
            else:
                self.ledger.transition(launch.ref, expected=LIVE_STATES, to=_S.EXITED,
                                       exit_status=launch.exit_code)

    def _free_slot(self, launch: _Launch, launch_id: str) -> None:
        if self._slot_owner.get(launch.key) == launch_id:
            del self._slot_owner[launch.key]
            self.running.discard(launch.key)
            if self._ahead is not None and launch.launched_at is not None:
                self._ahead.finished(time.monotonic() - launch.launched_at)
        if launch.ref is not None:
            self.running.discard(launch.ref)

    def _restart_zygote(self) -> None:
        assert self._runtime is not None
        code = self._runtime.exit_code
        lost = [lid for lid in self._runtime.pending if lid in self._launches]
        self.log.error(
            "the leoflow zygote died or its connection broke (exit code %s); restarting it. %d launches it had "
            "not started are re-offered", code, len(lost),
        )
        for launch_id in lost:
            launch = self._launches.pop(launch_id)
            self._free_slot(launch, launch_id)
            # the zygote may have forked the agent without telling us: never let it run beside its re-offer
            for pid in proc.find_by_title(agent_title_marker(launch_id)):
                self.log.warning("killing agent pid %d of launch %s that the dead zygote never reported", pid, launch_id)
                proc.kill_tree(pid)
            if launch.ref is not None:
                self.ledger.transition(launch.ref, expected=[_S.CLAIMED], to=_S.CLOSED,
                                       resolution=Resolution.LAUNCH_FAILED, detail="the zygote died before forking")
                self.queued_tasks[launch.key] = launch.workload
            else:
                self.queued_callbacks[launch.key] = launch.workload
        self._runtime.pending.clear()
        for launch in self._launches.values():
            if not launch.exited:
                launch.adopted = True  # the dead zygote's agents run on, but no event will come for them
        self._zygote_limit = None  # a new zygote starts without one
        try:
            self._runtime.restart()
        except (ZygoteError, OSError) as exc:
            self.log.error("could not restart the leoflow zygote (will retry at the next sync): %s", exc)
            return
        self.log.warning("the leoflow zygote was restarted (restart #%d)", self._runtime.restarts)

    def _reconcile(self) -> None:
        """Turn facts into attempt states and settle dead attempts, within ``[leoflow] settle_budget``."""
        budget = self.settings.settle_budget
        for attempt in self.ledger.open_attempts(runtime="lite"):
            launch = self._launches.get(_launch_id(attempt.ref))
            if attempt.state == _S.CLAIMED and launch is not None and launch.adopted:
                self._redispatch(attempt, launch.key, "the previous scheduler never started its agent",
                                 expected=[_S.CLAIMED])
                continue
            if attempt.state in LIVE_STATES and self._is_dead(attempt):
                self.ledger.transition(attempt.ref, expected=LIVE_STATES, to=_S.EXITED)
                attempt = self.ledger.get(attempt.ref) or attempt
            if attempt.state == _S.EXITED and budget > 0:
                budget -= 1
                self._settle(attempt)

    def _is_dead(self, attempt: Attempt) -> bool:
        """Proof of death: the agent (pid + start time) is gone and, for a launch of our own zygote, the
        zygote reaped it and killed what was left of its subtree (its ``exited`` event)."""
        if attempt.pid is not None and attempt.proc_start_time is not None:
            if proc.is_alive(proc.ProcessIdentity(attempt.pid, int(attempt.proc_start_time))):
                return False
        launch = self._launches.get(_launch_id(attempt.ref))
        if launch is not None and not launch.adopted:
            if launch.exited:
                return True  # the zygote killed what was left of the subtree before it reported ``exited``
            if self._runtime is not None and self._runtime.alive():
                return False  # ours: wait for the zygote's word
        # no zygote of ours saw this agent die (a predecessor's attempt, or our zygote is gone): its orphans
        # reparented to init, so find and kill what is left of the attempt before calling it dead
        if attempt.pid is not None and attempt.proc_start_time is not None:
            return self._kill_leftovers(attempt)
        # a predecessor's CLAIMED attempt whose launch never reported: if an agent did start, its /run is
        # fenced by the ti_id Airflow gives the TI on reset; nothing of ours can be proven alive
        return True

    def _kill_leftovers(self, attempt: Attempt) -> bool:
        """SIGKILL what is left of a dead agent's attempt (:func:`leoflow_agent.proc.attempt_leftovers`);
        True once nothing of it is alive."""
        agent = proc.ProcessIdentity(int(attempt.pid), int(attempt.proc_start_time))  # type: ignore[arg-type]
        launch_id = _launch_id(attempt.ref)
        left = proc.attempt_leftovers(agent, launch_id)
        if not left:
            return True
        self.log.warning("attempt %s: its agent is dead but %d of its processes are not (%s); killing them",
                         attempt.ref, len(left), left)
        for pid in left:
            proc.kill_tree(pid)
        return not proc.attempt_leftovers(agent, launch_id)

    def _settle(self, attempt: Attempt) -> None:
        ref = attempt.ref
        current = self.ledger.current(ref.ti_id)
        if current is None or current.ref != ref:
            self.ledger.transition(ref, expected=[_S.EXITED], to=_S.CLOSED, resolution=Resolution.MOVED_ON,
                                   detail="a newer epoch exists")
            return
        expect = outcome.AttemptIdentity(ref.ti_id, ref.try_number, ref.attempt_epoch)
        record = outcome.read_record_file(attempt.record_path, expect=expect) if attempt.record_path else None
        ti = load_ti_row(attempt.dag_id, attempt.run_id, attempt.task_id, attempt.map_index)
        action = decide(ti_id=ref.ti_id, try_number=ref.try_number, record=record, ti=ti,
                        reported=attempt.reported_state is not None)
        key = self._key_of(attempt)
        self.log.debug("settling %s: %s (%s)", ref, action.act, action.why)
        if action.act == Act.CLOSE:
            self._close(attempt, action.resolution, action.why)
        elif action.act == Act.RESTARTING_SUCCESS:
            if self._close(attempt, action.resolution, action.why):
                self.success(key)
        elif action.act == Act.REPLAY:
            assert record is not None
            self._replay(attempt, record)
        elif action.act == Act.INFRA_REDRIVE:
            self._infra_redrive(attempt, key, action.why)
        elif action.act == Act.REDISPATCH:
            self._redispatch(attempt, key, action.why)

    def _replay(self, attempt: Attempt, record: outcome.OutcomeRecord) -> None:
        """Replay a lost terminal report (settling mark committed first, no transaction across the call)."""
        ref = attempt.ref
        if not self.ledger.transition(ref, expected=[_S.EXITED], to=_S.SETTLING):
            return
        result = replay_state(record, jwt_generator=self.jwt_generator, server=get_execution_api_server_url(),
                              timeout=self.settings.settle_timeout)
        if not result.settled:
            self.log.warning("replay of %s failed (%s); will retry", ref, result.detail)
            self.ledger.transition(ref, expected=[_S.SETTLING], to=_S.EXITED, detail=result.detail[:500])
            return
        self.log.warning("leoflow recovered the lost report of %s: %s (%s)", ref, outcome_summary(record), result.detail)
        if record.assets_dropped:
            self.log.warning("the record of %s had its asset events dropped to fit its size budget", ref)
        if not self._close(attempt, Resolution.REPLAYED if result.applied else Resolution.MOVED_ON, result.detail,
                           expected=[_S.SETTLING]) or not result.applied:
            return
        where = dict(dag_id=attempt.dag_id, run_id=attempt.run_id, task_id=attempt.task_id, map_index=attempt.map_index)
        if record.state == "success":
            log_lost_success_callback(ti_id=ref.ti_id, **where)
        elif record.state == "up_for_retry" and record.callbacks_pending:
            request = retry_callback_request(msg=f"leoflow replayed the lost up_for_retry report of attempt {ref}",
                                             **where)
            if request is not None:
                self.send_callback(request)

    def _infra_redrive(self, attempt: Attempt, key: Any, why: str) -> None:
        """No usable evidence and the TI is RUNNING: a new try on the infra budget, else Airflow's own path."""
        from leoflow_airflow.redrive import RedriveResult, infra_redrive

        result = infra_redrive(ti_id=attempt.ref.ti_id, reason=why, limit=self.settings.infra_retry_budget)
        if result == RedriveResult.REDRIVEN:
            self.log.warning("attempt %s: %s; re-driven as a new try on the infra budget", attempt.ref, why)
            self._close(attempt, Resolution.INFRA_REDRIVE, why)
        elif result == RedriveResult.BUDGET_SPENT:
            if self._close(attempt, Resolution.EXECUTOR_FAILED, f"{why}; infra budget spent"):
                self.log.warning("attempt %s: %s and the infra budget is spent; failing it through Airflow",
                                 attempt.ref, why)
                self.running.discard(key)
                self.fail(key, f"{why}; leoflow's infra re-run budget is spent")
        else:
            self._close(attempt, Resolution.MOVED_ON, "the task instance moved on before the re-drive")

    def _redispatch(self, attempt: Attempt, key: Any, why: str, expected: Any = (_S.EXITED,)) -> None:
        """The agent died before /run (TI still QUEUED): dispatch the same ti_id again as epoch + 1."""
        ref = attempt.ref
        done = self.ledger.count_resolution(ref.ti_id, Resolution.REDISPATCHED)
        if done >= self.settings.redispatch_limit:
            if self._close(attempt, Resolution.EXECUTOR_FAILED, f"{why}; re-dispatched {done} times already",
                           expected=expected):
                self.running.discard(key)
                self.fail(key, f"{why}; leoflow re-dispatched it {done} times already")
            return
        if not self._close(attempt, Resolution.REDISPATCHED, why, expected=expected):
            return
        from airflow.executors.workloads import ExecuteTask as _ET

        import json

        # the ledger holds the workload without its token; a fresh one is minted at launch
        workload = _ET.model_validate({**json.loads(attempt.workload_json), "token": ""})
        self.log.warning("attempt %s: %s; re-dispatching the same ti_id as epoch %d", ref, why, ref.attempt_epoch + 1)
        self.queued_tasks[key] = workload
        self._apply(workload, self._dispatch_task(workload))

    def _close(self, attempt: Attempt, resolution: Resolution, why: str, *, expected: Any = (_S.EXITED,)) -> bool:
        changed = self.ledger.transition(attempt.ref, expected=expected, to=_S.CLOSED, resolution=resolution,
                                         detail=why[:500])
        launch_id = _launch_id(attempt.ref)
        launch = self._launches.pop(launch_id, None)
        if launch is not None:
            self._free_slot(launch, launch_id)
        return changed

    @staticmethod
    def _key_of(attempt: Attempt) -> TaskInstanceKey:
        from airflow.models.taskinstancekey import TaskInstanceKey

        return TaskInstanceKey(attempt.dag_id, attempt.task_id, attempt.run_id, attempt.ref.try_number,
                               attempt.map_index)

    # --- adoption -------------------------------------------------------------------------------------
    def try_adopt_task_instances(self, tis: Any) -> list[Any]:
        """Adopt a predecessor's attempts from the ledger (DESIGN §3 "Adoption"); return those not adopted.

        Runs while Airflow holds the TI rows ``FOR UPDATE`` and makes no HTTP call. A live agent (pid + start
        time) is adopted and keeps running. A dead one with an outcome record is adopted with
        ``last_heartbeat_at = now`` so Airflow's purge waits for the next ``sync()`` to settle it. A dead
        RUNNING one without a record gets ``max_tries + 1`` (on the infra budget, in Airflow's own
        transaction) and is returned, so Airflow's reset re-drives it as a new try. Anything leoflow never
        dispatched is returned.
        """
        from sqlalchemy.orm import object_session

        from airflow.utils import timezone

        not_adopted: list[Any] = []
        if self._gate is not None:
            self._gate.reset(time.monotonic())  # no reaping from a half-built picture
        for ti in tis:
            attempt = self.ledger.current(str(ti.id))
            if attempt is None or attempt.state == _S.CLOSED or attempt.ref.try_number != ti.try_number:
                not_adopted.append(ti)
                continue
            launch_id = _launch_id(attempt.ref)
            if not self._is_dead(attempt):
                self._launches[launch_id] = _Launch(ti.key, None, attempt.ref, adopted=True)
                self._slot_owner[ti.key] = launch_id
                self.running.add(ti.key)
                continue
            expect = outcome.AttemptIdentity(attempt.ref.ti_id, attempt.ref.try_number, attempt.ref.attempt_epoch)
            record = outcome.read_record_file(attempt.record_path, expect=expect) if attempt.record_path else None
            if record is not None or attempt.reported_state is not None or str(ti.state) != "running":
                ti.last_heartbeat_at = timezone.utcnow()
                self._launches[launch_id] = _Launch(ti.key, None, attempt.ref, adopted=True)
                continue
            session = object_session(ti)
            if session is not None and self._spend_infra_budget(session, ti):
                ti.max_tries = ti.max_tries + 1
                self.log.warning("adoption: attempt %s died with no record; Airflow's reset re-runs it as a new "
                                 "try on leoflow's infra budget (max_tries -> %d)", attempt.ref, ti.max_tries)
                from airflow.models.log import Log

                session.add(Log(event="leoflow infra re-drive", task_instance=ti,
                                extra=f"the agent died with no outcome record while no scheduler ran; re-run as a "
                                      f"new try without spending a retry (max_tries -> {ti.max_tries})"))
            not_adopted.append(ti)
        return not_adopted

    def _spend_infra_budget(self, session: Any, ti: Any) -> bool:
        """Charge one infra re-run to ``ti``'s logical budget inside Airflow's own transaction."""
        from leoflow_airflow.redrive import charge_budget

        return charge_budget(session, ti, limit=self.settings.infra_retry_budget).allowed

    # --- revoke, logs ---------------------------------------------------------------------------------
    def revoke_task(self, *, ti: TaskInstance) -> None:
        """Kill exactly that attempt's whole process subtree and forget it; never touches TI state or
        writes executor events (Airflow's contract for stuck-in-queued handling)."""
        ti_id = str(ti.id)
        self.queued_tasks.pop(ti.key, None)
        for attempt in self.ledger.open_attempts(runtime="lite"):
            if attempt.ref.ti_id != ti_id:
                continue
            dead = self._kill_attempt(attempt)
            launch_id = _launch_id(attempt.ref)
            launch = self._launches.get(launch_id)
            if launch is not None:
                self._free_slot(launch, launch_id)
                if not dead:
                    self.running.add(attempt.ref)  # still holds resources until it is gone
            if dead:
                self.ledger.transition(attempt.ref, expected=[s for s in _S if s != _S.CLOSED], to=_S.CLOSED,
                                       resolution=Resolution.REVOKED, detail="revoked by the scheduler")
                self._launches.pop(launch_id, None)
        self.running.discard(ti.key)

    def _kill_attempt(self, attempt: Attempt) -> bool:
        """SIGKILL the attempt's agent and its whole subtree; True when nothing of it is left."""
        if attempt.pid is None or attempt.proc_start_time is None:
            if self._runtime is not None:
                self._runtime.kill_launch(_launch_id(attempt.ref))
            return attempt.state == _S.CLAIMED
        return proc.kill_tree(proc.ProcessIdentity(attempt.pid, int(attempt.proc_start_time)))

    def get_task_log(self, ti: TaskInstance, try_number: int) -> tuple[list[str], list[str]]:
        """Return the live log of a running attempt: ``([source], [text])`` read from its log file.

        Called by the api-server (un-started executor) for RUNNING TIs only.
        """
        from airflow.configuration import conf

        try:
            attempt = self.ledger.current(str(ti.id))
        except Exception:  # noqa: BLE001 - a log read must never fail the page
            return [], []
        if attempt is None or attempt.ref.try_number != try_number:
            return [], []
        try:
            import json

            log_path = json.loads(attempt.workload_json).get("log_path")
        except ValueError:
            return [], []
        if not log_path:
            return [], []
        path = os.path.join(conf.get("logging", "base_log_folder"), log_path)
        try:
            with open(path, encoding="utf-8", errors="replace") as fh:
                text = fh.read()
        except OSError:
            return [], []
        return [f"leoflow attempt {attempt.ref.ti_id} epoch {attempt.ref.attempt_epoch}: {path}"], [text]
