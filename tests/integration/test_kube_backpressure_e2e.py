"""Issue 9 acceptance, end to end: the cluster saying "not now" or "never" to a task pod, seen through a real
Airflow (scheduler, dag-processor, api-server on SQLite) with ``[leoflow] runtime = kubernetes`` on the k8senv
control plane, the pods run by the real node with ``--real-node`` (a kubelet and containerd running leoflow's agent
image), else by the node harness (devtools/kube.py).

* A ResourceQuota with no room left: ten tasks stay QUEUED (backpressure, counted as
  ``leoflow.dispatch.backpressure`` at a StatsD listener), none fails or spends a try; once the quota is raised
  all ten run, each body once, and succeed.
* The same under API Priority and Fairness: a FlowSchema sends the scheduler's pod creates to a priority level
  that rejects (429) while one of its requests executes; once the FlowSchema is deleted all ten run once.
* A ``pod_override`` that Pod Security ``restricted`` forbids (``runAsUser: 0``): the API server refuses the
  pod, the task fails at once, at try 1, and the reason is where the user looks (the task's audit log).

One stack for the module. The scheduler and api-server talk to Kubernetes as a ServiceAccount holding only
what leoflow needs (:meth:`devtools.kube.KubeStack.scheduler_kubeconfig`), not as the admin: the admin is in
``system:masters``, which API Priority and Fairness exempts, so the 429 test needs a non-exempt identity.

Every wait is for an event (a ledger row, a run state, the admission webhook being called), never a sleep.
Wall time about 4 min on 2 cores: 1.7 min bringing the stack up, 1.3 min for the quota test (30 s of it is
the runtime's create back-off, which ten refusals in a row push to its cap), 50 s for the 429 test, 6 s for
Pod Security. Run it with ``--basetemp`` of its own when other pytest sessions run at the same time: pytest
keeps only the three newest ``/tmp/pytest-of-<user>/pytest-N`` and deletes older ones, control plane included.
"""

from __future__ import annotations

import base64
import datetime
import http.server
import json
import os
import shutil
import sqlite3
import ssl
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

import pytest

from devtools.kube import SCHEDULER_SERVICE_ACCOUNT, KubeStack, require_binaries
from devtools.stack import REPO_ROOT, AirflowStack
from devtools.statsd import StatsdListener, airflow_env
from tests.integration.lite_procs import wait_for

pytestmark = [pytest.mark.k8s, pytest.mark.airflow, pytest.mark.either_node, pytest.mark.timeout(1200)]

BACKPRESSURE_DAG = "leoflow_test_backpressure"
PODSECURITY_DAG = "leoflow_test_podsecurity"
DAG_FILES = [REPO_ROOT / "tests" / "dags" / f"{d}.py" for d in (BACKPRESSURE_DAG, PODSECURITY_DAG)]
TASKS = [f"t{i}" for i in range(10)]
LEOFLOW = "leoflow_airflow.executor.LeoflowExecutor"
POD_OVERRIDE_ALLOW = ("metadata.labels, metadata.annotations, spec.containers.env, "
                      "spec.containers.securityContext.runAsUser")
"""``[leoflow] pod_override_allow`` of the stack: lets ``runAsUser`` through, so Pod Security (the API server)
is what refuses the root pod, not leoflow's allowlist."""
RUN_TIMEOUT = 300.0
BACKPRESSURE_TIMEOUT = 120.0
HOLD_SECONDS = 27.0
"""How long the admission webhook holds the APF seat at most (the API server allows a webhook 30 s)."""
HOLD_LABEL = "leoflow.test/apf-hold"
FILLER_IMAGE = "127.0.0.1:1/leoflow/filler:1"
"""The quota filler's image: a registry at port 1 of loopback, which refuses at once (the real node's pull fails
without a wait; no traffic leaves this machine)."""


@dataclass
class Env:
    """The module's running stack."""

    stack: AirflowStack
    kube: KubeStack
    work: Path
    statsd: StatsdListener


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory, airflow_stack_factory, kube_node: str) -> Iterator[Env]:
    """A started control plane + node (the real node with ``--real-node``, else the harness) and a started
    Airflow whose scheduler and api-server use the least-privilege ServiceAccount kubeconfig and whose metrics go
    to a StatsD listener; stopped at the end (nothing may be left running)."""
    require_binaries()
    work = tmp_path_factory.mktemp("kube-bp")
    dags = work / "dags"
    dags.mkdir()
    for path in DAG_FILES:
        shutil.copyfile(path, dags / path.name)
    reuse = os.environ.get("K8SENV_DIR")
    kube = KubeStack(work / "kube", reuse_dir=Path(reuse) if reuse else None, build=False, node=kube_node)
    statsd = StatsdListener()
    with kube, statsd:
        stack = airflow_stack_factory("kube-bp", executor=LEOFLOW, parallelism=len(TASKS) + 2, dags_folder=dags,
                                      extra_env={"AIRFLOW__LEOFLOW__POD_OVERRIDE_ALLOW": POD_OVERRIDE_ALLOW,
                                                 **airflow_env(statsd.port)}, api_host=kube.api_host)
        kube.configure(stack)
        stack.extra_env["AIRFLOW__LEOFLOW__KUBE_CONFIG"] = str(kube.scheduler_kubeconfig(work / "scheduler.kubeconfig"))
        try:
            stack.migrate()
            stack.start(wait_for_dags=[BACKPRESSURE_DAG, PODSECURITY_DAG])
            for dag_id in (BACKPRESSURE_DAG, PODSECURITY_DAG):
                stack.unpause(dag_id)
            yield Env(stack, kube, work, statsd)
        finally:
            left = stack.stop()
        assert not left, f"processes left after stopping the stack: {left}"


# ---------------------------------------------------------------------------------------------------- helpers


def _core(env: Env):
    from kubernetes import client

    return client.CoreV1Api(env.kube.api)


def _ledger(stack: AirflowStack, dag_id: str, run_id: str) -> list[dict]:
    """The run's ``leoflow_attempt`` rows, oldest first (task_id, try_number, attempt_epoch, state, resolution,
    detail), read from the stack's SQLite file while it runs."""
    with closing(sqlite3.connect(stack.home / "airflow.db", timeout=60)) as conn:
        conn.row_factory = sqlite3.Row
        rows = conn.execute("select task_id, try_number, attempt_epoch, state, resolution, detail from "
                            "leoflow_attempt where dag_id=? and run_id=? order by id", (dag_id, run_id)).fetchall()
    return [dict(row) for row in rows]


def _is_backpressure(row: dict, what: str) -> bool:
    return row["resolution"] == "launch_failed" and (row["detail"] or "").startswith("backpressure creating pod") \
        and what in row["detail"]


def _backpressured_all(stack: AirflowStack, run_id: str, what: str) -> list[dict] | None:
    """The run's ledger rows once every task has at least one launch that the cluster answered with
    backpressure naming ``what``; None before."""
    rows = _ledger(stack, BACKPRESSURE_DAG, run_id)
    seen = {row["task_id"] for row in rows if _is_backpressure(row, what)}
    return rows if seen >= set(TASKS) else None


def _bodies(stack: AirflowStack, run_id: str) -> Counter:
    """How many times each task's body ran in ``run_id`` ({task_id: count}), from its trace lines."""
    path = stack.traces_dir / "backpressure.txt"
    lines = path.read_text().splitlines() if path.exists() else []
    return Counter(line.split()[1] for line in lines if line.split()[0] == run_id)


def _run_pods(env: Env, dag_id: str, before: set[str]) -> list[str]:
    """Names of the pods of ``dag_id`` the namespace has held (deleted ones included) not in ``before`` (uids)."""
    return sorted(versions[-1]["metadata"]["name"] for uid, versions in env.kube.pods().items()
                  if uid not in before and versions[-1]["metadata"].get("labels", {}).get("leoflow.io/dag-id") == dag_id)


def _assert_waiting(env: Env, run_id: str, what: str, before: set[str]) -> None:
    """While the cluster says "not now": every task is QUEUED at try 1, no pod of the run exists, and every
    launch of the run so far ended as backpressure naming ``what`` (none failed, none got a pod)."""
    tis = {ti["task_id"]: (ti["state"], ti["try_number"]) for ti in env.stack.task_instances(BACKPRESSURE_DAG, run_id)}
    assert tis == {t: ("queued", 1) for t in TASKS}
    assert _run_pods(env, BACKPRESSURE_DAG, before) == []
    rows = _ledger(env.stack, BACKPRESSURE_DAG, run_id)
    # a launch that ended was refused naming ``what``; one still open is a create in flight (a re-offer after
    # Retry-After), never one that got a pod
    assert [r for r in rows if r["state"] == "closed" and not _is_backpressure(r, what)] == []
    assert [r for r in rows if r["state"] not in ("closed", "claimed")] == []
    assert {r["try_number"] for r in rows} == {1}
    assert _bodies(env.stack, run_id) == Counter()


def _assert_each_ran_once(env: Env, run_id: str, before: set[str]) -> None:
    """After the cluster frees: the run succeeded, every task at try 1, each body ran exactly once, one pod per
    task, and of each task's launches exactly one was dispatched (the others were backpressure)."""
    assert env.stack.wait_for_run(BACKPRESSURE_DAG, run_id, timeout=RUN_TIMEOUT) == "success"
    tis = {ti["task_id"]: (ti["state"], ti["try_number"]) for ti in env.stack.task_instances(BACKPRESSURE_DAG, run_id)}
    assert tis == {t: ("success", 1) for t in TASKS}
    assert _bodies(env.stack, run_id) == Counter({t: 1 for t in TASKS})
    assert len(_run_pods(env, BACKPRESSURE_DAG, before)) == len(TASKS)
    rows = _ledger(env.stack, BACKPRESSURE_DAG, run_id)
    dispatched = Counter(r["task_id"] for r in rows if r["resolution"] != "launch_failed")
    assert dispatched == Counter({t: 1 for t in TASKS})
    # every launch without a pod was backpressure (a create racing the release may meet another transient
    # answer than ``what``: the quota controller's "status unknown for quota" right after the patch)
    assert [r for r in rows if r["resolution"] == "launch_failed" and not _is_backpressure(r, "")] == []


def _trigger(env: Env) -> tuple[str, set[str]]:
    """Trigger the ten-task DAG; returns its run_id and the uids of the pods the namespace held before."""
    before = set(env.kube.pods())
    return env.stack.trigger(BACKPRESSURE_DAG), before


# ---------------------------------------------------------------------------------------------------- quota


def _filler_pod(name: str, node_name: str):
    """A pod that never starts, compliant with ``restricted``: it holds one pod of the quota for as long as it
    exists. It is bound to the stack's Node (``node_name``): the harness leaves it alone (it has no harness label),
    the real node cannot pull its image (``ErrImagePull``: :data:`FILLER_IMAGE` names no registry that answers); a
    Node that does not exist would not do: the control plane's PodGC deletes a pod bound to a missing Node after
    40-60 s."""
    from kubernetes import client

    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1PodSpec(
            node_name=node_name,
            security_context=client.V1PodSecurityContext(run_as_non_root=True, run_as_user=1000,
                                                         seccomp_profile=client.V1SeccompProfile(type="RuntimeDefault")),
            containers=[client.V1Container(
                name="c", image=FILLER_IMAGE, security_context=client.V1SecurityContext(
                    allow_privilege_escalation=False, capabilities=client.V1Capabilities(drop=["ALL"])))]))


def test_a_full_resource_quota_keeps_ten_tasks_queued_then_each_runs_once(env: Env) -> None:
    """A ResourceQuota whose one pod is taken (a filler pod nobody runs): every create of the ten tasks is
    refused ``exceeded quota``, which is backpressure. Once every task has met it, all ten are still QUEUED at
    try 1, no pod of the run exists and nothing failed, and the executor's dispatches of the re-offered tasks
    were answered backpressure (the runtime's create back-off is closed: ``leoflow.dispatch.backpressure`` at
    the StatsD listener). The quota is raised: the run succeeds, every task at try 1, each body ran exactly
    once."""
    from kubernetes import client

    core, ns = _core(env), env.kube.namespace
    core.create_namespaced_resource_quota(ns, client.V1ResourceQuota(
        metadata=client.V1ObjectMeta(name="full"), spec=client.V1ResourceQuotaSpec(hard={"pods": "1"})))
    # a pod admitted before the quota controller gave the quota its status is charged only at its full resync
    wait_for(lambda: (core.read_namespaced_resource_quota("full", ns).status.hard or {}).get("pods") == "1",
             30, what="the quota controller to give the quota its status")
    core.create_namespaced_pod(ns, _filler_pod("quota-filler", env.kube.node_name))
    try:
        wait_for(lambda: (core.read_namespaced_resource_quota("full", ns).status.used or {}).get("pods") == "1",
                 30, what="the quota to count the filler pod")
        run_id, before = _trigger(env)
        wait_for(lambda: _backpressured_all(env.stack, run_id, "exceeded quota"), BACKPRESSURE_TIMEOUT,
                 what="every task's pod create to meet the full quota")
        _assert_waiting(env, run_id, "exceeded quota", before)
        # ten refusals in a row close the create back-off for up to 30 s (BACKOFF_MAX_SECONDS): the re-offered
        # tasks' next dispatch is answered from it
        want = {"leoflow.dispatch.backpressure"}
        assert want <= env.statsd.wait_names(want, timeout=30), env.statsd.names("airflow.")
        core.patch_namespaced_resource_quota("full", ns, {"spec": {"hard": {"pods": "100"}}})
        _assert_each_ran_once(env, run_id, before)
    finally:
        core.delete_namespaced_resource_quota("full", ns)
        core.delete_namespaced_pod("quota-filler", ns, grace_period_seconds=0)


# ---------------------------------------------------------------------------------------------------- APF 429


class _SeatHolder:
    """Keeps one request executing in a priority level: a validating admission webhook (HTTPS on 127.0.0.1,
    a self-signed certificate) that holds each ConfigMap create labelled :data:`HOLD_LABEL` until
    :meth:`release` or :data:`HOLD_SECONDS`. API Priority and Fairness counts the create as executing (its
    seat is taken) for as long as admission runs, so a level of zero seats rejects every other request of the
    level meanwhile (``queueset.canAccommodateSeatsLocked`` admits over the limit only when nothing executes).
    """

    def __init__(self, workdir: Path) -> None:
        self.held = threading.Event()
        self._release = threading.Event()
        self.timed_out = False
        cert, key = _self_signed(workdir)
        self.ca_bundle = base64.b64encode(cert.read_bytes()).decode()
        holder = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                holder.held.set()
                if not holder._release.wait(HOLD_SECONDS):
                    holder.timed_out = True
                body = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                                   "response": {"uid": review["request"]["uid"], "allowed": True}}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert, key)
        self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
        self.url = f"https://127.0.0.1:{self.server.server_address[1]}/hold"
        self._thread = threading.Thread(target=self.server.serve_forever, name="apf-seat-holder", daemon=True)
        self._thread.start()

    @property
    def released(self) -> bool:
        """Whether :meth:`release` (or :meth:`close`) was called."""
        return self._release.is_set()

    def release(self) -> None:
        """Let the held request (and any later one) through at once."""
        self._release.set()

    def close(self) -> None:
        """Release, stop serving, close the socket."""
        self._release.set()
        self.server.shutdown()
        self.server.server_close()


def _self_signed(workdir: Path) -> tuple[Path, Path]:
    """A self-signed certificate for IP 127.0.0.1 (its own CA bundle) and its key, as PEM files."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "leoflow-apf-holder")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(hours=2))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = workdir / "holder.crt", workdir / "holder.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    key_path.chmod(0o600)
    return cert_path, key_path


def test_an_apf_429_keeps_ten_tasks_queued_then_each_runs_once(env: Env) -> None:
    """A FlowSchema sends the scheduler's pod creates (its ServiceAccount) and a test user's labelled ConfigMap
    creates to a priority level of zero seats that rejects; a ConfigMap create held in admission keeps the
    level's one request executing, so every pod create of the ten tasks is answered 429 (backpressure). Once
    every task has met it, all ten are still QUEUED at try 1, no pod of the run exists and nothing failed. The
    FlowSchema is deleted and the hold released: the run succeeds, every task at try 1, each body ran once."""
    from kubernetes import client, config

    api, ns, kenv = env.kube.api, env.kube.namespace, env.kube.env
    rbac, fc = client.RbacAuthorizationV1Api(api), client.FlowcontrolApiserverV1Api(api)
    admission = client.AdmissionregistrationV1Api(api)
    rbac.create_namespaced_role(ns, client.V1Role(metadata=client.V1ObjectMeta(name="apf-holder"), rules=[
        client.V1PolicyRule(api_groups=[""], resources=["configmaps"], verbs=["create"])]))
    rbac.create_namespaced_role_binding(ns, client.V1RoleBinding(
        metadata=client.V1ObjectMeta(name="apf-holder"),
        role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="Role", name="apf-holder"),
        subjects=[client.RbacV1Subject(kind="User", name=kenv.test_user, api_group="rbac.authorization.k8s.io")]))
    user_api = config.new_client_from_config(config_file=str(kenv.user_kubeconfig))
    user_core = client.CoreV1Api(user_api)
    suffix = uuid.uuid4().hex[:6]
    level, schema, hook = f"leoflow-reject-{suffix}", f"leoflow-scheduler-{suffix}", f"leoflow-apf-hold-{suffix}"
    holder = _SeatHolder(env.work)
    created: list[tuple] = []
    try:
        fc.create_priority_level_configuration(client.V1PriorityLevelConfiguration(
            metadata=client.V1ObjectMeta(name=level),
            spec=client.V1PriorityLevelConfigurationSpec(type="Limited", limited=client.V1LimitedPriorityLevelConfiguration(
                nominal_concurrency_shares=0, lendable_percent=0, borrowing_limit_percent=0,
                limit_response=client.V1LimitResponse(type="Reject")))))
        created.append((fc.delete_priority_level_configuration, level))
        flow = fc.create_flow_schema(client.V1FlowSchema(
            metadata=client.V1ObjectMeta(name=schema),
            spec=client.V1FlowSchemaSpec(
                matching_precedence=100,
                priority_level_configuration=client.V1PriorityLevelConfigurationReference(name=level),
                distinguisher_method=client.V1FlowDistinguisherMethod(type="ByUser"),
                rules=[
                    client.V1PolicyRulesWithSubjects(
                        subjects=[client.FlowcontrolV1Subject(kind="ServiceAccount", service_account=
                                                              client.V1ServiceAccountSubject(
                                                                  name=SCHEDULER_SERVICE_ACCOUNT, namespace=ns))],
                        resource_rules=[client.V1ResourcePolicyRule(api_groups=[""], resources=["pods"],
                                                                    verbs=["create"], namespaces=[ns])]),
                    client.V1PolicyRulesWithSubjects(
                        subjects=[client.FlowcontrolV1Subject(kind="User",
                                                              user=client.V1UserSubject(name=kenv.test_user))],
                        resource_rules=[client.V1ResourcePolicyRule(api_groups=[""], resources=["configmaps"],
                                                                    verbs=["create"], namespaces=[ns])]),
                ])))
        created.append((fc.delete_flow_schema, schema))
        admission.create_validating_webhook_configuration(client.V1ValidatingWebhookConfiguration(
            metadata=client.V1ObjectMeta(name=hook),
            webhooks=[client.V1ValidatingWebhook(
                name="hold.leoflow.test", admission_review_versions=["v1"], side_effects="None",
                timeout_seconds=30, failure_policy="Ignore",
                client_config=client.AdmissionregistrationV1WebhookClientConfig(url=holder.url,
                                                                               ca_bundle=holder.ca_bundle),
                object_selector=client.V1LabelSelector(match_labels={HOLD_LABEL: suffix}),
                rules=[client.V1RuleWithOperations(operations=["CREATE"], api_groups=[""], api_versions=["v1"],
                                                   resources=["configmaps"], scope="Namespaced")])]))
        created.append((admission.delete_validating_webhook_configuration, hook))

        def user_create(labels: dict[str, str] | None = None) -> str:
            """Create a ConfigMap as the test user; the FlowSchema's UID APF put it under."""
            answer = user_core.create_namespaced_config_map_with_http_info(ns, client.V1ConfigMap(
                metadata=client.V1ObjectMeta(name=f"cm-{uuid.uuid4().hex[:8]}", labels=labels), data={"k": "v"}))
            headers = answer.headers if hasattr(answer, "headers") else answer[2]
            return {k.lower(): v for k, v in (headers or {}).items()}.get("x-kubernetes-pf-flowschema-uid", "")

        # the API server applies APF and webhook configuration asynchronously: wait until both are in force
        wait_for(lambda: user_create() == flow.metadata.uid, 30, what="APF to classify by the new FlowSchema")

        def hold() -> None:
            while not holder.held.is_set() and not holder.released:
                user_create({HOLD_LABEL: suffix})  # returns at once while the webhook is not in force yet

        holding = threading.Thread(target=hold, name="apf-hold", daemon=True)
        holding.start()
        assert holder.held.wait(30), "the admission webhook was never called"

        run_id, before = _trigger(env)
        wait_for(lambda: _backpressured_all(env.stack, run_id, "Too many requests"), HOLD_SECONDS - 2,
                 what="every task's pod create to be answered 429 while the seat is held")
        _assert_waiting(env, run_id, "Too many requests", before)
        assert not holder.timed_out, "the hold ended before the checks: the 429s were not all under it"
        fc.delete_flow_schema(schema)
        created.remove((fc.delete_flow_schema, schema))
        holder.release()
        holding.join(40)
        _assert_each_ran_once(env, run_id, before)
    finally:
        holder.close()
        for delete, name in reversed(created):
            delete(name)
        rbac.delete_namespaced_role_binding("apf-holder", ns)
        rbac.delete_namespaced_role("apf-holder", ns)
        user_api.close()


# ---------------------------------------------------------------------------------------------------- PodSecurity


def test_a_pod_security_violating_override_fails_at_once_with_the_reason(env: Env) -> None:
    """``as_root``'s pod_override asks for ``runAsUser: 0`` (let through by ``pod_override_allow``): the API
    server's Pod Security admission refuses the pod, so the task fails at once at try 1 (one launch in the
    ledger, no pod ever existed, its body never ran), and the reason, naming PodSecurity and ``runAsUser=0``,
    is in the task's audit log as the API serves it (``/eventLogs``: the UI's Audit Log; the scheduler writes
    the executor's reason there) and in its task log (the UI's Logs tab: the attempt never started, so the
    only line there is leoflow's note, ``leoflow_airflow.task_log``)."""
    before = set(env.kube.pods())
    run_id = env.stack.trigger(PODSECURITY_DAG)
    assert env.stack.wait_for_run(PODSECURITY_DAG, run_id, timeout=RUN_TIMEOUT) == "failed"
    [ti] = env.stack.task_instances(PODSECURITY_DAG, run_id)
    assert (ti["task_id"], ti["state"], ti["try_number"]) == ("as_root", "failed", 1)
    [row] = _ledger(env.stack, PODSECURITY_DAG, run_id)
    assert (row["try_number"], row["attempt_epoch"], row["resolution"]) == (1, 1, "launch_failed")
    assert "violates PodSecurity" in row["detail"] and "runAsUser=0" in row["detail"], row["detail"]
    assert _run_pods(env, PODSECURITY_DAG, before) == []
    assert not (env.stack.traces_dir / "podsecurity.txt").exists()
    events = env.stack._call("GET", "/eventLogs", params={"dag_id": PODSECURITY_DAG, "run_id": run_id,
                                                          "task_id": "as_root", "limit": 100})
    said = [e.get("extra") or "" for e in events["event_logs"]]
    assert [s for s in said if "violates PodSecurity" in s and "runAsUser=0" in s], said
    body = env.stack._call("GET", f"/dags/{PODSECURITY_DAG}/dagRuns/{run_id}/taskInstances/as_root/logs/1",
                           headers={"accept": "application/json"})
    lines = [c.get("event", "") for c in body["content"] if isinstance(c, dict)]
    assert [e for e in lines if "violates PodSecurity" in e and "runAsUser=0" in e], body
