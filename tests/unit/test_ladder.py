"""The resilience ladder (DESIGN §2 "The recovery window", §3): the hard rung refuses to start with one
message naming keys and values; soft rungs are warnings. Pure: values in, report out."""

from __future__ import annotations

from dataclasses import replace

import pytest

from leoflow_airflow import ladder, settings
from leoflow_airflow.errors import LadderViolation

# Airflow 3.3.2 defaults + leoflow defaults
DEFAULTS = ladder.LadderValues(
    task_success_overtime=20, min_heartbeat_interval=5, socket_cleanup_timeout=60,
    task_instance_heartbeat_timeout=300, task_queued_timeout=600, max_failed_heartbeats=3,
    agent_lost_threshold=120, maintenance_interval=5, settle_timeout=10,
)
LOWER = 20 + 5 + 60          # 85
UPPER = 300 - 2 * 5 - 10     # 280


def test_defaults_pass_cleanly():
    """Airflow's and leoflow's defaults break no rung."""
    report = ladder.evaluate(DEFAULTS)
    assert report.violations == ()
    assert report.warnings == ()


def test_heartbeat_timeout_60_is_refused_with_keys_and_values():
    """``[scheduler] task_instance_heartbeat_timeout = 60`` breaks the recovery window; the message names it."""
    report = ladder.evaluate(replace(DEFAULTS, task_instance_heartbeat_timeout=60))
    assert [r.rung for r in report.violations] == ["recovery_window"]
    rung = report.violations[0]
    assert "[scheduler] task_instance_heartbeat_timeout = 60" in rung.message
    for text in ("[core] task_success_overtime (20)", "[workers] min_heartbeat_interval (5)",
                 "[workers] socket_cleanup_timeout (60)", "[leoflow] maintenance_interval (5)",
                 "[leoflow] settle_timeout (10)", "= 105 s"):
        assert text in rung.message
    assert rung.values["scheduler.task_instance_heartbeat_timeout"] == 60
    with pytest.raises(LadderViolation, match="leoflow refuses to start: .*task_instance_heartbeat_timeout = 60"):
        ladder.enforce(report, lambda r: None)


@pytest.mark.parametrize(
    ("threshold", "ok"),
    [(LOWER - 1, False), (LOWER, False), (LOWER + 0.5, True), (120, True), (UPPER - 0.5, True),
     (UPPER, False), (UPPER + 1, False)],
)
def test_agent_lost_threshold_must_lie_strictly_inside_the_window(threshold, ok):
    """The window is open at both ends: lower < agent_lost_threshold < upper."""
    report = ladder.evaluate(replace(DEFAULTS, agent_lost_threshold=threshold))
    if ok:
        assert report.violations == ()
    else:
        assert [r.rung for r in report.violations] == ["agent_lost_threshold"]
        msg = report.violations[0].message
        assert f"[leoflow] agent_lost_threshold = {threshold:g}" in msg
        assert f"between {LOWER:g}" in msg and f"and {UPPER:g}" in msg


def test_window_boundary_lower_equal_upper_is_refused():
    """When the window is empty (lower == upper) the hard rung fires even before the threshold is looked at."""
    # upper = hb - 20 == 85  => hb = 105
    report = ladder.evaluate(replace(DEFAULTS, task_instance_heartbeat_timeout=105))
    assert [r.rung for r in report.violations] == ["recovery_window"]
    report = ladder.evaluate(replace(DEFAULTS, task_instance_heartbeat_timeout=106, agent_lost_threshold=85.5))
    assert report.violations == ()


def test_soft_rungs_warn_and_do_not_refuse():
    """Heartbeat-failure budget and a queued timeout under the dispatch-lost threshold are warnings."""
    values = replace(DEFAULTS, max_failed_heartbeats=100, task_queued_timeout=40)
    report = ladder.evaluate(values)
    assert report.violations == ()
    assert {r.rung for r in report.warnings} == {"heartbeat_failure_budget", "dispatch_lost_threshold"}
    seen: list[ladder.Rung] = []
    ladder.enforce(report, seen.append)
    assert seen == list(report.warnings)
    queued = next(r for r in report.warnings if r.rung == "dispatch_lost_threshold")
    assert queued.values == {"leoflow.dispatch_lost_threshold": 120.0, "scheduler.task_queued_timeout": 40}


@pytest.mark.parametrize(("settle_timeout", "threshold", "warned"),
                         [(10, 30, False), (14.9, 30, False), (15, 30, True), (10, 10, True), (3, 10, False)])
def test_settle_timeout_against_the_scheduler_health_check(settle_timeout, threshold, warned):
    """Issue 8 hole 11: a sync() may wait one settle timeout on a hanging replay, and Airflow's health check
    reads a heartbeat one scheduler loop old; at 2 x settle_timeout >= the threshold that is a warning."""
    report = ladder.evaluate(replace(DEFAULTS, settle_timeout=settle_timeout,
                                     scheduler_health_check_threshold=threshold))
    assert report.violations == ()
    rungs = [r for r in report.warnings if r.rung == "scheduler_health_check_threshold"]
    assert bool(rungs) == warned
    if warned:
        assert rungs[0].values == {"leoflow.settle_timeout": settle_timeout,
                                   "scheduler.scheduler_health_check_threshold": threshold}
        assert "[leoflow] settle_timeout" in rungs[0].message


def test_warnings_are_passed_even_when_refusing():
    """``enforce`` reports every soft rung before raising for a hard one."""
    report = ladder.evaluate(replace(DEFAULTS, task_instance_heartbeat_timeout=60, task_queued_timeout=10))
    seen: list[ladder.Rung] = []
    with pytest.raises(LadderViolation):
        ladder.enforce(report, seen.append)
    assert [r.rung for r in seen] == ["dispatch_lost_threshold"]


def test_read_values_takes_airflow_keys_and_leoflow_settings():
    """``read_values`` reads each Airflow key from its section (with Airflow's default as fallback)."""
    asked: list[tuple[str, str]] = []

    def getfloat(section: str, key: str, fallback: float) -> float:
        asked.append((section, key))
        return 60.0 if (section, key) == ("scheduler", "task_instance_heartbeat_timeout") else fallback

    s = settings.load(lambda sec, key, fb: {"agent_lost_threshold": "100", "settle_timeout": "3"}.get(key, fb))
    values = ladder.read_values(s, getfloat)
    assert set(asked) == {(sec, key) for sec, key, _ in ladder.AIRFLOW_KEYS.values()}
    assert values.task_instance_heartbeat_timeout == 60
    assert values.socket_cleanup_timeout == 60
    assert (values.agent_lost_threshold, values.settle_timeout, values.maintenance_interval) == (100, 3, 5)


@pytest.mark.parametrize(("threshold", "grace"), [(120, 60), (UPPER - 60, 60), (UPPER - 20, 20), (UPPER - 0.5, 0.5)])
def test_the_agent_lost_kill_grace_ends_inside_the_recovery_window(threshold, grace):
    """Issue 8 hole 16: the reaper's kill gives the task ``[core] killed_task_cleanup_time`` (60) for its
    on_kill, shortened so that ``agent_lost_threshold + grace`` never passes the window's upper bound (past it,
    Airflow's purge may fail the TI and spend a user retry first); shortened, it is a soft rung."""
    values = replace(DEFAULTS, agent_lost_threshold=threshold)
    assert ladder.reap_kill_grace(values) == grace
    report = ladder.evaluate(values)
    rungs = [r for r in report.warnings if r.rung == "kill_grace"]
    if grace < 60:
        (rung,) = rungs
        assert f"gives a killed task {grace:g} s" in rung.message and rung.values["core.killed_task_cleanup_time"] == 60
    else:
        assert rungs == []


def test_a_shorter_killed_task_cleanup_time_is_kept():
    assert ladder.reap_kill_grace(replace(DEFAULTS, killed_task_cleanup_time=5)) == 5


@pytest.mark.parametrize("valve, threshold, warned", [
    (60, 120, False),   # 120 + 60 (kill grace) + 60 + 5 = 245 < 280: re-driven before the purge
    (94, 120, False),   # 279: just in time
    (95, 120, True),    # 280: the purge may fail the task first
    (0, 120, True),     # 0 waits for ever: the purge fails a task whose node is unreachable
    (None, 120, False),  # Lite: not checked
])
def test_the_termination_valve_must_open_before_the_purge(valve, threshold, warned):
    values = replace(DEFAULTS, pod_termination_valve=valve, agent_lost_threshold=threshold)
    rungs = [w.rung for w in ladder.evaluate(values).warnings]
    assert ("pod_termination_valve" in rungs) is warned, rungs


@pytest.mark.parametrize("threshold, warned", [
    (240, False),   # the default: inside the window
    (279, False),
    (280, True),    # at the window's upper bound: a late sweep may meet the purge
    (300, True),    # not below the purge: still only a warning
    (600, True),
])
def test_orphan_run_threshold_past_the_window_warns_and_never_refuses(threshold, warned):
    """``[leoflow] orphan_run_threshold`` not below the recovery window's upper bound (Airflow's purge may fail an
    orphan first, spending a user retry) is a warning naming the keys, never a refusal: a deployment that lowered
    ``task_instance_heartbeat_timeout`` below the default threshold must still start (CI found the refusal:
    every test stack with a short purge timeout failed to start its scheduler)."""
    report = ladder.evaluate(replace(DEFAULTS, orphan_run_threshold=threshold))
    assert report.violations == ()
    assert [r.rung for r in report.warnings] == (["orphan_run_threshold"] if warned else [])
    for rung in report.warnings:
        assert f"[leoflow] orphan_run_threshold = {threshold:g}" in rung.message
        assert rung.values["scheduler.task_instance_heartbeat_timeout"] == 300
    ladder.enforce(report, lambda rung: None)  # does not raise


def test_read_values_checks_the_orphan_run_threshold():
    """The executor's ladder reads ``[leoflow] orphan_run_threshold`` (default 240 s, inside the window)."""
    values = ladder.read_values(settings.load(get=lambda s, k, f: f), getfloat=lambda s, k, f: f)
    assert values.orphan_run_threshold == 240
    assert ladder.evaluate(values).violations == ()


@pytest.mark.parametrize(("lease", "cleanup", "threshold", "refused"), [
    (45, 60, 120, False),   # the defaults: the pod has killed its task 105 s after its last answer
    (60, 60, 120, True),    # 120 s: the scheduler's re-run may start while the kill's grace still runs
    (70, 40, 120, False),
    (70, 40, 110, True),
])
def test_the_agents_lease_and_kill_end_before_the_scheduler_takes_silence_for_death(lease, cleanup, threshold,
                                                                                     refused):
    """k8s review §14: a task pod cut off from the API server kills its task ``agent_lease_seconds`` after its last
    answer, SIGKILL ``[core] killed_task_cleanup_time`` later; the scheduler re-runs it once the heartbeat is
    silent for ``agent_lost_threshold``. Refused unless the pod's end comes first, naming each key and value."""
    values = replace(DEFAULTS, agent_lease_seconds=lease, killed_task_cleanup_time=cleanup,
                     agent_lost_threshold=threshold)
    rungs = [r for r in ladder.evaluate(values).violations if r.rung == "agent_lease"]
    assert bool(rungs) is refused
    if refused:
        assert rungs[0].values == {"leoflow.agent_lease_seconds": lease, "core.killed_task_cleanup_time": cleanup,
                                   "leoflow.agent_lost_threshold": threshold}
        for text in (f"agent_lease_seconds ({lease:g})", f"killed_task_cleanup_time ({cleanup:g})",
                     f"agent_lost_threshold ({threshold:g})"):
            assert text in rungs[0].message


def test_only_kubernetes_reads_the_agents_lease():
    """Lite takes no lease (a pid proves a death there): its ladder never checks one."""
    lite = settings.load(lambda sec, key, fb: {"agent_lease_seconds": "500"}.get(key, fb))
    assert ladder.read_values(lite, lambda s, k, f: f).agent_lease_seconds is None
    conf = {"runtime": "kubernetes", "image": "img:1", "exchange_url": "http://x/leoflow", "agent_lease_seconds": "500"}
    kube = settings.load(lambda sec, key, fb: conf.get(key, fb))
    values = ladder.read_values(kube, lambda s, k, f: f)
    assert values.agent_lease_seconds == 500
    assert [r.rung for r in ladder.evaluate(values).violations] == ["agent_lease"]
