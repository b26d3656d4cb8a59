"""Test DAGs for the Kubernetes pod-end faults through a real Airflow (``tests/integration/test_kube_faults_e2e.py``,
``test_kube_pod_ends_e2e.py``).

Each body appends ``<run_id> <try> <event> <unix time> <pid>`` lines (``start``, ``tick`` every 0.2 s, ``end``) to
``$AIRFLOW_HOME/traces/<dag>.<task>.body`` (:func:`fault_trace.body_line`) and, on every try, works until the test
writes ``traces/release.<run_id>.<try>`` (at most :data:`HOLD_SECONDS`), then ends: the test decides when each try
may end, so a fault always lands while the body runs and a re-driven try can be held too.

``lf_khold`` runs on the stack's Node (the pod template's); ``lf_khold_deadline`` too, its pod's
``activeDeadlineSeconds`` :data:`DEADLINE_SECONDS`. ``lf_knode`` runs on :data:`LOST_NODE`, a Node
the test serves with a node harness of its own and then loses: its ``executor_config`` ``pod_override`` sets
``spec.nodeName`` and the harness label (the stack's ``[leoflow] pod_override_allow`` lists ``spec.nodeName``). Both
shorten the pod's ``terminationGracePeriodSeconds`` to :data:`GRACE_SECONDS`: the Task SDK's task process ignores
SIGTERM (it only calls ``on_kill``), so a pod stopped by an eviction or its deadline ends when the grace runs out.
"""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import DAG, task
from fault_trace import CALLBACKS, hold
from kubernetes.client import models as k8s

START = datetime(2026, 1, 1)
HOLD_SECONDS = 240
LOST_NODE = "harness-node-lost"
GRACE_SECONDS = 2
DEADLINE_SECONDS = 45
"""``lf_khold_deadline``'s pod's ``activeDeadlineSeconds``: room for the agent's start on a loaded machine, then the
kubelet ends the pod while its body holds."""


def _hold(ti) -> None:
    """The body: :func:`fault_trace.hold` for :data:`HOLD_SECONDS` at most."""
    hold(ti, HOLD_SECONDS)


def _override(node: str | None = None, deadline: int | None = None) -> dict:
    spec = k8s.V1PodSpec(containers=[], termination_grace_period_seconds=GRACE_SECONDS, node_name=node,
                         active_deadline_seconds=deadline)
    labels = {"leoflow.test/harness": node} if node else None
    return {"pod_override": k8s.V1Pod(metadata=k8s.V1ObjectMeta(labels=labels), spec=spec)}


with DAG(dag_id="lf_khold", schedule=None, start_date=START, catchup=False, is_paused_upon_creation=False,
         max_active_runs=8, default_args={"retries": 0, **CALLBACKS}):

    @task(executor_config=_override())
    def work(ti=None) -> None:
        _hold(ti)

    work()


with DAG(dag_id="lf_knode", schedule=None, start_date=START, catchup=False, is_paused_upon_creation=False,
         default_args={"retries": 0, **CALLBACKS}):

    @task(executor_config=_override(LOST_NODE))
    def work(ti=None) -> None:  # noqa: F811 - one task per DAG, both named work
        _hold(ti)

    work()


with DAG(dag_id="lf_khold_deadline", schedule=None, start_date=START, catchup=False, is_paused_upon_creation=False,
         default_args={"retries": 0, **CALLBACKS}):

    @task(executor_config=_override(deadline=DEADLINE_SECONDS))
    def work(ti=None) -> None:  # noqa: F811 - one task per DAG, all named work
        _hold(ti)

    work()
