"""The cncf KubernetesExecutor (KE) vs leoflow's Kubernetes runtime, same control plane, node and DAGs.

Run from the repo root with the project venv (issue 9, "Benchmark"; issue 35, the real node)::

    .venv/bin/python -m bench.kube_compare                          # all three, parallelism 32, node harness
    .venv/bin/python -m bench.kube_compare --node real              # on the real node, parallelism 16
    .venv/bin/python -m bench.kube_compare --ke-venv /work/kebench/venv --executors ke

``--node real`` (issue 35): the pods run under a kubelet and containerd (``scripts/k8senv start --real-node``), all
three executors' in one image, leoflow's agent image (its Airflow is the KE venv's, 3.3.2): leoflow's pods run its
ENTRYPOINT, KE's run KE's ``args`` under its ``dumb-init``; both mount the same kind of pod-side ``airflow.cfg`` and
DAG bundle (ConfigMaps) and log volume (:meth:`devtools.kube.KubeStack.real_pod_template_for`), in the task
namespace (Pod Security ``restricted``: KE's template carries the security context leoflow's pods get). Every pod
requests 100m CPU (a BestEffort pod starves on a shared node); the node's 2 allocatable CPUs hold 20 such pods, so
the default parallelism there is 16 (warm pools included: 16 + 2).

Set-up. One throw-away PostgreSQL (``scripts/pg``) with an ``airflow db migrate``'d template database
(:mod:`bench.compare`'s code); one k8senv control plane with the node harness (:class:`devtools.kube.KubeStack`:
``harness-node`` runs each pod's ``command + args`` as a local process). Per executor a fresh Airflow stack
(scheduler, dag-processor, api-server) on a fresh copy of the database, ``dags_folder = bench/dags``, the same
pinned settings (:data:`bench.compare.PINNED`), ``[core] parallelism`` 32; its DAGs run one at a time:
``bench_fanout`` (50 trivial tasks), ``bench_chain`` (20 in a chain).

- leoflow: ``KubeStack.configure`` (LeoflowExecutor, ``[leoflow] runtime = kubernetes``, restricted namespace,
  the harness pod template; the pod runs ``python -m leoflow_agent pod`` from the project venv).
- KE: Airflow 3.3.2 + apache-airflow-providers-cncf-kubernetes 10.25.0 in its own venv (KE needs
  ``kubernetes<37``; made under ``~/.cache/leoflow-bench/ke-venv`` when missing, see :func:`ensure_ke_venv`),
  which runs the stack's three processes and the task pods. ``[kubernetes_executor]`` ``in_cluster = False``,
  ``config_file`` = the k8senv admin kubeconfig, its own namespace, ``pod_template_file`` (``nodeName:
  harness-node``, the harness label, ``restartPolicy: Never``, ``command: [/usr/bin/env]`` with ``PATH`` = the KE
  venv's ``bin`` first so KE's ``args`` ``python -m airflow.sdk.execution_time.execute_workload ...`` run the
  KE venv's python, ``AIRFLOW_HOME`` a pod-side home like leoflow's: ``dags_folder``, bundles and
  ``execution_api_server_url``), ``worker_pods_creation_batch_size`` = parallelism (its default 1 would make
  KE create one pod per scheduler loop); every other KE option at its default.

Figures per (executor, DAG):

- queued-to-running p50/p95: TI ``queued_when`` -> ``start_date`` (REST API), seconds;
- wall: the DAG run's ``start_date`` -> ``end_date``, seconds;
- pod creates/s: pods of the executor's namespace first seen by a watch on every namespace (local monotonic
  time of the ADDED event) / (last - first), over the run; for the fan-out (50 > parallelism 32) the last 18
  wait for free slots, and the chain's pods come one at a time: both are the run's pace, not the API's create
  rate (``bench.kube_scale`` measures that);
- scheduler loop: the scheduler's ``Ran scheduling loop in X ms`` lines (Airflow's own timer around one
  loop, the one it sends as the ``scheduler.scheduler_loop_duration`` metric; logged at DEBUG, turned on for
  the scheduler job runner's logger alone with ``[logging] namespace_levels``) during the run: p50, p95, max,
  ms;
- scheduler CPU: CPU seconds of the scheduler process alone (``/proc``, :mod:`bench.cpu`) during the run.

Printed side by side with KE/leoflow ratios, written to ``bench/results/kube_compare-<stamp>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from bench import cpu
from bench.compare import (BENCH_DAGS, PINNED, RESULTS_DIR, Postgres, _git_state, _parse_ts, _ratio, _uptime,
                           bench_session, log, migrate_template, percentile, task_instances)
from devtools.kube import HARNESS_LABEL, HARNESS_NODE, REAL_POD_HOME, KubeStack, pod_airflow_cfg
from devtools.stack import AirflowStack

KE_VENV_DEFAULT = Path.home() / ".cache" / "leoflow-bench" / "ke-venv"
KE_REQUIREMENTS = ("apache-airflow==3.3.2", "apache-airflow-providers-cncf-kubernetes==10.25.0", "kubernetes<37",
                   "psycopg2-binary==2.9.13", "asyncpg==0.32.0")
"""What the KE venv holds (KE 10.25.0 needs ``kubernetes<37``; ``psycopg2`` and ``asyncpg``: Airflow derives an
async PostgreSQL URL from the sync one)."""
DAGS = {"bench_fanout": 50, "bench_chain": 20}
PARALLELISM = 32
REAL_NODE_PARALLELISM = 16
"""``--node real``'s default: 16 pods of 100m CPU (plus the chain's 2 warm pods) fit the node's 2 CPUs."""
EXECUTORS = ("leoflow-warm", "leoflow", "ke")
"""``leoflow-warm``: leoflow with warm pods (issue 11); ``leoflow``: a cold pod per attempt; ``ke``: the cncf
KubernetesExecutor."""
def warm_pools(parallelism: int = PARALLELISM) -> dict[str, dict[str, Any]]:
    """``[leoflow] warm_pools`` of the ``leoflow-warm`` stack at ``parallelism`` (see :data:`WARM_POOLS`)."""
    return {"bench_fanout": {"min_idle": parallelism, "max_pool_size": parallelism, "prewarm": True},
            "bench_chain": {"min_idle": 2, "max_pool_size": 2, "prewarm": True}}


WARM_POOLS = warm_pools()
"""``[leoflow] warm_pools`` of the ``leoflow-warm`` stack: the fan-out gets one warm pod per slot (``[core]
parallelism``: no more can run at once, so a larger pool would only start pods the run never uses), the chain (one
task at a time) two. Both are prewarmed (their DAGs are unpaused before any run) and measured once full."""
WARM_FILL_TIMEOUT_SECONDS = 600.0
LOOP_RE = re.compile(r"Ran scheduling loop in ([0-9.]+) ms")


# ---------------------------------------------------------------------------------------------- KE venv


def ensure_ke_venv(venv: Path, log: Any) -> Path:
    """The KE venv's python: ``venv`` made (``python3.11 -m venv``) and filled with :data:`KE_REQUIREMENTS` when
    it lacks any of them (pip; a fresh one takes minutes). Raises ``RuntimeError`` with pip's tail on failure."""
    python = venv / "bin" / "python"
    probe = ("import importlib.metadata as m, sys; "
             "ok = m.version('apache-airflow') == '3.3.2' and "
             "m.version('apache-airflow-providers-cncf-kubernetes') == '10.25.0' and "
             "int(m.version('kubernetes').split('.')[0]) < 37; import psycopg2, asyncpg; sys.exit(0 if ok else 1)")
    if python.exists() and subprocess.run([str(python), "-c", probe], capture_output=True).returncode == 0:
        return python
    if not python.exists():
        log(f"making the KubernetesExecutor venv {venv} (minutes)")
        venv.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([shutil.which("python3.11") or sys.executable, "-m", "venv", str(venv)], check=True)
    log(f"installing {' '.join(KE_REQUIREMENTS)} into {venv}")
    r = subprocess.run([str(python), "-m", "pip", "install", "-q", *KE_REQUIREMENTS], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"pip install into {venv} failed: {r.stderr[-2000:]}")
    return python


class VenvStack(AirflowStack):
    """An :class:`AirflowStack` whose Airflow processes run another venv's python (the KE venv)."""

    def __init__(self, home: Path, *, python: Path, **kwargs: Any) -> None:
        super().__init__(home, **kwargs)
        self.python = python

    def _airflow(self, *args: str) -> list[str]:
        return [str(self.python), "-m", "airflow", *args]


def configure_ke(stack: AirflowStack, kube: KubeStack, namespace: str, python: Path) -> dict[str, str]:
    """Write the KE pod-side home and pod template under ``stack.home`` and add ``[kubernetes_executor]`` to
    ``stack.extra_env`` (module docstring). Returns those settings. On the real node the pods run in the task
    namespace (``namespace`` is not used)."""
    base = stack.env()
    if kube.node == "real":
        template = kube.real_pod_template_for(stack, pod_airflow_cfg(
            dags_folder=stack.dags_folder, bundles=base["AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST"],
            execution_api_server_url=base["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"],
            base_log_folder=Path(REAL_POD_HOME) / "logs"))
        spec = template["spec"]
        spec["restartPolicy"] = "Never"
        spec["securityContext"].update({"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}})
        spec["containers"][0].update({
            "command": ["/usr/bin/dumb-init", "--"],  # KE's args: python -m airflow.sdk.execution_time...
            "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}})
        namespace = kube.namespace
    else:
        template = _harness_ke_template(stack, base, python)
    path = stack.home / "ke-pod-template.yaml"
    path.write_text(json.dumps(template, indent=2) + "\n")
    settings = {
        "AIRFLOW__CORE__EXECUTOR": "KubernetesExecutor",
        "AIRFLOW__KUBERNETES_EXECUTOR__IN_CLUSTER": "False",
        "AIRFLOW__KUBERNETES_EXECUTOR__CONFIG_FILE": str(kube.env.kubeconfig),
        "AIRFLOW__KUBERNETES_EXECUTOR__NAMESPACE": namespace,
        "AIRFLOW__KUBERNETES_EXECUTOR__POD_TEMPLATE_FILE": str(path),
        "AIRFLOW__KUBERNETES_EXECUTOR__WORKER_PODS_CREATION_BATCH_SIZE": str(stack.parallelism),
    }
    stack.extra_env.update(settings)
    return settings


def _harness_ke_template(stack: AirflowStack, base: dict[str, str], python: Path) -> dict[str, Any]:
    """The KE pod template on the node harness: the KE venv's python runs KE's ``args`` as a local process."""
    pod_home = stack.home / "pod-home"
    pod_home.mkdir(parents=True, exist_ok=True)
    (pod_home / "airflow.cfg").write_text(pod_airflow_cfg(
        dags_folder=stack.dags_folder, bundles=base["AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST"],
        execution_api_server_url=base["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"],
        base_log_folder=stack.home / "logs"))
    template = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"labels": {HARNESS_LABEL: HARNESS_NODE}},
        "spec": {
            "nodeName": HARNESS_NODE, "restartPolicy": "Never",
            "containers": [{
                "name": "base", "image": "registry.example/airflow:ke-bench", "command": ["/usr/bin/env"],
                "env": [{"name": "PATH", "value": f"{python.parent}:/usr/bin:/bin"},
                        {"name": "AIRFLOW_HOME", "value": str(pod_home)},
                        {"name": "PYTHONPATH", "value": base.get("PYTHONPATH", "")}],
            }],
        },
    }
    return template


# ---------------------------------------------------------------------------------------------- measuring


class PodWatch:
    """Watches pods of every namespace; remembers when (``time.monotonic()``) each pod UID was first seen."""

    def __init__(self, api: Any) -> None:
        self.api = api
        self.first_seen: dict[str, tuple[str, float]] = {}  # uid -> (namespace, monotonic)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-pod-watch", daemon=True)

    def start(self) -> None:
        """Start watching (a daemon thread; re-lists on any error)."""
        self._thread.start()

    def _run(self) -> None:
        from kubernetes import client, watch

        core = client.CoreV1Api(self.api)
        while not self._stop.is_set():
            try:
                for ev in watch.Watch().stream(core.list_pod_for_all_namespaces, timeout_seconds=30):
                    pod = ev["object"]
                    self.first_seen.setdefault(pod.metadata.uid, (pod.metadata.namespace, time.monotonic()))
                    if self._stop.is_set():
                        return
            except Exception:  # noqa: BLE001 - re-list; a bench watch must outlive a hiccup
                time.sleep(0.5)

    def creates(self, namespace: str, since: float, until: float) -> list[float]:
        """Monotonic first-seen times of ``namespace``'s pods first seen in [since, until], sorted."""
        return sorted(t for ns, t in self.first_seen.values() if ns == namespace and since <= t <= until)

    def stop(self) -> None:
        """Stop at the next event (the thread is a daemon)."""
        self._stop.set()


def loop_durations(log_path: Path, offset: int) -> tuple[list[float], int]:
    """The ``Ran scheduling loop in X ms`` values (ms) in ``log_path`` after byte ``offset``; and the new end."""
    try:
        with open(log_path, "rb") as fh:
            fh.seek(offset)
            text = fh.read().decode(errors="replace")
            end = fh.tell()
    except OSError:
        return [], offset
    return [float(m.group(1)) for m in LOOP_RE.finditer(text)], end


def measure(stack: AirflowStack, watch: PodWatch, namespace: str, sched_pid: int, *, executor: str,
            dag_id: str, timeout: float) -> dict[str, Any]:
    """Trigger ``dag_id`` once, wait for its end, return its figures (module docstring)."""
    log_path = stack.process_logs / "scheduler.log"
    _, offset = loop_durations(log_path, 0)
    cpu0 = cpu.snapshot().get(sched_pid)
    t0 = time.monotonic()
    load_before = os.getloadavg()
    run_id = stack.trigger(dag_id)
    try:
        state = stack.wait_for_run(dag_id, run_id, timeout=timeout, poll=0.5)
    except TimeoutError:
        state = "timeout"
    t1 = time.monotonic()
    cpu1 = cpu.snapshot().get(sched_pid)
    time.sleep(1.0)  # the last loop lines
    loops, _ = loop_durations(log_path, offset)
    run = stack.run(dag_id, run_id)
    tis = task_instances(stack, dag_id, run_id)
    q2r = [(_parse_ts(t["start_date"]) - _parse_ts(t["queued_when"])).total_seconds()
           for t in tis if t.get("start_date") and t.get("queued_when")]
    rs, re_ = _parse_ts(run.get("start_date")), _parse_ts(run.get("end_date"))
    creates = watch.creates(namespace, t0, t1)
    span = creates[-1] - creates[0] if len(creates) > 1 else float("nan")
    return {
        "executor": executor, "dag_id": dag_id, "state": state, "tasks": len(tis),
        "tasks_ok": sum(1 for t in tis if t["state"] == "success"),
        "q2r_p50_s": percentile(q2r, 50), "q2r_p95_s": percentile(q2r, 95),
        "wall_s": (re_ - rs).total_seconds() if rs and re_ else float("nan"),
        "pods": len(creates), "creates_per_s": (len(creates) - 1) / span if span and span > 0 else float("nan"),
        "loops": len(loops), "loop_p50_ms": percentile(loops, 50), "loop_p95_ms": percentile(loops, 95),
        "loop_max_ms": max(loops) if loops else float("nan"),
        "scheduler_cpu_s": (cpu1.own - cpu0.own) if cpu0 and cpu1 else float("nan"),
        "load_before": load_before, "load_after": os.getloadavg(),
        "tis": [[t["task_id"], t.get("queued_when"), t.get("start_date"), t.get("end_date"), t["state"]]
                for t in tis],
    }


def idle_workers(pg: Postgres, database: str) -> dict[str, int]:
    """``{dag_id: ready warm workers of its latest version}`` from the stack's database: registered, idle and
    awaiting (a worker awaits only once it has parsed its DAG file)."""
    rows = pg.query(database, "select v.dag_id, count(w.pod_uid) from dag_version v "
                              "join leoflow_warm_worker w on cast(w.dag_version_id as text) = cast(v.id as text) "
                              "where w.state = 'idle' and w.last_seen_at is not null and v.version_number = (select max(version_number) "
                              "from dag_version x where x.dag_id = v.dag_id) group by v.dag_id")
    return {dag_id: int(n) for dag_id, n in rows}


def wait_pools_full(pg: Postgres, database: str, dags: list[str], timeout: float,
                    pools: dict[str, dict[str, Any]] = WARM_POOLS) -> float:
    """Wait until each DAG of ``dags`` has its ``pools`` ``min_idle`` idle workers; the seconds taken.
    Raises ``TimeoutError`` with the counts seen."""
    t0 = time.monotonic()
    seen: dict[str, int] = {}
    while time.monotonic() - t0 < timeout:
        seen = idle_workers(pg, database)
        if all(seen.get(d, 0) >= pools[d]["min_idle"] for d in dags if d in pools):
            return time.monotonic() - t0
        time.sleep(1.0)
    raise TimeoutError(f"warm pools not full after {timeout:.0f}s: {seen}")


SETTLE_LOAD = 4.0
"""A DAG is triggered once the 1-minute load average is at most this (or after :data:`SETTLE_MAX_SECONDS`): the
machine's 2 cores also run the control plane and every pod, so a run that starts while the previous one's pods
(or a pool's start) still load it would measure them."""
SETTLE_MAX_SECONDS = 150.0


def settle(log: Any) -> None:
    """Wait until the 1-minute load average is at most :data:`SETTLE_LOAD`, at most :data:`SETTLE_MAX_SECONDS`."""
    t0 = time.monotonic()
    while os.getloadavg()[0] > SETTLE_LOAD and time.monotonic() - t0 < SETTLE_MAX_SECONDS:
        time.sleep(2.0)
    log(f"  settled {time.monotonic() - t0:.0f}s: load average {os.getloadavg()[0]:.2f}")


def scheduler_pid(stack: AirflowStack) -> int:
    """The pid of the stack's scheduler process (its popen: ``procs.spawn`` order api-server, scheduler, ...)."""
    return stack._popens[stack._names.index("scheduler")].pid  # noqa: SLF001 - the stack has no accessor


def run_executor(executor: str, pg: Postgres, template_db: str, work: Path, kube: KubeStack, watch: PodWatch,
                 ke_python: Path | None, ke_namespace: str, *, dags: list[str], timeout: float,
                 log: Any, parallelism: int = PARALLELISM) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """A fresh stack for ``executor`` (one of :data:`EXECUTORS`) on a fresh database; its DAGs one by one
    (``leoflow-warm``: once its warm pools are full)."""
    database = f"kbench_{executor.replace('-', '_')}"
    pg.execute(f"DROP DATABASE IF EXISTS {database}")
    pg.execute(f"CREATE DATABASE {database} TEMPLATE {template_db}")
    env = {**PINNED, "AIRFLOW__LOGGING__NAMESPACE_LEVELS": "airflow.jobs.scheduler_job_runner=DEBUG"}
    home = work / database
    common = dict(parallelism=parallelism, dags_folder=BENCH_DAGS, sql_alchemy_conn=pg.url_for(database),
                  extra_env=env, api_host=kube.api_host)
    pools = warm_pools(parallelism)
    if executor in ("leoflow", "leoflow-warm"):
        if executor == "leoflow-warm":
            env["AIRFLOW__LEOFLOW__WARM_POOLS"] = json.dumps(pools)
        stack = AirflowStack(home, **common)
        kube.configure(stack)
        namespace = kube.namespace
    else:
        stack = VenvStack(home, python=ke_python, **common)
        namespace = configure_ke(stack, kube, ke_namespace, ke_python)["AIRFLOW__KUBERNETES_EXECUTOR__NAMESPACE"]
    rows: list[dict[str, Any]] = []
    facts: dict[str, Any] = {"executor": executor, "home": str(home), "namespace": namespace}
    t0 = time.monotonic()
    try:
        stack.start(wait_for_dags=dags, timeout=300)
        facts["startup_s"] = round(time.monotonic() - t0, 1)
        for dag_id in dags:
            stack.unpause(dag_id)
        time.sleep(3.0)
        if executor == "leoflow-warm":
            facts["warm_fill_s"] = wait_pools_full(pg, database, dags, WARM_FILL_TIMEOUT_SECONDS, pools)
            log(f"  warm pools full in {facts['warm_fill_s']:.0f}s")
        pid = scheduler_pid(stack)
        for dag_id in dags:
            settle(log)
            row = measure(stack, watch, namespace, pid, executor=executor, dag_id=dag_id, timeout=timeout)
            rows.append(row)
            log(f"  {executor:7s} {dag_id:13s} {row['state']:8s} {row['tasks_ok']}/{row['tasks']} ok  "
                f"q2r p50 {row['q2r_p50_s']:.2f}s p95 {row['q2r_p95_s']:.2f}s  wall {row['wall_s']:.1f}s  "
                f"{row['pods']} pods {row['creates_per_s']:.2f}/s  loop p50 {row['loop_p50_ms']:.1f} "
                f"p95 {row['loop_p95_ms']:.1f} max {row['loop_max_ms']:.1f} ms ({row['loops']} loops)  "
                f"load {row['load_before'][0]:.2f}->{row['load_after'][0]:.2f}")
    finally:
        left = stack.stop()
        facts["stopped_clean"] = not left
        if kube.node == "real":  # a real node's CPU is the next executor's: its pods (warm ones too) must go first
            facts["pods_cleared_s"] = clear_pods(kube, namespace)
        try:
            pg.execute(f"DROP DATABASE IF EXISTS {database}")
        except Exception as exc:  # noqa: BLE001 - a database left behind is only disk space
            log(f"  could not drop database {database}: {exc}")
    return rows, facts


def clear_pods(kube: KubeStack, namespace: str, timeout: float = 180.0) -> float:
    """Delete every pod of ``namespace`` (grace 0, leoflow's finalizers released) and wait until none is left;
    the seconds it took. On the real node an executor's pods still running, warm pods above all, hold the CPU
    the next executor's pods request (the kubelet would refuse those with ``OutOfcpu``). Raises ``TimeoutError``."""
    from kubernetes import client

    from devtools.kube import release_finalizers

    core = client.CoreV1Api(kube.api)
    t0 = time.monotonic()
    core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
    while True:
        release_finalizers(core, namespace)
        left = [p.metadata.name for p in core.list_namespaced_pod(namespace).items]
        if not left:
            return round(time.monotonic() - t0, 1)
        if time.monotonic() - t0 > timeout:
            raise TimeoutError(f"pods of {namespace} left after {timeout:.0f}s: {left}")
        time.sleep(1.0)


FIELDS = (("q2r_p50_s", "queued->running p50 s", "{:.2f}"), ("q2r_p95_s", "queued->running p95 s", "{:.2f}"),
          ("wall_s", "wall s", "{:.1f}"), ("creates_per_s", "pod creates/s", "{:.2f}"),
          ("loop_p50_ms", "sched loop p50 ms", "{:.1f}"), ("loop_p95_ms", "sched loop p95 ms", "{:.1f}"),
          ("loop_max_ms", "sched loop max ms", "{:.1f}"), ("scheduler_cpu_s", "scheduler CPU s", "{:.2f}"),
          ("tasks_ok", "tasks ok", "{}"))


def render(rows: list[dict[str, Any]], parallelism: int = PARALLELISM) -> str:
    """Side by side per DAG: leoflow warm, leoflow cold, KE, then the ratios warm/KE and cold/KE (issue 11's bars:
    queued-to-running p50 warm/KE at most 0.10, the fan-out's wall warm/KE at most 0.33)."""
    lines = []
    for dag_id in DAGS:
        by = {r["executor"]: r for r in rows if r["dag_id"] == dag_id}
        if not by:
            continue
        lines.append(f"{dag_id} ({DAGS[dag_id]} tasks, parallelism {parallelism})")
        lines.append(f"  {'':24s} {'warm':>10s} {'cold':>10s} {'KE':>10s} {'warm/KE':>10s} {'cold/KE':>10s}")
        for key, label, fmt in FIELDS:
            values = [by.get(e, {}).get(key) for e in EXECUTORS]
            cells = [fmt.format(v) if v is not None else "-" for v in values]
            ke = values[2]
            ratios = [f"{_ratio(v, ke):.2f}" if v is not None and ke is not None else "-" for v in values[:2]]
            lines.append(f"  {label:24s} " + " ".join(f"{c:>10s}" for c in [*cells, *ratios]))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the comparison (module docstring); 0 when every run succeeded."""
    parser = argparse.ArgumentParser(prog="python -m bench.kube_compare", description=__doc__.split("\n")[0])
    parser.add_argument("--executors", nargs="+", choices=list(EXECUTORS), default=list(EXECUTORS))
    parser.add_argument("--dags", nargs="+", choices=list(DAGS), default=list(DAGS))
    parser.add_argument("--ke-venv", type=Path, default=KE_VENV_DEFAULT,
                        help=f"the KubernetesExecutor venv (made when missing; default {KE_VENV_DEFAULT})")
    parser.add_argument("--k8s-dir", type=Path, help="reuse this running `scripts/k8senv start --dir`")
    parser.add_argument("--run-timeout", type=float, default=600.0)
    parser.add_argument("--keep", action="store_true", help="keep the work dir (logs) afterwards")
    parser.add_argument("--node", choices=("harness", "real"), default="harness",
                        help="what runs the pods: the node harness (default) or the real node (kubelet, containerd)")
    parser.add_argument("--parallelism", type=int, default=None,
                        help=f"[core] parallelism (default {PARALLELISM}; {REAL_NODE_PARALLELISM} on the real node)")
    args = parser.parse_args(argv)
    parallelism = args.parallelism or (REAL_NODE_PARALLELISM if args.node == "real" else PARALLELISM)

    stamp, work = bench_session("leoflow-kbench-")
    log(f"leoflow kube bench {stamp}: work dir {work}; {_uptime()}")
    ke_python = ensure_ke_venv(args.ke_venv, log) if "ke" in args.executors else None
    pg = Postgres(work / "pg")
    kube = KubeStack(work / "kube", reuse_dir=args.k8s_dir, venv=Path(sys.prefix),  # harness pods run this venv
                     node=args.node)
    watch: PodWatch | None = None
    rows: list[dict[str, Any]] = []
    stacks: list[dict[str, Any]] = []
    ke_namespace = f"ke-bench-{stamp.lower()[-7:-1]}"
    try:
        pg.start()
        migrate_template(pg, "kbench_template", work, log)
        kube.start()
        from kubernetes import client

        core = client.CoreV1Api(kube.api)
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ke_namespace)))
        watch = PodWatch(kube.api)
        watch.start()
        for executor in args.executors:
            log(f"{executor}: parallelism {parallelism}, {args.node} node ({_uptime()})")
            r, facts = run_executor(executor, pg, "kbench_template", work, kube, watch, ke_python, ke_namespace,
                                    dags=list(args.dags), timeout=args.run_timeout, log=log, parallelism=parallelism)
            rows.extend(r)
            stacks.append(facts)
    finally:
        if watch is not None:
            watch.stop()
        try:
            if kube.api is not None:
                from kubernetes import client

                client.CoreV1Api(kube.api).delete_namespace(ke_namespace)
        except Exception:  # noqa: BLE001 - best effort on the way out
            pass
        kube.stop()
        try:
            if pg.url:
                pg.execute("DROP DATABASE IF EXISTS kbench_template")
        except Exception:  # noqa: BLE001
            pass
        pg.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    log("")
    log(f"KE vs leoflow on k8senv + the {'real node' if args.node == 'real' else 'node harness'}, one run each "
        f"({_uptime()})")
    log(render(rows, parallelism))
    out = RESULTS_DIR / f"kube_compare-{stamp}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"stamp": stamp, "git": _git_state(), "parallelism": parallelism, "node": args.node,
                               "ke_venv": str(args.ke_venv), "stacks": stacks, "runs": rows}, indent=2,
                              default=str))
    log(f"results: {out}")
    return 0 if rows and all(r["state"] == "success" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
