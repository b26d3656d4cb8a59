"""Issue 8, hole 14: more than one scheduler shares one ledger.

Two ``airflow scheduler`` processes (Airflow's HA set-up) run against one PostgreSQL database, on one host and
one ``AIRFLOW_HOME`` (so one ``[leoflow] runtime_dir``), each with ``[core] parallelism`` 3, so the eight 15 s
tasks of ``lf_h14`` are queued by both. Before the fix both zygotes shared one pidfile: each scheduler's
``start()`` SIGTERMed the other's zygote as "stale", which the other restarted, killing the first's again.

``two-hosts`` simulates a second host on this machine: the second scheduler stamps its attempts with another
host string (``[leoflow] test_host``, honoured only with ``test_fault_injection``), so each sees the other's
attempts as another host's (UNKNOWN; never judged by local pids, killed, settled or re-driven while the owner
heartbeats).

Asserted: both zygotes the schedulers started are alive at the end (never killed or restarted; neither log
says it removed a "stale" zygote or restarted its own), the run
succeeds, every task's body started once, ended, on try 1, the attempts were claimed by both scheduler jobs
with the expected host stamps, none was closed as an infra loss, re-dispatch, launch failure or abandonment,
and no "leoflow infra re-drive" Log row exists.
"""

from __future__ import annotations

import os
import sys

import pytest
import sqlalchemy as sa

from devtools import procs
from devtools.stack import AirflowStack
from fault_helpers import EXECUTOR, FAULT_DAGS, executions, pg_database
from leoflow_airflow.hosts import this_host
from lite_procs import log_text, spawn_in_stack, wait_for, zygotes

PG_URL = os.environ.get("LEOFLOW_TEST_PG_URL")

pytestmark = [
    pytest.mark.airflow,
    pytest.mark.postgres,
    pytest.mark.tables,
    pytest.mark.skipif(not PG_URL, reason="LEOFLOW_TEST_PG_URL is unset: run `scripts/pg start --dir DIR` and "
                       "export LEOFLOW_TEST_PG_URL=$(cat DIR/url)"),
]

DAG = "lf_h14"
TASKS = [f"t{i}" for i in range(8)]
SECOND_HOST = "simulated-host-b/00000000-0000-0000-0000-000000000002"
BAD_ENDINGS = {"infra_redrive", "redispatched", "executor_failed", "launch_failed", "abandoned"}


def stack_env() -> dict[str, str]:
    """The stacks' ``extra_env`` (the same for the template's migrate and every test's stack)."""
    return {
        "AIRFLOW__LEOFLOW__AGENT_ENV_PASSTHROUGH": procs.MARKER_VAR,  # the stack's clean-up finds agents
        "AIRFLOW__LEOFLOW__TEST_FAULT_INJECTION": "True",
        # two schedulers and their zygotes start at once on a shared 2-core machine: a zygote slow to import
        # the Task SDK must not be restarted (this test asserts each zygote lives through the run)
        "AIRFLOW__LEOFLOW__ZYGOTE_START_TIMEOUT": "600",
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
    }


@pytest.fixture(scope="module")
def template_db(tmp_path_factory) -> str:
    """A database migrated once by ``airflow db migrate`` (a stack configured as the tests' stacks are), the
    template each test's database is copied from (``CREATE DATABASE ... TEMPLATE``, as ``bench/compare.py``
    does): one migrate per module instead of one per test. Dropped afterwards. Returns its name."""
    with pg_database(PG_URL, "leoflow_h14_tmpl") as url:
        migrator = AirflowStack(tmp_path_factory.mktemp("hole14-template"), executor=EXECUTOR, parallelism=3,
                                dags_folder=FAULT_DAGS, sql_alchemy_conn=url, extra_env=stack_env())
        with migrator:
            migrator.migrate()  # the command has exited: no session is left on the template
        yield sa.make_url(url).database


@pytest.fixture
def pg_url(template_db: str) -> str:
    """A fresh database on the test PostgreSQL server, a copy of the migrated ``template_db`` (dropped
    afterwards), as a URL with its password."""
    with pg_database(PG_URL, "leoflow_h14", template=template_db) as url:
        yield url


@pytest.mark.parametrize("second_host", [None, SECOND_HOST], ids=["one-host", "two-hosts"])
def test_two_schedulers_share_one_ledger_without_killing_or_redriving_each_others_work(tmp_path_factory, pg_url,
                                                                                       second_host):
    """See the module docstring."""
    home = tmp_path_factory.mktemp("hole14")
    with AirflowStack(home, executor=EXECUTOR, parallelism=3, dags_folder=FAULT_DAGS, sql_alchemy_conn=pg_url,
                      extra_env=stack_env()) as stack:
        # pg_url is a copy of the migrated template: no migrate of its own
        stack.start(wait_for_dags=[DAG])
        second_env = stack.env()
        if second_host is not None:
            second_env["AIRFLOW__LEOFLOW__TEST_HOST"] = second_host
        spawn_in_stack(stack, "scheduler-2", [sys.executable, "-m", "airflow", "scheduler"], second_env)
        engine = sa.create_engine(pg_url, poolclass=sa.NullPool)
        try:
            def running_jobs() -> list[int]:
                with engine.connect() as conn:
                    return [r[0] for r in conn.execute(sa.text(
                        "select id from job where job_type = 'SchedulerJob' and state = 'running'"))]

            wait_for(lambda: len(running_jobs()) == 2, 180, "two running scheduler jobs")
            started = wait_for(lambda: sorted(z.pid for z in zygotes(stack)) if len(zygotes(stack)) == 2 else None,
                               180, "a zygote for each scheduler")

            run = stack.trigger(DAG)
            final = stack.wait_for_run(DAG, run, timeout=420)

            assert sorted(z.pid for z in zygotes(stack)) == started, "a scheduler's zygote was killed or restarted"
            for name in ("scheduler", "scheduler-2"):
                text = log_text(stack, name)
                assert "removing a stale leoflow zygote" not in text and "zygote was restarted" not in text, name
            assert final == "success", stack.task_states(DAG, run)
            for task in TASKS:
                execs = executions(stack, DAG, task, run)
                assert len(execs) == 1 and execs[0].ended and execs[0].try_number == 1, (task, execs)

            def attempts() -> list:
                with engine.connect() as conn:
                    return conn.execute(sa.text(
                        "select task_id, attempt_epoch, scheduler_job_id, host, state, resolution from leoflow_attempt "
                        "where dag_id = :d and run_id = :r order by task_id, attempt_epoch"), {"d": DAG, "r": run}).all()

            # a run succeeds at the last terminal report; each attempt closes once its agent has exited
            rows = wait_for(lambda: (found := attempts()) and all(r.state == "closed" for r in found) and found, 120,
                            "every attempt closed")
            with engine.connect() as conn:
                redrives = conn.execute(sa.text(
                    "select count(*) from log where dag_id = :d and run_id = :r and event = 'leoflow infra re-drive'"),
                    {"d": DAG, "r": run}).scalar_one()
            by_task: dict[str, list] = {}
            for r in rows:
                by_task.setdefault(r.task_id, []).append(r)
            assert sorted(by_task) == TASKS, rows
            for task, chain in by_task.items():
                # the last epoch of each task ended well; an earlier one may only be the owner's own re-dispatch
                # of an agent that died before /run (an api-server too slow to answer /run on a loaded machine
                # is infra, and the body still ran once, asserted above): never the peer's, never a re-drive
                *earlier, last = chain
                assert last.resolution not in BAD_ENDINGS, (task, chain)
                assert all(r.resolution == "redispatched" for r in earlier), (task, chain)
                assert len({(r.scheduler_job_id, r.host) for r in chain}) == 1, (task, chain)
            assert len({r.scheduler_job_id for r in rows}) == 2, f"one scheduler ran every attempt: {rows}"
            expected_hosts = {this_host()} if second_host is None else {this_host(), second_host}
            assert {r.host for r in rows} == expected_hosts, rows
            assert redrives == 0
        finally:
            engine.dispose()
