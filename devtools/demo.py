"""``python -m devtools.demo``: a real Airflow on SQLite runs every bundled DAG once through an executor.

Builds a fresh stack in a temporary AIRFLOW_HOME, runs ``airflow db migrate``, starts api-server, scheduler
and dag-processor, unpauses and triggers our DAGs and the chosen Airflow examples all at once, waits, prints
a table (DAG, run state, tasks succeeded/failed, wall seconds) and ``demo: N/N dag runs as expected``, then
stops everything it started. Exit status 0 only when every run (and every callback trace) is as expected in
``devtools.expected``; 1 otherwise; 2 when the stack could not be brought up.
"""

from __future__ import annotations

import argparse
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
    parser.add_argument("--parallelism", type=int, default=DEMO_PARALLELISM, help="[core] parallelism")
    parser.add_argument("--home", type=Path, help="AIRFLOW_HOME to use (default: a fresh temporary directory)")
    parser.add_argument("--keep", action="store_true", help="keep the AIRFLOW_HOME (logs) afterwards")
    parser.add_argument(
        "--no-sqlite-tuning",
        action="store_true",
        help="keep SQLite's defaults (rollback journal, 5 s busy timeout): for measuring only",
    )
    parser.add_argument("--timeout", type=float, default=RUN_TIMEOUT_SECONDS, help="seconds to wait for runs")
    return parser.parse_args(argv)


def format_table(results: dict[str, RunResult]) -> list[str]:
    """The demo's table, one line per DAG in ``expected.EXPECTED`` order; a run off its expectation is marked."""
    header = f"{'DAG':<36} {'run state':<10} {'tasks ok':>8} {'failed':>6} {'wall s':>7}  check"
    lines = [header, "-" * len(header)]
    for dag_id in expected.EXPECTED:
        result = results.get(dag_id)
        if result is None:
            lines.append(f"{dag_id:<36} {'(no run)':<10} {'':>8} {'':>6} {'':>7}  MISSING")
            continue
        ok, failed = result.counts()
        problems = expected.mismatches(dag_id, result.state, result.tasks)
        check = "ok" if not problems else "UNEXPECTED: " + "; ".join(problems)
        lines.append(f"{dag_id:<36} {result.state:<10} {ok:>8} {failed:>6} {result.wall_seconds:>7.1f}  {check}")
    return lines


def main(argv: list[str] | None = None) -> int:
    """Run the demo; returns the process exit status (0 all as expected, 1 some not, 2 stack failure)."""
    args = _parse(argv)
    executor = LOCAL_EXECUTOR if args.local else args.executor
    home = args.home or Path(tempfile.mkdtemp(prefix="leoflow-demo-"))
    began = time.monotonic()
    print(f"demo: executor {executor}, parallelism {args.parallelism}, SQLite, AIRFLOW_HOME {home}", flush=True)
    stack = AirflowStack(
        home,
        executor=executor,
        parallelism=args.parallelism,
        example_dags=expected.EXAMPLE_FILES,
        tune_sqlite=not args.no_sqlite_tuning,
    )
    status = 2
    try:
        stack.migrate()
        stack.start(wait_for_dags=list(expected.EXPECTED))
        print(f"demo: stack up in {time.monotonic() - began:.1f}s; triggering {len(expected.EXPECTED)} DAGs", flush=True)
        unknown = sorted(set(stack.dag_ids()) - set(expected.EXPECTED))
        if unknown:
            print(f"demo: DAGs loaded but not in devtools/expected.py: {unknown}", file=sys.stderr)
        triggered = time.monotonic()
        results = run_all(stack, list(expected.EXPECTED), timeout=args.timeout)
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
        status = 0 if good == len(expected.EXPECTED) and traces_ok else 1
    except (StackError, TimeoutError) as exc:
        print(f"demo: FAILED: {exc}", file=sys.stderr)
        status = 2 if isinstance(exc, StackError) else 1
    except KeyboardInterrupt:
        print("demo: interrupted", file=sys.stderr)
        status = 130
    finally:
        left = stack.stop()
        if left:
            print(f"demo: processes left after stop: {left}", file=sys.stderr)
            status = status or 1
        print(f"demo: stopped everything; total {time.monotonic() - began:.1f}s", flush=True)
        if not args.keep and args.home is None and status == 0:
            shutil.rmtree(home, ignore_errors=True)
        elif status != 0:
            print(f"demo: logs kept in {home}/process-logs and {home}/logs", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
