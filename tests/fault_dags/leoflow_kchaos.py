"""Kubernetes chaos-suite test DAGs (issue 10 item 7, ``tests/integration/test_kube_chaos.py``).

One task ``work`` each (retries 1), so a run costs one cold pod when nothing goes wrong. The body appends
``<run_id> <try> <event> <unix time> <pid>`` lines to ``$AIRFLOW_HOME/traces/<dag>.work.body``
(:func:`fault_trace.body_line`; the pods see the scheduler's ``traces`` through their Airflow home's link) and
ticks for :data:`TICK_SECONDS`, then ends. The **first** body of a run whose test planned a pod-level fault finds
``traces/hold.<run_id>`` and claims it (an atomic rename to ``traces/held.<run_id>.<pid>``, so exactly one body
of the run holds, whatever its try or epoch), then ticks until ``traces/release.<run_id>`` exists (at most
:data:`HOLD_SECONDS`): the fault always lands while that body runs, and every later body runs its short course.

The holding body writes its host name into ``held.<run_id>.<pid>`` (on the real node, its pod's name: the test finds
the pod and the body's PID on the machine from it), and outgrows its container's memory limit (:data:`MEMORY_LIMIT`)
once ``traces/oom.<run_id>`` exists, so the kernel's OOM killer ends it (the real node; the harness plays the OOM
killer itself and ignores resources).

``lf_koom`` (no retries) runs a child process that outgrows the container's memory limit and then fails, as a task
whose tool was OOM-killed does; ``lf_kpull`` (no retries) names an image that cannot be pulled
(:data:`MISSING_IMAGE`); ``lf_kdeadline`` (no retries) ticks past its pod's ``activeDeadlineSeconds``
(:data:`DEADLINE_SECONDS`). All three for ``test_kube_chaos.py`` on the real node.

``lf_kchaos`` runs on the stack's Node (the pod template's); ``lf_kchaos_node`` on :data:`LOST_NODE`
(``spec.nodeName`` and the harness label in its ``pod_override``), a Node the test serves with a node harness of its
own and then loses. Both shorten ``terminationGracePeriodSeconds`` to :data:`GRACE_SECONDS`: the Task SDK's task
process ignores SIGTERM, so a deleted or evicted pod ends when its grace runs out.
"""

from __future__ import annotations

import os
import socket
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
MEMORY_LIMIT = "1Gi"
"""The agent container's memory limit (its agent, the Task SDK's supervisor and the task process use about 300 MiB)."""
CPU_REQUEST = "100m"
"""The real node's template's CPU request, kept: an override's ``resources`` replaces the template's whole."""
GROW_BYTES = 64 * 2**20


def _body(ti) -> None:
    """Start, hold if this is the run's first body and the test asked for a hold, else tick briefly; end."""
    body_line(ti, "start")
    traces = traces_dir()
    claimed = traces / f"held.{ti.run_id}.{os.getpid()}"
    try:
        os.rename(traces / f"hold.{ti.run_id}", claimed)
        held = True
    except FileNotFoundError:
        held = False
    if held:  # the test's file is not this uid's to write: a new one in its place, atomically
        named = traces / f".pod.{ti.run_id}.{os.getpid()}"
        named.write_text(socket.gethostname() + "\n")
        os.replace(named, claimed)
    release, oom = traces / f"release.{ti.run_id}", traces / f"oom.{ti.run_id}"
    grown: list[bytes] = []
    deadline = time.monotonic() + (HOLD_SECONDS if held else TICK_SECONDS)
    while time.monotonic() < deadline and not (held and release.exists()):
        body_line(ti, "tick")
        if held and oom.exists():
            grown.append(b"\x01" * GROW_BYTES)  # written, so resident: past the limit the OOM killer ends it
            continue
        time.sleep(0.2)
    body_line(ti, "end")


def _override(node: str | None = None) -> dict:
    resources = k8s.V1ResourceRequirements(requests={"cpu": CPU_REQUEST}, limits={"memory": MEMORY_LIMIT})
    spec = k8s.V1PodSpec(containers=[k8s.V1Container(name="base", resources=resources)],
                         termination_grace_period_seconds=GRACE_SECONDS, node_name=node)
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


OOM_CHILD = "buf = []\nwhile True:\n    buf.append(b'\\x01' * (64 * 2**20))\n"
"""A Python program that grows by 64 MiB at a time until the OOM killer ends it."""

with DAG(dag_id="lf_koom", schedule=None, start_date=START, catchup=False, is_paused_upon_creation=False,
         max_active_runs=4, default_args={"retries": 0}):

    @task(executor_config=_override())
    def work(ti=None) -> None:  # noqa: F811 - one task per DAG, all named work
        """Start a child that outgrows the container's memory limit (the largest process, so the one the OOM
        killer ends on a kernel that kills one process), then fail as a task does when a tool it runs dies."""
        import subprocess
        import sys

        body_line(ti, "start")
        child = subprocess.run([sys.executable, "-c", OOM_CHILD], check=False)
        body_line(ti, "end")
        raise RuntimeError(f"the child ended with {child.returncode}")

    work()


MISSING_IMAGE = "127.0.0.1:1/leoflow/missing:1"
"""An image nobody can pull: its registry is a closed port of the node's loopback (so the pull never leaves this
machine), which the kubelet reports as ``ErrImagePull``, then ``ImagePullBackOff``."""

with DAG(dag_id="lf_kpull", schedule=None, start_date=START, catchup=False, is_paused_upon_creation=False,
         max_active_runs=4, default_args={"retries": 0}):

    @task(executor_config={"pod_override": k8s.V1Pod(spec=k8s.V1PodSpec(
        containers=[k8s.V1Container(name="base", image=MISSING_IMAGE)]))})
    def work(ti=None) -> None:  # noqa: F811 - one task per DAG, all named work
        """Never runs: its image cannot be pulled."""
        body_line(ti, "start")

    work()


DEADLINE_SECONDS = 45
"""``lf_kdeadline``'s pod's ``activeDeadlineSeconds`` (its ``pod_override``; leoflow keeps a deadline shorter than
``[leoflow] credential_ceiling_seconds``): the kubelet ends the pod this long after it started."""

with DAG(dag_id="lf_kdeadline", schedule=None, start_date=START, catchup=False, is_paused_upon_creation=False,
         max_active_runs=4, default_args={"retries": 0}):

    @task(executor_config={"pod_override": k8s.V1Pod(spec=k8s.V1PodSpec(
        active_deadline_seconds=DEADLINE_SECONDS, termination_grace_period_seconds=GRACE_SECONDS,
        containers=[k8s.V1Container(name="base")]))})
    def work(ti=None) -> None:  # noqa: F811 - one task per DAG, all named work
        """Tick for far longer than the pod may live; the kubelet ends it first."""
        body_line(ti, "start")
        deadline = time.monotonic() + HOLD_SECONDS
        while time.monotonic() < deadline:
            body_line(ti, "tick")
            time.sleep(0.5)
        body_line(ti, "end")

    work()
