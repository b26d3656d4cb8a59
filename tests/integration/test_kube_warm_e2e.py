"""Issue 11 acceptance for Kubernetes warm pods, end to end: a real Airflow (scheduler, dag-processor, api-server on
SQLite) with ``[leoflow] runtime = kubernetes`` on the k8senv control plane (its real garbage collector), every pod,
warm pods included, running the real agent (``python -m leoflow_agent warm-pod``): on the real node with
``--real-node`` (a kubelet and containerd, leoflow's agent image), else in the node harness as local processes. One stack for the module (:class:`~fault_helpers.FaultStack` on
``tests/fault_dags``, DAGs in ``tests/fault_dags/leoflow_warm.py``); the tests run in file order:

1. the pools fill before any run (``prewarm``): each DAG version gets ``min_idle`` registered warm pods, each owned by
   its version's anchor ConfigMap (``controller: true``); the UI's pools API shows them and ``airflow leoflow
   doctor`` finds them within their caps;
2. a warm DAG's tasks start without a pod create and end as cold ones do;
3. isolation (``warm_isolation = read-only-root``): what an attempt leaves in ``/tmp``, ``$HOME``, ``$TMPDIR`` and
   ``/dev/shm`` is gone before the next attempt on that worker;
4. a warm worker killed mid-attempt: the attempt is re-driven on the infra budget (no user retry spent), the pool
   refills, no body runs twice; an OOM-killed one: the TI's Log row names ``OOMKilled``;
5. the parity set (``devtools.expected.KUBE_DAGS``: every ``leoflow_*`` DAG of ``dags/`` and three Airflow
   examples, the set ``test_kube_runtime_e2e.py`` runs cold) with a pool per DAG: every run ends as under
   LocalExecutor, each DAG's tasks took warm pods, and no attempt ran twice;
6. a lost control plane: the scheduler is SIGKILLed and a new one started; the new one's ``start()`` deletes the
   anchors of the dead scheduler job and the garbage collector removes every warm pod they owned.

Each asserts what a user notices: TI states, try numbers and ``max_tries``, the TI's event log, how often each body
ran, and the pods the namespace held; and the metrics an operator reads (issue 12: the stack's scheduler and
api-server send to a StatsD listener of the module): the pools' ``leoflow.warm.kubernetes.pods.<state>`` gauges,
the warm placements (``leoflow.warm.kubernetes.hit``), the warm pods' requests (``leoflow.warm.<route>.ok`` /
``delivered``) and the recoveries (``leoflow.recovery.infra_redrive``, ``oom_redrive``).
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from devtools import expected
from devtools.kube import KubeStack
from devtools.runs import run_all
from devtools.stack import API_USER, OUR_DAGS
from devtools.statsd import StatsdListener, airflow_env
from fault_helpers import FAULT_DAGS, FaultStack, executions, kube_fault_stack, wait_until
from kube_attempts import check_bodies, closed_rows, ledger_rows, release_try
from node_faults import HarnessNode, RealNode, node_of

pytestmark = [pytest.mark.k8s, pytest.mark.airflow, pytest.mark.either_node, pytest.mark.timeout(1800)]

HOLD_DAG, CHAIN_DAG, ISO_DAG = "lf_kwarm", "lf_kwarm_chain", "lf_kwarm_iso"
DAGS = [HOLD_DAG, CHAIN_DAG, ISO_DAG]
POOLS = {
    HOLD_DAG: {"min_idle": 2, "max_pool_size": 3, "prewarm": True},
    CHAIN_DAG: {"min_idle": 2, "max_pool_size": 2, "prewarm": True},
    ISO_DAG: {"min_idle": 1, "max_pool_size": 1, "prewarm": True},
}
"""``[leoflow] warm_pools``: the per-DAG override (no DAG code changes); ``warm_min_idle`` stays 0 elsewhere."""
PARITY_DAGS = list(expected.KUBE_DAGS)
PARITY_POOLS = {dag_id: {"min_idle": 1, "max_pool_size": 2} for dag_id in PARITY_DAGS}
PARITY_POOLS["leoflow_fanout"] = {"min_idle": 2, "max_pool_size": 3}
"""The parity set's pools: no ``prewarm`` (a pool exists while its DAG has a queued or running run), small (each warm
pod is a real process on a 2-core machine); a task that finds no idle warm pod gets a cold pod, as it would."""
LABEL = "leoflow.io/"
MEMORY_LIMIT = "1Gi"
"""The agent container's memory limit in the module's pod template (warm pods included): an idle warm pod uses about
250 MiB; the real node's OOM test grows a body past it."""
INFRA = "leoflow infra re-drive"
EXTRA = {
    "AIRFLOW__LEOFLOW__WARM_POOLS": json.dumps({**POOLS, **PARITY_POOLS}),
    "AIRFLOW__LEOFLOW__WARM_ISOLATION": "read-only-root",
    "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_THRESHOLD": "10",
    "AIRFLOW__LEOFLOW__POD_RETENTION_SUCCESS": "3600",
}


@pytest.fixture(scope="module")
def statsd():
    """The StatsD listener the module's stack sends its metrics to (``airflow.`` prefix)."""
    with StatsdListener() as listener:
        yield listener


@pytest.fixture(scope="module")
def kube_stack(tmp_path_factory: pytest.TempPathFactory, statsd: StatsdListener, kube_node: str):
    """``(stack, kube)``: the module's Airflow (started, :data:`DAGS` serialized) on its Kubernetes (the real node
    with ``--real-node``, else the harness), every pod's agent container limited to :data:`MEMORY_LIMIT`."""
    work = tmp_path_factory.mktemp("kube-warm")
    dags = work / "dags"
    dags.mkdir()
    for path in [*sorted(FAULT_DAGS.glob("*.py")), *sorted(OUR_DAGS.glob("*.py"))]:
        shutil.copyfile(path, dags / path.name)
    with kube_fault_stack(work, extra_env={**EXTRA, **airflow_env(statsd.port)}, dags=[*DAGS, *PARITY_DAGS],
                          dags_folder=dags, example_dags=expected.KUBE_EXAMPLE_FILES, node=kube_node,
                          memory_limit=MEMORY_LIMIT) as both:
        yield both


@pytest.fixture(scope="module")
def node(kube_stack) -> HarnessNode | RealNode:
    """The faults of the node that runs the module's pods (:mod:`node_faults`)."""
    return node_of(kube_stack[1])


# ---------------------------------------------------------------------------------------------------- helpers


def _labels(pod: dict) -> dict[str, str]:
    return pod["metadata"].get("labels") or {}


def _phase(pod: dict) -> str | None:
    return (pod.get("status") or {}).get("phase")


def _warm_pods(kube: KubeStack) -> dict[str, dict]:
    """``{uid: latest version}`` of every warm pod the namespace ever held (deleted ones included)."""
    return {uid: versions[-1] for uid, versions in kube.pods().items()
            if _labels(versions[-1]).get(LABEL + "warm") == "true"}


def _task_pods(kube: KubeStack, dag_id: str) -> list[dict]:
    """The cold task pods ever created for ``dag_id`` (latest versions)."""
    return [versions[-1] for versions in kube.pods().values()
            if _labels(versions[-1]).get(LABEL + "dag-id") == dag_id
            and _labels(versions[-1]).get(LABEL + "warm") != "true"]


def _versions(stack: FaultStack) -> dict[str, str]:
    """``{dag_id: its latest dag_version_id}`` for every DAG."""
    rows = stack.db("select dag_id, id from dag_version order by version_number")
    return {dag_id: str(vid) for dag_id, vid in rows}


def _workers(stack: FaultStack) -> list[dict]:
    """Every row of ``leoflow_warm_worker``."""
    cols = ("pod_uid", "pod_name", "dag_version_id", "state", "ti_id", "try_number", "attempt_epoch",
            "attempts_taken", "last_seen_at")
    return [dict(zip(cols, row)) for row in stack.db(f"select {', '.join(cols)} from leoflow_warm_worker")]


def _same_version(a: str | None, b: str) -> bool:
    """Airflow stores a ``dag_version`` id as a UUID; SQLite gives it with or without dashes."""
    return a is not None and a.replace("-", "") == b.replace("-", "")


def _idle(stack: FaultStack, kube: KubeStack, dag_id: str) -> list[dict]:
    """The ready warm workers of ``dag_id``'s current version: registered, idle, awaiting (a worker awaits once it
    has parsed its DAG file), their pod Running and not deleting."""
    version = _versions(stack)[dag_id]
    pods = _warm_pods(kube)
    out = []
    for row in _workers(stack):
        pod = pods.get(row["pod_uid"])
        if (row["state"] == "idle" and row["last_seen_at"] and _same_version(row["dag_version_id"], version) and pod is not None
                and _phase(pod) == "Running" and not pod["metadata"].get("deletionTimestamp")):
            out.append(row)
    return out


def _wait_pools_full(stack: FaultStack, kube: KubeStack, timeout: float = 300.0) -> dict[str, list[dict]]:
    """Wait until every pool of :data:`POOLS` has ``min_idle`` idle registered workers; them, per DAG."""
    def full() -> dict[str, list[dict]] | None:
        idle = {dag_id: _idle(stack, kube, dag_id) for dag_id in POOLS}
        return idle if all(len(idle[d]) >= POOLS[d]["min_idle"] for d in POOLS) else None

    try:
        return wait_until(full, timeout, "every warm pool to hold min_idle idle workers", poll=1.0)
    except TimeoutError:
        print("warm workers:", _workers(stack))
        print("pods:\n  " + "\n  ".join(kube.describe_pods()))
        raise


def _running_on_warm(stack: FaultStack, kube: KubeStack, run_id: str, try_number: int) -> dict:
    """Wait until ``lf_kwarm.work`` try ``try_number``'s body runs on a warm pod; that pod's latest version."""
    def running() -> dict | None:
        if not [e for e in executions(stack, HOLD_DAG, "work", run_id) if e.try_number == try_number]:
            return None
        rows = [r for r in ledger_rows(stack, HOLD_DAG, run_id, "work") if r["try_number"] == try_number]
        if not rows or not rows[-1]["pod_uid"]:
            return None
        return _warm_pods(kube).get(rows[-1]["pod_uid"])

    return wait_until(running, 240, f"{HOLD_DAG} try {try_number}'s body running on a warm pod")


def _log_rows(stack: FaultStack, dag_id: str, run_id: str, task_id: str) -> list[tuple[str, str]]:
    return stack.db("select event, coalesce(extra, '') from log where dag_id=? and run_id=? and task_id=? "
                    "order by id", dag_id, run_id, task_id)


# ---------------------------------------------------------------------------------------------------- tests


def test_prewarm_fills_every_pool_with_registered_pods_owned_by_their_anchor(kube_stack, statsd) -> None:
    """With ``prewarm`` on and no run yet, each DAG version gets ``min_idle`` warm pods that registered with the
    plugin app (idle rows in the ledger), each labelled with its version and owned by that version's anchor
    ConfigMap (``controller: true``); no pool goes past ``max_pool_size``; no task pod exists. The scheduler's
    pool tick gauges them: ``leoflow.warm.kubernetes.pods.idle`` reaches the sum of the pools' ``min_idle``."""
    stack, kube = kube_stack
    idle = _wait_pools_full(stack, kube)
    versions = _versions(stack)
    pods = _warm_pods(kube)
    for dag_id, rows in idle.items():
        of_version = [p for p in pods.values()
                      if _same_version(_labels(p).get(LABEL + "dag-version"), versions[dag_id])
                      and _phase(p) not in ("Succeeded", "Failed")]
        assert POOLS[dag_id]["min_idle"] <= len(of_version) <= POOLS[dag_id]["max_pool_size"], (dag_id, of_version)
        for row in rows:
            pod = pods[row["pod_uid"]]
            owners = pod["metadata"].get("ownerReferences") or []
            assert [(o["kind"], o.get("controller")) for o in owners] == [("ConfigMap", True)], owners
            assert owners[0]["name"].startswith("leoflow-warm-"), owners
            assert pod["spec"]["containers"][0]["args"] == ["python", "-m", "leoflow_agent", "warm-pod"]
    assert [p for d in DAGS for p in _task_pods(kube, d)] == []
    # the UI's pools API (behind Airflow's auth) shows the same pools, by DAG
    token = httpx.post(f"{stack.public_url}/auth/token", json={"username": API_USER, "password": stack._password},
                       timeout=30).json()["access_token"]
    body = httpx.get(f"{stack.public_url}/leoflow/v1/ui/pools", headers={"Authorization": f"Bearer {token}"},
                     timeout=30).json()
    shown = {p["dag_id"]: p for p in body["pools"]}
    assert body["runtime"] == "kubernetes", body
    for dag_id, pool in POOLS.items():
        assert shown[dag_id]["ready"] >= pool["min_idle"] and shown[dag_id]["busy"] == 0, body
    # and `airflow leoflow doctor` finds every pool within its cap
    r = subprocess.run([str(Path(sys.executable).parent / "airflow"), "leoflow", "doctor", "--json"],
                       env=stack.env(), capture_output=True, text=True, timeout=180, cwd=stack.home)
    found = {f["name"]: f for f in json.loads(r.stdout[r.stdout.index("{"):])["findings"]}
    assert found["warm_pools"]["status"] == "ok", found["warm_pools"]
    assert found["warm_pools"]["detail"] == f"{len(POOLS)} warm pool(s) within their caps", found["warm_pools"]
    # the pool tick's gauges (every tick: within seconds of the pools filling)
    min_idle = sum(p["min_idle"] for p in POOLS.values())
    wait_until(lambda: max(statsd.gauges("airflow.leoflow.warm.kubernetes.pods.idle"), default=0) >= min_idle, 30,
               "the idle warm pods gauged", poll=0.5)
    assert {"leoflow.warm.kubernetes.pods.starting", "leoflow.warm.kubernetes.pods.busy",
            "leoflow.warm.kubernetes.pods.draining", "leoflow.warm.register.ok"} <= statsd.names("airflow.")


def test_a_warm_dag_s_tasks_start_without_a_pod_create(kube_stack, statsd) -> None:
    """``lf_kwarm_chain`` (a pool of 2 idle workers) runs its four tasks on warm pods: no pod is created for it,
    every attempt's ledger row names a warm pod, and the run ends as it does cold (each TI SUCCESS at try 1, the
    XCom chain counted 4); each placement is a ``leoflow.warm.kubernetes.hit``, each delivery a
    ``leoflow.warm.await.delivered`` and each stored record a ``leoflow.warm.outcome.ok``."""
    stack, kube = kube_stack
    _wait_pools_full(stack, kube)
    before = set(kube.pods())
    run_id = stack.trigger_with(CHAIN_DAG)
    assert stack.wait_for_run(CHAIN_DAG, run_id, timeout=240) == "success"
    warm = _warm_pods(kube)
    for i in range(4):
        ti = stack.ti_row(CHAIN_DAG, run_id, f"link_{i}")
        assert (ti["state"], ti["try_number"]) == ("success", 1), ti
        rows = ledger_rows(stack, CHAIN_DAG, run_id, f"link_{i}")
        assert [r["pod_uid"] in warm for r in rows] == [True], rows
    assert _task_pods(kube, CHAIN_DAG) == []
    created = [uid for uid in kube.pods() if uid not in before and _labels(kube.pods()[uid][-1]).get(
        LABEL + "dag-version") is None]
    assert created == [], "pods were created for the warm DAG's run"
    want = {"leoflow.warm.kubernetes.hit", "leoflow.warm.await.delivered", "leoflow.warm.outcome.ok"}
    assert want <= statsd.wait_names(want, timeout=30), sorted(statsd.names("airflow."))
    hits = [x for x in statsd.samples() if x.name == "airflow.leoflow.warm.kubernetes.hit"]
    assert sum(int(x.value) for x in hits) >= 4, hits


def test_what_an_attempt_leaves_is_gone_before_the_next_attempt_on_its_worker(kube_stack) -> None:
    """``lf_kwarm_iso``'s pool holds one worker, so ``write`` and ``check`` run on the same warm pod one after the
    other: ``write`` leaves a file in ``/tmp``, ``$HOME``, ``$TMPDIR`` and ``/dev/shm``; ``check`` finds none of
    them."""
    stack, kube = kube_stack
    _wait_pools_full(stack, kube)
    run_id = stack.trigger_with(ISO_DAG)
    assert stack.wait_for_run(ISO_DAG, run_id, timeout=240) == "success"
    pods = {r["pod_uid"] for task in ("write", "check") for r in ledger_rows(stack, ISO_DAG, run_id, task)}
    assert len(pods) == 1 and pods <= set(_warm_pods(kube)), pods
    written = json.loads(stack.db("select value from xcom where dag_id=? and run_id=? and task_id='write'",
                                  ISO_DAG, run_id)[0][0])
    assert any(p.startswith("/tmp/") for p in written), written


def test_a_warm_worker_killed_mid_attempt_is_redriven_on_the_infra_budget_and_the_pool_refills(kube_stack, node,
                                                                                                statsd) -> None:
    """Every process of the warm pod running ``lf_kwarm.work``'s body is SIGKILLed (the harness kills its process
    tree; on the real node containerd kills the container's processes: exit 137). The attempt is re-driven once on the infra
    budget (try 2, ``max_tries`` 0 → 1, a Log row ``leoflow infra re-drive``), try 2 runs and succeeds, no body
    ran twice at once nor after one had ended, and the pool is back to ``min_idle`` idle workers."""
    stack, kube = kube_stack
    _wait_pools_full(stack, kube)
    run_id = stack.trigger_with(HOLD_DAG)
    pod = _running_on_warm(stack, kube, run_id, 1)
    node.kill_container(pod["metadata"]["name"], pod["metadata"]["uid"])
    _running_on_warm(stack, kube, run_id, 2)
    release_try(stack, run_id, 2)
    assert stack.wait_for_run(HOLD_DAG, run_id, timeout=240) == "success"
    ti = stack.ti_row(HOLD_DAG, run_id, "work")
    assert (ti["state"], ti["try_number"], ti["max_tries"]) == ("success", 2, 1), ti
    rows = _log_rows(stack, HOLD_DAG, run_id, "work")
    assert [e for e, _ in rows].count(INFRA) == 1, rows
    ledger = closed_rows(stack, run_id, HOLD_DAG)
    assert [r[3] for r in ledger] == ["infra_redrive", "reported"], ledger
    check_bodies(stack, HOLD_DAG, run_id, lost_tries={1}, ended_tries={2})
    assert "leoflow.recovery.infra_redrive" in statsd.wait_names({"leoflow.recovery.infra_redrive"})
    _wait_pools_full(stack, kube)
    assert pod["metadata"]["uid"] not in {r["pod_uid"] for r in _idle(stack, kube, HOLD_DAG)}


def test_an_oom_killed_warm_worker_is_named_in_the_task_s_log(kube_stack, node, statsd) -> None:
    """An OOM kill while ``lf_kwarm.work``'s body runs on a warm pod: the harness OOM-kills the whole pod
    (``OOMKilled``, exit 137), which the warm-worker-lost path settles; on the real node the body outgrows the
    container's :data:`MEMORY_LIMIT` and the kernel's OOM killer ends the task process alone (cgroup v1), which the
    warm pod's agent refuses to report as the task's failure (``oom_killed``). Either way the attempt is re-driven
    once on the infra budget, the Log row names the OOM kill, and the recovery is counted as
    ``leoflow.recovery.oom_redrive``."""
    stack, kube = kube_stack
    _wait_pools_full(stack, kube)
    run_id = stack.trigger_with(HOLD_DAG)
    pod = _running_on_warm(stack, kube, run_id, 1)
    node.oom(stack.traces_dir, run_id, pod["metadata"]["name"], try_number=1)
    _running_on_warm(stack, kube, run_id, 2)
    release_try(stack, run_id, 2)
    assert stack.wait_for_run(HOLD_DAG, run_id, timeout=240) == "success"
    ti = stack.ti_row(HOLD_DAG, run_id, "work")
    assert (ti["state"], ti["try_number"], ti["max_tries"]) == ("success", 2, 1), ti
    infra = [extra for event, extra in _log_rows(stack, HOLD_DAG, run_id, "work") if event == INFRA]
    assert len(infra) == 1 and ("OOMKilled" in infra[0] or "OOM killer" in infra[0]), infra
    ledger = closed_rows(stack, run_id, HOLD_DAG)
    assert [r[3] for r in ledger] == ["oom_redrive", "reported"], ledger
    check_bodies(stack, HOLD_DAG, run_id, lost_tries={1}, ended_tries={2})
    assert "leoflow.recovery.oom_redrive" in statsd.wait_names({"leoflow.recovery.oom_redrive"})


def test_the_parity_dag_set_ends_as_cold_with_warm_pools_on(kube_stack) -> None:
    """The parity set (:data:`PARITY_DAGS`) with :data:`PARITY_POOLS`: each DAG is triggered paused, its pool
    fills for its queued run, then all are unpaused at once. Every run ends as under LocalExecutor (run and task
    states, the callbacks' trace lines); every DAG's tasks took warm pods (attempts in the ledger bound to a warm
    pod); every cold pod created during the run carries exactly one attempt; every attempt epoch was reported by
    its worker, one per try but a reschedule's (no re-drive, nothing ran twice), except cold pods the node refused for
    lack of room (the real node's 2 CPUs), which were re-offered as backpressure without a try spent. None of the set
    asks for resources in its ``executor_config``, so none is cold by design."""
    stack, kube = kube_stack
    for dag_id in PARITY_DAGS:
        stack.pause(dag_id)
    before = set(kube.pods())
    t0 = time.monotonic()

    def pools_filled(runs: dict[str, str]) -> None:
        wait_until(lambda: all(len(_idle(stack, kube, d)) >= PARITY_POOLS[d]["min_idle"] for d in runs), 300,
                   "every parity DAG's warm pool to hold min_idle idle workers", poll=1.0)
        print(f"parity pools filled in {time.monotonic() - t0:.0f}s")

    runs = run_all(stack, PARITY_DAGS, timeout=600, before_unpause=pools_filled)
    print(f"parity runs ended in {time.monotonic() - t0:.0f}s")
    problems = {d: expected.mismatches(d, runs[d].state, runs[d].tasks) for d in PARITY_DAGS}
    assert {d: p for d, p in problems.items() if p} == {}
    traces = sorted(line for path in stack.traces_dir.glob("*.log") for line in path.read_text().splitlines()
                    if line.split(" ", 1)[0] in PARITY_DAGS)
    assert traces == list(expected.EXPECTED_TRACES)

    cols = ("dag_id", "task_id", "map_index", "try_number", "attempt_epoch", "state", "resolution", "pod_uid", "ti_id",
            "detail")

    def attempts() -> list[dict]:
        rows = [dict(zip(cols, row)) for d in PARITY_DAGS
                for row in stack.db(f"select {', '.join(cols)} from leoflow_attempt where dag_id=? and run_id=? "
                                    "order by id", d, runs[d].run_id)]
        return rows if rows and all(r["state"] == "closed" for r in rows) else None

    rows = wait_until(attempts, 90, "every parity attempt to be settled")
    warm = set(_warm_pods(kube))
    cold = {uid for uid, versions in kube.pods().items() if uid not in before and uid not in warm}
    by_dag = {d: [r["pod_uid"] in warm for r in rows if r["dag_id"] == d] for d in PARITY_DAGS}
    print("warm / all attempts:", {d: f"{sum(v)}/{len(v)}" for d, v in by_dag.items()})
    assert [d for d, v in by_dag.items() if not any(v)] == [], "DAGs none of whose tasks took a warm pod"
    # every attempt ran in a pod, warm or its own cold one; every cold pod of the run carries one attempt
    assert [r for r in rows if r["pod_uid"] not in warm | cold] == []
    cold_uids = [r["pod_uid"] for r in rows if r["pod_uid"] in cold]
    assert sorted(cold_uids) == sorted(cold), "a cold pod carried no attempt, or more than one"
    # a cold pod the node had no room for (the real node: 2 CPUs hold 20 pods of 100m, fewer than the pools and the
    # cold pods together) is refused by the kubelet before it starts (OutOfcpu): that launch is re-offered as
    # backpressure, no try spent (the TI states above) and no body started
    no_room = [r for r in rows if r["resolution"] == "launch_failed"]
    assert [r for r in no_room if "refused by its node for lack of room" not in (r["detail"] or "")] == [], no_room
    if kube.node != "real":
        assert no_room == [], no_room
    ran = [r for r in rows if r["resolution"] != "launch_failed"]
    # nothing ran twice: every other epoch reported by its worker (no infra re-drive), and a task instance has one
    # such epoch per try plus one per reschedule Airflow recorded (leoflow_sensor's reschedule mode reschedules once)
    assert {r["resolution"] for r in ran} == {"reported"}, ran
    reschedules = Counter(str(ti_id).replace("-", "") for (ti_id,) in stack.db("select ti_id from task_reschedule"))
    epochs = Counter(r["ti_id"].replace("-", "") for r in ran)
    tries_of: dict[str, set[int]] = {}
    for r in ran:
        tries_of.setdefault(r["ti_id"].replace("-", ""), set()).add(r["try_number"])
    assert {ti: n for ti, n in epochs.items() if n != len(tries_of[ti]) + reschedules[ti]} == {}, rows
    assert sum(reschedules[ti] for ti in epochs) == 1, reschedules
    tries = {(r["dag_id"], r["task_id"], r["map_index"], r["try_number"]) for r in rows}
    for d in PARITY_DAGS:
        assert [e for e, _ in stack.db("select event, extra from log where dag_id=? and run_id=?", d,
                                       runs[d].run_id) if e == INFRA] == [], d
    # the TIs a worker ran are those the ledger holds, at their last try
    executed = {(ti["dag_id"], ti["task_id"], ti["map_index"], ti["try_number"])
                for d in PARITY_DAGS for ti in stack.task_instances(d, runs[d].run_id)
                if ti["state"] in ("success", "failed") and ti["operator"] != "EmptyOperator"}
    assert executed <= tries, executed - tries


def test_a_lost_control_plane_s_warm_pods_are_garbage_collected(kube_stack) -> None:
    """The scheduler is SIGKILLed (its job's heartbeat stops) and a new one started: its ``start()`` deletes the
    anchors of the dead scheduler job, and the garbage collector removes every warm pod they owned; the new
    scheduler's pools fill again with pods of its own job."""
    from kubernetes import client

    stack, kube = kube_stack
    _wait_pools_full(stack, kube)
    old_job = {_labels(p).get(LABEL + "scheduler-job") for p in _warm_pods(kube).values()
               if _phase(p) == "Running" and not p["metadata"].get("deletionTimestamp")}
    assert len(old_job) == 1, old_job
    stack.kill_component("scheduler", signal.SIGKILL)
    time.sleep(12)  # past [scheduler] scheduler_health_check_threshold: the old job is no longer alive
    stack.start_component("scheduler")
    core = client.CoreV1Api(kube.api)

    def old_pods_gone() -> bool:
        pods = core.list_namespaced_pod(kube.namespace, label_selector=f"{LABEL}warm=true").items
        return not [p for p in pods if (p.metadata.labels or {}).get(LABEL + "scheduler-job") in old_job]

    try:
        wait_until(old_pods_gone, 180, "the dead scheduler job's warm pods to be garbage-collected", poll=1.0)
    except TimeoutError as exc:
        raise TimeoutError(f"{exc}\n" + "\n".join(_gc_diagnosis(stack, kube, old_job))) from None
    anchors = core.list_namespaced_config_map(kube.namespace, label_selector=f"{LABEL}warm-anchor=true").items
    assert not [a for a in anchors if (a.metadata.labels or {}).get(LABEL + "scheduler-job") in old_job]
    _wait_pools_full(stack, kube)


def _gc_diagnosis(stack: FaultStack, kube: KubeStack, jobs: set) -> list[str]:
    """Lines for a failed wait on the garbage collector: the warm pods of ``jobs`` left (phase, deletion, owners,
    finalizers), the anchors, the scheduler's lines about warm pods and anchors since its last start, and the
    kube-controller-manager's garbage-collector lines."""
    from kubernetes import client

    core = client.CoreV1Api(kube.api)
    lines = ["warm pods of the dead job left:"]
    for p in core.list_namespaced_pod(kube.namespace, label_selector=f"{LABEL}warm=true").items:
        if (p.metadata.labels or {}).get(LABEL + "scheduler-job") in jobs:
            owners = [(o.name, o.uid) for o in p.metadata.owner_references or []]
            lines.append(f"  {p.metadata.name} phase={p.status.phase} deletion={p.metadata.deletion_timestamp} "
                         f"owners={owners} finalizers={p.metadata.finalizers}")
    lines.append("anchors:")
    for a in core.list_namespaced_config_map(kube.namespace, label_selector=f"{LABEL}warm-anchor=true").items:
        lines.append(f"  {a.metadata.name} uid={a.metadata.uid} deletion={a.metadata.deletion_timestamp}")
    text = (stack.process_logs / "scheduler.log").read_text(errors="replace")
    since = text.rsplit("Starting the scheduler", 1)[-1]
    lines.append("scheduler since its last start (warm pods, anchors, errors):")
    lines += ["  " + line[:300] for line in since.splitlines()
              if "warm pods" in line or "anchor" in line or "Traceback" in line or "error" in line.lower()][-40:]
    kcm = next(iter(kube.workdir.rglob("kube-controller-manager.log")), None)
    if kcm is not None:
        lines.append(f"{kcm} (garbage collector lines and errors):")
        lines += ["  " + line[:300] for line in kcm.read_text(errors="replace").splitlines()
                  if "garbage" in line.lower() or line.startswith("E")][-20:]
    return lines
