"""Wiring shared by the token-exchange tests of the k8s tier: ServiceAccounts, least-privilege RBAC for the
api-server's Kubernetes identity and a kubeconfig for it, task pods carrying an identity annotation, and their
TokenRequest tokens (bound to the pod, as the kubelet projects them)."""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Callable
from pathlib import Path

from kubernetes import client

from leoflow_airflow.ledger.states import AttemptRef, AttemptState
from leoflow_airflow.runtime.kubernetes.identity import IDENTITY_ANNOTATION, identity_annotation

from .conftest import wait_for

AUDIENCE = "leoflow-exchange-test"
"""``[leoflow] exchange_audience`` of these tests."""
TASK_SA = "leoflow-task"
"""``[leoflow] service_account``: the task pods' ServiceAccount."""
API_SA = "leoflow-api"
"""The api-server's Kubernetes identity: ``create tokenreviews`` (cluster) and ``get pods`` (namespace) only."""
OTHER_SA = "other"
"""Another ServiceAccount of the namespace."""


def workload_json(ti_id: str) -> str:
    """An ``ExecuteTask`` of ``ti_id`` as the ledger stores it (token stripped)."""
    from airflow.executors.workloads import BundleInfo, ExecuteTask
    from airflow.executors.workloads.task import TaskInstanceDTO

    ti = TaskInstanceDTO(id=uuid.UUID(ti_id), task_id="task", dag_id="dag", run_id="run", try_number=1,
                         dag_version_id=uuid.uuid4(), map_index=-1, pool_slots=1, priority_weight=1, queue="default")
    return ExecuteTask(token="", dag_rel_path="dag.py", bundle_info=BundleInfo(name="dags"), log_path="x.log",
                       ti=ti).model_dump_json(exclude={"token"})


def jwt_claims(token: str) -> dict:
    """The unverified payload of a JWT (to read the jti of a ServiceAccount token)."""
    payload = token.split(".")[1]
    return json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))


def sar_allowed(api: client.ApiClient, user: str, namespace: str, *, verb: str, resource: str,
                group: str = "") -> bool:
    """SubjectAccessReview: may ServiceAccount user ``user`` do ``verb`` on ``resource`` in ``namespace``?"""
    review = client.AuthorizationV1Api(api).create_subject_access_review(client.V1SubjectAccessReview(
        spec=client.V1SubjectAccessReviewSpec(user=user, groups=["system:serviceaccounts",
                                                                 f"system:serviceaccounts:{namespace}"],
                                              resource_attributes=client.V1ResourceAttributes(
                                                  namespace=namespace, verb=verb, resource=resource, group=group))))
    return bool(review.status.allowed)


def wire_namespace(api: client.ApiClient, core: client.CoreV1Api, namespace: str, k8s_env,
                   kubeconfig_path: Path) -> tuple[Path, Callable[[], None]]:
    """Create the three ServiceAccounts and the api-server's least-privilege grants, wait until RBAC applies
    them (and refuses more), write the api-server's kubeconfig; return it and a cleanup of the cluster-scoped
    objects (the namespaced ones go with the namespace)."""
    for name in (TASK_SA, API_SA, OTHER_SA):
        core.create_namespaced_service_account(namespace, client.V1ServiceAccount(
            metadata=client.V1ObjectMeta(name=name)))
    rbac = client.RbacAuthorizationV1Api(api)
    cluster_name = f"leoflow-exchange-{namespace}"
    rbac.create_cluster_role(client.V1ClusterRole(metadata=client.V1ObjectMeta(name=cluster_name), rules=[
        client.V1PolicyRule(api_groups=["authentication.k8s.io"], resources=["tokenreviews"], verbs=["create"])]))
    subject = client.RbacV1Subject(kind="ServiceAccount", name=API_SA, namespace=namespace)
    rbac.create_cluster_role_binding(client.V1ClusterRoleBinding(
        metadata=client.V1ObjectMeta(name=cluster_name), subjects=[subject],
        role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="ClusterRole", name=cluster_name)))
    rbac.create_namespaced_role(namespace, client.V1Role(metadata=client.V1ObjectMeta(name="leoflow-exchange"), rules=[
        client.V1PolicyRule(api_groups=[""], resources=["pods"], verbs=["get"])]))
    rbac.create_namespaced_role_binding(namespace, client.V1RoleBinding(
        metadata=client.V1ObjectMeta(name="leoflow-exchange"), subjects=[subject],
        role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="Role", name="leoflow-exchange")))
    user = f"system:serviceaccount:{namespace}:{API_SA}"
    wait_for(lambda: sar_allowed(api, user, namespace, verb="create", resource="tokenreviews",
                                 group="authentication.k8s.io")
             and sar_allowed(api, user, namespace, verb="get", resource="pods"), 30, what="RBAC grants")
    assert not sar_allowed(api, user, namespace, verb="list", resource="pods")
    assert not sar_allowed(api, user, namespace, verb="get", resource="secrets")

    sa_kubeconfig(core, k8s_env, namespace, API_SA, kubeconfig_path)

    def unwire() -> None:
        rbac.delete_cluster_role_binding(cluster_name)
        rbac.delete_cluster_role(cluster_name)

    return kubeconfig_path, unwire


def sa_kubeconfig(core: client.CoreV1Api, k8s_env, namespace: str, sa_name: str, path: Path) -> Path:
    """Write to ``path`` (and return it) a kubeconfig of the control plane authenticating as ServiceAccount
    ``namespace/sa_name`` with a TokenRequest token valid 1 h, so what it may do is RBAC's real answer."""
    token = core.create_namespaced_service_account_token(sa_name, namespace, client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=3600))).status.token
    cfg = json.loads(Path(k8s_env.kubeconfig).read_text())
    cfg["users"] = [{"name": sa_name, "user": {"token": token}}]
    cfg["contexts"] = [{"name": "k8senv", "context": {"cluster": "k8senv", "user": sa_name}}]
    path.write_text(json.dumps(cfg))
    return path


def make_pod(core: client.CoreV1Api, namespace: str, ref: AttemptRef, *, node: str, name: str | None = None,
             sa_name: str = TASK_SA, finalizers: list[str] | None = None) -> client.V1Pod:
    """A pod carrying ``ref``'s identity annotation, bound to ``node``, running as ``sa_name``, no token
    automounted."""
    name = name or f"t-{ref.ti_id[:8]}-{ref.attempt_epoch}"
    return core.create_namespaced_pod(namespace, client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, annotations={IDENTITY_ANNOTATION: identity_annotation(ref)},
                                     finalizers=finalizers),
        spec=client.V1PodSpec(
            node_name=node, service_account_name=sa_name, restart_policy="Never",
            automount_service_account_token=False,
            containers=[client.V1Container(name="agent", image="leoflow.test/none:0")])))


def pod_token(core: client.CoreV1Api, namespace: str, pod: client.V1Pod, *, audiences: list[str] | None = None,
              sa_name: str = TASK_SA) -> str:
    """A TokenRequest token of ``sa_name`` bound to ``pod`` (600 s), as the kubelet projects one."""
    return core.create_namespaced_service_account_token(sa_name, namespace, client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(
            audiences=audiences or [AUDIENCE], expiration_seconds=600,
            bound_object_ref=client.V1BoundObjectReference(kind="Pod", api_version="v1", name=pod.metadata.name,
                                                           uid=pod.metadata.uid)))).status.token


def kube_attempt(store, *, ti_id: str | None = None, state: AttemptState = AttemptState.DISPATCHED) -> AttemptRef:
    """A Kubernetes attempt of ``ti_id`` (default: a new one) in the ledger ``store`` (a ``LedgerStore``),
    CLAIMED and then moved to ``state``, with a stored workload (:func:`workload_json`)."""
    ti_id = ti_id or str(uuid.uuid4())
    a = store.claim_epoch(ti_id=ti_id, try_number=1, dag_id="dag", task_id="task", run_id="run", map_index=-1,
                          runtime="kubernetes", workload_json=workload_json(ti_id), scheduler_job_id=1)
    if state is not AttemptState.CLAIMED:
        assert store.transition(a.ref, expected=[AttemptState.CLAIMED], to=state)
    return a.ref


def make_warm_pod(core: client.CoreV1Api, namespace: str, *, node: str, version: str | None = None,
                  labels: dict[str, str] | None = None, sa_name: str = TASK_SA, finalizers: list[str] | None = None,
                  name: str | None = None, job_id: str = "1", anchored: bool = True) -> client.V1Pod:
    """A warm pod as leoflow makes one (k8s review §1: the registration takes no other): named
    ``warm_pod_name(job_id, version)`` (or ``name``), labels ``leoflow.io/warm=true``, ``leoflow.io/dag-version``
    (``version`` or a new uuid) and ``leoflow.io/scheduler-job`` (``labels`` replaces them all), and, when
    ``anchored``, owned (controller) by its anchor ConfigMap, created here unless it exists; bound to ``node``,
    running as ``sa_name``, no token automounted."""
    from leoflow_airflow.runtime.kubernetes import warmpods

    version = version or str(uuid.uuid4())
    if labels is None:
        labels = {"app.kubernetes.io/managed-by": "leoflow", "leoflow.io/warm": "true",
                  "leoflow.io/dag-version": version, "leoflow.io/scheduler-job": job_id}
    owners = None
    if anchored:
        anchor = warmpods.build_anchor(job_id, version, namespace, instance="test")
        try:
            made = core.create_namespaced_config_map(namespace, anchor)
        except client.ApiException as exc:
            if exc.status != 409:
                raise
            made = core.read_namespaced_config_map(anchor.metadata.name, namespace)
        owners = [client.V1OwnerReference(api_version="v1", kind="ConfigMap", name=made.metadata.name,
                                          uid=made.metadata.uid, controller=True, block_owner_deletion=False)]
    return core.create_namespaced_pod(namespace, client.V1Pod(
        metadata=client.V1ObjectMeta(name=name or warmpods.warm_pod_name(job_id, version), labels=labels,
                                     finalizers=finalizers, owner_references=owners),
        spec=client.V1PodSpec(node_name=node, service_account_name=sa_name, restart_policy="Never",
                              automount_service_account_token=False,
                              containers=[client.V1Container(name="agent", image="leoflow.test/none:0")])))


def drop_finalizers(core: client.CoreV1Api, namespace: str) -> None:
    """Take every finalizer off the pods of ``namespace``, so held pods go with their namespace."""
    for pod in core.list_namespaced_pod(namespace).items:
        if pod.metadata.finalizers:
            core.patch_namespaced_pod(pod.metadata.name, namespace, {"metadata": {"finalizers": None}})
