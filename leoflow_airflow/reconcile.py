"""What the reconciler does with a finished attempt (DESIGN §2, the table): a pure decision.

:func:`decide` takes the attempt as the ledger knows it, its decoded outcome record (or ``None``) and
Airflow's live task-instance row for the same logical TI (or ``None``), and returns one :class:`Action`.
The executor's ``sync()`` performs it (the I/O) and closes the ledger row with a guarded write.

Every row requires that the attempt is the current epoch of its ``ti_id`` and is dead; the caller checks
both before calling (proof of death: no process of the attempt's subtree left).

Where the record decides nothing (none, or one without a state), the runtime's own word on the end
(:class:`~leoflow_airflow.lifecycle.runtime.EndCause`, the Kubernetes runtime's pod status; issue 10 item 2)
settles it, in the evidence order of ``docs/DESIGN.md`` §2 "Pod ends": an infra loss is re-driven on the
infra budget; an OOM kill is re-driven once (:attr:`Resolution.OOM_REDRIVE` marks it durably) and an OOM kill
of that re-driven try is a task failure; ``DeadlineExceeded`` is a task failure. A record always wins over the cause.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from leoflow_agent.outcome import Outcome, OutcomeRecord, Reason
from leoflow_airflow.dispatch.guard import TIRow
from leoflow_airflow.ledger.states import Resolution
from leoflow_airflow.lifecycle.runtime import EndCause, EndKind


OVERWRITABLE_REPORTS = frozenset({"success", "failed", "up_for_retry", "skipped", "removed"})
"""Terminal states whose landed report :func:`decide` replays when the TI reads RUNNING again at the same
``ti_id`` (a hand-off's TI runs again legitimately, as a new epoch)."""


class Act(enum.StrEnum):
    """The kinds of action the reconciler takes."""

    CLOSE = "close"                    # nothing to do on Airflow's side; close the ledger row
    REPLAY = "replay"                  # PATCH the recorded /state body with a freshly minted execution token
    INFRA_REDRIVE = "infra_redrive"    # no usable record, TI RUNNING: re-run as a new try on the infra budget
    REDISPATCH = "redispatch"          # agent died before /run, TI still QUEUED: same ti_id as epoch + 1
    RESTARTING_SUCCESS = "restarting_success"  # a user cleared a running task: executor.success(key) once
    TASK_FAIL = "task_fail"            # the runtime says the task itself failed: executor.fail(key) with the reason


@dataclass(frozen=True)
class Action:
    """One decision: what to do, the resolution to close the ledger row with, and why (for the log)."""

    act: Act
    resolution: Resolution
    why: str


def decide(
    *, ti_id: str, try_number: int, record: OutcomeRecord | None, ti: TIRow | None, reported: bool = False,
    cause: EndCause | None = None, oom_redriven: bool = False,
) -> Action:
    """Decide what to do with a dead attempt ``(ti_id, try_number)`` (DESIGN §2's table).

    :param record: the attempt's outcome record as :func:`leoflow_agent.outcome.decode` returned it.
    :param ti: Airflow's live row for the attempt's logical TI (dag_id, run_id, task_id, map_index).
    :param reported: the agent told us its terminal PATCH returned 2xx (the ledger's ``reported_state``): the
        row is closed whatever Airflow's row says now, except a TI RUNNING again at the same ``ti_id`` with a
        terminal record (:data:`OVERWRITABLE_REPORTS`), whose report a late call overwrote: replayed.
    :param cause: what the runtime's status says ended the attempt (``Evidence.cause``; None for Lite). Read only
        where the record decides nothing: a TI still RUNNING with no record or a record without a state
        (:func:`settle_by_cause`), and a TI still QUEUED with no record at all (``DeadlineExceeded`` fails it;
        ``NO_ROOM``, a node that refused the pod for lack of room, is a ``REDISPATCH`` closed
        ``LAUNCH_FAILED``: backpressure; any other cause is named in the re-dispatch's reason).
    :param oom_redriven: this try is the one re-drive of an OOM kill: the latest earlier try of the logical TI
        in the ledger closed :attr:`Resolution.OOM_REDRIVE` (:func:`was_oom_redrive`). Read only for an OOM cause
        or an ``oom_killed`` record (the agent saw the OOM killer end its task process: one process killed at the
        limit, not the container, so the runtime's cause may say nothing).
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
        if record is not None and record.reason == Reason.API_UNREACHABLE and record.payload is None:
            return Action(Act.INFRA_REDRIVE, Resolution.INFRA_REDRIVE,
                          "the task failed after an Execution API call went unanswered; the agent refused "
                          "that failure")
        if record is not None and record.reason == Reason.OOM_KILLED and record.payload is None:
            said = "the OOM killer ended a process of the attempt and the agent refused the failure it caused"
            if cause is not None and cause.kind is EndKind.OOM_KILLED:  # the runtime names the container and pod
                said = f"{cause.reason}: {said}"
            return settle_by_cause(EndCause(EndKind.OOM_KILLED, said), oom_redriven=oom_redriven)
        if record is not None and record.reason == Reason.KILLED and record.payload is None:
            return Action(Act.INFRA_REDRIVE, Resolution.INFRA_REDRIVE,
                          "leoflow killed the attempt; the agent refused the failure the kill caused")
        if record is not None and record.payload is not None and record.state is not None:
            return Action(Act.REPLAY, Resolution.REPLAYED, f"the {record.state} report was lost; replaying it")
        if cause is not None:
            return settle_by_cause(cause, oom_redriven=oom_redriven)
        return Action(Act.INFRA_REDRIVE, Resolution.INFRA_REDRIVE, "the agent died with no outcome record")
    if ti.state == "queued" and not reported and (record is None or record.state is None):
        # no record, or one that reports no state (a task pod whose exchange was refused or never answered, an
        # agent that could not start): the agent never reached /run
        if record is None and cause is not None and cause.kind is EndKind.DEADLINE_EXCEEDED:
            return Action(Act.TASK_FAIL, Resolution.EXECUTOR_FAILED, f"{cause.reason} before the task started")
        if record is None and cause is not None and cause.kind is EndKind.NO_ROOM:
            # backpressure, not a dead agent: the lifecycle re-offers it after a pause, no redispatch_limit spent
            return Action(Act.REDISPATCH, Resolution.LAUNCH_FAILED, f"{cause.reason}; re-offered as backpressure")
        why = "the agent died before /run" if record is None else f"the agent never reached /run ({record.reason})"
        if record is None and cause is not None:
            why += f": {cause.reason}"
        return Action(Act.REDISPATCH, Resolution.REDISPATCHED, why)
    if ti.state == "running" and record is not None and record.payload is not None \
            and record.state in OVERWRITABLE_REPORTS:
        # reported: the agent's terminal PATCH was answered 2xx, which Airflow 3.3 sends after its commit (the
        # Execution API's session dependency has scope="function"), yet that ti_id is RUNNING again: a call of the
        # same execution still waiting on the database wrote over it. On SQLite ``PATCH /run`` reads the TI's
        # state before it waits for the write lock, so a /run the Task SDK client gave up on and retried lands
        # after the task's success (Lite chaos loop, a 15 s scheduler stop). The record is the report: replay it
        return Action(Act.REPLAY, Resolution.REPLAYED,
                      f"Airflow shows the task running again after the agent's {record.state} report landed (a "
                      "late call of the same execution overwrote it); replaying the report")
    if reported or (record is not None and record.state == ti.state):
        return Action(Act.CLOSE, Resolution.REPORTED, f"Airflow has the agent's report (now {ti.state})")
    if record is not None and record.state in ("up_for_reschedule", "deferred", "awaiting_input"):
        return Action(Act.CLOSE, Resolution.REPORTED, f"the {record.state} hand-off landed (now {ti.state})")
    return Action(Act.CLOSE, Resolution.MOVED_ON, f"the task instance is {ti.state}")


def settle_by_cause(cause: EndCause, *, oom_redriven: bool) -> Action:
    """What a RUNNING TI's dead attempt gets when its record decides nothing and its runtime named the end
    (issue 10 item 2; ``docs/DESIGN.md`` §2 "Pod ends"). ``why`` is ``cause.reason`` first, so the TI's Log row
    names it (``OOMKilled, exit 137, container base``):

    - ``INFRA_LOSS`` → ``INFRA_REDRIVE``: a new try on the infra budget (``Resolution.INFRA_REDRIVE``);
    - ``OOM_KILLED``, not re-driven before → ``INFRA_REDRIVE``, marked ``Resolution.OOM_REDRIVE``;
    - ``OOM_KILLED`` on the try that re-drive made (``oom_redriven``) → ``TASK_FAIL``: ``executor.fail``,
      Airflow's own failure path (failure callback, user retries apply), ``Resolution.EXECUTOR_FAILED``;
    - ``DEADLINE_EXCEEDED`` → ``TASK_FAIL``, the same.

    A spent infra budget turns either re-drive into ``executor.fail`` as for any infra loss (the lifecycle).
    """
    if cause.kind is EndKind.DEADLINE_EXCEEDED:
        return Action(Act.TASK_FAIL, Resolution.EXECUTOR_FAILED, cause.reason)
    if cause.kind is EndKind.OOM_KILLED:
        if oom_redriven:
            return Action(Act.TASK_FAIL, Resolution.EXECUTOR_FAILED,
                          f"{cause.reason}; OOM-killed again on the try leoflow re-ran after an OOM kill")
        return Action(Act.INFRA_REDRIVE, Resolution.OOM_REDRIVE, cause.reason)
    return Action(Act.INFRA_REDRIVE, Resolution.INFRA_REDRIVE, cause.reason)


def was_oom_redrive(previous: Resolution | str | None) -> bool:
    """How "re-driven once" is counted, durably (never in memory): a try is the one re-drive of an OOM kill when
    the latest earlier try of its logical TI in the ledger (``LedgerStore.previous_try``, its highest epoch)
    closed with ``previous`` = :attr:`Resolution.OOM_REDRIVE`. So an OOM kill is re-driven, an OOM kill of that
    re-driven try fails the task, and a user retry after that failure (its previous try closed
    ``executor_failed``) is again entitled to one re-drive, within the infra budget, which bounds them all."""
    return previous is not None and str(previous) == Resolution.OOM_REDRIVE.value


def outcome_summary(record: OutcomeRecord | None) -> str:
    """A short text for logs: ``"success"``, ``"failed (heartbeat_lost)"`` or ``"no record"``."""
    if record is None:
        return "no record"
    text = record.state or str(record.outcome)
    if record.outcome == Outcome.FAILED and record.reason:
        text += f" ({record.reason})"
    return text
