"""The Lite zygote's allow-listed environment (DESIGN §3): no JWT secret, no DB URL, no other secret."""

from __future__ import annotations

import pytest

from leoflow_airflow.runtime.environment import agent_environment

SCHEDULER_ENV = {
    "PATH": "/usr/bin", "HOME": "/root", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "TZ": "UTC",
    "PYTHONPATH": "/repo", "VIRTUAL_ENV": "/venv", "AIRFLOW_HOME": "/af", "AIRFLOW_CONFIG": "/af/airflow.cfg",
    "AIRFLOW__CORE__DAGS_FOLDER": "/dags",
    "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": "http://127.0.0.1:8080/execution/",
    "AIRFLOW__LOGGING__BASE_LOG_FOLDER": "/af/logs",
    "AIRFLOW__WORKERS__MIN_HEARTBEAT_INTERVAL": "5",
    "AIRFLOW__LEOFLOW__RUNTIME": "lite",
    "AIRFLOW__SECRETS__BACKEND": "airflow.secrets.local_filesystem.LocalFilesystemBackend",
    # the tasks' own connections and variables reach them as under LocalExecutor (EnvironmentVariablesBackend)
    "AIRFLOW_CONN_MYDB": "postgresql://app:pw@apphost/appdb", "AIRFLOW_VAR_COLOUR": "blue",
}
SECRETS = {
    "AIRFLOW__API_AUTH__JWT_SECRET": "jwt-secret-value",
    "AIRFLOW__API_AUTH__JWT_PRIVATE_KEY_PATH": "/k.pem",
    "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": "postgresql://u:p@h/db",
    "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC": "postgresql+asyncpg://u:p@h/db",
    "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_CMD": "cat /conn",
    "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_SECRET": "conn",
    "AIRFLOW__CORE__SQL_ALCHEMY_CONN": "postgresql://legacy",          # deprecated location, still read
    "AIRFLOW__CORE__FERNET_KEY": "fernet",
    "AIRFLOW__CORE__FERNET_KEY_CMD": "cat /fernet",
    "AIRFLOW__CORE__INTERNAL_API_SECRET_KEY": "internal",
    "AIRFLOW__API__SECRET_KEY": "api-secret",
    "AIRFLOW__WEBSERVER__SECRET_KEY": "web-secret",
    "AIRFLOW__SECRETS__BACKEND_KWARGS": '{"token": "x"}',
    "AIRFLOW__SMTP__SMTP_PASSWORD": "smtp",
    "AIRFLOW__CELERY__BROKER_URL": "redis://:pw@h",
    "AIRFLOW__CELERY__RESULT_BACKEND": "db+postgresql://u:p@h",
    "AIRFLOW__KUBERNETES_EXECUTOR__CONFIG_FILE": "/kube",
    "AIRFLOW__CORE__SOMETHING_TOKEN": "t",
    "AIRFLOW__": "x", "AIRFLOW__CORE": "x",
    "AWS_SECRET_ACCESS_KEY": "aws", "PGPASSWORD": "pg",
    "LD_PRELOAD": "/evil.so", "PYTHONSTARTUP": "/evil.py",
}


def test_plain_and_safe_airflow_variables_pass():
    """What a task needs to behave as under LocalExecutor reaches the agent unchanged."""
    assert agent_environment({**SCHEDULER_ENV, **SECRETS}) == SCHEDULER_ENV


@pytest.mark.parametrize("name", sorted(SECRETS))
def test_secrets_never_pass(name):
    """No credential-bearing or unknown variable reaches the zygote."""
    assert name not in agent_environment({**SCHEDULER_ENV, name: SECRETS[name]})


def test_no_value_of_a_secret_survives_anywhere():
    """Not even under another name: no secret value appears among the values handed down."""
    values = set(agent_environment({**SCHEDULER_ENV, **SECRETS}).values())
    assert not values & set(SECRETS.values())


def test_passthrough_is_the_operators_explicit_choice():
    """Names listed in ``[leoflow] agent_env_passthrough`` pass, even a secret one; nothing else changes."""
    env = {**SCHEDULER_ENV, **SECRETS, "MY_TOOL_HOME": "/opt/tool"}
    out = agent_environment(env, ["MY_TOOL_HOME", "PGPASSWORD"])
    assert out["MY_TOOL_HOME"] == "/opt/tool" and out["PGPASSWORD"] == "pg"
    assert "AIRFLOW__API_AUTH__JWT_SECRET" not in out
    assert agent_environment(env, ["AIRFLOW__API_AUTH__JWT_SECRET"])["AIRFLOW__API_AUTH__JWT_SECRET"]


def test_secret_key_match_is_case_insensitive_and_the_input_is_not_modified():
    """A lower-case secret-looking key is still dropped; the caller's mapping is left as it was."""
    env = {"AIRFLOW__CORE__my_password": "x", "PATH": "/bin"}
    before = dict(env)
    assert agent_environment(env) == {"PATH": "/bin"}
    assert env == before
