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
