"""Where the CPU of one DAG run goes, by process role: a diagnostic companion to :mod:`bench.compare`.

Starts one stack (``--executor local|leoflow``, ``--parallelism``), runs one bench DAG, and samples every
process below the scheduler every ``--interval`` seconds from ``/proc``. Each process is keyed by
(pid, start time) and classified by its title (``airflow scheduler``, ``leoflow_agent serve`` = zygote,
``leoflow agent:`` = agent/supervisor, ``airflow worker`` = LocalExecutor worker/supervisor, other Python
children = task processes); its last seen own CPU (utime + stime, seconds) is its cost. A process that lived
less than one interval can be missed, and the CPU it used after the last sample is lost: the figures are a
lower bound of each role, for finding what dominates, not a measurement to quote.

    .venv/bin/python -m bench.probe --executor leoflow --dag bench_fanout --parallelism 32
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from bench import cpu
from bench.compare import (
    BENCH_DAGS, DAGS, EXECUTORS, PINNED, Postgres, migrate_template, stack_roots,
)
from devtools.stack import AirflowStack


def _start_and_faults(pid: int) -> tuple[int, int]:
    """(start time in clock ticks, minor page faults so far) of ``pid``; (0, 0) when unreadable."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            raw = fh.read().decode("ascii", "replace")
        fields = raw[raw.rfind(")") + 2 :].split()
        return int(fields[19]), int(fields[7])
    except (OSError, ValueError, IndexError):
        return 0, 0


def role(pid: int, ppid_role: str | None) -> str:
    """Classify a process by its title (``/proc/<pid>/cmdline``) and its parent's role."""
    try:
        title = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "gone"
    if "airflow scheduler" in title:
        return "scheduler"
    if "leoflow_agent serve" in title:
        return "zygote"
    if title.startswith("leoflow agent"):
        return "agent (supervisor)"
    if title.startswith("airflow worker"):
        return "local worker (supervisor)"
    if ppid_role in ("agent (supervisor)", "local worker (supervisor)"):
        return "task process"
    return f"other: {title[:40]}"


def main(argv: list[str] | None = None) -> int:
    """Run the probe; prints CPU seconds per role and per task. Returns 0."""
    parser = argparse.ArgumentParser(prog="python -m bench.probe", description=__doc__.split("\n\n")[0])
    parser.add_argument("--executor", choices=list(EXECUTORS), default="leoflow")
    parser.add_argument("--dag", choices=list(DAGS), default="bench_fanout")
    parser.add_argument("--parallelism", type=int, default=32)
    parser.add_argument("--interval", type=float, default=0.05, help="sampling interval, seconds")
    parser.add_argument("--keep", action="store_true", help="keep the work dir (logs)")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="leoflow-probe-", dir="/tmp"))
    work.chmod(0o755)
    pg = Postgres(work / "pg")
    try:
        pg.start()
        migrate_template(pg, "probe_template", work, print)
        pg.execute("CREATE DATABASE probe_run TEMPLATE probe_template")
        stack = AirflowStack(
            work / "stack", executor=EXECUTORS[args.executor], parallelism=args.parallelism,
            dags_folder=BENCH_DAGS, sql_alchemy_conn=pg.url_for("probe_run"),
            extra_env=dict(PINNED),
        )
        try:
            stack.start(wait_for_dags=[args.dag], timeout=240)
            stack.unpause(args.dag)
            time.sleep(3)
            sched = stack_roots()["scheduler"]
            seen: dict[tuple[int, int], tuple[str, float, int]] = {}
            roles: dict[int, str] = {}

            def sample() -> None:
                table = cpu.snapshot()
                for st in cpu.subtree(table, sched):
                    start, faults = _start_and_faults(st.pid)
                    key = (st.pid, start)
                    if st.pid not in roles or key not in seen:
                        roles[st.pid] = role(st.pid, roles.get(st.ppid))
                    seen[key] = (roles[st.pid], st.own, faults)

            sample()
            base = dict(seen)
            run_id = stack.trigger(args.dag)
            t0 = time.monotonic()
            while True:
                sample()
                if time.monotonic() - t0 > 1 and int((time.monotonic() - t0) / args.interval) % 20 == 0:
                    if stack.run(args.dag, run_id)["state"] in ("success", "failed"):
                        break
                time.sleep(args.interval)
            for _ in range(int(8 / args.interval)):  # supervisors linger after the run ends
                sample()
                time.sleep(args.interval)
        finally:
            stack.stop()
        per_role: dict[str, float] = defaultdict(float)
        faults_role: dict[str, int] = defaultdict(int)
        count: dict[str, int] = defaultdict(int)
        for key, (r, own, faults) in seen.items():
            per_role[r] += own - (base[key][1] if key in base else 0.0)
            faults_role[r] += faults - (base[key][2] if key in base else 0)
            if key not in base:
                count[r] += 1
        n = DAGS[args.dag]
        print(f"\n{args.executor} p={args.parallelism} {args.dag}: own CPU by role (lower bound), {n} tasks")
        for r, secs in sorted(per_role.items(), key=lambda kv: -kv[1]):
            print(
                f"  {r:28s} {secs:7.2f} s  {secs / n:6.3f} s/task  minor faults/task "
                f"{faults_role[r] // n:7d}  new processes: {count[r]}"
            )
    finally:
        pg.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
