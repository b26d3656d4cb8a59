"""What the reconciler does with a finished attempt (DESIGN §2, the table): a pure decision.

:func:`decide` takes the attempt as the ledger knows it, its decoded outcome record (or ``None``) and
Airflow's live task-instance row for the same logical TI (or ``None``), and returns one :class:`Action`.
The executor's ``sync()`` performs it (the I/O) and closes the ledger row with a guarded write.

Every row requires that the attempt is the current epoch of its ``ti_id`` and is dead; the caller checks
both before calling (proof of death: no process of the attempt's subtree left).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from leoflow_agent.outcome import Outcome, OutcomeRecord, Reason
from leoflow_airflow.dispatch.guard import TIRow
from leoflow_airflow.ledger.states import Resolution


class Act(enum.StrEnum):
    """The kinds of action the reconciler takes."""

    CLOSE = "close"                    # nothing to do on Airflow's side; close the ledger row
    REPLAY = "replay"                  # PATCH the recorded /state body with a freshly minted execution token
    INFRA_REDRIVE = "infra_redrive"    # no usable record, TI RUNNING: re-run as a new try on the infra budget
    REDISPATCH = "redispatch"          # agent died before /run, TI still QUEUED: same ti_id as epoch + 1
    RESTARTING_SUCCESS = "restarting_success"  # a user cleared a running task: executor.success(key) once


@dataclass(frozen=True)
class Action:
    """One decision: what to do, the resolution to close the ledger row with, and why (for the log)."""

    act: Act
    resolution: Resolution
    why: str


def decide(
    *, ti_id: str, try_number: int, record: OutcomeRecord | None, ti: TIRow | None, reported: bool = False
) -> Action:
    """Decide what to do with a dead attempt ``(ti_id, try_number)`` (DESIGN §2's table).

    :param record: the attempt's outcome record as :func:`leoflow_agent.outcome.decode` returned it.
    :param ti: Airflow's live row for the attempt's logical TI (dag_id, run_id, task_id, map_index).
    :param reported: the agent told us its terminal PATCH returned 2xx (the ledger's ``reported_state``).
    """
    if ti is None:
        return Action(Act.CLOSE, Resolution.MOVED_ON, "the task instance row is gone")
    if ti.id != ti_id:
        if ti.state == "restarting" and ti.try_number == try_number:
            return Action(Act.RESTARTING_SUCCESS, Resolution.RESTARTING, "a user cleared the running task")
        if record is not None and record.state is not None and record.state in ("up_for_retry",):
            return Action(Act.CLOSE, Resolution.REPORTED, "the agent's up_for_retry report landed")
        return Action(Act.CLOSE, Resolution.MOVED_ON, f"the task instance moved on (now {ti.state})")
    if ti.state == "running" and not reported:
        if record is not None and record.reason == Reason.HEARTBEAT_LOST:
            return Action(Act.INFRA_REDRIVE, Resolution.INFRA_REDRIVE, "the agent lost its heartbeat")
        if record is not None and record.reason == Reason.KILLED and record.payload is None:
            return Action(Act.INFRA_REDRIVE, Resolution.INFRA_REDRIVE,
                          "leoflow killed the attempt; the agent refused the failure the kill caused")
        if record is not None and record.payload is not None and record.state is not None:
            return Action(Act.REPLAY, Resolution.REPLAYED, f"the {record.state} report was lost; replaying it")
        return Action(Act.INFRA_REDRIVE, Resolution.INFRA_REDRIVE, "the agent died with no outcome record")
    if ti.state == "queued" and not reported and (record is None or record.state is None):
        # no record, or one that reports no state (a task pod whose exchange was refused or never answered, an
        # agent that could not start): the agent never reached /run
        why = "the agent died before /run" if record is None else f"the agent never reached /run ({record.reason})"
        return Action(Act.REDISPATCH, Resolution.REDISPATCHED, why)
    if reported or (record is not None and record.state == ti.state):
        return Action(Act.CLOSE, Resolution.REPORTED, f"Airflow has the agent's report (now {ti.state})")
    if record is not None and record.state in ("up_for_reschedule", "deferred", "awaiting_input"):
        return Action(Act.CLOSE, Resolution.REPORTED, f"the {record.state} hand-off landed (now {ti.state})")
    return Action(Act.CLOSE, Resolution.MOVED_ON, f"the task instance is {ti.state}")


def outcome_summary(record: OutcomeRecord | None) -> str:
    """A short text for logs: ``"success"``, ``"failed (heartbeat_lost)"`` or ``"no record"``."""
    if record is None:
        return "no record"
    text = record.state or str(record.outcome)
    if record.outcome == Outcome.FAILED and record.reason:
        text += f" ({record.reason})"
    return text
