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

Then it is re-driven through the infra path (:func:`leoflow_airflow.redrive.infra_redrive`: a new try on the
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

__all__ = ["OrphanSettings", "Ownership", "Redrive", "RunningTI", "OrphanView", "candidates", "decide"]

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


@dataclass(frozen=True)
class OrphanView:
    """One candidate: Airflow's row and whether the ledger holds an open attempt of its ``ti_id``."""

    ti: RunningTI
    open_attempt: bool


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
    """``threshold``: ``[leoflow] orphan_run_threshold`` seconds; ``owner``: this executor's :class:`Ownership`."""

    threshold: float
    owner: Ownership


@dataclass(frozen=True)
class Redrive:
    """Re-drive the RUNNING task instance ``ti_id`` as a new try on the infra budget; ``why`` is for the log and
    the Log row."""

    ti_id: str
    why: str
    reaper: str = REAPER


def _silent(ti: RunningTI, now: datetime, settings: OrphanSettings) -> tuple[float, str] | None:
    """``(seconds silent, latest activity's name)`` when ``ti`` would be an orphan run if the ledger held no open
    attempt of it (running in a running dag run, queued by this executor, silent past the threshold); else
    None."""
    if ti.state != "running" or ti.run_state != "running" or not settings.owner.owns(ti.executor):
        return None
    last = ti.last_activity()
    if last is None:
        return None  # nothing to measure silence from: never guessed
    silent = (now - last[0]).total_seconds()
    return (silent, last[1]) if silent > settings.threshold else None


def candidates(rows: list[RunningTI], now: datetime, settings: OrphanSettings) -> list[RunningTI]:
    """The rows of ``rows`` that :func:`decide` re-drives unless the ledger holds an open attempt of them, in
    their order: the only ones whose attempts need looking up (a page of heartbeating task instances needs no
    ledger read at all; issue 10, "Benchmark"). Pure: ``now`` is tz-aware UTC."""
    return [ti for ti in rows if _silent(ti, now, settings) is not None]


def decide(snapshot: list[OrphanView], now: datetime, settings: OrphanSettings) -> list[Redrive]:
    """The orphan runs among ``snapshot`` (module docstring), in its order. Pure: ``now`` is tz-aware UTC."""
    actions: list[Redrive] = []
    for view in snapshot:
        ti = view.ti
        found = None if view.open_attempt else _silent(ti, now, settings)
        if found is None:
            continue
        silent, latest = found
        actions.append(Redrive(ti.ti_id, (
            f"task instance {ti.dag_id}.{ti.task_id} (run {ti.run_id}, map_index {ti.map_index}, try "
            f"{ti.try_number}) is running with no open leoflow attempt and no activity for {silent:.0f} s "
            f"(> orphan_run_threshold {settings.threshold:g} s; latest: {latest})")))
    return actions
