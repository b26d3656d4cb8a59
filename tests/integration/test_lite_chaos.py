"""Issue 3 and issue 8 acceptance: the chaos loop, on a real Airflow with leoflow (Lite) and fault injection.

At least 100 runs of ``lf_chaos`` (``a >> b``, one retry each; ``tests/fault_dags/leoflow_chaos.py``),
triggered in waves. In every run the agent of one task (chosen by a seeded RNG; the seed is printed,
``LEOFLOW_CHAOS_SEED`` replays it) is killed at a random fault point. On top, each wave gets one
process-level fault (issue 8), each fault once per six waves, in a seeded order:

* ``none``: the agent kills alone (only here is each kill point's DESIGN §2 path reported: "as expected", or
  "other path" when a second fault met the attempt under load; a report, not an assertion);
* ``scheduler_sigkill``: SIGKILL the scheduler while the wave's TIs are being queued, start a new one;
* ``scheduler_sigstop``: SIGSTOP the scheduler past ``[scheduler] scheduler_health_check_threshold``
  (10 s here) while the wave runs;
* ``scheduler_sigterm``: SIGTERM the scheduler (Airflow's graceful ``end()``) while the wave's TIs are being
  queued, start a new one;
* ``api_sigstop``: SIGSTOP the api-server while a body runs and keep it stopped across that body's end (22 s
  at most: far below this stack's SQLite busy timeout, see ``API_BODY_WAIT``);
* ``fork_failure``: the zygote's forks fail with EAGAIN (a pids cgroup at its limit) while the wave is
  dispatched, then the limit is lifted.

Asserted over all runs: lost successes 0 (a body that completed always ends SUCCESS), double runs 0 (two
executions of a body never overlap, a completed body never runs again), user retries spent on infra faults 0
(``try_number - 1 == max_tries - retries``), every run succeeds, every attempt settles. A table (fault ×
runs × outcome) is printed before any assertion, so a failing run still shows it.
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections import Counter, defaultdict

import pytest

from devtools import sqlite_tuning
from devtools.stack import StackError
from fault_helpers import FaultStack, ForkLimit, chaos_table, executions, overlaps, wait_until, zygote_pid

pytestmark = [pytest.mark.airflow, pytest.mark.slow, pytest.mark.tables]

DAG = "lf_chaos"
KILL_POINTS = ("before_run", "after_run", "mid_task", "after_record", "after_patch")
PROCESS_FAULTS = ("none", "scheduler_sigkill", "scheduler_sigstop", "scheduler_sigterm", "api_sigstop",
                  "fork_failure")
RETRIES = 1
# fault point -> (try_number, max_tries, tries whose body started) of the faulted TI once its run succeeded
EXPECTED = {
    "before_run": (1, 1, [1]),      # re-dispatched as epoch 2 of the same try
    "after_run": (2, 2, [2]),       # no record, RUNNING: one infra re-run; try 1's body never started
    "mid_task": (2, 2, [1, 2]),     # no record, RUNNING: one infra re-run
    "after_record": (1, 1, [1]),    # the recorded success replayed
    "after_patch": (1, 1, [1]),     # Airflow had the report already
}
# issue 8 asks for at least 100 seeded runs, and every process fault gets one wave: six waves of 17
RUNS = int(os.environ.get("LEOFLOW_CHAOS_RUNS", "102"))
WAVE = 17
WAVE_BUDGET = 4 * 60.0  # seconds for one wave's runs to end, its process fault included (~1 min typical)
HEALTH_CHECK_THRESHOLD = 10.0
STALL = HEALTH_CHECK_THRESHOLD + 5  # the scheduler SIGSTOP
API_HOLD = 10.0  # seconds the api-server stays stopped after the body it caught ended
API_BODY_WAIT = 12.0  # at most this many seconds stopped before API_HOLD, waiting for the caught body's end
# The whole stop (API_BODY_WAIT + API_HOLD, 22 s) stays far below this stack's SQLite busy timeout (120 s,
# devtools/sqlite_tuning.OUTAGE_BUSY_TIMEOUT_SECONDS): an api-server SIGSTOPped inside a write transaction holds
# SQLite's one write lock, and past that timeout every other writer, Airflow's scheduler loop included, fails
# with "database is locked" and the scheduler exits (CI: a 70 s stop with the 30 s default; later a 22 s stop
# and the burst of requests queued behind it). That is the test's SQLite, not the outage under test: on
# PostgreSQL a stopped api-server holds only the rows it wrote.
FORK_WINDOW = 10.0  # seconds forks fail once the wave's first TI is queued

EXTRA = {
    "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_THRESHOLD": str(int(HEALTH_CHECK_THRESHOLD)),
    "AIRFLOW__SCHEDULER__ORPHANED_TASKS_CHECK_INTERVAL": "5",
    **sqlite_tuning.env(outage=True),
}


def _wave_faults(rng: random.Random, waves: int) -> list[str]:
    """One process fault per wave: every fault once per ``len(PROCESS_FAULTS)`` waves, shuffled.
    ``LEOFLOW_CHAOS_FAULTS`` (comma-separated names of ``PROCESS_FAULTS``) narrows the set, to replay one fault
    wave after wave; ``ValueError`` for an unknown name."""
    chosen = [f for f in os.environ.get("LEOFLOW_CHAOS_FAULTS", "").split(",") if f] or list(PROCESS_FAULTS)
    unknown = sorted(set(chosen) - set(PROCESS_FAULTS))
    if unknown:
        raise ValueError(f"LEOFLOW_CHAOS_FAULTS names unknown faults {unknown}; known: {PROCESS_FAULTS}")
    out: list[str] = []
    while len(out) < waves:
        block = list(chosen)
        rng.shuffle(block)
        out.extend(block)
    return out[:waves]


def _tis_in(stack: FaultStack, runs: list[str], states: tuple[str, ...]) -> int:
    """How many of ``runs``' TIs are in one of ``states``."""
    marks = ",".join("?" * len(runs))
    states_in = ",".join("?" * len(states))
    (n,), = stack.db(f"select count(*) from task_instance where dag_id = ? and run_id in ({marks}) "
                     f"and state in ({states_in})", DAG, *runs, *states)
    return n


def _running_body(stack: FaultStack, runs: dict[str, tuple[str, str]]) -> tuple[str, str] | None:
    """A ``(run_id, task)`` whose body started and has not ended, preferring a task without a planned kill.
    Reads each task's trace file once (this is polled fast)."""
    found = None
    for task in ("a", "b"):
        path = stack.traces_dir / f"{DAG}.{task}.body"
        lines = path.read_text().splitlines() if path.exists() else []
        open_bodies: dict[tuple[str, str], bool] = {}  # (run_id, pid) -> still running
        for line in lines:
            parts = line.split()
            if len(parts) >= 5 and parts[0] in runs and parts[2] in ("start", "end"):
                open_bodies[(parts[0], parts[4])] = parts[2] == "start"
        for (run_id, _), running in open_bodies.items():
            if running:
                if runs[run_id][0] != task:
                    return run_id, task
                found = found or (run_id, task)
    return found


def _stuck_report(stack: FaultStack, runs: list[str]) -> str:
    """What a wave's unfinished runs were waiting on, for the log of a failed run: their TI states, their
    ledger rows not closed, and the scheduler log's last lines."""
    marks = ",".join("?" * len(runs))
    tis = stack.db(f"select run_id, task_id, state, try_number from task_instance where dag_id = ? "
                   f"and run_id in ({marks}) order by run_id, task_id", DAG, *runs)
    rows = stack.db(f"select run_id, task_id, try_number, attempt_epoch, state from leoflow_attempt "
                    f"where dag_id = ? and state != 'closed' and run_id in ({marks})", DAG, *runs)
    log = stack.process_logs / "scheduler.log"
    tail = log.read_text(errors="replace").splitlines()[-60:] if log.exists() else []
    return "\n".join(["unfinished runs' TIs:", *map(str, tis), "their open ledger rows:", *map(str, rows),
                      "scheduler log tail:", *tail])


def _restart_scheduler(stack: FaultStack, sig: int) -> None:
    stack.kill_component("scheduler", sig, timeout=60)
    stack.start_component("scheduler")


def _inject(stack: FaultStack, fault: str, wave: dict[str, tuple[str, str]], fork: ForkLimit | None) -> str:
    """Apply one wave's process fault once its condition holds; returns a note for the log. The scheduler
    faults wait for a queued TI of the wave (the dispatch burst); ``fork_failure`` was armed before the
    wave was triggered and is lifted here."""
    runs = list(wave)

    def queued() -> bool:
        return _tis_in(stack, runs, ("queued",)) > 0

    if fault == "none":
        return ""
    if fault in ("scheduler_sigkill", "scheduler_sigterm"):
        wait_until(queued, 120, "a queued TI of the wave", poll=0.1)
        at_signal = _tis_in(stack, runs, ("queued",))
        _restart_scheduler(stack, signal.SIGKILL if fault == "scheduler_sigkill" else signal.SIGTERM)
        return f"{at_signal} TIs queued at the signal"
    if fault == "scheduler_sigstop":
        wait_until(lambda: _tis_in(stack, runs, ("queued", "running")) > 0, 120, "a queued or running TI",
                   poll=0.1)
        stack.stop_component("scheduler")
        try:
            time.sleep(STALL)  # the stall itself: the scenario's input
        finally:
            stack.continue_component("scheduler")
        return f"stopped {STALL:g}s"
    if fault == "api_sigstop":
        caught = wait_until(lambda: _running_body(stack, wave), 120, "a running body", poll=0.05)
        pgid = stack.pid_of("api-server")
        os.killpg(pgid, signal.SIGSTOP)
        t0 = time.monotonic()
        try:
            try:
                wait_until(lambda: executions(stack, DAG, caught[1], caught[0])[-1].ended, API_BODY_WAIT,
                           "the caught body to end", poll=0.1)
            except TimeoutError:
                pass  # its agent was killed (a planned fault): the outage still spans its end
            time.sleep(API_HOLD)  # the rest of the outage: the scenario's input
        finally:
            os.killpg(pgid, signal.SIGCONT)
        stack.wait_api()
        return f"api-server stopped {time.monotonic() - t0:.0f}s across {caught}"
    if fault == "fork_failure":
        assert fork is not None
        try:
            wait_until(queued, 120, "a queued TI of the wave", poll=0.1)
            time.sleep(FORK_WINDOW)  # the window in which forks fail: the scenario's input
        finally:
            fork.lift()
        return f"forks failed for {FORK_WINDOW:g}s"
    raise ValueError(f"unknown process fault {fault!r}")


def _arm_fork_failure(stack: FaultStack, fork: ForkLimit) -> None:
    pid = wait_until(lambda: zygote_pid(stack), 120, "the zygote")
    fork.add(pid)
    fork.block()


def _poll_runs(stack: FaultStack, pending: set[str], finals: dict[str, str], deadline: float) -> None:
    """Poll until every run in ``pending`` ended (moved to ``finals``) or ``deadline`` (``time.monotonic()``)
    passed; ``StackError`` at once when a stack process (the scheduler, say) exited on its own. The dag runs'
    states are read from the metadata DB (one query every 0.5 s; WAL: never blocked by a writer), not through
    the api-server the tasks depend on, which a wave may have stopped."""
    while pending and time.monotonic() < deadline:
        stack._check_alive()  # noqa: SLF001 - devtools is ours: a dead scheduler ends nothing
        marks = ",".join("?" * len(pending))
        for run_id, state in stack.db(f"select run_id, state from dag_run where dag_id=? and run_id in ({marks})",
                                      DAG, *sorted(pending)):
            if state in ("success", "failed"):
                finals[run_id] = state
                pending.discard(run_id)
        if pending:
            time.sleep(0.5)


@pytest.mark.timeout(30 * 60)  # 6 waves x WAVE_BUDGET at worst; about 8 minutes when nothing hangs
def test_chaos_loop(tmp_path_factory: pytest.TempPathFactory) -> None:
    """See the module docstring."""
    seed = int(os.environ.get("LEOFLOW_CHAOS_SEED", str(time.time_ns() % 2**32)))
    print(f"\nchaos seed: {seed} (LEOFLOW_CHAOS_SEED={seed} replays it), runs: {RUNS}")
    rng = random.Random(seed)
    waves = (RUNS + WAVE - 1) // WAVE
    wave_faults = _wave_faults(rng, waves)
    if "fork_failure" in wave_faults and not ForkLimit.available():
        pytest.skip("no writable pids cgroup v1 hierarchy at /sys/fs/cgroup/pids for the fork-failure fault")
    t0 = time.monotonic()
    home = tmp_path_factory.mktemp("chaos")
    fork: ForkLimit | None = None
    # the triggers go to an api-server of their own (``public_api_apart``), as a UI's would: on SQLite a trigger's
    # audit-row commit on the event loop of the api-server the tasks talk to deadlocks it for the busy timeout
    # (120 s here) against an Execution API transaction of the same process (devtools.stack.AirflowStack; CI: a
    # wave's 17 runs all unfinished after 240 s; here: the whole stack stalled 120 s at a wave's first /run calls)
    with FaultStack(home, parallelism=8, extra_env=EXTRA, public_api_apart=True) as stack:
        stack.up([DAG])
        plan: dict[str, tuple[str, str, str]] = {}  # run_id -> (task, kill point, process fault)
        finals: dict[str, str] = {}
        notes: list[str] = []
        crashed: list[str] = []  # a stack process died or a fault's condition never came: no more waves
        try:
            for index, fault in enumerate(wave_faults):
                if crashed:
                    break
                t_wave = time.monotonic()
                if fault == "fork_failure":
                    fork = ForkLimit(f"leoflow-chaos-{stack.stack_id[:12]}")
                    _arm_fork_failure(stack, fork)
                wave: dict[str, tuple[str, str]] = {}
                for _ in range(min(WAVE, RUNS - index * WAVE)):
                    task, point = rng.choice(("a", "b")), rng.choice(KILL_POINTS)
                    run_id = stack.trigger_with(DAG, {f"{task}/1/1": point}, prefix=f"c{len(plan):03d}")
                    plan[run_id] = (task, point, fault)
                    wave[run_id] = (task, point)
                pending = set(wave)
                try:
                    note = _inject(stack, fault, wave, fork)
                    _poll_runs(stack, pending, finals, t_wave + WAVE_BUDGET)
                except (StackError, TimeoutError) as exc:  # the table is still printed, then the test fails
                    crashed.append(f"wave {index + 1} ({fault}): {exc}")
                    note = "stopped: " + crashed[-1]
                notes.append(f"wave {index + 1} ({fault}{': ' + note if note else ''}): {len(wave)} runs, "
                             f"{len(pending)} unfinished, {time.monotonic() - t_wave:.0f}s "
                             f"(total {time.monotonic() - t0:.0f}s)")
                print(notes[-1])
                if pending:
                    print(_stuck_report(stack, sorted(pending)))
        finally:
            if fork is not None:
                fork.close()

        # every attempt settles: its ledger row is closed and nothing of it is left running
        unsettled: list[tuple] = []
        try:
            if not crashed:
                wait_until(lambda: not stack.db(f"select 1 from leoflow_attempt where dag_id = '{DAG}' "
                                                "and state != 'closed'"), 120, "every chaos attempt to be closed")
        except TimeoutError:
            unsettled = stack.db(f"select run_id, task_id, attempt_epoch, state from leoflow_attempt "
                                 f"where dag_id = '{DAG}' and state != 'closed'")
        problems, path_notes, by_point, by_fault = _judge(stack, plan, finals)
        columns = ["runs", "run success", "unfinished", "as expected", "other path", "infra re-runs",
                   "lost successes", "double runs", "user retries spent"]
        print(f"\nchaos: {len(plan)} runs, seed {seed}, {time.monotonic() - t0:.0f}s")
        print("\nagent kill points (waves without a process fault; 'as expected': its DESIGN §2 path)\n"
              + "\n".join(chaos_table(by_point, columns, list(KILL_POINTS), "fault point")))
        print("\nprocess faults (every run of its waves, agent kills included)\n"
              + "\n".join(chaos_table(by_fault, columns, list(PROCESS_FAULTS), "process fault")))
        if path_notes:
            print("\n" + "\n".join(path_notes))
        if unsettled:
            problems.append(f"attempts not settled: {unsettled}")
        problems = crashed + problems
        assert not crashed, "\n".join(problems)
        total = sum(by_fault.values(), Counter())
        assert total["lost successes"] == 0 and total["double runs"] == 0 and total["user retries spent"] == 0, \
            "\n".join(problems)
        assert all(finals.get(run_id) == "success" for run_id in plan), "\n".join(problems)
        assert not problems, "\n".join(problems)


def _judge(stack: FaultStack, plan: dict[str, tuple[str, str, str]], finals: dict[str, str],
           ) -> tuple[list[str], list[str], dict[str, Counter], dict[str, Counter]]:
    """Per finished run: lost successes, double runs, user retries spent (the problems: each fails the test),
    and (waves without a process fault) whether the faulted TI took its DESIGN §2 path (a note: under load an
    attempt can meet a second fault, e.g. a ``/run`` slow enough that epoch 1 is re-dispatched, and then takes
    another valid path); a run the stack left unfinished is counted as such and judged for overlapping bodies
    only. Returns the problems, the notes, and the counts by kill point and by process fault."""
    problems: list[str] = []
    notes: list[str] = []
    by_point: dict[str, Counter] = defaultdict(Counter)
    by_fault: dict[str, Counter] = defaultdict(Counter)
    for run_id, (faulted, point, fault) in plan.items():
        rows = [by_fault[fault]] + ([by_point[point]] if fault == "none" else [])

        def count(key: str, n: int, rows: list[Counter] = rows) -> None:
            for row in rows:
                row[key] += n

        count("runs", 1)
        count("run success", int(finals.get(run_id) == "success"))
        count("unfinished", int(run_id not in finals))
        for task in ("a", "b"):
            if run_id not in finals:  # the stack died under it: only a double run can be judged
                if overlaps(executions(stack, DAG, task, run_id)):
                    count("double runs", 1)
                    problems.append(f"double run: {run_id} {task} (unfinished; {fault})")
                continue
            ti = stack.ti_row(DAG, run_id, task)
            execs = executions(stack, DAG, task, run_id)
            tag = f"{run_id} {task} ({point if task == faulted else 'no kill'}; {fault})"
            ended = [e for e in execs if e.ended]
            if ended and ti.get("state") != "success":
                count("lost successes", 1)
                problems.append(f"lost success: {tag}: {ti}, {execs}")
            if overlaps(execs) or len(ended) > 1 or (ended and any(e.start > ended[0].last for e in execs)):
                count("double runs", 1)
                problems.append(f"double run: {tag}: {execs}")
            if ti and ti["try_number"] >= 1 and (ti["try_number"] - 1) != (ti["max_tries"] - RETRIES):
                count("user retries spent", 1)
                problems.append(f"user retry spent: {tag}: {ti}")
            count("infra re-runs", (ti.get("max_tries") or RETRIES) - RETRIES)
            if task != faulted:
                if fault == "none" and ti and (ti["try_number"], ti["max_tries"]) != (1, RETRIES):
                    notes.append(f"unfaulted task disturbed: {tag}: {ti}")
                continue
            for attempt in stack.attempts(DAG, run_id, task):
                count(f"ledger {attempt['resolution']}", 1)
            if fault != "none":
                continue
            got = (ti.get("try_number"), ti.get("max_tries"), [e.try_number for e in execs])
            if got == EXPECTED[point]:
                count("as expected", 1)
            else:  # a second fault met the attempt (a slow /run re-dispatched epoch 1, whose plan held the kill)
                count("other path", 1)
                notes.append(f"other path: {tag}: got {got}, expected {EXPECTED[point]}")
    return problems, notes, by_point, by_fault
