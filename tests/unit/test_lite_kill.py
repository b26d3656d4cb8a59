"""``LiteRuntime.kill`` with a grace, on real processes (issue 8 hole 16): an agent no zygote of ours owns (a
predecessor's, adopted) gets SIGTERM and SIGCONT at once, without the call waiting out the grace; the attempt
stays LIVE while anything of it runs; ``poll`` SIGKILLs what is left once the grace is over. The zygote is never
started here (``poll`` must not start one either)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa

from leoflow_agent import proc
from leoflow_agent.protocol import kill_marker_path
from leoflow_airflow import settings as leoflow_settings
from leoflow_airflow.ledger.models import metadata
from leoflow_airflow.ledger.states import AttemptState
from leoflow_airflow.ledger.store import LedgerStore
from leoflow_airflow.lifecycle.runtime import Presence, launch_id
from leoflow_airflow.runtime.lite import LiteRuntime

GRACE = 1.5


@pytest.fixture
def lite(tmp_path):
    """A ledger and a Lite runtime whose zygote is never started."""
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'ledger.db'}")
    metadata.create_all(engine)
    settings = leoflow_settings.load(get=lambda s, k, f: {"runtime_dir": str(tmp_path / "rt")}.get(k, f))
    runtime = LiteRuntime(settings, parallelism=2, mint=lambda w, t: "{}", server=lambda: "http://x/")
    yield LedgerStore(engine), runtime
    engine.dispose()


def _adopted(ledger: LedgerStore, runtime: LiteRuntime, agent: subprocess.Popen):
    """A DISPATCHED attempt whose agent is ``agent``, adopted by ``runtime`` (a predecessor's)."""
    attempt = ledger.claim_epoch(ti_id=str(uuid.uuid4()), try_number=1, dag_id="d", task_id="t", run_id="r",
                                 map_index=-1, runtime="lite", workload_json="{}", scheduler_job_id=1,
                                 record_path_for=lambda epoch: runtime.record_path("x", epoch))
    ledger.transition(attempt.ref, expected=[AttemptState.CLAIMED], to=AttemptState.DISPATCHED, pid=agent.pid,
                      proc_start_time=proc.start_time(agent.pid))
    attempt = ledger.get(attempt.ref)
    runtime.adopt(attempt)
    return attempt


def _agent(script: str, tmp_path: Path, **env: str) -> subprocess.Popen:
    """A stand-in agent running ``script``; it prints "ready" once its handlers are installed."""
    agent = subprocess.Popen([sys.executable, "-c", textwrap.dedent(script)], stdout=subprocess.PIPE, text=True,
                             cwd=tmp_path, env={**os.environ, **env})
    assert agent.stdout.readline().strip() == "ready", agent.poll()
    return agent


def _wait(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_a_stopped_adopted_agent_gets_its_sigterm_and_is_sigkilled_after_the_grace(lite, tmp_path):
    """The agent (standing in for a hung supervisor: SIGSTOPped) catches SIGTERM as the Task SDK supervisor's
    forwarder does, records it (its task's on_kill) and carries on, as does its child. ``kill`` returns LIVE at
    once; nothing is SIGKILLed before the grace is over; ``poll`` then kills agent and child: GONE."""
    ledger, runtime = lite
    agent = _agent("""
        import signal, subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, "
                                  "signal.SIG_IGN); time.sleep(120)"])
        signal.signal(signal.SIGTERM, lambda *_: open("on_kill", "w").write("on_kill"))
        print("ready", flush=True)
        while True:
            time.sleep(0.05)
    """, tmp_path)
    try:
        attempt = _adopted(ledger, runtime, agent)
        ident = proc.ProcessIdentity(attempt.pid, attempt.proc_start_time)
        (child,) = [proc.identity(p) for p in proc.descendants(agent.pid)]
        os.kill(agent.pid, signal.SIGSTOP)
        started = time.monotonic()
        assert runtime.kill(attempt, grace=GRACE) == Presence.LIVE
        assert time.monotonic() - started < 0.5, "kill waited on the grace"
        assert os.path.exists(kill_marker_path(attempt.record_path))  # written before the signal: the agent reads it
        _wait(lambda: (tmp_path / "on_kill").exists(), 10, "the agent's SIGTERM handler (SIGCONT woke it)")
        assert runtime.kill(attempt, grace=GRACE) == Presence.LIVE  # a repeated kill keeps the first deadline
        while time.monotonic() - started < GRACE - 0.3:  # inside the grace: nothing is SIGKILLed
            runtime.poll()
            assert runtime.observe([attempt]) == {attempt.ref: Presence.LIVE}
            time.sleep(0.05)
        assert proc.is_alive(ident) and proc.is_alive(child)

        def gone() -> bool:
            runtime.poll()
            return runtime.observe([attempt]) == {attempt.ref: Presence.GONE}

        _wait(gone, 10, "the escalation once the grace is over")
        assert time.monotonic() - started >= GRACE
        assert agent.wait(timeout=5) == -signal.SIGKILL
        assert not proc.is_alive(child)
        assert runtime.zygote.pid is None  # poll never started a zygote for this runtime
    finally:
        if agent.poll() is None:
            agent.kill()
        agent.wait()


def test_the_task_left_by_an_agent_that_exited_at_its_sigterm_keeps_its_grace(lite, tmp_path):
    """The agent exits at once on SIGTERM; its task process (a session of its own, found by its attempt
    marker) ignores it and runs on. The attempt stays LIVE, its task untouched, until the grace is over; then
    the task is killed and the attempt is GONE."""
    ledger, runtime = lite
    # the attempt, and so its launch id (the task's ``LEOFLOW_ATTEMPT`` marker), exists before its agent
    claimed = ledger.claim_epoch(ti_id=str(uuid.uuid4()), try_number=1, dag_id="d", task_id="t", run_id="r",
                                 map_index=-1, runtime="lite", workload_json="{}", scheduler_job_id=1,
                                 record_path_for=lambda epoch: runtime.record_path("y", epoch))
    agent = _agent("""
        import os, signal, subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", "import os, signal, time; os.setsid(); "
                                  "signal.signal(signal.SIGTERM, signal.SIG_IGN); print('in', flush=True); "
                                  "time.sleep(120)"], stdout=subprocess.PIPE, text=True)
        assert child.stdout.readline().strip() == "in"
        print("ready", flush=True)
        time.sleep(120)
    """, tmp_path, LEOFLOW_ATTEMPT=launch_id(claimed.ref))
    task = None
    try:
        ledger.transition(claimed.ref, expected=[AttemptState.CLAIMED], to=AttemptState.DISPATCHED,
                          pid=agent.pid, proc_start_time=proc.start_time(agent.pid))
        attempt = ledger.get(claimed.ref)
        runtime.adopt(attempt)
        (task,) = [proc.identity(p) for p in proc.descendants(agent.pid)]
        started = time.monotonic()
        assert runtime.kill(attempt, grace=GRACE) == Presence.LIVE
        assert agent.wait(timeout=5) == -signal.SIGTERM
        while time.monotonic() - started < GRACE - 0.3:
            runtime.poll()
            assert runtime.observe([attempt]) == {attempt.ref: Presence.LIVE}
            assert proc.is_alive(task)
            time.sleep(0.05)

        def gone() -> bool:
            runtime.poll()
            return runtime.observe([attempt]) == {attempt.ref: Presence.GONE}

        _wait(gone, 10, "the task to be killed once the grace is over")
        assert time.monotonic() - started >= GRACE
        assert not proc.is_alive(task)
    finally:
        if agent.poll() is None:
            agent.kill()
        agent.wait()
        if task is not None and proc.is_alive(task):
            os.kill(task.pid, signal.SIGKILL)


def test_an_immediate_kill_leaves_nothing_when_it_returns(lite, tmp_path):
    """Grace 0 (revoke, a launch that must not run): SIGKILL of the subtree, GONE on return, no marker."""
    ledger, runtime = lite
    agent = _agent("""
        import signal, subprocess, sys, time
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print("ready", flush=True)
        time.sleep(120)
    """, tmp_path)
    try:
        attempt = _adopted(ledger, runtime, agent)
        (child,) = [proc.identity(p) for p in proc.descendants(agent.pid)]
        assert runtime.kill(attempt, grace=0) == Presence.GONE
        assert agent.wait(timeout=5) == -signal.SIGKILL and not proc.is_alive(child)
        assert not os.path.exists(kill_marker_path(attempt.record_path))
    finally:
        if agent.poll() is None:
            agent.kill()
        agent.wait()
