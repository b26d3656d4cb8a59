"""The attempt timeline's pure shaping (leoflow_airflow.api.timeline) and the pools answer (issue 12 item 5).

The page and its authenticated API are tested end to end in a real browser in
tests/integration/test_ui_timeline.py; here, the decisions a user reads off the page: which events an attempt
shows, in which order, with which times, and what counts as a recovery or an override.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from leoflow_airflow.api.timeline import TryTimes, build_timeline, parse_ti_query
from leoflow_airflow.api.ui import pools
from leoflow_airflow.ledger.states import AttemptRef, AttemptState, Resolution
from leoflow_airflow.ledger.store import Attempt

T0 = datetime(2026, 12, 3, 9, 0, tzinfo=timezone.utc)
TI = "0199d8a0-0000-7000-8000-000000000001"


def _at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def _attempt(try_number: int, epoch: int, state: AttemptState, *, ti_id: str = TI, **kw) -> Attempt:
    base = dict(
        ref=AttemptRef(ti_id, try_number, epoch), dag_id="d", task_id="t", run_id="r", map_index=-1, state=state,
        runtime="lite", workload_json="{}", scheduler_job_id=1, host="node-1/boot", pid=None, proc_start_time=None,
        record_path=None, pod_name=None, pod_uid=None, reported_state=None, exit_status=None, resolution=None,
        detail=None, created_at=_at(epoch * 10), dispatched_at=None, reported_at=None, exited_at=None,
        closed_at=None, updated_at=_at(epoch * 10))
    base.update(kw)
    return Attempt(**base)


def test_a_redispatch_then_a_replay_read_as_two_epochs_with_their_evidence() -> None:
    """Epoch 1 died before /run and was re-dispatched; epoch 2's lost report was replayed from its record.
    Airflow's ``run`` goes on epoch 2 only; ``record`` carries the replayed body's end_date."""
    first = _attempt(1, 1, AttemptState.CLOSED, pid=101, dispatched_at=_at(11), exited_at=_at(12),
                     closed_at=_at(13), resolution=Resolution.REDISPATCHED, detail="its agent died before /run")
    second = _attempt(1, 2, AttemptState.CLOSED, pid=202, dispatched_at=_at(21), exited_at=_at(30), exit_status=-9,
                      closed_at=_at(31), resolution=Resolution.REPLAYED, record_path="/rec/2.json", detail="200")
    out = build_timeline([second, first], [TryTimes(1, _at(22), _at(29), "success")])

    assert [(a["attempt_epoch"], a["resolution"], a["evidence"]) for a in out] == [
        (1, "redispatched", "re-dispatch"), (2, "replayed", "replayed record")]
    assert [e["event"] for e in out[0]["events"]] == ["claim", "dispatch", "exit", "settle"]
    assert [e["event"] for e in out[1]["events"]] == ["claim", "dispatch", "run", "exit", "record", "settle"]
    by_name = {e["event"]: e for e in out[1]["events"]}
    assert by_name["run"]["time"] == _at(22).isoformat() and by_name["run"]["source"] == "airflow"
    assert by_name["record"]["time"] == _at(29).isoformat() and by_name["record"]["record_path"] == "/rec/2.json"
    assert by_name["dispatch"]["pid"] == 202 and by_name["dispatch"]["host"] == "node-1/boot"
    assert by_name["settle"]["evidence"] == "replayed record" and by_name["settle"]["epoch"] == 2
    assert all(e["try_number"] == 1 for a in out for e in a["events"])


def test_a_pod_attempt_names_its_pod_and_its_exchange() -> None:
    """A Kubernetes attempt shows its pod name and UID, and the token exchange with its credential id."""
    a = _attempt(2, 1, AttemptState.CLOSED, runtime="kubernetes", pod_name="lf-abc", pod_uid="uid-1",
                 dispatched_at=_at(1), exchanged_at=_at(2), exchange_credential_id="JTI=x", reported_at=_at(5),
                 reported_state="success", exited_at=_at(6), closed_at=_at(7), resolution=Resolution.REPORTED)
    events = build_timeline([a], [])[0]["events"]
    assert [e["event"] for e in events] == ["claim", "dispatch", "exchange", "report", "exit", "settle"]
    assert events[1]["pod_name"] == "lf-abc" and events[1]["pod_uid"] == "uid-1" and "pid" not in events[1]
    assert events[2]["credential_id"] == "JTI=x"
    assert events[-1]["evidence"] == "the agent's own terminal report"


def test_a_user_clear_is_an_override_and_an_open_settle_has_no_time() -> None:
    """RESTARTING (a user cleared the task) shows as ``override``; a SETTLING row's settle has no time yet."""
    cleared = _attempt(1, 1, AttemptState.CLOSED, dispatched_at=_at(1), closed_at=_at(9),
                       resolution=Resolution.RESTARTING)
    settling = _attempt(2, 1, AttemptState.SETTLING, ti_id="other", dispatched_at=_at(11), exited_at=_at(12),
                        detail="timeout")
    out = build_timeline([settling, cleared], [])
    assert out[0]["events"][-1]["event"] == "override" and out[0]["events"][-1]["evidence"] == "override"
    assert out[1]["events"][-1] == {"event": "settle", "time": None, "epoch": 1, "try_number": 2, "source": "ledger",
                                    "note": "a replay was sent and may have landed", "detail": "timeout"}
    assert out[1]["evidence"] is None


@pytest.mark.parametrize("raw,expected", [(None, -1), ("", -1), ("{MAP_INDEX}", -1), ("3", 3), (5, 5)])
def test_map_index_defaults_to_unmapped(raw, expected) -> None:
    """The Airflow UI leaves ``{MAP_INDEX}`` in the tab's URL for an unmapped task: read as -1."""
    assert parse_ti_query("d", "r", "t", raw) == ("d", "r", "t", expected)


@pytest.mark.parametrize("args,message", [((None, "r", "t", None), "dag_id"), (("d", "", "t", None), "run_id"),
                                          (("d", "r", None, None), "task_id"), (("d", "r", "t", "-2"), "map_index")])
def test_bad_queries_are_named(args, message) -> None:
    with pytest.raises(ValueError, match=message):
        parse_ti_query(*args)


def test_lite_pools_say_where_they_cannot_be_seen_and_kubernetes_pools_come_from_the_ledger() -> None:
    """Lite answers an empty list with the reason (nothing is made up); Kubernetes lists the warm pods registered
    in the ledger of its namespace, per DAG version."""
    lite = pools(lambda s, k, f: f)
    assert lite["runtime"] == "lite" and lite["pools"] == [] and "zygote" in lite["note"]
    asked = []
    conf = {"runtime": "kubernetes", "namespace": "tasks"}
    kube = pools(lambda s, k, f: conf.get(k, f), warm_rows=lambda ns: asked.append(ns) or [{"dag_id": "d"}])
    assert (kube["runtime"], kube["pools"], asked) == ("kubernetes", [{"dag_id": "d"}], ["tasks"])
    assert "leoflow_warm_worker" in kube["source"] and "not registered" in kube["note"]


def test_warm_pool_rows_count_ready_starting_and_busy_workers_per_version() -> None:
    from types import SimpleNamespace as W

    from leoflow_airflow.api.timeline import warm_pool_rows

    seen = datetime(2026, 1, 1, tzinfo=timezone.utc)
    workers = [W(dag_version_id="v2", state="idle", last_seen_at=seen, attempts_taken=3),
               W(dag_version_id="v2", state="idle", last_seen_at=None, attempts_taken=0),
               W(dag_version_id="v2", state="busy", last_seen_at=seen, attempts_taken=1),
               W(dag_version_id="v1", state="assigned", last_seen_at=seen, attempts_taken=0),
               W(dag_version_id="gone", state="idle", last_seen_at=seen, attempts_taken=0)]
    assert warm_pool_rows(workers, {"v1": "b_dag", "v2": "a_dag"}) == [
        {"dag_id": "a_dag", "dag_version_id": "v2", "ready": 1, "starting": 1, "busy": 1, "attempts_taken": 4},
        {"dag_id": "b_dag", "dag_version_id": "v1", "ready": 0, "starting": 0, "busy": 1, "attempts_taken": 0},
        {"dag_id": "gone", "dag_version_id": "gone", "ready": 1, "starting": 0, "busy": 0, "attempts_taken": 0},
    ]
