"""KubernetesRuntime at scale on kwok: pod creates/s, the CPU of one reconcile pass, apiserver requests per pass.

Run from the repo root with the project venv (issue 9, "Benchmark")::

    .venv/bin/python -m bench.kube_scale                      # starts its own k8senv control plane
    .venv/bin/python -m bench.kube_scale --k8s-dir /tmp/k8s   # reuse one started by `scripts/k8senv start`

What it does. A :class:`~leoflow_airflow.runtime.kubernetes.runtime.KubernetesRuntime` is driven directly (no
Airflow scheduler, as ``tests/k8s/test_kube_runtime.py`` does) against the real kube-apiserver of
``scripts/k8senv``, in a fresh namespace. The pod template binds every pod to the kwok nodes (``kwok-node-0``);
kwok makes a bound pod Running at once and, as the pods carry no ``kwok.leoflow.test/exit-code`` annotation,
they stay Running: every launched attempt stays in flight. Attempts are launched in steps up to 10, 100 and
1,000 in flight; at each step, once every create answered:

- ``creates/s``: the step's launches / (last ``Started`` event - first ``launch()``), seconds of wall clock,
  launching as fast as ``admit()`` allows (``[leoflow] launch_queue_size`` creates in flight, the default 64);
- ``pass CPU``: ``time.thread_time()`` (CPU seconds of the calling thread only, i.e. the scheduler's) around one
  ``observe(all open attempts)`` + ``poll()`` + ``collect()`` pass, the median of :data:`PASSES` passes
  (``collect``'s 30 s throttle is reset before each pass so it really walks the cache);
- ``requests/pass``: HTTP requests the runtime's ``ApiClient`` sent from the start of a pass until
  :data:`SETTLE_SECONDS` after it (the pass may hand reads or deletes to the runtime's worker pool), counted by
  wrapping ``ApiClient.rest_client.request`` (every ``call_api``, the informer's list and watch included).
  ``idle requests/s`` is the same count over :data:`IDLE_SECONDS` with no pass (the informer's watch re-opens).

They must not grow with the number of running attempts: state comes from the informer's cache, not requests.
Results are printed and written to ``bench/results/kube_scale-<UTC stamp>.json`` (git-ignored).
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from bench.compare import RESULTS_DIR, _git_state, _uptime

STEPS = (10, 100, 1000)
"""Attempts in flight at which a pass is measured."""
PASSES = 5
"""Passes measured per step (the median CPU is reported, every pass kept in the JSON)."""
SETTLE_SECONDS = 1.0
"""Requests counted until this long after a pass ends (work the pass handed to the runtime's pool)."""
IDLE_SECONDS = 5.0
"""The window of the idle request count."""
TEMPLATE = """\
apiVersion: v1
kind: Pod
metadata:
  labels: {bench: kube-scale}
spec:
  nodeName: kwok-node-0
  containers:
  - name: base
    image: registry.example/leoflow:bench
"""


class RequestCounter:
    """Counts the HTTP requests of one ``kubernetes.client.ApiClient`` by wrapping its ``rest_client.request``
    (the one call every ``call_api`` ends in); thread-safe. ``count`` is the total so far."""

    def __init__(self, api_client: Any) -> None:
        self.count = 0
        self.by_verb: dict[str, int] = {}
        self._lock = threading.Lock()
        inner = api_client.rest_client.request

        def request(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
            with self._lock:
                self.count += 1
                key = f"{method} {'watch' if 'watch=' in url else url.rsplit('?', 1)[0].rsplit('/', 1)[-1]}"
                self.by_verb[key] = self.by_verb.get(key, 0) + 1
            return inner(method, url, *args, **kwargs)

        api_client.rest_client.request = request


def bench_settings(kubeconfig: Path, namespace: str, workdir: Path, **extra: str) -> Any:
    """The parsed ``[leoflow]`` settings of a benchmark's Kubernetes runtime: namespace ``namespace`` of the
    control plane of ``kubeconfig``, the pod template :data:`TEMPLATE` (written into ``workdir``), an exchange
    URL nothing answers (kwok runs no container); ``extra`` adds or replaces ``[leoflow]`` options (strings)."""
    from leoflow_airflow import settings as leoflow_settings

    template = workdir / "pod.yaml"
    template.write_text(TEMPLATE)
    conf = {"runtime": "kubernetes", "image": "registry.example/leoflow:bench",
            "exchange_url": "http://127.0.0.1:9/leoflow", "namespace": namespace, "in_cluster": "False",
            "kube_config": str(kubeconfig), "pod_template_file": str(template), **extra}
    return leoflow_settings.load(lambda section, key, fallback: conf.get(key, fallback))


def counted_runtime(settings: Any) -> tuple[Any, RequestCounter]:
    """A ``KubernetesRuntime`` on ``settings`` (no ``pod_mutation_hook``) whose ``ApiClient`` is wrapped by a
    :class:`RequestCounter`; ``(runtime, counter)``. The client is made here, at once, so the counter exists
    before the runtime starts (the runtime's factory hands this one client out)."""
    from kubernetes import config

    from leoflow_airflow.runtime.kubernetes.runtime import KubernetesRuntime

    api = config.new_client_from_config(config_file=settings.kubernetes.kube_config)
    counter = RequestCounter(api)
    return KubernetesRuntime(settings, api_client_factory=lambda: api, mutation_hook=False), counter


def _attempt(ref: Any, facts: dict[str, str]) -> Any:
    """The ledger row the lifecycle would hold for a dispatched attempt ``ref`` (pod facts from ``Started``)."""
    from leoflow_airflow.ledger.states import AttemptState
    from leoflow_airflow.ledger.store import Attempt

    now = datetime.now(timezone.utc)
    return Attempt(ref=ref, dag_id="bench", task_id="task", run_id="run", map_index=-1,
                   state=AttemptState.DISPATCHED, runtime="kubernetes", workload_json="{}", scheduler_job_id=None,
                   host=None, pid=None, proc_start_time=None, record_path=None, pod_name=facts.get("pod_name"),
                   pod_uid=facts.get("pod_uid"), reported_state=None, exit_status=None, resolution=None,
                   detail=None, created_at=now, dispatched_at=now, reported_at=None, exited_at=None,
                   closed_at=None, updated_at=now)


def _wait(predicate: Any, timeout: float, what: str, interval: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


class Bench:
    """One runtime in one namespace; :meth:`grow_to` launches attempts, :meth:`one_pass` times a pass.
    ``extra``: ``[leoflow]`` options added to :func:`bench_settings`'s."""

    def __init__(self, kubeconfig: Path, namespace: str, workdir: Path, **extra: str) -> None:
        self.settings = bench_settings(kubeconfig, namespace, workdir, **extra)
        self.rt, self.counter = counted_runtime(self.settings)
        self.attempts: list[Any] = []
        self.pending: dict[str, Any] = {}  # launch id -> ref

    def start(self) -> None:
        """Start the runtime and wait until it admits launches (start-up check passed, cache synced)."""
        self.rt.start()
        _wait(lambda: self.rt.admit() is None, 60, "the runtime to admit launches")

    def _take(self) -> None:
        from leoflow_airflow.lifecycle.runtime import Started

        for ev in self.rt.poll():
            ref = self.pending.pop(ev.launch_id, None)
            if ref is None:
                continue
            if not isinstance(ev, Started):
                raise RuntimeError(f"a create failed: {ev}")
            self.attempts.append(_attempt(ref, ev.facts))

    def grow_to(self, n: int) -> dict[str, float]:
        """Launch attempts until ``n`` are Started; returns ``{"launched", "seconds", "creates_per_s",
        "requests"}`` (the requests sent meanwhile: one create each, which shows the counter works)."""
        from leoflow_airflow.dispatch.disposition import Disposition
        from leoflow_airflow.ledger.states import AttemptRef
        from leoflow_airflow.lifecycle.runtime import LaunchSpec, launch_id

        todo = launched = n - len(self.attempts) - len(self.pending)
        requests0 = self.counter.count
        t0 = time.monotonic()
        while todo > 0:
            ref = AttemptRef(str(uuid.uuid4()), 1, 1)
            ti = SimpleNamespace(dag_id="bench", task_id=f"t{len(self.attempts) + len(self.pending)}",
                                 run_id="run", map_index=-1, executor_config=None)
            lid = launch_id(ref)
            result = self.rt.launch(LaunchSpec(lid, ref, SimpleNamespace(ti=ti)))
            if result.disposition is Disposition.DISPATCHED:
                self.pending[lid] = ref
                todo -= 1
            else:
                time.sleep(0.005)
            self._take()
        while self.pending:
            self._take()
            time.sleep(0.005)
        took = time.monotonic() - t0
        return {"launched": launched, "seconds": took, "creates_per_s": launched / took if took else 0.0,
                "requests": self.counter.count - requests0}  # about one per create: the counter counts

    def running(self) -> int:
        """Pods the informer's cache holds as Running."""
        return sum(1 for v in self.rt.informer.views() if v.phase == "Running")

    def one_pass(self) -> dict[str, Any]:
        """One observe + poll + collect over every open attempt: CPU seconds of this thread, requests sent."""
        from leoflow_airflow.lifecycle.runtime import Presence

        self.rt._next_collect = 0.0  # bench only: defeat collect's 30 s throttle so the pass walks the cache
        before = self.counter.count
        verbs_before = dict(self.counter.by_verb)
        w0 = time.monotonic()
        c0 = time.thread_time()
        presence = self.rt.observe(self.attempts)
        events = self.rt.poll()
        deleted = self.rt.collect(lambda ti_id, epoch: False)
        cpu = time.thread_time() - c0
        wall = time.monotonic() - w0
        time.sleep(SETTLE_SECONDS)
        live = sum(1 for p in presence.values() if p is Presence.LIVE)
        verbs = {k: v - verbs_before.get(k, 0) for k, v in self.counter.by_verb.items()
                 if v != verbs_before.get(k, 0)}
        return {"cpu_s": cpu, "wall_s": wall, "requests": self.counter.count - before, "requests_by": verbs,
                "live": live, "events": len(events), "collect_deletes": deleted}

    def idle_requests(self) -> int:
        """Requests sent over :data:`IDLE_SECONDS` with no call into the runtime."""
        before = self.counter.count
        time.sleep(IDLE_SECONDS)
        return self.counter.count - before

    def stop(self) -> None:
        """Stop the runtime (its pods stay: the namespace's deletion removes them)."""
        self.rt.stop(timeout=5)


def table(columns: list[tuple[str, int, Any]], rows: list[dict[str, Any]]) -> str:
    """A printed table: ``columns`` of ``(header, width, cell(row) -> str)``, right-aligned, one line per row."""
    head = " ".join(f"{name:>{width}}" for name, width, _ in columns)
    lines = [head, "-" * len(head)]
    lines += [" ".join(f"{cell(r):>{width}}" for _, width, cell in columns) for r in rows]
    return "\n".join(lines)


def render(rows: list[dict[str, Any]]) -> str:
    """The printed table, one row per step."""
    return table([("in flight", 9, lambda r: str(r["in_flight"])), ("running", 7, lambda r: str(r["running"])),
                  ("creates/s", 9, lambda r: f"{r['grow']['creates_per_s']:.1f}"),
                  ("pass CPU ms", 11, lambda r: f"{r['pass_cpu_ms_median']:.2f}"),
                  ("pass wall ms", 12, lambda r: f"{r['pass_wall_ms_median']:.2f}"),
                  ("req/pass", 8, lambda r: str(r["requests_per_pass_max"])),
                  ("idle req/s", 10, lambda r: f"{r['idle_requests'] / IDLE_SECONDS:.2f}")], rows)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark (module docstring); exit status 0, or 1 with the reason on stderr."""
    parser = argparse.ArgumentParser(prog="python -m bench.kube_scale", description=__doc__.split("\n")[0])
    parser.add_argument("--k8s-dir", type=Path, help="reuse this running `scripts/k8senv start --dir` control plane")
    parser.add_argument("--steps", default=",".join(map(str, STEPS)), help="attempts in flight (comma-separated)")
    args = parser.parse_args(argv)
    steps = [int(x) for x in args.steps.split(",")]

    install_interrupts()
    try:
        with control_plane(args.k8s_dir) as (env, namespace, work):
            bench = Bench(env.kubeconfig, namespace, work)
            try:
                return _run(bench, steps)
            finally:
                bench.stop()
    except Exception as exc:  # noqa: BLE001 - a benchmark reports and exits
        print(f"kube_scale: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


def _run(bench: Bench, steps: list[int]) -> int:
    bench.start()
    rows = []
    load_before = _uptime()
    for n in steps:
        grow = bench.grow_to(n)
        _wait(lambda: bench.running() >= n, 120, f"{n} pods Running in the cache", interval=0.1)
        passes = [bench.one_pass() for _ in range(PASSES)]
        idle = bench.idle_requests()
        row = {"in_flight": n, "running": bench.running(), "grow": grow, "passes": passes,
               "pass_cpu_ms_median": 1000 * statistics.median(p["cpu_s"] for p in passes),
               "pass_wall_ms_median": 1000 * statistics.median(p["wall_s"] for p in passes),
               "requests_per_pass_max": max(p["requests"] for p in passes), "idle_requests": idle}
        rows.append(row)
        print(f"{n} in flight: {grow['launched']} creates ({grow['requests']} requests) in "
              f"{grow['seconds']:.1f} s; pass CPU "
              f"{row['pass_cpu_ms_median']:.2f} ms; requests/pass {[p['requests'] for p in passes]}; "
              f"load {_uptime()}", flush=True)
    print()
    print(render(rows))
    print(f"\nload average: before {load_before}; after {_uptime()}")
    out = write_results("kube_scale", {"rows": rows, "load_before": load_before, "load_after": _uptime(),
                                       "settle_s": SETTLE_SECONDS, "idle_s": IDLE_SECONDS,
                                       "counted": "requests of the runtime's ApiClient (rest_client.request)"})
    print(f"results: {out}")
    return 0


def install_interrupts() -> None:
    """Make SIGINT and SIGTERM raise ``KeyboardInterrupt``: a background job starts with SIGINT ignored, and
    SIGTERM would skip the clean-up (the control plane and its namespace)."""
    def interrupted(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGINT, interrupted)
    signal.signal(signal.SIGTERM, interrupted)


def write_results(prefix: str, figures: dict[str, Any]) -> Path:
    """Write ``figures`` plus the git state measured to ``bench/results/<prefix>-<UTC stamp>.json``; its path."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out = RESULTS_DIR / f"{prefix}-{stamp}.json"
    out.write_text(json.dumps({**figures, "git": _git_state()}, indent=2, default=str))
    return out


@contextmanager
def control_plane(k8s_dir: Path | None, nodes: int | None = None) -> Iterator[tuple[Any, str, Path]]:
    """A k8senv control plane and a fresh namespace in it: ``(env, namespace, workdir)``.

    :param k8s_dir: reuse this running ``scripts/k8senv start --dir`` control plane; None starts one (building
        the binaries first if needed) and stops it on exit.
    :param nodes: kwok Nodes of a started control plane (None: k8senv's default); a reused one keeps its own.
    On exit the namespace is deleted (on a reused control plane, leoflow's finalizers are stripped first so its
    pods do not stay Terminating) and ``workdir`` removed. Raises what k8senv or the apiserver raise.
    """
    from kubernetes import client, config

    from devtools import k8senv

    work = Path(tempfile.mkdtemp(prefix="leoflow-kube-bench-"))
    started: Path | None = None
    core = None
    namespace = f"leoflow-bench-{uuid.uuid4().hex[:6]}"
    try:
        if k8s_dir is not None:
            env = k8senv.K8sEnv.load(k8s_dir, 0.0)
        else:
            if k8senv.bindir() is None:
                print("building the k8s binaries (once, about 6.5 min on 2 cores)", flush=True)
                k8senv.build()
            started = work / "k8senv"
            env = k8senv.start(started, nodes=nodes)
        core = client.CoreV1Api(config.new_client_from_config(config_file=str(env.kubeconfig)))
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
        _wait(lambda: any(sa.metadata.name == "default"
                          for sa in core.list_namespaced_service_account(namespace).items), 60,
              "the namespace's default ServiceAccount", interval=0.2)
        yield env, namespace, work
    finally:
        if core is not None:
            try:
                core.delete_namespace(namespace)
            except Exception:  # noqa: BLE001 - the control plane may be gone
                pass
            if started is None:  # a reused control plane: its pods must not stay Terminating on our finalizer
                from devtools.kube import release_finalizers

                for problem in release_finalizers(core, namespace):
                    print(f"kube bench: {problem}", file=sys.stderr)
        if started is not None:
            k8senv.stop(started)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
