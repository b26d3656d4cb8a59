"""No credential is handed down through the environment or a command line (issue 2, acceptance 2), and
everything else a DAG relies on under LocalExecutor is (issue 8 hole 15).

A real Airflow (scheduler, dag-processor, api-server) runs LeoflowExecutor (Lite); the stack sets
``AIRFLOW__API_AUTH__JWT_SECRET`` and ``AIRFLOW__DATABASE__SQL_ALCHEMY_CONN`` in every Airflow process's
environment, plus the other forms of Airflow's own secrets (``_CMD``, ``_SECRET``, the fernet key, ``[api]
secret_key``), names denied by ``[leoflow] agent_env_deny`` and ordinary variables DAGs rely on (a proxy,
``JAVA_HOME``, a DAG's own setting, ``[secrets] backend_kwargs``). While ``leoflow_test_creds`` runs (a BashOperator dumping ``env``, a Python task dumping
``os.environ``), the test scans every process on the machine: no command line carries the JWT secret, a JWT
(``eyJ...``) or the workload token, and no process under the zygote has either credential in its
environment. Both tasks see every ordinary variable with its value and no denied one. Run as root: every ``/proc/<pid>/{cmdline,environ}`` is readable, nothing is skipped.
"""

from __future__ import annotations

import json
import os
import time

import pytest

from lite_procs import all_procs, descendants, lite_stack, scheduler, wait_for, zygote_file, zygotes

pytestmark = [pytest.mark.airflow, pytest.mark.timeout(300)]

DAG = "leoflow_test_creds"
TASK_SDK_DB_PLACEHOLDER = "airflow-db-not-allowed:///"

PASSED = {  # what DAGs under LocalExecutor rely on: each reaches the task with its value
    "HTTPS_PROXY": "http://proxy.invalid:3128",
    "JAVA_HOME": "/opt/leoflow-test-jdk",
    "MY_DAG_SETTING": "my-dag-setting-value",
    "AIRFLOW__SECRETS__BACKEND_KWARGS": '{"connections_prefix": "leoflow-test/connections"}',
}


def _denied(home) -> dict[str, str]:
    """Airflow's own secrets in their other forms (the stack sets the plain JWT secret and DB URL itself) and
    the ``agent_env_deny`` additions; none may reach a task. The plain variables win over the ``_CMD`` and
    ``_SECRET`` forms in Airflow's lookup, so these change nothing for the stack's own processes."""
    from cryptography.fernet import Fernet

    return {
        "AIRFLOW__CORE__FERNET_KEY": Fernet.generate_key().decode(),
        "AIRFLOW__API__SECRET_KEY": "leoflow-test-api-secret-key",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_CMD": f"echo sqlite:///{home}/airflow.db",
        "AIRFLOW__API_AUTH__JWT_SECRET_SECRET": "leoflow-test/jwt-secret-path",
        "MY_DENIED_VAR": "my-denied-value",
        "LEOFLOW_TEST_DENIED_PREFIX_A": "denied-by-prefix-value",
        "AIRFLOW__CELERY__RESULT_BACKEND_CMD": "echo leoflow-test-result-backend",
    }


DENY_OPTION = "MY_DENIED_VAR, LEOFLOW_TEST_DENIED_PREFIX_*, AIRFLOW__CELERY__RESULT_BACKEND"


def test_no_credential_reaches_zygote_tasks_or_any_command_line(tmp_path):
    """JWT secret and DB URL stay in the scheduler; no token is on any command line."""
    assert os.geteuid() == 0, "run as root so no process is unreadable"
    t0 = time.monotonic()
    denied = _denied(tmp_path / "home")
    extra = {**PASSED, **denied, "AIRFLOW__LEOFLOW__AGENT_ENV_DENY": DENY_OPTION}
    with lite_stack(tmp_path / "home", extra_env=extra) as stack:
        env = stack.env()
        jwt_secret = env["AIRFLOW__API_AUTH__JWT_SECRET"].encode()
        db_url = env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].encode()
        assert len(jwt_secret) >= 32 and db_url.startswith(b"sqlite:///")
        stack.migrate()
        stack.start(wait_for_dags=[DAG])

        # positive control: the scheduler really holds both credentials in its environment
        sched = scheduler(stack)
        sched_env = sched.environ.split(b"\0")
        assert b"AIRFLOW__API_AUTH__JWT_SECRET=" + jwt_secret in sched_env
        assert b"AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=" + db_url in sched_env

        zygote = wait_for(lambda: zygotes(stack), 60, "the zygote")
        assert len(zygote) == 1 and zygote[0].ppid == sched.pid
        zygote = zygote[0]
        with open(f"/proc/{zygote.pid}/environ", "rb") as fh:
            zygote_env = fh.read()
        assert jwt_secret not in zygote_env and db_url not in zygote_env
        zygote_vars = dict(kv.split(b"=", 1) for kv in zygote_env.split(b"\0") if b"=" in kv)
        assert b"AIRFLOW__API_AUTH__JWT_SECRET" not in zygote_vars
        assert b"AIRFLOW__DATABASE__SQL_ALCHEMY_CONN" not in zygote_vars
        for name, value in PASSED.items():
            assert zygote_vars.get(name.encode()) == value.encode(), name
        for name, value in denied.items():
            assert name.encode() not in zygote_vars and value.encode() not in zygote_env, name
        assert b"_AIRFLOW_PROCESS_CONTEXT" not in zygote_vars  # the scheduler's role, not the agents'

        stack.unpause(DAG)
        run_id = stack.trigger(DAG)
        # scan every process while the run is in flight, as often as we can
        tokens_seen_in_cmdline: list[tuple[int, bytes]] = []
        env_leaks: list[tuple[int, bytes, str]] = []
        task_procs_seen = 0
        scans = 0
        deadline = time.monotonic() + 150
        state = None
        while time.monotonic() < deadline:
            table = all_procs()
            scans += 1
            for p in table:
                if jwt_secret in p.cmdline or b"eyJ" in p.cmdline or db_url in p.cmdline:
                    tokens_seen_in_cmdline.append((p.pid, p.cmdline[:300]))
            under_zygote = descendants(zygote.pid, table)
            task_procs_seen = max(task_procs_seen, len(under_zygote))
            for p in under_zygote:
                for needle, what in ((jwt_secret, "jwt secret"), (db_url, "db url"), (b"eyJ", "a JWT")):
                    if needle in p.environ:
                        env_leaks.append((p.pid, p.cmdline[:200], what))
            if scans % 10 == 0:
                state = stack.run(DAG, run_id)["state"]
                if state in ("success", "failed"):
                    break
            time.sleep(0.05)
        assert state == "success", (state, stack.task_states(DAG, run_id))
        assert stack.task_states(DAG, run_id) == {"bash_env": "success", "python_env": "success"}
        # the scan saw the agents and their task processes (2 agents + 2 task children + bash + sleep)
        assert task_procs_seen >= 4, f"the scan never saw the attempts' processes ({task_procs_seen})"
        assert tokens_seen_in_cmdline == []
        assert env_leaks == []

        # what the tasks themselves saw
        bash_env = dict(
            line.split("=", 1) for line in (stack.traces_dir / "bash_env.txt").read_text().splitlines()
            if "=" in line and not line.startswith((" ", "\t"))
        )
        python_env = json.loads((stack.traces_dir / "python_env.json").read_text())
        for name, seen in (("bash", bash_env), ("python", python_env)):
            assert "AIRFLOW_HOME" in seen, f"{name} dump looks empty: {sorted(seen)[:20]}"
            assert "AIRFLOW__API_AUTH__JWT_SECRET" not in seen, name
            # the Task SDK itself plants a placeholder DB URL in the task child to block DB access
            for key in ("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "AIRFLOW__CORE__SQL_ALCHEMY_CONN"):
                assert seen.get(key, TASK_SDK_DB_PLACEHOLDER) == TASK_SDK_DB_PLACEHOLDER, (name, key)
            values = "\n".join(f"{k}={v}" for k, v in seen.items())
            assert jwt_secret.decode() not in values, name
            assert db_url.decode() not in values, name
            assert "eyJ" not in values, f"{name} task sees a JWT in its environment"
            for key, value in PASSED.items():
                assert seen.get(key) == value, (name, key, seen.get(key))
            for key, value in denied.items():
                assert key not in seen and value not in values, (name, key)
        # the workload token the agent used is a JWT minted at launch: it never appears in the zygote log
        # (the agent's stdout/stderr) either
        zlog = zygote_file(stack, "zygote.log").read_bytes()
        assert jwt_secret not in zlog and b"eyJ" not in zlog
    print(f"credentials test took {time.monotonic() - t0:.1f}s, {scans} scans")
