"""The lost-agent reapers (DESIGN §3 "Reap"): agent-lost and dispatch-lost, pure decisions over presence.

* **agent-lost**: the TI is RUNNING, its heartbeat (Airflow's ``last_heartbeat_at``) has been silent for more
  than ``[leoflow] agent_lost_threshold`` seconds, yet its agent process still exists: a hung supervisor.
  Kill it; the reconciler then decides from the record (or re-drives it as an infra loss) before Airflow's
  own purge would fail it at ``[scheduler] task_instance_heartbeat_timeout``.
* **dispatch-lost** (start-expired): the TI is still QUEUED ``[leoflow] dispatch_lost_threshold`` seconds
  after leoflow dispatched it, and its agent never reached ``/run``. Kill it; the reconciler re-dispatches the
  same ``ti_id`` as epoch + 1 (at most ``[leoflow] redispatch_limit`` times).

Three-valued presence (:class:`~leoflow_airflow.lifecycle.runtime.Presence`): a LIVE agent is subject to these
rules, a GONE one belongs to the reconciler, an UNKNOWN one is left alone; only these rules ever kill a live
agent.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from leoflow_airflow.ledger.states import AttemptRef
from leoflow_airflow.lifecycle.runtime import Presence

__all__ = ["AttemptView", "KillAgent", "Presence", "ReapSettings", "decide"]


@dataclass(frozen=True)
class AttemptView:
    """One open, dispatched attempt as the reapers see it.

    :param ti_state: Airflow's state of that exact ``ti_id`` (``None`` when the id is gone/archived).
    :param last_heartbeat_at: Airflow's ``last_heartbeat_at`` of that ``ti_id`` (tz-aware UTC) or ``None``.
    :param dispatched_at: when leoflow handed it to the runtime (tz-aware UTC).
    """

    ref: AttemptRef
    presence: Presence
    ti_state: str | None
    last_heartbeat_at: datetime | None
    dispatched_at: datetime | None


@dataclass(frozen=True)
class ReapSettings:
    """Thresholds in seconds."""

    agent_lost_threshold: float
    dispatch_lost_threshold: float


@dataclass(frozen=True)
class KillAgent:
    """Kill this attempt's whole subtree; ``reaper`` names the rule, ``why`` is for the log and Log row."""

    ref: AttemptRef
    reaper: str
    why: str


def decide(snapshot: list[AttemptView], now: datetime, settings: ReapSettings) -> list[KillAgent]:
    """Return the agents to kill. Pure: ``now`` is tz-aware UTC; no I/O."""
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
        elif view.ti_state == "queued" and view.dispatched_at is not None:
            waited = (now - view.dispatched_at).total_seconds()
            if waited > settings.dispatch_lost_threshold:
                actions.append(KillAgent(view.ref, "dispatch-lost",
                                         f"still queued {waited:.0f} s after dispatch (> dispatch_lost_threshold "
                                         f"{settings.dispatch_lost_threshold:g} s): its agent never reached /run"))
    return actions
