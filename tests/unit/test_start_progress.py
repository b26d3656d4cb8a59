"""Dispatch-lost for pods (issue 10 item 1): where the dispatch-lost clock starts, and what a pod that has not
started its agent means, as pure decisions and through the lifecycle.

* ``runtime/kubernetes/status.py``: what a pod's JSON says of its agent container's start and its scheduling;
* ``runtime/kubernetes/decide.py`` :func:`start_progress`: every row of its table (running, still starting,
  pulling, unschedulable within and past ``[leoflow] pod_unschedulable_timeout``, each stuck reason);
* ``reap/lost.py`` :func:`decide`: the reaper's answer to each start state, and Lite (no start progress)
  exactly as before;
* the lifecycle over ``FakeRuntime``: a rejected start fails the TI with its reason (task log and Log row), a
  pod with no room is re-offered as backpressure without spending ``redispatch_limit``.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from leoflow_airflow import ladder
from leoflow_airflow import settings as leoflow_settings
from leoflow_airflow.ledger.states import AttemptRef, AttemptState, Resolution
from leoflow_airflow.lifecycle.actions import Fail, Reoffer, TaskEvent
from leoflow_airflow.lifecycle.runtime import Presence, StartProgress, StartState
from leoflow_airflow.reap.lost import After, AttemptView, ReapSettings, decide
from leoflow_airflow.runtime.kubernetes.decide import IMAGE_PULL_GRACE_SECONDS, start_key, start_progress
from leoflow_airflow.runtime.kubernetes.status import pod_view
from test_lifecycle import World

NOW = datetime(2026, 12, 1, 10, 10, tzinfo=timezone.utc)
SEEN = datetime(2026, 12, 1, 10, 9, tzinfo=timezone.utc)
REF = AttemptRef("0190b6c2-7a1e-7000-8000-00000000abcd", 1, 1)
IMAGE = "registry.example/leoflow:big"


def pod(*, node: str | None = "node-a", phase: str = "Pending", state: dict | None = None,
        conditions: list | None = None, deleting: bool = False) -> dict:
    """A task pod as the API serves it: its agent container ``base`` in ``state`` (None: no status yet)."""
    meta = {"name": "p-1", "namespace": "ns", "uid": "u-1", "resourceVersion": "1"}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-01T10:09:30Z"
    status: dict = {"phase": phase, "conditions": conditions or []}
    if state is not None:
        status["containerStatuses"] = [{"name": "base", "image": IMAGE, "imageID": "", "ready": False,
                                        "restartCount": 0, "state": state}]
    spec: dict = {"restartPolicy": "Never", "containers": [{"name": "base", "image": IMAGE}]}
    if node is not None:
        spec["nodeName"] = node
        status["startTime"] = "2026-12-01T10:00:01Z"
    return {"metadata": meta, "spec": spec, "status": status}


def waiting(reason: str, message: str = "") -> dict:
    return {"waiting": {"reason": reason, **({"message": message} if message else {})}}


UNSCHEDULABLE = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                  "message": "0/3 nodes are available: 3 Insufficient memory.",
                  "lastTransitionTime": "2026-12-01T10:02:00Z"}]


def progress(obj: dict, timeout: float = 300) -> StartProgress:
    view = pod_view(obj)
    assert view is not None
    return start_progress(view, first_seen=SEEN, unschedulable_timeout=timeout)


# --- what the pod's status says ----------------------------------------------------------------------------

def test_the_view_reads_the_agent_containers_start_its_image_and_the_unschedulable_condition():
    v = pod_view(pod(phase="Running", state={"running": {"startedAt": "2026-12-01T10:05:00Z"}}))
    assert v.agent_running and v.agent_started_at == datetime(2026, 12, 1, 10, 5, tzinfo=timezone.utc)
    assert v.agent_image == IMAGE and v.unschedulable is None
    v = pod_view(pod(node=None, conditions=UNSCHEDULABLE))
    assert not v.agent_running and v.agent_started_at is None
    assert v.unschedulable == "0/3 nodes are available: 3 Insufficient memory."
    assert v.unschedulable_since == datetime(2026, 12, 1, 10, 2, tzinfo=timezone.utc)
    scheduled = [{"type": "PodScheduled", "status": "True", "lastTransitionTime": "2026-12-01T10:02:00Z"}]
    assert pod_view(pod(conditions=scheduled)).unschedulable is None


# --- start_progress: every row -----------------------------------------------------------------------------

def test_a_running_agent_container_starts_the_clock_at_its_started_at():
    p = progress(pod(phase="Running", state={"running": {"startedAt": "2026-12-01T10:05:00Z"}}))
    assert (p.state, p.since) == (StartState.STARTED, datetime(2026, 12, 1, 10, 5, tzinfo=timezone.utc))
    p = progress(pod(phase="Running", state={"running": {}}))  # no startedAt: the pod's startTime
    assert (p.state, p.since) == (StartState.STARTED, datetime(2026, 12, 1, 10, 0, 1, tzinfo=timezone.utc))


@pytest.mark.parametrize("obj, shows", [
    (pod(node=None), "not scheduled yet"),                                  # no scheduler has taken it yet
    (pod(), "scheduled"),                                                   # bound, no container status yet
    (pod(state=waiting("ContainerCreating")), "waiting ContainerCreating"),  # the image is being pulled
    (pod(state=waiting("PodInitializing")), "waiting PodInitializing"),
    (pod(node=None, conditions=UNSCHEDULABLE, deleting=True), "not scheduled yet"),  # deleting: its end settles
    (pod(state=waiting("ErrImagePull", "nope"), deleting=True), "waiting ErrImagePull"),
], ids=["unbound", "scheduled", "pulling", "initializing", "deleting-unschedulable", "deleting-stuck"])
def test_a_pod_still_being_started_is_progress(obj, shows):
    p = progress(obj)
    assert p.state is StartState.STARTING and p.until is None and shows in p.reason


def test_an_image_pull_failure_is_rejected_after_a_short_grace_naming_the_image_and_the_kubelets_message():
    said = f'failed to pull and unpack image "{IMAGE}": not found'
    for reason in ("ErrImagePull", "ImagePullBackOff"):
        p = progress(pod(state=waiting(reason, said)))
        assert p.state is StartState.REJECTED
        assert (p.since, p.until) == (SEEN, SEEN + timedelta(seconds=IMAGE_PULL_GRACE_SECONDS))
        assert p.reason == f'image "{IMAGE}" cannot be pulled: {said} ({reason}, pod p-1)'
    # the kubelet alternates the two while it backs off: one step, so its first-seen time holds
    assert start_key(pod_view(pod(state=waiting("ErrImagePull")))) == \
        start_key(pod_view(pod(state=waiting("ImagePullBackOff"))))


@pytest.mark.parametrize("reason, what", [
    ("InvalidImageName", f'image "{IMAGE}" is not a valid image name'),
    ("CreateContainerConfigError", "container base cannot be configured"),
    ("CreateContainerError", "container base cannot be created"),
])
def test_a_container_that_can_never_start_is_rejected_at_once(reason, what):
    p = progress(pod(state=waiting(reason, 'secret "db" not found')))
    assert (p.state, p.until) == (StartState.REJECTED, None)
    assert p.reason == f'{what}: secret "db" not found ({reason}, pod p-1)'


def test_an_unschedulable_pod_waits_as_backpressure_within_its_bound():
    p = progress(pod(node=None, conditions=UNSCHEDULABLE), timeout=300)
    since = datetime(2026, 12, 1, 10, 2, tzinfo=timezone.utc)  # the condition's lastTransitionTime
    assert (p.state, p.since, p.until) == (StartState.NO_ROOM, since, since + timedelta(seconds=300))
    assert "0/3 nodes are available: 3 Insufficient memory." in p.reason and "pod p-1" in p.reason
    assert progress(pod(node=None, conditions=UNSCHEDULABLE), timeout=0).until is None  # 0: no bound


# --- the reaper --------------------------------------------------------------------------------------------

SETTINGS = ReapSettings(agent_lost_threshold=120, dispatch_lost_threshold=120)


def queued(start: StartProgress | None, *, dispatched_age: float = 3600, presence=Presence.LIVE) -> AttemptView:
    return AttemptView(ref=REF, presence=presence, ti_state="queued", last_heartbeat_at=None,
                       dispatched_at=NOW - timedelta(seconds=dispatched_age), start=start)


def test_lite_keeps_its_clock_at_the_dispatch():
    """No start progress (Lite): killed 120 s after the dispatch, as before."""
    [kill] = decide([queued(None, dispatched_age=121)], NOW, SETTINGS)
    assert (kill.reaper, kill.after) == ("dispatch-lost", After.SETTLE) and "after dispatch" in kill.why
    assert decide([queued(None, dispatched_age=119)], NOW, SETTINGS) == []


def test_the_clock_starts_when_the_agent_runs_not_at_the_dispatch():
    started = StartProgress(StartState.STARTED, since=NOW - timedelta(seconds=119))
    assert decide([queued(started, dispatched_age=3600)], NOW, SETTINGS) == []
    started = StartProgress(StartState.STARTED, since=NOW - timedelta(seconds=121))
    [kill] = decide([queued(started)], NOW, SETTINGS)
    assert (kill.reaper, kill.after) == ("dispatch-lost", After.SETTLE) and "after its agent started" in kill.why


def test_a_slow_start_is_never_dispatch_lost():
    assert decide([queued(StartProgress(StartState.STARTING, since=NOW - timedelta(hours=1)))], NOW, SETTINGS) == []


def test_no_room_waits_within_its_bound_then_is_reoffered_as_backpressure():
    within = StartProgress(StartState.NO_ROOM, since=NOW - timedelta(seconds=299), until=NOW + timedelta(seconds=1),
                           reason="pod p-1 is unschedulable: 0/3 nodes")
    assert decide([queued(within)], NOW, SETTINGS) == []
    past = StartProgress(StartState.NO_ROOM, since=NOW - timedelta(seconds=301), until=NOW - timedelta(seconds=1),
                         reason="pod p-1 is unschedulable: 0/3 nodes")
    [kill] = decide([queued(past)], NOW, SETTINGS)
    assert (kill.reaper, kill.after) == ("start-backpressure", After.BACKPRESSURE)
    assert kill.why == "no room to start it for 301 s: pod p-1 is unschedulable: 0/3 nodes; re-offered as backpressure"
    unbounded = StartProgress(StartState.NO_ROOM, since=NOW - timedelta(days=1), reason="x")
    assert decide([queued(unbounded)], NOW, SETTINGS) == []


def test_a_rejected_start_is_killed_once_its_grace_passed_with_its_reason():
    grace = StartProgress(StartState.REJECTED, since=NOW, until=NOW + timedelta(seconds=60), reason='image "x" …')
    assert decide([queued(grace)], NOW, SETTINGS) == []
    for until in (NOW, None):
        rejected = StartProgress(StartState.REJECTED, since=NOW, until=until, reason='image "x" cannot be pulled: 404')
        [kill] = decide([queued(rejected)], NOW, SETTINGS)
        assert (kill.reaper, kill.why, kill.after) == ("start-rejected", 'image "x" cannot be pulled: 404', After.REJECT)


def test_only_a_live_queued_attempt_is_judged_by_its_start():
    rejected = StartProgress(StartState.REJECTED, reason="r")
    assert decide([queued(rejected, presence=Presence.UNKNOWN)], NOW, SETTINGS) == []
    assert decide([queued(rejected, presence=Presence.GONE)], NOW, SETTINGS) == []
    running = AttemptView(ref=REF, presence=Presence.LIVE, ti_state="running", last_heartbeat_at=NOW,
                          dispatched_at=NOW - timedelta(hours=1), start=rejected)
    assert decide([running], NOW, SETTINGS) == []


# --- through the lifecycle ---------------------------------------------------------------------------------

def test_a_rejected_start_fails_the_ti_with_its_reason_in_the_task_log_and_a_log_row(tmp_path):
    world = World(tmp_path)
    w, ref = world.dispatched()
    world.life.take()
    reason = f'image "{IMAGE}" cannot be pulled: not found (ErrImagePull, pod p-1)'
    world.runtime.progress[ref] = StartProgress(StartState.REJECTED, reason=reason)
    actions = world.life.cycle()
    assert (world.runtime.killed, world.runtime.kill_graces) == ([ref], [0.0])
    assert [(a.event, a.extra) for a in actions if isinstance(a, TaskEvent)] == [("leoflow start-rejected", reason)]
    assert not [a for a in actions if isinstance(a, Fail)]  # not before its pod is gone
    actions = world.exit(ref, code=None)
    assert [a for a in actions if isinstance(a, Fail)] == [Fail(w.key, reason, log_path="x.log")]
    assert not [a for a in actions if isinstance(a, Reoffer)]
    row = world.row(ref)
    assert (row.state, row.resolution, row.detail) == (AttemptState.CLOSED, Resolution.EXECUTOR_FAILED, reason)
    assert world.airflow.redrives == []


def test_no_room_is_reoffered_as_backpressure_spending_no_redispatch(tmp_path):
    world = World(tmp_path, redispatch_limit="0")  # a re-dispatch would fail it at once
    w, ref = world.dispatched()
    world.life.take()
    world.runtime.progress[ref] = StartProgress(StartState.NO_ROOM, until=world.clock.utcnow(), reason="0/3 nodes")
    world.life.cycle()
    assert world.runtime.kill_graces == [0.0]
    actions = world.exit(ref, code=None)
    assert [a for a in actions if isinstance(a, Reoffer)] == [Reoffer(w.key, w)]
    assert not [a for a in actions if isinstance(a, Fail)]
    assert world.row(ref).resolution == Resolution.LAUNCH_FAILED


def test_a_slow_start_outlives_dispatch_lost_threshold_and_lite_is_unchanged(tmp_path):
    world = World(tmp_path, dispatch_lost_threshold="60")
    _, slow = world.dispatched()
    _, lite = world.dispatched()
    world.runtime.progress[slow] = StartProgress(StartState.STARTING, reason="pulling")
    world.clock.tick(600)
    world.life.cycle()
    assert world.runtime.killed == [lite]  # the one with no start progress: 600 s after its dispatch


def test_the_ladder_warns_when_pods_wait_for_room_past_airflows_queued_timeout():
    kube = {"runtime": "kubernetes", "image": "r/leoflow:1", "exchange_url": "http://127.0.0.1:9/leoflow"}
    conf = {**kube, "pod_unschedulable_timeout": "900"}
    s = leoflow_settings.load(get=lambda section, key, fallback: conf.get(key, fallback))
    assert s.kubernetes.pod_unschedulable_timeout == 900.0
    values = ladder.read_values(s, getfloat=lambda section, key, fallback: fallback)
    rungs = {r.rung: r for r in ladder.evaluate(values).warnings}
    assert rungs["pod_unschedulable_timeout"].values == {"leoflow.pod_unschedulable_timeout": 900.0,
                                                         "scheduler.task_queued_timeout": 600.0}
    default = leoflow_settings.load(get=lambda section, key, fallback: kube.get(key, fallback))
    assert default.kubernetes.pod_unschedulable_timeout == 300.0
    assert "pod_unschedulable_timeout" not in {
        r.rung for r in ladder.evaluate(ladder.read_values(default, getfloat=lambda s_, k, f: f)).warnings}
    lite = leoflow_settings.load(get=lambda section, key, fallback: {"pod_unschedulable_timeout": "900"}.get(key, fallback))
    assert ladder.read_values(lite, getfloat=lambda s_, k, f: f).pod_unschedulable_timeout is None
