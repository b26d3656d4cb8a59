"""The scheduler's remote-logging settings on a task pod (issue 12 item 7; DESIGN "Task logs"): which
``[logging]`` options a pod gets as ``AIRFLOW__LOGGING__*``, that none of them may carry a credential, that a
layer of the pod (template, override, hook) that sets one of them wins, and that Airflow's own secrets still
refuse the pod. The end-to-end read-back after the pod is gone is ``tests/integration/test_kube_task_logs.py``.
"""

from __future__ import annotations

import json

import pytest
from kubernetes.client import models as k8s

from leoflow_airflow import settings as leoflow_settings
from leoflow_airflow.errors import ConfigError, PodRefused
from leoflow_airflow.runtime.kubernetes.logenv import FORWARDED_OPTIONS, credential_problem, logging_env
from leoflow_airflow.runtime.kubernetes.pod import PodAttempt, build_pod


def kube() -> leoflow_settings.KubernetesSettings:
    values = {"image": "registry.example/leoflow:1", "exchange_url": "https://airflow.example/leoflow"}
    return leoflow_settings.load_kubernetes(lambda section, key, fallback: values.get(key, fallback))


def attempt() -> PodAttempt:
    return PodAttempt(ti_id="0190b6c2-7a1e-7000-8000-00000000abcd", try_number=1, attempt_epoch=1, dag_id="etl",
                      task_id="load", run_id="manual__2026-01-01T00:00:00+00:00")


def agent(pod: k8s.V1Pod) -> k8s.V1Container:
    return pod.spec.containers[0]


def env_of(container: k8s.V1Container) -> dict[str, str]:
    return {e.name: e.value for e in container.env or []}


S3 = {"remote_logging": "True", "remote_base_log_folder": "s3://logs-bucket/airflow",
      "remote_log_conn_id": "aws_logs", "remote_task_handler_kwargs": '{"delete_local_copy": true}',
      "delete_local_logs": "True", "encrypt_s3_logs": "False", "logging_config_class": "",
      "base_log_folder": "/opt/airflow/logs", "google_key_path": "/secrets/gcp.json"}


def test_remote_logging_on_forwards_each_set_option_by_airflows_env_name() -> None:
    assert logging_env(S3) == {
        "AIRFLOW__LOGGING__REMOTE_LOGGING": "True",
        "AIRFLOW__LOGGING__REMOTE_BASE_LOG_FOLDER": "s3://logs-bucket/airflow",
        "AIRFLOW__LOGGING__REMOTE_LOG_CONN_ID": "aws_logs",
        "AIRFLOW__LOGGING__REMOTE_TASK_HANDLER_KWARGS": '{"delete_local_copy": true}',
        "AIRFLOW__LOGGING__DELETE_LOCAL_LOGS": "True",
        "AIRFLOW__LOGGING__ENCRYPT_S3_LOGS": "False",
    }, "the empty logging_config_class and the pod's own base_log_folder / google_key_path are not forwarded"


def test_a_logging_config_class_is_forwarded_when_set() -> None:
    env = logging_env({"remote_logging": "t", "logging_config_class": "my_company.log_config.LOGGING_CONFIG"})
    assert env == {"AIRFLOW__LOGGING__REMOTE_LOGGING": "True",
                   "AIRFLOW__LOGGING__LOGGING_CONFIG_CLASS": "my_company.log_config.LOGGING_CONFIG"}


@pytest.mark.parametrize("flag", ["False", "", "0", "no"])
def test_remote_logging_off_forwards_nothing(flag) -> None:
    assert logging_env({**S3, "remote_logging": flag}) == {}


@pytest.mark.parametrize(("option", "value", "why"), [
    ("remote_base_log_folder", "wasb://logs:hunter2hunter2@account.blob.core.windows.net/x", "URL with a password"),
    ("remote_task_handler_kwargs", '{"aws_secret_access_key": "wJalrXUtnFEMI/K7MDENG"}', "aws_secret_access_key"),
    ("remote_task_handler_kwargs", '{"client": {"password": "pw123456"}}', "client.password"),
    ("remote_task_handler_kwargs", '{"sas_token": "sv=2020&sig=abc"}', "sas_token"),
    ("remote_task_handler_kwargs", '{"key": "-----BEGIN RSA PRIVATE KEY-----\\nMII"}', "PEM private key"),
    ("remote_log_conn_id", "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ0YXNrIn0.c2lnbmF0dXJl", "JWT"),
])
def test_a_credential_in_a_forwarded_option_is_refused_by_name_without_echoing_it(option, value, why) -> None:
    with pytest.raises(ConfigError) as err:
        logging_env({"remote_logging": "True", option: value})
    text = str(err.value)
    assert f"[logging] {option}" in text and why in text and "secretKeyRef" in text
    assert value not in text and "hunter2" not in text


@pytest.mark.parametrize("value", ['{"delete_local_copy": true, "token_file": ""}', '{"max_bytes": 10}',
                                   "gs://bucket/logs", "https://user@logs.example/airflow", "not json {"])
def test_values_without_a_credential_pass(value) -> None:
    assert credential_problem("remote_task_handler_kwargs", value) is None


def test_the_pod_carries_the_forwarded_settings_in_its_agent_container() -> None:
    env = logging_env(S3)
    pod = build_pod(attempt(), kube(), forward_env=env)
    assert {k: env_of(agent(pod))[k] for k in env} == env
    assert all(not (c.env and any(e.name in env for e in c.env)) for c in pod.spec.containers[1:])


def test_a_pod_layer_that_sets_one_of_them_wins() -> None:
    """The template names another folder and takes the kwargs from a Secret: both kept, the rest added."""
    secret = k8s.V1EnvVarSource(secret_key_ref=k8s.V1SecretKeySelector(name="log-creds", key="kwargs"))
    template = k8s.V1Pod(spec=k8s.V1PodSpec(containers=[k8s.V1Container(name="base", env=[
        k8s.V1EnvVar(name="AIRFLOW__LOGGING__REMOTE_BASE_LOG_FOLDER", value="s3://pods-bucket/logs"),
        k8s.V1EnvVar(name="AIRFLOW__LOGGING__REMOTE_TASK_HANDLER_KWARGS", value_from=secret)])]))

    def hook(pod: k8s.V1Pod) -> None:
        pod.spec.containers[0].env.append(k8s.V1EnvVar(name="AIRFLOW__LOGGING__DELETE_LOCAL_LOGS", value="False"))

    pod = build_pod(attempt(), kube(), template=template, mutation_hook=hook, forward_env=logging_env(S3))
    names = [e.name for e in agent(pod).env]
    assert len(names) == len(set(names)), f"each variable once: {names}"
    env = {e.name: e for e in agent(pod).env}
    assert env["AIRFLOW__LOGGING__REMOTE_BASE_LOG_FOLDER"].value == "s3://pods-bucket/logs"
    assert env["AIRFLOW__LOGGING__REMOTE_TASK_HANDLER_KWARGS"].value_from == secret
    assert env["AIRFLOW__LOGGING__DELETE_LOCAL_LOGS"].value == "False"
    assert env["AIRFLOW__LOGGING__REMOTE_LOG_CONN_ID"].value == "aws_logs"
    assert env["AIRFLOW__LOGGING__REMOTE_LOGGING"].value == "True"


def test_forwarding_does_not_weaken_the_refusal_of_airflows_own_secrets() -> None:
    template = k8s.V1Pod(spec=k8s.V1PodSpec(containers=[k8s.V1Container(name="base", env=[
        k8s.V1EnvVar(name="AIRFLOW__CORE__FERNET_KEY", value="x")])]))
    with pytest.raises(PodRefused, match="AIRFLOW__CORE__FERNET_KEY"):
        build_pod(attempt(), kube(), template=template, forward_env=logging_env(S3))


def test_no_forwarded_option_is_one_of_airflows_own_secrets() -> None:
    from leoflow_airflow.runtime.environment import withheld

    assert not [o for o in FORWARDED_OPTIONS if withheld(f"AIRFLOW__LOGGING__{o.upper()}")]


def test_the_runtime_reads_the_schedulers_logging_options(monkeypatch) -> None:
    """What ``KubernetesRuntime.start`` hands every pod, from the live Airflow config (env form here; Airflow is
    imported first, so its own logging set-up does not build a gs:// handler)."""
    import airflow.configuration  # noqa: F401 - initialised before the variables below exist

    from leoflow_airflow.runtime.kubernetes.runtime import _remote_logging_env

    monkeypatch.setenv("AIRFLOW__LOGGING__REMOTE_LOGGING", "True")
    monkeypatch.setenv("AIRFLOW__LOGGING__REMOTE_BASE_LOG_FOLDER", "gs://b/logs")
    monkeypatch.setenv("AIRFLOW__LOGGING__REMOTE_TASK_HANDLER_KWARGS", json.dumps({"delete_local_copy": True}))
    env = _remote_logging_env()
    assert env["AIRFLOW__LOGGING__REMOTE_BASE_LOG_FOLDER"] == "gs://b/logs"
    assert json.loads(env["AIRFLOW__LOGGING__REMOTE_TASK_HANDLER_KWARGS"]) == {"delete_local_copy": True}
    monkeypatch.setenv("AIRFLOW__LOGGING__REMOTE_TASK_HANDLER_KWARGS", '{"password": "pw"}')
    with pytest.raises(ConfigError, match="remote_task_handler_kwargs"):
        _remote_logging_env()
