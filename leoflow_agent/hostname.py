"""One fixed hostname per attempt, reported on every Execution API call of that attempt (issue: the hostname a
heartbeat reports must never change under a running task).

Airflow 3.3's Task SDK asks ``[core] hostname_callable`` (default: the FQDN, a DNS lookup) afresh for the ``/run``
call, for every heartbeat and in the task process (``airflow.sdk.api.client.get_hostname``), and the Execution
API answers a heartbeat whose hostname differs from the one ``/run`` recorded with 409 ``running_elsewhere``,
which makes the supervisor kill a healthy task (apache/airflow#63774: a DNS answer that changed mid-task). The
agent therefore works its attempt's hostname out ONCE, before the supervisor starts (:func:`pin`), and points
``hostname_callable`` at :func:`attempt_hostname`, which returns that value for the rest of the process and of
every process it starts (the task process inherits the environment). On Kubernetes the value is the pod's name
(a pod's hostname); on Lite it is what the operator's own ``hostname_callable`` (or Airflow's default) answers
at the agent's start.
"""

from __future__ import annotations

import os
import socket

HOSTNAME_ENV = "LEOFLOW_ATTEMPT_HOSTNAME"
"""The environment variable holding the attempt's pinned hostname."""

CALLABLE = "leoflow_agent.hostname.attempt_hostname"
"""The import path :func:`pin` puts into ``AIRFLOW__CORE__HOSTNAME_CALLABLE``."""

MAX_HOSTNAME_CHARS = 1000
"""Airflow's ``task_instance.hostname`` column is ``String(1000)``; a longer name is cut to it."""


def attempt_hostname() -> str:
    """The hostname :func:`pin` fixed for this attempt; ``socket.gethostname()`` when nothing was pinned (a
    process that did not start from an agent). Never raises."""
    return os.environ.get(HOSTNAME_ENV) or socket.gethostname()


def pin(hostname: str | None = None) -> str:
    """Fix this process's (and its children's) reported hostname for the attempt and return it.

    :param hostname: the name to report (a pod's name); ``None`` asks Airflow's own ``get_hostname()`` once,
        which honours an operator's ``[core] hostname_callable``.
    :raises ImportError: when ``hostname`` is None and the Task SDK is not installed.
    """
    if not hostname:
        from airflow.sdk.api.client import get_hostname

        hostname = str(get_hostname())
    hostname = hostname[:MAX_HOSTNAME_CHARS]
    os.environ[HOSTNAME_ENV] = hostname
    os.environ["AIRFLOW__CORE__HOSTNAME_CALLABLE"] = CALLABLE
    return hostname
