"""Issue 2 acceptance: unchanged DAGs end the same under LeoflowExecutor as under LocalExecutor.

One real Airflow (SQLite, scheduler + dag-processor + api-server) per executor; every bundled DAG (ours in
``dags/`` and the chosen Airflow examples) is triggered at once. The reference is LocalExecutor: each
executor must reach the states in ``devtools/expected.py``, and the two must agree run by run, task by task,
and on the callback trace lines (``dag_id task_id try_number kind``).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest

from devtools import expected
from devtools.demo import DEMO_PARALLELISM
from devtools.runs import RunResult, run_all

pytestmark = pytest.mark.airflow

LOCAL = "LocalExecutor"
LEOFLOW = "leoflow_airflow.executor.LeoflowExecutor"
RUN_TIMEOUT_SECONDS = 600.0


@dataclass(frozen=True)
class Outcome:
    """What one executor did with the whole DAG set: ``{dag_id: RunResult}`` and the sorted trace lines."""

    executor: str
    runs: dict[str, RunResult]
    traces: list[str]


def _require_importable(executor: str) -> None:
    """Fail fast (ImportError) when a dotted executor class path cannot be imported in this interpreter."""
    path = executor.split(":")[-1]
    if "." not in path:
        return  # one of Airflow's own executor names
    module, _, name = path.rpartition(".")
    getattr(importlib.import_module(module), name)


@pytest.fixture(scope="module")
def outcome_of(airflow_stack_factory) -> Iterator[Callable[[str], Outcome]]:
    """``outcome_of(executor) -> Outcome``: runs the DAG set once per executor string (cached per module).

    A failure is cached too and raised again, so a broken executor costs one stack, not one per test.
    """
    cache: dict[str, Outcome] = {}
    failures: dict[str, BaseException] = {}

    def get(executor: str) -> Outcome:
        if executor in failures:
            raise failures[executor]
        if executor not in cache:
            try:
                cache[executor] = _run(executor)
            except Exception as exc:
                failures[executor] = exc
                raise
        return cache[executor]

    def _run(executor: str) -> Outcome:
        _require_importable(executor)
        name = "local" if executor == LOCAL else "leoflow"
        stack = airflow_stack_factory(
            name,
            executor=executor,
            parallelism=DEMO_PARALLELISM,
            example_dags=expected.EXAMPLE_FILES,
        )
        try:
            stack.migrate()
            stack.start(wait_for_dags=list(expected.EXPECTED), scheduler=False)
            runs = run_all(stack, list(expected.EXPECTED), timeout=RUN_TIMEOUT_SECONDS, start_scheduler=True)
            outcome = Outcome(executor, runs, stack.traces())
        finally:
            left = stack.stop()
        assert not left, f"processes left after stopping the {name} stack: {left}"
        return outcome

    yield get


def _problems(outcome: Outcome) -> dict[str, list[str]]:
    found = {}
    for dag_id in expected.EXPECTED:
        result = outcome.runs[dag_id]
        problems = expected.mismatches(dag_id, result.state, result.tasks)
        if problems:
            found[dag_id] = problems
    return found


@pytest.mark.parametrize("executor", [LOCAL, LEOFLOW], ids=["local", "leoflow"])
def test_every_dag_run_ends_as_expected(outcome_of, executor: str) -> None:
    """Each bundled DAG run ends in its expected run state with every task in its expected state."""
    outcome = outcome_of(executor)
    assert _problems(outcome) == {}
    assert outcome.traces == list(expected.EXPECTED_TRACES)


def test_leoflow_matches_local_executor(outcome_of) -> None:
    """Same DAG-run states, same per-task states and the same callback traces as LocalExecutor."""
    local = outcome_of(LOCAL)
    leoflow = outcome_of(LEOFLOW)
    assert {d: r.state for d, r in leoflow.runs.items()} == {d: r.state for d, r in local.runs.items()}
    for dag_id in expected.EXPECTED:
        assert leoflow.runs[dag_id].tasks == local.runs[dag_id].tasks, dag_id
    assert leoflow.traces == local.traces
