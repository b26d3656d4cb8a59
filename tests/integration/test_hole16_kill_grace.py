"""Issue 8 hole 16, on a real Airflow: the agent-lost reaper's kill gives the task SIGTERM and its grace first,
so the operator's ``on_kill`` runs, as Airflow's own supervisor does; the task is still handled as an infra
loss (re-driven once on the infra budget, no user retry spent).

``leoflow_test_on_kill_lost`` (``tests/zygote_dags``): try 1 runs until killed; its ``on_kill`` writes a marker
and stops the work, so the task then fails (as a ``BashOperator`` whose ``on_kill`` ended its command would).
The agent (the Task SDK supervisor) is frozen with SIGSTOP, as a hung supervisor is: its heartbeat goes silent
while its task runs on. Past ``[leoflow] agent_lost_threshold`` the reaper kills it through the zygote: SIGTERM
and SIGCONT (the supervisor forwards SIGTERM to the task: ``on_kill``), SIGKILL after ``[core]
killed_task_cleanup_time`` (5 s here). The task's failure report, which the kill caused, is refused by the agent;
the attempt is re-driven as try 2 with ``max_tries`` raised by one, and try 2 succeeds.

The scheduler's metrics go to a StatsD listener of the test: the kill is counted as ``leoflow.reaper.agent-lost``
(issue 12's metrics acceptance: every reaper by name).

Before the fix every kill was SIGSTOP + SIGKILL of the subtree: ``on_kill`` never ran (no marker), an
external job the task had started would have run on beside the re-driven try.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from devtools import procs
from devtools.statsd import StatsdListener, airflow_env
from fault_helpers import FaultStack, catches_sigterm, pid_alive, wait_until
from leoflow_agent import proc

pytestmark = [pytest.mark.airflow, pytest.mark.timeout(600)]

ZYGOTE_DAGS = Path(__file__).resolve().parent.parent / "zygote_dags"
DAG, TASK = "leoflow_test_on_kill_lost", "stops"

EXTRA = {
    "AIRFLOW__LEOFLOW__AGENT_ENV_PASSTHROUGH": procs.MARKER_VAR,  # the stack's cleanup finds our agents
    "AIRFLOW__CORE__KILLED_TASK_CLEANUP_TIME": "5",
    # the recovery window stays valid: 5 + 5 + 5 < agent_lost_threshold 20 (+ the 5 s grace) < 90 - 2 x 5 - 10
    "AIRFLOW__LEOFLOW__AGENT_LOST_THRESHOLD": "20",
    "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "90",
    "AIRFLOW__CORE__TASK_SUCCESS_OVERTIME": "5",
    "AIRFLOW__WORKERS__SOCKET_CLEANUP_TIMEOUT": "5",
    "AIRFLOW__LEOFLOW__REAP_GRACE": "5",
}


class KillStack(FaultStack):
    """A :class:`FaultStack` on ``tests/zygote_dags``."""

    def __init__(self, home: Path, extra_env: dict[str, str]) -> None:
        super().__init__(home, extra_env={**EXTRA, **extra_env}, parallelism=2)
        self.dags_folder = ZYGOTE_DAGS.resolve()


def test_the_agent_lost_reaper_runs_on_kill_and_the_task_is_redriven_on_the_infra_budget(tmp_path_factory):
    """See the module docstring."""
    home = tmp_path_factory.mktemp("killgrace")
    marker = home / "on_kill.marker"
    with StatsdListener() as statsd, KillStack(home, airflow_env(statsd.port)) as stack:
        stack.up([DAG])
        run = stack.trigger(DAG, {"marker": str(marker)})

        def running_agent() -> int | None:
            """The agent's pid once it runs the task with both SIGTERM handlers in place: the supervisor's
            forwarder (agent) and the task runner's on_kill (its task process)."""
            rows = [a for a in stack.attempts(DAG, run, TASK) if a["state"] == "dispatched" and a["pid"]]
            if len(rows) != 1 or stack.ti_row(DAG, run, TASK).get("state") != "running":
                return None
            pid = rows[0]["pid"]
            if catches_sigterm(pid) and any(catches_sigterm(c) for c in proc.children(pid)):
                return pid
            return None

        agent = wait_until(running_agent, 240, "the task to run with its SIGTERM handlers")
        agent_ident = proc.identity(agent)
        (task,) = [proc.identity(c) for c in proc.children(agent) if catches_sigterm(c)]
        os.kill(agent, signal.SIGSTOP)  # a hung supervisor: no heartbeat, while its task runs on

        assert stack.wait_for_run(DAG, run, timeout=300) == "success"
        assert marker.exists() and marker.read_text() == "on_kill", "the kill never ran the task's on_kill"
        ti = stack.ti_row(DAG, run, TASK)
        assert (ti["try_number"], ti["max_tries"]) == (2, 2), ("one infra re-run, the user's retry unspent", ti)
        # the re-drive waited for proof of death: nothing of try 1 ran beside try 2
        assert not proc.is_alive(agent_ident) and not proc.is_alive(task)
        events = stack.log_events(DAG, run, TASK)
        assert events.count("leoflow agent-lost") == 1, events  # killed once, not once per sync()
        want = {"leoflow.reaper.agent-lost", "leoflow.recovery.infra_redrive"}
        assert want <= statsd.wait_names(want), sorted(statsd.names("airflow."))
        assert events.count("leoflow infra re-drive") == 1, events
        first, second = stack.attempts(DAG, run, TASK)
        assert (first["try_number"], first["resolution"]) == (1, "infra_redrive"), first
        assert second["try_number"] == 2, second  # its row closes once its agent exits, maybe after the run ends
        spent = stack.db("select spent from leoflow_infra_budget where run_id = ? and task_id = ?", run, TASK)
        assert spent == [(1,)], spent
        # the failure the kill caused was refused by the agent, and the task's log says so
        logs = [p.read_text(errors="replace") for p in (home / "logs").glob(f"dag_id={DAG}/**/attempt=1.log")]
        assert any("leoflow killed this attempt" in text for text in logs), logs
        assert not pid_alive(agent)
