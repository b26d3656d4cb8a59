"""Trigger every bundled DAG once on a running stack, wait for all runs, collect what a user would see."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from devtools.stack import AirflowStack


@dataclass(frozen=True)
class RunResult:
    """One DAG run's outcome: final ``state``, ``{task key: state}`` and ``wall_seconds`` (start to end)."""

    dag_id: str
    run_id: str
    state: str
    tasks: dict[str, str]
    wall_seconds: float

    def counts(self) -> tuple[int, int]:
        """(tasks that ended ``success``, tasks that ended ``failed``)."""
        states = list(self.tasks.values())
        return states.count("success"), states.count("failed")


def _seconds(start: str | None, end: str | None) -> float:
    if not start or not end:
        return float("nan")
    return (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()


def run_all(stack: AirflowStack, dag_ids: list[str], *, timeout: float, start_scheduler: bool = False,
            before_unpause: Callable[[dict[str, str]], None] | None = None) -> dict[str, RunResult]:
    """Trigger every DAG in ``dag_ids`` while paused, then unpause them all, and wait for all runs to end.

    With ``start_scheduler`` (a stack started with ``start(scheduler=False)``) the scheduler starts only once
    every trigger and unpause is done: no public-API write then meets a task's open ``/run`` transaction, which
    on SQLite stalls the api-server for the 30 s busy timeout and can fail the scheduler's own ledger write
    (``database is locked``; seen by a new user's ``make demo`` on a loaded host). Without it the writes are at
    least ordered so the triggers do not compete with the first tasks.

    ``before_unpause(runs)``, given ``{dag_id: run_id}``, is called after every trigger and before any unpause
    (a test waits there for what the queued runs start, e.g. their warm pools); on a stack whose DAGs are
    unpaused at creation, pause them first or their runs start at once.

    Returns ``{dag_id: RunResult}``. Raises ``TimeoutError`` when some run has not ended after ``timeout``
    seconds, and ``devtools.stack.StackError`` when the API refuses a call.
    """
    runs = {}
    for dag_id in dag_ids:
        runs[dag_id] = stack.trigger(dag_id)
    if before_unpause is not None:
        before_unpause(dict(runs))
    for dag_id in dag_ids:
        stack.unpause(dag_id)
    if start_scheduler:
        stack.start_scheduler()
    deadline = time.monotonic() + timeout
    states = stack.wait_for_runs(runs, timeout=max(1.0, deadline - time.monotonic()))
    results = {}
    for dag_id, run_id in runs.items():
        run = stack.run(dag_id, run_id)
        results[dag_id] = RunResult(
            dag_id=dag_id,
            run_id=run_id,
            state=states[dag_id],
            tasks=stack.task_states(dag_id, run_id),
            wall_seconds=_seconds(run.get("start_date"), run.get("end_date")),
        )
    return results
