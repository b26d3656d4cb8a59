"""leoflow's test plugin: one implementation of every ``leoflow_*`` hook (``leoflow_airflow.hookspecs``).

Inert unless ``LEOFLOW_TEST_PLUGIN_DIR`` names a folder (it is installed into every test venv, so every other
test must not notice it). When set:

* ``leoflow_mutate_pod`` adds the label ``leoflow-test-plugin=mutated`` and the annotation
  ``leoflow-test-plugin/attempt=<ti_id>/<try>/<epoch>``, and tries to weaken what leoflow pins: the
  ServiceAccount, token automount, ``runAsNonRoot``, the identity annotation, the agent's arguments and
  termination message path, the restart policy and the finalizers. With ``LEOFLOW_TEST_PLUGIN_SECRET=1`` it
  also puts ``AIRFLOW__CORE__FERNET_KEY`` in the agent's environment (the pod must be refused);
* ``leoflow_exchange`` denies exchanges of the DAGs named in ``LEOFLOW_TEST_PLUGIN_VETO_DAGS`` (comma
  separated), raises for those in ``LEOFLOW_TEST_PLUGIN_RAISE_DAGS``, and annotates every other one;
* ``leoflow_attempt_settled`` and ``leoflow_warm_pool_resized`` append a JSON line to ``settled.jsonl`` /
  ``warm.jsonl`` in that folder, then raise (``LEOFLOW_TEST_PLUGIN_RAISE=1``), which leoflow must shrug off.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from leoflow_airflow.hookspecs import ExchangeVerdict, hookimpl

LABEL = "leoflow-test-plugin"
DENY_REASON = "the test plugin denies this DAG"


def _dir() -> Path | None:
    folder = os.environ.get("LEOFLOW_TEST_PLUGIN_DIR")
    return Path(folder) if folder else None


def _names(var: str) -> set[str]:
    return {x for x in os.environ.get(var, "").split(",") if x}


def _append(name: str, entry: dict) -> None:
    folder = _dir()
    assert folder is not None
    with open(folder / name, "a", encoding="utf-8") as f:
        f.write(json.dumps(entry, sort_keys=True) + "\n")
    if os.environ.get("LEOFLOW_TEST_PLUGIN_RAISE") == "1":
        raise RuntimeError(f"the test plugin raises after writing {name}")


@hookimpl
def leoflow_mutate_pod(pod, attempt):
    """Add a label and an annotation; try to change pinned fields (they must come back)."""
    if _dir() is None:
        return
    from kubernetes.client import models as k8s

    meta = pod.metadata
    meta.labels = {**(meta.labels or {}), LABEL: "mutated"}
    meta.annotations = {**(meta.annotations or {}), "leoflow.io/attempt": "forged",
                        f"{LABEL}/attempt": f"{attempt.ti_id}/{attempt.try_number}/{attempt.attempt_epoch}"}
    meta.finalizers = []
    spec = pod.spec
    spec.service_account_name = "default"
    spec.automount_service_account_token = True
    spec.restart_policy = "Always"
    spec.security_context = k8s.V1PodSecurityContext(run_as_non_root=False)
    agent = spec.containers[0]
    agent.args = ["sh", "-c", "echo pwned"]
    agent.termination_message_path = "/tmp/elsewhere"
    if os.environ.get("LEOFLOW_TEST_PLUGIN_SECRET") == "1":
        agent.env = [*(agent.env or []), k8s.V1EnvVar(name="AIRFLOW__CORE__FERNET_KEY", value="stolen")]


@hookimpl
def leoflow_exchange(attempt, pod_name, namespace):
    """Deny, raise or annotate, by DAG (module docstring)."""
    if _dir() is None:
        return None
    if attempt.dag_id in _names("LEOFLOW_TEST_PLUGIN_RAISE_DAGS"):
        raise RuntimeError("the test plugin's policy back end is down")
    if attempt.dag_id in _names("LEOFLOW_TEST_PLUGIN_VETO_DAGS"):
        return ExchangeVerdict(deny=DENY_REASON)
    return ExchangeVerdict(log_fields={"test_plugin": f"{namespace}/{pod_name}"})


@hookimpl
def leoflow_attempt_settled(attempt, evidence, resolution, detail):
    """Append what was settled to ``settled.jsonl``."""
    if _dir() is None:
        return
    _append("settled.jsonl", {"ti_id": attempt.ti_id, "try_number": attempt.try_number,
                              "attempt_epoch": attempt.attempt_epoch, "dag_id": attempt.dag_id,
                              "task_id": attempt.task_id, "runtime": attempt.runtime, "evidence": dict(evidence),
                              "resolution": resolution, "detail": detail})


@hookimpl
def leoflow_warm_pool_resized(pool_key, before, after):
    """Append the resize to ``warm.jsonl``."""
    if _dir() is None:
        return
    _append("warm.jsonl", {"pool_key": pool_key, "before": before, "after": after})
