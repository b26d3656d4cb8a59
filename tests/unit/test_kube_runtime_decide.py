"""The Kubernetes runtime's pure decisions (``runtime/kubernetes/decide.py``): a pod create's answer → the
lifecycle's event, the back-off window ``admit()`` answers from, presence from the cache and a confirming read,
and the settled-pod retention."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

import pytest

from leoflow_airflow.dispatch.disposition import Disposition
from leoflow_airflow.ledger.states import AttemptRef
from leoflow_airflow.lifecycle.runtime import LaunchFailed, Presence, Started
from leoflow_airflow.runtime.kubernetes import decide
from leoflow_airflow.runtime.kubernetes.classify import CreateReply, Verdict, VerdictKind, classify_create
from leoflow_airflow.runtime.kubernetes.decide import CreateResult, CreateWindow, Lookup, create_event

NAME = "dag-task-0190b6c2000070008000000000000001-1"
REF = AttemptRef("0190b6c2-0000-7000-8000-000000000001", 1, 1)


def status(code: int, message: str, reason: str = "", name: str = "") -> str:
    import json

    return json.dumps({"kind": "Status", "code": code, "message": message, "reason": reason,
                       "details": {"name": name, "kind": "pods"}})


def verdict(code: int, body: str = "", headers: dict | None = None) -> Verdict:
    return classify_create(CreateReply(code, body, headers), pod_name=NAME)


# --- create → event ---------------------------------------------------------------------------------------

def test_a_created_pod_is_started_with_its_name_and_uid():
    event = create_event(CreateResult("L", NAME, verdict(201), uid="u-1"))
    assert event == Started("L", {"pod_name": NAME, "pod_uid": "u-1"})


@pytest.mark.parametrize(("code", "body"), [
    (429, status(429, "Too many requests, please try again later.")),
    (403, status(403, 'pods "x" is forbidden: exceeded quota: q, requested: pods=1, used: pods=3, limited: pods=3')),
    (403, status(403, "status unknown for quota: q, resources: pods")),
])
def test_backpressure_is_retried_never_failed(code, body):
    event = create_event(CreateResult("L", NAME, verdict(code, body)))
    assert isinstance(event, LaunchFailed) and event.retryable and "backpressure" in event.error


@pytest.mark.parametrize(("code", "body", "says"), [
    (403, status(403, 'pods "x" is forbidden: violates PodSecurity "restricted:latest": privileged'), "PodSecurity"),
    (403, status(403, 'pods is forbidden: User "u" cannot create resource "pods"'), "cannot create"),
    (422, status(422, "Pod \"x\" is invalid: spec.containers[0].image: Required value"), "Required value"),
])
def test_refused_fails_at_once_with_the_api_servers_reason(code, body, says):
    event = create_event(CreateResult("L", NAME, verdict(code, body)))
    assert isinstance(event, LaunchFailed) and not event.retryable and says in event.error


def test_a_409_on_our_name_is_settled_by_the_read():
    conflict = verdict(409, status(409, f'pods "{NAME}" already exists', "AlreadyExists", NAME))
    assert conflict.kind is VerdictKind.CHECK_EXISTING
    ours = create_event(CreateResult("L", NAME, conflict, uid="u-old", lookup=Lookup.OURS))
    assert ours == Started("L", {"pod_name": NAME, "pod_uid": "u-old"})
    other = create_event(CreateResult("L", NAME, conflict, lookup=Lookup.OTHER, detail="names attempt x/1/1"))
    assert isinstance(other, LaunchFailed) and not other.retryable and "names attempt x/1/1" in other.error
    gone = create_event(CreateResult("L", NAME, conflict, lookup=Lookup.ABSENT))
    assert isinstance(gone, LaunchFailed) and gone.retryable
    unread = create_event(CreateResult("L", NAME, conflict))  # no read: counts as a failed one
    assert isinstance(unread, LaunchFailed) and unread.retryable


def test_a_transport_error_is_deferred_unless_the_read_finds_our_pod():
    timeout = Verdict(VerdictKind.DEFERRED, "ReadTimeoutError: read timed out")
    landed = create_event(CreateResult("L", NAME, timeout, uid="u-2", lookup=Lookup.OURS))
    assert landed == Started("L", {"pod_name": NAME, "pod_uid": "u-2"})
    for lookup in (Lookup.ABSENT, Lookup.FAILED):
        event = create_event(CreateResult("L", NAME, timeout, lookup=lookup, detail="connection refused"))
        assert isinstance(event, LaunchFailed) and event.retryable and "deferred" in event.error


# --- the back-off window ------------------------------------------------------------------------------------

def test_retry_after_closes_the_window_as_backpressure_for_that_long():
    window = CreateWindow()
    assert window.admit(100.0) is None
    window.note(verdict(429, status(429, "slow down"), {"Retry-After": "7"}), now=100.0)
    closed = window.admit(106.9)
    assert closed is not None and closed.disposition is Disposition.BACKPRESSURE and "slow down" in closed.reason
    assert window.admit(107.0) is None


def test_backoff_doubles_per_answer_in_a_row_and_a_landed_create_reopens_it():
    window = CreateWindow()
    deferred = Verdict(VerdictKind.DEFERRED, "HTTP 503")
    waits = []
    for i in range(7):
        window.note(deferred, now=float(i * 1000))
        waits.append(window.until - i * 1000)
    assert waits == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    assert window.admit(6000.5).disposition is Disposition.DEFERRED
    window.note(Verdict(VerdictKind.DISPATCHED), now=6000.5)
    assert window.admit(6000.5) is None
    window.note(deferred, now=7000.0)
    assert window.until == 7001.0  # the streak starts over


def test_refused_and_409_leave_the_window_alone_and_retry_after_is_capped():
    window = CreateWindow()
    window.note(Verdict(VerdictKind.REFUSED, "violates PodSecurity"), now=0.0)
    window.note(Verdict(VerdictKind.CHECK_EXISTING, "exists"), now=0.0)
    assert window.admit(0.0) is None
    window.note(Verdict(VerdictKind.BACKPRESSURE, "quota", retry_after=10**6), now=0.0)
    assert window.until == decide.RETRY_AFTER_MAX_SECONDS


# --- presence -------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class View:
    uid: str
    ref: AttemptRef | None
    terminal: bool = False
    deleting: bool = False
    node_name: str | None = "node-1"
    deletion_grace: int | None = None
    agent: object | None = None  # the agent container's terminated state (status.ContainerEnd)


@dataclass(frozen=True)
class Read:
    at: float
    view: View | None


def presence(cached, read, *, uid="u1", now=100.0):
    return decide.presence(cached, read, uid=uid, ref=REF, now=now, read_reuse=10.0)


def test_the_cache_says_live_or_terminal():
    assert presence(View("u1", REF), None)[::2] == (Presence.LIVE, False)
    assert presence(View("u1", REF, terminal=True), None)[::2] == (Presence.GONE, False)
    assert presence(View("u1", REF), None, uid=None)[0] is Presence.LIVE  # no UID yet: by identity


def test_an_ended_agent_container_is_proof_of_death_while_a_sidecar_keeps_the_pod_running():
    """k8s review §12: Istio's proxy or a logging sidecar keeps the pod ``Running`` after the agent reported and
    exited; the kubelet's ``terminated`` state of the agent container ends the attempt (its slot is freed and its
    record read), whatever the phase and however fresh the heartbeat that ended with it."""
    ended = View("u1", REF, terminal=False, agent=object())
    assert decide.presence(ended, None, uid="u1", ref=REF, now=100.0, read_reuse=10.0, heartbeat_age=1.0,
                           silent_after=120.0)[0] is Presence.GONE
    assert presence(View("u1", REF, terminal=False), None)[0] is Presence.LIVE


def test_absence_from_the_cache_is_unknown_until_a_read_confirms_it():
    assert presence(None, None) == (Presence.UNKNOWN, None, True)
    assert presence(View("u-new", REF), None) == (Presence.UNKNOWN, None, True)  # the name holds another UID
    assert presence(None, Read(99.0, None))[::2] == (Presence.GONE, False)  # 404
    assert presence(None, Read(0.0, View("u-new", REF)))[::2] == (Presence.GONE, False)  # another UID, for good


def test_a_read_that_found_the_pod_is_reused_then_renewed():
    alive = View("u1", REF)
    assert presence(None, Read(95.0, alive))[::2] == (Presence.LIVE, False)
    assert presence(None, Read(80.0, alive))[::2] == (Presence.LIVE, True)
    assert presence(None, Read(80.0, View("u1", REF, terminal=True)))[::2] == (Presence.GONE, False)


def test_without_a_uid_a_404_holds_only_while_fresh():
    assert presence(None, Read(95.0, None), uid=None)[::2] == (Presence.GONE, False)
    assert presence(None, Read(50.0, None), uid=None) == (Presence.UNKNOWN, None, True)


# --- retention --------------------------------------------------------------------------------------------------

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)


@pytest.mark.parametrize(("phase", "finished", "after", "due"), [
    ("Succeeded", "2026-12-01T12:00:00Z", 59, False),
    ("Succeeded", "2026-12-01T12:00:00Z", 60, True),
    ("Failed", "2026-12-01T12:00:00Z", 60, False),
    ("Failed", T0, 3600, True),
    ("Failed", None, 3600, True),  # no end time: from when it was first seen terminal
    ("Succeeded", "not a time", 59, False),
])
def test_retention_counts_from_the_end_by_phase(phase, finished, after, due):
    assert decide.retention_due(phase=phase, finished_at=finished, first_seen_terminal=T0,
                                now=T0 + timedelta(seconds=after), success_seconds=60,
                                failure_seconds=3600) is due


def test_zero_retention_deletes_at_once():
    assert decide.retention_due(phase="Succeeded", finished_at=T0, first_seen_terminal=T0, now=T0,
                                success_seconds=0, failure_seconds=0)


# --- the confirmation valve (issue 10 item 3) ------------------------------------------------------------------

def test_a_deleted_pod_should_stop_by_its_grace_and_a_second_delete_only_shortens_it():
    deleting = View("u1", REF, deleting=True, deletion_grace=30)
    assert decide.deletion_deadline(View("u1", REF), seen=100.0, earlier=None) is None  # not being deleted
    assert decide.deletion_deadline(View("u1", REF, terminal=True, deleting=True), seen=100.0, earlier=None) is None
    assert decide.deletion_deadline(deleting, seen=100.0, earlier=None) == 130.0
    assert decide.deletion_deadline(deleting, seen=110.0, earlier=130.0) == 130.0  # seen again: the first stands
    forced = View("u1", REF, deleting=True, deletion_grace=0)  # escalated to a grace-0 delete
    assert decide.deletion_deadline(forced, seen=105.0, earlier=130.0) == 105.0
    assert decide.deletion_deadline(View("u1", REF, deleting=True), seen=100.0, earlier=None) == 100.0


@pytest.mark.parametrize("now, valve, opened", [
    (159.9, 60.0, False),  # within the valve: wait for the terminated status and its record
    (160.0, 60.0, True),
    (10_000.0, 0.0, False),  # 0: wait for ever
])
def test_the_valve_opens_its_length_past_the_deadline(now, valve, opened):
    assert decide.valve_open(100.0, now=now, valve=valve) is opened
    assert decide.valve_open(None, now=now, valve=valve) is False  # nothing deleted: nothing to confirm


def test_a_fresh_heartbeat_keeps_the_valve_shut_and_a_missing_pod_live():
    """k8s review §14: the valve opens only once the TI's heartbeat is silent past ``silent_after`` (``[leoflow]
    agent_lost_threshold``) or unknown; a pod gone from the API server (404) is GONE only then, too."""
    assert decide.valve_open(100.0, now=200.0, valve=60.0, heartbeat_age=3.0, silent_after=120.0) is False
    assert decide.valve_open(100.0, now=200.0, valve=60.0, heartbeat_age=121.0, silent_after=120.0) is True
    assert decide.valve_open(100.0, now=200.0, valve=60.0, heartbeat_age=None, silent_after=120.0) is True
    fresh = {"heartbeat_age": 3.0, "silent_after": 120.0}
    assert decide.presence(None, Read(99.0, None), uid="u1", ref=REF, now=100.0, read_reuse=10.0,
                           **fresh)[0] is Presence.LIVE
    never_bound = View("u1", REF, deleting=True, node_name=None)
    assert decide.presence(never_bound, None, uid="u1", ref=REF, now=100.0, read_reuse=10.0,
                           **fresh)[0] is Presence.GONE  # it never ran: no heartbeat of it can be fresh
