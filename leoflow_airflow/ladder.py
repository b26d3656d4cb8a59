"""The resilience ladder: timing knobs owned by Airflow and leoflow whose relative ORDER recovery depends on
(seed 002 ``ResilienceLadder``; DESIGN §2 "The recovery window", §3 "Airflow's own zombie purge").

Pure: :func:`evaluate` takes the values and returns violations (hard rungs: the executor refuses to start)
and warnings (soft rungs: logged structured, with key and value). :func:`read_values` is the only I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from leoflow_airflow.errors import LadderViolation
from leoflow_airflow.settings import LeoflowSettings

AIRFLOW_KEYS: dict[str, tuple[str, str, float]] = {
    # name: (section, key, Airflow 3.3.2 default)
    "task_success_overtime": ("core", "task_success_overtime", 20.0),
    "min_heartbeat_interval": ("workers", "min_heartbeat_interval", 5.0),
    "socket_cleanup_timeout": ("workers", "socket_cleanup_timeout", 60.0),
    "task_instance_heartbeat_timeout": ("scheduler", "task_instance_heartbeat_timeout", 300.0),
    "task_queued_timeout": ("scheduler", "task_queued_timeout", 600.0),
    "max_failed_heartbeats": ("workers", "max_failed_heartbeats", 3.0),
    "scheduler_health_check_threshold": ("scheduler", "scheduler_health_check_threshold", 30.0),
    "killed_task_cleanup_time": ("core", "killed_task_cleanup_time", 60.0),
}


@dataclass(frozen=True)
class LadderValues:
    """Every value the ladder compares, in seconds (``max_failed_heartbeats`` is a count)."""

    task_success_overtime: float
    min_heartbeat_interval: float
    socket_cleanup_timeout: float
    task_instance_heartbeat_timeout: float
    task_queued_timeout: float
    max_failed_heartbeats: float
    agent_lost_threshold: float
    maintenance_interval: float
    settle_timeout: float
    dispatch_lost_threshold: float = 120.0
    scheduler_health_check_threshold: float = 30.0
    killed_task_cleanup_time: float = 60.0
    pod_unschedulable_timeout: float | None = None
    """``[leoflow] pod_unschedulable_timeout`` with ``runtime = kubernetes``, else None (not checked)."""
    pod_termination_valve: float | None = None
    """``[leoflow] pod_termination_valve`` with ``runtime = kubernetes``, else None (not checked)."""
    orphan_run_threshold: float | None = None
    """``[leoflow] orphan_run_threshold`` (None: not checked)."""
    agent_lease_seconds: float | None = None
    """``[leoflow] agent_lease_seconds`` with ``runtime = kubernetes``, else None (not checked: Lite takes no
    lease)."""


@dataclass(frozen=True)
class Rung:
    """One broken rung: a message plus the ``{"section.key": value}`` it is about."""

    rung: str
    message: str
    values: dict[str, float]


@dataclass(frozen=True)
class LadderReport:
    """The outcome of :func:`evaluate`: hard ``violations`` and soft ``warnings``."""

    violations: tuple[Rung, ...]
    warnings: tuple[Rung, ...]


def window(v: LadderValues) -> tuple[float, float]:
    """The recovery window's bounds in seconds: ``(lower, upper)`` for ``agent_lost_threshold`` (DESIGN §2)."""
    lower = v.task_success_overtime + v.min_heartbeat_interval + v.socket_cleanup_timeout
    return lower, v.task_instance_heartbeat_timeout - 2 * v.maintenance_interval - v.settle_timeout


def reap_kill_grace(v: LadderValues) -> float:
    """Seconds the agent-lost reaper gives a task between SIGTERM and SIGKILL (issue 8 hole 16): ``[core]
    killed_task_cleanup_time``, shortened where the kill would otherwise end after the recovery window's upper
    bound (:func:`window`), i.e. after Airflow's purge may have failed the TI and spent a user retry; never
    below 0. ``agent_lost_threshold + grace <= upper``."""
    _, upper = window(v)
    return max(0.0, min(v.killed_task_cleanup_time, upper - v.agent_lost_threshold))


def evaluate(v: LadderValues) -> LadderReport:
    """Check the ladder. Hard rung (DESIGN §2): the recovery window

    ``task_success_overtime + min_heartbeat_interval + socket_cleanup_timeout < agent_lost_threshold <
    task_instance_heartbeat_timeout - 2 * maintenance_interval - settle_timeout``.

    A healthy supervisor stops heartbeating once its terminal state is set, hence the lower bound; Airflow's
    purge (which cannot be switched off) must never act before leoflow has decided, hence the upper bound.

    Hard rung (Kubernetes, k8s review §14): ``agent_lease_seconds + killed_task_cleanup_time <
    agent_lost_threshold``: the scheduler takes a silent heartbeat as proof of death only past
    ``agent_lost_threshold``, so an agent cut off from the API server must have killed its task (lease, then the
    kill's grace) before then, or the re-run runs beside it.

    Soft rung: ``[leoflow] orphan_run_threshold`` below the window's upper bound (else the purge may fail an
    orphaned running task before the orphan-run reaper re-runs it). Only a warning: a deployment that lowered
    ``task_instance_heartbeat_timeout`` below the default threshold must still start.
    """
    lower, upper = window(v)
    margin = 2 * v.maintenance_interval + v.settle_timeout
    window_values = {
        "core.task_success_overtime": v.task_success_overtime,
        "workers.min_heartbeat_interval": v.min_heartbeat_interval,
        "workers.socket_cleanup_timeout": v.socket_cleanup_timeout,
        "leoflow.agent_lost_threshold": v.agent_lost_threshold,
        "scheduler.task_instance_heartbeat_timeout": v.task_instance_heartbeat_timeout,
        "leoflow.maintenance_interval": v.maintenance_interval,
        "leoflow.settle_timeout": v.settle_timeout,
    }
    violations: list[Rung] = []
    if not lower < upper:
        violations.append(Rung(
            "recovery_window",
            f"[scheduler] task_instance_heartbeat_timeout = {v.task_instance_heartbeat_timeout:g} is not above "
            f"leoflow's recovery window: it must exceed [core] task_success_overtime ({v.task_success_overtime:g}) "
            f"+ [workers] min_heartbeat_interval ({v.min_heartbeat_interval:g}) + [workers] socket_cleanup_timeout "
            f"({v.socket_cleanup_timeout:g}) + 2 x [leoflow] maintenance_interval ({v.maintenance_interval:g}) + "
            f"[leoflow] settle_timeout ({v.settle_timeout:g}) = {lower + 2 * v.maintenance_interval + v.settle_timeout:g} s; "
            f"with [leoflow] agent_lost_threshold = {v.agent_lost_threshold:g} (which must itself exceed {lower:g} s) "
            f"set it above {max(lower, v.agent_lost_threshold) + margin:g} s",
            window_values,
        ))
    elif not lower < v.agent_lost_threshold < upper:
        violations.append(Rung(
            "agent_lost_threshold",
            f"[leoflow] agent_lost_threshold = {v.agent_lost_threshold:g} must lie strictly between {lower:g} "
            f"([core] task_success_overtime + [workers] min_heartbeat_interval + [workers] socket_cleanup_timeout) "
            f"and {upper:g} ([scheduler] task_instance_heartbeat_timeout = {v.task_instance_heartbeat_timeout:g} "
            f"- 2 x [leoflow] maintenance_interval - [leoflow] settle_timeout)"
            + (f"; or raise [scheduler] task_instance_heartbeat_timeout above {v.agent_lost_threshold + margin:g} s"
               if v.agent_lost_threshold >= upper else ""),
            window_values,
        ))
    lease = v.agent_lease_seconds
    if lease is not None and not lease + v.killed_task_cleanup_time < v.agent_lost_threshold:
        violations.append(Rung(
            "agent_lease",
            f"[leoflow] agent_lease_seconds ({lease:g}) + [core] killed_task_cleanup_time "
            f"({v.killed_task_cleanup_time:g}) = {lease + v.killed_task_cleanup_time:g} s must be below [leoflow] "
            f"agent_lost_threshold ({v.agent_lost_threshold:g}): a task pod cut off from the API server kills its "
            f"task only that long after its last answer, and the scheduler re-runs the task once its heartbeat has "
            f"been silent for agent_lost_threshold, so both would run at once; lower agent_lease_seconds below "
            f"{v.agent_lost_threshold - v.killed_task_cleanup_time:g} s or raise agent_lost_threshold",
            {"leoflow.agent_lease_seconds": lease, "core.killed_task_cleanup_time": v.killed_task_cleanup_time,
             "leoflow.agent_lost_threshold": v.agent_lost_threshold},
        ))
    orphan = v.orphan_run_threshold
    warnings: list[Rung] = []
    if orphan is not None and orphan >= upper:
        # a warning, never a refusal: a deployment that lowered the purge timeout below the default threshold
        # must still start (the orphan-run reaper is a safety net; without it Airflow's own purge still acts)
        warnings.append(Rung(
            "orphan_run_threshold",
            f"[leoflow] orphan_run_threshold = {orphan:g} is not below {upper:g} s ([scheduler] "
            f"task_instance_heartbeat_timeout = {v.task_instance_heartbeat_timeout:g} - 2 x [leoflow] "
            f"maintenance_interval - [leoflow] settle_timeout): Airflow's heartbeat purge may fail an orphaned "
            f"running task (spending a user retry) before leoflow's orphan-run reaper re-runs it on the infra "
            f"budget; lower it below {upper:g} s",
            {"leoflow.orphan_run_threshold": orphan,
             "scheduler.task_instance_heartbeat_timeout": v.task_instance_heartbeat_timeout,
             "leoflow.maintenance_interval": v.maintenance_interval, "leoflow.settle_timeout": v.settle_timeout},
        ))
    if not violations and reap_kill_grace(v) < v.killed_task_cleanup_time:
        warnings.append(Rung(
            "kill_grace",
            f"the agent-lost reaper gives a killed task {reap_kill_grace(v):g} s for its on_kill, not [core] "
            f"killed_task_cleanup_time = {v.killed_task_cleanup_time:g} s, so that it ends before Airflow's "
            f"heartbeat purge ({upper:g} s into the window); lower [leoflow] agent_lost_threshold or raise "
            f"[scheduler] task_instance_heartbeat_timeout to give it all",
            {"core.killed_task_cleanup_time": v.killed_task_cleanup_time,
             "leoflow.agent_lost_threshold": v.agent_lost_threshold,
             "scheduler.task_instance_heartbeat_timeout": v.task_instance_heartbeat_timeout},
        ))
    hb_budget = v.max_failed_heartbeats * v.min_heartbeat_interval
    if hb_budget >= v.task_instance_heartbeat_timeout:
        warnings.append(Rung(
            "heartbeat_failure_budget",
            "the supervisor tolerates heartbeat failures for longer than Airflow's heartbeat timeout",
            {"workers.max_failed_heartbeats": v.max_failed_heartbeats,
             "workers.min_heartbeat_interval": v.min_heartbeat_interval,
             "scheduler.task_instance_heartbeat_timeout": v.task_instance_heartbeat_timeout},
        ))
    if v.dispatch_lost_threshold >= v.task_queued_timeout:
        warnings.append(Rung(
            "dispatch_lost_threshold",
            "Airflow's stuck-in-queued handling (revoke + requeue) acts before leoflow's dispatch-lost reaper "
            "can re-dispatch the same ti_id",
            {"leoflow.dispatch_lost_threshold": v.dispatch_lost_threshold,
             "scheduler.task_queued_timeout": v.task_queued_timeout},
        ))
    if v.pod_unschedulable_timeout and v.pod_unschedulable_timeout >= v.task_queued_timeout:
        warnings.append(Rung(
            "pod_unschedulable_timeout",
            "Airflow's stuck-in-queued handling (revoke + requeue, then failure after [scheduler] "
            "num_stuck_in_queued_retries) acts on an unschedulable task pod before leoflow re-offers it as "
            "backpressure: lower [leoflow] pod_unschedulable_timeout below [scheduler] task_queued_timeout",
            {"leoflow.pod_unschedulable_timeout": v.pod_unschedulable_timeout,
             "scheduler.task_queued_timeout": v.task_queued_timeout},
        ))
    if not violations and v.pod_termination_valve is not None:
        # the agent-lost reaper deletes a silent pod with reap_kill_grace; on an unreachable node no kubelet
        # reports its end, so the valve must open (and the next sync() re-drive it) before the purge acts
        late = v.agent_lost_threshold + reap_kill_grace(v) + v.pod_termination_valve + v.maintenance_interval
        if v.pod_termination_valve == 0 or late >= upper:
            warnings.append(Rung(
                "pod_termination_valve",
                "a task pod on an unreachable node never reports its end; leoflow re-runs its task instance on the "
                "infra budget once [leoflow] pod_termination_valve has passed after the agent-lost reaper's delete "
                f"(agent_lost_threshold + kill grace {reap_kill_grace(v):g} + valve + maintenance_interval = "
                f"{late:g} s after its last heartbeat), and Airflow's heartbeat purge may fail it first (a user "
                f"retry spent) from {upper:g} s on: keep the valve above 0 and lower it, or lower [leoflow] "
                "agent_lost_threshold",
                {"leoflow.pod_termination_valve": v.pod_termination_valve,
                 "leoflow.agent_lost_threshold": v.agent_lost_threshold,
                 "scheduler.task_instance_heartbeat_timeout": v.task_instance_heartbeat_timeout},
            ))
    if 2 * v.settle_timeout >= v.scheduler_health_check_threshold:
        # a sync() may spend one settle timeout on a replay an api-server accepts but does not answer (issue 8
        # hole 11); the heartbeat Airflow's health check reads lags one scheduler loop (the Job row is written
        # with the previous heartbeat's time: seen on 3.3.2), so the check sees up to two such loops
        warnings.append(Rung(
            "scheduler_health_check_threshold",
            "while the api-server accepts connections but does not answer, one sync() waits up to [leoflow] "
            "settle_timeout on a replay, and Airflow's scheduler health check sees the scheduler's heartbeat up to "
            "two such loops old: at 2 x settle_timeout >= [scheduler] scheduler_health_check_threshold it takes "
            "this scheduler for dead (with several schedulers a peer adopts its tasks)",
            {"leoflow.settle_timeout": v.settle_timeout,
             "scheduler.scheduler_health_check_threshold": v.scheduler_health_check_threshold},
        ))
    return LadderReport(tuple(violations), tuple(warnings))


def read_values(settings: LeoflowSettings, getfloat: Callable[[str, str, float], float] | None = None) -> LadderValues:
    """Collect the ladder's values from Airflow's config and ``settings``.

    :param getfloat: ``getfloat(section, key, fallback)``; defaults to Airflow's ``conf.getfloat``.
    """
    if getfloat is None:
        from airflow.configuration import conf

        def getfloat(section: str, key: str, fallback: float) -> float:
            return conf.getfloat(section, key, fallback=fallback)

    airflow_values = {name: float(getfloat(sec, key, dflt)) for name, (sec, key, dflt) in AIRFLOW_KEYS.items()}
    return LadderValues(
        **airflow_values,
        agent_lost_threshold=settings.agent_lost_threshold,
        maintenance_interval=settings.maintenance_interval,
        settle_timeout=settings.settle_timeout,
        dispatch_lost_threshold=settings.dispatch_lost_threshold,
        pod_unschedulable_timeout=settings.kubernetes.pod_unschedulable_timeout
        if settings.runtime == "kubernetes" else None,
        pod_termination_valve=settings.kubernetes.pod_termination_valve
        if settings.runtime == "kubernetes" else None,
        orphan_run_threshold=settings.orphan_run_threshold,
        agent_lease_seconds=settings.agent_lease_seconds if settings.runtime == "kubernetes" else None,
    )


def enforce(report: LadderReport, warn: Callable[[Rung], None]) -> None:
    """Raise :class:`LadderViolation` with one message for every hard rung; pass soft rungs to ``warn``."""
    for rung in report.warnings:
        warn(rung)
    if report.violations:
        raise LadderViolation("leoflow refuses to start: " + "; ".join(r.message for r in report.violations))
