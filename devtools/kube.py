"""A Kubernetes for a real Airflow with ``[leoflow] runtime = kubernetes``, on this machine, without a cluster.

:class:`KubeStack` brings up, in order:

1. the k8s binaries (``scripts/k8senv build``: cached in ``~/.cache/leoflow-k8senv``, instant once built) and a
   control plane (``scripts/k8senv start``: etcd, kube-apiserver, kube-controller-manager, kwok), or reuses one
   already started (``reuse_dir``, as ``K8SENV_DIR`` does for the k8s tier);
2. the task namespace, labelled ``pod-security.kubernetes.io/enforce=restricted`` (``latest``) from its
   creation, so the API server's Pod Security admission refuses any task pod below the ``restricted`` level, and
   the task pods' ServiceAccount (:data:`TASK_SERVICE_ACCOUNT`);
3. a recorder that keeps every version of every pod of the namespace as the API server returned it (JSON), so
   pods that leoflow has already deleted can still be inspected (:meth:`KubeStack.pods`);
4. the node harness (``tests/k8s/harness.py``) serving Node :data:`HARNESS_NODE`: it plays the kubelet for pods
   bound to that Node and labelled ``leoflow.test/harness=harness-node``, running each container's
   ``command + args`` as a local process (the image is ignored) with the pod's env and projected token.

:meth:`KubeStack.configure` then points an :class:`~devtools.stack.AirflowStack` at it: it writes the pod
template (``nodeName`` and the harness label come from it, as a user's would) and a separate pod-side Airflow
home whose ``airflow.cfg`` holds no credential, and adds the ``[leoflow]`` options to the stack's environment.

What the harness cannot do, and what stands in for it:

* It runs every process as root in its own mount namespace and ignores ``securityContext``. The template still
  asks for ``runAsUser: 50000`` (the uid of the official Airflow image), as a real cluster needs: the builder pins
  ``runAsNonRoot: true``, which a kubelet refuses to start as uid 0. Pod Security admission (the API server's) is
  real and judges the pod as created.
* It ignores the image: ``command: ["/usr/bin/env"]`` with ``PATH`` starting at the project's venv makes the
  builder's ``args`` (``python -m leoflow_agent pod``) run the venv's Python, which has leoflow and the DAGs'
  dependencies, as the image would.
* Pods share the host's filesystem: the pod-side ``AIRFLOW_HOME`` is a directory of the Airflow home, its
  ``traces`` a link to the scheduler side's (callback traces, ``dags/leoflow_callbacks.py``), its log folder the
  scheduler side's ``logs`` (so the UI shows task logs, as a shared log volume or remote logging would).

Typical use (``devtools.demo --runtime kubernetes``, ``tests/integration/test_kube_runtime_e2e.py``)::

    with KubeStack(workdir) as kube:
        stack = AirflowStack(home, executor=LEOFLOW_EXECUTOR, example_dags=...)
        kube.configure(stack)
        stack.migrate(); stack.start(...)
        ...
        stack.stop()
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from devtools import k8senv
from devtools.k8senv import K8sEnv
from devtools.stack import REPO_ROOT, AirflowStack

HARNESS_NODE = "harness-node"
"""The Node the harness serves; the pod template binds every task pod to it (k8senv runs no scheduler)."""
HARNESS_LABEL = "leoflow.test/harness"
"""The label the harness selects its pods by (value :data:`HARNESS_NODE`)."""
TASK_SERVICE_ACCOUNT = "leoflow-task"
"""``[leoflow] service_account``: the ServiceAccount the task pods run as."""
SCHEDULER_SERVICE_ACCOUNT = "leoflow-scheduler"
"""The ServiceAccount :meth:`KubeStack.scheduler_kubeconfig` makes for the scheduler and api-server."""
PLACEHOLDER_IMAGE = "leoflow.test/agent:harness"
"""``[leoflow] image``: required by the API server's validation, ignored by the harness."""
POD_RUN_AS_USER = 50000
"""The template's ``runAsUser`` (the official Airflow image's uid): what ``runAsNonRoot`` needs on a real node."""
PSA_RESTRICTED = {"pod-security.kubernetes.io/enforce": "restricted",
                  "pod-security.kubernetes.io/enforce-version": "latest"}
"""Labels of the task namespace: Pod Security admission enforces ``restricted`` on every task pod."""
LEOFLOW_EXECUTOR = "leoflow_airflow.executor.LeoflowExecutor"
NODES = ("harness", "real")
"""What runs the task pods: the node harness (a kubelet stand-in, processes on this machine) or the real node
(``scripts/k8senv start --real-node``: a kubelet and containerd running leoflow's agent image)."""
REAL_POD_HOME = "/tmp/airflow-home"
"""On the real node: the task pods' ``AIRFLOW_HOME`` (an emptyDir; their ``airflow.cfg`` comes from a ConfigMap)."""
REAL_POD_CPU_REQUEST = "100m"
"""On the real node: the agent container's CPU request (:func:`real_pod_template`)."""
POD_CONFIG_MAP = "leoflow-pod-airflow-cfg"
DAGS_CONFIG_MAP = "leoflow-dags"
SHARED_CLAIM = "leoflow-shared"
"""On the real node: the PersistentVolumeClaim of the stack's home (a hostPath PersistentVolume), mounted with
``subPath`` ``logs`` and ``traces``, as a shared log volume is in Airflow's own chart (restricted pods may not
mount a hostPath themselves; a claim they may)."""


def require_binaries() -> None:
    """For test modules that bring a :class:`KubeStack` up: skip the calling test (``pytest.skip``) when the
    k8s binaries are not built and no control plane is given (``K8SENV_DIR``); fail it instead
    (``pytest.fail``) when ``K8SENV_REQUIRED=1`` (CI), as the k8s tier does."""
    import pytest

    if os.environ.get("K8SENV_DIR") or k8senv.bindir() is not None:
        return
    msg = "k8senv binaries are not built; run `scripts/k8senv build`"
    if os.environ.get("K8SENV_REQUIRED") == "1":
        pytest.fail(msg)
    pytest.skip(msg)


class KubeStackError(RuntimeError):
    """The Kubernetes side could not be brought up; the message says which part and where its log is."""


class KubeStack:
    """A control plane, a restricted task namespace with its ServiceAccount, a pod recorder and the node harness
    (module docstring). Use as a context manager, or call :meth:`start` and :meth:`stop`.

    :param workdir: a directory this object owns (created): the control plane's state and logs
        (``k8senv/``), the harness's per-pod directories (``harness/``: each container's log is
        ``harness/<namespace>.<pod>.*/base.log``).
    :param namespace: prefix of the task namespace's name (a random suffix keeps reused control planes apart).
    :param reuse_dir: the ``--dir`` of a control plane already started with ``scripts/k8senv start``; it is
        then neither built, started nor stopped here.
    :param venv: the virtualenv whose ``bin/python`` the pods run.
    :param build: build the k8s binaries when missing (minutes, once); False: raise :class:`KubeStackError`.
    :param node: ``"harness"`` (default) or ``"real"``: task pods run on the real node, in leoflow's agent image
        (built by ``scripts/k8senv image``), and reach the Airflow api-server at the node's bridge address
        (:attr:`api_host`); DAG files and the pod-side ``airflow.cfg`` reach them as ConfigMaps. Needs root.
    """

    def __init__(self, workdir: Path, *, namespace: str = "leoflow-tasks", reuse_dir: Path | None = None,
                 venv: Path = REPO_ROOT / ".venv", build: bool = True, node: str = "harness") -> None:
        if node not in NODES:
            raise ValueError(f"node must be one of {NODES}, not {node!r}")
        self.node = node
        self.image = PLACEHOLDER_IMAGE
        self.node_name = HARNESS_NODE
        self.workdir = Path(workdir).resolve()
        self.namespace = f"{namespace}-{uuid.uuid4().hex[:6]}"
        self.service_account = TASK_SERVICE_ACCOUNT
        self.reuse_dir = None if reuse_dir is None else Path(reuse_dir).resolve()
        self.venv = Path(venv).absolute()  # not resolved: .venv/bin/python is a link to the base interpreter
        self.build = build
        self.env: K8sEnv | None = None
        self.api: Any = None
        self.harness: Any = None
        self.pod_template_file: Path | None = None
        self.pod_home: Path | None = None
        self._started_dir: Path | None = None
        self._recorded: dict[str, dict[str, dict]] = {}  # uid -> resourceVersion -> pod JSON
        self._recorded_lock = threading.Lock()
        self._recorder_errors: list[str] = []
        self._recorder_rv: str | None = None
        self._stop_recorder = threading.Event()
        self._recorder_stream: Any = None  # the recorder's current kubernetes.watch.Watch, stopped by stop()
        self._recorder: threading.Thread | None = None
        self._cluster_objects: list[tuple[str, str]] = []  # (kind, name) created here, cluster-scoped
        self._published = 0  # real node: how many stacks' pod files were published (real_pod_template_for)
        self.scheduler_user: str | None = None

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> KubeStack:
        """Bring everything up (module docstring, 1-4); returns self.

        Raises :class:`KubeStackError` naming what failed (binaries, control plane, namespace, harness: e.g. no
        root for ``unshare``); whatever was started by then is stopped again.
        """
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        from kubernetes import client, config

        self.workdir.mkdir(parents=True, exist_ok=True)
        if not (self.venv / "bin" / "python").exists():
            raise KubeStackError(f"no Python at {self.venv}/bin/python for the task pods; run `make venv`")
        real = self.node == "real"
        images: tuple[Path, ...] = ()
        if self.reuse_dir is not None:
            self.env = K8sEnv.load(self.reuse_dir, 0.0)
            if real and self.env.real_node is None:
                raise KubeStackError(f"the control plane of {self.reuse_dir} has no real node (start --real-node)")
        else:
            built = k8senv.bindir() is not None
            if not built and not self.build:
                raise KubeStackError("the k8s binaries are not built; run `scripts/k8senv build`")
            if not built or real:  # the real node's binaries and images: built once, then checked in a moment
                if not built:
                    print("kube: building the k8s binaries (once, about 6.5 min on 2 cores)", flush=True)
                try:
                    k8senv.build(with_node=real)
                except k8senv.K8sEnvError as exc:
                    raise KubeStackError(str(exc)) from None
            self._started_dir = self.workdir / "k8senv"
            try:
                if real:
                    archive, self.image = k8senv.agent_image()
                    images = (archive,)
                self.env = k8senv.start(self._started_dir, real_node=real, images=images)
            except k8senv.K8sEnvError as exc:
                self._started_dir = None
                raise KubeStackError(f"{exc}\n(logs in {self.workdir / 'k8senv'})") from None
        if real:
            self.node_name = self.env.real_node["name"]
            if self.reuse_dir is not None:
                archive, self.image = k8senv.agent_image()  # the reused node imported it: `start --image`
        self.api = config.new_client_from_config(config_file=str(self.env.kubeconfig))
        core = client.CoreV1Api(self.api)
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(
            name=self.namespace, labels=dict(PSA_RESTRICTED))))
        core.create_namespaced_service_account(self.namespace, client.V1ServiceAccount(
            metadata=client.V1ObjectMeta(name=self.service_account)))
        self._recorder = threading.Thread(target=self._record, name="kube-pod-recorder", daemon=True)
        self._recorder.start()
        if real:
            return
        from tests.k8s.harness import HarnessError, NodeHarness

        try:
            self.harness = NodeHarness(self.api, HARNESS_NODE, self.workdir / "harness")
        except HarnessError as exc:
            raise KubeStackError(f"the node harness cannot run here: {exc}") from None
        self.harness.start()

    def stop(self) -> list[str]:
        """Stop the harness (it kills every pod process still running), the recorder and the control plane
        this object started; delete the task namespace of a reused one. Idempotent.

        Returns problems found on the way (harness errors, recorder errors, a control plane that did not stop),
        empty when clean. The pod records stay readable (:meth:`pods`).
        """
        problems: list[str] = []
        if self.harness is not None:
            self.harness.stop()
            problems.extend(f"node harness: {e}" for e in self.harness.errors)
            self.harness = None
        self._stop_recorder.set()
        if self._recorder_stream is not None:
            self._recorder_stream.stop()  # shuts the stream's socket: the recorder ends now, not at its timeout
        if self._recorder is not None:
            self._recorder.join(15)
            if self._recorder.is_alive():
                problems.append("pod recorder did not stop within 15 s")
            self._recorder = None
        problems.extend(f"pod recorder: {e}" for e in self._recorder_errors)
        self._recorder_errors.clear()
        if self.api is not None and self.reuse_dir is not None:
            from kubernetes import client
            from kubernetes.client.rest import ApiException

            core = client.CoreV1Api(self.api)
            try:
                core.delete_namespace(self.namespace)
            except ApiException as exc:
                if exc.status != 404:
                    problems.append(f"deleting namespace {self.namespace}: {exc.status} {exc.reason}")
            problems.extend(release_finalizers(core, self.namespace))
            rbac = client.RbacAuthorizationV1Api(self.api)
            for kind, name in reversed(self._cluster_objects):
                delete = {"clusterrole": rbac.delete_cluster_role, "persistentvolume": core.delete_persistent_volume
                          }.get(kind, rbac.delete_cluster_role_binding)
                try:
                    delete(name)
                except ApiException as exc:
                    if exc.status != 404:
                        problems.append(f"deleting {kind} {name}: {exc.status} {exc.reason}")
        self._cluster_objects.clear()
        if self.api is not None:
            self.api.close()
            self.api = None
        if self._started_dir is not None:
            if (err := k8senv.stop(self._started_dir)) is not None:
                problems.append(err)
            self._started_dir = None
        return problems

    def __enter__(self) -> KubeStack:
        return self.start()

    @property
    def api_host(self) -> str:
        """The address an :class:`~devtools.stack.AirflowStack` must listen on (its ``api_host``) for task pods
        to reach it: 127.0.0.1 with the harness (pods are processes here), the real node's bridge address
        (198.51.100.1) with the real node. Valid once started."""
        return self.env.real_node["ip"] if self.node == "real" and self.env is not None else "127.0.0.1"

    def __exit__(self, *exc: object) -> None:
        problems = self.stop()
        if problems and exc[0] is None:
            raise KubeStackError("; ".join(problems))

    # ------------------------------------------------------------------ Airflow configuration

    def configure(self, stack: AirflowStack) -> dict[str, str]:
        """Point ``stack`` (not yet started) at this Kubernetes: write the pod-side Airflow home and the pod
        template under ``stack.home``, and add the Airflow settings of the scheduler and api-server side to
        ``stack.extra_env`` (they win over the stack's own). Returns those settings.

        Settings: ``[core] executor`` LeoflowExecutor; ``[leoflow] runtime = kubernetes``, ``namespace``,
        ``service_account``, ``image`` (:data:`PLACEHOLDER_IMAGE`), ``pod_template_file``, ``in_cluster =
        False`` with ``kube_config`` the admin kubeconfig, ``exchange_url`` the api-server's base URL +
        ``/leoflow``. ``[api_auth] jwt_secret`` (shared by every process, so the api-server can mint at exchange)
        and ``[core] execution_api_server_url`` are the stack's own. Raises :class:`KubeStackError` before
        :meth:`start`, or when the stack has no shared ``jwt_secret``.
        """
        if self.env is None:
            raise KubeStackError("configure() needs a started KubeStack")
        if stack.api_host != self.api_host:
            raise KubeStackError(f"the stack's api-server listens on {stack.api_host}; task pods reach this machine "
                                 f"at {self.api_host}: build the AirflowStack with api_host=kube.api_host")
        base = stack.env()
        if not base.get("AIRFLOW__API_AUTH__JWT_SECRET"):
            raise KubeStackError("the stack sets no [api_auth] jwt_secret: the api-server mints each pod's token "
                                 "at exchange and every process must validate it with one shared secret")
        self.pod_home = stack.home / "pod-home"
        self.pod_home.mkdir(parents=True, exist_ok=True)
        real = self.node == "real"
        (self.pod_home / "airflow.cfg").write_text(pod_airflow_cfg(
            dags_folder=stack.dags_folder,
            bundles=base["AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST"],
            execution_api_server_url=base["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"],
            base_log_folder=Path(REAL_POD_HOME) / "logs" if real else stack.home / "logs",
        ))
        stack.traces_dir.mkdir(parents=True, exist_ok=True)
        traces = self.pod_home / "traces"
        if not traces.is_symlink():
            traces.symlink_to(stack.traces_dir, target_is_directory=True)
        self.pod_template_file = stack.home / "pod-template.yaml"
        if real:
            template = self.real_pod_template_for(stack, (self.pod_home / "airflow.cfg").read_text())
        else:
            template = pod_template(venv=self.venv, airflow_home=self.pod_home)
        self.pod_template_file.write_text(json.dumps(template, indent=2) + "\n")
        settings = {
            "AIRFLOW__CORE__EXECUTOR": LEOFLOW_EXECUTOR,
            "AIRFLOW__LEOFLOW__RUNTIME": "kubernetes",
            "AIRFLOW__LEOFLOW__NAMESPACE": self.namespace,
            "AIRFLOW__LEOFLOW__SERVICE_ACCOUNT": self.service_account,
            "AIRFLOW__LEOFLOW__IMAGE": self.image,
            "AIRFLOW__LEOFLOW__POD_TEMPLATE_FILE": str(self.pod_template_file),
            "AIRFLOW__LEOFLOW__IN_CLUSTER": "False",
            "AIRFLOW__LEOFLOW__KUBE_CONFIG": str(self.env.kubeconfig),
            "AIRFLOW__LEOFLOW__EXCHANGE_URL": f"{stack.base_url}/leoflow",
        }
        stack.extra_env.update(settings)
        return settings

    def real_pod_template_for(self, stack: AirflowStack, airflow_cfg: str) -> dict[str, Any]:
        """Real node: publish what the pods of ``stack`` mount and return their pod template
        (:func:`real_pod_template`). The pod-side ``airflow_cfg`` (text) and each DAG bundle's files (``*.py`` at its
        top) become ConfigMaps of the task namespace, and the claim of a hostPath PersistentVolume at ``stack.home``
        whose ``logs`` and ``traces`` (made writable for the pods' uid) the pods mount. Each call publishes under
        names of its own (``-1``, ``-2`` ... after the first), so stacks configured one after another on this
        control plane (a benchmark's executors) never share their pods' files. Raises :class:`KubeStackError` when a
        bundle's files pass a ConfigMap's 1 MiB."""
        from kubernetes import client

        stack.prepare_home()  # the example DAG files, which the ConfigMaps copy
        bundles = {b["name"]: Path(b["kwargs"]["path"]) for b in json.loads(
            stack.env()["AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST"])}
        suffix = f"-{self._published}" if self._published else ""
        self._published += 1
        core = client.CoreV1Api(self.api)
        maps = {POD_CONFIG_MAP + suffix: {"airflow.cfg": airflow_cfg}}
        for i, (name, path) in enumerate(sorted(bundles.items())):
            files = {p.name: p.read_text() for p in sorted(path.glob("*.py"))}
            if sum(len(v) for v in files.values()) > 900_000:
                raise KubeStackError(f"the DAG files of bundle {name} ({path}) are too large for a ConfigMap")
            maps[f"{DAGS_CONFIG_MAP}{suffix}-{i}"] = files
        for name, data in maps.items():
            core.create_namespaced_config_map(self.namespace, client.V1ConfigMap(
                metadata=client.V1ObjectMeta(name=name), data=data))
        home = stack.home
        for sub in ("logs", "traces"):
            (home / sub).mkdir(parents=True, exist_ok=True)
            os.chmod(home / sub, 0o777)
        volume, claim = f"{self.namespace}-shared{suffix}", SHARED_CLAIM + suffix
        core.create_persistent_volume(client.V1PersistentVolume(
            metadata=client.V1ObjectMeta(name=volume),
            spec=client.V1PersistentVolumeSpec(
                capacity={"storage": "1Gi"}, access_modes=["ReadWriteMany"], storage_class_name="",
                persistent_volume_reclaim_policy="Retain",
                host_path=client.V1HostPathVolumeSource(path=str(home), type="Directory"),
                claim_ref=client.V1ObjectReference(namespace=self.namespace, name=claim))))
        self._cluster_objects.append(("persistentvolume", volume))
        core.create_namespaced_persistent_volume_claim(self.namespace, client.V1PersistentVolumeClaim(
            metadata=client.V1ObjectMeta(name=claim),
            spec=client.V1PersistentVolumeClaimSpec(
                access_modes=["ReadWriteMany"], storage_class_name="", volume_name=volume,
                resources=client.V1VolumeResourceRequirements(requests={"storage": "1Gi"}))))
        return real_pod_template(node=self.node_name, image=self.image, bundles=bundles, suffix=suffix)

    def scheduler_kubeconfig(self, path: Path, *, name: str = SCHEDULER_SERVICE_ACCOUNT,
                             token_seconds: int = 7200) -> Path:
        """Write to ``path`` a kubeconfig for a least-privilege identity of leoflow's own (not the admin's,
        which is in ``system:masters``: exempt from RBAC and from API Priority and Fairness), and return it.

        The identity is the ServiceAccount ``name`` of the task namespace, granted exactly what leoflow needs
        (``leoflow_airflow.runtime.kubernetes.access``): the scheduler's rules in the task namespace (a Role)
        and the api-server's token exchange rules (``create tokenreviews``, a ClusterRole; ``get pods`` is in
        the Role). Its token comes from the TokenRequest API, valid ``token_seconds``. Its user name, for RBAC
        subjects and FlowSchemas, is ``system:serviceaccount:<namespace>:<name>``
        (:attr:`scheduler_user` after the call). Cluster-wide objects are deleted again by :meth:`stop` on a
        reused control plane.
        """
        import yaml
        from kubernetes import client

        from leoflow_airflow.runtime.kubernetes.access import EXCHANGE_RULES, SCHEDULER_RULES

        if self.api is None or self.env is None:
            raise KubeStackError("scheduler_kubeconfig() needs a started KubeStack")
        core, rbac = client.CoreV1Api(self.api), client.RbacAuthorizationV1Api(self.api)
        core.create_namespaced_service_account(self.namespace, client.V1ServiceAccount(
            metadata=client.V1ObjectMeta(name=name)))
        subject = client.RbacV1Subject(kind="ServiceAccount", name=name, namespace=self.namespace)

        def policy(rules) -> list:
            return [client.V1PolicyRule(api_groups=[r.group], verbs=[r.verb],
                                        resources=[r.resource + (f"/{r.subresource}" if r.subresource else "")])
                    for r in rules]

        namespaced = [r for r in (*SCHEDULER_RULES, *EXCHANGE_RULES) if r.resource != "tokenreviews"]
        rbac.create_namespaced_role(self.namespace, client.V1Role(
            metadata=client.V1ObjectMeta(name=name), rules=policy(namespaced)))
        rbac.create_namespaced_role_binding(self.namespace, client.V1RoleBinding(
            metadata=client.V1ObjectMeta(name=name), subjects=[subject],
            role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="Role", name=name)))
        cluster_name = f"{self.namespace}-{name}"
        rbac.create_cluster_role(client.V1ClusterRole(
            metadata=client.V1ObjectMeta(name=cluster_name),
            rules=policy([r for r in EXCHANGE_RULES if r.resource == "tokenreviews"])))
        self._cluster_objects.append(("clusterrole", cluster_name))
        rbac.create_cluster_role_binding(client.V1ClusterRoleBinding(
            metadata=client.V1ObjectMeta(name=cluster_name), subjects=[subject],
            role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="ClusterRole", name=cluster_name)))
        self._cluster_objects.append(("clusterrolebinding", cluster_name))
        token = core.create_namespaced_service_account_token(name, self.namespace, client.AuthenticationV1TokenRequest(
            spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=token_seconds))).status.token
        admin = yaml.safe_load(Path(self.env.kubeconfig).read_text())
        context = next(c for c in admin["contexts"] if c["name"] == admin["current-context"])["context"]
        cluster = next(c for c in admin["clusters"] if c["name"] == context["cluster"])
        path = Path(path)
        path.touch(mode=0o600)  # the token is a credential: never readable by others, not even briefly
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "clusters": [cluster],
            "users": [{"name": name, "user": {"token": token}}],
            "contexts": [{"name": name, "context": {"cluster": cluster["name"], "user": name}}],
            "current-context": name}))
        self.scheduler_user = f"system:serviceaccount:{self.namespace}:{name}"
        return path

    # ------------------------------------------------------------------ pods

    def _record(self) -> None:
        """Thread body: list and watch the task namespace's pods until :meth:`stop`, keeping each version seen
        (``raw_object``: the API server's JSON); relist on 410 Gone, never watch from ``"0"``."""
        from kubernetes import client, watch
        from kubernetes.client.rest import ApiException

        core = client.CoreV1Api(self.api)
        rv: str | None = None
        while not self._stop_recorder.is_set():
            try:
                if rv is None:
                    listed = json.loads(core.list_namespaced_pod(self.namespace, _preload_content=False).data)
                    for pod in listed["items"]:
                        self._keep(pod)
                    rv = listed["metadata"]["resourceVersion"]
                w = self._recorder_stream = watch.Watch()
                if self._stop_recorder.is_set():
                    break
                for event in w.stream(core.list_namespaced_pod, self.namespace, resource_version=rv,
                                      timeout_seconds=5, allow_watch_bookmarks=True):
                    raw = event.get("raw_object") or {}
                    rv = (raw.get("metadata") or {}).get("resourceVersion") or rv
                    if event["type"] in ("ADDED", "MODIFIED", "DELETED"):
                        self._keep(raw)
                    self._recorder_rv = rv
                    if self._stop_recorder.is_set():
                        w.stop()
                        break
            except ApiException as exc:
                if exc.status == 410:
                    rv = None
                    continue
                if not self._stop_recorder.is_set():
                    self._recorder_errors.append(f"{exc.status} {exc.reason}")
                    self._stop_recorder.wait(0.5)
            except Exception as exc:  # noqa: BLE001 - keep recording; reported by stop()
                if not self._stop_recorder.is_set():
                    self._recorder_errors.append(repr(exc))
                    self._stop_recorder.wait(0.5)

    def _keep(self, pod: dict) -> None:
        meta = pod.get("metadata") or {}
        uid, rv = meta.get("uid"), meta.get("resourceVersion")
        if uid and rv:
            with self._recorded_lock:
                self._recorded.setdefault(uid, {})[rv] = pod

    def pods(self) -> dict[str, list[dict]]:
        """Every pod the namespace has had since :meth:`start`: ``{uid: [each version seen, oldest first]}``,
        each a dict as the API server serialized it (metadata, spec, status). Includes pods deleted since.

        While started, the current state is also listed first, so a pod created just now is never missing.
        """
        if self.api is not None:
            self.record_current()
        with self._recorded_lock:
            return {uid: [versions[rv] for rv in sorted(versions, key=_rv_key)]
                    for uid, versions in self._recorded.items()}

    def record_current(self) -> None:
        """List the namespace's pods now and keep them (as the recorder would)."""
        from kubernetes import client

        listed = json.loads(client.CoreV1Api(self.api).list_namespaced_pod(
            self.namespace, _preload_content=False).data)
        for pod in listed["items"]:
            self._keep(pod)

    def describe_pods(self) -> list[str]:
        """One line per pod recorded, for a diagnosis: name, last phase, the agent container's state and
        termination message (cut), pod reason/message, and where the harness kept its log."""
        lines = []
        for versions in self.pods().values():
            pod = versions[-1]
            name = pod["metadata"]["name"]
            status = pod.get("status") or {}
            gone = " (deleted)" if pod["metadata"].get("deletionTimestamp") else ""
            agent = next(iter(status.get("containerStatuses") or []), {})
            term = (agent.get("state") or {}).get("terminated") or {}
            logs = sorted(str(p) for p in (self.workdir / "harness").glob(f"{self.namespace}.{name}.*/base.log"))
            lines.append(
                f"{name}{gone}: phase={status.get('phase')} reason={status.get('reason')} "
                f"message={(status.get('message') or '')[:200]!r} exit={term.get('exitCode')} "
                f"termination={(term.get('message') or '')[:300]!r} log={logs[-1] if logs else None}")
        return lines

    def wait_for_no_running_pods(self, timeout: float) -> None:
        """Wait until no pod of the namespace is Pending or Running (every attempt's pod ended or is gone).

        Raises ``TimeoutError`` naming the pods still active after ``timeout`` seconds.
        """
        from kubernetes import client

        core = client.CoreV1Api(self.api)
        deadline = time.monotonic() + timeout
        while True:
            active = [p.metadata.name for p in core.list_namespaced_pod(self.namespace).items
                      if p.status.phase in (None, "Pending", "Running")]
            if not active:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"pods still active after {timeout}s: {active}")
            time.sleep(1.0)


def release_finalizers(core: Any, namespace: str) -> list[str]:
    """Strip leoflow's finalizer from every leoflow pod of ``namespace`` (the function behind ``airflow leoflow
    release-pods``), so the pods of a deleted namespace (and the namespace) can go; the problems met, empty when
    clean. Never raises."""
    from leoflow_airflow.runtime.kubernetes.finalizer import release_pods
    from leoflow_airflow.runtime.kubernetes.runtime import label_selector

    try:
        return [f"releasing pod {namespace}/{r.name}: {r.outcome} {r.detail}"
                for r in release_pods(core, namespace, label_selector(None)) if not r.done]
    except Exception as exc:  # noqa: BLE001 - reported with the other problems
        return [f"releasing leoflow's finalizers in {namespace}: {type(exc).__name__}: {exc}"]


def _rv_key(rv: str) -> tuple[int, str]:
    """Sort key of a resourceVersion: numeric where it is (etcd revisions), else textual after."""
    return (int(rv), "") if rv.isdigit() else (1 << 62, rv)


def pod_airflow_cfg(*, dags_folder: Path, bundles: str, execution_api_server_url: str,
                    base_log_folder: Path) -> str:
    """The ``airflow.cfg`` of the pod-side Airflow home: only what the Task SDK needs in the task process.

    :param dags_folder: ``[core] dags_folder``, the scheduler's.
    :param bundles: ``[dag_processor] dag_bundle_config_list`` (JSON text), the scheduler's, so the task finds
        the workload's bundle by name.
    :param execution_api_server_url: ``[core] execution_api_server_url``, where the task reaches the api-server.
    :param base_log_folder: ``[logging] base_log_folder``, where the task's log goes.

    No credential: no ``sql_alchemy_conn``, ``fernet_key``, ``jwt_secret`` or ``secret_key``; the task's
    only credential is the workload token it gets at exchange.
    """
    json.loads(bundles)  # must be JSON: a ValueError here beats a task that cannot find its DAG
    bundle_lines = "\n    ".join(bundles.splitlines())
    return (
        "# The task pods' Airflow configuration (devtools/kube.py): no credential of any kind.\n"
        "[core]\n"
        f"dags_folder = {dags_folder}\n"
        f"execution_api_server_url = {execution_api_server_url}\n"
        "load_examples = False\n"
        "\n[dag_processor]\n"
        f"dag_bundle_config_list = {bundle_lines}\n"
        "\n[logging]\n"
        f"base_log_folder = {base_log_folder}\n"
    )


def real_pod_template(*, node: str, image: str, bundles: dict[str, Path], suffix: str = "") -> dict[str, Any]:
    """The pod template of the real node: a pod as a user of a real cluster would write it.

    ``spec.nodeName`` ``node`` (k8senv runs no scheduler), the agent ``image`` with its own ENTRYPOINT (no
    ``command``), ``runAsUser`` 50000, ``AIRFLOW_HOME`` :data:`REAL_POD_HOME` (an emptyDir) with
    ``AIRFLOW_CONFIG`` from the ConfigMap :data:`POD_CONFIG_MAP`; each DAG bundle's files (``bundles``: name ->
    path, sorted by name as :meth:`KubeStack.real_pod_template_for` numbers their ConfigMaps) mounted read-only at
    the path the bundle configuration names, as a git-sync or baked-in DAG folder would be; the claim
    :data:`SHARED_CLAIM`'s ``logs`` at ``AIRFLOW_HOME/logs`` and ``traces`` at ``AIRFLOW_HOME/traces``. ``suffix``
    ends the ConfigMaps' and the claim's names (:meth:`KubeStack.real_pod_template_for`).
    """
    dag_volumes = [{"name": f"dags-{i}", "configMap": {"name": f"{DAGS_CONFIG_MAP}{suffix}-{i}"}}
                   for i in range(len(bundles))]
    dag_mounts = [{"name": f"dags-{i}", "mountPath": str(path), "readOnly": True}
                  for i, (_, path) in enumerate(sorted(bundles.items()))]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {},
        "spec": {
            "nodeName": node,
            "securityContext": {"runAsUser": POD_RUN_AS_USER, "runAsGroup": 0},
            "volumes": [
                {"name": "airflow-home", "emptyDir": {}},
                {"name": "airflow-cfg", "configMap": {"name": POD_CONFIG_MAP + suffix}},
                {"name": "shared", "persistentVolumeClaim": {"claimName": SHARED_CLAIM + suffix}},
                *dag_volumes,
            ],
            "containers": [{
                "name": "base",
                "image": image,
                # a CPU request, as a deployment's template has: a pod without one is BestEffort, whose cgroup
                # the kubelet gives cpu.shares 2, so beside this machine's other work (the scheduler, the other
                # tests) its agent starved (60 s to import Airflow); 100m keeps parallelism 8 and the warm pods
                # within the node's 2 allocatable CPUs (the kubelet refuses a pod past them: OutOfcpu)
                "resources": {"requests": {"cpu": REAL_POD_CPU_REQUEST}},
                "env": [
                    {"name": "AIRFLOW_HOME", "value": REAL_POD_HOME},
                    {"name": "AIRFLOW_CONFIG", "value": "/etc/leoflow/airflow.cfg"},
                ],
                "volumeMounts": [
                    {"name": "airflow-home", "mountPath": REAL_POD_HOME},
                    {"name": "airflow-cfg", "mountPath": "/etc/leoflow", "readOnly": True},
                    {"name": "shared", "mountPath": f"{REAL_POD_HOME}/logs", "subPath": "logs"},
                    {"name": "shared", "mountPath": f"{REAL_POD_HOME}/traces", "subPath": "traces"},
                    *dag_mounts,
                ],
            }],
        },
    }


def pod_template(*, venv: Path, airflow_home: Path) -> dict[str, Any]:
    """The pod template (``[leoflow] pod_template_file``) of the harness: a pod as a user would write it.

    ``spec.nodeName`` :data:`HARNESS_NODE` and label ``leoflow.test/harness`` (the harness picks the pod up; no
    scheduler runs), a security context of the ``restricted`` level with a non-zero ``runAsUser``, and the
    container ``base`` with ``command: ["/usr/bin/env"]`` (the builder's ``args`` ``python -m leoflow_agent
    pod`` follow it) and env ``PATH`` (``venv``'s ``bin`` first) and ``AIRFLOW_HOME`` (``airflow_home``).
    """
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"labels": {HARNESS_LABEL: HARNESS_NODE}},
        "spec": {
            "nodeName": HARNESS_NODE,
            "securityContext": {"runAsUser": POD_RUN_AS_USER, "runAsGroup": 0},
            "containers": [{
                "name": "base",
                "image": PLACEHOLDER_IMAGE,
                "command": ["/usr/bin/env"],
                "env": [
                    {"name": "PATH", "value": f"{venv}/bin:/usr/bin:/bin"},
                    {"name": "AIRFLOW_HOME", "value": str(airflow_home)},
                ],
            }],
        },
    }

