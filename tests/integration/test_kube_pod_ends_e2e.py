"""How a pod's end is settled, end to end, on the real node with ``--real-node`` (a kubelet and containerd running
leoflow's agent image; every fault the real one), else on the node harness: a real Airflow (scheduler, dag-processor,
api-server on SQLite) with ``[leoflow] runtime = kubernetes`` on the k8senv control plane. One stack for the module
(:class:`~fault_helpers.FaultStack` on ``tests/fault_dags`` pointed at a :class:`~devtools.kube.KubeStack`, the pod
template's agent container limited to :data:`MEMORY_LIMIT`); the tests run in file order:

* **an OOM kill** (issue 10 item 2): re-driven once on the infra budget, failed through Airflow when the re-driven
  try is OOM-killed too;
* **an eviction through the Eviction API**: re-driven on the infra budget, naming ``EvictionByEvictionAPI``;
* **a pod past its ``activeDeadlineSeconds``**: the task fails at its first try, never re-driven;
* **a scheduler SIGKILLed with five pods running** (issue 9): the new scheduler adopts every pod, none is deleted or
  created again, each body runs once;
* **the finalizer** (issue 10 item 4): a success whose pod is force-deleted after termination, before any scheduler
  read it, is settled SUCCESS from the record the finalizer kept; the body ran once.

The bodies (``tests/fault_dags/leoflow_kube.py``: :func:`fault_trace.hold`) tick into ``traces/<dag>.work.body``
until the test releases their try (``traces/release.<run_id>.<try>``), so every fault lands while a body runs; the
node's side of each fault is :mod:`node_faults`'. The checks shared by all (:func:`kube_attempts.check_bodies`): no
body that recorded its end ran again, no two bodies of one TI overlapped, and a body whose pod was lost or stopped
never ended. What needs several Nodes or a pod held unstarted stays on the harness (``test_kube_faults_e2e.py``).

Each asserts what a user notices: TI states, try numbers and ``max_tries``, the Log rows of the TI's event log, how
often each body ran, and every version of every pod the namespace held.
"""

from __future__ import annotations

import re
import signal
from pathlib import Path

import pytest

from fault_helpers import executions, kube_fault_stack, wait_until
from kube_attempts import (
    LABEL,
    TASK,
    check_bodies,
    closed_rows,
    deleted_while_active,
    ended_pods,
    ledger_rows,
    log_rows,
    pod_phase,
    release_try,
    running_try,
    scheduler_jobs,
    settled_rows,
    ti_id_of,
)
from node_faults import HarnessNode, RealNode, node_of

pytestmark = [pytest.mark.k8s, pytest.mark.airflow, pytest.mark.either_node, pytest.mark.timeout(1800)]

HOLD_DAG, DEADLINE_DAG = "lf_khold", "lf_khold_deadline"
ADOPT_DAG, ADOPT_TASKS = "lf_adopt", [f"t{i}" for i in range(5)]
FINALIZER_DAG = "leoflow_test_finalizer"
DAGS = [HOLD_DAG, DEADLINE_DAG, ADOPT_DAG, FINALIZER_DAG]
MEMORY_LIMIT = "1Gi"
"""The agent container's memory limit (the pod template's): the real node's OOM test grows a body past it."""
ALLOW = ("metadata.labels, metadata.annotations, spec.containers.image, spec.containers.imagePullPolicy, "
         "spec.containers.resources, spec.containers.env, spec.nodeSelector, spec.affinity, spec.tolerations, "
         "spec.priorityClassName, spec.terminationGracePeriodSeconds, spec.activeDeadlineSeconds")
"""``[leoflow] pod_override_allow``: leoflow's default list and the two fields the DAGs set."""
INFRA = "leoflow infra re-drive"
FAILED = "leoflow task failed"
OOM_NAMED = re.compile(r"OOMKilled, exit \d+, container base \(pod ")
"""How the Log row of an OOM kill starts: the container's reason, its exit code (137 when the whole container was
killed, the harness's; the agent's own when the kernel killed the task process alone, the real node's), its name."""
EXTRA = {
    "AIRFLOW__LEOFLOW__POD_OVERRIDE_ALLOW": ALLOW,
    "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_THRESHOLD": "10",
    "AIRFLOW__SCHEDULER__ORPHANED_TASKS_CHECK_INTERVAL": "15",
    "AIRFLOW__LEOFLOW__POD_RETENTION_SUCCESS": "3600",
    "AIRFLOW__LEOFLOW__POD_TERMINATION_VALVE": "25",
}
"""The module's settings: a SIGKILLed scheduler's job is seen dead after 10 s and its tasks adopted within 15 s;
no pod is deleted by the retention GC during the module (every deletion is a fault's or a decision's); a deleted
pod on a running node reports its end within seconds, so the valve is short."""


@pytest.fixture(scope="module")
def kube_stack(tmp_path_factory: pytest.TempPathFactory, kube_node: str):
    """``(stack, kube)``: the module's Airflow (started, :data:`DAGS` serialized) on its Kubernetes."""
    with kube_fault_stack(tmp_path_factory.mktemp("kube-pod-ends"), extra_env=EXTRA, dags=DAGS, node=kube_node,
                          memory_limit=MEMORY_LIMIT) as both:
        yield both


@pytest.fixture(scope="module")
def node(kube_stack) -> HarnessNode | RealNode:
    """The faults of the node that runs the module's pods (:mod:`node_faults`)."""
    return node_of(kube_stack[1])


def test_an_oom_kill_is_redriven_once_and_the_log_names_it(kube_stack, node) -> None:
    """An OOM kill while ``lf_khold.work``'s body runs: the harness OOM-kills the agent container (``OOMKilled``,
    exit 137; the whole container's processes die); on the real node the body outgrows the container's
    :data:`MEMORY_LIMIT` and the kernel's OOM killer ends it (the task process alone: containerd reports
    ``OOMKilled`` with the agent's exit code). Re-driven once on the infra budget: try 2, ``max_tries`` 0 → 1, the
    Log row names ``OOMKilled`` and the container; try 2 runs and succeeds. A second run is OOM-killed on both
    tries: the second kill fails the TI through Airflow (no third try) with a ``leoflow task failed`` Log row
    naming it."""
    stack, kube = kube_stack
    once = stack.trigger_with(HOLD_DAG)
    twice = stack.trigger_with(HOLD_DAG)
    for run in (once, twice):
        node.oom(stack.traces_dir, run, running_try(stack, kube, HOLD_DAG, run, 1), try_number=1)
    running_try(stack, kube, HOLD_DAG, once, 2)
    release_try(stack, once, 2)
    node.oom(stack.traces_dir, twice, running_try(stack, kube, HOLD_DAG, twice, 2), try_number=2)
    assert stack.wait_for_run(HOLD_DAG, once, timeout=240) == "success"
    assert stack.wait_for_run(HOLD_DAG, twice, timeout=240) == "failed"

    ti = stack.ti_row(HOLD_DAG, once, TASK)
    assert (ti["state"], ti["try_number"], ti["max_tries"]) == ("success", 2, 1), ti
    rows = log_rows(stack, HOLD_DAG, once)
    infra = [extra for event, extra in rows if event == INFRA]
    assert len(infra) == 1 and OOM_NAMED.match(infra[0]), rows
    assert "max_tries 0 -> 1" in infra[0], rows
    ledger = closed_rows(stack, once, HOLD_DAG)
    assert ledger == [(1, 1, "closed", "oom_redrive"), (2, 1, "closed", "reported")], ledger
    check_bodies(stack, HOLD_DAG, once, lost_tries={1}, ended_tries={2})

    ti = stack.ti_row(HOLD_DAG, twice, TASK)
    assert (ti["state"], ti["try_number"], ti["max_tries"]) == ("failed", 2, 1), ti
    rows = log_rows(stack, HOLD_DAG, twice)
    assert [e for e, _ in rows].count(INFRA) == 1, rows
    failed = [extra for event, extra in rows if event == FAILED]
    assert len(failed) == 1 and OOM_NAMED.match(failed[0]), rows
    assert "OOM-killed again" in failed[0], rows
    ledger = closed_rows(stack, twice, HOLD_DAG)
    assert ledger == [(1, 1, "closed", "oom_redrive"), (2, 1, "closed", "executor_failed")], ledger
    check_bodies(stack, HOLD_DAG, twice, lost_tries={1, 2}, ended_tries=set())


def test_an_eviction_through_the_eviction_api_is_redriven_naming_it(kube_stack) -> None:
    """``lf_khold.work``'s pod is evicted through the real Eviction API while its body runs (no
    PodDisruptionBudget: the API server adds ``DisruptionTarget`` ``EvictionByEvictionAPI`` and deletes it; the
    kubelet, or the harness as one, stops it). Re-driven on the infra budget: try 2, ``max_tries`` 0 → 1, the Log row
    names ``EvictionByEvictionAPI``, no retry or failure callback; try 2 succeeds; try 1's body never ended."""
    from kubernetes import client

    stack, kube = kube_stack
    run = stack.trigger_with(HOLD_DAG)
    pod = running_try(stack, kube, HOLD_DAG, run, 1)
    client.CoreV1Api(kube.api).create_namespaced_pod_eviction(pod, kube.namespace, client.V1Eviction(
        metadata=client.V1ObjectMeta(name=pod, namespace=kube.namespace)))
    running_try(stack, kube, HOLD_DAG, run, 2)
    release_try(stack, run, 2)
    assert stack.wait_for_run(HOLD_DAG, run, timeout=240) == "success"

    ti = stack.ti_row(HOLD_DAG, run, TASK)
    assert (ti["state"], ti["try_number"], ti["max_tries"]) == ("success", 2, 1), ti
    rows = log_rows(stack, HOLD_DAG, run)
    infra = [extra for event, extra in rows if event == INFRA]
    assert len(infra) == 1 and "EvictionByEvictionAPI" in infra[0] and "max_tries 0 -> 1" in infra[0], rows
    ledger = closed_rows(stack, run, HOLD_DAG)
    assert ledger == [(1, 1, "closed", "infra_redrive"), (2, 1, "closed", "reported")], ledger
    check_bodies(stack, HOLD_DAG, run, lost_tries={1}, ended_tries={2})


def test_a_pod_past_its_deadline_fails_the_task_with_the_reason_never_redriven(kube_stack, node) -> None:
    """``lf_khold_deadline.work``'s pod asks for ``activeDeadlineSeconds`` 45 (its ``pod_override``); its body holds
    past it. The kubelet ends the pod (Failed, reason ``DeadlineExceeded``; the harness plays that check once the
    body runs): the TI fails at try 1 (``max_tries`` still 0, no infra re-drive) with a ``leoflow task failed`` Log
    row naming ``DeadlineExceeded``; its body ran once, never ended."""
    stack, kube = kube_stack
    run = stack.trigger_with(DEADLINE_DAG)
    node.exceed_deadline(running_try(stack, kube, DEADLINE_DAG, run, 1))
    assert stack.wait_for_run(DEADLINE_DAG, run, timeout=240) == "failed"

    ti = stack.ti_row(DEADLINE_DAG, run, TASK)
    assert (ti["state"], ti["try_number"], ti["max_tries"]) == ("failed", 1, 0), ti
    rows = log_rows(stack, DEADLINE_DAG, run)
    assert INFRA not in [e for e, _ in rows], rows
    failed = [extra for event, extra in rows if event == FAILED]
    assert len(failed) == 1 and failed[0].startswith("DeadlineExceeded: Pod was active on the node longer than the "
                                                     "specified deadline"), rows
    ledger = closed_rows(stack, run, DEADLINE_DAG)
    assert ledger == [(1, 1, "closed", "executor_failed")], ledger
    check_bodies(stack, DEADLINE_DAG, run, lost_tries={1}, ended_tries=set())


def test_scheduler_sigkilled_with_five_pods_running_adopts_them_all(kube_stack) -> None:
    """Five tasks run in five pods, each body holding until released; the scheduler is SIGKILLed and a new one
    started. The new scheduler's job owns every TI; every pod the namespace ever held for those TIs is one of the
    five seen before the kill (none created), none got a ``deletionTimestamp`` while it ran (none deleted), each
    body ran once, and every TI ends SUCCESS at try 1 with one ledger epoch, reported by its own agent."""
    stack, kube = kube_stack
    run = stack.trigger_with(ADOPT_DAG)

    def all_running() -> dict[str, str] | None:
        if not all(executions(stack, ADOPT_DAG, t, run) for t in ADOPT_TASKS):
            return None
        rows = {t: ledger_rows(stack, ADOPT_DAG, run, t) for t in ADOPT_TASKS}
        if not all(len(r) == 1 and r[0]["pod_uid"] for r in rows.values()):
            return None  # the scheduler has not yet recorded every pod's UID: the state the restart must find
        uids = {t: r[0]["pod_uid"] for t, r in rows.items()}
        pods = kube.pods()
        running = all(pods.get(uid) and pod_phase(pods[uid][-1]) == "Running" for uid in uids.values())
        return uids if running else None

    before = wait_until(all_running, 240, "five pods Running, their bodies started and their UIDs recorded")
    (old_job,) = {stack.ti_row(ADOPT_DAG, run, t)["queued_by_job_id"] for t in ADOPT_TASKS}

    stack.kill_component("scheduler", signal.SIGKILL)
    stack.start_component("scheduler")

    def adopted() -> int | None:
        jobs = [j for j in scheduler_jobs(stack) if j != old_job]
        if not jobs:
            return None
        owners = {stack.ti_row(ADOPT_DAG, run, t)["queued_by_job_id"] for t in ADOPT_TASKS}
        return jobs[-1] if owners == {jobs[-1]} else None

    new_job = wait_until(adopted, 240, "the new scheduler's job to own every TI")
    stack.release(run)
    assert stack.wait_for_run(ADOPT_DAG, run, timeout=240) == "success"

    problems = []
    for t in ADOPT_TASKS:
        ti = stack.ti_row(ADOPT_DAG, run, t)
        epochs = [(r["try_number"], r["attempt_epoch"], r["state"], r["resolution"], r["pod_uid"])
                  for r in settled_rows(stack, ADOPT_DAG, run, t)]
        pods = ended_pods(kube, ti_id_of(stack, ADOPT_DAG, run, t))
        execs = executions(stack, ADOPT_DAG, t, run)
        if (ti["state"], ti["try_number"], ti["queued_by_job_id"]) != ("success", 1, new_job):
            problems.append(f"{t}: must succeed at try 1 under the new scheduler's job {new_job}: {ti}")
        if list(pods) != [before[t]]:
            problems.append(f"{t}: pods {sorted(pods)}, expected only the one running before the kill {before[t]}")
        for uid, versions in pods.items():
            if deleted_while_active(versions):
                problems.append(f"{t}: pod {uid} was deleted while it ran: {deleted_while_active(versions)}")
            if pod_phase(versions[-1]) != "Succeeded":
                problems.append(f"{t}: pod {uid} ended {pod_phase(versions[-1])}")
        if len(execs) != 1 or not execs[0].ended or execs[0].try_number != 1:
            problems.append(f"{t}: the body must run once, at try 1, to its end: {execs}")
        if epochs != [(1, 1, "closed", "reported", before[t])]:
            problems.append(f"{t}: ledger {epochs}")
        if INFRA in stack.log_events(ADOPT_DAG, run, t):
            problems.append(f"{t}: re-driven: {stack.log_events(ADOPT_DAG, run, t)}")
    assert not problems, "\n".join(problems)


def _lines(path: Path) -> list[str]:
    return [line.split(" pid=")[0] for line in path.read_text().splitlines()] if path.exists() else []


def test_a_success_force_deleted_after_termination_is_settled_from_its_record_and_ran_once(kube_stack) -> None:
    """"A success whose pod is force-deleted after termination: with the finalizer, settled SUCCESS from the record;
    the body ran once". ``leoflow_test_finalizer``'s ``body`` waits for the test's go; the test freezes the scheduler
    (SIGSTOP), lets the body finish: its agent writes the outcome record into the termination message and is
    SIGKILLed before its terminal PATCH (TEST-ONLY fault ``after_record``), so the record is the only evidence of the
    success. The pod ends; the test deletes it with grace 0 (``kubectl delete --force --grace-period=0``, what PodGC
    does), kills the frozen scheduler (it never read the pod) and starts a new one. The finalizer kept the pod,
    terminal and deleting, so the successor reads the record, settles the body SUCCESS from it (the ledger says
    ``replayed``), releases the finalizer and the pod goes; the body ran once and ``downstream`` ran once. Without
    the finalizer the delete would take the record with the pod, and the successor would re-run the body on the
    infra budget."""
    from kubernetes import client

    stack, kube = kube_stack
    core = client.CoreV1Api(kube.api)
    ns = kube.namespace
    body_trace = stack.traces_dir / "finalizer_body.txt"
    run_id = stack.trigger_with(FINALIZER_DAG)
    wait_until(lambda: _lines(body_trace) == ["started"], 300, "the body to start in its pod")
    [pod] = [p for p in core.list_namespaced_pod(ns).items
             if (p.metadata.labels.get(LABEL + "dag-id"), p.metadata.labels.get(LABEL + "task-id"))
             == (FINALIZER_DAG, "body")]
    name, uid = pod.metadata.name, pod.metadata.uid
    stack.stop_component("scheduler")  # from here on no scheduler reads the pod
    (stack.traces_dir / f"finalizer_go.{run_id}").write_text("go\n")

    def ended():
        p = core.read_namespaced_pod(name, ns)
        return p if p.status.phase in ("Succeeded", "Failed") else None

    ended_pod = wait_until(ended, 120, "the body's pod to end")
    message = ended_pod.status.container_statuses[0].state.terminated.message
    assert message and '"state":"success"' in message.replace(" ", ""), message
    core.delete_namespaced_pod(name, ns, body=client.V1DeleteOptions(
        grace_period_seconds=0, preconditions=client.V1Preconditions(uid=uid)))
    kept = core.read_namespaced_pod(name, ns)  # the finalizer keeps it, record and all
    assert kept.metadata.uid == uid and kept.metadata.deletion_timestamp is not None
    assert kept.status.container_statuses[0].state.terminated.message == message
    stack.kill_component("scheduler", signal.SIGKILL, resume=True)  # it never read the pod
    stack.start_component("scheduler")
    state = stack.wait_for_run(FINALIZER_DAG, run_id, timeout=600)
    wait_until(lambda: uid not in {p.metadata.uid for p in core.list_namespaced_pod(ns).items}, 120,
               "the successor to release the settled pod")
    tasks = stack.task_states(FINALIZER_DAG, run_id)
    assert state == "success" and tasks == {"body": "success", "downstream": "success"}, (state, tasks)
    assert _lines(body_trace) == ["started", "ran"]  # the body ran once
    assert _lines(stack.traces_dir / "finalizer_downstream.txt") == ["ran"]
    rows = [(r["try_number"], r["attempt_epoch"], r["state"], r["resolution"])
            for r in ledger_rows(stack, FINALIZER_DAG, run_id, "body")]
    assert rows == [(1, 1, "closed", "replayed")]  # settled SUCCESS from the record
