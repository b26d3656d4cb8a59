"""``LiteRuntime``'s answer at the seam for a CLAIMED attempt without a pid (hole 1), on real processes: its
agent is looked up by its process-title marker, never presumed dead. The zygote is never started here, and
observing a CLAIMED attempt never signals a process."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
import uuid

import pytest
import sqlalchemy as sa

from leoflow_agent import proc
from leoflow_agent.protocol import agent_title_marker
from leoflow_airflow import settings as leoflow_settings
from leoflow_airflow.ledger.models import metadata
from leoflow_airflow.ledger.store import LedgerStore
from leoflow_airflow.lifecycle.runtime import Presence, launch_id
from leoflow_airflow.runtime.lite import LiteRuntime


@pytest.fixture
def claimed(tmp_path):
    """A CLAIMED ledger row (no pid) and a Lite runtime that never launched it."""
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'ledger.db'}")
    metadata.create_all(engine)
    attempt = LedgerStore(engine).claim_epoch(ti_id=str(uuid.uuid4()), try_number=1, dag_id="d", task_id="t",
                                              run_id="r", map_index=-1, runtime="lite", workload_json="{}",
                                              scheduler_job_id=1)
    settings = leoflow_settings.load(get=lambda s, k, f: {"runtime_dir": str(tmp_path / "rt")}.get(k, f))
    yield attempt, LiteRuntime(settings, parallelism=2, mint=lambda w, t: "{}", server=lambda: "http://x/")
    engine.dispose()


def test_claimed_attempt_whose_agent_runs_is_live_and_located(claimed):
    attempt, runtime = claimed
    title = agent_title_marker(launch_id(attempt.ref))
    agent = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import time
        from setproctitle import setproctitle
        setproctitle({title!r})
        time.sleep(60)
    """)])
    try:
        deadline = time.monotonic() + 10
        while proc.find_by_title(title) != [agent.pid] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert runtime.observe([attempt]) == {attempt.ref: Presence.LIVE}
        assert runtime.locate(attempt) == {"pid": agent.pid, "proc_start_time": proc.start_time(agent.pid)}
        assert agent.poll() is None  # looked at, never signalled
    finally:
        agent.kill()
        agent.wait()


def test_claimed_attempt_with_no_agent_is_gone(claimed):
    attempt, runtime = claimed
    assert runtime.locate(attempt) is None
    assert runtime.observe([attempt]) == {attempt.ref: Presence.GONE}


def test_claimed_attempt_whose_task_outlived_its_agent_is_killed_before_it_is_gone(claimed):
    """A scheduler SIGKILLed right after the fork takes the zygote with it; the agent dies (a fault), but its
    task child runs on in the attempt's cgroup with no agent and no title marker. Observing the CLAIMED row
    kills what the cgroup holds before it answers GONE, so no new try can run beside that body (the chaos
    loop's double run in CI)."""
    attempt, runtime = claimed
    hierarchy = proc.probe_cgroup()
    if hierarchy is None:
        pytest.skip("this host allows no attempt cgroup")
    lid = launch_id(attempt.ref)
    body = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import os, sys, time
        from leoflow_agent import proc
        if proc.join_attempt_cgroup(proc.CgroupHierarchy(**{hierarchy.__dict__!r}), {lid!r}) is None:
            sys.exit(3)
        os.setsid()
        print("in", flush=True)
        time.sleep(60)
    """)], stdout=subprocess.PIPE, text=True)
    try:
        assert body.stdout.readline().strip() == "in", body.poll()
        assert runtime.observe([attempt]) == {attempt.ref: Presence.GONE}
        assert body.wait(timeout=10) == -9
        assert proc.attempt_cgroups(lid) == []
    finally:
        if body.poll() is None:
            body.kill()
        body.wait()
