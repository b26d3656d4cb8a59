"""Issue 33 item 11: where an ended attempt's pod log is kept (:mod:`leoflow_airflow.runtime.kubernetes.logsalvage`),
the pure decisions. The end-to-end case (a real Airflow, the node harness, a lost upload) is
``tests/integration/test_kube_task_logs.py``."""

from __future__ import annotations

import json
from datetime import datetime, timezone

from leoflow_airflow.ledger.states import AttemptRef
from leoflow_airflow.runtime.kubernetes.logsalvage import (
    HEADER_PREFIX,
    Place,
    salvage_place,
    salvage_target,
    salvaged_text,
)

REF = AttemptRef(ti_id="0199aaaa-0000-7000-8000-000000000001", try_number=2, attempt_epoch=3)


def test_a_remote_store_gets_the_log_only_when_it_has_none_and_could_be_read():
    assert salvage_place(remote_logging=True, remote_has_log=False) is Place.REMOTE
    assert salvage_place(remote_logging=True, remote_has_log=True) is None
    assert salvage_place(remote_logging=True, remote_has_log=None) is None  # never blind


def test_without_remote_logging_nothing_is_kept():
    """The api-server reads its own folder: a copy on the scheduler's disk would only fill that disk."""
    for has in (None, False, True):
        assert salvage_place(remote_logging=False, remote_has_log=has) is None


def test_the_target_is_the_workloads_log_path_and_ti():
    ti = {"id": REF.ti_id, "dag_id": "d", "task_id": "t", "run_id": "r", "try_number": 2, "map_index": -1}
    target = salvage_target(json.dumps({"type": "ExecuteTask", "log_path": "dag_id=d/attempt=2.log", "ti": ti}))
    assert target is not None and target.log_path == "dag_id=d/attempt=2.log" and target.ti == ti


def test_a_workload_without_a_safe_log_path_keeps_nothing():
    ti = {"task_id": "t"}
    for raw in (None, "", "not json", "[]", json.dumps({"ti": ti}), json.dumps({"log_path": "x.log"}),
                json.dumps({"log_path": "/etc/passwd", "ti": ti}), json.dumps({"log_path": "../../x.log", "ti": ti}),
                json.dumps({"log_path": "", "ti": ti})):
        assert salvage_target(raw) is None, raw


def test_the_kept_text_names_the_pod_and_the_attempt_first():
    now = datetime(2026, 12, 7, 10, 0, tzinfo=timezone.utc)
    text = salvaged_text(namespace="tasks", pod="p-1", container="base", ref=REF, text="a\nb", now=now)
    head, rest = text.split("\n", 1)
    assert head.startswith(HEADER_PREFIX + "tasks/p-1 (container base) at 2026-12-07T10:00:00+00:00")
    assert "try 2 epoch 3" in head
    assert rest == "a\nb\n"
