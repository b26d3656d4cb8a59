"""The Lite zygote's environment (DESIGN §3; issue 8 hole 15): the scheduler's environment minus Airflow's own
secrets, so a DAG sees what it sees under LocalExecutor and never the JWT secret, the DB URL or the fernet key."""

from __future__ import annotations

import pytest

from leoflow_airflow.runtime.environment import AIRFLOW_OWN_SECRETS, agent_environment, deny_entry_problem

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
    # what DAGs under LocalExecutor rely on: proxies, cloud SDKs, JVMs, secrets-backend settings, their own
    "HTTPS_PROXY": "http://proxy:3128", "https_proxy": "http://proxy:3128", "NO_PROXY": "localhost",
    "JAVA_HOME": "/usr/lib/jvm/java-17", "MY_DAG_SETTING": "42", "AWS_SECRET_ACCESS_KEY": "aws",
    "AWS_PROFILE": "etl", "GOOGLE_APPLICATION_CREDENTIALS": "/gcp.json", "PGPASSWORD": "pg",
    "AIRFLOW__SECRETS__BACKEND_KWARGS": '{"connections_prefix": "airflow/c", "token": "vault-token"}',
    "AIRFLOW__WORKERS__SECRETS_BACKEND_KWARGS": '{"region_name": "eu-west-1"}',
    "AIRFLOW__LOGGING__REMOTE_TASK_HANDLER_KWARGS": '{"delete_local_copy": true}',
    "AIRFLOW__SENTRY__SENTRY_DSN": "https://key@sentry.example/1",
    "AIRFLOW__SMTP__SMTP_HOST": "mail", "AIRFLOW__API_AUTH__JWT_AUDIENCE": "urn:airflow.apache.org:task",
    "AIRFLOW__API__SSL_CERT": "/af/cert.pem", "AIRFLOW__DATABASE__MAX_DB_RETRIES": "3",
}
SECRETS = {
    "AIRFLOW__API_AUTH__JWT_SECRET": "jwt-secret-value",
    "AIRFLOW__API_AUTH__JWT_SECRET_CMD": "cat /jwt",
    "AIRFLOW__API_AUTH__JWT_SECRET_SECRET": "airflow/jwt",
    "AIRFLOW__API_AUTH__JWT_PRIVATE_KEY_PATH": "/k.pem",
    "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": "postgresql://u:p@h/db",
    "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC": "postgresql+asyncpg://u:p@h/db",
    "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_CMD": "cat /conn",
    "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_SECRET": "conn",
    "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC_CMD": "cat /conn-async",
    "AIRFLOW__DATABASE__SQL_ALCHEMY_ENGINE_ARGS": '{"connect_args": {"password": "p"}}',
    "AIRFLOW__CORE__SQL_ALCHEMY_CONN": "postgresql://legacy",          # deprecated location, still read
    "AIRFLOW__CORE__SQL_ALCHEMY_CONN_SECRET": "legacy-conn",
    "AIRFLOW__CORE__FERNET_KEY": "fernet",
    "AIRFLOW__CORE__FERNET_KEY_CMD": "cat /fernet",
    "AIRFLOW__API__SECRET_KEY": "api-secret",
    "AIRFLOW__API__SECRET_KEY_SECRET": "airflow/api-secret",
    "AIRFLOW__WEBSERVER__SECRET_KEY": "web-secret",                     # deprecated location of [api] secret_key
    "AIRFLOW__TEAM_A___DATABASE__SQL_ALCHEMY_CONN": "postgresql://team",  # a team-scoped override (3.3)
    "AIRFLOW__TEAM_A___API_AUTH__JWT_SECRET_CMD": "cat /team-jwt",
    "airflow__database__sql_alchemy_conn": "postgresql://lower",         # read by conf.as_dict(include_env)
    "_AIRFLOW_PROCESS_CONTEXT": "server",   # the scheduler's role marker: an agent would look for a metastore
    "LEOFLOW_ATTEMPT": "someone-else",      # leoflow's own per-attempt marker: set per agent, never inherited
}


def test_everything_but_airflows_own_secrets_passes():
    """What a task sees under LocalExecutor reaches it unchanged, Airflow's own secrets excepted."""
    assert agent_environment({**SCHEDULER_ENV, **SECRETS}) == SCHEDULER_ENV


@pytest.mark.parametrize("name", sorted(SECRETS))
def test_airflows_own_secrets_never_pass(name):
    """Every form of an Airflow secret (plain, ``_CMD``, ``_SECRET``, team-scoped, lower case) is dropped."""
    assert name not in agent_environment({**SCHEDULER_ENV, name: SECRETS[name]})


def test_no_value_of_a_secret_survives_anywhere():
    """Not even under another name: no secret value appears among the values handed down."""
    values = set(agent_environment({**SCHEDULER_ENV, **SECRETS}).values())
    assert not values & set(SECRETS.values())


def test_every_listed_option_is_an_airflow_3_3_option():
    """The built-in list names real options of Airflow 3.3.2's config (or their documented deprecated names)."""
    from airflow.configuration import conf

    described = conf.configuration_description
    for section, key in AIRFLOW_OWN_SECRETS:
        known = key in described.get(section, {}).get("options", {}) or (section, key) in conf.inversed_deprecated_options
        assert known, (section, key)


def test_agent_env_deny_adds_names_prefixes_and_their_config_forms():
    """``[leoflow] agent_env_deny``: exact names, ``PREFIX*``, and for ``AIRFLOW__S__K`` its _CMD/_SECRET/team
    forms too; case-insensitive, like the built-in list."""
    env = {**SCHEDULER_ENV, "AIRFLOW__CELERY__RESULT_BACKEND": "db+postgresql://u:p@h",
           "AIRFLOW__CELERY__RESULT_BACKEND_CMD": "cat /rb", "AIRFLOW__T1___CELERY__RESULT_BACKEND": "x",
           "VAULT_TOKEN": "v", "AWS_SESSION_TOKEN": "s"}
    out = agent_environment(env, deny=["AIRFLOW__CELERY__RESULT_BACKEND", "aws_*", "VAULT_TOKEN", "MY_DAG_SETTING"])
    dropped = set(env) - set(out)
    assert dropped == {"AIRFLOW__CELERY__RESULT_BACKEND", "AIRFLOW__CELERY__RESULT_BACKEND_CMD",
                       "AIRFLOW__T1___CELERY__RESULT_BACKEND", "VAULT_TOKEN", "AWS_SECRET_ACCESS_KEY",
                       "AWS_PROFILE", "AWS_SESSION_TOKEN", "MY_DAG_SETTING"}


def test_passthrough_is_the_operators_explicit_exception():
    """Names listed in ``[leoflow] agent_env_passthrough`` pass even when denied; nothing else changes."""
    env = {**SCHEDULER_ENV, **SECRETS}
    out = agent_environment(env, ["AIRFLOW__CORE__FERNET_KEY", "VAULT_TOKEN"], deny=["JAVA_HOME"])
    assert out["AIRFLOW__CORE__FERNET_KEY"] == "fernet"
    assert "AIRFLOW__API_AUTH__JWT_SECRET" not in out and "JAVA_HOME" not in out


def test_the_input_is_not_modified():
    env = {**SCHEDULER_ENV, **SECRETS}
    before = dict(env)
    agent_environment(env, deny=["PATH"])
    assert env == before


@pytest.mark.parametrize("entry, problem", [
    ("", "empty"), ("*", "every variable"), ("A B", "not an environment variable name"),
    ("1ABC", "not an environment variable name"), ("AWS_*_KEY", "not an environment variable name"),
    ("FOO=bar", "not an environment variable name"),
])
def test_malformed_deny_entries_are_named(entry, problem):
    assert problem in deny_entry_problem(entry)


@pytest.mark.parametrize("entry", ["VAULT_TOKEN", "aws_*", "AIRFLOW__CELERY__BROKER_URL", "_X", "A1*"])
def test_wellformed_deny_entries(entry):
    assert deny_entry_problem(entry) is None
