"""End to end: a real Airflow with ``[leoflow] runtime = kubernetes`` on the k8senv control plane, every attempt a
pod (devtools/kube.py, ``make demo-k8s``), run by the real node with ``--real-node`` (a kubelet and containerd
running leoflow's agent image; the Airflow api-server listens on the node's bridge address), else by the node
harness.

One stack for the whole module (a scheduler, dag-processor and api-server on SQLite; a control plane; a task
namespace labelled ``pod-security.kubernetes.io/enforce=restricted``; the node): the demo's DAG set plus
``leoflow_test_creds`` (tests/dags: a BashOperator and a Python task dumping their environment) are triggered
at once, then every test reads what that one run left:

* every DAG run ends as under LocalExecutor (``devtools/expected.py``, the reference the parity test checks),
  callbacks included, and every task ran in a pod of the restricted namespace, bound to the harness node;
* no pod object the namespace ever held (every version, recorded by a watch, deleted pods included) carries a
  JWT, the ``jwt_secret``, the DB URL, the fernet key, the api-server's ``secret_key`` or the workload JSON;
* the tasks' own environment (``env``, ``os.environ``) carries none of them either, nor does the pod-side
  ``airflow.cfg``.

The scheduler side is given real values of each secret (the stack's jwt_secret and SQLite URL, a fresh fernet
key and ``[api] secret_key``), so each assertion looks for something that exists next door.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from devtools import expected
from devtools.demo import DEMO_PARALLELISM, KUBE_RUN_TIMEOUT_SECONDS
from devtools.kube import HARNESS_LABEL, PSA_RESTRICTED, REAL_POD_HOME, KubeStack, require_binaries
from devtools.runs import RunResult, run_all
from devtools.stack import OUR_DAGS, REPO_ROOT

pytestmark = [pytest.mark.k8s, pytest.mark.airflow, pytest.mark.either_node,
              pytest.mark.timeout(KUBE_RUN_TIMEOUT_SECONDS + 600)]

E2E_EXAMPLE_FILES = expected.KUBE_EXAMPLE_FILES
"""Airflow examples run here beside every leoflow_* DAG of the demo (``expected.KUBE_EXAMPLE_FILES``); set
``LEOFLOW_KUBE_E2E_FULL=1`` to run the demo's full set (``expected.EXAMPLE_FILES``) here too."""
FULL = os.environ.get("LEOFLOW_KUBE_E2E_FULL") == "1"
EXAMPLE_FILES = expected.EXAMPLE_FILES if FULL else E2E_EXAMPLE_FILES
E2E_DAGS = tuple(expected.EXPECTED) if FULL else expected.KUBE_DAGS
"""The DAG ids whose runs are checked against ``expected.EXPECTED``."""
CREDS_DAG = "leoflow_test_creds"
CREDS_DAG_FILE = REPO_ROOT / "tests" / "dags" / f"{CREDS_DAG}.py"
LOST_DAG = "leoflow_test_lost_report"
LOST_DAG_FILE = REPO_ROOT / "tests" / "dags" / f"{LOST_DAG}.py"
LEOFLOW = "leoflow_airflow.executor.LeoflowExecutor"
JWT = re.compile(r"eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]+")
"""A JWT: base64url of a JSON header (``{"`` encodes as ``eyJ``), payload and signature."""
WORKLOAD_MARKERS = ('"dag_rel_path"', '"bundle_info"', '"log_path"', "ExecuteTask", '"token":')
"""What a serialized ``ExecuteTask`` workload always carries (field names and the type tag)."""
DB_MARKERS = ("sql_alchemy_conn", "sqlite:///", "postgresql://", "postgresql+")


@dataclass(frozen=True)
class Outcome:
    """What the module's one run left behind."""

    runs: dict[str, RunResult]
    executed: list[tuple[str, str, int, int]]  # (dag_id, task_id, map_index, try_number) of TIs a worker ran
    traces: list[str]
    pods: dict[str, list[dict]]  # uid -> every version seen, oldest first
    secrets: dict[str, str]  # what -> value, each present on the scheduler side
    task_env: dict[str, dict[str, str]]  # "bash" / "python" -> the task's environment
    pod_cfg: str  # the pod-side airflow.cfg
    pod_home: Path
    node: str  # "harness" or "real": what ran the pods
    node_name: str  # the Node the pods were bound to
    namespace_labels: dict[str, str]
    sample_token: str | None  # a ServiceAccount token the harness projected into a pod (detector's control)
    lost_report: dict[str, object]  # leoflow_test_lost_report: trace line counts and the body's ledger rows
    check: subprocess.CompletedProcess  # `airflow leoflow check` with the scheduler's configuration


def _dags_folder(root: Path) -> Path:
    """The demo's DAGs (dags/) plus the environment-dumping test DAG, in one folder."""
    root.mkdir(parents=True, exist_ok=True)
    for path in [*sorted(OUR_DAGS.glob("*.py")), CREDS_DAG_FILE, LOST_DAG_FILE]:
        shutil.copyfile(path, root / path.name)
    return root


def _callback_traces(traces_dir: Path) -> list[str]:
    """The callback trace lines (``<dag_id>.log`` files; the creds DAG's dumps are not traces), sorted."""
    lines: list[str] = []
    for path in sorted(traces_dir.glob("*.log")):
        lines.extend(line for line in path.read_text().splitlines() if line.strip())
    return sorted(lines)


def _bash_env(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line and not line.startswith((" ", "\t")))


def _sample_token(workdir: Path) -> str | None:
    """One projected token file the harness wrote for a pod (``harness/<pod dir>/volumes/leoflow-token/token``)."""
    for path in sorted(workdir.glob("harness/*/volumes/*/token")):
        text = path.read_text().strip()
        if text:
            return text
    return None


def _minted_token(kube: KubeStack) -> str:
    """A ServiceAccount JWT of the task ServiceAccount, minted through the TokenRequest API (the real node's
    projected tokens stay inside its containers): the detector's control on the real node."""
    from kubernetes import client

    request = client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(audiences=["leoflow"],
                                                                                 expiration_seconds=600))
    return client.CoreV1Api(kube.api).create_namespaced_service_account_token(
        kube.service_account, kube.namespace, request).status.token


@pytest.fixture(scope="module")
def outcome(tmp_path_factory: pytest.TempPathFactory, airflow_stack_factory, kube_node: str) -> Outcome:
    """Bring the module's one stack up, run the DAG set and the creds DAG once, stop everything, return what
    was seen. A failure is raised again for every test of the module (pytest caches it with the fixture)."""
    require_binaries()
    from cryptography.fernet import Fernet

    work = tmp_path_factory.mktemp("kube-e2e")
    reuse = os.environ.get("K8SENV_DIR")
    node = kube_node
    kube = KubeStack(work / "kube", reuse_dir=Path(reuse) if reuse else None, build=False, node=node)
    extra = {"AIRFLOW__CORE__FERNET_KEY": Fernet.generate_key().decode(),
             "AIRFLOW__API__SECRET_KEY": "leoflow-e2e-api-secret-key-" + os.urandom(8).hex(),
             # TEST ONLY: lets leoflow_test_lost_report's executor_config kill its agent after the record
             "AIRFLOW__LEOFLOW__TEST_FAULT_INJECTION": "True"}
    dag_ids = [*E2E_DAGS, CREDS_DAG, LOST_DAG]
    with kube:
        stack = airflow_stack_factory("kube", executor=LEOFLOW, parallelism=DEMO_PARALLELISM,
                                      dags_folder=_dags_folder(work / "dags"), example_dags=EXAMPLE_FILES,
                                      extra_env=extra, api_host=kube.api_host)
        kube.configure(stack)
        env = stack.env()
        secrets = {
            "jwt_secret": env["AIRFLOW__API_AUTH__JWT_SECRET"],
            "DB URL": env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"],
            "fernet key": env["AIRFLOW__CORE__FERNET_KEY"],
            "[api] secret_key": env["AIRFLOW__API__SECRET_KEY"],
        }
        try:
            stack.migrate()
            check = subprocess.run([sys.executable, "-m", "airflow", "leoflow", "check"], env=stack.env(),
                                   capture_output=True, text=True, timeout=300)
            stack.start(wait_for_dags=dag_ids, scheduler=False)
            runs = run_all(stack, dag_ids, timeout=KUBE_RUN_TIMEOUT_SECONDS, start_scheduler=True)
            executed = _executed(stack, runs)
            kube.wait_for_no_running_pods(timeout=120)
            pods = kube.pods()
        except BaseException:
            print("task pods:\n  " + "\n  ".join(kube.describe_pods()))
            raise
        finally:
            left = stack.stop()
        assert not left, f"processes left after stopping the stack: {left}"
        namespace_labels = dict(kube_namespace_labels(kube))
        traces = _callback_traces(stack.traces_dir)
        task_env = {
            "bash": _bash_env((stack.traces_dir / "bash_env.txt").read_text()),
            "python": json.loads((stack.traces_dir / "python_env.json").read_text()),
        }
        pod_home = Path(REAL_POD_HOME) if node == "real" else kube.pod_home
        pod_cfg = (kube.pod_home / "airflow.cfg").read_text()
        sample = _minted_token(kube) if node == "real" else _sample_token(kube.workdir)
        lost_report = _lost_report(stack, runs[LOST_DAG].run_id)
    return Outcome(runs=runs, executed=executed, traces=traces, pods=pods, secrets=secrets, task_env=task_env, pod_cfg=pod_cfg,
                   pod_home=pod_home, node=node, node_name=kube.node_name, namespace_labels=namespace_labels,
                   sample_token=sample, lost_report=lost_report, check=check)


def _lost_report(stack, run_id: str) -> dict[str, object]:
    """What leoflow_test_lost_report left: how many times each body ran (trace lines) and the body's ledger rows
    ``(try_number, attempt_epoch, state, resolution)`` (the stack is stopped: its SQLite file is read directly)."""
    import sqlite3

    def lines(name: str) -> int:
        path = stack.traces_dir / name
        return len(path.read_text().splitlines()) if path.exists() else 0

    with sqlite3.connect(stack.home / "airflow.db", timeout=60) as conn:
        rows = conn.execute("select try_number, attempt_epoch, state, resolution from leoflow_attempt "
                            "where dag_id=? and run_id=? and task_id='body' order by id", (LOST_DAG, run_id)).fetchall()
    return {"body_runs": lines("lost_report_body.txt"), "downstream_runs": lines("lost_report_downstream.txt"),
            "body_attempts": [tuple(row) for row in rows]}


def _executed(stack, runs: dict[str, RunResult]) -> list[tuple[str, str, int, int]]:
    """The task instances an executor ran: ended success or failed, not an ``EmptyOperator`` (the scheduler
    marks those success itself, no worker runs them). ``(dag_id, task_id, map_index, try_number)``."""
    return sorted((ti["dag_id"], ti["task_id"], ti["map_index"], ti["try_number"])
                  for dag_id, result in runs.items()
                  for ti in stack.task_instances(dag_id, result.run_id)
                  if ti["state"] in ("success", "failed") and ti["operator"] != "EmptyOperator")


def kube_namespace_labels(kube: KubeStack) -> dict[str, str]:
    """The task namespace's labels, read from the API server."""
    from kubernetes import client

    return client.CoreV1Api(kube.api).read_namespace(kube.namespace).metadata.labels or {}


def _leaks(text: str, secrets: dict[str, str]) -> list[str]:
    """What of a credential ``text`` carries: a JWT, a secret's value, a DB URL, workload JSON (empty: none)."""
    found = [f"a JWT ({m.group(0)[:16]}...)" for m in JWT.finditer(text)]
    found += [what for what, value in secrets.items() if value and value in text]
    found += [f"DB marker {m!r}" for m in DB_MARKERS if m in text.lower()]
    found += [f"workload marker {m!r}" for m in WORKLOAD_MARKERS if m in text]
    return found


# ---------------------------------------------------------------------------------------------------- runs


def test_every_dag_run_ends_as_under_local_executor(outcome: Outcome) -> None:
    """Each demo DAG run ends in its expected run state with every task in its expected state, and the callbacks
    left the same trace lines, as under LocalExecutor."""
    problems = {dag_id: expected.mismatches(dag_id, outcome.runs[dag_id].state, outcome.runs[dag_id].tasks)
                for dag_id in E2E_DAGS}
    assert {d: p for d, p in problems.items() if p} == {}
    assert outcome.traces == list(expected.EXPECTED_TRACES)
    assert outcome.runs[CREDS_DAG].state == "success"
    assert outcome.runs[CREDS_DAG].tasks == {"bash_env": "success", "python_env": "success"}


def test_every_task_ran_in_an_admitted_pod_on_the_node(outcome: Outcome) -> None:
    """Pods really ran the tasks: the namespace enforces Pod Security ``restricted``; every task instance a
    worker ran (its last try) has a pod labelled with its DAG, task, map index and try; each pod is bound to the
    node by the template (the harness's also carry its label; the real node's ran under containerd, which gave
    each a container ID), runs the agent (``python -m leoflow_agent pod``) and ended Succeeded or Failed."""
    assert {k: outcome.namespace_labels.get(k) for k in PSA_RESTRICTED} == PSA_RESTRICTED
    last = [versions[-1] for versions in outcome.pods.values()]
    labelled = set()
    for pod in last:
        labels = pod["metadata"]["labels"]
        labelled.add((labels.get("leoflow.io/dag-id"), labels.get("leoflow.io/task-id"),
                      int(labels.get("leoflow.io/map-index", "-1")), int(labels.get("leoflow.io/try-number", "0"))))
    assert outcome.executed, "no task instance was run by a worker"
    assert [ti for ti in outcome.executed if ti not in labelled] == []
    for pod in last:
        name, spec = pod["metadata"]["name"], pod["spec"]
        assert spec.get("nodeName") == outcome.node_name, name
        if outcome.node == "harness":
            assert pod["metadata"]["labels"].get(HARNESS_LABEL) == outcome.node_name, name
        else:
            statuses = (pod.get("status") or {}).get("containerStatuses") or [{}]
            assert statuses[0].get("containerID", "").startswith("containerd://"), (name, statuses)
        assert spec["containers"][0]["args"] == ["python", "-m", "leoflow_agent", "pod"], name
        assert spec.get("automountServiceAccountToken") is False, name
        assert (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"), (name, pod.get("status"))


def test_a_success_whose_report_was_lost_is_recovered_from_the_termination_message(outcome: Outcome) -> None:
    """The agent is SIGKILLed after writing its success record to the termination message and before its PATCH
    (TEST-ONLY fault ``after_record``): the reconciler reads the record back from the pod's status and replays
    it, so the task ends SUCCESS at try 1, its body ran once, and its downstream ran."""
    run = outcome.runs[LOST_DAG]
    assert (run.state, run.tasks) == ("success", {"body": "success", "downstream": "success"})
    assert (LOST_DAG, "body", -1, 1) in outcome.executed, "the body did not end at try 1"
    assert outcome.lost_report["body_runs"] == 1
    assert outcome.lost_report["downstream_runs"] == 1
    assert outcome.lost_report["body_attempts"] == [(1, 1, "closed", "replayed")]


def test_airflow_leoflow_check_reports_the_runtime_and_the_schedulers_permissions(outcome: Outcome) -> None:
    """``airflow leoflow check`` with the scheduler's configuration names the runtime, namespace, image,
    exchange URL and audience, asks the API server for every permission the scheduler needs in the task
    namespace (all granted: the stack's identity is cluster-admin), names what the api-server needs, exits 0."""
    out = outcome.check.stdout
    assert outcome.check.returncode == 0, (out, outcome.check.stderr)
    assert "[leoflow] runtime = kubernetes" in out
    assert "kubernetes: namespace " in out and "exchange URL http" in out and "/leoflow/v1/exchange" in out
    for rule in ("create pods", "list pods", "watch pods", "delete pods", "patch pods", "get serviceaccounts"):
        assert f"ok   {rule}" in out, (rule, out)
    assert "create tokenreviews.authentication.k8s.io" in out


# ---------------------------------------------------------------------------------------------------- credentials


def test_detector_finds_each_credential() -> None:
    """The leak detector the next tests rely on flags each kind it looks for (so a clean result means clean)."""
    secrets = {"jwt_secret": "s3cr3t-value"}
    workload = '{"token": "", "dag_rel_path": "x.py", "bundle_info": {"name": "d"}, "log_path": "l", ' \
               '"type": "ExecuteTask"}'
    assert _leaks("x eyJhbGciOiJI.eyJzdWIiOiIx.c2lnbmF0dXJl y", {}) == ["a JWT (eyJhbGciOiJI.eyJ...)"]
    assert _leaks("a s3cr3t-value b", secrets) == ["jwt_secret"]
    assert _leaks("sqlite:////tmp/airflow.db", {}) == ["DB marker 'sqlite:///'"]
    assert len(_leaks(workload, {})) == len(WORKLOAD_MARKERS)
    assert _leaks('{"metadata": {"name": "p"}}', secrets) == []


def test_no_credential_on_any_pod_object(outcome: Outcome) -> None:
    """Every version of every pod the namespace held (deleted ones included), as the API server serialized it,
    carries no JWT, no jwt_secret, no DB URL, no fernet key, no ``[api] secret_key`` and no workload JSON."""
    assert outcome.pods, "no pod was recorded"
    assert all(len(v) >= 1 for v in outcome.secrets.values())
    # control: a real ServiceAccount JWT (the harness's: one it projected into a pod's token volume; on the real
    # node: one minted through TokenRequest), which the detector would see on a pod object
    assert outcome.sample_token is not None, "no ServiceAccount token to check the detector with"
    assert _leaks(outcome.sample_token, {}), "the detector misses a real projected token"
    leaks = {}
    for uid, versions in outcome.pods.items():
        for pod in versions:
            found = _leaks(json.dumps(pod), outcome.secrets)
            if found:
                leaks[f"{pod['metadata']['name']}@{pod['metadata']['resourceVersion']}"] = found
    assert leaks == {}


def test_no_credential_in_the_task_environment(outcome: Outcome) -> None:
    """What the tasks see (a BashOperator's ``env``, a Python task's ``os.environ``) and the pod-side
    ``airflow.cfg`` hold no JWT, jwt_secret, DB URL, fernet key or ``[api] secret_key``; the dumps come from
    tasks in pods (``KUBERNETES_SERVICE_HOST`` set, the pod-side ``AIRFLOW_HOME``)."""
    for name, seen in outcome.task_env.items():
        assert seen.get("AIRFLOW_HOME") == str(outcome.pod_home), (name, sorted(seen))
        assert "KUBERNETES_SERVICE_HOST" in seen, f"the {name} task did not run in a pod"
        for key in seen:
            for secret_key in ("SQL_ALCHEMY_CONN", "JWT_SECRET", "FERNET_KEY", "API__SECRET_KEY"):
                if secret_key in key.upper():
                    # the Task SDK plants a placeholder DB URL in the task process to block DB access
                    assert seen[key].startswith("airflow-db-not-allowed"), (name, key)
        text = "\n".join(f"{k}={v}" for k, v in seen.items() if not v.startswith("airflow-db-not-allowed"))
        assert _leaks(text, outcome.secrets) == [], name
    cfg = outcome.pod_cfg.lower()
    for key in ("sql_alchemy_conn", "jwt_secret", "fernet_key", "secret_key", "jwt_private_key"):
        assert key not in cfg, key
    assert _leaks(outcome.pod_cfg, outcome.secrets) == []
