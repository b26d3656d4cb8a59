"""Outcome record (DESIGN §4, seed 003): decode matrix, byte budget, round trips, record file, fuzz.

Pure and fast: no Airflow process, no network. One test imports Airflow's generated Execution API
models to prove the payload field names we drop and parse are the real ones, and that a replayed body
still validates against Airflow's own schema.
"""

from __future__ import annotations

import json
import os
import random
import stat
import string
from dataclasses import replace
from datetime import datetime, timedelta, timezone

import pytest

from leoflow_agent.outcome import (
    CALLBACKS_PENDING_STATES,
    MAX_REASON_LEN,
    MAX_RECORD_BYTES,
    MIN_TERMINATION_MESSAGE_BUDGET,
    TERMINATION_MESSAGE_BUDGET,
    AttemptIdentity,
    Outcome,
    OutcomeRecord,
    Reason,
    RecordTooLarge,
    agent_start_failed,
    decode,
    encode,
    exchange_refused,
    exchange_unreachable,
    heartbeat_lost,
    read_record_file,
    record_for_state,
    truncate_utf8,
    write_record_file,
    write_termination_message,
)

TI = "0190b6c2-7e4f-7a3c-9d1e-2b5f6a7c8d90"
ATTEMPT = AttemptIdentity(TI, 2, 3)
API = "2026-06-30"
END = "2025-03-04T05:06:07.123456Z"


def body(state: str, **extra) -> dict:
    """A PATCH /state body shaped like the Task SDK client's model_dump_json() output."""
    shapes = {
        "success": {"end_date": END, "task_outlets": [], "outlet_events": [], "rendered_map_index": None},
        "failed": {"end_date": END, "rendered_map_index": None},
        "skipped": {"end_date": END, "rendered_map_index": "x"},
        "removed": {"end_date": END, "rendered_map_index": None},
        "upstream_failed": {"end_date": END, "rendered_map_index": None},
        "up_for_retry": {"end_date": END, "rendered_map_index": None, "retry_delay_seconds": 300.0,
                         "retry_reason": None},
        "up_for_reschedule": {"reschedule_date": "2025-03-04T05:11:07.5+01:00", "end_date": END},
        "deferred": {"classpath": "airflow.providers.standard.triggers.temporal.DateTimeTrigger",
                     "trigger_kwargs": {"moment": {"__type": "datetime", "__var": 1741064767.0}},
                     "trigger_timeout": None, "queue": None, "next_method": "execute_complete",
                     "next_kwargs": None, "rendered_map_index": None},
        "awaiting_input": {"timeout": None, "next_method": "execute_complete", "next_kwargs": {},
                           "rendered_map_index": None},
    }
    return {"state": state, **shapes[state], **extra}


EXPECTED_OUTCOME = {
    "success": Outcome.SUCCESS,
    "skipped": Outcome.SUCCESS,
    "removed": Outcome.SUCCESS,
    "failed": Outcome.FAILED,
    "up_for_retry": Outcome.FAILED,
    "upstream_failed": Outcome.FAILED,
    "up_for_reschedule": Outcome.RESCHEDULE,
    "deferred": Outcome.DEFERRED,
    "awaiting_input": Outcome.DEFERRED,
}
STATES = sorted(EXPECTED_OUTCOME)


def valid_record(state: str = "success", **extra) -> OutcomeRecord:
    return record_for_state(state, body(state, **extra), attempt=ATTEMPT, api_version=API)


def doc_of(record: OutcomeRecord) -> dict:
    return json.loads(encode(record))


def text_of(doc: dict) -> str:
    return json.dumps(doc)


# --------------------------------------------------------------------------------------------------
# record_for_state


@pytest.mark.parametrize("state", STATES)
def test_record_for_state_maps_every_reported_state(state):
    payload = body(state)
    rec = record_for_state(state, payload, attempt=ATTEMPT, api_version=API)
    assert rec.outcome is EXPECTED_OUTCOME[state]
    assert rec.state == state
    assert rec.payload == payload
    assert rec.api_version == API
    assert rec.attempt() == ATTEMPT
    assert rec.callbacks_pending is (state in {"success", "up_for_retry"})
    assert rec.reason is None and not rec.assets_dropped
    if state == "up_for_reschedule":
        # +01:00 normalised to UTC, fractional seconds kept
        assert rec.reschedule_at == "2025-03-04T04:11:07.500000Z"
        assert rec.reschedule_time() == datetime(2025, 3, 4, 4, 11, 7, 500000, tzinfo=timezone.utc)
    else:
        assert rec.reschedule_at is None and rec.reschedule_time() is None


def test_callbacks_pending_states_are_the_ones_patched_before_callbacks():
    assert CALLBACKS_PENDING_STATES == {"success", "up_for_retry"}


@pytest.mark.parametrize("state", ["running", "queued", "scheduled", "restarting", "none", "", "SUCCESS", None, 1])
def test_record_for_state_refuses_states_that_are_not_terminal_or_handing_off(state):
    with pytest.raises(ValueError):
        record_for_state(state, {"state": state}, attempt=ATTEMPT, api_version=API)


def test_record_for_state_accepts_airflow_state_enum_and_stores_its_value():
    class TaskInstanceState(str, __import__("enum").Enum):  # the shape of Airflow's own enum
        UP_FOR_RETRY = "up_for_retry"

    rec = record_for_state(TaskInstanceState.UP_FOR_RETRY, body("up_for_retry"), attempt=ATTEMPT, api_version=API)
    assert rec.state == "up_for_retry" and type(rec.state) is str
    assert '"state":"up_for_retry"' in encode(rec)


@pytest.mark.parametrize(
    "payload",
    [
        {"state": "failed", "end_date": END},  # body says failed, report says success
        {"end_date": END},  # no state in the body: the replay would be refused by Airflow
        ["success"],
        {"state": "success", "end_date": float("nan")},
        {"state": "success", "x": object()},
    ],
    ids=["state-mismatch", "no-state", "not-object", "nan", "not-json"],
)
def test_record_for_state_refuses_a_body_that_could_not_be_replayed(payload):
    with pytest.raises(ValueError):
        record_for_state("success", payload, attempt=ATTEMPT, api_version=API)


@pytest.mark.parametrize("date", [None, "", "soon", "2025-03-04T05:06:07", "2025-03-04", 17])
def test_record_for_state_refuses_a_reschedule_without_a_usable_time(date):
    payload = body("up_for_reschedule", reschedule_date=date)
    with pytest.raises(ValueError):
        record_for_state("up_for_reschedule", payload, attempt=ATTEMPT, api_version=API)


def test_record_for_state_keeps_its_own_copy_of_the_body():
    payload = body("success")
    rec = record_for_state("success", payload, attempt=ATTEMPT, api_version=API)
    payload["end_date"] = "tampered"
    assert rec.payload["end_date"] == END


def test_heartbeat_lost_record():
    rec = heartbeat_lost(ATTEMPT)
    assert rec.outcome is Outcome.FAILED
    assert rec.reason == Reason.HEARTBEAT_LOST == "heartbeat_lost"
    assert rec.state is None and rec.payload is None and not rec.callbacks_pending
    assert decode(encode(rec), expect=ATTEMPT) == rec


# --------------------------------------------------------------------------------------------------
# encode


def test_encode_is_compact_versioned_json_without_absent_fields():
    text = encode(heartbeat_lost(ATTEMPT))
    assert text == (
        '{"v":1,"attempt_epoch":3,"outcome":"failed","reason":"heartbeat_lost",'
        f'"ti_id":"{TI}","try_number":2}}'
    )


def test_encode_omits_epoch_zero_as_the_seed_does():
    rec = OutcomeRecord(Outcome.SUCCESS, ti_id=TI, try_number=1, attempt_epoch=0)
    assert "attempt_epoch" not in encode(rec)


def test_encode_writes_non_ascii_as_utf8_and_counts_bytes():
    rec = OutcomeRecord(Outcome.FAILED, reason="délai dépassé €")
    text = encode(rec)
    assert "délai dépassé €" in text
    assert decode(text.encode("utf-8")).reason == "délai dépassé €"


def test_encode_clamps_reason_to_max_reason_len_bytes():
    rec = OutcomeRecord(Outcome.FAILED, reason="€" * 200)  # 600 bytes
    got = decode(encode(rec)).reason
    assert got == "€" * (MAX_REASON_LEN // 3)
    assert len(got.encode()) <= MAX_REASON_LEN


@pytest.mark.parametrize(
    "record",
    [
        OutcomeRecord(Outcome.RESCHEDULE),
        OutcomeRecord(Outcome.RESCHEDULE, reschedule_at="tomorrow"),
        OutcomeRecord("bogus"),  # type: ignore[arg-type]
        OutcomeRecord(Outcome.SUCCESS, state="failed"),
        OutcomeRecord(Outcome.SUCCESS, state="success", payload={"state": "failed"}),
        OutcomeRecord(Outcome.SUCCESS, state="success", payload={"state": "success", "x": float("inf")}),
        OutcomeRecord(Outcome.SUCCESS, state="success", payload={"state": "success", "x": object()}),
        OutcomeRecord(Outcome.SUCCESS, try_number="2"),  # type: ignore[arg-type]
    ],
    ids=["resched-no-time", "resched-bad-time", "bad-outcome", "state-mismatch", "payload-mismatch",
         "infinity", "not-json", "wrong-type"],
)
def test_encode_refuses_a_record_the_reader_would_take_for_no_record(record):
    with pytest.raises(ValueError) as info:
        encode(record)
    assert not isinstance(info.value, RecordTooLarge)


@pytest.mark.parametrize("state", STATES)
def test_round_trip_every_state(state):
    rec = valid_record(state)
    for sink in (encode(rec), encode(rec, budget=TERMINATION_MESSAGE_BUDGET)):
        assert decode(sink, expect=ATTEMPT) == rec
        assert decode(sink.encode("utf-8"), expect=ATTEMPT) == rec


def test_round_trip_seed_style_records():
    records = [
        OutcomeRecord(Outcome.SUCCESS),
        OutcomeRecord(Outcome.FAILED, exit_code=137),
        OutcomeRecord(Outcome.FAILED, exit_code=-9, reason=Reason.EXECUTION_TIMEOUT.value),
        OutcomeRecord(Outcome.RESCHEDULE, reschedule_at="2025-03-04T05:06:07.123456789Z"),
        OutcomeRecord(Outcome.DEFERRED, ti_id=TI),
        OutcomeRecord(Outcome.FAILED, reason=Reason.AGENT_START_FAILED.value, attempt_epoch=4),
    ]
    for rec in records:
        assert decode(encode(rec)) == rec


# --------------------------------------------------------------------------------------------------
# encode with a byte budget

OUTLETS = [{"name": f"asset_{i}", "uri": f"s3://bucket/data/partition={i:04d}", "type": "Asset"}
           for i in range(40)]
EVENTS = [{"dest_asset_key": {"name": f"asset_{i}", "uri": f"s3://bucket/data/partition={i:04d}"},
           "extra": {"rows": i * 1000, "note": "written by the nightly load"}} for i in range(40)]


def test_budget_drops_asset_events_first_and_flags_it():
    rec = valid_record("success", task_outlets=OUTLETS, outlet_events=EVENTS, rendered_map_index="eu-west")
    whole = encode(rec)
    assert len(whole.encode()) > TERMINATION_MESSAGE_BUDGET  # the premise
    assert decode(whole) == rec  # the record file keeps everything, unflagged

    text = encode(rec, budget=TERMINATION_MESSAGE_BUDGET)
    assert len(text.encode()) <= TERMINATION_MESSAGE_BUDGET
    got = decode(text, expect=ATTEMPT)
    assert got.assets_dropped is True
    assert got.payload["outlet_events"] == [] and got.payload["task_outlets"] == []
    # everything else in the body survives for the replay
    assert got.payload["end_date"] == END and got.payload["rendered_map_index"] == "eu-west"
    assert (got.outcome, got.state, got.callbacks_pending, got.api_version) == (
        Outcome.SUCCESS, "success", True, API)


def test_budget_keeps_assets_when_they_fit_and_does_not_flag():
    rec = valid_record("success", task_outlets=OUTLETS[:2], outlet_events=EVENTS[:2])
    got = decode(encode(rec, budget=TERMINATION_MESSAGE_BUDGET))
    assert got == rec and not got.assets_dropped


def test_budget_drops_assets_before_touching_reason():
    rec = replace(valid_record("success", task_outlets=OUTLETS, outlet_events=EVENTS),
                  reason=Reason.EXECUTION_TIMEOUT.value)
    got = decode(encode(rec, budget=TERMINATION_MESSAGE_BUDGET))
    assert got.assets_dropped and got.reason == "execution_timeout"


def test_budget_then_truncates_reason_on_a_multibyte_boundary():
    reason = "ü€𝄞" * 30  # 2-, 3- and 4-byte characters, 270 bytes -> clamped to 240 first
    rec = OutcomeRecord(Outcome.FAILED, ti_id=TI, try_number=2, attempt_epoch=3, reason=reason)
    floor = len(encode(OutcomeRecord(Outcome.FAILED, ti_id=TI, try_number=2, attempt_epoch=3)).encode())
    for budget in range(floor + len(',"reason":""'), floor + 260):
        text = encode(rec, budget=budget)
        raw = text.encode("utf-8")  # would raise on a split character
        assert len(raw) <= budget
        got = decode(raw)
        assert got is not None and reason.startswith(got.reason or "")
        # the cut is as long as the budget allows: one more character would not fit
        kept = got.reason or ""
        if len(kept) < len(truncate_utf8(reason, MAX_REASON_LEN)):
            bigger = OutcomeRecord(Outcome.FAILED, ti_id=TI, try_number=2, attempt_epoch=3,
                                   reason=reason[: len(kept) + 1])
            assert len(encode(bigger).encode()) > budget


def test_budget_reason_cut_to_nothing_is_omitted():
    rec = OutcomeRecord(Outcome.FAILED, reason="execution_timeout")
    floor = len(encode(OutcomeRecord(Outcome.FAILED)).encode())
    text = encode(rec, budget=floor)
    assert decode(text) == OutcomeRecord(Outcome.FAILED)


def test_budget_raises_record_too_large_when_nothing_helps():
    huge = {"blob": "x" * 5000}
    rec = valid_record("deferred", trigger_kwargs=huge)
    with pytest.raises(RecordTooLarge) as info:
        encode(rec, budget=TERMINATION_MESSAGE_BUDGET)
    assert isinstance(info.value, ValueError)
    assert info.value.budget == TERMINATION_MESSAGE_BUDGET and info.value.size > TERMINATION_MESSAGE_BUDGET
    assert decode(encode(rec)) == rec  # the record file still takes it whole


@pytest.mark.parametrize("state", ["success", "failed", "up_for_retry", "up_for_reschedule", "skipped"])
def test_every_terminal_record_fits_the_minimum_termination_message_budget(state):
    """MIN_TERMINATION_MESSAGE_BUDGET (the pod builder's floor) holds the widest terminal record today's
    supervisor sends: a 250-character rendered_map_index (Airflow's column) of 4-byte characters, the widest
    numbers, asset events and a long reason dropped or cut to fit, and the record still decodes whole."""
    widest = AttemptIdentity(TI, 2**31 - 1, 2**31 - 1)
    when = "2026-01-01T00:00:00.123456+00:00"
    payload = {"state": state, "end_date": when}
    if state == "up_for_reschedule":
        payload["reschedule_date"] = when
    else:
        payload["rendered_map_index"] = "\U0001F600" * 250
    if state == "up_for_retry":
        payload["retry_delay_seconds"] = 1.7976931348623157e308
    if state == "success":
        payload["task_outlets"] = [{"name": "a" * 500, "uri": "s3://" + "b" * 500, "type": "Asset"}]
        payload["outlet_events"] = [{"dest_asset_key": {"name": "a" * 500, "uri": "u"}, "extra": {"k": "v" * 500}}]
    rec = replace(record_for_state(state, payload, attempt=widest, api_version="2026-06-30"),
                  exit_code=-(2**31), reason="execution_timeout" * 10)
    text = encode(rec, budget=MIN_TERMINATION_MESSAGE_BUDGET)
    assert len(text.encode()) <= MIN_TERMINATION_MESSAGE_BUDGET
    got = decode(text, expect=widest)
    assert got is not None and got.payload.get("rendered_map_index") == payload.get("rendered_map_index")
    assert got.state == state and got.exit_code == -(2**31)


def test_whole_body_is_still_bounded_by_the_reader_ceiling():
    events = [{"extra": {"blob": "y" * 4096}, "dest_asset_key": {"name": str(i)}} for i in range(300)]
    rec = valid_record("success", outlet_events=events)
    text = encode(rec)
    assert len(text.encode()) <= MAX_RECORD_BYTES
    got = decode(text)
    assert got is not None and got.assets_dropped and got.payload["outlet_events"] == []


# --------------------------------------------------------------------------------------------------
# decode matrix


def test_decode_accepts_each_valid_kind_with_its_fields():
    ok = decode(encode(valid_record("success")), expect=ATTEMPT)
    assert ok.outcome is Outcome.SUCCESS and ok.callbacks_pending

    retry = decode(encode(valid_record("up_for_retry")), expect=ATTEMPT)
    assert retry.outcome is Outcome.FAILED and retry.state == "up_for_retry"
    assert retry.payload["retry_delay_seconds"] == 300.0

    resched = decode(encode(valid_record("up_for_reschedule")), expect=ATTEMPT)
    assert resched.outcome is Outcome.RESCHEDULE
    assert resched.reschedule_time() == datetime(2025, 3, 4, 4, 11, 7, 500000, tzinfo=timezone.utc)

    deferred = decode(encode(valid_record("deferred")), expect=ATTEMPT)
    assert deferred.outcome is Outcome.DEFERRED and deferred.payload["next_method"] == "execute_complete"

    hb = decode(encode(heartbeat_lost(ATTEMPT)), expect=ATTEMPT)
    assert hb.outcome is Outcome.FAILED and hb.reason == "heartbeat_lost"


def test_decode_reads_a_seed_003_record_written_by_the_go_agent():
    assert decode('{"v":1,"outcome":"failed","exit_code":1}') == OutcomeRecord(Outcome.FAILED, exit_code=1)
    got = decode('{"outcome":"reschedule","v":1,"reschedule_at":"2025-03-04T05:06:07.123456789+00:00"}\n')
    assert got.reschedule_time() == datetime(2025, 3, 4, 5, 6, 7, 123456, tzinfo=timezone.utc)


GOOD = doc_of(valid_record("success"))
RESCHED = doc_of(valid_record("up_for_reschedule"))


def mutate(doc: dict, **changes) -> str:
    out = dict(doc)
    for key, value in changes.items():
        if value is ...:
            out.pop(key, None)
        else:
            out[key] = value
    return json.dumps(out)


NO_RECORD = {
    "none": None,
    "empty-str": "",
    "empty-bytes": b"",
    "whitespace": " \n\t",
    "log-tail": "[2025-03-04T05:06:07Z] INFO - Task exited with return code 1\nTraceback (most recent call last):\n",
    "log-tail-then-record": "INFO done\n" + text_of(GOOD),
    "truncated-record": text_of(GOOD)[:-7],
    "json-array": "[1, 2]",
    "json-string": '"success"',
    "json-number": "1",
    "json-null": "null",
    "v-2": mutate(GOOD, v=2),
    "v-0": mutate(GOOD, v=0),
    "v-true": mutate(GOOD, v=True),
    "v-float": mutate(GOOD, v=1.0),
    "v-string": mutate(GOOD, v="1"),
    "v-missing": mutate(GOOD, v=...),
    "outcome-unknown": mutate(GOOD, outcome="skipped"),
    "outcome-upper": mutate(GOOD, outcome="SUCCESS"),
    "outcome-missing": mutate(GOOD, outcome=...),
    "outcome-null": mutate(GOOD, outcome=None),
    "reschedule-no-time": mutate(RESCHED, reschedule_at=...),
    "reschedule-null-time": mutate(RESCHED, reschedule_at=None),
    "reschedule-garbage-time": mutate(RESCHED, reschedule_at="in five minutes"),
    "reschedule-naive-time": mutate(RESCHED, reschedule_at="2025-03-04T05:06:07"),
    "reschedule-date-only": mutate(RESCHED, reschedule_at="2025-03-04"),
    "reschedule-basic-iso": mutate(RESCHED, reschedule_at="20250304T050607Z"),
    "reschedule-impossible-date": mutate(RESCHED, reschedule_at="2025-02-30T05:06:07Z"),
    "reschedule-overflow": mutate(RESCHED, reschedule_at="9999-12-31T23:59:59-01:00"),
    "reschedule-number-time": mutate(RESCHED, reschedule_at=1741064767),
    "oversized-str": mutate(GOOD, padding="x" * MAX_RECORD_BYTES),
    "oversized-bytes": mutate(GOOD, padding="x" * MAX_RECORD_BYTES).encode(),
    "oversized-multibyte": mutate(GOOD, padding="€" * (MAX_RECORD_BYTES // 3 + 1)),
    "wrong-ti": mutate(GOOD, ti_id="0190b6c2-0000-7000-8000-000000000000"),
    "wrong-try": mutate(GOOD, try_number=1),
    "wrong-epoch": mutate(GOOD, attempt_epoch=2),
    "type-ti-int": mutate(GOOD, ti_id=5),
    "type-ti-empty": mutate(GOOD, ti_id=""),
    "type-try-str": mutate(GOOD, try_number="2"),
    "type-try-bool": mutate(GOOD, try_number=True),
    "type-epoch-float": mutate(GOOD, attempt_epoch=3.0),
    "type-epoch-negative": mutate(GOOD, attempt_epoch=-3),
    "type-state-int": mutate(GOOD, state=1),
    "type-payload-list": mutate(GOOD, payload=[GOOD["payload"]]),
    "type-payload-str": mutate(GOOD, payload=json.dumps(GOOD["payload"])),
    "type-api-int": mutate(GOOD, api_version=20260630),
    "type-callbacks-str": mutate(GOOD, callbacks_pending="true"),
    "type-callbacks-int": mutate(GOOD, callbacks_pending=1),
    "type-assets-str": mutate(GOOD, assets_dropped="false"),
    "type-exit-str": mutate(GOOD, exit_code="1"),
    "type-exit-bool": mutate(GOOD, exit_code=False),
    "type-exit-huge": mutate(GOOD, exit_code=2**40),
    "type-reason-int": mutate(GOOD, reason=7),
    "type-reason-list": mutate(GOOD, reason=["heartbeat_lost"]),
    "state-vs-outcome": mutate(GOOD, outcome="failed"),
    "state-running": mutate(GOOD, state="running", payload={**GOOD["payload"], "state": "running"}),
    "state-unknown": mutate(GOOD, state="done", payload={**GOOD["payload"], "state": "done"}),
    "payload-state-differs": mutate(GOOD, payload={**GOOD["payload"], "state": "failed"}),
    "payload-without-state": mutate(GOOD, payload={k: v for k, v in GOOD["payload"].items() if k != "state"}),
    "payload-without-record-state": mutate(GOOD, state=...),
    "nan": text_of(GOOD)[:-1] + ',"x":NaN}',
    "infinity": text_of(GOOD)[:-1] + ',"x":-Infinity}',
    "invalid-utf8": text_of(GOOD).replace("success", "succ\xffess", 1).encode("latin-1"),
    "split-multibyte": ('{"v":1,"outcome":"failed","reason":"' + "€").encode()[:-1] + b'"}',
    "utf8-bom": b"\xef\xbb\xbf" + text_of(GOOD).encode(),
    "deep-nesting": '{"v":1,"outcome":"success","x":' + "[" * 100_000 + "]" * 100_000 + "}",
    "huge-int": '{"v":1,"outcome":"failed","exit_code":' + "9" * 5000 + "}",
    "not-text": 12345,
}


@pytest.mark.parametrize("case", sorted(NO_RECORD))
def test_decode_returns_no_record(case):
    assert decode(NO_RECORD[case], expect=ATTEMPT) is None


def test_the_matrix_cases_are_one_edit_away_from_a_valid_record():
    # Guards the matrix itself: the documents it mutates are accepted as they are.
    assert decode(text_of(GOOD), expect=ATTEMPT) is not None
    assert decode(text_of(RESCHED), expect=ATTEMPT) is not None
    assert decode(text_of(GOOD).encode("utf-8"), expect=ATTEMPT) is not None


def test_decode_checks_only_the_attempt_fields_that_are_present():
    partial = mutate(GOOD, attempt_epoch=..., try_number=...)
    assert decode(partial, expect=ATTEMPT) is not None  # caller checked epoch/try against labels
    assert decode(partial, expect=AttemptIdentity("another", 2, 3)) is None
    assert decode(mutate(GOOD, attempt_epoch=0), expect=ATTEMPT).attempt_epoch is None  # seed: 0 = absent
    assert decode(text_of(GOOD)) is not None  # no expectation: nothing to compare


def test_decode_ignores_unknown_keys_and_null_optional_fields():
    got = decode(mutate(GOOD, future_field={"a": 1}, exit_code=None, reason=None), expect=ATTEMPT)
    assert got == valid_record("success")


def test_decode_bounds_an_over_long_reason_instead_of_rejecting():
    got = decode(mutate(GOOD, reason="é" * 1000))
    assert got is not None and got.reason == "é" * (MAX_REASON_LEN // 2)


def test_decode_accepts_bytearray_and_surrounding_whitespace():
    assert decode(bytearray(b"\n " + text_of(GOOD).encode() + b"\n")) == valid_record("success")


def test_decode_never_raises_on_a_broken_expect():
    assert decode(text_of(GOOD), expect="not an attempt") is None  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------------
# truncate_utf8


def test_truncate_utf8_cuts_on_character_boundaries():
    rng = random.Random(3)
    alphabet = "aé€𝄞\u0301\x00\"\\"
    for _ in range(2000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 40)))
        limit = rng.randrange(-2, 120)
        cut = truncate_utf8(text, limit)
        raw = cut.encode("utf-8")
        assert text.startswith(cut)
        assert len(raw) <= max(0, limit)
        if cut != text:  # maximal: the next character would not fit
            assert len(text[: len(cut) + 1].encode("utf-8")) > limit


# --------------------------------------------------------------------------------------------------
# the real Airflow payloads


def test_real_airflow_bodies_round_trip_and_still_validate_after_assets_are_dropped():
    from airflow.sdk.api.datamodels import _generated as m

    when = datetime(2025, 3, 4, 5, 6, 7, tzinfo=timezone.utc)
    bodies = {
        "success": m.TISuccessStatePayload(
            end_date=when,
            task_outlets=[m.AssetProfile(name=f"a{i}", uri=f"s3://b/{'k' * 40}/{i}", type="Asset") for i in range(30)],
            outlet_events=[{"dest_asset_key": {"name": f"a{i}", "uri": f"s3://b/{i}"}, "extra": {"n": i}}
                           for i in range(30)],
        ),
        "up_for_retry": m.TIRetryStatePayload(end_date=when, retry_delay_seconds=30.0),
        "failed": m.TITerminalStatePayload(state=m.TerminalStateNonSuccess.FAILED, end_date=when),
        "up_for_reschedule": m.TIRescheduleStatePayload(reschedule_date=when + timedelta(minutes=5), end_date=when),
        "deferred": m.TIDeferredStatePayload(classpath="x.Trigger", next_method="execute_complete",
                                             trigger_timeout=timedelta(hours=1)),
    }
    for state, model in bodies.items():
        payload = json.loads(model.model_dump_json())
        rec = record_for_state(state, payload, attempt=ATTEMPT, api_version=m.API_VERSION)
        for budget in (None, TERMINATION_MESSAGE_BUDGET):
            got = decode(encode(rec, budget=budget), expect=ATTEMPT)
            assert got is not None
            # what the reconciler replays is still a body Airflow's schema accepts
            replayed = type(model).model_validate(got.payload)
            assert replayed.state == model.state
            if state == "up_for_reschedule":
                assert got.reschedule_time() == when + timedelta(minutes=5)
        if state == "success":
            assert got.assets_dropped and replayed.outlet_events == [] and replayed.task_outlets == []


# --------------------------------------------------------------------------------------------------
# the Lite record file


def test_record_file_round_trip_is_private_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "attempt.json"
    rec = valid_record("up_for_retry")
    write_record_file(path, rec)
    assert read_record_file(path, expect=ATTEMPT) == rec
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert os.listdir(tmp_path) == ["attempt.json"]
    assert read_record_file(str(path), expect=AttemptIdentity(TI, 2, 4)) is None  # another epoch's reader


def test_record_file_is_replaced_whole(tmp_path):
    path = tmp_path / "attempt.json"
    write_record_file(path, heartbeat_lost(ATTEMPT))
    write_record_file(path, valid_record("success"))
    assert read_record_file(path) == valid_record("success")
    assert os.listdir(tmp_path) == ["attempt.json"]


def test_record_file_keeps_the_old_record_when_a_write_fails(tmp_path):
    path = tmp_path / "attempt.json"
    write_record_file(path, heartbeat_lost(ATTEMPT))
    with pytest.raises(ValueError):
        write_record_file(path, OutcomeRecord(Outcome.RESCHEDULE))  # not writable: no time
    assert read_record_file(path) == heartbeat_lost(ATTEMPT)
    target_is_dir = tmp_path / "d"
    target_is_dir.mkdir()
    (target_is_dir / "x").write_text("")
    with pytest.raises(OSError):
        write_record_file(target_is_dir, valid_record())
    assert sorted(os.listdir(tmp_path)) == ["attempt.json", "d"]  # no temporary left behind
    with pytest.raises(OSError):
        write_record_file(tmp_path / "missing" / "attempt.json", valid_record())


def test_reading_a_missing_corrupt_or_odd_record_file_is_no_record(tmp_path):
    path = tmp_path / "attempt.json"
    assert read_record_file(path) is None
    write_record_file(path, valid_record("success"))
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])  # torn write
    assert read_record_file(path) is None
    path.write_bytes(b"\x00" * 64)
    assert read_record_file(path) is None
    path.write_bytes(data + b" " * MAX_RECORD_BYTES)  # valid JSON, but past the ceiling
    assert read_record_file(path) is None
    assert read_record_file(tmp_path) is None  # a directory
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert read_record_file(fifo) is None  # returns at once rather than blocking on a writer
    assert read_record_file(None) is None  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------------
# fuzz: decode never raises, and whatever it accepts is a fixpoint of encode/decode

KEYS = ["v", "outcome", "ti_id", "try_number", "attempt_epoch", "state", "payload", "api_version",
        "callbacks_pending", "exit_code", "reschedule_at", "reason", "assets_dropped", "outlet_events",
        "task_outlets", "reschedule_date", "end_date", "x", ""]
ATOMS = [None, True, False, 0, 1, 2, -1, 3, 2**31, 2**63, 1.0, 1.5, -0.0, 1e308, "", "success", "failed",
         "reschedule", "deferred", "up_for_retry", "up_for_reschedule", "awaiting_input", "skipped", "running",
         TI, "2025-03-04T05:06:07Z", "2025-03-04T05:06:07", "heartbeat_lost", "€" * 100, "\ud800", "\x00"]


def random_json(rng: random.Random, depth: int = 0):
    roll = rng.random()
    if depth > 3 or roll < 0.5:
        return rng.choice(ATOMS)
    if roll < 0.75:
        return [random_json(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {rng.choice(KEYS): random_json(rng, depth + 1) for _ in range(rng.randrange(6))}


def mutate_bytes(rng: random.Random, data: bytes) -> bytes:
    buf = bytearray(data)
    for _ in range(rng.randrange(1, 4)):
        op = rng.randrange(4)
        pos = rng.randrange(len(buf) + 1)
        if op == 0 and buf:
            buf[min(pos, len(buf) - 1)] = rng.randrange(256)
        elif op == 1:
            del buf[pos: pos + rng.randrange(1, 8)]
        elif op == 2:
            buf[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 4)))
        else:
            buf = buf[:pos]
    return bytes(buf)


def fuzz_inputs(rng: random.Random, n: int):
    seeds = [encode(valid_record(s)).encode() for s in STATES]
    seeds += [encode(heartbeat_lost(ATTEMPT)).encode(),
              encode(valid_record("success", task_outlets=OUTLETS[:3], outlet_events=EVENTS[:3])).encode()]
    for i in range(n):
        kind = i % 4
        if kind == 0:
            yield bytes(rng.randrange(256) for _ in range(rng.randrange(0, 96)))
        elif kind == 1:
            doc = random_json(rng)
            if isinstance(doc, dict) and rng.random() < 0.7:
                doc.setdefault("v", 1)
                doc.setdefault("outcome", rng.choice(["success", "failed", "reschedule", "deferred"]))
            yield json.dumps(doc)
        elif kind == 2:
            yield mutate_bytes(rng, rng.choice(seeds))
        else:  # a valid record with one field replaced by something random
            doc = json.loads(rng.choice(seeds))
            doc[rng.choice(KEYS)] = random_json(rng)
            text = json.dumps(doc)
            yield text if rng.random() < 0.5 else text.encode("utf-8", "surrogatepass")


def test_fuzz_decode_never_raises():
    rng = random.Random(0x1E0F10)
    count = accepted = 0
    for item in fuzz_inputs(rng, 10_000):
        variants = [item]
        if isinstance(item, bytes):
            variants.append(item.decode("utf-8", "surrogateescape"))  # str with lone surrogates
        for candidate in variants:
            for expect in (None, ATTEMPT):
                got = decode(candidate, expect=expect)  # must not raise, whatever the input
                count += 1
                if got is None:
                    continue
                assert isinstance(got, OutcomeRecord) and isinstance(got.outcome, Outcome)
                accepted += 1
                # anything the reader accepts, the writer can write back unchanged
                assert decode(encode(got)) == got
                small = encode(got, budget=MAX_RECORD_BYTES)
                assert decode(small) == got
    assert count >= 20_000
    # the generator reaches past the first checks: a fuzz that only ever produced garbage proves little
    assert accepted > 500, accepted


def test_fuzz_encode_with_random_budgets_never_exceeds_them():
    rng = random.Random(7)
    rec_pool = [valid_record(s) for s in STATES] + [
        valid_record("success", task_outlets=OUTLETS, outlet_events=EVENTS),
        OutcomeRecord(Outcome.FAILED, ti_id=TI, reason="".join(rng.choice(string.printable + "é€𝄞") for _ in range(400))),
    ]
    for _ in range(600):
        rec = rng.choice(rec_pool)
        budget = rng.randrange(40, 3000)
        try:
            text = encode(rec, budget=budget)
        except RecordTooLarge:
            continue
        assert len(text.encode("utf-8")) <= budget
        got = decode(text)
        assert got is not None and got.outcome == rec.outcome and got.state == rec.state
        assert (got.payload is None) == (rec.payload is None)
        assert got.assets_dropped or got.payload == rec.payload


def test_encode_refuses_a_reason_that_is_not_text():
    with pytest.raises(ValueError):
        encode(OutcomeRecord(Outcome.FAILED, reason=5))  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------------
# a task pod's records and its termination message (issue 9 item 4)


@pytest.mark.parametrize(("build", "reason"), [(exchange_refused, "exchange_refused"),
                                               (exchange_unreachable, "exchange_unreachable"),
                                               (agent_start_failed, "agent_start_failed")])
def test_a_pod_agents_refusal_records_carry_a_reason_and_no_state(build, reason):
    """Before its grant a pod's agent does not know its attempt: the record carries none, and any reader's
    expectation accepts it (the reader matched the pod by its labels); after it, the record names the attempt."""
    anonymous = build()
    assert (anonymous.outcome, anonymous.reason, anonymous.state, anonymous.payload) == (
        Outcome.FAILED, reason, None, None)
    assert anonymous.attempt() is None
    text = encode(anonymous, budget=MIN_TERMINATION_MESSAGE_BUDGET)
    assert text == '{"v":1,"outcome":"failed","reason":"%s"}' % reason
    assert decode(text, expect=ATTEMPT) == anonymous
    named = build(ATTEMPT)
    assert decode(encode(named), expect=ATTEMPT) == named and named.attempt() == ATTEMPT
    assert decode(encode(named), expect=AttemptIdentity(TI, 2, 4)) is None


def _message_records() -> list[OutcomeRecord]:
    """Records as a termination message carries them: a success with non-ASCII text (a raw byte cut can split a
    character), a deferral whose payload nests an object with a ``v`` key of 1, and a refusal."""
    return [
        valid_record("success", rendered_map_index="Zürich-€-𝄞"),
        valid_record("deferred", trigger_kwargs={"v": 1, "outcome": "success", "x": {"v": 1}}),
        exchange_refused(),
    ]


@pytest.mark.parametrize("prefix", ["", "container runtime said: ", 'oom {"v":1 odd: ', ": "])
def test_decode_reads_a_record_after_the_kubelets_runtime_message_prefix(prefix):
    """The kubelet writes ``"<runtime message>: <file content>"`` when the runtime has a message of its own; the
    record is read from the ``{"v":1`` that starts a valid record to the end, even when the payload nests one."""
    for record in _message_records():
        text = encode(record, budget=TERMINATION_MESSAGE_BUDGET)
        assert decode(prefix + text, expect=ATTEMPT) == record
        assert decode((prefix + text).encode("utf-8"), expect=ATTEMPT) == record
        assert decode(prefix + text, expect=AttemptIdentity(TI, 2, 4)) in (None, record) and (
            record.attempt() is None or decode(prefix + text, expect=AttemptIdentity(TI, 2, 4)) is None)


@pytest.mark.parametrize("prefix", [b"", b"runtime message: "])
def test_a_head_or_tail_truncated_message_is_no_record(prefix):
    """The kubelet keeps a file's last 4096 bytes (a longer file loses its head) and cuts each message to its
    share of 12288 bytes keeping the head (a raw byte slice that may split a UTF-8 character): every cut of every
    record, with or without a runtime prefix, reads as "no record", never as another record."""
    for record in _message_records():
        data = encode(record, budget=TERMINATION_MESSAGE_BUDGET).encode("utf-8")
        whole = prefix + data
        assert decode(whole, expect=ATTEMPT) == record
        for cut in range(1, len(data)):
            assert decode(prefix + data[cut:], expect=ATTEMPT) is None, ("head", cut)
            assert decode(whole[:len(prefix) + cut], expect=ATTEMPT) is None, ("tail", cut)
            assert decode((prefix + data[:cut]).decode("utf-8", "replace")) is None, ("tail as text", cut)


def test_prefix_search_is_bounded_on_hostile_text():
    """A text made of nothing but record openings is tried a bounded number of times, then "no record"."""
    hostile = "x" + '{"v":1' * 100_000
    assert decode(hostile) is None
    good = encode(exchange_refused())
    assert decode("x" + '{"v":1,' * 3 + good) == exchange_refused()


def test_termination_message_holds_exactly_the_record_whatever_was_there(tmp_path):
    """The record is the whole file: a longer earlier content (another record, a log line) is gone, not
    followed or preceded by the new record; a second write replaces the first, never appends."""
    path = tmp_path / "termination-log"
    path.write_bytes(b"x" * 5000)
    written = write_termination_message(path, exchange_refused(), budget=TERMINATION_MESSAGE_BUDGET)
    assert path.read_bytes() == encode(exchange_refused()).encode()
    assert written.size == len(path.read_bytes()) and not written.assets_dropped
    success = valid_record("success")
    write_termination_message(path, success, budget=TERMINATION_MESSAGE_BUDGET)
    assert path.read_bytes() == encode(success, budget=TERMINATION_MESSAGE_BUDGET).encode()
    assert decode(path.read_bytes(), expect=ATTEMPT) == success


def test_termination_message_keeps_its_budget_and_says_when_assets_were_dropped(tmp_path):
    path = tmp_path / "termination-log"
    events = [{"dest_asset_key": {"name": f"a{i}", "uri": f"s3://b/{i}"}, "extra": {}} for i in range(200)]
    record = valid_record("success", outlet_events=events)
    written = write_termination_message(path, record, budget=MIN_TERMINATION_MESSAGE_BUDGET)
    assert written.assets_dropped and written.size == len(path.read_bytes()) <= MIN_TERMINATION_MESSAGE_BUDGET
    got = decode(path.read_bytes(), expect=ATTEMPT)
    assert got.assets_dropped and got.payload["outlet_events"] == [] and got.state == "success"


def test_termination_message_is_created_when_missing_and_left_alone_when_the_record_cannot_fit(tmp_path):
    path = tmp_path / "termination-log"
    write_termination_message(path, heartbeat_lost(ATTEMPT), budget=TERMINATION_MESSAGE_BUDGET)
    assert decode(path.read_bytes()) == heartbeat_lost(ATTEMPT)
    with pytest.raises(RecordTooLarge):
        write_termination_message(path, valid_record("success"), budget=40)
    assert decode(path.read_bytes()) == heartbeat_lost(ATTEMPT)  # not truncated by a write that never happened
    with pytest.raises(OSError):
        write_termination_message(tmp_path / "missing" / "log", heartbeat_lost(ATTEMPT), budget=4096)
