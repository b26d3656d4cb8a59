"""Issue 10 item 7 acceptance: the chaos suite, Kubernetes edition, on a real Airflow with ``[leoflow] runtime =
kubernetes`` (the k8senv control plane with its real PodGC and Eviction API; the real node runs the pods with
``--real-node``, else the node harness, devtools/kube.py) and fault injection.

With ``--chaos``, at least 60 runs (with ``--chaos-ci``: :data:`CI_RUNS`, one wave) of ``lf_kchaos`` (one task
``work``, one retry; ``tests/fault_dags/leoflow_kchaos.py``), triggered in waves of :data:`WAVE` at once. A seeded RNG (the seed is printed; ``LEOFLOW_CHAOS_SEED`` replays it,
``LEOFLOW_CHAOS_RUNS`` sets the number of runs) gives every run one **pod-level fault**, each fault once per block of
:data:`POD_FAULTS` in a shuffled order:

* the pod agent SIGKILLs itself at a fault point (``[leoflow] test_fault_injection``'s plan, ``work/1/1``):
  ``before_run``, ``after_run``, ``after_record``, ``after_patch`` (``leoflow_agent.podmain.POD_FAULT_POINTS``);
* ``mid_task``: while the run's first body holds, the harness SIGKILLs the agent container's whole process tree
  (a pod agent cannot kill itself mid-task: that point needs the Lite zygote's marker; a container whose agent
  dies dies whole), exit 137, reason ``Error``;
* ``delete_graceful`` / ``delete_force``: while the body holds, the pod is deleted with its grace period (2 s: the
  Task SDK's task process ignores SIGTERM) or with grace 0 (UID precondition);
* ``evict``: while the body holds, an eviction through the Eviction API (``DisruptionTarget``
  ``EvictionByEvictionAPI``);
* ``oom``: while the body holds, the harness OOM-kills the agent container (``OOMKilled``, exit 137; at most one
  per TI: a second OOM fails the TI by design).

On top, each wave gets one **process-level fault**, each once per block of the test's faults, in a seeded order:

* ``none``;
* ``scheduler_sigkill``: SIGKILL the scheduler while the wave's TIs are being queued (mid-dispatch), start a new one;
* ``api_sigkill``: SIGKILL the api-server's process group the moment a body of the wave ends (its agent is
  reporting: the state PATCH, the exchange of pods starting), start a new one :data:`API_DOWN` s later. This fault
  has a test of its own, :func:`test_kube_chaos_api_server_killed_mid_report` (one wave). It found the issue-10
  bug: a pod whose Task SDK calls the Execution API during the outage fails its task with ``API_SERVER_ERROR``,
  which spent a user retry; the agent now refuses that failure (``api_unreachable``) and the task is re-run on
  the infra budget;
* ``forced_410``: while bodies run, the scheduler's and api-server's connections to the kube-apiserver (their
  kubeconfig points at a relay in the test, :class:`CuttableRelay`) are cut, the task pods change, etcd is advanced
  and compacted at its head, and the relay restored: the scheduler's pod informer re-watches from a compacted
  ``resourceVersion``, is answered ``410 Gone`` and relists (the scheduler log must say so);
* ``node_lost``: :data:`NODE_RUNS` of the wave's runs are ``lf_kchaos_node`` runs on a Node of their own
  (:data:`LOST_NODE`, a second node harness); once their bodies hold, the node is lost (the harness stops: every
  process dies, nothing reports; the Node is deleted), the real PodGC marks the pods Failed (``DeletionByPodGC``)
  and deletes them, and a replacement Node comes up.

**On the real node** (``--real-node``, as ``scripts/run-tests`` runs the module; issue 35) the pods run in leoflow's
agent image under a kubelet and containerd, and each fault is the real one (:mod:`node_faults`): ``mid_task``
containerd SIGKILLs every process of the agent container; ``oom`` the holding body outgrows the container's memory
limit and the kernel's OOM killer ends it (on this cgroup-v1 machine the task process alone: containerd reports
``OOMKilled`` with the agent's exit 0); ``node_lost`` the kubelet, containerd, the shims and every container process
are SIGKILLed, the Node is deleted, PodGC fails and deletes the pods, and the node is revived; one Node, so every run
of a ``node_lost`` wave is a node-loss run of ``lf_kchaos``. The partition wave stops the node's kubelet (SIGSTOP)
and cuts the pods off the api-server with iptables.

**The partition wave** (:func:`test_kube_chaos_partition`, issue 33): :data:`PARTITION_RUNS` runs on a node that
is cut off from the control plane while its pod processes run on: the Node deleted, or the pods deleted with a
grace the node never acts on, while the pods still reach Airflow; or the pods cut off from Airflow too (their
relay to the api-server, :func:`_relay_pods`), where the agent's lease must kill the body before any re-run.

Counted over every run, each must be 0: **lost successes** (a body that ended whose TI is not SUCCESS, or a body
that started after one had ended), **double runs** (two bodies of one TI overlapping, from the body traces),
**user retries spent** (``try_number - 1 != max_tries - retries``: every re-run came from the infra budget), and
**older touched newer** (a pod of a TI that has an older pod, deleted while active, not by the test's own fault and
not by a Kubernetes controller: every version of every pod is recorded, ``KubeStack.pods``). Every run must
succeed and every attempt be settled (its ledger row closed). The settlements that are deterministic are asserted
for every run that got the fault: ``oom`` → a ledger row ``oom_redrive`` and try 2; ``evict`` and ``node_lost``
→ a ledger row ``infra_redrive`` and try 2. For the rest, a run whose path differs from :data:`EXPECTED` (the
path when the fault meets the attempt alone) is counted as "other path" and named (a second fault met it), not
failed. The tables (pod fault × runs × counts × ledger resolutions; process fault × the same) are printed before
any assertion.

Wall time: 60 runs are about 140 cold pods (~5 s CPU each) plus PodGC's 40-60 s.
"""

from __future__ import annotations

import base64
import json
import os
import random
import signal
import threading
import time
import urllib.parse
import urllib.request
import uuid
from collections import Counter, defaultdict
from pathlib import Path

import psutil
import pytest

from devtools.kube import KubeStack, require_binaries
from devtools.stack import StackError
from fault_helpers import (FaultStack, chaos_table, executions, newer_pods_touched, overlaps, pod_order, pod_phase,
                           pods_by_ti, wait_until)
from node_faults import HarnessNode, alive, held_file, node_of
from tests.k8s.test_informer import CuttableRelay

pytestmark = [pytest.mark.k8s, pytest.mark.airflow, pytest.mark.either_node, pytest.mark.slow, pytest.mark.chaos,
              pytest.mark.tables]
# every test here runs with --chaos; test_kube_chaos also with --chaos-ci, at :data:`CI_RUNS` (one wave, its seed
# printed; issue 34)

DAG, NODE_DAG, TASK = "lf_kchaos", "lf_kchaos_node", "work"
OOM_DAG, PULL_DAG, DEADLINE_DAG = "lf_koom", "lf_kpull", "lf_kdeadline"
"""``tests/fault_dags/leoflow_kchaos.py``'s DAGs whose task fails after the OOM killer ended a child of it, whose
image cannot be pulled, and whose pod outlives its ``activeDeadlineSeconds``."""
MISSING_IMAGE = "127.0.0.1:1/leoflow/missing:1"
"""``tests/fault_dags/leoflow_kchaos.py``'s ``MISSING_IMAGE``."""
LOST_NODE = "harness-node-lost"
"""``tests/fault_dags/leoflow_kchaos.py``'s ``LOST_NODE``."""
AGENT_KILLS = ("before_run", "after_run", "after_record", "after_patch")
HELD_FAULTS = ("mid_task", "delete_graceful", "delete_force", "evict", "oom")
"""Pod faults the test injects while the run's first body holds."""
POD_FAULTS = ("before_run", "after_run", "mid_task", "after_record", "after_patch", "delete_graceful",
              "delete_force", "evict", "oom")
PROCESS_FAULTS = ("none", "scheduler_sigkill", "api_sigkill", "forced_410", "node_lost")
RETRIES = 1
# pod fault -> (try_number, max_tries, tries whose body started) of the TI once its run succeeded, the fault alone
EXPECTED = {
    "before_run": (1, 1, [1]),        # the agent died before /run: the same try re-dispatched as epoch 2
    "after_run": (2, 2, [2]),         # RUNNING, no record, no body: one infra re-run
    "mid_task": (2, 2, [1, 2]),       # RUNNING, no record: one infra re-run
    "after_record": (1, 1, [1]),      # the recorded success replayed from the termination message
    "after_patch": (1, 1, [1]),       # Airflow had the report already
    "delete_graceful": (2, 2, [1, 2]),
    "delete_force": (2, 2, [1, 2]),
    "evict": (2, 2, [1, 2]),
    "oom": (2, 2, [1, 2]),            # re-driven once on the infra budget
    "node_lost": (2, 2, [1, 2]),
}
PARTITIONS = ("partition_node_deleted", "partition_pod_deleted", "partition_cut")
"""The partition wave's cases (:func:`test_kube_chaos_partition`)."""
EXPECTED.update({
    "partition_node_deleted": (1, 1, [1]),  # the body heartbeats on: nothing is re-run, its success lands
    "partition_pod_deleted": (1, 1, [1]),
    "partition_cut": (2, 2, [1, 2]),        # the agent's lease kills the body; then one infra re-run
})
GRACE_SECONDS = 2
"""``tests/fault_dags/leoflow_kchaos.py``'s ``terminationGracePeriodSeconds``."""
PARTITION_RUNS = int(os.environ.get("LEOFLOW_PARTITION_RUNS", "24"))
PARTITION_WAVE = 8
PARTITION_HOLD = 30.0
"""Seconds a partitioned body still holds after the case's trigger took effect (PodGC failed its pod, the delete's
grace and ``pod_termination_valve`` ran out), so a re-run the scheduler wrongly starts overlaps it."""
LEASE_BOUND = 45.0 + 60.0 + 60.0
"""Seconds the partition_cut wave waits for the agents' lease to kill the bodies: ``agent_lease_seconds`` (45) +
``[core] killed_task_cleanup_time`` (60; the task process ignores SIGTERM) + margin for a loaded host."""
API_LOSS = "Execution API call went unanswered"
"""In the ledger ``detail`` of an attempt re-driven after its agent refused a failure an api-server outage caused
(``leoflow_airflow.reconcile.decide``, reason ``api_unreachable``)."""
SETTLED = {"oom": "oom_redrive", "evict": "infra_redrive", "node_lost": "infra_redrive"}
"""Pod faults whose settlement is deterministic: the ledger resolution one epoch must have (and try 2)."""
RUNS = int(os.environ.get("LEOFLOW_CHAOS_RUNS", "60"))
"""Runs of :func:`test_kube_chaos` with ``--chaos`` (15-22 minutes on the 2-core host)."""
CI_RUNS = 12
"""Runs of :func:`test_kube_chaos` with ``--chaos-ci``: one wave, one seeded process fault, seeded pod faults."""
WAVE = 12
NODE_RUNS = 4
WAVE_BUDGET = 12 * 60.0  # seconds for one wave's runs to end on a loaded 2-core host, its process fault included
PODGC_BOUND = 150.0  # PodGC: a pass every 20 s, a 40 s quarantine; margin for a loaded host
ALLOW = ("metadata.labels, metadata.annotations, spec.containers.image, spec.containers.imagePullPolicy, "
         "spec.containers.resources, spec.containers.env, spec.nodeSelector, spec.affinity, spec.tolerations, "
         "spec.priorityClassName, spec.nodeName, spec.terminationGracePeriodSeconds, spec.activeDeadlineSeconds")
EXTRA = {
    "AIRFLOW__LEOFLOW__POD_OVERRIDE_ALLOW": ALLOW,
    "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_THRESHOLD": "10",
    "AIRFLOW__SCHEDULER__ORPHANED_TASKS_CHECK_INTERVAL": "15",
}
API_DOWN = 15.0
"""Seconds the api-server stays dead after its SIGKILL before a new one is started (which takes 20-40 s more)."""
GONE = "410 Gone"


@pytest.fixture(scope="module")
def kube_stack(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest):
    """``(stack, kube, relay, pod_relay, node)``: the module's Airflow (started, both chaos DAGs serialized) on its
    Kubernetes, the relay of its scheduler's and api-server's kube-apiserver connections, the relay of the pods'
    Airflow connections (the harness only: the real node's are cut with iptables), and the node's faults
    (:mod:`node_faults`): the real node with ``--real-node``, else the node harness."""
    require_binaries()
    t0 = time.monotonic()
    work = tmp_path_factory.mktemp("kube-chaos")
    reuse = os.environ.get("K8SENV_DIR")
    real = request.config.getoption("--real-node")
    with KubeStack(work / "kube", reuse_dir=Path(reuse) if reuse else None, build=False,
                   node="real" if real else "harness") as kube:
        stack = FaultStack(work / "airflow", extra_env=EXTRA, parallelism=16, api_host=kube.api_host)
        server = urllib.parse.urlsplit(kube.env.server)
        relay = CuttableRelay((server.hostname, server.port))
        pod_relay = None if real else CuttableRelay(("127.0.0.1", stack.api_port))
        node = node_of(kube)
        try:
            kube.configure(stack)
            stack.extra_env["AIRFLOW__LEOFLOW__KUBE_CONFIG"] = str(_relayed_kubeconfig(kube, relay, work))
            if pod_relay is not None:
                _relay_pods(stack, kube, pod_relay)
            stack.up([DAG, NODE_DAG, OOM_DAG, PULL_DAG, DEADLINE_DAG])
            print(f"stack up in {time.monotonic() - t0:.0f}s ({kube.node} node)")
            yield stack, kube, relay, pod_relay, node
        except BaseException:
            print("task pods:\n  " + "\n  ".join(kube.describe_pods()))
            raise
        finally:
            left = stack.stop()
            relay.close()
            if pod_relay is not None:
                pod_relay.close()
            print(f"module wall time {time.monotonic() - t0:.0f}s")
        assert not left, f"processes left after stopping the stack: {left}"


def _relayed_kubeconfig(kube: KubeStack, relay: CuttableRelay, work: Path) -> Path:
    """A copy of the admin kubeconfig whose server is ``relay`` (the same TLS name, 127.0.0.1): the scheduler and
    api-server reach the kube-apiserver through it, so the forced 410 can cut them off alone."""
    import yaml

    config = yaml.safe_load(Path(kube.env.kubeconfig).read_text())
    for cluster in config["clusters"]:
        cluster["cluster"]["server"] = f"https://127.0.0.1:{relay.port}"
    path = work / "relayed-kubeconfig"
    path.touch(mode=0o600)
    path.write_text(yaml.safe_dump(config))
    return path


def _relay_pods(stack: FaultStack, kube: KubeStack, pod_relay: CuttableRelay) -> None:
    """Make every task pod reach Airflow's api-server (the exchange and the Execution API) through ``pod_relay``,
    so the partition wave can cut the pods off it alone (``partition_cut``)."""
    relayed = f"http://127.0.0.1:{pod_relay.port}"
    stack.extra_env["AIRFLOW__LEOFLOW__EXCHANGE_URL"] = f"{relayed}/leoflow"
    cfg = kube.pod_home / "airflow.cfg"
    text = cfg.read_text()
    assert f"execution_api_server_url = {stack.base_url}" in text, text
    cfg.write_text(text.replace(f"execution_api_server_url = {stack.base_url}",
                                f"execution_api_server_url = {relayed}"))


# ---------------------------------------------------------------------------------------------------- the plan


def _blocks(rng: random.Random, items: tuple[str, ...], n: int) -> list[str]:
    """``n`` items: every item once per ``len(items)``, each block shuffled."""
    out: list[str] = []
    while len(out) < n:
        block = list(items)
        rng.shuffle(block)
        out.extend(block)
    return out[:n]


def _plan(rng: random.Random, runs: int, process_faults: tuple[str, ...], *, real: bool = False
          ) -> list[tuple[str, list[tuple[str, str]]]]:
    """``[(process fault, [(dag_id, pod fault), ...]), ...]`` per wave: :data:`NODE_RUNS` runs of a
    ``node_lost`` wave are ``lf_kchaos_node`` runs whose fault is the node's loss, every other run gets a pod fault.
    On the ``real`` node (one Node: its loss ends every pod of the wave) every run of a ``node_lost`` wave is an
    ``lf_kchaos`` run whose fault is the node's loss."""
    waves = (runs + WAVE - 1) // WAVE
    process = _blocks(rng, process_faults, waves)
    sizes = [min(WAVE, runs - i * WAVE) for i in range(waves)]
    node_runs = [(size if real else min(NODE_RUNS, size)) if fault == "node_lost" else 0
                 for fault, size in zip(process, sizes)]
    pod = iter(_blocks(rng, POD_FAULTS, runs - sum(node_runs)))
    node_dag = DAG if real else NODE_DAG
    return [(fault, [(node_dag, "node_lost")] * lost + [(DAG, next(pod)) for _ in range(size - lost)])
            for fault, size, lost in zip(process, sizes, node_runs)]


# ---------------------------------------------------------------------------------------------------- helpers


def _holding(stack: FaultStack, node, run_ids: list[str]) -> dict[str, tuple[str, str, int]] | None:
    """``{run_id: (pod name, pod uid, body pid)}`` once every run's holding body runs in a pod of ``node``
    (:mod:`node_faults`), else None."""
    found = {}
    for run_id in run_ids:
        held = node.held(stack.traces_dir, run_id)
        if held is None:
            return None
        found[run_id] = held
    return found


def _inject_pod_fault(stack: FaultStack, kube: KubeStack, node, run_id: str, name: str, uid: str,
                      fault: str) -> None:
    """Apply one held pod fault (module docstring) to pod ``name`` (``uid``) whose body holds."""
    from kubernetes import client

    core = client.CoreV1Api(kube.api)
    if fault == "oom":
        node.oom(stack.traces_dir, run_id, name)
    elif fault == "mid_task":
        node.kill_container(name, uid)
    elif fault in ("delete_graceful", "delete_force"):
        core.delete_namespaced_pod(name, kube.namespace, body=client.V1DeleteOptions(
            grace_period_seconds=0 if fault == "delete_force" else None,
            preconditions=client.V1Preconditions(uid=uid)))
    elif fault == "evict":
        core.create_namespaced_pod_eviction(name, kube.namespace, client.V1Eviction(
            metadata=client.V1ObjectMeta(name=name, namespace=kube.namespace)))
    else:
        raise ValueError(f"unknown held pod fault {fault!r}")


class PodFaults(threading.Thread):
    """Injects each held run's pod fault once its first body holds, while the main thread drives the wave's
    process fault. ``targets`` ``{run_id: fault}``; :attr:`hit` ``{run_id: pod uid}`` once injected;
    :attr:`errors` a line per fault that could not be injected (the test fails on any)."""

    def __init__(self, stack: FaultStack, kube: KubeStack, node, targets: dict[str, str], deadline: float) -> None:
        super().__init__(name="kube-chaos-pod-faults", daemon=True)
        self.stack, self.kube, self.node, self.targets, self.deadline = stack, kube, node, dict(targets), deadline
        self.hit: dict[str, str] = {}
        self.errors: list[str] = []
        self._stop_event = threading.Event()

    def run(self) -> None:
        pending = dict(self.targets)
        while pending and time.monotonic() < self.deadline and not self._stop_event.is_set():
            for run_id, fault in list(pending.items()):
                path = held_file(self.stack.traces_dir, run_id)
                if path is None:
                    continue
                held = self.node.held(self.stack.traces_dir, run_id)
                if held is None:
                    if not self.node.real and not psutil.pid_exists(int(path.name.rsplit(".", 1)[1])):
                        self.errors.append(f"{run_id} {fault}: its held body ended before the fault")
                        del pending[run_id]
                    continue
                name, uid, _ = held
                try:
                    _inject_pod_fault(self.stack, self.kube, self.node, run_id, name, uid, fault)
                    self.hit[run_id] = uid
                except Exception as exc:  # noqa: BLE001 - reported; the test fails on it
                    self.errors.append(f"{run_id} {fault} on pod {name}: {exc!r}")
                del pending[run_id]
            self._stop_event.wait(0.3)
        self.errors.extend(f"{run_id} {fault}: never injected (no held body)" for run_id, fault in pending.items())

    def stop(self) -> None:
        self._stop_event.set()
        self.join(30)


def _tis_in(stack: FaultStack, wave: dict[str, tuple[str, str]], states: tuple[str, ...]) -> int:
    """How many TIs of the wave's runs are in one of ``states``."""
    runs = list(wave)
    marks, states_in = ",".join("?" * len(runs)), ",".join("?" * len(states))
    (n,), = stack.db(f"select count(*) from task_instance where run_id in ({marks}) and state in ({states_in})",
                     *runs, *states)
    return n


def _body_lines(stack: FaultStack, wave: dict[str, tuple[str, str]]) -> list[list[str]]:
    lines = []
    for dag_id in {d for d, _ in wave.values()}:
        path = stack.traces_dir / f"{dag_id}.{TASK}.body"
        lines.extend(line.split() for line in (path.read_text().splitlines() if path.exists() else []))
    return [p for p in lines if len(p) >= 5 and p[0] in wave]


def _scheduler_log(stack: FaultStack) -> str:
    path = stack.process_logs / "scheduler.log"
    return path.read_text(errors="replace") if path.exists() else ""


def _etcd(kube: KubeStack, path: str, body: dict) -> dict:
    req = urllib.request.Request(f"{kube.env.etcd}{path}", method="POST", data=json.dumps(body).encode())
    with urllib.request.urlopen(req, timeout=30) as answer:
        return json.loads(answer.read())


def _force_410(stack: FaultStack, kube: KubeStack, relay: CuttableRelay) -> str:
    """Cut the scheduler's and api-server's connections to the kube-apiserver (the relay their kubeconfig points
    at), let the task namespace's pods change, advance etcd and compact it at its head, restore the relay: the
    scheduler's pod informer re-watches from a compacted ``resourceVersion``, is answered ``410 Gone`` and relists
    (the scheduler log must say so; ``tests/k8s/test_informer.py`` forces it the same way)."""
    from kubernetes import client

    core = client.CoreV1Api(kube.api)
    seen = _scheduler_log(stack).count(GONE)
    before = int(core.list_namespaced_pod(kube.namespace).metadata.resource_version)
    t0 = time.monotonic()
    relay.cut()
    try:
        wait_until(lambda: int(core.list_namespaced_pod(kube.namespace).metadata.resource_version) > before + 1,
                   120, "the task pods to change while the scheduler is cut off", poll=0.5)
        key = base64.b64encode(b"/leoflow-chaos/forced-410").decode()
        for i in range(3):  # revisions past anything the informer saw
            head = int(_etcd(kube, "/v3/kv/put", {"key": key, "value": base64.b64encode(str(i).encode()).decode()})
                       ["header"]["revision"])
        _etcd(kube, "/v3/kv/compaction", {"revision": head, "physical": True})
    finally:
        relay.restore()
    cut_for = time.monotonic() - t0
    wait_until(lambda: _scheduler_log(stack).count(GONE) > seen, 180, "the scheduler's informer to get 410 Gone")
    return f"cut off {cut_for:.0f}s, etcd compacted at {head}, the informer relisted on 410"


def _lose_node(stack: FaultStack, kube: KubeStack, node, lost, wave: dict[str, tuple[str, str]],
               hit: dict[str, str]):
    """Wait until every node run's body holds, lose the node, wait for PodGC to delete its pods, then serve the
    Node again: a replacement harness (returned) or, on the real node, the same node revived (its kubelet and
    containerd started again; None returned). Records each node run's lost pod in ``hit``."""
    from kubernetes import client

    from tests.k8s.harness import NodeHarness

    node_runs = [r for r, (_, f) in wave.items() if f == "node_lost"]
    held = wait_until(lambda: _holding(stack, node if node.real else HarnessNode(kube, lost), node_runs), 600,
                      "every node run's body to hold on the node to lose")
    hit.update({run_id: uid for run_id, (_, uid, _) in held.items()})
    core = client.CoreV1Api(kube.api)
    if node.real:
        lost_note = node.action("lose")
        core.delete_node(kube.node_name)
    else:
        lost.lose_node()
    t_lost = time.monotonic()

    def deleted() -> bool:  # PodGC marked them Failed and deleted them; leoflow's finalizer may still hold them
        kube.record_current()
        live = {p.metadata.uid for p in core.list_namespaced_pod(kube.namespace).items
                if p.metadata.deletion_timestamp is None}
        return not live & {hit[r] for r in node_runs}

    try:
        wait_until(deleted, PODGC_BOUND, "PodGC to delete the lost node's pods")
    finally:
        if node.real:
            node.action("revive")
    took = time.monotonic() - t_lost
    if node.real:
        return None, f"{lost_note}; PodGC deleted {len(node_runs)} pods {took:.0f}s after the Node's deletion; revived"
    replacement = NodeHarness(kube.api, LOST_NODE, kube.workdir / f"harness-replacement-{uuid.uuid4().hex[:6]}")
    replacement.start()
    return replacement, f"PodGC deleted {len(node_runs)} pods {took:.0f}s after the Node's deletion"


def _inject(stack: FaultStack, kube: KubeStack, node, relay: CuttableRelay, fault: str,
            wave: dict[str, tuple[str, str]], lost, hit: dict[str, str]):
    """Apply one wave's process fault once its condition holds; returns ``(replacement harness or None, note)``."""
    if fault == "none":
        return None, ""
    if fault == "scheduler_sigkill":
        wait_until(lambda: _tis_in(stack, wave, ("queued",)) > 0, 300, "a queued TI of the wave", poll=0.1)
        queued = _tis_in(stack, wave, ("queued",))
        stack.kill_component("scheduler", signal.SIGKILL, timeout=60)
        stack.start_component("scheduler")
        return None, f"{queued} TIs queued at the SIGKILL"
    if fault == "api_sigkill":
        ended = wait_until(lambda: next((p for p in _body_lines(stack, wave) if p[2] == "end"), None), 600,
                           "a body of the wave to end", poll=0.05)
        stack.kill_component("api-server", signal.SIGKILL, group=True, timeout=60)
        t0 = time.monotonic()
        time.sleep(API_DOWN)  # the rest of the outage: the scenario's input
        stack.start_component("api-server")
        stack.wait_api(300)
        return None, f"SIGKILLed as {ended[0]}'s body ended; answering again after {time.monotonic() - t0:.0f}s"
    if fault == "forced_410":
        wait_until(lambda: any(p[2] == "tick" for p in _body_lines(stack, wave)), 600, "a body of the wave to run",
                   poll=0.2)
        return None, _force_410(stack, kube, relay)
    if fault == "node_lost":
        return _lose_node(stack, kube, node, lost, wave, hit)
    raise ValueError(f"unknown process fault {fault!r}")


def _poll_runs(stack: FaultStack, wave: dict[str, tuple[str, str]], pending: set[str], finals: dict[str, str],
               deadline: float) -> None:
    """Poll until every run in ``pending`` ended (moved to ``finals``) or ``deadline`` passed; ``StackError`` at
    once when a stack process exited on its own."""
    while pending and time.monotonic() < deadline:
        stack._check_alive()  # noqa: SLF001 - devtools is ours: a dead scheduler ends nothing
        for run_id in sorted(pending):
            try:
                state = stack.run(wave[run_id][0], run_id)["state"]
            except Exception:  # noqa: BLE001 - a busy or restarting api-server: poll again
                continue
            if state in ("success", "failed"):
                finals[run_id] = state
                pending.discard(run_id)
        time.sleep(2)


def _delete_node(kube: KubeStack) -> None:
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    try:
        client.CoreV1Api(kube.api).delete_node(LOST_NODE)
    except ApiException as exc:
        if exc.status != 404:
            raise


# ---------------------------------------------------------------------------------------------------- the test


SEED = int(os.environ.get("LEOFLOW_CHAOS_SEED", str(time.time_ns() % 2**32)))


@pytest.mark.chaos_ci
@pytest.mark.timeout(60 * 60)
def test_kube_chaos(kube_stack, request: pytest.FixtureRequest) -> None:
    """See the module docstring: :data:`RUNS` runs with ``--chaos`` (:data:`CI_RUNS` with ``--chaos-ci``, unless
    ``LEOFLOW_CHAOS_RUNS`` is set), every process fault but ``api_sigkill``."""
    full = request.config.getoption("--chaos") or "LEOFLOW_CHAOS_RUNS" in os.environ
    _chaos(kube_stack, tuple(f for f in PROCESS_FAULTS if f != "api_sigkill"), RUNS if full else CI_RUNS, SEED)


@pytest.mark.real_node
@pytest.mark.chaos_ci
@pytest.mark.timeout(20 * 60)
def test_an_oom_killed_child_an_unpullable_image_and_a_deadline_are_settled_as_the_node_reports_them(
        kube_stack) -> None:
    """Issue 35, three real faults of one task pod each, run side by side (one wait, for CI's time):

    * **an OOM-killed child**: at the container's memory limit this kernel (cgroup v1) kills the largest process,
      here a child the task runs, not the container; the task then fails as a task does when its tool dies, and the
      supervisor reports ``failed``. That report must not spend the user's retry on what the memory limit did: the
      agent refuses it (``oom_killed``, ``leoflow_agent/oom.py``) and the reconciler settles it as an OOM kill,
      like a container the runtime reports ``OOMKilled``: re-driven once on the infra budget, then, OOM-killed
      again, failed through Airflow's own path. ``lf_koom`` has no retries, so before the refusal the first try's
      report failed the task at once (try 1, ledger ``reported``);
    * **an image that cannot be pulled** (its registry a closed loopback port): the pod waits ``ErrImagePull`` /
      ``ImagePullBackOff`` as the kubelet reports it; past the pull grace (60 s) leoflow deletes the pod and fails
      the task through Airflow's own path, naming the image and the kubelet's reason, without re-running it (the
      same image fails again). Its body never ran;
    * **a pod past its ``activeDeadlineSeconds``** (45 s, the task's ``pod_override``: room for the agent's start on a loaded machine): the kubelet stops the pod
      (``Failed``, reason ``DeadlineExceeded``) while its body runs; the task fails at its first try (no retries,
      ``max_tries`` still 0: never re-driven, a deadline is the user's bound) with a ``leoflow task failed`` Log row
      giving the kubelet's reason; its body ran once and never ended."""
    from kubernetes import client

    stack, kube, _, _, _ = kube_stack
    oom_run = stack.trigger_with(OOM_DAG, None, prefix="oom")
    pull_run = stack.trigger_with(PULL_DAG, None, prefix="pull")
    deadline_run = stack.trigger_with(DEADLINE_DAG, None, prefix="deadline")
    runs = ((OOM_DAG, oom_run), (PULL_DAG, pull_run), (DEADLINE_DAG, deadline_run))
    states = {dag_id: stack.wait_for_run(dag_id, run_id, timeout=15 * 60, poll=2) for dag_id, run_id in runs}
    for dag_id, run_id in runs:
        wait_until(lambda d=dag_id, r=run_id: all(a["state"] == "closed" for a in stack.attempts(d, r, TASK)), 120,
                   f"the {dag_id} run's attempts to be closed")

    ti = stack.ti_row(OOM_DAG, oom_run, TASK)
    ledger = [(a["try_number"], a["resolution"]) for a in stack.attempts(OOM_DAG, oom_run, TASK)]
    log1 = stack.home / "logs" / f"dag_id={OOM_DAG}" / f"run_id={oom_run}" / f"task_id={TASK}" / "attempt=1.log"
    text = log1.read_text(errors="replace") if log1.exists() else ""
    assert (states[OOM_DAG], ti["state"], ti["try_number"], ti["max_tries"]) == ("failed", "failed", 2, 1), \
        (ti, ledger)
    assert ledger == [(1, "oom_redrive"), (2, "executor_failed")], ledger
    assert "OOM killer ended a process of this attempt" in text, text[-2000:]

    ti = stack.ti_row(PULL_DAG, pull_run, TASK)
    ledger = stack.attempts(PULL_DAG, pull_run, TASK)
    assert (states[PULL_DAG], ti["state"], ti["try_number"]) == ("failed", "failed", 1), (ti, ledger)
    assert len(ledger) == 1 and MISSING_IMAGE in (ledger[0]["detail"] or ""), ledger
    assert any(word in ledger[0]["detail"] for word in ("ErrImagePull", "ImagePullBackOff")), ledger
    assert not executions(stack, PULL_DAG, TASK, pull_run), "the body of a task whose image cannot be pulled ran"
    core = client.CoreV1Api(kube.api)
    wait_until(lambda: not [p for p in core.list_namespaced_pod(kube.namespace).items
                            if p.metadata.name.startswith("lf-kpull-")], 120, "the pull run's pod to be deleted")

    ti = stack.ti_row(DEADLINE_DAG, deadline_run, TASK)
    ledger = [(a["try_number"], a["resolution"]) for a in stack.attempts(DEADLINE_DAG, deadline_run, TASK)]
    assert (states[DEADLINE_DAG], ti["state"], ti["try_number"], ti["max_tries"]) == ("failed", "failed", 1, 0), \
        (ti, ledger)
    assert ledger == [(1, "executor_failed")], ledger
    events = stack.db("select event, coalesce(extra, '') from log where dag_id=? and run_id=? and task_id=?",
                      DEADLINE_DAG, deadline_run, TASK)
    failed = [extra for event, extra in events if event == "leoflow task failed"]
    assert len(failed) == 1 and failed[0].startswith("DeadlineExceeded:"), events
    assert [e for e, _ in events if e == "leoflow infra re-drive"] == [], events
    [body] = executions(stack, DEADLINE_DAG, TASK, deadline_run)
    assert not body.ended, body


@pytest.mark.real_node
@pytest.mark.chaos_ci
@pytest.mark.timeout(10 * 60)
def test_a_pod_its_node_has_no_room_for_waits_as_backpressure_and_runs_once_there_is_room(kube_stack) -> None:
    """Issue 35, found by the benchmark on the real node (a warm pool's pods held the CPU the cold pods requested):
    a pod bound to a node whose allocatable CPU other pods hold is refused by the kubelet at admission (``Failed``,
    reason ``OutOfcpu``) before it starts. That is backpressure, not a dead agent: before, leoflow re-dispatched it
    as "the agent died before /run" and, past ``[leoflow] redispatch_limit`` (2), failed the task. Now each refusal
    closes its epoch ``launch_failed`` and the workload is offered again 5 s later; once a pod holding the room
    ends, the task runs at its first try and succeeds."""
    from kubernetes import client

    stack, kube, _, _, _ = kube_stack
    core = client.CoreV1Api(kube.api)
    node = core.read_node(kube.node_name)
    held = sum(_milli_cpu((c.resources.requests or {}).get("cpu", "0"))
               for p in core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={kube.node_name}").items
               if p.status.phase not in ("Succeeded", "Failed") for c in p.spec.containers)
    room = _milli_cpu(node.status.allocatable["cpu"]) - held
    filler = "cpu-filler"
    core.create_namespaced_pod(kube.namespace, client.V1Pod(
        metadata=client.V1ObjectMeta(name=filler),
        spec=client.V1PodSpec(
            node_name=kube.node_name, restart_policy="Never", termination_grace_period_seconds=0,
            security_context=client.V1PodSecurityContext(
                run_as_non_root=True, run_as_user=65534, seccomp_profile=client.V1SeccompProfile(type="RuntimeDefault")),
            containers=[client.V1Container(
                name="sleep", image="leoflow.local/busybox:1", command=["/bin/sh", "-c", "sleep 3600"],
                resources=client.V1ResourceRequirements(requests={"cpu": f"{room - 50}m"}),
                security_context=client.V1SecurityContext(allow_privilege_escalation=False,
                                                          capabilities=client.V1Capabilities(drop=["ALL"])))])))
    try:
        wait_until(lambda: core.read_namespaced_pod(filler, kube.namespace).status.phase == "Running", 120,
                   "the pod that holds the node's CPU to run")
        run_id = stack.trigger_with(DAG, None, prefix="room")

        def refused() -> int:
            ti = stack.ti_row(DAG, run_id, TASK)
            return sum(1 for a in stack.attempts(DAG, run_id, TASK) if a["resolution"] == "launch_failed") \
                if ti else 0

        wait_until(lambda: refused() >= 2, 180, "the run's pod to be refused for lack of room twice")
    finally:
        core.delete_namespaced_pod(filler, kube.namespace, grace_period_seconds=0)
    state = stack.wait_for_run(DAG, run_id, timeout=300, poll=2)
    ti = stack.ti_row(DAG, run_id, TASK)
    wait_until(lambda: all(a["state"] == "closed" for a in stack.attempts(DAG, run_id, TASK)), 120,
               "the run's attempts to be closed")
    ledger = stack.attempts(DAG, run_id, TASK)
    resolutions = [a["resolution"] for a in ledger]
    assert (state, ti["state"], ti["try_number"], ti["max_tries"]) == ("success", "success", 1, RETRIES), \
        (ti, resolutions)
    assert set(resolutions[:-1]) == {"launch_failed"} and resolutions[-1] == "reported", resolutions
    assert all("OutOfcpu" in (a["detail"] or "") for a in ledger[:-1]), [a["detail"] for a in ledger]
    assert len(executions(stack, DAG, TASK, run_id)) == 1


def _milli_cpu(quantity: str) -> int:
    """A CPU quantity (``"2"``, ``"1500m"``, ``"0.5"``) in millicores."""
    return int(quantity[:-1]) if quantity.endswith("m") else int(float(quantity) * 1000)


@pytest.mark.timeout(30 * 60)
def test_kube_chaos_api_server_killed_mid_report(kube_stack) -> None:
    """One wave of :data:`WAVE` runs (pod faults as in :func:`test_kube_chaos`) whose process fault is
    ``api_sigkill``: the api-server SIGKILLed as a body ends, dead :data:`API_DOWN` s, then started again. A task
    the outage failed (a call of its own unanswered) is refused by its agent (``api_unreachable``) and re-run on
    the infra budget; that re-run moves its pod fault's path one try on (``api_unreachable re-runs``)."""
    _chaos(kube_stack, ("api_sigkill",), WAVE, SEED + 1)


@pytest.mark.timeout(60 * 60)
def test_kube_chaos_partition(kube_stack) -> None:
    """Issue 33's partition wave: :data:`PARTITION_RUNS` runs in waves of :data:`PARTITION_WAVE`, each wave one case
    of :data:`PARTITIONS` in a seeded order. Every run's body holds on the node; then that node is partitioned: cut
    off from the control plane (no status, no reaction to deletes) while its pod processes run on:

    * ``partition_node_deleted``: the Node is deleted (PodGC marks the pods Failed, ``DeletionByPodGC``, and deletes
      them; leoflow's finalizer holds them); the pods still reach Airflow and heartbeat;
    * ``partition_pod_deleted``: each pod is deleted with its grace period, which the node never acts on;
    * ``partition_cut``: the pods also lose Airflow's api-server; the agent's lease must kill each body before the
      scheduler re-runs it; the pods reach it again once the bodies are dead.

    On the node harness, ``lf_kchaos_node`` runs on :data:`LOST_NODE`, partitioned with
    :meth:`NodeHarness.partition`, the pods cut off by their relay, and a new harness serves the Node's name for new
    pods at once (so a re-run the scheduler starts too early really runs, and its body shows as an overlap). On the
    real node (``--real-node``), ``lf_kchaos`` runs there; its kubelet is stopped (SIGSTOP), the pods' packets to the
    api-server dropped by iptables, and the node heals once the wave's bodies ended (the kubelet continued, or
    restarted when its Node was deleted): a re-run started too early runs then, after the first body ended, and
    counts as a lost success (a body that started after one had ended).

    :data:`PARTITION_HOLD` s after the case took effect the bodies are released. Judged as :func:`test_kube_chaos`:
    0 overlaps ("double runs": two bodies' [start, last trace] intersect), 0 lost successes, 0 user retries spent."""
    from tests.k8s.harness import NodeHarness

    stack, kube, _, pod_relay, node = kube_stack
    seed = SEED + 2
    dag_id = DAG if node.real else NODE_DAG
    print(f"\nkube partition seed: {seed} (LEOFLOW_CHAOS_SEED={SEED} replays the module), runs: {PARTITION_RUNS}, "
          f"{kube.node} node")
    waves = _blocks(random.Random(seed), PARTITIONS, (PARTITION_RUNS + PARTITION_WAVE - 1) // PARTITION_WAVE)
    t0 = time.monotonic()
    plan: dict[str, tuple[str, str, str]] = {}
    finals: dict[str, str] = {}
    hit: dict[str, str] = {}
    crashed: list[str] = []
    for index, case in enumerate(waves):
        if crashed:
            break
        t_wave = time.monotonic()
        size = min(PARTITION_WAVE, PARTITION_RUNS - index * PARTITION_WAVE)
        lost = None if node.real else NodeHarness(kube.api, LOST_NODE,
                                                  kube.workdir / f"harness-partitioned-{index}").start()
        healed = None
        wave: dict[str, tuple[str, str]] = {}
        note = ""
        try:
            for _ in range(size):
                run_id = stack.trigger_with(dag_id, None, prefix=f"p{len(plan):03d}",
                                            prepare=lambda r: (stack.traces_dir / f"hold.{r}").write_text("hold\n"))
                plan[run_id] = (dag_id, case, "partition")
                wave[run_id] = (dag_id, case)
            pending = set(wave)
            try:
                healed, note = _partition(stack, kube, node, pod_relay, case, wave, lost, hit,
                                          lambda i=index: NodeHarness(kube.api, LOST_NODE,
                                                                      kube.workdir / f"harness-healed-{i}"))
                _poll_runs(stack, wave, pending, finals, t_wave + WAVE_BUDGET)
            except (StackError, TimeoutError) as exc:
                crashed.append(f"wave {index + 1} ({case}): {exc}")
                note = "stopped: " + crashed[-1]
            finally:
                _heal(stack, kube, node, pod_relay, case)
                for run_id in wave:
                    (stack.traces_dir / f"release.{run_id}").write_text("go\n")
        finally:
            if lost is not None:
                lost.stop()
                _delete_node(kube)
            if healed is not None:
                healed.stop()
        print(f"wave {index + 1} ({case}{': ' + note if note else ''}): {len(wave)} runs, {len(pending)} unfinished, "
              f"{time.monotonic() - t_wave:.0f}s (total {time.monotonic() - t0:.0f}s)", flush=True)
    _conclude(stack, kube, plan, finals, hit, crashed, [], seed=seed, t0=t0, pod_rows=list(PARTITIONS),
              process_rows=["partition"])


def _heal(stack: FaultStack, kube: KubeStack, node, pod_relay: CuttableRelay | None, case: str) -> None:
    """End the partition: the pods reach Airflow again; on the real node its kubelet runs again (a new one when the
    case deleted its Node, which only a starting kubelet registers again). Idempotent."""
    if pod_relay is not None:
        pod_relay.restore()
    if node.real:
        node.action("uncut", port=stack.api_port)
        node.action("restart-kubelet" if case == "partition_node_deleted" else "thaw")


def _partition(stack: FaultStack, kube: KubeStack, node, pod_relay: CuttableRelay | None, case: str,
               wave: dict[str, tuple[str, str]], lost, hit: dict[str, str], healed_node):
    """Once every run of ``wave`` holds on the node, partition it and play ``case`` (:func:`test_kube_chaos_partition`);
    on the harness the Node's name is served again with ``healed_node()`` (returned, with a note; None on the real
    node, healed by the caller's :func:`_heal` once the wave ended). The bodies are released by the caller for
    ``partition_cut``, here :data:`PARTITION_HOLD` s after the case took effect for the others. Records each
    partitioned pod in ``hit`` (the test's own fault, spared by "older touched newer")."""
    from kubernetes import client

    core = client.CoreV1Api(kube.api)
    on = node if node.real else HarnessNode(kube, lost)
    held = wait_until(lambda: _holding(stack, on, list(wave)), 600,
                      "every partition run's body to hold on the node to partition")
    hit.update({run_id: uid for run_id, (_, uid, _) in held.items()})
    if case == "partition_cut":
        if node.real:
            node.action("cut", port=stack.api_port)
        else:
            pod_relay.cut()
    if node.real:
        node.action("freeze")
    else:
        lost.partition()
    t_cut = time.monotonic()

    def heal():
        return None if node.real else healed_node().start()

    if case == "partition_node_deleted":
        core.delete_node(kube.node_name if node.real else LOST_NODE)

        def failed_by_podgc() -> bool:
            kube.record_current()
            pods = {p.metadata.uid: p for p in core.list_namespaced_pod(kube.namespace).items}
            return all(uid not in pods or pods[uid].metadata.deletion_timestamp is not None
                       for _, uid, _ in held.values())

        wait_until(failed_by_podgc, PODGC_BOUND, "PodGC to fail the partitioned node's pods")
        note = f"PodGC acted {time.monotonic() - t_cut:.0f}s after the Node's deletion"
        healed = heal()
    elif case == "partition_pod_deleted":
        healed = heal()
        for name, uid, _ in held.values():
            core.delete_namespaced_pod(name, kube.namespace, body=client.V1DeleteOptions(
                preconditions=client.V1Preconditions(uid=uid)))
        time.sleep(GRACE_SECONDS + 60.0)  # the grace, then leoflow's pod_termination_valve (60 s)
        note = "deleted with their grace; the node never acted"
    else:
        healed = heal()
        wait_until(lambda: not any(alive(pid) for _, _, pid in held.values()), LEASE_BOUND,
                   "the agents' lease to kill every cut-off body")
        note = f"the lease killed every body {time.monotonic() - t_cut:.0f}s after the cut"
        _heal(stack, kube, node, pod_relay, case)
        return healed, note
    time.sleep(PARTITION_HOLD)
    for run_id in wave:  # the bodies end now and report their success themselves
        (stack.traces_dir / f"release.{run_id}").write_text("go\n")
    return healed, note


def _chaos(kube_stack, process_faults: tuple[str, ...], runs: int, seed: int) -> None:
    """Make ``runs`` seeded runs in waves with ``process_faults`` (module docstring); print the tables, then
    assert."""
    from tests.k8s.harness import NodeHarness

    stack, kube, relay, _, node = kube_stack
    print(f"\nkube chaos seed: {seed} (LEOFLOW_CHAOS_SEED={SEED} replays the module), runs: {runs}, "
          f"process faults: {', '.join(process_faults)}, {kube.node} node")
    waves = _plan(random.Random(seed), runs, process_faults, real=node.real)
    t0 = time.monotonic()
    plan: dict[str, tuple[str, str, str]] = {}  # run_id -> (dag_id, pod fault, process fault)
    finals: dict[str, str] = {}
    hit: dict[str, str] = {}  # run_id -> uid of the pod the test's fault hit
    notes: list[str] = []
    crashed: list[str] = []
    inject_errors: list[str] = []
    for index, (fault, slots) in enumerate(waves):
        if crashed:
            break
        t_wave = time.monotonic()
        lost = replacement = None
        if fault == "node_lost" and not node.real:
            lost = NodeHarness(kube.api, LOST_NODE, kube.workdir / f"harness-lost-{index}").start()
        wave: dict[str, tuple[str, str]] = {}
        try:
            for dag_id, pod_fault in slots:
                hold = pod_fault in HELD_FAULTS or pod_fault == "node_lost"
                run_id = stack.trigger_with(
                    dag_id, {f"{TASK}/1/1": pod_fault} if pod_fault in AGENT_KILLS else None,
                    prefix=f"k{len(plan):03d}",
                    prepare=(lambda r: (stack.traces_dir / f"hold.{r}").write_text("hold\n")) if hold else None)
                plan[run_id] = (dag_id, pod_fault, fault)
                wave[run_id] = (dag_id, pod_fault)
            injector = PodFaults(stack, kube, node, {r: f for r, (_, f) in wave.items() if f in HELD_FAULTS},
                                 t_wave + WAVE_BUDGET)
            injector.start()
            pending = set(wave)
            try:
                replacement, note = _inject(stack, kube, node, relay, fault, wave, lost, hit)
                _poll_runs(stack, wave, pending, finals, t_wave + WAVE_BUDGET)
            except (StackError, TimeoutError) as exc:  # the table is still printed, then the test fails
                crashed.append(f"wave {index + 1} ({fault}): {exc}")
                note = "stopped: " + crashed[-1]
            finally:
                injector.stop()
                hit.update(injector.hit)
                inject_errors.extend(injector.errors)
                for run_id in wave:  # a body still holding (its fault never came) may end now
                    (stack.traces_dir / f"release.{run_id}").write_text("go\n")
        finally:
            if lost is not None:
                lost.stop()
            if replacement is not None:
                replacement.stop()
            if lost is not None:
                _delete_node(kube)
        notes.append(f"wave {index + 1} ({fault}{': ' + note if note else ''}): {len(wave)} runs "
                     f"({dict(Counter(f for _, f in wave.values()))}), {len(pending)} unfinished, "
                     f"{time.monotonic() - t_wave:.0f}s (total {time.monotonic() - t0:.0f}s)")
        print(notes[-1], flush=True)

    _conclude(stack, kube, plan, finals, hit, crashed, inject_errors, seed=seed, t0=t0,
              pod_rows=[*POD_FAULTS, "node_lost"], process_rows=list(process_faults))


def _conclude(stack: FaultStack, kube: KubeStack, plan: dict[str, tuple[str, str, str]], finals: dict[str, str],
              hit: dict[str, str], crashed: list[str], inject_errors: list[str], *, seed: int, t0: float,
              pod_rows: list[str], process_rows: list[str]) -> None:
    """Wait for every attempt to be closed, judge every run (:func:`_judge`), print the two tables, then assert
    0 lost successes, double runs, user retries spent and older touched newer, every run a success, no problem."""
    unsettled: list[tuple] = []
    try:
        if not crashed:
            wait_until(lambda: not stack.db("select 1 from leoflow_attempt where dag_id in (?, ?) and state != "
                                            "'closed'", DAG, NODE_DAG), 180, "every chaos attempt to be closed")
    except TimeoutError:
        unsettled = stack.db("select run_id, task_id, try_number, attempt_epoch, state from leoflow_attempt "
                             "where dag_id in (?, ?) and state != 'closed'", DAG, NODE_DAG)
    problems, path_notes, by_pod, by_process = _judge(stack, kube, plan, finals, hit)
    wall = time.monotonic() - t0
    columns = ["runs", "run success", "unfinished", "as expected", "other path", "infra re-runs",
               "api_unreachable re-runs", "lost successes", "double runs", "user retries spent", "older touched newer"]
    print(f"\nkube chaos: {len(plan)} runs, seed {seed}, {wall:.0f}s")
    print("\npod faults (every run; 'as expected': the path of the fault alone)\n"
          + "\n".join(chaos_table(by_pod, columns, pod_rows, "pod fault")))
    print("\nprocess faults (every run of its wave, pod faults included)\n"
          + "\n".join(chaos_table(by_process, columns, process_rows, "process fault")))
    if path_notes:
        print("\n" + "\n".join(path_notes))
    if unsettled:
        problems.append(f"attempts not settled: {unsettled}")
    problems = crashed + inject_errors + problems
    print("\n".join(["problems:", *problems]) if problems else "no problems")
    assert not crashed, "\n".join(problems)
    total = sum(by_process.values(), Counter())
    assert (total["lost successes"], total["double runs"], total["user retries spent"],
            total["older touched newer"]) == (0, 0, 0, 0), "\n".join(problems)
    assert all(finals.get(run_id) == "success" for run_id in plan), "\n".join(problems)
    assert not problems, "\n".join(problems)


def _judge(stack: FaultStack, kube: KubeStack, plan: dict[str, tuple[str, str, str]], finals: dict[str, str],
           hit: dict[str, str]) -> tuple[list[str], list[str], dict[str, Counter], dict[str, Counter]]:
    """Per run: lost successes, double runs, user retries spent, older touched newer (each a problem), the
    deterministic settlements (:data:`SETTLED`, a problem when missed), whether the TI took :data:`EXPECTED`'s
    path (a note when not) and its ledger resolutions. A run left unfinished is judged for double runs only.
    Returns the problems, the notes, and the counts by pod fault and by process fault."""
    problems: list[str] = []
    notes: list[str] = []
    by_pod: dict[str, Counter] = defaultdict(Counter)
    by_process: dict[str, Counter] = defaultdict(Counter)
    pods = pods_by_ti(kube.pods())
    for run_id, (dag_id, pod_fault, process_fault) in plan.items():
        rows = [by_pod[pod_fault], by_process[process_fault]]

        def count(key: str, n: int = 1, rows: list[Counter] = rows) -> None:
            for row in rows:
                row[key] += n

        tag = f"{run_id} ({pod_fault}; {process_fault})"
        count("runs")
        count("run success", int(finals.get(run_id) == "success"))
        execs = executions(stack, dag_id, TASK, run_id)
        if run_id not in finals:
            count("unfinished")
            if overlaps(execs):
                count("double runs")
                problems.append(f"double run: {tag} (unfinished): {execs}")
            continue
        ti = stack.ti_row(dag_id, run_id, TASK)
        ended = [e for e in execs if e.ended]
        if ended and ti.get("state") != "success":
            count("lost successes")
            problems.append(f"lost success: {tag}: {ti}, {execs}")
        elif ended and any(e.start > ended[0].last for e in execs):
            count("lost successes")
            problems.append(f"lost success (a body ran after one had ended): {tag}: {execs}")
        if overlaps(execs) or len(ended) > 1:
            count("double runs")
            problems.append(f"double run: {tag}: {execs}")
        if ti and ti["try_number"] >= 1 and (ti["try_number"] - 1) != (ti["max_tries"] - RETRIES):
            count("user retries spent")
            problems.append(f"user retry spent: {tag}: {ti}")
        count("infra re-runs", (ti.get("max_tries") or RETRIES) - RETRIES)
        ti_pods = pods.get(str(uuid.UUID(ti["id"])), {}) if ti else {}
        ordered = sorted(ti_pods.values(), key=pod_order)
        for uid in newer_pods_touched(ti_pods, spared={hit.get(run_id)}):
            versions = ti_pods[uid]
            count("older touched newer")
            problems.append(f"older touched newer: {tag}: pod {versions[0]['metadata']['name']} (try, epoch) "
                            f"{pod_order(versions)} deleted while {pod_phase(versions[-1])}; pods "
                            f"{[(v[-1]['metadata']['name'], pod_order(v), pod_phase(v[-1])) for v in ordered]}")
        ledger = stack.attempts(dag_id, run_id, TASK)
        for attempt in ledger:
            count(f"ledger {attempt['resolution']}")
        resolutions = [a["resolution"] for a in ledger]
        # tries the api-server outage failed before the pod fault met one (the agent's api_unreachable refusal,
        # re-driven on the infra budget): each moves the fault's path one try on
        shift = sum(1 for a in ledger if a["resolution"] == "infra_redrive" and API_LOSS in (a["detail"] or ""))
        count("api_unreachable re-runs", shift)
        if pod_fault in SETTLED and (SETTLED[pod_fault] not in resolutions or ti.get("try_number") != 2 + shift):
            rows_seen = [(a["try_number"], a["attempt_epoch"], a["resolution"], a["detail"]) for a in ledger]
            problems.append(f"settlement: {tag}: expected a ledger row {SETTLED[pod_fault]} and try {2 + shift}, "
                            f"got {rows_seen}, {ti}")
        got = (ti.get("try_number"), ti.get("max_tries"), [e.try_number for e in execs])
        try_number, max_tries, bodies = EXPECTED[pod_fault]
        if got == (try_number + shift, max_tries + shift, [b + shift for b in bodies]):
            count("as expected")
        else:
            count("other path")
            notes.append(f"other path: {tag}: got {got}, expected {EXPECTED[pod_fault]}; ledger "
                         f"{[(a['try_number'], a['attempt_epoch'], a['resolution']) for a in ledger]}")
    return problems, notes, by_pod, by_process
