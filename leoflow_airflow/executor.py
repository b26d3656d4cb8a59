"""``LeoflowExecutor``: an Airflow 3 ``BaseExecutor`` that runs every task attempt under an attempt epoch,
records its outcome durably and reconciles what was lost (DESIGN §1-§3).

Enable it with ``[core] executor = leoflow_airflow.executor.LeoflowExecutor``; DAGs do not change.

This module is Airflow glue only. The attempt lifecycle lives in :mod:`leoflow_airflow.lifecycle` and runs
over a :class:`~leoflow_airflow.lifecycle.runtime.Runtime` (``[leoflow] runtime``: Lite's local agent processes
or Kubernetes' pod per attempt); the executor hands it
workloads and performs the :mod:`~leoflow_airflow.lifecycle.actions` it returns. The scheduler calls, per
loop: ``heartbeat()`` → ``trigger_tasks`` → :meth:`_process_workloads` (dispatch), then :meth:`sync`
(events, reconcile, reap). The api-server builds the executor without starting it, only to call
:meth:`get_task_log`; nothing expensive happens in ``__init__``.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

from airflow.executors.base_executor import BaseExecutor, get_execution_api_server_url
from airflow.executors.workloads import ExecuteCallback, ExecuteTask

from leoflow_airflow import ladder, metrics
from leoflow_airflow import settings as leoflow_settings
from leoflow_airflow.dispatch.disposition import Disposition, DispatchResult
from leoflow_airflow.lifecycle import actions as act

if TYPE_CHECKING:
    from airflow.models.taskinstance import TaskInstance

    from leoflow_airflow.ledger.store import LedgerStore
    from leoflow_airflow.lifecycle.core import Lifecycle
    from leoflow_airflow.runtime.kubernetes.podlog import PodLogReader


def _token_lifetime() -> float:
    """Seconds a workload token is valid: ``[scheduler] task_queued_timeout`` (Airflow 3.3
    ``BaseWorkloadSchema.generate_token``), 600 when unset or malformed."""
    from airflow.configuration import conf

    try:
        value = conf.getfloat("scheduler", "task_queued_timeout", fallback=600.0)
    except (ValueError, TypeError):
        return 600.0
    return value if value > 0 else 600.0


def _killed_task_cleanup_time() -> float:
    """Seconds a killed task gets between SIGTERM and SIGKILL: ``[core] killed_task_cleanup_time`` (Airflow
    3.3's default 60), 60 when malformed; never negative."""
    from airflow.configuration import conf

    try:
        value = conf.getfloat("core", "killed_task_cleanup_time", fallback=60.0)
    except (ValueError, TypeError):
        return 60.0
    return max(0.0, value)


class LeoflowExecutor(BaseExecutor):
    """Runs each attempt through leoflow's lifecycle on the configured runtime (``[leoflow] runtime``: ``lite``
    or ``kubernetes``).

    ``running`` holds the key of the attempt that owns each slot plus an ``AttemptRef`` for every other attempt
    still alive (one being killed), so two epochs of one key never share a slot (DESIGN §3 "Slots").

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
        self._life: Lifecycle | None = None
        self._sole_executor = False  # set in start(): no other executor shares [core] parallelism
        self._started = False
        self._pod_logs: PodLogReader | None = None  # get_task_log on pods: built on the first read

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

    # --- start and stop -------------------------------------------------------------------------------
    @property
    def life(self) -> Lifecycle:
        """The attempt lifecycle over the configured runtime, built on first use without starting the runtime
        (an un-started executor can still revoke or terminate attempts from the ledger)."""
        if self._life is None:
            from leoflow_airflow.lifecycle.airflow import AirflowIO
            from leoflow_airflow.lifecycle.core import Lifecycle
            from leoflow_airflow.lifecycle.runtime import Runtime

            settings = self.settings
            runtime: Runtime
            if settings.runtime == "kubernetes":
                from leoflow_airflow.runtime.kubernetes.runtime import KubernetesRuntime

                runtime = KubernetesRuntime(settings, server=get_execution_api_server_url)
            else:
                from leoflow_airflow.runtime.lite import LiteRuntime

                runtime = LiteRuntime(settings, parallelism=self.parallelism, mint=self._workload_json,
                                      server=get_execution_api_server_url, token_lifetime=_token_lifetime())
            fault_for = None
            if settings.test_fault_injection:
                from leoflow_airflow.testing.faults import fault_for as plan_fault

                def fault_for(workload: ExecuteTask, epoch: int) -> str | None:
                    return plan_fault(workload.ti, epoch, plan_path=settings.test_fault_plan)

            airflow = AirflowIO(jwt_generator=self.jwt_generator, server=get_execution_api_server_url,
                                settle_timeout=settings.settle_timeout, infra_retry_budget=settings.infra_retry_budget)
            self._life = Lifecycle(ledger=self.ledger, runtime=runtime, airflow=airflow, settings=settings,
                                   job_id=self.job_id, fault_for=fault_for, kill_grace=_killed_task_cleanup_time())
        return self._life

    def start(self) -> None:
        """Validate config, enforce the resilience ladder and start the runtime. Returns without waiting for
        it (Lite: the zygote importing the Task SDK; Kubernetes: the pod cache and the namespace check):
        dispatches answer DEFERRED until it is up.

        :raises ConfigError: a malformed ``[leoflow]`` value (key and value named).
        :raises LadderViolation: the recovery window is broken (keys and values named).
        :raises ConfigError: ``runtime = kubernetes`` without a shared ``[api_auth] jwt_secret`` or
            ``jwt_private_key_path`` (``api.exchange.check_can_mint``), or with a malformed pod template or an
            unloadable Kubernetes client configuration.
        :raises OSError: the zygote could not be spawned.
        """
        from airflow.executors.executor_loader import ExecutorLoader

        settings = self.settings
        values = ladder.read_values(settings)
        ladder.enforce(ladder.evaluate(values), self._warn_rung)
        self.life.reap_kill_grace = ladder.reap_kill_grace(values)
        if settings.runtime == "kubernetes":
            # Task pods' workload tokens are minted by the api-server's exchange: refuse a scheduler whose
            # api-servers cannot.
            from leoflow_airflow.api.exchange import check_can_mint

            check_can_mint()
        try:
            self._sole_executor = len(ExecutorLoader.get_executor_names(validate_teams=False)) <= 1
        except Exception:  # noqa: BLE001 - unknown: count the held workloads (the safe side)
            self._sole_executor = False
        self.life.job_id = self.job_id
        self.life.ownership = self._ownership()
        runtime = self.life.runtime
        if hasattr(runtime, "job_id"):  # the Kubernetes runtime's warm pods are per scheduler job
            runtime.job_id = self.job_id
        runtime.start()
        self._started = True
        self.log.info("leoflow started: runtime=%s, runtime_dir=%s, parallelism=%d", runtime.kind,
                      settings.runtime_dir, self.parallelism)

    def _ownership(self) -> Any:
        """Which task instances this executor queued, for the orphan-run reaper (``reap.orphan.Ownership``): the
        ``TaskInstance.executor`` values the scheduler matches to it (its alias, module path and class name, as
        ``SchedulerJobRunner._try_to_load_executor`` does), and whether it is the default executor (then an empty
        ``executor`` is its too). Unknown (no name, a config error): only this class's own path and name, never
        the empty value (the safe side: an orphan is then left to Airflow's purge)."""
        from airflow.executors.executor_loader import ExecutorLoader

        from leoflow_airflow.reap.orphan import Ownership

        path = f"{type(self).__module__}.{type(self).__qualname__}"
        names = {path, type(self).__qualname__}
        name = getattr(self, "name", None)
        default = False
        if name is not None:
            names |= {n for n in (name.alias, name.module_path) if n}
            try:
                default = ExecutorLoader.get_default_executor_name().module_path == name.module_path
            except Exception:  # noqa: BLE001 - unknown: not the default (the safe side)
                default = False
        return Ownership(frozenset(names), default)

    def _warn_rung(self, rung: ladder.Rung) -> None:
        self.log.warning("leoflow resilience ladder: %s (%s)", rung.message, rung.values, extra={"rung": rung.rung})

    def end(self) -> None:
        """Stop: dispatch nothing new, wait up to ``[leoflow] end_drain_timeout`` seconds for running attempts,
        then hang up on the runtime and record what it still reported. Running agents are left for a
        successor scheduler to adopt."""
        if not self._started:
            return
        self._started = False
        with self.ledger.pinned():
            self._perform(self.life.drain(self.settings.end_drain_timeout))
        self.log.info("leoflow zygote stopped; %d agents left running",
                      sum(not l.exited for l in self.life.table.launches.values()))

    def terminate(self) -> None:
        """Kill everything: every live attempt's whole subtree, each task given SIGTERM and ``[core]
        killed_task_cleanup_time`` seconds first so its ``on_kill`` runs (this call waits for that, at most the
        grace), then the runtime."""
        self._started = False
        self.life.terminate()
        self.life.runtime.terminate()

    # --- slots ----------------------------------------------------------------------------------------
    def _queue_ahead(self) -> int:
        """Workloads accepted beyond free slots right now (the runtime's extra capacity: Lite's adaptive
        queue-ahead, at most ``[leoflow] queue_ahead``); 0 before ``start()`` (the api-server's log reader)."""
        if not self._started:
            return 0
        return self.life.runtime.extra_capacity(self.parallelism, self.life.running_ages())

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
        """What the scheduler counts against ``[core] parallelism`` across all executors
        (``scheduler_job_runner._executable_task_instances_to_queued``). With other executors configured it is
        the true count (running plus held), so leoflow's queue-ahead never lets the executors together run more
        than ``[core] parallelism``; as the only executor, the queue-ahead room is taken off, so the scheduler
        keeps up to that many workloads queued here while every slot is busy (the zygote still forks at most
        ``parallelism`` agents)."""
        occupied = super().slots_occupied
        if self._sole_executor:
            return max(0, occupied - self._queue_ahead())
        return occupied

    def _launch_held(self) -> None:
        """Hand the runtime every workload held here, up to ``parallelism + queue_ahead`` in all: the zygote
        forks at most ``parallelism`` busy agents and starts each held one in-band the moment a busy agent
        reports (:mod:`leoflow_agent.handoff`), without waiting for the scheduler's next loop."""
        free = self.parallelism + self._queue_ahead() - len(self.running)
        if free > 0 and (self.queued_tasks or self.queued_callbacks):
            self.trigger_tasks(free)

    # --- dispatch -------------------------------------------------------------------------------------
    def _process_workloads(self, workloads: Any) -> None:
        """Dispatch each workload and act on its :class:`Disposition` (DESIGN §3 "Dispatch"): callbacks and
        anything else first (Airflow's ``trigger_tasks`` puts callbacks first, to finish work before starting
        more), then the task workloads as one batch (:meth:`Lifecycle.dispatch_tasks`: its reads made once)."""
        workloads = list(workloads)
        batch = [w for w in workloads if isinstance(w, ExecuteTask)] if self._started else []
        in_batch = {id(w) for w in batch}
        with self.ledger.pinned():
            for workload in workloads:
                if id(workload) not in in_batch:
                    self._record(workload, self._dispatch(workload))
            if batch:
                for workload, result in zip(batch, self.life.dispatch_tasks(batch)):
                    self._record(workload, result)

    def _record(self, workload: Any, result: DispatchResult) -> None:
        metrics.incr(f"leoflow.dispatch.{result.disposition.value}")
        self._apply(workload, result)

    def _dispatch(self, workload: Any) -> DispatchResult:
        if not self._started:
            return DispatchResult(Disposition.DEFERRED, "the executor is not started")
        if isinstance(workload, ExecuteCallback):
            return self.life.dispatch_callback(workload)
        return DispatchResult(Disposition.REFUSED, f"{type(workload).__name__} is not supported")

    def _apply(self, workload: Any, result: DispatchResult) -> None:
        """Act on one dispatch's disposition: leave it queued (re-offered), mark it running, drop it, or fail."""
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
            self._note_in_task_log(getattr(workload, "log_path", None),
                                   f"leoflow did not start this attempt: {result.reason}")
            self.fail(key, result.reason)

    # --- sync -------------------------------------------------------------------------------------------
    def sync(self) -> None:
        """One lifecycle cycle (events, reconcile, reap), then hand held workloads over (DESIGN §3)."""
        if not self._started:
            return
        with metrics.timed("leoflow.executor.sync"):
            with self.ledger.pinned():
                self._perform(self.life.cycle())
            self._launch_held()

    def _perform(self, actions: list[act.SchedulerAction]) -> None:
        """Tell Airflow what the lifecycle decided; the only place that does."""
        for action in actions:
            if isinstance(action, act.Occupy):
                self.running.add(action.key)
            elif isinstance(action, act.Release):
                self.running.discard(action.key)
            elif isinstance(action, act.Reoffer):
                queue = self.queued_callbacks if action.callback else self.queued_tasks
                queue[action.key] = action.workload
            elif isinstance(action, act.Fail):
                self.running.discard(action.key)
                if action.log_path:
                    self._note_in_task_log(action.log_path, action.reason)
                self.fail(action.key, action.reason)
            elif isinstance(action, act.Succeed):
                self.success(action.key)
            elif isinstance(action, act.ChangeState):
                self.change_state(action.key, action.state)
            elif isinstance(action, act.SendCallback):
                self.send_callback(action.request)
            elif isinstance(action, act.TaskEvent):
                self._task_event(action)

    def _note_in_task_log(self, log_path: str | None, message: str) -> None:
        """Write ``message`` into the task log of an attempt that never started (:mod:`.task_log`), so the UI's
        Logs tab says why; never raises."""
        from airflow.configuration import conf

        from leoflow_airflow.task_log import write_note

        write_note(log_path, message, base_log_folder=conf.get("logging", "base_log_folder"),
                   remote_logging=conf.getboolean("logging", "remote_logging", fallback=False))

    def _task_event(self, action: act.TaskEvent) -> None:
        """Write the TaskEvent's Log row now, in a session of its own. Not through ``log_task_event``: Airflow
        3.3.2's scheduler saves those with ``bulk_save_objects(<generator>, preserve_order=False)``, which under
        the pinned SQLAlchemy 2.1.9 emits ``INSERT INTO log DEFAULT VALUES`` (NOT NULL ``event``): every row
        is lost and the scheduler logs an error. A failed write is logged, never raised (the row is help for
        the operator, the kill it records has happened)."""
        from airflow.models.log import Log
        from airflow.utils.session import create_session

        try:
            with create_session() as session:
                session.add(Log(event=action.event, task_instance=action.key, extra=action.extra))
        except Exception:  # noqa: BLE001 - an event-log row must never break the scheduler loop
            self.log.exception("could not write the %r event of %s", action.event, action.key)

    # --- adoption ---------------------------------------------------------------------------------------
    def try_adopt_task_instances(self, tis: Any) -> list[Any]:
        """Adopt a predecessor's attempts from the ledger (DESIGN §3 "Adoption"); return those not adopted.

        Runs while Airflow holds the TI rows ``FOR UPDATE`` and makes no HTTP call. A dead RUNNING attempt
        without a record gets ``max_tries + 1`` (on the infra budget, in Airflow's own transaction) and is
        returned, so Airflow's reset re-drives it as a new try. A QUEUED TI whose try leoflow never started is
        adopted and dispatched from a rebuilt workload (Airflow's reset would spend a try on it).
        """
        from sqlalchemy.orm import object_session

        from airflow.models.log import Log
        from airflow.utils import timezone

        with self.ledger.pinned():
            not_adopted, lost = self.life.adopt(list(tis), timezone.utcnow())
            waiting = [ti for ti in not_adopted if ti not in lost and self._awaits_dispatch(ti)]
        self._perform(self.life.take())
        for ti in waiting:
            workload = self._rebuild_workload(ti)
            if workload is not None:
                self.queued_tasks[ti.key] = workload  # dispatched at the next heartbeat, as the same try
                not_adopted.remove(ti)
        for ti in lost:
            session = object_session(ti)
            if session is None or not self._spend_infra_budget(session, ti):
                continue
            ti.max_tries = ti.max_tries + 1
            self.log.warning("adoption: task instance %s died with no record; Airflow's reset re-runs it as a new "
                             "try on leoflow's infra budget (max_tries -> %d)", ti.key, ti.max_tries)
            session.add(Log(event="leoflow infra re-drive", task_instance=ti,
                            extra=f"the agent died with no outcome record while no scheduler ran; re-run as a "
                                  f"new try without spending a retry (max_tries -> {ti.max_tries})"))
        return not_adopted

    def _awaits_dispatch(self, ti: Any) -> bool:
        """A QUEUED TI whose current try leoflow has not started (no open epoch): the predecessor held it in its
        queue (queue-ahead, a deferred dispatch, a re-offer). Airflow would reset it and spend a try; leoflow
        dispatches it instead. Not one leoflow already failed through Airflow."""
        from leoflow_airflow.ledger.states import AttemptState, Resolution

        if str(ti.state) != "queued":
            return False
        attempt = self.ledger.current(str(ti.id))
        if attempt is None or attempt.ref.try_number != ti.try_number:
            return True
        return attempt.state == AttemptState.CLOSED and attempt.resolution != Resolution.EXECUTOR_FAILED

    def _rebuild_workload(self, ti: Any) -> ExecuteTask | None:
        """The ``ExecuteTask`` the scheduler would build for ``ti`` (Airflow's ``ExecuteTask.make``), or None
        (logged) when it cannot be built; its token is replaced at launch."""
        try:
            return ExecuteTask.make(ti, generator=self.jwt_generator)
        except Exception:  # noqa: BLE001 - the TI is then left to Airflow's reset, as before
            self.log.exception("adoption: could not rebuild the workload of %s; Airflow resets it", ti.key)
            return None

    def _spend_infra_budget(self, session: Any, ti: Any) -> bool:
        """Charge one infra re-run to ``ti``'s logical budget inside Airflow's own transaction."""
        from leoflow_airflow.redrive import charge_budget

        return charge_budget(session, ti, limit=self.settings.infra_retry_budget).allowed

    # --- revoke, logs ---------------------------------------------------------------------------------
    def revoke_task(self, *, ti: TaskInstance) -> None:
        """Kill exactly that attempt's whole process subtree at once (no grace: Airflow revokes a TI stuck in
        queued, whose attempt must not run) and forget it; never touches TI state or writes executor events
        (Airflow's contract for stuck-in-queued handling)."""
        self.queued_tasks.pop(ti.key, None)
        with self.ledger.pinned():
            self.life.revoke(str(ti.id), ti.key)
        self._perform(self.life.take())

    def get_task_log(self, ti: TaskInstance, try_number: int) -> tuple[list[str], list[str]]:
        """Return the live log of a running attempt: ``([source], [text])``.

        Called by the api-server (un-started executor) for RUNNING TIs only; a non-empty source list makes
        Airflow skip the served-logs fetch. By the runtime the attempt ran on (its ledger row): Lite: read from
        the attempt's log file. Kubernetes: the log of the attempt's pod through the Kubernetes API while the
        pod is there, else one source line saying the pod is gone and where its log went, or naming the error (:class:`.runtime.kubernetes.podlog.PodLogReader`; its
        client is built on the first read). ``([], [])`` when the ledger's current attempt is not
        ``try_number``'s. Never raises.
        """
        from airflow.configuration import conf

        try:
            attempt = self.ledger.current(str(ti.id))
        except Exception:  # noqa: BLE001 - a log read must never fail the page
            return [], []
        if attempt is None or attempt.ref.try_number != try_number:
            return [], []
        try:
            log_path = json.loads(attempt.workload_json).get("log_path")
        except ValueError:
            return [], []
        if attempt.runtime == "kubernetes":
            return self._pod_log(attempt, log_path or "")
        if not log_path:
            return [], []
        path = os.path.join(conf.get("logging", "base_log_folder"), log_path)
        try:
            with open(path, encoding="utf-8", errors="replace") as fh:
                text = fh.read()
        except OSError:
            return [], []
        return [f"leoflow attempt {attempt.ref.ti_id} epoch {attempt.ref.attempt_epoch}: {path}"], [text]

    def _pod_log(self, attempt: Any, log_path: str) -> tuple[list[str], list[str]]:
        """``get_task_log`` of an attempt on the Kubernetes runtime (never raises)."""
        from airflow.configuration import conf

        from leoflow_airflow.runtime.kubernetes.podlog import PodLogReader
        from leoflow_airflow.runtime.kubernetes.tasklog import LogPlace

        if self._pod_logs is None:
            try:
                self._pod_logs = PodLogReader(self.settings.kubernetes)
            except Exception as exc:  # noqa: BLE001 - a malformed [leoflow] value: the page still renders
                return [f"leoflow: the log of pod {attempt.pod_name or '?'} cannot be read: {exc}"], []
        place = LogPlace(base_log_folder=conf.get("logging", "base_log_folder"), log_path=log_path,
                         remote_logging=conf.getboolean("logging", "remote_logging", fallback=False),
                         remote_base_log_folder=conf.get("logging", "remote_base_log_folder", fallback=""))
        return self._pod_logs.task_log(attempt, place)
