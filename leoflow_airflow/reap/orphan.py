"""The orphan-run reaper (DESIGN §3 "Reap"; seed 002's orphan-run): a pure decision over Airflow's RUNNING task
instances that nothing of leoflow watches any more.

A task instance is an **orphan run** when all of these hold:

* it is RUNNING and its dag run is RUNNING;
* it was queued by this executor: its ``TaskInstance.executor`` names it (alias, module path or class name, as
  the scheduler matches it), or is empty while this executor is the default one;
* the ledger holds **no open attempt** of its ``ti_id`` (any runtime): no agent, no pod, no settle of leoflow
  will ever report for it (an attempt row lost or closed while Airflow still shows the task running);
* nothing happened to it for more than ``[leoflow] orphan_run_threshold`` seconds: the latest of its
  ``queued_dttm``, ``start_date``, ``last_heartbeat_at``, ``updated_at`` and its dag run's ``start_date``.

A silent orphan run whose ``ti_id``'s latest attempt closed with the agent's **terminal report landed**
(``reported_state`` one of :data:`RESTORABLE_REPORTS`, closed ``reported`` or ``replayed``, same try) is not
re-driven: a late call of that same execution wrote the TI back to RUNNING after the report (on SQLite a ``PATCH
/run`` the Task SDK client retried while the write lock was held; DESIGN §2, the "overwritten report" row, is the
same race caught before the settle). It is **restored**: the landed state is PATCHed again once the TI has been
silent ``landed_grace`` seconds (30 by default: no heartbeat of any live execution comes that late), so the body
never runs twice, a failed task is not re-run on the infra budget, and no user retry is spent.

Otherwise it is re-driven through the infra path (:func:`leoflow_airflow.redrive.infra_redrive`: a new try on the
infra budget, ``max_tries + 1``, no user retry spent, a Log row with the reason), before Airflow's heartbeat
purge (``[scheduler] task_instance_heartbeat_timeout``) would fail it and spend a user retry. The dag run itself
is never touched: Airflow decides run states.

A QUEUED task instance with no attempt is **not** an orphan here: it normally waits in the executor's queue for a
slot or a re-offer (backpressure), and Airflow's stuck-in-queued handling (``[scheduler] task_queued_timeout``)
owns the ones that are really lost; the infra re-drive could not reset it anyway (it requires RUNNING).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from leoflow_airflow.reconcile import OVERWRITABLE_REPORTS

__all__ = ["Landed", "OrphanSettings", "RESTORABLE_REPORTS", "Ownership", "Redrive", "Restore", "RunningTI",
           "OrphanView", "candidates", "decide"]

REAPER = "orphan-run"
"""The reaper's name in logs and in the re-drive's Log row (``leoflow orphan-run: …``)."""


@dataclass(frozen=True)
class RunningTI:
    """What Airflow's rows say of one task instance (``task_instance`` joined with its ``dag_run``); every
    timestamp tz-aware UTC or None. Read by :func:`leoflow_airflow.airflow_db.load_running_tis`."""

    ti_id: str
    dag_id: str
    run_id: str
    task_id: str
    map_index: int
    try_number: int
    state: str | None
    executor: str | None
    """``TaskInstance.executor``: the executor the task asked for (None: the default executor)."""
    run_state: str | None
    """The dag run's state."""
    queued_dttm: datetime | None = None
    start_date: datetime | None = None
    last_heartbeat_at: datetime | None = None
    updated_at: datetime | None = None
    run_start_date: datetime | None = None

    def last_activity(self) -> tuple[datetime, str] | None:
        """The latest of its activity times and which one it is, or None when it has none."""
        seen = [(value, name) for name, value in (
            ("queued_dttm", self.queued_dttm), ("start_date", self.start_date),
            ("last_heartbeat_at", self.last_heartbeat_at), ("updated_at", self.updated_at),
            ("dag run start_date", self.run_start_date)) if value is not None]
        return max(seen, key=lambda item: item[0]) if seen else None


RESTORABLE_REPORTS: frozenset[str] = OVERWRITABLE_REPORTS - {"up_for_retry"}
"""The landed reports an orphan run is restored to (success, failed, skipped, removed): the reports
:data:`leoflow_airflow.reconcile.OVERWRITABLE_REPORTS` names, as they can be written over at the same ``ti_id``
after the settle. Not ``up_for_retry``: Airflow gives the next try a new ``ti_id``
when it lands (``TaskInstance.prepare_db_for_next_try``), so a late call of the old one finds no row."""


@dataclass(frozen=True)
class Landed:
    """The ledger's latest attempt of a ``ti_id``, closed after its agent's terminal report landed (module
    docstring): its ``try_number`` and ``attempt_epoch``, the ``state`` reported, and when (``at``, tz-aware UTC
    or None)."""

    try_number: int
    attempt_epoch: int
    state: str
    at: datetime | None = None


@dataclass(frozen=True)
class OrphanView:
    """One candidate: Airflow's row, whether the ledger holds an open attempt of its ``ti_id``, and (none open)
    whether its latest attempt closed with its report landed (``landed``)."""

    ti: RunningTI
    open_attempt: bool
    landed: Landed | None = None


@dataclass(frozen=True)
class Ownership:
    """Which task instances this executor queued: ``names`` are the values of ``TaskInstance.executor`` that
    name it (its alias, module path and class name); ``default``: it is the default executor, so an empty
    ``executor`` is its too."""

    names: frozenset[str]
    default: bool

    def owns(self, executor: str | None) -> bool:
        """True when a task instance with this ``TaskInstance.executor`` was queued by this executor."""
        return self.default if not executor else executor in self.names


@dataclass(frozen=True)
class OrphanSettings:
    """``threshold``: ``[leoflow] orphan_run_threshold`` seconds; ``owner``: this executor's :class:`Ownership`;
    ``landed_grace``: seconds of silence before an orphan run whose terminal report had landed is restored."""

    threshold: float
    owner: Ownership
    landed_grace: float = 30.0


@dataclass(frozen=True)
class Redrive:
    """Re-drive the RUNNING task instance ``ti_id`` as a new try on the infra budget; ``why`` is for the log and
    the Log row."""

    ti_id: str
    why: str
    reaper: str = REAPER


@dataclass(frozen=True)
class Restore:
    """PATCH the landed ``state`` of attempt (``ti_id``, ``try_number``, ``attempt_epoch``) again: a late call of
    that execution wrote its RUNNING task instance back over it. ``at``: the ``end_date`` to send, when it was
    first reported or the late call's ``start_date`` if later (tz-aware UTC or None); ``why`` is for the log and
    the Log row."""

    ti_id: str
    try_number: int
    attempt_epoch: int
    state: str
    at: datetime | None
    why: str
    reaper: str = REAPER


def _silent(ti: RunningTI, now: datetime, settings: OrphanSettings,
            threshold: float | None = None) -> tuple[float, str] | None:
    """``(seconds silent, latest activity's name)`` when ``ti`` would be an orphan run if the ledger held no open
    attempt of it (running in a running dag run, queued by this executor, silent past ``threshold``, by default
    the settings' ``threshold``); else None."""
    if ti.state != "running" or ti.run_state != "running" or not settings.owner.owns(ti.executor):
        return None
    last = ti.last_activity()
    if last is None:
        return None  # nothing to measure silence from: never guessed
    silent = (now - last[0]).total_seconds()
    return (silent, last[1]) if silent > (settings.threshold if threshold is None else threshold) else None


def candidates(rows: list[RunningTI], now: datetime, settings: OrphanSettings) -> list[RunningTI]:
    """The rows of ``rows`` that :func:`decide` acts on for some ledger view of them (none open: restored past
    ``landed_grace`` when its terminal report had landed, else re-driven past ``threshold``), in their order: the
    only ones whose attempts need looking up (a page of heartbeating task instances needs no ledger read at all;
    issue 10, "Benchmark"). Pure: ``now`` is tz-aware UTC."""
    first = min(settings.threshold, settings.landed_grace)
    return [ti for ti in rows if _silent(ti, now, settings, first) is not None]


def decide(snapshot: list[OrphanView], now: datetime, settings: OrphanSettings) -> list[Redrive | Restore]:
    """The orphan runs among ``snapshot`` (module docstring), in its order: a :class:`Restore` for one whose
    terminal report (:data:`RESTORABLE_REPORTS`) had landed (silent past ``landed_grace``), else a
    :class:`Redrive` (silent past ``threshold``). Pure: ``now`` is tz-aware UTC."""
    actions: list[Redrive | Restore] = []
    for view in snapshot:
        ti = view.ti
        if view.open_attempt:
            continue
        landed = view.landed
        if landed is not None and landed.state in RESTORABLE_REPORTS and landed.try_number == ti.try_number:
            found = _silent(ti, now, settings, settings.landed_grace)
            if found is not None:
                # Airflow's duration is end_date - start_date: never before the late call's start_date
                at = max((t for t in (landed.at, ti.start_date) if t is not None), default=None)
                actions.append(Restore(ti.ti_id, landed.try_number, landed.attempt_epoch, landed.state, at, (
                    f"task instance {ti.dag_id}.{ti.task_id} (run {ti.run_id}, map_index {ti.map_index}, try "
                    f"{ti.try_number}) is running again after its attempt {landed.attempt_epoch}'s {landed.state} "
                    f"report landed, with no open leoflow attempt and no activity for {found[0]:.0f} s (latest: "
                    f"{found[1]}): a late call of that execution overwrote the {landed.state}; restoring it")))
            continue
        found = _silent(ti, now, settings)
        if found is None:
            continue
        silent, latest = found
        actions.append(Redrive(ti.ti_id, (
            f"task instance {ti.dag_id}.{ti.task_id} (run {ti.run_id}, map_index {ti.map_index}, try "
            f"{ti.try_number}) is running with no open leoflow attempt and no activity for {silent:.0f} s "
            f"(> orphan_run_threshold {settings.threshold:g} s; latest: {latest})")))
    return actions
