"""The Lite reapers' pure decisions, the settling gate, the infra budget rule and record GC."""

from __future__ import annotations

import os
import time
from datetime import datetime, timedelta, timezone

from leoflow_airflow.runtime.lite import gc
from leoflow_airflow.ledger.states import AttemptRef
from leoflow_airflow.reap.gate import SettlingGate
from leoflow_airflow.reap.lost import AttemptView, Presence, ReapSettings, decide
from leoflow_airflow.redrive import budget_decision

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=timezone.utc)
SETTINGS = ReapSettings(agent_lost_threshold=120, dispatch_lost_threshold=60)
REF = AttemptRef("01a226c6-736e-7f99-8b42-e24b62c2f224", 1, 1)


def view(presence=Presence.LIVE, state="running", hb_age=None, dispatched_age=None) -> AttemptView:
    return AttemptView(
        ref=REF,
        presence=presence,
        ti_state=state,
        last_heartbeat_at=None if hb_age is None else NOW - timedelta(seconds=hb_age),
        dispatched_at=None if dispatched_age is None else NOW - timedelta(seconds=dispatched_age),
    )


def test_agent_lost_kills_a_live_agent_whose_heartbeat_went_silent():
    [action] = decide([view(hb_age=121)], NOW, SETTINGS)
    assert (action.ref, action.reaper) == (REF, "agent-lost")
    assert "121 s" in action.why


def test_agent_lost_spares_fresh_heartbeats_and_dead_agents():
    assert decide([view(hb_age=119)], NOW, SETTINGS) == []
    assert decide([view(presence=Presence.GONE, hb_age=1000)], NOW, SETTINGS) == []
    assert decide([view(state="success", hb_age=119)], NOW, SETTINGS) == []


def test_moved_on_kills_a_live_agent_whose_task_was_marked_or_cleared_once_its_heartbeat_is_silent():
    """Mark success, mark failed and a clear while it runs: a healthy agent stops at the heartbeat's 409 and ends
    by itself; one that still lives past the threshold cannot reach the api-server (a partitioned node) or hangs,
    and is killed, so its pod is deleted with its grace instead of running on or showing Succeeded."""
    for state in ("success", "failed", "restarting", "up_for_retry", "skipped", "superseded"):
        [action] = decide([view(state=state, hb_age=121)], NOW, SETTINGS)
        assert (action.ref, action.reaper) == (REF, "moved-on") and state in action.why and "121 s" in action.why
        assert decide([view(state=state, hb_age=119)], NOW, SETTINGS) == []  # its callbacks may still run
        assert decide([view(presence=Presence.UNKNOWN, state=state, hb_age=1000)], NOW, SETTINGS) == []
    assert decide([view(state=None, hb_age=None)], NOW, SETTINGS) == []  # in neither table: nothing to go by
    assert decide([view(state="deferred", hb_age=1000)], NOW, SETTINGS) == []


def test_dispatch_lost_kills_an_agent_that_never_reached_run():
    [action] = decide([view(state="queued", dispatched_age=61)], NOW, SETTINGS)
    assert action.reaper == "dispatch-lost"
    assert decide([view(state="queued", dispatched_age=59)], NOW, SETTINGS) == []
    assert decide([view(state="queued", dispatched_age=None)], NOW, SETTINGS) == []


def test_gate_needs_a_sweep_and_the_grace_period():
    gate = SettlingGate(grace=30)
    gate.reset(100.0)
    assert not gate.is_open(200.0)  # no sweep yet
    gate.swept()
    assert not gate.is_open(120.0)
    assert gate.is_open(130.0)
    gate.reset(130.0)  # adoption closes it again
    assert not gate.is_open(500.0)


def test_infra_budget_counts_and_resets_when_a_clear_rewrote_max_tries():
    first = budget_decision(spent=None, seen_max_tries=None, max_tries=0, limit=2)
    assert first.allowed and first.spent == 1
    d = budget_decision(spent=1, seen_max_tries=1, max_tries=1, limit=2)
    assert d.allowed and d.spent == 2
    d = budget_decision(spent=2, seen_max_tries=2, max_tries=2, limit=2)
    assert not d.allowed
    d = budget_decision(spent=2, seen_max_tries=2, max_tries=5, limit=2)  # a user clear rewrote max_tries
    assert d.allowed and d.spent == 1
    assert not budget_decision(spent=None, seen_max_tries=None, max_tries=0, limit=0).allowed


def test_gc_removes_only_expired_closed_attempts(tmp_path):
    root = tmp_path
    old = root / "attempts" / "ti-a" / "1"
    young = root / "attempts" / "ti-b" / "1"
    still_open = root / "attempts" / "ti-c" / "2"
    for d in (old, young, still_open):
        d.mkdir(parents=True)
        (d / "record.json").write_text("{}")
    past = time.time() - 3600
    os.utime(old, (past, past))
    os.utime(still_open, (past, past))
    closed = {("ti-a", 1), ("ti-b", 1)}
    removed = gc.collect(str(root), retention=600, is_closed=lambda t, e: (t, e) in closed)
    assert removed == 1
    assert not old.exists() and not old.parent.exists()
    assert young.exists() and still_open.exists()
