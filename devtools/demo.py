"""``python -m devtools.demo``: a real Airflow on SQLite runs every bundled DAG once through an executor.

Builds a fresh stack in a temporary AIRFLOW_HOME, runs ``airflow db migrate``, starts api-server, scheduler
and dag-processor, unpauses and triggers our DAGs and the chosen Airflow examples all at once, waits, prints
a table (DAG, run state, tasks succeeded/failed, wall seconds) and ``demo: N/N dag runs as expected``, then
stops everything it started. Exit status 0 only when every run (and every callback trace) is as expected in
``devtools.expected``; 1 otherwise; 2 when the stack could not be brought up.

``--runtime kubernetes`` (``make demo-k8s``) runs the same DAGs with ``[leoflow] runtime = kubernetes``: a pod
per attempt on the test control plane of ``scripts/k8senv``, run by its real node (a kubelet and containerd running
leoflow's agent image) or, with ``--node harness``, by the node harness (:mod:`devtools.kube`).
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import sys
import tempfile
import time
from pathlib import Path

from devtools import expected
from devtools.runs import RunResult, run_all
from devtools.stack import AirflowStack, StackError

LEOFLOW_EXECUTOR = "leoflow_airflow.executor.LeoflowExecutor"
LOCAL_EXECUTOR = "LocalExecutor"
DEMO_PARALLELISM = 8
"""``[core] parallelism`` of the demo: measured free of ``database is locked`` on SQLite here (see README)."""
RUN_TIMEOUT_SECONDS = 600.0
KUBE_RUN_TIMEOUT_SECONDS = 1500.0
"""With ``--runtime kubernetes`` every attempt is a cold ``python`` process (no zygote): slower on 2 cores."""
RUNTIMES = ("lite", "kubernetes")


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m devtools.demo", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--executor",
        default=LEOFLOW_EXECUTOR,
        help=f"[core] executor string (default {LEOFLOW_EXECUTOR})",
    )
    parser.add_argument(
        "--local", action="store_true", help=f"shortcut for --executor {LOCAL_EXECUTOR} (the reference)"
    )
    parser.add_argument(
        "--runtime", choices=RUNTIMES, default="lite",
        help="[leoflow] runtime: lite (default) or kubernetes (a pod per attempt on the scripts/k8senv control "
        "plane, run by its real node or the node harness: --node; needs root; builds the k8s binaries, and for the "
        "real node the kubelet and the agent image, on first use)",
    )
    parser.add_argument(
        "--node", choices=("real", "harness"), default="real",
        help="with --runtime kubernetes: run the pods on the real node (a kubelet and containerd running leoflow's "
        "agent image; default) or in the node harness (a kubelet stand-in running them as local processes)",
    )
    parser.add_argument(
        "--k8senv-dir", type=Path,
        help="with --runtime kubernetes: reuse a control plane started with `scripts/k8senv start --dir DIR`",
    )
    parser.add_argument("--parallelism", type=int, default=DEMO_PARALLELISM, help="[core] parallelism")
    parser.add_argument("--home", type=Path, help="AIRFLOW_HOME to use (default: a fresh temporary directory)")
    parser.add_argument("--keep", action="store_true", help="keep the AIRFLOW_HOME (logs) afterwards")
    parser.add_argument(
        "--no-sqlite-tuning",
        action="store_true",
        help="keep SQLite's defaults (rollback journal, 5 s busy timeout): for measuring only",
    )
    parser.add_argument("--timeout", type=float, help=f"seconds to wait for runs (default {RUN_TIMEOUT_SECONDS:.0f}; "
                        f"{KUBE_RUN_TIMEOUT_SECONDS:.0f} with --runtime kubernetes)")
    return parser.parse_args(argv)


def format_table(results: dict[str, RunResult]) -> list[str]:
    """The demo's table, one line per DAG in ``expected.EXPECTED`` order; a run off its expectation is marked, and
    a run that failed as its DAG means to (``expected.EXPECTED``: ``run_state`` failed) says so."""
    header = f"{'DAG':<36} {'run state':<10} {'tasks ok':>8} {'failed':>6} {'wall s':>7}  check"
    lines = [header, "-" * len(header)]
    for dag_id in expected.EXPECTED:
        result = results.get(dag_id)
        if result is None:
            lines.append(f"{dag_id:<36} {'(no run)':<10} {'':>8} {'':>6} {'':>7}  MISSING")
            continue
        ok, failed = result.counts()
        problems = expected.mismatches(dag_id, result.state, result.tasks)
        check = "UNEXPECTED: " + "; ".join(problems) if problems else (
            "ok (this DAG fails on purpose)" if expected.EXPECTED[dag_id].run_state == "failed" else "ok")
        lines.append(f"{dag_id:<36} {result.state:<10} {ok:>8} {failed:>6} {result.wall_seconds:>7.1f}  {check}")
    return lines


def main(argv: list[str] | None = None) -> int:
    """Run the demo; returns the process exit status (0 all as expected, 1 some not, 2 stack failure)."""
    args = _parse(argv)
    kube_mode = args.runtime == "kubernetes"
    executor = LOCAL_EXECUTOR if args.local else args.executor
    if kube_mode and executor != LEOFLOW_EXECUTOR:
        print("demo: --runtime kubernetes runs LeoflowExecutor only", file=sys.stderr)
        return 2
    timeout = args.timeout or (KUBE_RUN_TIMEOUT_SECONDS if kube_mode else RUN_TIMEOUT_SECONDS)
    home = args.home or Path(tempfile.mkdtemp(prefix="leoflow-demo-"))
    began = time.monotonic()
    runtime = f", runtime {args.runtime}" if executor == LEOFLOW_EXECUTOR else ""
    print(f"demo: executor {executor}{runtime}, parallelism {args.parallelism}, SQLite, AIRFLOW_HOME {home}",
          flush=True)
    kube = None
    status = 2
    leftovers: list[str] = []
    try:
        with contextlib.ExitStack() as cleanup:
            if kube_mode:
                from devtools.kube import KubeStack, KubeStackError

                kube = KubeStack(home / "kube", reuse_dir=args.k8senv_dir, node=args.node)
                try:
                    kube.start()
                except KubeStackError as exc:
                    raise StackError(f"the Kubernetes side did not come up: {exc}") from None
                cleanup.callback(lambda: leftovers.extend(f"Kubernetes side: {p}" for p in kube.stop()))
            stack = AirflowStack(
                home,
                executor=executor,
                parallelism=args.parallelism,
                example_dags=expected.EXAMPLE_FILES,
                tune_sqlite=not args.no_sqlite_tuning,
                api_host=kube.api_host if kube is not None else "127.0.0.1",
            )
            if kube is not None:
                kube.configure(stack)
                where = (f"real node {kube.node_name} (kubelet and containerd, image {kube.image})"
                         if args.node == "real" else f"node harness on {kube.node_name}")
                print(f"demo: control plane {kube.env.server}, namespace {kube.namespace} (Pod Security "
                      f"restricted), {where}", flush=True)
            cleanup.callback(lambda: leftovers.extend(f"process left after stop: {p}" for p in stack.stop()))
            status = _run(stack, timeout, began)
    except (StackError, TimeoutError) as exc:
        print(f"demo: FAILED: {exc}", file=sys.stderr)
        status = 2 if isinstance(exc, StackError) else 1
    except KeyboardInterrupt:
        print("demo: interrupted", file=sys.stderr)
        status = 130
    for problem in leftovers:
        print(f"demo: {problem}", file=sys.stderr)
    status = status or (1 if leftovers else 0)
    if kube is not None and status != 0 and kube.pods():
        print("demo: task pods (last state of each):\n  " + "\n  ".join(kube.describe_pods()), file=sys.stderr)
    print(f"demo: stopped everything; total {time.monotonic() - began:.1f}s", flush=True)
    if not args.keep and args.home is None and status == 0:
        shutil.rmtree(home, ignore_errors=True)
    elif status != 0:
        print(f"demo: logs kept in {home}/process-logs and {home}/logs", file=sys.stderr)
    return status


def _run(stack: AirflowStack, timeout: float, began: float) -> int:
    """Bring the stack up, run every DAG once, print the table; the exit status (0 or 1)."""
    stack.migrate()
    stack.start(wait_for_dags=list(expected.EXPECTED), scheduler=False)
    print(f"demo: stack up in {time.monotonic() - began:.1f}s; triggering {len(expected.EXPECTED)} DAGs", flush=True)
    unknown = sorted(set(stack.dag_ids()) - set(expected.EXPECTED))
    if unknown:
        print(f"demo: DAGs loaded but not in devtools/expected.py: {unknown}", file=sys.stderr)
    triggered = time.monotonic()
    results = run_all(stack, list(expected.EXPECTED), timeout=timeout, start_scheduler=True)
    runs_seconds = time.monotonic() - triggered
    traces = stack.traces()
    print("\n".join(format_table(results)))
    good = sum(
        1 for dag_id, r in results.items() if not expected.mismatches(dag_id, r.state, r.tasks)
    )
    traces_ok = tuple(traces) == expected.EXPECTED_TRACES
    print(
        f"demo: callbacks {'as expected' if traces_ok else 'NOT as expected'} "
        f"({len(traces)} trace lines, want {len(expected.EXPECTED_TRACES)})"
    )
    if not traces_ok:
        print(f"demo: traces {traces}\ndemo: expected {list(expected.EXPECTED_TRACES)}", file=sys.stderr)
    print(f"demo: all runs ended {runs_seconds:.1f}s after triggering")
    print(f"demo: {good}/{len(expected.EXPECTED)} dag runs as expected")
    return 0 if good == len(expected.EXPECTED) and traces_ok else 1


if __name__ == "__main__":
    sys.exit(main())
