"""``python -m leoflow_airflow.runtime.kubernetes.callback --server URL``: run one ``ExecuteCallback`` workload
(a deadline callback) on the scheduler's host for the Kubernetes runtime, which gives callbacks no pod.

The workload JSON (its token included) is read from stdin, which the runtime points at an unlinked 0600
temporary file: it is never on the command line or in the environment. The callback runs through
``BaseExecutor.run_workload`` exactly as Lite's agents and Airflow's own executors run it; the exit code is 0
when it succeeded, 1 otherwise (the runtime reports ``CallbackDone(ok)`` from it).
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv``, read the workload from stdin, run it; the exit code (2 for a usage error)."""
    parser = argparse.ArgumentParser(prog="python -m leoflow_airflow.runtime.kubernetes.callback")
    parser.add_argument("--server", required=True, help="the Execution API URL")
    args = parser.parse_args(argv)
    from pydantic import TypeAdapter

    from airflow.executors import workloads
    from airflow.executors.base_executor import BaseExecutor

    workload = TypeAdapter(workloads.All).validate_json(sys.stdin.buffer.read())
    code = BaseExecutor.run_workload(workload, server=args.server, subprocess_logs_to_stdout=False)
    return 0 if code in (0, None) else 1


if __name__ == "__main__":
    sys.exit(main())
