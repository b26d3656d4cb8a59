"""The lost-agent reapers (DESIGN §3 "Reap"): agent-lost and dispatch-lost, pure decisions over presence.

* **agent-lost**: the TI is RUNNING, its heartbeat (Airflow's ``last_heartbeat_at``) has been silent for more
  than ``[leoflow] agent_lost_threshold`` seconds, yet its agent process still exists: a hung supervisor.
  Kill it; the reconciler then decides from the record (or re-drives it as an infra loss) before Airflow's
  own purge would fail it at ``[scheduler] task_instance_heartbeat_timeout``.
* **moved-on**: the TI is no longer this execution's to run: a user marked it success or failed, or cleared it
  while it ran, or a retry or a re-drive superseded its try (a new ``ti_id``), or it ended (a report of its own)
  while its agent lives on, and its heartbeat (for a superseded try: the archive time) has been silent for more
  than ``[leoflow] agent_lost_threshold`` seconds. A healthy agent ends by itself well within that
  (the supervisor stops its task at the heartbeat's 409 and leaves ``task_success_overtime`` for callbacks; the
  boot-time ladder keeps the threshold above both), so one still alive cannot reach the api-server or is hung:
  kill it, with ``reap_kill_grace`` (on Kubernetes: delete that epoch's pod with its grace period), instead of
  leaving a body running, or a pod ``Succeeded`` that contradicts the task's state, until retention. The
  reconciler then closes the attempt (moved on) or, for a RESTARTING TI, hands it back to Airflow.
* **dispatch-lost** (start-expired): the TI is still QUEUED ``[leoflow] dispatch_lost_threshold`` seconds
  after its agent started, and its agent never reached ``/run``. Kill it; the reconciler re-dispatches the
  same ``ti_id`` as epoch + 1 (at most ``[leoflow] redispatch_limit`` times). The clock starts where the
  runtime's :class:`~leoflow_airflow.lifecycle.runtime.StartProgress` says the agent started (Kubernetes: its
  container running), or at the dispatch when the runtime says nothing (Lite, exactly as before). While the
  TI is QUEUED and its attempt not started, the start progress decides instead:

  ==================  ========================================================================================
  ``STARTING``        progress (scheduled, pulling its image, creating its container): never killed here
                      (Airflow's ``task_queued_timeout`` still bounds it)
  ``NO_ROOM``         backpressure: left alone until ``until``; then killed and its workload re-offered
                      (``start-backpressure``: never a user retry, never a failure)
  ``REJECTED``        once ``until`` passed (at once without one): killed, and the TI fails through Airflow's
                      path with the reason (``start-rejected``)
  ==================  ========================================================================================

Three-valued presence (:class:`~leoflow_airflow.lifecycle.runtime.Presence`): a LIVE agent is subject to these
rules, a GONE one belongs to the reconciler, an UNKNOWN one is left alone; only these rules ever kill a live
agent.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime

from leoflow_airflow.ledger.states import AttemptRef
from leoflow_airflow.lifecycle.runtime import Presence, StartProgress, StartState

__all__ = ["After", "AttemptView", "KillAgent", "MOVED_ON_STATES", "Presence", "ReapSettings", "SUPERSEDED",
           "decide"]

SUPERSEDED = "superseded"
"""The ``ti_state`` of an attempt whose ``ti_id`` a newer try archived (a clear, a retry, an infra re-drive: Airflow
3.3 gives the task instance a new id at once); its ``last_heartbeat_at`` is then the archive time
(``leoflow_airflow.airflow_db.load_ti_liveness``)."""

MOVED_ON_STATES = frozenset({"success", "failed", "skipped", "removed", "upstream_failed", "up_for_retry",
                             "restarting", SUPERSEDED})
"""States of an attempt's own ``ti_id`` in which its execution has nothing left to run once its heartbeat is
silent past the threshold (the moved-on reaper): ended, marked by a user, or superseded by a newer try (a clear
of a running task or a retry archives the id at once; "restarting" and "up_for_retry" on the same id are kept
for the moment between Airflow's two writes)."""


@dataclass(frozen=True)
class AttemptView:
    """One open, dispatched attempt as the reapers see it.

    :param ti_state: Airflow's state of that exact ``ti_id`` (``None`` when the id is gone/archived).
    :param last_heartbeat_at: Airflow's ``last_heartbeat_at`` of that ``ti_id`` (tz-aware UTC) or ``None``.
    :param dispatched_at: when leoflow handed it to the runtime (tz-aware UTC).
    :param start: how far it got toward running its agent, as the runtime tells (None: the runtime says nothing;
        the dispatch-lost clock counts from ``dispatched_at``).
    """

    ref: AttemptRef
    presence: Presence
    ti_state: str | None
    last_heartbeat_at: datetime | None
    dispatched_at: datetime | None
    start: StartProgress | None = None


@dataclass(frozen=True)
class ReapSettings:
    """Thresholds in seconds."""

    agent_lost_threshold: float
    dispatch_lost_threshold: float


class After(enum.StrEnum):
    """What follows a reaper's kill once the attempt is gone."""

    SETTLE = "settle"
    """The reconciler decides from the evidence (a re-dispatch, an infra re-drive, a replay)."""
    REJECT = "reject"
    """The task instance fails through Airflow's path with ``why`` (it can never start as asked)."""
    BACKPRESSURE = "backpressure"
    """The workload is re-offered: no user retry, no failure, no ``redispatch_limit`` spent."""


@dataclass(frozen=True)
class KillAgent:
    """Kill this attempt's whole subtree; ``reaper`` names the rule, ``why`` is for the log and Log row (and,
    for ``REJECT``, the task's failure reason); ``after`` says what follows once it is gone."""

    ref: AttemptRef
    reaper: str
    why: str
    after: After = After.SETTLE


def decide(snapshot: list[AttemptView], now: datetime, settings: ReapSettings) -> list[KillAgent]:
    """Return the agents to kill (module docstring). Pure: ``now`` is tz-aware UTC; no I/O."""
    actions: list[KillAgent] = []
    for view in snapshot:
        if view.presence != Presence.LIVE:
            continue  # gone attempts belong to the reconciler; unknown ones are never reaped
        if view.ti_state == "running" and view.last_heartbeat_at is not None:
            silent = (now - view.last_heartbeat_at).total_seconds()
            if silent > settings.agent_lost_threshold:
                actions.append(KillAgent(view.ref, "agent-lost",
                                         f"heartbeat silent for {silent:.0f} s (> agent_lost_threshold "
                                         f"{settings.agent_lost_threshold:g} s) while the agent process lives"))
        elif view.ti_state in MOVED_ON_STATES and view.last_heartbeat_at is not None:
            silent = (now - view.last_heartbeat_at).total_seconds()
            if silent > settings.agent_lost_threshold:
                actions.append(KillAgent(view.ref, "moved-on",
                                         f"the task instance is {view.ti_state} (ended, marked or cleared), yet its "
                                         f"agent still lives {silent:.0f} s after its last heartbeat (> "
                                         f"agent_lost_threshold {settings.agent_lost_threshold:g} s)"))
        elif view.ti_state == "queued":
            action = _queued(view, now, settings)
            if action is not None:
                actions.append(action)
    return actions


def _queued(view: AttemptView, now: datetime, settings: ReapSettings) -> KillAgent | None:
    """The dispatch-lost rule for one LIVE attempt whose TI is QUEUED (module docstring's table)."""
    start = view.start
    if start is None or start.state is StartState.STARTED:
        since, what = (view.dispatched_at, "dispatch") if start is None else (start.since, "its agent started")
        if since is None:
            return None
        waited = (now - since).total_seconds()
        if waited <= settings.dispatch_lost_threshold:
            return None
        return KillAgent(view.ref, "dispatch-lost",
                         f"still queued {waited:.0f} s after {what} (> dispatch_lost_threshold "
                         f"{settings.dispatch_lost_threshold:g} s): its agent never reached /run")
    if start.until is not None and now < start.until:
        return None
    if start.state is StartState.REJECTED:
        return KillAgent(view.ref, "start-rejected", start.reason or "it cannot start", After.REJECT)
    if start.state is StartState.NO_ROOM and start.until is not None:
        waited = f" for {(now - start.since).total_seconds():.0f} s" if start.since is not None else ""
        return KillAgent(view.ref, "start-backpressure",
                         f"no room to start it{waited}: {start.reason or 'the runtime cannot place it'}; "
                         "re-offered as backpressure", After.BACKPRESSURE)
    return None  # STARTING, or NO_ROOM without a bound: progress
