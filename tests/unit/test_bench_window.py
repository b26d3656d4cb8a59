"""bench.compare: which processes keep a run's CPU window open, and how a run's user wall is split (issue 11).

Until 2026-12-03 the window stayed open until the scheduler's tree was back to its size before the run, so
leoflow's Lite file workers (which live on after a run by design) held every leoflow run's window open for the
full 20 s and billed the stack's idle CPU of that wait to its tasks. These titles are the real ones: Airflow's
LocalExecutor prefix, leoflow's file worker and agent titles, and the zygote's command line.
"""

from __future__ import annotations

import sys

from airflow.executors.local_executor import _get_executor_process_title_prefix

from bench.compare import is_idle_pool_title
from leoflow_agent.protocol import agent_title_marker
from leoflow_agent.warm import FileKey

LOCAL_PREFIX = _get_executor_process_title_prefix(None)


def test_idle_pool_processes_do_not_hold_the_window_open() -> None:
    assert is_idle_pool_title(f"{LOCAL_PREFIX} <idle>")
    assert is_idle_pool_title(FileKey("dags-folder", None, "bench_chain.py").title())
    assert is_idle_pool_title(f"{sys.executable} -m leoflow_agent serve --socket /tmp/x/zygote.sock ")


def test_attempt_processes_hold_the_window_open() -> None:
    assert not is_idle_pool_title(f"{LOCAL_PREFIX} bench_chain.link_03 run_id=manual__x try=1")  # a busy worker
    assert not is_idle_pool_title(f"{agent_title_marker('01a23dd8:1:1')} bench_chain.link_03 map_index=-1")
    assert not is_idle_pool_title("airflow worker -- 01a23dd8-43cb-7ed1-8d1c-61aa3b03714e")  # a task process
    assert not is_idle_pool_title(f"{sys.executable} -m airflow scheduler")


def _at(seconds: float):
    from datetime import datetime, timedelta, timezone

    return datetime(2026, 12, 6, 16, 0, tzinfo=timezone.utc) + timedelta(seconds=seconds)


def test_a_run_s_user_wall_splits_into_the_wait_to_start_its_ends_its_tasks_and_the_link_cycle() -> None:
    from bench.compare import phases

    # trigger at 0, run starts at 0.8 (the scheduler's sleep), links queued at 1.0, 2.1, 3.3, each ending 0.2 s
    # later, run ends at 3.9
    tis = [(_at(1.0), _at(1.2)), (_at(2.1), _at(2.3)), (_at(3.3), _at(3.5))]
    got = phases(_at(0), _at(0.8), _at(3.9), tis)
    assert round(got["to_start"], 6) == 0.8
    assert round(got["edges"], 6) == 0.6  # 0.2 from the start to link 0 queued, 0.4 from its end to the run end
    assert round(got["tasks"], 6) == 2.5
    assert round(got["link_cycle"], 6) == 1.15  # the median of 1.1 and 1.2
    assert round(got["to_start"] + got["edges"] + got["tasks"], 6) == 3.9  # the user wall, whole


def test_missing_timestamps_give_nan_not_an_error() -> None:
    from bench.compare import phases

    got = phases(_at(0), None, None, [(None, None)])
    assert all(v != v for v in got.values())  # nan
