"""What the lifecycle asks of Airflow (DESIGN §3): values the executor alone performs, so the lifecycle can be
tested by reading its output. Pure module."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["ChangeState", "Fail", "Occupy", "Release", "Reoffer", "SchedulerAction", "SendCallback", "Succeed",
           "TaskEvent"]


@dataclass(frozen=True, slots=True)
class Fail:
    """``executor.fail(key, reason)``, after ``running.discard(key)``: Airflow's killed-externally path.

    ``log_path``: the workload's relative task-log path when the attempt never started (its launch was
    refused), so the reason is also written where the UI's Logs tab looks (:mod:`leoflow_airflow.task_log`);
    None otherwise.
    """

    key: Any
    reason: str
    log_path: str | None = None


@dataclass(frozen=True, slots=True)
class Succeed:
    """``executor.success(key)``: a RESTARTING TI is re-run by Airflow at once."""

    key: Any


@dataclass(frozen=True, slots=True)
class Reoffer:
    """Put ``workload`` back into ``queued_tasks`` (``callback``: ``queued_callbacks``) under ``key``; the
    next ``trigger_tasks`` dispatches it through the normal path. Idempotent per key."""

    key: Any
    workload: Any
    callback: bool = False


@dataclass(frozen=True, slots=True)
class Occupy:
    """``running.add(key)``: a TaskInstanceKey/CallbackKey, or an AttemptRef for an attempt still alive
    whose key no longer owns the slot."""

    key: Any


@dataclass(frozen=True, slots=True)
class Release:
    """``running.discard(key)``."""

    key: Any


@dataclass(frozen=True, slots=True)
class SendCallback:
    """``executor.send_callback(request)`` (a retry callback for a replayed ``up_for_retry``)."""

    request: Any


@dataclass(frozen=True, slots=True)
class ChangeState:
    """``executor.change_state(key, state)``: a callback workload's result."""

    key: Any
    state: Any


@dataclass(frozen=True, slots=True)
class TaskEvent:
    """A Log row an operator sees (``event``, ``extra``) on the TI of ``key``; the executor writes it itself
    (``LeoflowExecutor._task_event``: Airflow's ``log_task_event`` rows are lost on 3.3.2)."""

    key: Any
    event: str
    extra: str


SchedulerAction = Fail | Succeed | Reoffer | Occupy | Release | SendCallback | ChangeState | TaskEvent
