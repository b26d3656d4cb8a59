"""The reconciler's pure decision over a dead, current attempt: DESIGN §2's table as a matrix.

Evidence (outcome record as the agent wrote it, decoded from a real record file where it matters) x
Airflow's TI row x whether the agent's terminal report landed -> exactly one action.
"""

from __future__ import annotations

import pytest

from leoflow_agent import outcome
from leoflow_airflow.dispatch.guard import TIRow
from leoflow_airflow.ledger.states import Resolution
from leoflow_airflow.reconcile import Act, decide, outcome_summary

TI_ID = "0190b6c2-7e4f-7a3c-9d1e-2b5f6a7c8d90"
NEW_ID = "0190b6c2-7e4f-7a3c-9d1e-2b5f6a7c8d91"
ATTEMPT = outcome.AttemptIdentity(TI_ID, 1, 1)

PAYLOADS = {
    "success": {"state": "success", "end_date": "2025-01-01T00:00:00Z", "task_outlets": [], "outlet_events": []},
    "failed": {"state": "failed", "end_date": "2025-01-01T00:00:00Z"},
    "up_for_retry": {"state": "up_for_retry", "end_date": "2025-01-01T00:00:00Z"},
    "skipped": {"state": "skipped", "end_date": "2025-01-01T00:00:00Z"},
    "removed": {"state": "removed", "end_date": "2025-01-01T00:00:00Z"},
    "up_for_reschedule": {"state": "up_for_reschedule", "reschedule_date": "2025-01-01T00:05:00Z",
                          "end_date": "2025-01-01T00:00:00Z"},
    "deferred": {"state": "deferred", "classpath": "x.Trigger", "trigger_kwargs": {}, "next_method": "resume"},
}


def rec(state: str | None) -> outcome.OutcomeRecord | None:
    """A record as the agent writes it before a PATCH of ``state`` (``"heartbeat_lost"`` for the heartbeat-loss
    record, ``"killed"`` for the record of a failure refused after leoflow's graceful kill)."""
    if state is None:
        return None
    if state == "heartbeat_lost":
        return outcome.heartbeat_lost(ATTEMPT)
    if state == "killed":
        return outcome.killed(ATTEMPT)
    if state == "api_unreachable":
        return outcome.api_unreachable(ATTEMPT)
    if state == "oom_killed":
        return outcome.oom_killed(ATTEMPT)
    if state in ("exchange_refused", "exchange_unreachable", "agent_start_failed"):
        return getattr(outcome, state)(None)  # a task pod's agent before its grant: no attempt identity
    return outcome.record_for_state(state, PAYLOADS[state], attempt=ATTEMPT, api_version="2025-09-23")


def row(state: str | None, *, ti_id: str = TI_ID, try_number: int = 1) -> TIRow:
    """Airflow's row of the logical TI."""
    return TIRow(id=ti_id, state=state, try_number=try_number, max_tries=1, queued_by_job_id=1)


MATRIX = [
    # (record, TI id, TI state, TI try, reported) -> (act, resolution)
    # row 1: a record with the terminal payload, that ti_id RUNNING -> replay
    *[((s, TI_ID, "running", 1, False), (Act.REPLAY, Resolution.REPLAYED)) for s in PAYLOADS],
    # row 2: record says heartbeat_lost, RUNNING -> infra loss
    (("heartbeat_lost", TI_ID, "running", 1, False), (Act.INFRA_REDRIVE, Resolution.INFRA_REDRIVE)),
    # ... and so does a failure the agent refused after leoflow killed it (issue 8 hole 16)
    (("killed", TI_ID, "running", 1, False), (Act.INFRA_REDRIVE, Resolution.INFRA_REDRIVE)),
    # ... and a failure the agent refused after an Execution API call went unanswered (issue 10)
    (("api_unreachable", TI_ID, "running", 1, False), (Act.INFRA_REDRIVE, Resolution.INFRA_REDRIVE)),
    # ... and a failure the agent refused after the OOM killer ended its task process (issue 35, the real node)
    (("oom_killed", TI_ID, "running", 1, False), (Act.INFRA_REDRIVE, Resolution.OOM_REDRIVE)),
    (("oom_killed", TI_ID, "queued", 1, False), (Act.REDISPATCH, Resolution.REDISPATCHED)),
    # row 3: no record, RUNNING -> infra loss
    ((None, TI_ID, "running", 1, False), (Act.INFRA_REDRIVE, Resolution.INFRA_REDRIVE)),
    # row 4: no record, that ti_id QUEUED (died before /run) -> re-dispatch the same ti_id
    ((None, TI_ID, "queued", 1, False), (Act.REDISPATCH, Resolution.REDISPATCHED)),
    # ... and so does a record that reports no state: a task pod whose exchange was refused or never answered,
    # or whose agent could not start (issue 9 item 4), and any other refusal record while the TI waits QUEUED
    *[((r, TI_ID, "queued", 1, False), (Act.REDISPATCH, Resolution.REDISPATCHED))
      for r in ("exchange_refused", "exchange_unreachable", "agent_start_failed", "heartbeat_lost", "killed")],
    # a refusal record beside a TI that ran, or moved on, or whose report landed: the rows below, unchanged
    (("exchange_refused", TI_ID, "running", 1, False), (Act.INFRA_REDRIVE, Resolution.INFRA_REDRIVE)),
    (("exchange_refused", TI_ID, "success", 1, False), (Act.CLOSE, Resolution.MOVED_ON)),
    (("exchange_unreachable", NEW_ID, "queued", 2, False), (Act.CLOSE, Resolution.MOVED_ON)),
    (("exchange_refused", TI_ID, "queued", 1, True), (Act.CLOSE, Resolution.REPORTED)),
    # row 5: ti_id archived, logical TI RESTARTING at the same try -> success(key) once, whatever the evidence
    *[((r, NEW_ID, "restarting", 1, rep), (Act.RESTARTING_SUCCESS, Resolution.RESTARTING))
      for r in (None, "success", "heartbeat_lost") for rep in (False, True)],
    # row 6: anything else -> close, nothing else
    ((None, NEW_ID, "restarting", 2, False), (Act.CLOSE, Resolution.MOVED_ON)),        # a later try restarts
    ((None, NEW_ID, "running", 2, False), (Act.CLOSE, Resolution.MOVED_ON)),           # a new try runs
    ((None, NEW_ID, "queued", 2, False), (Act.CLOSE, Resolution.MOVED_ON)),
    (("up_for_retry", NEW_ID, "running", 2, False), (Act.CLOSE, Resolution.REPORTED)), # the retry report landed
    ((None, TI_ID, "success", 1, False), (Act.CLOSE, Resolution.MOVED_ON)),            # someone else settled it
    ((None, TI_ID, "failed", 1, False), (Act.CLOSE, Resolution.MOVED_ON)),
    ((None, TI_ID, "scheduled", 1, False), (Act.CLOSE, Resolution.MOVED_ON)),
    ((None, TI_ID, None, 1, False), (Act.CLOSE, Resolution.MOVED_ON)),
    (("success", TI_ID, "success", 1, False), (Act.CLOSE, Resolution.REPORTED)),      # report landed, 2xx lost
    (("failed", TI_ID, "failed", 1, False), (Act.CLOSE, Resolution.REPORTED)),
    (("skipped", TI_ID, "skipped", 1, False), (Act.CLOSE, Resolution.REPORTED)),
    (("success", TI_ID, "success", 1, True), (Act.CLOSE, Resolution.REPORTED)),
    ((None, TI_ID, "success", 1, True), (Act.CLOSE, Resolution.REPORTED)),
    # the agent's terminal PATCH returned 2xx: never re-driven, whatever the row says now ...
    ((None, TI_ID, "running", 1, True), (Act.CLOSE, Resolution.REPORTED)),
    # ... but a terminal report a late call of the same execution overwrote (that ti_id RUNNING again; on SQLite a
    # retried PATCH /run that waited on the write lock) is replayed from the record
    *[((s, TI_ID, "running", 1, True), (Act.REPLAY, Resolution.REPLAYED))
      for s in ("success", "failed", "up_for_retry", "skipped", "removed")],
    # a hand-off's TI runs again legitimately (as a new epoch): never replayed
    *[((s, TI_ID, "running", 1, True), (Act.CLOSE, Resolution.REPORTED))
      for s in ("up_for_reschedule", "deferred")],
    ((None, TI_ID, "queued", 1, True), (Act.CLOSE, Resolution.REPORTED)),
    # hand-offs that landed: same ti_id is back in the scheduler's hands
    (("up_for_reschedule", TI_ID, "up_for_reschedule", 1, False), (Act.CLOSE, Resolution.REPORTED)),
    (("up_for_reschedule", TI_ID, "queued", 1, False), (Act.CLOSE, Resolution.REPORTED)),
    (("up_for_reschedule", TI_ID, "scheduled", 1, False), (Act.CLOSE, Resolution.REPORTED)),
    (("deferred", TI_ID, "deferred", 1, False), (Act.CLOSE, Resolution.REPORTED)),
    (("deferred", TI_ID, "queued", 1, False), (Act.CLOSE, Resolution.REPORTED)),
    (("heartbeat_lost", TI_ID, "failed", 1, False), (Act.CLOSE, Resolution.MOVED_ON)),
]


@pytest.mark.parametrize(("given", "expected"), MATRIX, ids=[
    f"{g[0]}-{'same' if g[1] == TI_ID else 'new'}-{g[2]}-try{g[3]}-{'rep' if g[4] else 'norep'}" for g, _ in MATRIX
])
def test_decision_matrix(given, expected):
    """Each evidence x TI-row combination maps to the action DESIGN §2's table prescribes."""
    record, ti_id, state, try_number, reported = given
    action = decide(ti_id=TI_ID, try_number=1, record=rec(record), ti=row(state, ti_id=ti_id, try_number=try_number),
                    reported=reported)
    assert (action.act, action.resolution) == expected
    assert action.why


def test_row_gone_closes():
    """The TI row was deleted (DAG run deleted): close the ledger row, nothing else."""
    for record in (None, "success", "heartbeat_lost"):
        action = decide(ti_id=TI_ID, try_number=1, record=rec(record), ti=None)
        assert (action.act, action.resolution) == (Act.CLOSE, Resolution.MOVED_ON)


def test_replay_only_with_a_payload():
    """A record without a payload (a bare seed-003 record from another writer) is not replayable: infra loss."""
    bare = outcome.OutcomeRecord(outcome=outcome.Outcome.SUCCESS, ti_id=TI_ID, try_number=1, attempt_epoch=1)
    action = decide(ti_id=TI_ID, try_number=1, record=bare, ti=row("running"))
    assert action.act == Act.INFRA_REDRIVE


@pytest.mark.parametrize("content", [
    b"", b"{", b"not json at all\n", b"\x00\xff\xfe", b'{"v":2,"outcome":"success"}',
    b'{"v":1,"outcome":"exploded"}', b"[1,2,3]",
])
def test_corrupted_record_file_is_no_record_and_loses_nothing(tmp_path, content):
    """A corrupted record file reads as "no record": a RUNNING TI is re-driven (not lost, not replayed with
    garbage), a QUEUED one re-dispatched; nothing raises."""
    path = tmp_path / "record.json"
    path.write_bytes(content)
    record = outcome.read_record_file(path, expect=ATTEMPT)
    assert record is None
    assert decide(ti_id=TI_ID, try_number=1, record=record, ti=row("running")).act == Act.INFRA_REDRIVE
    assert decide(ti_id=TI_ID, try_number=1, record=record, ti=row("queued")).act == Act.REDISPATCH


def test_truncated_valid_record_file_is_no_record(tmp_path):
    """A record file cut short (every proper prefix of a valid record) never decodes into a record."""
    data = outcome.encode(rec("success")).encode()
    path = tmp_path / "record.json"
    outcome.write_record_file(path, rec("success"))
    assert outcome.read_record_file(path, expect=ATTEMPT) == rec("success")
    for cut in range(0, len(data) - 1, 7):
        path.write_bytes(data[:cut])
        assert outcome.read_record_file(path, expect=ATTEMPT) is None


def test_record_of_another_attempt_is_no_record(tmp_path):
    """A record written by a different epoch of the same ti_id does not count for this attempt."""
    path = tmp_path / "record.json"
    outcome.write_record_file(path, rec("success"))
    other = outcome.AttemptIdentity(TI_ID, 1, 2)
    assert outcome.read_record_file(path, expect=other) is None


def test_outcome_summary():
    """Log summaries name the state, the failure reason, or say there is no record."""
    assert outcome_summary(None) == "no record"
    assert outcome_summary(rec("success")) == "success"
    assert outcome_summary(rec("up_for_retry")) == "up_for_retry"
    assert "heartbeat_lost" in outcome_summary(rec("heartbeat_lost"))


def test_an_oom_killed_record_on_the_try_an_oom_kill_re_drove_fails_the_task():
    """The agent's ``oom_killed`` record settles as an OOM kill the runtime reports: re-driven once, then, on the
    try that re-drive made, failed (``executor.fail``) instead of re-driven again."""
    action = decide(ti_id=TI_ID, try_number=2, record=rec("oom_killed"), ti=row("running", try_number=2),
                    oom_redriven=True)
    assert (action.act, action.resolution) == (Act.TASK_FAIL, Resolution.EXECUTOR_FAILED)
    assert "OOM" in action.why


def test_a_pod_its_node_had_no_room_for_is_re_offered_as_backpressure():
    """Issue 35, the real node: a QUEUED TI whose pod the kubelet refused for lack of room (``OutOfcpu``) never
    started: re-dispatched, closed ``launch_failed`` (backpressure: no redispatch_limit spent, never a failure)."""
    from leoflow_airflow.lifecycle.runtime import EndCause, EndKind

    cause = EndCause(EndKind.NO_ROOM, "pod p-1 was refused by its node for lack of room (pod reason OutOfcpu)")
    action = decide(ti_id=TI_ID, try_number=1, record=None, ti=row("queued"), cause=cause)
    assert (action.act, action.resolution) == (Act.REDISPATCH, Resolution.LAUNCH_FAILED)
    assert "OutOfcpu" in action.why and "backpressure" in action.why


def test_an_oom_killed_record_names_the_container_the_runtime_reports_oom_killed():
    """Issue 35, the real node: the kernel killed the task process alone, the agent refused the failure
    (``oom_killed``) and the container runtime still names the container ``OOMKilled`` (with the agent's exit code):
    the re-drive's reason, which the TI's Log row shows, names that container and its pod, then the refusal."""
    from leoflow_airflow.lifecycle.runtime import EndCause, EndKind

    cause = EndCause(EndKind.OOM_KILLED, "OOMKilled, exit 0, container base (pod p-1)")
    action = decide(ti_id=TI_ID, try_number=1, record=rec("oom_killed"), ti=row("running"), cause=cause)
    assert (action.act, action.resolution) == (Act.INFRA_REDRIVE, Resolution.OOM_REDRIVE)
    assert action.why.startswith("OOMKilled, exit 0, container base (pod p-1): the OOM killer ended a process"), action
    bare = decide(ti_id=TI_ID, try_number=1, record=rec("oom_killed"), ti=row("running"))  # Lite: no runtime cause
    assert bare.why.startswith("the OOM killer ended a process of the attempt"), bare
