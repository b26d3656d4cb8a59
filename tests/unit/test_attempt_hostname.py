"""One fixed hostname per attempt (leoflow_agent.hostname): Airflow answers a heartbeat whose hostname differs from
the one its ``/run`` recorded with 409 ``running_elsewhere`` and the supervisor then kills a healthy task
(apache/airflow#63774). The agent works the name out once and every later ask, the task process's included, gets
that name, whatever DNS answers meanwhile."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from leoflow_agent import hostname


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    monkeypatch.delenv(hostname.HOSTNAME_ENV, raising=False)
    monkeypatch.delenv("AIRFLOW__CORE__HOSTNAME_CALLABLE", raising=False)


def test_the_hostname_asked_at_the_start_is_the_one_every_later_call_reports(monkeypatch):
    from airflow.sdk.api import client

    answers = iter(["node-a.example.internal", "node-a", "node-b.example.internal"])
    monkeypatch.setattr(socket, "getfqdn", lambda name="": next(answers))  # the operator's hostname_callable
    monkeypatch.setenv("AIRFLOW__CORE__HOSTNAME_CALLABLE", "socket.getfqdn")
    assert client.get_hostname() == "node-a.example.internal"  # unpinned: every ask is a new DNS answer
    assert client.get_hostname() == "node-a"

    assert hostname.pin() == "node-b.example.internal"
    assert [client.get_hostname() for _ in range(3)] == ["node-b.example.internal"] * 3
    child = subprocess.run([sys.executable, "-c", "from airflow.sdk.api.client import get_hostname; "
                            "print(get_hostname())"], capture_output=True, text=True, env=dict(os.environ),
                           check=True, timeout=120)
    assert child.stdout.strip() == "node-b.example.internal"  # the task process inherits it


def test_a_pod_reports_its_own_name_and_an_overlong_name_is_cut_to_airflows_column():
    from airflow.sdk.api import client

    assert hostname.pin("lf-hello-0190abcd-1") == "lf-hello-0190abcd-1"
    assert client.get_hostname() == "lf-hello-0190abcd-1"
    assert len(hostname.pin("x" * 5000)) == hostname.MAX_HOSTNAME_CHARS
