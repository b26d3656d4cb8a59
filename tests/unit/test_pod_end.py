"""How a task pod's end is classified and settled (issue 10 item 2; facts file requirement 12's evidence order:
the record, the containers' reason and exit code, the pod's reason and ``DisruptionTarget``, the phase).

Three layers, each pure or on fakes:

* :func:`status.end_cause` / :func:`status.pod_evidence` over pod JSON shaped as the kube-apiserver serves it:
  every class (infra loss, OOM kill, ``DeadlineExceeded``), the reason text a user reads, and the mixed cases;
* :func:`reconcile.decide` with a cause: the settlement of each class, the record winning over every cause;
* the lifecycle (``FakeRuntime`` + the real SQLite ledger): an OOM kill re-driven once and failed on the re-driven
  try, counted from the ledger (a restarted scheduler counts the same), the reason in the TI's Log row.

What a real kube-apiserver and the node harness report for each (an OOM kill, an eviction through the Eviction API,
``DeadlineExceeded``) is in ``tests/k8s/test_pod_end.py``.
"""

from __future__ import annotations

import pytest

from leoflow_agent import outcome
from leoflow_airflow import reconcile
from leoflow_airflow.dispatch.guard import TIRow
from leoflow_airflow.ledger.states import AttemptRef, Resolution
from leoflow_airflow.lifecycle.actions import Fail, TaskEvent
from leoflow_airflow.lifecycle.runtime import MAX_DETAIL_CHARS, EndCause, EndKind, Presence
from leoflow_airflow.runtime.kubernetes.identity import IDENTITY_ANNOTATION, identity_annotation
from leoflow_airflow.runtime.kubernetes.status import INFRA_DISRUPTIONS, end_cause, pod_evidence, pod_view
from test_lifecycle import World

TI = "0190b6c2-7a1e-7000-8000-00000000beef"
REF = AttemptRef(TI, 1, 1)
IDENT = outcome.AttemptIdentity(TI, 1, 1)
DEADLINE_MESSAGE = "Pod was active on the node longer than the specified deadline"


def terminated(code: int, reason: str, message: str | None = None) -> dict:
    """A container ``state`` that terminated with ``code``/``reason`` (and a termination message)."""
    t = {"exitCode": code, "reason": reason, "startedAt": "2026-12-01T10:00:02Z",
         "finishedAt": "2026-12-01T10:03:04Z", "containerID": "containerd://abc"}
    if message is not None:
        t["message"] = message
    return {"terminated": t}


def pod(*, phase: str = "Failed", agent: dict | None = None, sidecar: dict | None = None, init: dict | None = None,
        ephemeral: dict | None = None, reason: str | None = None, message: str | None = None,
        disruption: str | None = None, ref: AttemptRef = REF) -> dict:
    """A task pod as the API serves it: agent container ``base``, a ``sidecar``, optionally an init container
    ``setup`` and an ephemeral ``debugger``; a pod ``reason``/``message``; a ``DisruptionTarget`` reason."""
    running = {"running": {"startedAt": "2026-12-01T10:00:02Z"}}
    conditions = [{"type": "Ready", "status": "False", "reason": "PodCompleted"}]
    if disruption is not None:
        conditions.append({"type": "DisruptionTarget", "status": "True", "reason": disruption,
                           "message": "a disruption", "lastTransitionTime": "2026-12-01T10:03:00Z"})
    status = {"phase": phase, "startTime": "2026-12-01T10:00:01Z", "conditions": conditions,
              "containerStatuses": [
                  {"name": "base", "ready": False, "restartCount": 0, "image": "leoflow:1", "imageID": "",
                   "state": agent or running},
                  {"name": "sidecar", "ready": False, "restartCount": 0, "image": "x", "imageID": "",
                   "state": sidecar or running}]}
    if init is not None:
        status["initContainerStatuses"] = [{"name": "setup", "ready": False, "restartCount": 0, "image": "x",
                                            "imageID": "", "state": init}]
    if ephemeral is not None:
        status["ephemeralContainerStatuses"] = [{"name": "debugger", "ready": False, "restartCount": 0,
                                                 "image": "busybox", "imageID": "", "state": ephemeral}]
    if reason is not None:
        status["reason"] = reason
    if message is not None:
        status["message"] = message
    return {"kind": "Pod", "apiVersion": "v1",
            "metadata": {"name": "dag-task-beef-1", "namespace": "ns", "uid": "6f1c2d3e-0000-4000-8000-00000000000a",
                         "annotations": {IDENTITY_ANNOTATION: identity_annotation(ref)}},
            "spec": {"nodeName": "node-a", "restartPolicy": "Never",
                     "containers": [{"name": "base", "image": "leoflow:1"}, {"name": "sidecar", "image": "x"}]},
            "status": status}


def success_message() -> str:
    """The termination message of an agent that recorded a success."""
    return outcome.encode(outcome.record_for_state(
        "success", {"state": "success", "end_date": "2026-12-01T10:03:00Z", "task_outlets": [], "outlet_events": []},
        attempt=IDENT, api_version="2025-09-23"))


def cause_of(obj: dict) -> EndCause | None:
    view = pod_view(obj)
    assert view is not None
    return end_cause(view)


# --- classification: status -> class and the reason a user reads -------------------------------------------
def test_oom_killed_agent_container_names_oomkilled_exit_137_and_the_container():
    cause = cause_of(pod(agent=terminated(137, "OOMKilled")))
    assert cause == EndCause(EndKind.OOM_KILLED, "OOMKilled, exit 137, container base (pod dag-task-beef-1)")


@pytest.mark.parametrize("where", ["sidecar", "init"])
def test_an_oom_kill_of_any_other_container_of_the_pod_is_an_oom_kill_naming_that_container(where):
    if where == "sidecar":
        obj = pod(agent=terminated(1, "Error"), sidecar=terminated(137, "OOMKilled"))
        name = "sidecar"
    else:
        obj = pod(phase="Failed", agent={"waiting": {"reason": "PodInitializing"}}, init=terminated(137, "OOMKilled"))
        name = "setup"
    cause = cause_of(obj)
    assert cause is not None and cause.kind is EndKind.OOM_KILLED
    assert cause.reason.startswith(f"OOMKilled, exit 137, container {name}")


def test_the_agent_containers_oom_kill_is_named_before_a_sidecars():
    cause = cause_of(pod(agent=terminated(137, "OOMKilled"), sidecar=terminated(137, "OOMKilled")))
    assert cause is not None and "container base" in cause.reason


def test_an_ephemeral_debug_containers_oom_kill_says_nothing_of_the_task():
    assert cause_of(pod(agent=terminated(1, "Error"), ephemeral=terminated(137, "OOMKilled"))) is None


def test_deadline_exceeded_is_a_task_failure_class_with_the_kubelets_message():
    cause = cause_of(pod(agent=terminated(137, "Error"), reason="DeadlineExceeded", message=DEADLINE_MESSAGE))
    assert cause is not None and cause.kind is EndKind.DEADLINE_EXCEEDED
    assert cause.reason.startswith(f"DeadlineExceeded: {DEADLINE_MESSAGE} (pod dag-task-beef-1")
    assert "credential_ceiling_seconds" in cause.reason


def test_node_pressure_eviction_is_an_infra_loss_naming_the_pod_reason_and_the_disruption():
    cause = cause_of(pod(agent=terminated(137, "Error"), reason="Evicted",
                         message="The node was low on resource: memory.", disruption="TerminationByKubelet"))
    assert cause == EndCause(EndKind.INFRA_LOSS,
                             "pod dag-task-beef-1 evicted by the kubelet (node pressure) (pod reason Evicted: The "
                             "node was low on resource: memory.); DisruptionTarget TerminationByKubelet")


@pytest.mark.parametrize("disruption", sorted(INFRA_DISRUPTIONS))
def test_every_disruption_target_reason_is_an_infra_loss_naming_it(disruption):
    cause = cause_of(pod(agent=terminated(143, "Error"), disruption=disruption))
    assert cause is not None and cause.kind is EndKind.INFRA_LOSS
    assert cause.reason == f"pod dag-task-beef-1 {INFRA_DISRUPTIONS[disruption]} (DisruptionTarget {disruption})"


def test_a_disruption_reason_kubernetes_adds_later_is_still_an_infra_loss():
    cause = cause_of(pod(agent=terminated(143, "Error"), disruption="SomethingNew"))
    assert cause == EndCause(EndKind.INFRA_LOSS,
                             "pod dag-task-beef-1 disrupted by Kubernetes (DisruptionTarget SomethingNew)")


def test_a_pod_deleted_by_podgc_before_the_kubelet_reported_is_an_infra_loss():
    """PodGC patches a pod of a deleted Node to Failed with ``DeletionByPodGC`` and deletes it with grace 0: the
    containers never reported an end."""
    cause = cause_of(pod(phase="Failed", disruption="DeletionByPodGC"))
    assert cause is not None and cause.kind is EndKind.INFRA_LOSS and "DeletionByPodGC" in cause.reason


@pytest.mark.parametrize("reason", ["Terminated", "NodeShutdown", "NodeLost"])
def test_node_shutdown_and_node_loss_pod_reasons_are_infra_losses(reason):
    cause = cause_of(pod(agent=terminated(143, "Error"), reason=reason, message="node going away"))
    assert cause is not None and cause.kind is EndKind.INFRA_LOSS and f"pod reason {reason}" in cause.reason


@pytest.mark.parametrize("obj", [
    pod(agent=terminated(1, "Error")),                                  # the agent exited, no record: no class
    pod(phase="Succeeded", agent=terminated(0, "Completed")),
    pod(phase="Failed", agent=terminated(137, "Error")),                # SIGKILL is not an OOM kill
    pod(phase="Running"),
    pod(phase="Failed", reason="UnexpectedAdmissionError", message="x"),  # not a disruption leoflow knows
], ids=["error", "succeeded", "sigkill", "running", "other-pod-reason"])
def test_exit_codes_and_phases_alone_classify_nothing(obj):
    assert cause_of(obj) is None


# --- mixed cases --------------------------------------------------------------------------------------------
def test_evicted_and_deadline_exceeded_is_the_deadline():
    """Evicted through the API (``DisruptionTarget`` set when the eviction began) and then ended by its deadline:
    the pod reason is the end the kubelet recorded; a deadline is never an infra loss."""
    cause = cause_of(pod(agent=terminated(137, "Error"), reason="DeadlineExceeded", message=DEADLINE_MESSAGE,
                         disruption="EvictionByEvictionAPI"))
    assert cause is not None and cause.kind is EndKind.DEADLINE_EXCEEDED


def test_oom_killed_under_node_pressure_eviction_is_the_oom_kill():
    cause = cause_of(pod(agent=terminated(137, "OOMKilled"), reason="Evicted", disruption="TerminationByKubelet"))
    assert cause is not None and cause.kind is EndKind.OOM_KILLED


def test_a_recorded_success_then_oom_killed_carries_both_and_the_record_wins():
    view = pod_view(pod(agent=terminated(137, "OOMKilled", success_message())))
    evidence = pod_evidence(view, REF)
    assert evidence.record is not None and evidence.record.state == "success"
    assert evidence.exit_code == 137 and evidence.cause is not None and evidence.cause.kind is EndKind.OOM_KILLED
    running = TIRow(id=TI, state="running", try_number=1, max_tries=1, queued_by_job_id=None)
    act = reconcile.decide(ti_id=TI, try_number=1, record=evidence.record, ti=running, cause=evidence.cause,
                           oom_redriven=True)
    assert (act.act, act.resolution) == (reconcile.Act.REPLAY, Resolution.REPLAYED)
    landed = TIRow(id=TI, state="success", try_number=1, max_tries=1, queued_by_job_id=None)
    act = reconcile.decide(ti_id=TI, try_number=1, record=evidence.record, ti=landed, cause=evidence.cause)
    assert (act.act, act.resolution) == (reconcile.Act.CLOSE, Resolution.REPORTED)


def test_a_pod_of_another_attempt_gives_no_cause():
    view = pod_view(pod(agent=terminated(137, "OOMKilled"), ref=AttemptRef(TI, 1, 2)))
    assert pod_evidence(view, REF).cause is None


def test_the_reason_is_one_bounded_line():
    cause = cause_of(pod(agent=terminated(137, "Error"), reason="Evicted", message="low\nmemory " * 500))
    assert cause is not None and "\n" not in cause.reason and len(cause.reason) <= MAX_DETAIL_CHARS


# --- settlement: reconcile.decide with a cause --------------------------------------------------------------
OOM = EndCause(EndKind.OOM_KILLED, "OOMKilled, exit 137, container base (pod p)")
DEADLINE = EndCause(EndKind.DEADLINE_EXCEEDED, f"DeadlineExceeded: {DEADLINE_MESSAGE} (pod p)")
EVICTED = EndCause(EndKind.INFRA_LOSS, "pod p evicted through the Eviction API (DisruptionTarget EvictionByEvictionAPI)")


def decide(state: str, cause: EndCause | None, *, record: outcome.OutcomeRecord | None = None,
           oom_redriven: bool = False, reported: bool = False) -> reconcile.Action:
    ti = TIRow(id=TI, state=state, try_number=1, max_tries=1, queued_by_job_id=None)
    return reconcile.decide(ti_id=TI, try_number=1, record=record, ti=ti, reported=reported, cause=cause,
                            oom_redriven=oom_redriven)


@pytest.mark.parametrize(("cause", "oom_redriven", "act", "resolution"), [
    (EVICTED, False, reconcile.Act.INFRA_REDRIVE, Resolution.INFRA_REDRIVE),
    (EVICTED, True, reconcile.Act.INFRA_REDRIVE, Resolution.INFRA_REDRIVE),
    (OOM, False, reconcile.Act.INFRA_REDRIVE, Resolution.OOM_REDRIVE),
    (OOM, True, reconcile.Act.TASK_FAIL, Resolution.EXECUTOR_FAILED),
    (DEADLINE, False, reconcile.Act.TASK_FAIL, Resolution.EXECUTOR_FAILED),
    (DEADLINE, True, reconcile.Act.TASK_FAIL, Resolution.EXECUTOR_FAILED),
], ids=["evicted", "evicted-after-oom", "oom-first", "oom-again", "deadline", "deadline-after-oom"])
def test_each_class_of_a_running_ti_without_a_record_settles_with_its_reason_first(cause, oom_redriven, act,
                                                                                    resolution):
    action = decide("running", cause, oom_redriven=oom_redriven)
    assert (action.act, action.resolution) == (act, resolution)
    assert action.why.startswith(cause.reason)


def test_a_record_wins_over_every_cause():
    ident = outcome.AttemptIdentity(TI, 1, 1)
    success = outcome.record_for_state("success", {"state": "success", "end_date": "2026-12-01T10:03:00Z",
                                                   "task_outlets": [], "outlet_events": []}, attempt=ident,
                                       api_version="2025-09-23")
    for cause in (OOM, DEADLINE, EVICTED):
        assert decide("running", cause, record=success, oom_redriven=True).act is reconcile.Act.REPLAY
        assert decide("running", cause, reported=True).act is reconcile.Act.CLOSE
        # the agent's own verdict of an infra loss stays one, whatever the pod's status adds
        action = decide("running", cause, record=outcome.heartbeat_lost(ident))
        assert (action.act, action.resolution) == (reconcile.Act.INFRA_REDRIVE, Resolution.INFRA_REDRIVE)


def test_no_cause_is_todays_table():
    action = decide("running", None)
    assert (action.act, action.resolution, action.why) == (
        reconcile.Act.INFRA_REDRIVE, Resolution.INFRA_REDRIVE, "the agent died with no outcome record")


def test_a_queued_ti_is_redispatched_naming_the_cause_unless_its_deadline_ran_out():
    evicted = decide("queued", EVICTED)
    assert evicted.act is reconcile.Act.REDISPATCH and evicted.why.endswith(EVICTED.reason)
    assert decide("queued", OOM).act is reconcile.Act.REDISPATCH
    deadline = decide("queued", DEADLINE)
    assert (deadline.act, deadline.resolution) == (reconcile.Act.TASK_FAIL, Resolution.EXECUTOR_FAILED)
    assert deadline.why.startswith(DEADLINE.reason)
    # an agent that said it never reached /run: its record wins, the same ti_id is dispatched again
    refused = outcome.exchange_unreachable(outcome.AttemptIdentity(TI, 1, 1))
    assert decide("queued", DEADLINE, record=refused).act is reconcile.Act.REDISPATCH


def test_was_oom_redrive_reads_the_previous_tries_resolution():
    assert reconcile.was_oom_redrive(Resolution.OOM_REDRIVE)
    assert reconcile.was_oom_redrive("oom_redrive")
    for other in (None, Resolution.INFRA_REDRIVE, Resolution.EXECUTOR_FAILED, Resolution.REPORTED):
        assert not reconcile.was_oom_redrive(other)


# --- the lifecycle: once, counted in the ledger -------------------------------------------------------------
@pytest.fixture
def world(tmp_path):
    w = World(tmp_path)
    yield w
    w.engine.dispose()


def end_running(world: World, cause: EndCause | None, *, try_number: int = 1):
    """Dispatch a try of the logical TI, Airflow holds it RUNNING, its pod ends with ``cause``: the actions."""
    w, ref = world.dispatched(try_number=try_number)
    world.airflow.set_state(ref.ti_id, "running")
    if cause is not None:
        world.runtime.causes[ref] = cause
    return w, ref, world.exit(ref, code=137)


def test_an_oom_kill_is_redriven_once_then_fails_through_airflow_with_the_reason(world):
    _, first, actions = end_running(world, OOM)
    assert world.airflow.redrives == [first.ti_id] and world.airflow.redrive_reasons == [OOM.reason]
    assert world.row(first).resolution == Resolution.OOM_REDRIVE
    assert not [a for a in actions if isinstance(a, Fail)]
    # Airflow's reset made the next try (a new ti_id); a restarted scheduler settles it: the count is the ledger's
    world.life = world.new_lifecycle()
    w2, second, actions = end_running(world, OOM, try_number=2)
    assert world.airflow.redrives == [first.ti_id]  # not re-driven again
    assert world.row(second).resolution == Resolution.EXECUTOR_FAILED
    fails = [a for a in actions if isinstance(a, Fail)]
    events = [a for a in actions if isinstance(a, TaskEvent)]
    assert [f.key for f in fails] == [w2.key] and fails[0].reason.startswith("OOMKilled, exit 137, container base")
    assert [(e.key, e.event) for e in events] == [(w2.key, "leoflow task failed")]
    assert events[0].extra == fails[0].reason
    # the user's retry (try 3) after that failure gets its own one re-drive, within the infra budget
    _, third, _ = end_running(world, OOM, try_number=3)
    assert world.row(third).resolution == Resolution.OOM_REDRIVE


def test_an_oom_kill_after_an_infra_loss_is_still_redriven(world):
    end_running(world, EVICTED)
    _, second, _ = end_running(world, OOM, try_number=2)
    assert world.row(second).resolution == Resolution.OOM_REDRIVE


def test_an_oom_kill_with_the_infra_budget_spent_fails_through_airflow(world):
    from leoflow_airflow.redrive import RedriveResult

    world.airflow.redrive_result = RedriveResult.BUDGET_SPENT
    w, ref, actions = end_running(world, OOM)
    assert world.row(ref).resolution == Resolution.EXECUTOR_FAILED
    [fail] = [a for a in actions if isinstance(a, Fail)]
    assert fail.key == w.key and fail.reason.startswith(OOM.reason) and "budget is spent" in fail.reason


def test_deadline_exceeded_fails_through_airflow_and_is_never_redriven(world):
    w, ref, actions = end_running(world, DEADLINE)
    assert world.airflow.redrives == []
    assert world.row(ref).resolution == Resolution.EXECUTOR_FAILED
    assert [(a.key, a.reason) for a in actions if isinstance(a, Fail)] == [(w.key, DEADLINE.reason)]
    assert [a.extra for a in actions if isinstance(a, TaskEvent)] == [DEADLINE.reason]


def test_an_eviction_is_redriven_on_the_infra_budget_with_its_reason(world):
    _, ref, actions = end_running(world, EVICTED)
    assert world.airflow.redrive_reasons == [EVICTED.reason]
    assert world.row(ref).resolution == Resolution.INFRA_REDRIVE
    assert not [a for a in actions if isinstance(a, (Fail, TaskEvent))]


def test_a_predecessors_attempt_past_its_deadline_is_adopted_and_failed_not_reset_as_an_infra_loss(world):
    """At adoption (no HTTP call there) a dead RUNNING attempt with no record is handed to Airflow's reset on the
    infra budget; one whose runtime named a cause is adopted instead, so the next cycle settles it by the table."""
    from test_lifecycle import T0

    w, ref = world.dispatched()
    world.airflow.set_state(ref.ti_id, "running")
    world.runtime.presence[ref] = Presence.GONE
    world.runtime.causes[ref] = DEADLINE
    successor = world.new_lifecycle()
    ti = world.adoptable(w, "running")
    assert successor.adopt([ti], now=T0) == ([], [])
    assert ti.last_heartbeat_at == T0  # Airflow's purge waits for the next sync()
    actions = successor.cycle()
    assert world.row(ref).resolution == Resolution.EXECUTOR_FAILED and world.airflow.redrives == []
    assert [(a.key, a.reason) for a in actions if isinstance(a, Fail)] == [(w.key, DEADLINE.reason)]
    # the same without a cause is Airflow's reset on the infra budget, as before
    w2, ref2 = world.dispatched(task_id="other")
    world.airflow.set_state(ref2.ti_id, "running")
    world.runtime.presence[ref2] = Presence.GONE
    ti2 = world.adoptable(w2, "running")
    assert world.new_lifecycle().adopt([ti2], now=T0) == ([ti2], [ti2])
