"""Issue 10 acceptance, end to end: how a task pod's end is settled through a real Airflow on Kubernetes (scheduler,
dag-processor and api-server on SQLite; the k8senv control plane with its real PodGC; the node harness runs the
pods, devtools/kube.py), each fault once, deterministically, with what a user sees: the TI's state, try and
``max_tries``, the Log rows of its event log, and how often its body ran.

One stack for the module (:class:`~fault_helpers.FaultStack` on ``tests/fault_dags`` pointed at a
:class:`~devtools.kube.KubeStack`). The bodies (``tests/fault_dags/leoflow_kube.py``) tick into
``traces/<dag>.work.body`` until the test releases their try (``traces/release.<run_id>.<try>``), so every fault
lands while a body runs, and a re-driven try runs only as long as the test lets it. ``[leoflow] pod_override_allow``
adds ``spec.nodeName`` and ``spec.terminationGracePeriodSeconds``: ``lf_knode`` runs on a Node of its own
(``harness-node-lost``, served by a second node harness) so losing it leaves the stack's ``harness-node`` alone, and
both DAGs' pods stop 2 s after a SIGTERM (the Task SDK's task process ignores SIGTERM).

The user-facing checks shared by all (:func:`_check_bodies`): no body that recorded its end ran again, no two bodies
of one TI overlapped, and a body whose pod was lost or stopped never ended.

Wall time on the 2-core host: 214 s for the module at low load (the stack's start 55 s; node loss 82 s, of which
PodGC's wait 56 s; OOM 21 s, eviction 20 s, deadline 17 s; teardown 20 s), 444 s at load 3-6 (start 92 s, PodGC
45 s).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from devtools.kube import KubeStack, require_binaries
from fault_helpers import FaultStack, executions, overlaps, wait_until

pytestmark = [pytest.mark.k8s, pytest.mark.airflow, pytest.mark.timeout(1200)]

HOLD_DAG, NODE_DAG, TASK = "lf_khold", "lf_knode", "work"
DAGS = [HOLD_DAG, NODE_DAG]
LOST_NODE = "harness-node-lost"
"""``tests/fault_dags/leoflow_kube.py``'s ``LOST_NODE``."""
ALLOW = ("metadata.labels, metadata.annotations, spec.containers.image, spec.containers.imagePullPolicy, "
         "spec.containers.resources, spec.containers.env, spec.nodeSelector, spec.affinity, spec.tolerations, "
         "spec.priorityClassName, spec.nodeName, spec.terminationGracePeriodSeconds")
"""``[leoflow] pod_override_allow``: leoflow's default list and the two fields the fault DAGs set."""
EXTRA = {"AIRFLOW__LEOFLOW__POD_OVERRIDE_ALLOW": ALLOW}
INFRA = "leoflow infra re-drive"
FAILED = "leoflow task failed"
PODGC_BOUND = 110.0
"""Seconds PodGC may take once a Node is deleted: a pass every 20 s, a 40 s quarantine (40-60 s, 80 s at worst:
scripts/k8senv), plus margin for a loaded host. It must stay below ``[leoflow] agent_lost_threshold`` (120 s of a
silent heartbeat), or leoflow's own agent-lost reaper could settle the attempt first (with another reason than the
one asserted)."""


@pytest.fixture(scope="module")
def kube_stack(tmp_path_factory: pytest.TempPathFactory):
    """``(stack, kube)``: the module's Airflow (started, :data:`DAGS` serialized) on its Kubernetes."""
    require_binaries()
    t0 = time.monotonic()
    work = tmp_path_factory.mktemp("kube-failures")
    reuse = os.environ.get("K8SENV_DIR")
    with KubeStack(work / "kube", reuse_dir=Path(reuse) if reuse else None, build=False) as kube:
        stack = FaultStack(work / "airflow", extra_env=EXTRA, parallelism=8)
        try:
            kube.configure(stack)
            stack.up(DAGS)
            print(f"stack up in {time.monotonic() - t0:.0f}s")
            yield stack, kube
        except BaseException:
            print("task pods:\n  " + "\n  ".join(kube.describe_pods()))
            raise
        finally:
            left = stack.stop()
            print(f"module wall time {time.monotonic() - t0:.0f}s")
        assert not left, f"processes left after stopping the stack: {left}"


# ---------------------------------------------------------------------------------------------------- helpers


def _ledger(stack: FaultStack, run_id: str, dag_id: str) -> list[tuple]:
    """``(try_number, attempt_epoch, state, resolution, pod_name, pod_uid)`` of each ledger row of the TI."""
    return stack.db("select try_number, attempt_epoch, state, resolution, pod_name, pod_uid from leoflow_attempt "
                    "where dag_id=? and run_id=? and task_id=? order by id", dag_id, run_id, TASK)


def _settled(stack: FaultStack, run_id: str, dag_id: str) -> list[tuple]:
    """``(try_number, attempt_epoch, state, resolution)`` of each ledger row once every row is closed (a pod's end
    is seen after its TI's report), or as they are after 90 s (the assertion then shows what is still open)."""
    def closed() -> list[tuple] | None:
        rows = [r[:4] for r in _ledger(stack, run_id, dag_id)]
        return rows if rows and all(r[2] == "closed" for r in rows) else None

    try:
        return wait_until(closed, 90, f"every ledger row of {dag_id} {run_id} closed")
    except TimeoutError:
        return [r[:4] for r in _ledger(stack, run_id, dag_id)]


def _log_rows(stack: FaultStack, dag_id: str, run_id: str) -> list[tuple[str, str]]:
    """``(event, extra)`` of the TI's event log (Airflow's ``log`` table, the UI's event log), oldest first."""
    return stack.db("select event, coalesce(extra, '') from log where dag_id=? and run_id=? and task_id=? "
                    "order by id", dag_id, run_id, TASK)


def _running_try(stack: FaultStack, kube: KubeStack, dag_id: str, run_id: str, try_number: int) -> str:
    """Wait until the body of ``try_number`` has started in a Running pod whose UID the ledger holds; the pod's
    name."""
    def started() -> str | None:
        if not [e for e in executions(stack, dag_id, TASK, run_id) if e.try_number == try_number]:
            return None
        rows = [r for r in _ledger(stack, run_id, dag_id) if r[0] == try_number and r[5]]
        if not rows:
            return None
        name, uid = rows[-1][4], rows[-1][5]
        versions = kube.pods().get(uid)
        return name if versions and (versions[-1].get("status") or {}).get("phase") == "Running" else None

    return wait_until(started, 240, f"{dag_id} try {try_number}'s body running in its pod")


def _release(stack: FaultStack, run_id: str, try_number: int) -> None:
    (stack.traces_dir / f"release.{run_id}.{try_number}").write_text("go\n")


def _check_bodies(stack: FaultStack, dag_id: str, run_id: str, *, lost_tries: set[int], ended_tries: set[int]) -> list:
    """The body executions of the TI, after asserting: one per try in ``lost_tries | ended_tries``, those of
    ``lost_tries`` never ended (their pod was lost or stopped before the body's end), those of ``ended_tries``
    ended; no two overlapped; none started after one had ended (a recorded success never runs again)."""
    execs = executions(stack, dag_id, TASK, run_id)
    assert sorted(e.try_number for e in execs) == sorted(lost_tries | ended_tries), execs
    assert {e.try_number for e in execs if not e.ended} == lost_tries, execs
    assert overlaps(execs) == [], execs
    for i, e in enumerate(execs):
        assert not (e.ended and execs[i + 1:]), f"a body ran after one that ended: {execs}"
    return execs


def _disruption(pod: dict) -> dict | None:
    return next((c for c in (pod.get("status") or {}).get("conditions") or [] if c["type"] == "DisruptionTarget"),
                None)


def _callbacks(stack: FaultStack, dag_id: str) -> list[str]:
    path = stack.traces_dir / "callbacks.log"
    return [line for line in (path.read_text().splitlines() if path.exists() else []) if line.startswith(dag_id + " ")]


# ---------------------------------------------------------------------------------------------------- tests


def test_a_lost_node_s_task_is_rerun_as_a_new_try_on_the_infra_budget(kube_stack) -> None:
    """``lf_knode.work`` (retries 0) runs on ``harness-node-lost``; while its body runs the node is lost (its harness
    kills every process and reports nothing; the Node is deleted). The real PodGC marks the pod Failed with
    ``DisruptionTarget`` ``DeletionByPodGC`` and deletes it; a Node of the same name comes back (a new harness:
    the replacement machine). The TI is re-run as try 2 on the infra budget: ``max_tries`` 0 → 1 (up by exactly
    one, the user's retries untouched: no retry or failure callback), one ``leoflow infra re-drive`` Log row
    naming PodGC; try 1's body never ended, try 2's ran once and succeeded."""
    from tests.k8s.harness import NodeHarness

    stack, kube = kube_stack
    lost = NodeHarness(kube.api, LOST_NODE, kube.workdir / "harness-lost")
    replacement = None
    try:
        lost.start()
        run = stack.trigger_with(NODE_DAG)
        first_pod = _running_try(stack, kube, NODE_DAG, run, 1)
        before = stack.ti_row(NODE_DAG, run, TASK)
        assert (before["state"], before["try_number"], before["max_tries"]) == ("running", 1, 0), before

        lost.lose_node()
        t_lost = time.monotonic()
        first_uid = next(r[5] for r in _ledger(stack, run, NODE_DAG) if r[4] == first_pod)

        def gone() -> bool:
            kube.record_current()
            return first_uid in kube.pods() and not any(
                p["metadata"]["uid"] == first_uid for p in _live(kube))

        wait_until(gone, PODGC_BOUND, "PodGC to delete the lost node's pod")
        print(f"node loss: PodGC removed the pod {time.monotonic() - t_lost:.0f}s after the Node's deletion")
        replacement = NodeHarness(kube.api, LOST_NODE, kube.workdir / "harness-replacement").start()

        _running_try(stack, kube, NODE_DAG, run, 2)
        _release(stack, run, 2)
        assert stack.wait_for_run(NODE_DAG, run, timeout=240) == "success"
    finally:
        lost.stop()
        if replacement is not None:
            replacement.stop()
        _delete_node(kube)

    ti = stack.ti_row(NODE_DAG, run, TASK)
    assert (ti["state"], ti["try_number"], ti["max_tries"]) == ("success", 2, 1), ti
    first_versions = kube.pods()[first_uid]
    failed = [v for v in first_versions if (v.get("status") or {}).get("phase") == "Failed"]
    assert failed and (_disruption(failed[0]) or {}).get("reason") == "DeletionByPodGC", first_versions[-1]["status"]
    rows = _log_rows(stack, NODE_DAG, run)
    infra = [extra for event, extra in rows if event == INFRA]
    assert len(infra) == 1 and "DeletionByPodGC" in infra[0] and "max_tries 0 -> 1" in infra[0], rows
    assert FAILED not in [e for e, _ in rows], rows
    ledger = _settled(stack, run, NODE_DAG)
    assert ledger == [(1, 1, "closed", "infra_redrive"), (2, 1, "closed", "reported")], ledger
    _check_bodies(stack, NODE_DAG, run, lost_tries={1}, ended_tries={2})
    assert _callbacks(stack, NODE_DAG) == [f"{NODE_DAG} {TASK} 2 success"]


def test_an_oom_kill_is_redriven_once_and_the_log_names_it(kube_stack) -> None:
    """The harness OOM-kills the agent container of ``lf_khold.work`` while its body runs (``OOMKilled``, exit 137;
    the whole container's processes die). Re-driven once on the infra budget: try 2, ``max_tries`` 0 → 1, the Log
    row names ``OOMKilled, exit 137, container base``; try 2 runs and succeeds. A second run is OOM-killed on both
    tries: the second kill fails the TI through Airflow (no third try) with a ``leoflow task failed`` Log row
    naming it."""
    stack, kube = kube_stack
    once = stack.trigger_with(HOLD_DAG)
    twice = stack.trigger_with(HOLD_DAG)
    for run in (once, twice):
        kube.harness.oom_kill(kube.namespace, _running_try(stack, kube, HOLD_DAG, run, 1))
    _running_try(stack, kube, HOLD_DAG, once, 2)
    _release(stack, once, 2)
    kube.harness.oom_kill(kube.namespace, _running_try(stack, kube, HOLD_DAG, twice, 2))
    assert stack.wait_for_run(HOLD_DAG, once, timeout=240) == "success"
    assert stack.wait_for_run(HOLD_DAG, twice, timeout=240) == "failed"

    ti = stack.ti_row(HOLD_DAG, once, TASK)
    assert (ti["state"], ti["try_number"], ti["max_tries"]) == ("success", 2, 1), ti
    rows = _log_rows(stack, HOLD_DAG, once)
    infra = [extra for event, extra in rows if event == INFRA]
    assert len(infra) == 1 and infra[0].startswith("OOMKilled, exit 137, container base (pod "), rows
    assert "max_tries 0 -> 1" in infra[0], rows
    ledger = _settled(stack, once, HOLD_DAG)
    assert ledger == [(1, 1, "closed", "oom_redrive"), (2, 1, "closed", "reported")], ledger
    _check_bodies(stack, HOLD_DAG, once, lost_tries={1}, ended_tries={2})

    ti = stack.ti_row(HOLD_DAG, twice, TASK)
    assert (ti["state"], ti["try_number"], ti["max_tries"]) == ("failed", 2, 1), ti
    rows = _log_rows(stack, HOLD_DAG, twice)
    assert [e for e, _ in rows].count(INFRA) == 1, rows
    failed = [extra for event, extra in rows if event == FAILED]
    assert len(failed) == 1 and failed[0].startswith("OOMKilled, exit 137, container base (pod "), rows
    assert "OOM-killed again" in failed[0], rows
    ledger = _settled(stack, twice, HOLD_DAG)
    assert ledger == [(1, 1, "closed", "oom_redrive"), (2, 1, "closed", "executor_failed")], ledger
    _check_bodies(stack, HOLD_DAG, twice, lost_tries={1, 2}, ended_tries=set())


def test_an_eviction_through_the_eviction_api_is_redriven_naming_it(kube_stack) -> None:
    """``lf_khold.work``'s pod is evicted through the real Eviction API while its body runs (no
    PodDisruptionBudget: the API server adds ``DisruptionTarget`` ``EvictionByEvictionAPI`` and deletes it; the
    harness stops it as a kubelet does). Re-driven on the infra budget: try 2, ``max_tries`` 0 → 1, the Log row
    names ``EvictionByEvictionAPI``, no retry or failure callback; try 2 succeeds; try 1's body never ended."""
    from kubernetes import client

    stack, kube = kube_stack
    run = stack.trigger_with(HOLD_DAG)
    pod = _running_try(stack, kube, HOLD_DAG, run, 1)
    client.CoreV1Api(kube.api).create_namespaced_pod_eviction(pod, kube.namespace, client.V1Eviction(
        metadata=client.V1ObjectMeta(name=pod, namespace=kube.namespace)))
    _running_try(stack, kube, HOLD_DAG, run, 2)
    _release(stack, run, 2)
    assert stack.wait_for_run(HOLD_DAG, run, timeout=240) == "success"

    ti = stack.ti_row(HOLD_DAG, run, TASK)
    assert (ti["state"], ti["try_number"], ti["max_tries"]) == ("success", 2, 1), ti
    rows = _log_rows(stack, HOLD_DAG, run)
    infra = [extra for event, extra in rows if event == INFRA]
    assert len(infra) == 1 and "EvictionByEvictionAPI" in infra[0] and "max_tries 0 -> 1" in infra[0], rows
    ledger = _settled(stack, run, HOLD_DAG)
    assert ledger == [(1, 1, "closed", "infra_redrive"), (2, 1, "closed", "reported")], ledger
    _check_bodies(stack, HOLD_DAG, run, lost_tries={1}, ended_tries={2})


def test_a_pod_past_its_deadline_fails_the_task_with_the_reason_never_redriven(kube_stack) -> None:
    """The harness ends ``lf_khold.work``'s pod as the kubelet's ``activeDeadlineSeconds`` check does (Failed,
    reason ``DeadlineExceeded``) while its body runs: the TI fails at try 1 (``max_tries`` still 0, no infra
    re-drive) with a ``leoflow task failed`` Log row naming ``DeadlineExceeded``; its body ran once, never ended."""
    stack, kube = kube_stack
    run = stack.trigger_with(HOLD_DAG)
    kube.harness.exceed_deadline(kube.namespace, _running_try(stack, kube, HOLD_DAG, run, 1))
    assert stack.wait_for_run(HOLD_DAG, run, timeout=240) == "failed"

    ti = stack.ti_row(HOLD_DAG, run, TASK)
    assert (ti["state"], ti["try_number"], ti["max_tries"]) == ("failed", 1, 0), ti
    rows = _log_rows(stack, HOLD_DAG, run)
    assert INFRA not in [e for e, _ in rows], rows
    failed = [extra for event, extra in rows if event == FAILED]
    assert len(failed) == 1 and failed[0].startswith("DeadlineExceeded: Pod was active on the node longer than the "
                                                     "specified deadline"), rows
    ledger = _settled(stack, run, HOLD_DAG)
    assert ledger == [(1, 1, "closed", "executor_failed")], ledger
    _check_bodies(stack, HOLD_DAG, run, lost_tries={1}, ended_tries=set())


# ---------------------------------------------------------------------------------------------------- plumbing


def _live(kube: KubeStack) -> list[dict]:
    import json

    from kubernetes import client

    return json.loads(client.CoreV1Api(kube.api).list_namespaced_pod(kube.namespace, _preload_content=False)
                      .data)["items"]


def _delete_node(kube: KubeStack) -> None:
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    try:
        client.CoreV1Api(kube.api).delete_node(LOST_NODE)
    except ApiException as exc:
        if exc.status != 404:
            raise
