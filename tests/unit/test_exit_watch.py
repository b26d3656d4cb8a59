"""Once an attempt's terminal state is reported, its agent has the Task SDK supervisor look for the task
process's exit every 50 ms instead of sleeping up to ``[workers] min_heartbeat_interval`` (5 s) with nothing to
wait on: the agent (a Lite slot's process, a task pod) ends right after its task instead of 5 s later in about
half the attempts (``leoflow_agent.runner.ExitWatch``)."""

from __future__ import annotations

import types

import pytest

from leoflow_agent.runner import EXIT_POLL_INTERVAL, ExitWatch


def test_the_real_supervisor_has_the_interval_it_waits_on_and_it_is_lowered_then_put_back() -> None:
    """Against Airflow's own module: fails if an upgrade renames the value the supervisor waits on."""
    from airflow.sdk.execution_time import supervisor

    before = supervisor.MIN_HEARTBEAT_INTERVAL
    assert before > EXIT_POLL_INTERVAL, before
    watch = ExitWatch(supervisor)
    try:
        assert watch.closely() is True
        assert supervisor.MIN_HEARTBEAT_INTERVAL == EXIT_POLL_INTERVAL
    finally:
        watch.restore()
    assert supervisor.MIN_HEARTBEAT_INTERVAL == before


def test_the_supervisor_reads_the_interval_at_every_wait() -> None:
    """The lowered value only helps if ``_monitor_subprocess`` reads the module's value each time round, not a
    copy taken earlier: its code names the global."""
    from airflow.sdk.execution_time.supervisor import ActivitySubprocess

    code = ActivitySubprocess._monitor_subprocess.__code__
    assert "MIN_HEARTBEAT_INTERVAL" in code.co_names, code.co_names


@pytest.mark.parametrize("value", [0.01, EXIT_POLL_INTERVAL])
def test_a_shorter_interval_is_never_raised(value: float) -> None:
    module = types.SimpleNamespace(MIN_HEARTBEAT_INTERVAL=value)
    watch = ExitWatch(module)
    assert watch.closely() is False
    assert module.MIN_HEARTBEAT_INTERVAL == value
    watch.restore()
    assert module.MIN_HEARTBEAT_INTERVAL == value


@pytest.mark.parametrize("module", [types.SimpleNamespace(), types.SimpleNamespace(MIN_HEARTBEAT_INTERVAL="5"),
                                    types.SimpleNamespace(MIN_HEARTBEAT_INTERVAL=True)],
                         ids=["missing", "a string", "a bool"])
def test_without_a_numeric_interval_nothing_changes(module: types.SimpleNamespace) -> None:
    before = dict(vars(module))
    watch = ExitWatch(module)
    assert watch.closely() is False
    watch.restore()
    assert vars(module) == before
