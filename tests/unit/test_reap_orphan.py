"""The orphan-run reaper's pure decision (issue 10 item 1; :mod:`leoflow_airflow.reap.orphan`): a RUNNING task
instance of a running dag run, queued by this executor, with no open leoflow attempt and no activity past
``[leoflow] orphan_run_threshold`` is re-driven; anything else is left alone."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone

import pytest

from leoflow_airflow.reap.orphan import (
    Landed, OrphanSettings, OrphanView, Ownership, Restore, RunningTI, candidates, decide,
)

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)
OURS = Ownership(frozenset({"LeoflowExecutor", "leoflow_airflow.executor.LeoflowExecutor", "leo"}), default=True)
SETTINGS = OrphanSettings(threshold=240, owner=OURS)


def ago(seconds: float) -> datetime:
    return NOW - timedelta(seconds=seconds)


SILENT = RunningTI(ti_id="0199aaaa-0000-7000-8000-000000000001", dag_id="d", run_id="r", task_id="t", map_index=-1,
                   try_number=2, state="running", executor=None, run_state="running", queued_dttm=ago(400),
                   start_date=ago(390), last_heartbeat_at=ago(300), updated_at=ago(300), run_start_date=ago(900))


CASES = [
    ("no attempt and silent", SILENT, False, True),
    ("an attempt is open", SILENT, True, False),
    ("a recent heartbeat", replace(SILENT, last_heartbeat_at=ago(30)), False, False),
    ("a recent update", replace(SILENT, updated_at=ago(239)), False, False),
    ("just past the threshold", replace(SILENT, last_heartbeat_at=ago(241), updated_at=None), False, True),
    ("the dag run started recently", replace(SILENT, run_start_date=ago(10)), False, False),
    ("another executor's TI", replace(SILENT, executor="CeleryExecutor"), False, False),
    ("ours by alias", replace(SILENT, executor="leo"), False, True),
    ("ours by module path", replace(SILENT, executor="leoflow_airflow.executor.LeoflowExecutor"), False, True),
    ("queued: Airflow's stuck-in-queued owns it", replace(SILENT, state="queued"), False, False),
    ("a finished TI", replace(SILENT, state="success"), False, False),
    ("its dag run is not running", replace(SILENT, run_state="failed"), False, False),
    ("no time at all to judge by", replace(SILENT, queued_dttm=None, start_date=None, last_heartbeat_at=None,
                                           updated_at=None, run_start_date=None), False, False),
]


@pytest.mark.parametrize(("case", "ti", "open_attempt", "redriven"), CASES)
def test_decide(case, ti, open_attempt, redriven):
    actions = decide([OrphanView(ti, open_attempt)], NOW, SETTINGS)
    assert [a.ti_id for a in actions] == ([ti.ti_id] if redriven else []), case
    for action in actions:
        assert action.reaper == "orphan-run"
        assert "no open leoflow attempt" in action.why and "orphan_run_threshold 240 s" in action.why


@pytest.mark.parametrize(("case", "ti", "open_attempt", "redriven"), CASES)
def test_candidates_are_exactly_the_task_instances_decide_acts_on_when_no_attempt_is_open(case, ti, open_attempt,
                                                                                         redriven):
    """What the lifecycle asks the ledger about (issue 10, "Benchmark": a page of live task instances reads
    nothing): a task instance is a candidate exactly when it would be restored (its success had landed) or
    re-driven had it no open attempt."""
    landed = Landed(ti.try_number, 1, "success")
    would = decide([OrphanView(ti, False)], NOW, SETTINGS) != [] or \
        decide([OrphanView(ti, False, landed)], NOW, SETTINGS) != []
    assert (candidates([ti], NOW, SETTINGS) == [ti]) == would, case


def test_an_empty_executor_is_ours_only_when_we_are_the_default():
    """``TaskInstance.executor`` None means the default executor: ours only if leoflow is it."""
    not_default = OrphanSettings(240, replace(OURS, default=False))
    assert decide([OrphanView(SILENT, False)], NOW, not_default) == []
    assert decide([OrphanView(replace(SILENT, executor="LeoflowExecutor"), False)], NOW, not_default) != []


def test_the_reason_names_the_task_and_its_latest_activity():
    (action,) = decide([OrphanView(SILENT, False)], NOW, SETTINGS)
    assert "d.t (run r, map_index -1, try 2)" in action.why
    assert "no activity for 300 s" in action.why and "latest: last_heartbeat_at" in action.why


def test_order_is_kept_and_each_view_is_judged_alone():
    other = replace(SILENT, ti_id="0199aaaa-0000-7000-8000-000000000002")
    views = [OrphanView(other, False), OrphanView(SILENT, True), OrphanView(SILENT, False)]
    assert [a.ti_id for a in decide(views, NOW, SETTINGS)] == [other.ti_id, SILENT.ti_id]


LANDED = Landed(try_number=2, attempt_epoch=3, state="success", at=ago(60))


@pytest.mark.parametrize(("case", "view", "expected"), [
    ("its success had landed, silent past the grace", OrphanView(replace(SILENT, last_heartbeat_at=ago(31),
                                                                         updated_at=ago(31)), False, LANDED), "restore"),
    ("its success had landed, silent 300 s", OrphanView(SILENT, False, LANDED), "restore"),
    ("landed, not yet silent for the grace", OrphanView(replace(SILENT, last_heartbeat_at=ago(29), updated_at=None),
                                                        False, LANDED), None),
    ("landed, but an attempt is open again", OrphanView(SILENT, True, LANDED), None),
    ("a landed failure, silent past the grace: restored",
     OrphanView(replace(SILENT, last_heartbeat_at=ago(31), updated_at=None), False, replace(LANDED, state="failed")),
     "restore"),
    ("a landed skip, silent 300 s", OrphanView(SILENT, False, replace(LANDED, state="skipped")), "restore"),
    ("a landed removal, silent 300 s", OrphanView(SILENT, False, replace(LANDED, state="removed")), "restore"),
    ("a landed up_for_retry (the next try has a new ti_id): re-driven",
     OrphanView(SILENT, False, replace(LANDED, state="up_for_retry")), "redrive"),
    ("a landed deferral (a hand-off, not a report to restore): re-driven",
     OrphanView(SILENT, False, replace(LANDED, state="deferred")), "redrive"),
    ("a landed deferral, silent under the threshold",
     OrphanView(replace(SILENT, last_heartbeat_at=ago(60), updated_at=None), False,
                replace(LANDED, state="deferred")), None),
    ("landed for another try: re-driven", OrphanView(SILENT, False, replace(LANDED, try_number=1)), "redrive"),
])
def test_a_terminal_report_a_late_call_overwrote_is_restored_not_rerun(case, view, expected):
    """A RUNNING TI whose latest attempt's terminal report (success, failed, skipped, removed) had landed (a late
    ``PATCH /run`` of that execution wrote it back, on SQLite) is restored after ``landed_grace`` (30 s) of
    silence, never re-driven: its body must not run twice, nor a failed task run again. Anything else keeps the
    re-drive after ``orphan_run_threshold``."""
    actions = decide([view], NOW, SETTINGS)
    kinds = [("restore" if isinstance(a, Restore) else "redrive") for a in actions]
    assert kinds == ([expected] if expected else []), case
    for action in actions:
        if isinstance(action, Restore):
            assert (action.ti_id, action.try_number, action.attempt_epoch, action.state, action.at) == (
                SILENT.ti_id, 2, 3, view.landed.state, max(ago(60), view.ti.start_date))
            assert f"{view.landed.state} report landed" in action.why and "restoring it" in action.why
        # a candidate whenever decide acts on it for some ledger view
        assert candidates([view.ti], NOW, SETTINGS) == [view.ti]
