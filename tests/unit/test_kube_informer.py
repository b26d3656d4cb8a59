"""How the pod informer applies watch-stream lines to its cache (issue 9 item 5), without a server: the event
types, the 410 ERROR event that must lead to a relist, bookmarks, tombstones and their expiry.

The informer against a real kube-apiserver (LIST + WATCH, a forced 410, the label selector) is
``tests/k8s/test_informer.py``; these tests only feed it lines as the apiserver writes them.
"""

from __future__ import annotations

import json

import pytest
from kubernetes import client

from leoflow_airflow.runtime.kubernetes import informer as informer_module
from leoflow_airflow.runtime.kubernetes.informer import PodInformer


def pod(name: str, uid: str, rv: str, phase: str = "Running", message: str | None = None) -> dict:
    """A pod object as a watch event carries it."""
    state = {"running": {}} if message is None else {"terminated": {"exitCode": 0, "reason": "Completed",
                                                                    "message": message}}
    return {"metadata": {"name": name, "uid": uid, "namespace": "ns", "resourceVersion": rv},
            "status": {"phase": phase, "containerStatuses": [{"name": "base", "state": state}]}}


def line(kind: str, obj: dict) -> bytes:
    """One watch event line."""
    return json.dumps({"type": kind, "object": obj}).encode()


@pytest.fixture
def inf() -> PodInformer:
    """An informer never started (no request is ever sent), counting its on_event wake-ups in ``woken``."""
    woken: list[int] = []
    i = PodInformer(client.ApiClient(client.Configuration()), "ns", "a=b", on_event=lambda: woken.append(1))
    i.woken = woken  # type: ignore[attr-defined]
    return i


def test_added_modified_deleted_and_tombstone(inf):
    assert inf._apply_line(line("ADDED", pod("p", "u1", "10"))) == 1
    assert inf._apply_line(line("MODIFIED", pod("p", "u1", "11", "Succeeded", "rec"))) == 1
    assert inf.get("p").phase == "Succeeded" and inf.resource_version == "11"
    assert inf._apply_line(line("DELETED", pod("p", "u1", "12", "Succeeded", "rec"))) == 1
    assert inf.get("p") is None and inf.views() == []
    tomb = inf.tombstone("p", "u1")
    assert tomb.phase == "Succeeded" and tomb.agent.message == "rec"
    assert inf.tombstone("p", "u2") is None
    assert (inf.events, len(inf.woken), inf.resource_version) == (3, 3, "12")


def test_a_pod_recreated_under_its_name_keeps_the_old_one_as_tombstone(inf):
    inf._apply_line(line("ADDED", pod("p", "u1", "10", "Failed")))
    inf._apply_line(line("ADDED", pod("p", "u2", "13")))
    assert inf.get("p").uid == "u2" and inf.tombstone("p", "u1").phase == "Failed"
    inf._apply_line(line("DELETED", pod("p", "u1", "14", "Failed")))  # a late DELETED of the old UID
    assert inf.get("p").uid == "u2"


def test_bookmark_only_advances_the_resource_version(inf):
    assert inf._apply_line(line("BOOKMARK", {"kind": "Pod", "metadata": {"resourceVersion": "99"}})) == 0
    assert (inf.resource_version, inf.events, inf.views(), inf.woken) == ("99", 0, [], [])


def test_error_410_event_means_gone_and_other_errors_and_garbage_are_stream_errors(inf):
    with pytest.raises(informer_module._Gone):
        inf._apply_line(line("ERROR", {"kind": "Status", "code": 410, "reason": "Expired",
                                       "message": "too old resource version: 5 (20)"}))
    with pytest.raises(informer_module._StreamError, match="500"):
        inf._apply_line(line("ERROR", {"kind": "Status", "code": 500, "reason": "InternalError"}))
    for bad in (b"not json", b"[]", b'{"type": "ADDED"}', b'{"type": "ADDED", "object": 3}'):
        with pytest.raises(informer_module._StreamError):
            inf._apply_line(bad)
    assert inf.events == 0


def test_malformed_pod_in_an_event_advances_the_version_but_changes_nothing(inf):
    assert inf._apply_line(line("ADDED", {"metadata": {"name": "p", "resourceVersion": "7"}})) == 0
    assert (inf.resource_version, inf.views(), inf.events) == ("7", [], 0)


def test_tombstones_expire(inf, monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(informer_module.time, "monotonic", lambda: now[0])
    inf._apply_line(line("DELETED", pod("p", "u1", "3", "Failed")))
    now[0] += 599
    assert inf.tombstone("p", "u1") is not None
    now[0] += 2
    assert inf.tombstone("p", "u1") is None


def test_backoff_doubles_is_capped_and_jittered(inf):
    for failures, top in ((1, 0.5), (2, 1.0), (3, 2.0), (10, 10.0), (10_000, 10.0)):
        for _ in range(20):
            assert top / 2 <= inf._backoff(failures) <= top


def test_take_changed_names_what_events_touched_and_all_after_a_list(inf, monkeypatch):
    """What ``poll()`` re-examines (issue 10, "Benchmark": a loop's cost follows what changed): None (anything)
    after a LIST, then exactly the pods events added, modified or deleted since the last call."""
    page = {"metadata": {"resourceVersion": "5"}, "items": [pod("a", "ua", "4"), pod("b", "ub", "5")]}
    monkeypatch.setattr(inf, "_list_page", lambda token: page)
    inf._list()
    assert inf.take_changed() is None
    assert inf.take_changed() == set()
    inf._apply_line(line("MODIFIED", pod("a", "ua", "6", "Succeeded", "rec")))
    inf._apply_line(line("ADDED", pod("c", "uc", "7")))
    inf._apply_line(line("DELETED", pod("b", "ub", "8", "Failed")))
    inf._apply_line(line("BOOKMARK", {"kind": "Pod", "metadata": {"resourceVersion": "9"}}))
    assert inf.take_changed() == {"a", "b", "c"}
    assert inf.take_changed() == set()
    inf._list()  # a relist (after a 410): any pod may have changed
    assert inf.take_changed() is None


def _same_as_a_scan(inf: PodInformer) -> None:
    """The indexes answer what a scan of every cached view would."""
    views = inf.views()
    assert sorted(v.name for v in inf.ending()) == sorted(v.name for v in views if v.terminal or v.deleting)
    for uid in {v.uid for v in views} | {"u-none"}:
        assert inf.has_uid(uid) == any(v.uid == uid for v in views)


def test_ending_and_has_uid_follow_events_and_lists_as_a_scan_would(inf, monkeypatch):
    """What ``collect`` walks (issue 10, "Benchmark": its cost follows the ended pods, not every running one):
    the terminal or deleting views, kept by each event and LIST; a recreated name and a late DELETED of an old
    UID leave the index right."""
    deleting = pod("d", "ud", "3")
    deleting["metadata"]["deletionTimestamp"] = "2026-12-02T00:00:00Z"
    page = {"metadata": {"resourceVersion": "5"}, "items": [pod("a", "ua", "4"), pod("b", "ub", "5", "Failed"),
                                                            deleting]}
    monkeypatch.setattr(inf, "_list_page", lambda token: page)
    inf._list()
    assert sorted(v.name for v in inf.ending()) == ["b", "d"]
    _same_as_a_scan(inf)
    inf._apply_line(line("MODIFIED", pod("a", "ua", "6", "Succeeded", "rec")))
    assert "a" in {v.name for v in inf.ending()}
    inf._apply_line(line("ADDED", pod("b", "ub2", "7")))  # recreated under its name, running
    assert "b" not in {v.name for v in inf.ending()} and not inf.has_uid("ub") and inf.has_uid("ub2")
    inf._apply_line(line("DELETED", pod("b", "ub", "8", "Failed")))  # a late DELETED of the old UID
    assert inf.has_uid("ub2")
    inf._apply_line(line("DELETED", pod("a", "ua", "9", "Succeeded", "rec")))
    assert not inf.has_uid("ua")
    _same_as_a_scan(inf)
    page = {"metadata": {"resourceVersion": "10"}, "items": [pod("b", "ub2", "10", "Failed")]}
    inf._list()  # a relist replaces both indexes
    assert [v.name for v in inf.ending()] == ["b"] and not inf.has_uid("ud")
    _same_as_a_scan(inf)
