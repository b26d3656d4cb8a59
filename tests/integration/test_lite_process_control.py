"""``end()``, ``revoke_task`` and ``terminate()`` on real attempts (issue 2, acceptance 3).

One real Airflow runs ``leoflow_test_sleepy`` under LeoflowExecutor (Lite): two BashOperators whose ``bash``
(in a session of its own) runs ``sleep 600``, a Python task sleeping 600 s and a short Python task that waits for the test's release file. Then:

1. the scheduler is stopped (SIGTERM, Airflow's graceful path calls ``executor.end()``): no zygote is left,
   every agent and its whole subtree carries on, and the short task, released only then, still finishes and
   reaches success;
2. a fresh ``LeoflowExecutor`` (in a driver process with the stack's configuration, as the scheduler that
   adopts them would be) revokes ``bash_forever``: its agent, task child, ``bash`` and ``sleep`` are all gone,
   the other attempts are untouched, and its ledger row is closed as revoked;
3. ``terminate()`` kills every remaining attempt's whole subtree: SIGTERM first, SIGKILL of what is left after
   ``[core] killed_task_cleanup_time`` (5 s here; the Python task ignores its SIGTERM), before it returns.

Processes are identified by pid + kernel start time throughout, so a recycled pid can never pass as alive.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from leoflow_agent import proc
from lite_procs import (
    Proc, agents, descendants, lite_stack, log_text, scheduler, stack_procs, wait_for, zygotes,
)

pytestmark = [pytest.mark.airflow, pytest.mark.timeout(300)]

DAG = "leoflow_test_sleepy"
FOREVER = ("bash_forever", "bash_forever_2", "python_forever")

DRIVER = textwrap.dedent("""
    import json, sys
    from sqlalchemy import select
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session
    from leoflow_airflow.executor import LeoflowExecutor

    action, dag_id, run_id, task_id = sys.argv[1:5]
    executor = LeoflowExecutor()
    if action == "revoke":
        with create_session() as session:
            ti = session.scalars(select(TaskInstance).where(
                TaskInstance.dag_id == dag_id, TaskInstance.run_id == run_id,
                TaskInstance.task_id == task_id)).one()
            executor.revoke_task(ti=ti)
            print(json.dumps({"ti_id": str(ti.id), "running": len(executor.running)}))
    elif action == "terminate":
        executor.terminate()
        print(json.dumps({}))
    else:
        from leoflow_airflow.ledger.store import LedgerStore
        from sqlalchemy import text
        ledger = LedgerStore.from_airflow()
        rows = [{"task_id": a.task_id, "state": str(a.state), "resolution": str(a.resolution),
                 "pid": a.pid} for a in ledger.open_attempts()]
        print(json.dumps(rows))
""")


def ident(p: Proc) -> proc.ProcessIdentity:
    """The pid + start-time identity of a process we saw alive."""
    found = proc.identity(p.pid)
    assert found is not None, f"pid {p.pid} vanished"
    return found


def attempt_tree(stack, task_id: str) -> tuple[Proc, list[Proc]]:
    """The agent of ``task_id`` and its live subtree."""
    mine = [a for a in agents(stack) if f".{task_id} ".encode() in a.cmdline]
    assert len(mine) == 1, [a.cmdline for a in agents(stack)]
    return mine[0], descendants(mine[0].pid)


def is_bash(p: Proc) -> bool:
    """argv[0] is bash (BashOperator runs it by its full path)."""
    return p.cmdline.split(b"\0")[0].rsplit(b"/", 1)[-1] == b"bash"


def bash_ready(stack, task_id: str) -> bool:
    """The attempt's ``bash`` runs in a session of its own with ``sleep 600`` under it."""
    try:
        agent, tree = attempt_tree(stack, task_id)
    except AssertionError:
        return False
    bash = [p for p in tree if is_bash(p) and b"sleep 600" in p.cmdline]
    sleeps = [p for p in tree if p.cmdline == b"sleep\x00600\x00"]
    return bool(bash and sleeps and bash[0].sid == bash[0].pid != agent.sid and sleeps[0].ppid == bash[0].pid)


def drive(stack, *args: str) -> object:
    """Run :data:`DRIVER` with the stack's configuration and return its JSON answer."""
    out = subprocess.run([sys.executable, "-c", DRIVER, *args], env=stack.env(), cwd=stack.home,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def alive(idents) -> list[proc.ProcessIdentity]:
    """The identities among ``idents`` that still name a live process."""
    return [i for i in idents if proc.is_alive(i)]


def test_end_leaves_agents_revoke_and_terminate_leave_nothing(tmp_path):
    """end(): no zygote, agents carry on and finish; revoke_task/terminate(): no process of the attempt left."""
    t0 = time.monotonic()
    with lite_stack(tmp_path / "home", parallelism=8,
                    extra_env={"AIRFLOW__CORE__KILLED_TASK_CLEANUP_TIME": "5"}) as stack:
        stack.migrate()
        stack.start(wait_for_dags=[DAG])
        stack.unpause(DAG)
        run_id = stack.trigger(DAG, conf={"short_seconds": 120})  # it runs until released below
        wait_for(lambda: all(bash_ready(stack, t) for t in ("bash_forever", "bash_forever_2")), 90,
                 "both bash attempts to run bash + sleep 600 in a session of their own")
        wait_for(lambda: len(agents(stack)) == 4, 30, "four agents")
        trees = {t: attempt_tree(stack, t) for t in (*FOREVER, "short")}
        idents = {t: [ident(agent), *[ident(p) for p in tree]] for t, (agent, tree) in trees.items()}
        for t in FOREVER:
            assert len(idents[t]) >= 2, (t, idents[t])  # agent + task child at least

        # 1. end(): SIGTERM the scheduler alone; Airflow's graceful exit calls executor.end()
        sched = scheduler(stack)
        zygote = zygotes(stack)
        assert len(zygote) == 1 and zygote[0].ppid == sched.pid
        zygote_ident = ident(zygote[0])
        os.kill(sched.pid, signal.SIGTERM)
        wait_for(lambda: proc.identity(sched.pid) is None, 60, "the scheduler to exit")
        assert not proc.is_alive(zygote_ident) and zygotes(stack) == []
        assert "leoflow zygote stopped; 4 agents left running" in log_text(stack, "scheduler")
        for t in (*FOREVER, "short"):
            assert alive(idents[t]) == idents[t], f"{t}: end() killed part of a running attempt"

        # ... and the agents carry on: the short task, released now, reports success with no scheduler running
        (stack.traces_dir / f"release.{run_id}").touch()
        wait_for(lambda: stack.task_states(DAG, run_id).get("short") == "success", 90,
                 "the short task to succeed after the scheduler ended")
        wait_for(lambda: not alive(idents["short"]), 30, "the short attempt's processes to exit")
        states = stack.task_states(DAG, run_id)
        assert all(states[t] == "running" for t in FOREVER), states

        # 2. revoke_task: exactly that attempt's whole subtree, bash in its own session included
        answer = drive(stack, "revoke", DAG, run_id, "bash_forever")
        assert answer["running"] == 0
        assert alive(idents["bash_forever"]) == [], "revoke_task left a process of the attempt"
        for t in ("bash_forever_2", "python_forever"):
            assert alive(idents[t]) == idents[t], f"revoke_task touched {t}"
        open_rows = {r["task_id"]: r for r in drive(stack, "ledger", DAG, run_id, "-")}
        assert "bash_forever" not in open_rows  # closed (as revoked)
        assert {"bash_forever_2", "python_forever"} <= set(open_rows)

        # 3. terminate(): every remaining attempt's whole subtree
        drive(stack, "terminate", DAG, run_id, "-")
        for t in FOREVER:
            assert alive(idents[t]) == [], f"terminate() left a process of {t}"
        leftovers = [p for p in stack_procs(stack) if b"sleep\x00600" in p.cmdline or is_bash(p)]
        assert leftovers == []
    print(f"process control took {time.monotonic() - t0:.1f}s")
