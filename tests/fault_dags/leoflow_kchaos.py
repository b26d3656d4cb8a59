"""Kubernetes chaos-suite test DAGs (issue 10 item 7, ``tests/integration/test_kube_chaos.py``).

One task ``work`` each (retries 1), so a run costs one cold pod when nothing goes wrong. The body appends
``<run_id> <try> <event> <unix time> <pid>`` lines to ``$AIRFLOW_HOME/traces/<dag>.work.body``
(:func:`fault_trace.body_line`; the pods see the scheduler's ``traces`` through their Airflow home's link) and
ticks for :data:`TICK_SECONDS`, then ends. The **first** body of a run whose test planned a pod-level fault finds
``traces/hold.<run_id>`` and claims it (an atomic rename to ``traces/held.<run_id>.<pid>``, so exactly one body
of the run holds, whatever its try or epoch), then ticks until ``traces/release.<run_id>`` exists (at most
:data:`HOLD_SECONDS`): the fault always lands while that body runs, and every later body runs its short course.

``lf_kchaos`` runs on the stack's harness Node (the pod template's); ``lf_kchaos_node`` on :data:`LOST_NODE`
(``spec.nodeName`` and the harness label in its ``pod_override``), a Node the test serves with a node harness of its
own and then loses. Both shorten ``terminationGracePeriodSeconds`` to :data:`GRACE_SECONDS`: the Task SDK's task
process ignores SIGTERM, so a deleted or evicted pod ends when its grace runs out.
"""

from __future__ import annotations

import os
import time
from datetime import datetime, timedelta

from airflow.sdk import DAG, task
from fault_trace import body_line, traces_dir
from kubernetes.client import models as k8s

START = datetime(2026, 1, 1)
TICK_SECONDS = 2.0
HOLD_SECONDS = 300
LOST_NODE = "harness-node-lost"
GRACE_SECONDS = 2


def _body(ti) -> None:
    """Start, hold if this is the run's first body and the test asked for a hold, else tick briefly; end."""
    body_line(ti, "start")
    traces = traces_dir()
    try:
        os.rename(traces / f"hold.{ti.run_id}", traces / f"held.{ti.run_id}.{os.getpid()}")
        held = True
    except FileNotFoundError:
        held = False
    release = traces / f"release.{ti.run_id}"
    deadline = time.monotonic() + (HOLD_SECONDS if held else TICK_SECONDS)
    while time.monotonic() < deadline and not (held and release.exists()):
        body_line(ti, "tick")
        time.sleep(0.2)
    body_line(ti, "end")


def _override(node: str | None = None) -> dict:
    spec = k8s.V1PodSpec(containers=[], termination_grace_period_seconds=GRACE_SECONDS, node_name=node)
    labels = {"leoflow.test/harness": node} if node else None
    return {"pod_override": k8s.V1Pod(metadata=k8s.V1ObjectMeta(labels=labels), spec=spec)}


_ARGS = {"retries": 1, "retry_delay": timedelta(seconds=1)}

with DAG(dag_id="lf_kchaos", schedule=None, start_date=START, catchup=False, is_paused_upon_creation=False,
         max_active_runs=64, default_args=_ARGS):

    @task(executor_config=_override())
    def work(ti=None) -> None:
        _body(ti)

    work()


with DAG(dag_id="lf_kchaos_node", schedule=None, start_date=START, catchup=False, is_paused_upon_creation=False,
         max_active_runs=64, default_args=_ARGS):

    @task(executor_config=_override(LOST_NODE))
    def work(ti=None) -> None:  # noqa: F811 - one task per DAG, both named work
        _body(ti)

    work()
