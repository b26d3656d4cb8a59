"""bench.compare's CPU window: which processes keep a run's window open (issue 11's machine-CPU bar).

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
