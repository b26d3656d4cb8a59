"""The Kubernetes chaos suite's faults on whatever runs its task pods (``tests/integration/test_kube_chaos.py``).

Two kinds of node, one interface:

* :class:`HarnessNode`: the node harness (``tests/k8s/harness.py``): pods are processes on this machine, the
  harness plays the kubelet's part of each fault (its OOM kill, its loss, its partition) and a new harness serves
  the Node's name again;
* :class:`RealNode`: the real node (``scripts/k8senv start --real-node``): a kubelet and containerd running
  leoflow's agent image. Each fault is the real one: containerd kills the container's processes, the kernel's OOM
  killer ends a body that outgrows the container's memory limit, the kubelet is stopped (SIGSTOP) to cut the node
  off from the control plane while its pods run on, iptables drops the pods' packets to Airflow's api-server, and
  a lost node has its kubelet, containerd and every container process SIGKILLed (``scripts/k8senv node``).

A body that holds (``tests/fault_dags/leoflow_kchaos.py``) renames ``traces/hold.<run_id>`` to
``traces/held.<run_id>.<pid>`` (``pid`` in its own PID namespace) and writes its host name (the pod's name on the
real node) into it; :meth:`held` finds the pod and the body's PID on this machine from that.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import psutil

from devtools import k8senv


def held_file(traces: Path, run_id: str) -> Path | None:
    """``traces/held.<run_id>.<pid>`` once the run's body claimed its hold, else None."""
    return next(iter(traces.glob(f"held.{run_id}.*")), None)


def alive(pid: int) -> bool:
    """Process ``pid`` (of this machine) runs (a zombie has ended: its body writes nothing more)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


class HarnessNode:
    """The node harness's side of each fault; ``harness`` the :class:`~tests.k8s.harness.NodeHarness` whose pods
    are checked by :meth:`held`."""

    real = False

    def __init__(self, kube, harness) -> None:
        self.kube, self.harness = kube, harness

    def held(self, traces: Path, run_id: str) -> tuple[str, str, int] | None:
        """``(pod name, pod uid, body pid on this machine)`` of the run's holding body once it runs in a pod of
        :attr:`harness`, else None."""
        path = held_file(traces, run_id)
        if path is None:
            return None
        pid = int(path.name.rsplit(".", 1)[1])
        try:
            ancestors = {p.pid for p in psutil.Process(pid).parents()}
        except psutil.Error:
            return None
        for run in list(self.harness.runs.values()):
            proc = run.procs.get("base")
            if proc is not None and proc.pid in ancestors:
                return run.name, run.uid, pid
        return None

    def kill_container(self, name: str, uid: str) -> None:
        """SIGKILL the agent container's whole process tree (exit 137, reason ``Error``)."""
        from tests.k8s.harness import kill_tree

        run = self.harness.run_named(self.kube.namespace, name)
        kill_tree(run.procs["base"].pid)

    def oom(self, traces: Path, run_id: str, name: str, try_number: int | None = None) -> None:
        """The harness plays the OOM killer on the agent container (``OOMKilled``, exit 137)."""
        self.harness.oom_kill(self.kube.namespace, name)

    def exceed_deadline(self, name: str) -> None:
        """The harness plays the kubelet's ``activeDeadlineSeconds`` check on pod ``name`` now (``DeadlineExceeded``):
        it counts no deadline itself."""
        self.harness.exceed_deadline(self.kube.namespace, name)


class RealNode:
    """The real node's side of each fault (module docstring). ``kube`` a started ``KubeStack(node="real")``."""

    real = True

    def __init__(self, kube) -> None:
        self.kube = kube
        self.dir = kube.env.dir
        self.record = kube.env.real_node

    def held(self, traces: Path, run_id: str) -> tuple[str, str, int] | None:
        """``(pod name, pod uid, body pid on this machine)`` of the run's holding body once it wrote its pod's name,
        else None. The host PID is the process in that pod's cgroup whose innermost ``NSpid`` is the body's own."""
        from kubernetes import client
        from kubernetes.client.rest import ApiException

        path = held_file(traces, run_id)
        name = path.read_text().strip() if path is not None else ""
        if not name:
            return None
        try:
            pod = client.CoreV1Api(self.kube.api).read_namespaced_pod(name, self.kube.namespace)
        except ApiException:
            return None
        pid = host_pid(pod.metadata.uid, int(path.name.rsplit(".", 1)[1]))
        return (name, pod.metadata.uid, pid) if pid is not None else None

    def kill_container(self, name: str, uid: str) -> None:
        """containerd SIGKILLs every process of the pod's agent container (``ctr task kill --all``): exit 137,
        reason ``Error``. Raises RuntimeError when the container is not running or ``ctr`` fails."""
        from kubernetes import client

        pod = client.CoreV1Api(self.kube.api).read_namespaced_pod(name, self.kube.namespace)
        if pod.metadata.uid != uid:
            raise RuntimeError(f"pod {name} is not {uid} any more")
        status = next((s for s in pod.status.container_statuses or [] if s.name == "base"), None)
        if status is None or status.state.running is None or not status.container_id:
            raise RuntimeError(f"pod {name}'s container base is not running: {status}")
        cid = status.container_id.split("://", 1)[1]
        r = subprocess.run(["ctr", "--address", self.record["containerd_socket"], "-n", "k8s.io", "tasks", "kill",
                            "--all", "--signal", "SIGKILL", cid], capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            raise RuntimeError(f"ctr tasks kill {cid}: {r.stderr.strip()}")

    def oom(self, traces: Path, run_id: str, name: str, try_number: int | None = None) -> None:
        """Tell the run's holding body to outgrow its container's memory limit (``traces/oom.<run_id>``, or
        ``traces/oom.<run_id>.<try_number>`` for :func:`fault_trace.hold`'s bodies): the kernel's OOM killer ends
        it."""
        suffix = "" if try_number is None else f".{try_number}"
        (traces / f"oom.{run_id}{suffix}").write_text("grow\n")

    def exceed_deadline(self, name: str) -> None:
        """Nothing to do: the kubelet ends pod ``name`` itself once its ``activeDeadlineSeconds`` ran out."""

    def action(self, action: str, **kwargs) -> str:
        """``scripts/k8senv node ACTION`` on this node (:data:`devtools.k8senv.NODE_ACTIONS`)."""
        return k8senv.node_action(self.dir, action, **kwargs)


def node_of(kube) -> HarnessNode | RealNode:
    """The faults of the node a started :class:`devtools.kube.KubeStack` runs its pods on: :class:`RealNode` for
    ``node="real"``, else :class:`HarnessNode` over its node harness."""
    return RealNode(kube) if kube.node == "real" else HarnessNode(kube, kube.harness)


def host_pid(pod_uid: str, ns_pid: int) -> int | None:
    """The PID on this machine of the process of pod ``pod_uid`` (its cgroup path names ``pod<uid>``, as the
    kubelet's cgroupfs driver does) whose PID in its own namespace is ``ns_pid``; None when there is none."""
    mark = f"pod{pod_uid}"
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if mark not in (proc / "cgroup").read_text():
                continue
            status = (proc / "status").read_text()
        except OSError:
            continue
        nspid = next((line.split()[1:] for line in status.splitlines() if line.startswith("NSpid:")), [])
        if nspid and int(nspid[-1]) == ns_pid:
            return int(proc.name)
    return None

