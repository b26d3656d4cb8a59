"""Issue 3 acceptance: the chaos loop, on a real Airflow with leoflow (Lite) and fault injection.

At least 50 runs of ``lf_chaos`` (``a >> b``, one retry each; ``tests/fault_dags/leoflow_chaos.py``), each with
the agent of one task (chosen by a seeded RNG; the seed is printed, ``LEOFLOW_CHAOS_SEED`` replays it) killed
at a random fault point, triggered in waves. Asserted over all runs: lost successes 0 (a body that completed
always ends SUCCESS, every run succeeds), double runs 0 (two executions of a body never overlap, a completed
body never runs again), user retries spent on infra faults 0 (``try_number - 1 == max_tries - retries``), and
each fault point took its DESIGN §2 path. A table (fault point × runs × outcome) is printed.
"""

from __future__ import annotations

import os
import random
import time
from collections import Counter, defaultdict

import pytest

from fault_helpers import FaultStack, executions, overlaps, wait_until

pytestmark = [pytest.mark.airflow, pytest.mark.slow]

KILL_POINTS = ("before_run", "after_run", "mid_task", "after_record", "after_patch")
RETRIES = 1
# fault point -> (try_number, max_tries, tries whose body started) of the faulted TI once its run succeeded
EXPECTED = {
    "before_run": (1, 1, [1]),      # re-dispatched as epoch 2 of the same try
    "after_run": (2, 2, [2]),       # no record, RUNNING: one infra re-run; try 1's body never started
    "mid_task": (2, 2, [1, 2]),     # no record, RUNNING: one infra re-run
    "after_record": (1, 1, [1]),    # the recorded success replayed
    "after_patch": (1, 1, [1]),     # Airflow had the report already
}
RUNS = int(os.environ.get("LEOFLOW_CHAOS_RUNS", "50"))
WAVE = 10
TOTAL_BUDGET = 11 * 60.0


def test_chaos_loop(tmp_path_factory: pytest.TempPathFactory) -> None:
    """See the module docstring."""
    seed = int(os.environ.get("LEOFLOW_CHAOS_SEED", str(time.time_ns() % 2**32)))
    print(f"\nchaos seed: {seed} (LEOFLOW_CHAOS_SEED={seed} replays it), runs: {RUNS}")
    rng = random.Random(seed)
    t0 = time.monotonic()
    with FaultStack(tmp_path_factory.mktemp("chaos"), parallelism=8) as stack:
        stack.up(["lf_chaos"])
        plan: dict[str, tuple[str, str]] = {}  # run_id -> (task, point)
        finals: dict[str, str] = {}
        for start in range(0, RUNS, WAVE):
            wave = {}
            for _ in range(min(WAVE, RUNS - start)):
                task, point = rng.choice(("a", "b")), rng.choice(KILL_POINTS)
                run_id = stack.trigger_with("lf_chaos", {f"{task}/1/1": point}, prefix=f"c{len(plan):03d}")
                plan[run_id] = (task, point)
                wave[run_id] = (task, point)
            left = TOTAL_BUDGET - (time.monotonic() - t0)
            assert left > 0, f"over the time budget after {len(plan) - len(wave)} runs"
            deadline = time.monotonic() + left
            pending = set(wave)
            while pending and time.monotonic() < deadline:
                for run_id in sorted(pending):
                    state = stack.run("lf_chaos", run_id)["state"]
                    if state in ("success", "failed"):
                        finals[run_id] = state
                        pending.discard(run_id)
                time.sleep(2)
            assert not pending, f"runs unfinished within the time budget: {[wave[r] for r in pending]}"
            print(f"wave {start // WAVE + 1}: {len(wave)} runs done at {time.monotonic() - t0:.0f}s")

        # every attempt settles: its ledger row is closed and nothing of it is left running
        try:
            wait_until(lambda: not stack.db("select 1 from leoflow_attempt where dag_id = 'lf_chaos' "
                                            "and state != 'closed'"), 120, "every chaos attempt to be closed")
        except TimeoutError:
            open_rows = stack.db("select run_id, task_id, attempt_epoch, state from leoflow_attempt "
                                 "where dag_id = 'lf_chaos' and state != 'closed'")
            pytest.fail(f"attempts not settled: {open_rows}")
        problems: list[str] = []
        rows: dict[str, Counter] = defaultdict(Counter)
        for run_id, (faulted, point) in plan.items():
            row = rows[point]
            row["runs"] += 1
            row["run success"] += finals[run_id] == "success"
            for task in ("a", "b"):
                ti = stack.ti_row("lf_chaos", run_id, task)
                execs = executions(stack, "lf_chaos", task, run_id)
                tag = f"{run_id} {task} ({point if task == faulted else 'no fault'})"
                ended = [e for e in execs if e.ended]
                if ended and ti.get("state") != "success":
                    row["lost successes"] += 1
                    problems.append(f"lost success: {tag}: {ti}, {execs}")
                if overlaps(execs) or len(ended) > 1 or (ended and any(e.start > ended[0].last for e in execs)):
                    row["double runs"] += 1
                    problems.append(f"double run: {tag}: {execs}")
                if ti and (ti["try_number"] - 1) != (ti["max_tries"] - RETRIES):
                    row["user retries spent"] += 1
                    problems.append(f"user retry spent: {tag}: {ti}")
                if task != faulted:
                    if ti and (ti["try_number"], ti["max_tries"]) != (1, RETRIES):
                        problems.append(f"unfaulted task disturbed: {tag}: {ti}")
                    continue
                want_try, want_max, want_bodies = EXPECTED[point]
                got = (ti.get("try_number"), ti.get("max_tries"), [e.try_number for e in execs])
                if got == (want_try, want_max, want_bodies):
                    row["as expected"] += 1
                else:
                    problems.append(f"unexpected path: {tag}: got {got}, expected {EXPECTED[point]}")
                row["infra re-runs"] += (ti.get("max_tries") or RETRIES) - RETRIES
                for attempt in stack.attempts("lf_chaos", run_id, task):
                    row[f"ledger {attempt['resolution']}"] += 1

        columns = ["runs", "run success", "as expected", "infra re-runs", "lost successes", "double runs",
                   "user retries spent"]
        ledger_cols = sorted({k for r in rows.values() for k in r if k.startswith("ledger ")})
        header = ["fault point", *columns, *ledger_cols]
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for point in KILL_POINTS:
            r = rows.get(point, Counter())
            lines.append("| " + " | ".join([point, *(str(r[c]) for c in columns + ledger_cols)]) + " |")
        total = sum(rows.values(), Counter())
        lines.append("| **all** | " + " | ".join(str(total[c]) for c in columns + ledger_cols) + " |")
        print(f"\nchaos: {len(plan)} runs, seed {seed}, {time.monotonic() - t0:.0f}s\n" + "\n".join(lines))
        assert total["lost successes"] == 0 and total["double runs"] == 0 and total["user retries spent"] == 0, \
            "\n".join(problems)
        assert all(state == "success" for state in finals.values()), "\n".join(problems)
        assert not problems, "\n".join(problems)
