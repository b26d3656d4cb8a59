"""The zygote under faults, on a real Airflow (issue 8, holes 8, 13 and 16; DAGs in ``tests/zygote_dags``).

- hole 16: a kill through the zygote's ``kill`` op gives the task SIGTERM and its grace first, so the
  operator's ``on_kill`` runs, and SIGKILLs what is left after ``[core] killed_task_cleanup_time`` without
  blocking the zygote's loop;
- hole 13: after a scheduler restart, the proof of death of an agent that died finds and kills a
  ``BashOperator(env=...)``'s ``bash`` (a session of its own, no attempt marker in its environment) through the
  attempt's cgroup;
- hole 8: forks failing under a pids limit never spend a task's try: every task succeeds on its first try
  once the limit is lifted. **Passes only with Task A's executor side** (``launch_failed`` with
  ``retryable: true`` closes the epoch LAUNCH_FAILED and re-offers the workload instead of ``fail()``).

The three share one stack (module fixture ``stack``: a stack start-up at load costs 30-40 s plus its teardown),
run in file order: hole 8 (the first: it needs the stack's first zygote and leaves nothing running), hole 16
(leaves a scheduler that was stopped and whose zygote hung up; it ends its run and waits until no agent is
left), hole 13 (last: it SIGKILLs the scheduler and starts the next one with the settings it needs). Each
test uses its own DAG and run and waits for its runs' agents to be gone before the next one starts. Settings
as each test had with a stack of its own: ``[core] killed_task_cleanup_time`` 8 (hole 16's grace; holes 8 and
13 kill nothing through the zygote before the restart), and the restarted scheduler of hole 13 gets its
health-check threshold and orphan check interval and the default cleanup time.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path

import pytest

from devtools import procs
from devtools.stack import StackError
from fault_helpers import FaultStack, catches_sigterm, pid_alive, wait_until
from leoflow_agent import proc
from lite_procs import AGENT_TITLE, agents, all_procs, descendants, scheduler, zygotes
from zygote_client import ZygoteClient

pytestmark = [pytest.mark.airflow, pytest.mark.timeout(600)]

ZYGOTE_DAGS = Path(__file__).resolve().parent.parent / "zygote_dags"
PIDS_ROOT = "/sys/fs/cgroup/pids"


class ZygoteStack(FaultStack):
    """A :class:`FaultStack` on ``tests/zygote_dags`` whose zygote passes the stack marker on (so the stack's
    cleanup finds agents that outlive it)."""

    def __init__(self, home: Path, *, extra_env: dict[str, str] | None = None, parallelism: int = 4) -> None:
        env = {"AIRFLOW__LEOFLOW__AGENT_ENV_PASSTHROUGH": procs.MARKER_VAR, **(extra_env or {})}
        super().__init__(home, extra_env=env, parallelism=parallelism)
        self.dags_folder = ZYGOTE_DAGS.resolve()


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """One :class:`ZygoteStack` (parallelism 4, ``[core] killed_task_cleanup_time`` 8) with the three DAGs."""
    env = {"AIRFLOW__CORE__KILLED_TASK_CLEANUP_TIME": "8"}
    with ZygoteStack(tmp_path_factory.mktemp("zygote"), extra_env=env, parallelism=4) as shared:
        shared.up(["leoflow_test_many", "leoflow_test_on_kill", "leoflow_test_bash_env"])
        yield shared


def no_agent_left(stack: FaultStack, timeout: float = 180.0) -> None:
    """Wait until no agent runs under the stack's zygote (a test's runs are over before the next test)."""
    wait_until(lambda: not agents(stack), timeout, "every agent of the test to exit")


def end_run(stack: FaultStack, dag_id: str, run_id: str, attempts: int = 4) -> None:
    """Mark ``run_id`` failed through the public API (a TI the scheduler may re-drive after the test's fault
    is then not run again), then wait until no agent is left. The PATCH is idempotent: a 5xx (a busy SQLite)
    is retried, up to ``attempts`` calls; ``StackError`` when every call failed or one answered 4xx."""
    for attempt in range(1, attempts + 1):
        try:
            stack._call("PATCH", f"/dags/{dag_id}/dagRuns/{run_id}", json={"state": "failed"})
            break
        except StackError as exc:
            if attempt == attempts or " answered 4" in str(exc):
                raise
        time.sleep(2 * attempt)
    no_agent_left(stack)


def zygote_socket(stack: FaultStack) -> str:
    (zygote,) = zygotes(stack)
    argv = zygote.cmdline.split(b"\0")
    return argv[argv.index(b"--socket") + 1].decode()


def test_forks_failing_under_a_pids_limit_spend_no_try(stack):
    """Hole 8 (needs Task A's executor side: run after merging). The zygote is moved into a v1 pids cgroup
    whose limit is its own process count, so every fork fails with EAGAIN; twenty tasks with no retries
    are triggered with parallelism 4. Once forks have failed, the limit is lifted: all twenty succeed on
    their first try (none went through Airflow's killed-externally path to failed or up_for_retry)."""
    if not os.access(PIDS_ROOT, os.W_OK):
        pytest.skip("no writable cgroup v1 pids hierarchy")
    cgroup = os.path.join(PIDS_ROOT, f"leoflow-test-{uuid.uuid4().hex[:12]}")
    os.mkdir(cgroup)
    try:
        (zygote,) = wait_until(lambda: zygotes(stack), 120, "the zygote")
        with open(os.path.join(cgroup, "cgroup.procs"), "w") as fh:
            fh.write(str(zygote.pid))
        with open(os.path.join(cgroup, "pids.current")) as fh:
            current = fh.read().strip()
        with open(os.path.join(cgroup, "pids.max"), "w") as fh:
            fh.write(current)
        run = stack.trigger("leoflow_test_many", {})

        def forks_failed() -> bool:
            with open(os.path.join(cgroup, "pids.events")) as fh:
                return int(fh.read().split()[-1]) >= 3  # "max <n>": forks refused by the limit
        wait_until(forks_failed, 240, "forks to fail under the pids limit")
        with open(os.path.join(cgroup, "pids.max"), "w") as fh:
            fh.write("max")
        stack.wait_for_run("leoflow_test_many", run, timeout=400)
        rows = stack.db("select task_id, state, try_number from task_instance where dag_id = ? and run_id = ?",
                        "leoflow_test_many", run)
        assert len(rows) == 20 and all(state == "success" and tries == 1 for _, state, tries in rows), rows
        no_agent_left(stack)
    finally:
        with open(os.path.join(cgroup, "pids.max"), "w") as fh:
            fh.write("max")
        for pid in open(os.path.join(cgroup, "cgroup.procs")).read().split():
            try:  # back to the root: rmdir needs the cgroup empty
                with open(os.path.join(PIDS_ROOT, "cgroup.procs"), "w") as fh:
                    fh.write(pid)
            except ProcessLookupError:
                pass  # exited since the listing (CI: an agent ending): nothing left to move
        os.rmdir(cgroup)


def test_the_zygote_kill_op_runs_on_kill_then_kills_the_subtree_after_the_grace(stack):
    """Hole 16. The task's ``on_kill`` writes a marker; the kill reaches it as Airflow's supervisor would
    deliver it (SIGTERM forwarded by the Task SDK supervisor, ``ActivitySubprocess.wait``). The task ignores
    it and sleeps on, so the zygote SIGKILLs agent and task once ``[core] killed_task_cleanup_time`` (8 s
    here) is over; meanwhile the zygote keeps answering (a malformed launch is refused before ``exited``)."""
    marker = stack.home / "on_kill.marker"
    run = stack.trigger("leoflow_test_on_kill", {"marker": str(marker)})
    try:
        # the agent is the zygote's child (its task process, forked after the title was set, carries it too)
        (agent,) = wait_until(lambda: [a for a in agents(stack) if a.ppid == zygotes(stack)[0].pid], 240,
                              "the agent")
        launch_id = agent.cmdline.split(b"\0")[0][len(AGENT_TITLE):].split(b" ")[0].decode()
        # both handlers in place: the supervisor's forwarder (agent) and the task runner's on_kill (task)
        task = wait_until(lambda: [c for c in proc.children(agent.pid) if catches_sigterm(c)]
                          if catches_sigterm(agent.pid) else None, 240, "the task process's SIGTERM handler")[0]
        agent_ident, task_ident = proc.identity(agent.pid), proc.identity(task)
        sched = scheduler(stack)
        os.kill(sched.pid, signal.SIGSTOP)  # it must not notice that we took over its zygote connection
        try:
            client = ZygoteClient(zygote_socket(stack))
            assert client.next()["ev"] == "hello"
            client.send({"op": "kill", "launch_id": launch_id})
            client.send({"op": "launch", "launch_id": "probe"})  # malformed: answered at once
            events = [client.next()]
            while events[-1].get("ev") != "exited":
                events.append(client.next())
            kinds = [(e["ev"], e.get("launch_id")) for e in events]
            assert kinds.index(("launch_failed", "probe")) < kinds.index(("exited", launch_id)), kinds
            assert marker.read_text() == "on_kill"
            assert not proc.is_alive(agent_ident) and not proc.is_alive(task_ident)
            client.close()
        finally:
            os.kill(sched.pid, signal.SIGCONT)
    finally:
        end_run(stack, "leoflow_test_on_kill", run)


def test_a_restarted_scheduler_kills_a_bash_with_its_own_env_left_by_a_dead_agent(stack):
    """Hole 13. ``BashOperator(env=...)`` runs ``bash`` in a session of its own with a replaced environment.
    The scheduler is SIGKILLed (its zygote goes with it, the agent does not), then the agent and its task
    process are SIGKILLed too (an OOM kill). The next scheduler's proof of death must find and kill that
    orphaned ``bash`` and its ``sleep`` (before the fix the ``/proc`` scan found nothing of the attempt, and
    the old ``bash`` ran on beside the re-driven try). The restarted scheduler runs with the health-check
    threshold and orphan check interval below (it takes the killed one for dead after 10 s) and the default
    ``killed_task_cleanup_time``; the killed one ran with the module stack's settings."""
    restart_env = {
        "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_THRESHOLD": "10",
        "AIRFLOW__SCHEDULER__ORPHANED_TASKS_CHECK_INTERVAL": "15",
    }
    run = stack.trigger("leoflow_test_bash_env", {})

    def bash_tree():
        """This stack's task ``bash`` (below its zygote, with the DAG's env) and its ``sleep``."""
        table = all_procs()
        ours = [p for z in zygotes(stack) for p in descendants(z.pid, table)]
        bashes = [p for p in ours if b"LEOFLOW_TEST_ONLY=this" in p.environ.split(b"\0")
                  and os.path.basename(p.cmdline.split(b"\0")[0]) == b"bash"]
        sleeps = [p for p in ours if bashes and p.ppid == bashes[0].pid]
        return (bashes[0], sleeps[0]) if bashes and sleeps else None

    bash, sleep = wait_until(bash_tree, 240, "the task's bash and sleep")
    assert os.getsid(bash.pid) == bash.pid  # a session of its own
    bash_ident, sleep_ident = proc.identity(bash.pid), proc.identity(sleep.pid)
    # the bash can be up before the scheduler has read the zygote's spawn event and recorded the agent's pid
    rows = wait_until(lambda: (found := stack.attempts("leoflow_test_bash_env", run, "bash_env"))
                      and all(a["pid"] for a in found) and found, 60, "the agent's pid in the ledger")
    (attempt,) = rows
    task_pid = bash.ppid  # the Task SDK's task process: bash's parent
    stack.kill_component("scheduler", signal.SIGKILL)
    # the OOM killer takes the agent and its task process (the two big Python processes); bash, in a
    # session of its own, is orphaned: no parent link, no session, no marker leads back to the attempt
    for pid in (attempt["pid"], task_pid):
        os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not pid_alive(attempt["pid"]) and not pid_alive(task_pid), 30, "agent and task to die")
    assert proc.is_alive(bash_ident) and proc.is_alive(sleep_ident)
    stack.extra_env.pop("AIRFLOW__CORE__KILLED_TASK_CLEANUP_TIME", None)
    stack.extra_env.update(restart_env)
    stack.start_component("scheduler")
    wait_until(lambda: not proc.is_alive(bash_ident) and not proc.is_alive(sleep_ident), 300,
               "the new scheduler to kill the dead attempt's bash and sleep")
