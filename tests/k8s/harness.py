"""A node harness that plays the kubelet for selected pods, against the real kube-apiserver.

It drives pods that are bound to its Node (``spec.nodeName == node_name``) *and* carry the label
``leoflow.test/harness=<node_name>``. Every other pod is left alone (kwok drives the pods on the kwok
Nodes; the harness Node carries no kwok label, so kwok never touches the harness's pods).

For each such pod, and each of its containers, it runs ``command + args`` as a local process (the
image is ignored) with the container's env, in its own mount namespace made by ``unshare --mount``
(root needed). Inside that namespace it bind-mounts:

* each ``projected`` volume (ServiceAccount token, ConfigMap keys, downward API) as a per-pod directory
  at the container's ``mountPath``; the token is minted through the real TokenRequest API, bound to the
  pod, with the source's audience (default: the apiserver's) and ``expirationSeconds`` (default 3600),
  and rewritten (atomically, same directory) once 80 % of its lifetime has passed;
* ``emptyDir``, ``configMap`` and ``secret`` volumes as per-pod directories;
* a per-pod, per-container file at ``terminationMessagePath`` (default ``/dev/termination-log``).

Mount points that do not exist on the host are created empty (and removed by ``stop()``); their content
is only ever visible inside the pod's own namespace, so concurrent pods never see each other's files.

Status goes back through the pod's ``status`` subresource: Running with ``state.running`` when the
processes start; Succeeded/Failed with ``state.terminated`` (exit code, reason Completed/Error, message) when
they end. The message is made as the kubelet makes it (``research/k8s-runtime-facts.md`` §6.1): the **last**
4096 bytes of the termination file (``tail.ReadAtMost``), or the log tail for ``FallbackToLogsOnError``
(exit code not 0 and the file empty: the last 80 lines, at most 2048 bytes); then, when
``NodeHarness.runtime_message`` is set, that text and ``": "`` in front (what the kubelet does when the
container runtime reports a message of its own); then the pod-wide cap, which keeps the **head** of every
container's message, ``12288 // (containers + initContainers + ephemeralContainers)`` bytes, a raw byte slice
that may split a UTF-8 character (shown as U+FFFD, as the API server's JSON encoding shows it). A pod that is
deleted while running gets SIGTERM, SIGKILL after its grace period, its terminal status, and is then removed with
grace 0 and a UID precondition, as the kubelet does (a deleted pod it never started is marked Failed first); a pod
holding a finalizer then stays, terminal and deleting, until the finalizer is removed. Conditions the kubelet does
not own (``DisruptionTarget``, set by the Eviction API) are kept by every status write, as the kubelet keeps them.

Switches a test flips for one running pod: :meth:`NodeHarness.oom_kill` (the kernel's OOM killer: SIGKILL, the
container reports ``OOMKilled``, exit 137) and :meth:`NodeHarness.exceed_deadline` (the kubelet's
``activeDeadlineSeconds`` check: the pod ends Failed, reason ``DeadlineExceeded``). For the whole node:
:meth:`NodeHarness.lose_node` (the machine is gone: every process killed, no status written, the Node object
deleted; PodGC then fails and removes its pods), :meth:`NodeHarness.become_unreachable` (the same, the Node kept) and
:meth:`NodeHarness.partition` (the kubelet cut off, the processes running on).

Logs: each container's stdout and stderr go to one file (``<container>.log`` in the per-pod directory), served
as the kubelet serves them to the API server's ``pods/log`` proxy: HTTPS ``GET
/containerLogs/{namespace}/{pod}/{container}`` with ``tailLines``, ``limitBytes`` and ``follow`` (a
self-signed certificate made at ``start()``, on ``NodeHarness.kubelet_host``, a free port), the address and
port registered in the Node's status (``addresses`` InternalIP, ``daemonEndpoints.kubeletEndpoint.Port``) as a
kubelet registers them. Unlike a kubelet it asks no client certificate of the API server (the test control
plane gives the API server none, and no ``--kubelet-certificate-authority``, so the API server does not verify
ours either) and ``timestamps=true`` is refused with 400 (the harness keeps no per-line times).

Environment the process gets: the container's ``env`` (``value``, ``fieldRef`` on metadata.name,
metadata.namespace, metadata.uid, metadata.labels['k'], metadata.annotations['k'], spec.nodeName,
spec.serviceAccountName, status.podIP, status.hostIP; ``configMapKeyRef``/``secretKeyRef``), plus
``KUBERNETES_SERVICE_HOST``/``KUBERNETES_SERVICE_PORT`` pointing at the test apiserver, and ``PATH`` and
``HOME`` from the test process unless the pod sets them. Unsupported pod features (no command,
``subPath``, hostPath and other volume types, envFrom, restartPolicy other than Never) make the pod Failed
with reason ``HarnessUnsupported`` and a message naming the feature.
"""

from __future__ import annotations

import base64
import datetime as dt
import http.server
import ipaddress
import json
import os
import re
import shlex
import shutil
import signal
import ssl
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable
from urllib.parse import parse_qs, urlparse

from kubernetes import client, watch
from kubernetes.client.rest import ApiException

HARNESS_LABEL = "leoflow.test/harness"
DEFAULT_TERMINATION_PATH = "/dev/termination-log"
MAX_MESSAGE_BYTES = 4096
"""The kubelet keeps the last this many bytes of a termination-message file (``MaxContainerTerminationMessageLength``)."""
MAX_POD_MESSAGE_BYTES = 12288
"""… and cuts each container's message to this // (containers + initContainers + ephemeralContainers) bytes
(``MaxPodTerminationMessageLogLength``; ``status_manager.normalizeStatus``)."""
MAX_LOG_MESSAGE_LINES, MAX_LOG_MESSAGE_BYTES = 80, 2048
"""``FallbackToLogsOnError``: the last 80 lines of the log, at most 2048 bytes."""


KUBELET_CONDITIONS = frozenset({"PodScheduled", "Ready", "Initialized", "ContainersReady", "PodResizeInProgress",
                                "PodResizePending", "PodReadyToStartContainers"})
"""Pod condition types the kubelet owns (``k8s:pkg/kubelet/types/pod_status.go`` ``PodConditionsByKubelet``, plus
``PodReadyToStartContainers``). Every other condition (``DisruptionTarget``, set by the Eviction API, the taint
manager, PodGC) is kept when the kubelet writes status (``status_manager.mergePodStatus``)."""

DEADLINE_EXCEEDED_MESSAGE = "Pod was active on the node longer than the specified deadline"
"""The kubelet's pod ``status.message`` when ``activeDeadlineSeconds`` ran out (``k8s:pkg/kubelet/active_deadline.go:32``)."""


def merge_conditions(old: list | None, mine: list) -> list:
    """The conditions a kubelet status write leaves: the old ones it does not own (:data:`KUBELET_CONDITIONS`),
    then its own ``mine``."""
    kept = [c for c in old or [] if isinstance(c, dict) and c.get("type") not in KUBELET_CONDITIONS]
    return kept + list(mine)


def kubelet_message(file_content: bytes, *, containers: int, runtime_message: str | None = None,
                    log_tail: bytes | None = None) -> str:
    """The ``state.terminated.message`` the kubelet reports for one container whose termination file holds
    ``file_content``, in a pod of ``containers`` containers (all kinds counted, >= 1): the file's last
    :data:`MAX_MESSAGE_BYTES` bytes (``log_tail`` instead when given: the caller decided the log fallback
    applies), ``runtime_message + ": "`` in front when given, then the head
    ``MAX_POD_MESSAGE_BYTES // containers`` bytes, decoded as the API server's JSON shows invalid UTF-8."""
    data = log_tail if log_tail is not None else file_content[-MAX_MESSAGE_BYTES:]
    if runtime_message:
        data = runtime_message.encode() + b": " + data
    data = data[:MAX_POD_MESSAGE_BYTES // max(1, containers)]
    return data.decode(errors="replace")


def _namespace_terminating(exc: BaseException) -> bool:
    """True for the API server's 403 to a create (a TokenRequest for a projected volume, say) in a namespace being
    deleted: the kubelet only fails to set up such a pod, which goes with its namespace; no harness error."""
    return isinstance(exc, ApiException) and exc.status == 403 and "being terminated" in str(exc.body or "")


class HarnessError(RuntimeError):
    """The harness cannot run here (no ``unshare``, not root) or was misused."""


class Unsupported(Exception):
    """A pod uses a feature the harness does not implement; the pod is marked Failed with this message."""


def _now() -> str:
    """Return the current UTC time in RFC 3339 with second precision, as the API stores it."""
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def check_unshare(unshare: str = "unshare") -> str:
    """Return the absolute path of a working ``unshare`` that can make a mount namespace.

    Raises HarnessError with the reason when the command is missing or ``unshare --mount`` fails
    (it needs root or CAP_SYS_ADMIN).
    """
    path = shutil.which(unshare)
    if not path:
        raise HarnessError(f"`{unshare}` not found: the node harness needs util-linux's unshare "
                           "(Debian package util-linux) and root to run pods in their own mount namespace")
    r = subprocess.run([path, "--mount", "--propagation", "private", "true"], capture_output=True, text=True)
    if r.returncode != 0:
        raise HarnessError(f"`{path} --mount true` failed (exit {r.returncode}: {r.stderr.strip()}); "
                           "the node harness needs root (CAP_SYS_ADMIN) to make mount namespaces")
    return path


class _PodRun:
    """The harness's state for one pod: its per-pod directory, processes and token refreshers."""

    def __init__(self, harness: "NodeHarness", pod: client.V1Pod):
        self.h = harness
        self.ns, self.name, self.uid = pod.metadata.namespace, pod.metadata.name, pod.metadata.uid
        self.pod = pod
        self.dir = Path(tempfile.mkdtemp(prefix=f"{self.ns}.{self.name}.", dir=harness.workdir))
        self.procs: dict[str, subprocess.Popen] = {}
        self.started: dict[str, str] = {}
        self.deleting = threading.Event()
        self.done = threading.Event()
        self.removed = False  # remove() asked the API server to remove the deleted pod
        self.oom_killed: set[str] = set()  # containers the OOM switch killed (NodeHarness.oom_kill)
        self.pod_end: tuple[str, str] | None = None  # (reason, message) the kubelet ends the pod with
        self.thread = threading.Thread(target=self._run, name=f"harness-{self.ns}/{self.name}", daemon=True)

    # ---- status --------------------------------------------------------------------------------
    def _write_status(self, mutate) -> None:
        """Read the pod as a JSON dict, apply `mutate(pod_dict)` and PUT it to the status subresource,
        retrying on 409 conflicts; a pod that is gone (or replaced by another UID) is left alone, and nothing
        is written once the node is lost (:meth:`NodeHarness.lose_node`: a vanished kubelet writes nothing)."""
        for _ in range(20):
            if self.h.lost:
                return
            try:
                resp = self.h.core.read_namespaced_pod(self.name, self.ns, _preload_content=False)
                pod = json.loads(resp.data)
            except ApiException as e:
                if e.status == 404:
                    return
                raise
            if pod["metadata"]["uid"] != self.uid:
                return
            pod.setdefault("status", {})
            mutate(pod)
            try:
                self.h.core.replace_namespaced_pod_status(self.name, self.ns, pod, _preload_content=False)
                return
            except ApiException as e:
                if e.status == 409:
                    continue
                if e.status == 404:
                    return
                raise
        raise HarnessError(f"could not write status of {self.ns}/{self.name}: too many conflicts")

    def _fail(self, reason: str, message: str) -> None:
        """Mark the pod Failed with a pod-level reason and message (no container ran)."""
        def mutate(pod):
            pod["status"].update(phase="Failed", reason=reason, message=message)
        self._write_status(mutate)

    # ---- volumes -------------------------------------------------------------------------------
    def _token(self, src: client.V1ServiceAccountTokenProjection) -> tuple[str, float]:
        """Mint a token for the pod's ServiceAccount bound to this pod; return (token, lifetime seconds)."""
        spec = client.V1TokenRequestSpec(
            audiences=[src.audience] if src.audience else [],
            expiration_seconds=src.expiration_seconds or 3600,
            bound_object_ref=client.V1BoundObjectReference(kind="Pod", api_version="v1", name=self.name,
                                                           uid=self.uid))
        sa = self.pod.spec.service_account_name or "default"
        tr = self.h.core.create_namespaced_service_account_token(
            sa, self.ns, client.AuthenticationV1TokenRequest(spec=spec))
        exp = tr.status.expiration_timestamp
        lifetime = (exp - dt.datetime.now(dt.timezone.utc)).total_seconds()
        return tr.status.token, max(lifetime, 1.0)

    @staticmethod
    def _write_atomic(path: Path, data: bytes, mode: int = 0o644) -> None:
        """Write `data` to `path` via a temporary file renamed into place (readers never see half)."""
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_bytes(data)
        os.chmod(tmp, mode)
        os.replace(tmp, path)

    def _field(self, path: str) -> str:
        """Resolve a downward-API fieldPath against the pod; raise Unsupported for unknown paths."""
        p = self.pod
        simple = {
            "metadata.name": p.metadata.name, "metadata.namespace": p.metadata.namespace,
            "metadata.uid": p.metadata.uid, "spec.nodeName": p.spec.node_name,
            "spec.serviceAccountName": p.spec.service_account_name or "default",
            "status.podIP": "127.0.0.1", "status.hostIP": "127.0.0.1",
        }
        if path in simple:
            return simple[path] or ""
        for prefix, values in (("metadata.labels", p.metadata.labels), ("metadata.annotations", p.metadata.annotations)):
            if path.startswith(prefix + "['") and path.endswith("']"):
                return (values or {}).get(path[len(prefix) + 2:-2], "")
        raise Unsupported(f"fieldRef {path!r}")

    def _materialize(self, vol: client.V1Volume) -> Path:
        """Create the per-pod directory for one volume and fill it; return it.

        Projected ServiceAccount tokens get a refresher thread. Raises Unsupported for other volume types.
        """
        d = self.dir / "volumes" / vol.name
        d.mkdir(parents=True, exist_ok=True)
        if vol.empty_dir is not None:
            return d
        if vol.config_map is not None or vol.secret is not None:
            items = self._source_items(vol.config_map, vol.secret)
            for key, value in items.items():
                self._write_atomic(d / key, value)
            return d
        if vol.projected is not None:
            for src in vol.projected.sources or []:
                if src.service_account_token is not None:
                    self._start_token_refresher(d, src.service_account_token)
                elif src.config_map is not None or src.secret is not None:
                    items = self._source_items(src.config_map, src.secret)
                    for key, value in items.items():
                        self._write_atomic(d / key, value)
                elif src.downward_api is not None:
                    for item in src.downward_api.items or []:
                        if item.field_ref is None:
                            raise Unsupported("downwardAPI resourceFieldRef")
                        self._write_atomic(d / item.path, self._field(item.field_ref.field_path).encode())
                else:
                    raise Unsupported(f"projected source in volume {vol.name!r}")
            return d
        raise Unsupported(f"volume {vol.name!r}: only emptyDir, configMap, secret and projected are supported")

    def _source_items(self, cm, secret) -> dict[str, bytes]:
        """Return {path: bytes} for a configMap or secret source, honouring `items` and `optional`."""
        src = cm or secret
        try:
            if cm is not None:
                obj = self.h.core.read_namespaced_config_map(cm.name, self.ns)
                data = {k: v.encode() for k, v in (obj.data or {}).items()}
                data.update({k: base64.b64decode(v) for k, v in (obj.binary_data or {}).items()})
            else:
                obj = self.h.core.read_namespaced_secret(secret.secret_name, self.ns)
                data = {k: base64.b64decode(v) for k, v in (obj.data or {}).items()}
        except ApiException as e:
            if e.status == 404 and src.optional:
                return {}
            raise Unsupported(f"volume source {getattr(src, 'name', None) or getattr(src, 'secret_name', None)!r}"
                              f" not readable: {e.status} {e.reason}") from None
        if src.items:
            return {it.path: data[it.key] for it in src.items if it.key in data}
        return data

    def _start_token_refresher(self, d: Path, src: client.V1ServiceAccountTokenProjection) -> None:
        """Write a bound token to d/<path> now, then rewrite it each time `refresh_fraction` of its life passes."""
        token, lifetime = self._token(src)
        target = d / src.path
        self._write_atomic(target, token.encode(), 0o600)

        def refresh(lifetime=lifetime):
            while True:
                wait = self.h.refresh_after_seconds or lifetime * self.h.refresh_fraction
                if self.done.wait(wait):
                    return
                try:
                    tok, lifetime = self._token(src)
                    self._write_atomic(target, tok.encode(), 0o600)
                except ApiException:
                    if self.done.is_set():
                        return
                    lifetime = 10.0  # pod gone or apiserver busy: try again soon

        threading.Thread(target=refresh, name=f"token-{self.name}-{src.path}", daemon=True).start()

    # ---- environment ---------------------------------------------------------------------------
    def _env(self, c: client.V1Container) -> dict[str, str]:
        """Return the process environment for container `c`; raise Unsupported for what is not handled."""
        if c.env_from:
            raise Unsupported("envFrom")
        api = urlparse(self.h.server)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/root",
               "HOSTNAME": self.name, "KUBERNETES_SERVICE_HOST": api.hostname or "127.0.0.1",
               "KUBERNETES_SERVICE_PORT": str(api.port or 443)}
        for e in c.env or []:
            if e.value_from is None:
                env[e.name] = _expand(e.value or "", env)
            elif e.value_from.field_ref is not None:
                env[e.name] = self._field(e.value_from.field_ref.field_path)
            elif e.value_from.config_map_key_ref is not None or e.value_from.secret_key_ref is not None:
                ref = e.value_from.config_map_key_ref or e.value_from.secret_key_ref
                if e.value_from.config_map_key_ref is not None:
                    vals = self._source_items(client.V1ConfigMapVolumeSource(name=ref.name, optional=ref.optional), None)
                else:
                    vals = self._source_items(None, client.V1SecretVolumeSource(secret_name=ref.name, optional=ref.optional))
                if ref.key in vals:
                    env[e.name] = vals[ref.key].decode()
                elif not ref.optional:
                    raise Unsupported(f"env {e.name}: key {ref.key!r} not found in {ref.name!r}")
            else:
                raise Unsupported(f"env {e.name}: valueFrom kind")
        return env

    # ---- run -----------------------------------------------------------------------------------
    def _mount_script(self, c: client.V1Container, volumes: dict[str, Path], term_file: Path,
                      env: dict[str, str] | None = None) -> str:
        """Return the shell script run under unshare: bind mounts, then exec the container command.

        A volume mounted over a directory that holds host paths the container names (its command, args, working
        directory or environment: the test's venv, its Airflow home, all under the machine's ``/tmp``; e.g. an
        ``emptyDir`` on ``/tmp``, as a warm pod's read-only-root isolation mounts) is mounted last: the host
        directory is first bound to a stash (:meth:`NodeHarness.stash_dir`), the volume then goes over it, and
        each host entry the container names is bound back inside the volume (on a node those paths would be in
        the image). What the container writes elsewhere in that directory lands in the volume, never on the
        host; the bound-back entries are mount points (``/proc/self/mountinfo``), which a sweep leaves alone."""
        lines = ["set -e"]
        binds: list[tuple[Path, str, bool]] = []
        for m in c.volume_mounts or []:
            if m.sub_path or m.sub_path_expr:
                raise Unsupported(f"volumeMount {m.name!r}: subPath")
            if m.name not in volumes:
                raise Unsupported(f"volumeMount {m.name!r}: no such volume")
            binds.append((volumes[m.name], m.mount_path, bool(m.read_only)))
        tpath = c.termination_message_path or DEFAULT_TERMINATION_PATH
        binds.append((term_file, tpath, False))
        named = _host_paths(c, env or {})
        shadowing = [b for b in binds
                     if any(_under(p, b[1]) and p != b[1].rstrip("/") and os.path.exists(p) for p in named)]
        for src, dst, ro in [b for b in binds if b not in shadowing]:
            self.h.ensure_mount_point(dst, is_dir=src.is_dir())
            lines.append(f"mount --bind {shlex.quote(str(src))} {shlex.quote(dst)}")
            if ro:
                lines.append(f"mount -o remount,bind,ro {shlex.quote(dst)}")
        for i, (src, dst, ro) in enumerate(sorted(shadowing, key=lambda b: b[1].count("/"))):
            self.h.ensure_mount_point(dst, is_dir=src.is_dir())
            stash = self.h.stash_dir(self.dir.name, i)
            top = dst.rstrip("/")
            visible = f"{stash}{str(src)[len(top):]}" if _under(str(src), dst) else str(src)
            lines.append(f"mount --bind {shlex.quote(top)} {shlex.quote(stash)}")
            lines.append(f"mount --bind {shlex.quote(visible)} {shlex.quote(top)}")
            for entry in sorted({p[len(top) + 1:].split("/", 1)[0] for p in named if _under(p, dst)} - {""}):
                host, inside = f"{stash}/{entry}", f"{top}/{entry}"
                lines.append(f"if [ -d {shlex.quote(host)} ]; then mkdir -p {shlex.quote(inside)}; "
                             f"elif [ -e {shlex.quote(host)} ]; then touch {shlex.quote(inside)}; fi")
                lines.append(f"if [ -e {shlex.quote(host)} ]; then mount --bind {shlex.quote(host)} "
                             f"{shlex.quote(inside)}; fi")
            if ro:
                lines.append(f"mount -o remount,bind,ro {shlex.quote(top)}")
        lines.append('exec "$@"')
        return "\n".join(lines)

    def _start_container(self, c: client.V1Container, volumes: dict[str, Path]) -> None:
        """Start one container's command under unshare with its mounts; record the process."""
        if not c.command:
            raise Unsupported(f"container {c.name!r} has no command (the harness ignores images)")
        term_file = self.dir / f"termination-{c.name}"
        term_file.write_bytes(b"")
        env = self._env(c)
        script = self._mount_script(c, volumes, term_file, env)
        cwd = c.working_dir or "/"
        log = open(self.dir / f"{c.name}.log", "wb")
        try:
            self.procs[c.name] = subprocess.Popen(
                [self.h.unshare, "--mount", "--propagation", "private", "--", "/bin/sh", "-c", script,
                 "sh", *[_expand(a, env) for a in c.command], *[_expand(a, env) for a in (c.args or [])]],
                env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True)
        finally:
            log.close()
        self.started[c.name] = _now()

    def _run(self) -> None:
        """Thread body: set the pod up, run it, report its end; never raises (errors fail the pod)."""
        try:
            self._run_inner()
        except Unsupported as e:
            self._stop_procs(0)
            self._fail("HarnessUnsupported", f"node harness does not support: {e}")
        except Exception as e:  # noqa: BLE001 - report instead of dying silently
            self._stop_procs(0)
            if not _namespace_terminating(e):  # a test's teardown deleted the namespace while this pod set up
                self.h.errors.append(f"{self.ns}/{self.name}: {e!r}")
            try:
                self._fail("HarnessError", repr(e)[:1000])
            except Exception:  # noqa: BLE001
                pass
        finally:
            self.done.set()
            # the kubelet removes every deleted pod whose containers stopped, whichever way the run ended;
            # NodeHarness._handle does the same for a delete seen after this point (one of the two sees both flags)
            if self.deleting.is_set():
                try:
                    self.remove()
                except Exception as e:  # noqa: BLE001 - reported at stop()
                    self.h.errors.append(f"{self.ns}/{self.name}: remove: {e!r}")

    def _run_inner(self) -> None:
        """Set up volumes, start the containers, write Running, wait, write the terminal status."""
        spec = self.pod.spec
        if (spec.restart_policy or "Always") != "Never":
            raise Unsupported(f"restartPolicy {spec.restart_policy or 'Always'!r} (use Never)")
        if spec.init_containers:
            raise Unsupported("initContainers")
        volumes = {v.name: self._materialize(v) for v in spec.volumes or []}
        for c in spec.containers:
            self._start_container(c, volumes)
        start = _now()

        def running(pod):
            pod["status"].update(
                phase="Running", hostIP="127.0.0.1", podIP="127.0.0.1", startTime=start,
                hostIPs=[{"ip": "127.0.0.1"}], podIPs=[{"ip": "127.0.0.1"}],
                conditions=merge_conditions(pod["status"].get("conditions"), [
                    {"type": t, "status": "True", "lastTransitionTime": start}
                    for t in ("Initialized", "Ready", "ContainersReady", "PodScheduled")]),
                containerStatuses=[{
                    "name": c.name, "image": c.image or "", "imageID": "", "ready": True, "restartCount": 0,
                    "started": True, "state": {"running": {"startedAt": self.started[c.name]}}}
                    for c in spec.containers])
        self._write_status(running)

        codes: dict[str, int] = {}
        finished: dict[str, str] = {}
        while len(codes) < len(self.procs):
            for name, p in self.procs.items():
                if name not in codes and p.poll() is not None:
                    codes[name], finished[name] = p.returncode, _now()
            if self.deleting.is_set() or self.pod_end is not None:
                grace = self.pod.spec.termination_grace_period_seconds
                self._stop_procs(30 if grace is None else grace)
                for name, p in self.procs.items():
                    codes.setdefault(name, p.returncode)
                    finished.setdefault(name, _now())
                break
            time.sleep(0.05)

        def terminated(pod):
            statuses = []
            for c in spec.containers:
                code = codes[c.name]
                code = 128 - code if code < 0 else code  # killed by signal N -> 128+N, as runtimes report
                reason = "OOMKilled" if c.name in self.oom_killed else "Completed" if code == 0 else "Error"
                term = {"exitCode": code, "reason": reason,
                        "startedAt": self.started[c.name], "finishedAt": finished[c.name]}
                msg = self._message(c, code)
                if msg:
                    term["message"] = msg
                statuses.append({"name": c.name, "image": c.image or "", "imageID": "", "ready": False,
                                 "restartCount": 0, "started": False, "state": {"terminated": term}})
            now = _now()
            succeeded = self.pod_end is None and all(codes[c.name] == 0 for c in spec.containers)
            pod["status"].update(
                containerStatuses=statuses,
                phase="Succeeded" if succeeded else "Failed",
                conditions=merge_conditions(pod["status"].get("conditions"), [
                    {"type": t, "status": "True", "lastTransitionTime": start}
                    for t in ("Initialized", "PodScheduled")]
                    + [{"type": t, "status": "False", "reason": "PodCompleted", "lastTransitionTime": now}
                       for t in ("Ready", "ContainersReady")]))
            if self.pod_end is not None:
                pod["status"].update(reason=self.pod_end[0], message=self.pod_end[1])
        self._write_status(terminated)  # a deleted pod is then removed by _run (it removes on every path)

    def remove(self) -> None:
        """Remove the deleted pod once its containers stopped, as the kubelet does (grace 0, UID precondition;
        gone or replaced: nothing to do), once: a finalizer-held pod's later events ask again; nothing once the
        node is lost (a vanished kubelet removes nothing)."""
        if self.h.lost or self.removed:
            return
        try:
            self.h.core.delete_namespaced_pod(self.name, self.ns, body=client.V1DeleteOptions(
                grace_period_seconds=0, preconditions=client.V1Preconditions(uid=self.uid)))
        except ApiException as e:
            if e.status not in (404, 409):
                raise
        self.removed = True

    def _message(self, c: client.V1Container, code: int) -> str:
        """Return the container's termination message as the kubelet makes it (:func:`kubelet_message`): the
        file's last 4096 bytes, else (FallbackToLogsOnError, a failure, an empty file) the log tail; the
        harness's ``runtime_message`` in front when set; cut to the pod-wide share keeping the head."""
        data = (self.dir / f"termination-{c.name}").read_bytes()
        tail = None
        if not data and code != 0 and c.termination_message_policy == "FallbackToLogsOnError":
            lines = (self.dir / f"{c.name}.log").read_bytes().splitlines()[-MAX_LOG_MESSAGE_LINES:]
            tail = b"\n".join(lines)[-MAX_LOG_MESSAGE_BYTES:]
        spec = self.pod.spec
        count = sum(len(getattr(spec, f) or []) for f in ("containers", "init_containers", "ephemeral_containers"))
        return kubelet_message(data, containers=count, runtime_message=self.h.runtime_message, log_tail=tail)

    def _stop_procs(self, grace: float) -> None:
        """SIGTERM every running process group, then kill each container's whole process tree
        (:func:`kill_tree`) once its main process ended or `grace` seconds passed (0: at once), as a container
        runtime kills a container's cgroup: nothing a container started outlives it."""
        import psutil

        # the processes each container started, before any of them can exit and leave its children orphaned
        started: list[psutil.Process] = []
        for p in self.procs.values():
            if p.poll() is None:  # alive and not reaped: its pid cannot have been reused
                try:
                    started.extend(psutil.Process(p.pid).children(recursive=True))
                except psutil.NoSuchProcess:
                    pass
                if grace > 0:
                    try:
                        os.killpg(p.pid, signal.SIGTERM)
                    except ProcessLookupError:
                        pass
        deadline = time.monotonic() + grace
        for p in self.procs.values():
            try:
                p.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            if p.poll() is None:
                kill_tree(p.pid)
            p.wait()
        for child in started:  # those that outlived their parent (psutil checks it is still the same process)
            try:
                child.kill()
            except psutil.NoSuchProcess:
                pass


def _under(path: str, directory: str) -> bool:
    """Whether ``path`` is ``directory`` or below it (both absolute)."""
    top = directory.rstrip("/") or "/"
    return path == top or path.startswith(top + "/") or top == "/"


def _host_paths(c: client.V1Container, env: dict[str, str]) -> set[str]:
    """The absolute host paths a container names: in its command, args, working directory and environment
    values (``:``-separated lists split, ``KEY=path`` forms too), normalised."""
    words = [*(c.command or []), *(c.args or []), c.working_dir or "", *env.values()]
    out = set()
    for word in words:
        for part in re.split(r"[:=\s]", word or ""):
            if part.startswith("/") and len(part) > 1:
                out.add(os.path.normpath(part))
    return out


def kill_tree(pid: int) -> None:
    """SIGKILL process ``pid``, its process group and every descendant, as a container runtime kills a container's
    cgroup. The tree is frozen first (SIGSTOP, repeated until no new descendant appears), so nothing forks away
    between the listing and the kill. Needed because a container's processes need not share its process group:
    the Task SDK's supervisor puts its task process in a group of its own (``setpgid``). The caller makes sure
    ``pid`` is alive and not yet reaped (so not reused); gone descendants are skipped."""
    import psutil

    try:
        root = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return
    tree: dict[int, psutil.Process] = {}
    for _ in range(10):
        try:
            found = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            break
        new = [p for p in found if p.pid not in tree]
        if not new:
            break
        for p in new:
            tree[p.pid] = p
            try:
                p.suspend()
            except psutil.NoSuchProcess:
                pass
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for p in tree.values():
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass


def _expand(s: str, env: dict[str, str]) -> str:
    """Expand $(VAR) references as the kubelet does ($$(VAR) escapes); unknown ones stay as they are."""
    out, i = [], 0
    while i < len(s):
        if s.startswith("$$(", i):
            out.append("$(")
            i += 3
        elif s.startswith("$(", i) and ")" in s[i:]:
            j = s.index(")", i)
            name = s[i + 2:j]
            out.append(env.get(name, s[i:j + 1]))
            i = j + 1
        else:
            out.append(s[i])
            i += 1
    return "".join(out)


KUBELET_LOG_POLL_SECONDS = 0.05
"""How often a ``follow=true`` log request looks for new bytes in the container's log file."""


def self_signed_cert(host: str, directory: Path) -> tuple[Path, Path]:
    """Write a self-signed serving certificate for IP ``host`` (EC P-256, valid one day) and its key into
    ``directory``; return (cert path, key path)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"harness-kubelet@{host}")])
    now = dt.datetime.now(dt.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(host))]), critical=False)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = directory / "kubelet.crt", directory / "kubelet.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    os.chmod(key_path, 0o600)
    return cert_path, key_path


def tail_log(data: bytes, *, tail_lines: int | None, limit_bytes: int | None) -> bytes:
    """What the kubelet returns of a container log holding ``data``: the last ``tail_lines`` lines (all when
    None; a last line without its newline counts as a line), then at most the first ``limit_bytes`` bytes of
    those."""
    if tail_lines is not None:
        lines = data.splitlines(keepends=True)
        data = b"".join(lines[-tail_lines:]) if tail_lines > 0 else b""
    if limit_bytes is not None:
        data = data[:limit_bytes]
    return data


class _KubeletHandler(http.server.BaseHTTPRequestHandler):
    """``GET /containerLogs/{namespace}/{pod}/{container}`` of the harness's kubelet endpoint."""

    server: "_KubeletServer"
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        """Quiet: the harness's kubelet does not write an access log."""

    def _error(self, code: int, text: str) -> None:
        body = text.encode()
        self.send_response(code)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        """Serve one container log request (see :class:`NodeHarness`)."""
        url = urlparse(self.path)
        parts = url.path.strip("/").split("/")
        if len(parts) != 4 or parts[0] != "containerLogs":
            self._error(404, f"the harness kubelet serves /containerLogs/{{ns}}/{{pod}}/{{container}} only, "
                             f"not {url.path}")
            return
        _, ns, name, container = parts
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        if query.get("timestamps") == "true" or query.get("previous") == "true":
            self._error(400, "the harness kubelet does not support timestamps or previous")
            return
        try:
            tail = int(query["tailLines"]) if "tailLines" in query else None
            limit = int(query["limitBytes"]) if "limitBytes" in query else None
        except ValueError:
            self._error(400, f"bad tailLines/limitBytes: {url.query}")
            return
        run = self.server.harness.run_named(ns, name)
        path = run.dir / f"{container}.log" if run is not None else None
        if run is None or path is None or not path.exists():
            self._error(404, f"container {container!r} of pod {ns}/{name} not found on this node")
            return
        with open(path, "rb") as fh:
            data = tail_log(fh.read(), tail_lines=tail, limit_bytes=limit)
            if query.get("follow") != "true":
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            sent = 0
            try:
                while True:
                    if data:
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                        self.wfile.flush()
                        sent += len(data)
                    if limit is not None and sent >= limit:
                        break
                    ended = run.done.is_set()  # read once more after the end: nothing is lost
                    data = fh.read()
                    if limit is not None:
                        data = data[:limit - sent]
                    if not data:
                        if ended or self.server.harness._stop.is_set():
                            break
                        time.sleep(KUBELET_LOG_POLL_SECONDS)  # a file has no event to wait for
                self.wfile.write(b"0\r\n\r\n")
            except (BrokenPipeError, ConnectionResetError):
                pass


class _KubeletServer(http.server.ThreadingHTTPServer):
    """The HTTPS server of the harness's kubelet endpoint (one thread per request)."""

    daemon_threads = True

    def __init__(self, harness: "NodeHarness", host: str, cert: Path, key: Path) -> None:
        super().__init__((host, 0), _KubeletHandler)
        self.harness = harness
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert, key)
        self.socket = ctx.wrap_socket(self.socket, server_side=True)


class NodeHarness:
    """Plays the kubelet for harness-labelled pods bound to Node `node_name` (see the module docstring).

    Args:
        api: an admin ``kubernetes.client.ApiClient`` for the test apiserver.
        node_name: the Node to create and serve (it gets no kwok label, so kwok leaves it alone).
        workdir: where per-pod directories go (created).
        refresh_fraction: rewrite a projected token once this fraction of its lifetime passed (0 < f < 1).
        refresh_after_seconds: if set, refresh tokens at this fixed period instead (tests of the refresh).
        unshare: the unshare command to use.
        kubelet_host: the IP address the kubelet endpoint (container logs) listens on and the Node's InternalIP.

    Attribute ``runtime_message`` (default ``None``): when set, every termination message the harness reports
    from then on gets this text and ``": "`` in front, as a kubelet does when the container runtime has a
    message of its own. The session fixture's harness is shared: a test sets it with ``monkeypatch.setattr``.
    :meth:`hold_pods` / :meth:`release_held` keep chosen pods Pending (unstarted) until released; attribute
    ``held`` (``{uid: pod}``) is what is held now.

    Raises HarnessError from the constructor when unshare is missing or cannot make mount namespaces.
    Use ``start()`` / ``stop()``, or the object as a context manager.
    """

    def __init__(self, api: client.ApiClient, node_name: str, workdir: Path, *,
                 refresh_fraction: float = 0.8, refresh_after_seconds: float | None = None,
                 unshare: str = "unshare", kubelet_host: str = "127.0.0.1"):
        if not 0 < refresh_fraction < 1:
            raise ValueError(f"refresh_fraction must be in (0, 1), got {refresh_fraction}")
        self.unshare = check_unshare(unshare)
        self.api, self.node_name = api, node_name
        self.core = client.CoreV1Api(api)
        self.server = api.configuration.host
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.refresh_fraction, self.refresh_after_seconds = refresh_fraction, refresh_after_seconds
        self.runs: dict[str, _PodRun] = {}
        self.errors: list[str] = []
        self.runtime_message: str | None = None
        self._mp_lock = threading.Lock()
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None
        self._stream: watch.Watch | None = None  # the watcher's current stream, stopped from stop()
        self.kubelet_host = kubelet_host
        self.kubelet_port = 0
        self._kubelet: _KubeletServer | None = None
        self.lost = False  # lose_node(): no status write, no delete from now on
        self._hold: Callable[[client.V1Pod], bool] | None = None
        self.held: dict[str, client.V1Pod] = {}
        self._hold_lock = threading.Lock()

    @property
    def label_selector(self) -> str:
        """The label selector a pod needs to be driven by this harness."""
        return f"{HARNESS_LABEL}={self.node_name}"

    @property
    def pod_labels(self) -> dict[str, str]:
        """The labels to put on a pod so this harness runs it (with ``spec.nodeName = node_name``)."""
        return {HARNESS_LABEL: self.node_name}

    def stash_dir(self, pod_dir: str, index: int) -> str:
        """An empty host directory outside ``/tmp`` (under ``/run/leoflow-harness``) where a pod's mount script
        binds a host directory before a volume goes over it (:meth:`_PodRun._mount_script`); removed by
        :meth:`stop`."""
        path = Path("/run/leoflow-harness") / f"{os.getpid()}-{id(self):x}" / pod_dir / str(index)
        path.mkdir(parents=True, exist_ok=True)
        return str(path)

    def ensure_mount_point(self, path: str, is_dir: bool) -> None:
        """Create an empty directory or file at `path` on the host if missing, to bind-mount over.

        The placeholder stays after :meth:`stop`: another harness on this machine (a second test process) may be
        binding over the same path (``/dev/termination-log``, ``/var/run/secrets/leoflow``), and removing it
        under that harness made its next pod fail to start. Raises Unsupported if `path` exists with the other
        type.
        """
        p = Path(path)
        with self._mp_lock:
            if p.exists():
                if p.is_dir() != is_dir:
                    raise Unsupported(f"mount path {path!r} exists as a {'directory' if p.is_dir() else 'file'}")
                return
            p.parent.mkdir(parents=True, exist_ok=True)
            if is_dir:
                p.mkdir(exist_ok=True)
            else:
                p.touch()

    def run_named(self, namespace: str, name: str) -> _PodRun | None:
        """The harness's run of the newest pod ``namespace/name`` it started, or None."""
        for run in reversed(list(self.runs.values())):
            if run.ns == namespace and run.name == name:
                return run
        return None

    def oom_kill(self, namespace: str, name: str, container: str = "base") -> None:
        """Play the kernel's OOM killer on a running pod: SIGKILL ``container``'s process group now. Its
        ``state.terminated`` then reports reason ``OOMKilled`` and exit code 137, as the container runtime does
        (facts §6.6); the pod ends Failed once every container has ended (``restartPolicy: Never``).

        Raises HarnessError when the harness runs no such pod or container, or the container already ended."""
        run = self.run_named(namespace, name)
        proc = run.procs.get(container) if run is not None else None
        if run is None or proc is None or proc.poll() is not None:
            raise HarnessError(f"no running container {container!r} in pod {namespace}/{name} to OOM-kill")
        run.oom_killed.add(container)
        kill_tree(proc.pid)

    def exceed_deadline(self, namespace: str, name: str) -> None:
        """Play the kubelet's ``activeDeadlineSeconds`` check on a running pod, now: its containers are stopped as
        for a deletion (SIGTERM, SIGKILL after the pod's grace period) and the pod ends Failed with reason
        ``DeadlineExceeded`` and the kubelet's message (:data:`DEADLINE_EXCEEDED_MESSAGE`;
        ``k8s:pkg/kubelet/active_deadline.go``). The pod stays (the kubelet deletes nothing here).

        Raises HarnessError when the harness runs no such pod."""
        run = self.run_named(namespace, name)
        if run is None or run.done.is_set():
            raise HarnessError(f"no running pod {namespace}/{name} whose deadline could run out")
        run.pod_end = ("DeadlineExceeded", DEADLINE_EXCEEDED_MESSAGE)

    def lose_node(self, timeout: float = 30.0) -> None:
        """Play the loss of this node (a machine reclaimed or powered off), then its removal from the cluster:
        the harness stops serving it (no watch, no kubelet endpoint), every pod process is SIGKILLed and **no
        status is written** (a vanished kubelet reports nothing: its pods stay Running in the API server), and
        then the Node object is deleted, as a cloud controller or an operator deletes a gone machine's Node.
        The pods stay until PodGC (kube-controller-manager's ``pod-garbage-collector-controller``) finds them
        bound to a Node that no longer exists: it marks them Failed with condition ``DisruptionTarget``
        (reason ``DeletionByPodGC``) and deletes them with grace 0, 40-60 s later (facts §6.6; scripts/k8senv).

        The harness is stopped for good (:meth:`stop` afterwards is harmless); serving the Node again takes a new
        ``NodeHarness``. Raises ``ApiException`` when the Node cannot be deleted (404 is fine: already gone)."""
        self.lost = True
        self.stop(grace=0.0, timeout=timeout)
        try:
            self.core.delete_node(self.node_name)
        except ApiException as e:
            if e.status != 404:
                raise

    def become_unreachable(self, timeout: float = 30.0) -> None:
        """Play a node that stops answering but is not removed (a network partition, a hung or powered-off machine
        nobody deleted): like :meth:`lose_node`, every pod process is SIGKILLed and **no status is written**, but
        the Node object stays. Its pods stay Running in the API server; a pod deleted now keeps its
        ``deletionTimestamp`` and never turns terminal (no kubelet confirms it), until its Node is deleted and
        PodGC removes it. Stopped for good, as :meth:`lose_node`."""
        self.lost = True
        self.stop(grace=0.0, timeout=timeout)

    def partition(self, timeout: float = 30.0) -> None:
        """Play a node cut off from the control plane while its machine runs on (a network partition between the
        kubelet and the API server): the harness stops watching and serving (a pod deleted now is never stopped,
        **no status is written**, ``pods/log`` is unreachable), but every pod process runs on, and reaches whatever
        it reached before (Airflow's api-server, unless the test cuts that too). Its pods stay Running in the API
        server; PodGC fails and removes them only once the Node is deleted. Pods created for the node from now on
        are not started: serving the node again takes a new ``NodeHarness`` (which leaves these pods alone: they
        are not Pending). :meth:`stop` still kills the processes. Idempotent."""
        self.lost = True
        self._stop.set()
        self._disconnect(timeout)

    def _disconnect(self, timeout: float) -> None:
        """End the watch (waiting up to ``timeout`` seconds for its thread) and the kubelet endpoint; idempotent."""
        if self._stream is not None:
            self._stream.stop()  # the client's stop() shuts the socket: the stream ends now, not at its timeout
        if self._watcher:
            self._watcher.join(timeout)
        if self._kubelet is not None:
            self._kubelet.shutdown()
            self._kubelet.server_close()
            self._kubelet = None

    def start(self) -> "NodeHarness":
        """Start the kubelet endpoint, create (or adopt) the Node with its address and kubelet port, mark it
        Ready, and start watching for pods. Returns self."""
        cert, key = self_signed_cert(self.kubelet_host, self.workdir)
        self._kubelet = _KubeletServer(self, self.kubelet_host, cert, key)
        self.kubelet_port = self._kubelet.server_address[1]
        threading.Thread(target=self._kubelet.serve_forever, name=f"harness-kubelet-{self.node_name}",
                         daemon=True).start()
        node = client.V1Node(metadata=client.V1ObjectMeta(
            name=self.node_name, labels={"kubernetes.io/hostname": self.node_name, HARNESS_LABEL: "node"}))
        try:
            self.core.create_node(node)
        except ApiException as e:
            if e.status != 409:
                raise
        now = _now()
        self.core.patch_node_status(self.node_name, {"status": {
            "conditions": [{"type": "Ready", "status": "True", "reason": "HarnessReady", "message": "node harness",
                            "lastHeartbeatTime": now, "lastTransitionTime": now}],
            "addresses": [{"type": "InternalIP", "address": self.kubelet_host},
                          {"type": "Hostname", "address": self.node_name}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": self.kubelet_port}},
            "capacity": {"cpu": "8", "memory": "16Gi", "pods": "110"},
            "allocatable": {"cpu": "8", "memory": "16Gi", "pods": "110"}}})
        self._watcher = threading.Thread(target=self._watch, name=f"harness-watch-{self.node_name}", daemon=True)
        self._watcher.start()
        return self

    def _handle(self, pod: client.V1Pod) -> None:
        """React to one observed pod: start a run for a new Pending pod, flag deletion of a running one."""
        uid = pod.metadata.uid
        run = self.runs.get(uid)
        if pod.metadata.deletion_timestamp is not None:
            self.held.pop(uid, None)
            if run is not None:
                run.deleting.set()
                if run.done.is_set():  # its containers stopped before the delete was seen: remove it now
                    run.remove()
            elif (pod.status.phase or "Pending") == "Pending":
                # never started by us: mark it Failed and release it as the kubelet would (TerminatePod makes a
                # deleted Pending pod Failed before the final delete; a finalizer then keeps it, terminal)
                try:
                    self.core.patch_namespaced_pod_status(
                        pod.metadata.name, pod.metadata.namespace,
                        [{"op": "test", "path": "/metadata/uid", "value": uid},
                         {"op": "replace", "path": "/status/phase", "value": "Failed"}],
                        _content_type="application/json-patch+json")
                except ApiException as e:
                    if e.status not in (404, 409, 422):
                        raise
                try:
                    self.core.delete_namespaced_pod(pod.metadata.name, pod.metadata.namespace,
                                                    body=client.V1DeleteOptions(
                                                        grace_period_seconds=0,
                                                        preconditions=client.V1Preconditions(uid=uid)))
                except ApiException as e:
                    if e.status not in (404, 409):
                        raise
            return
        if run is None and (pod.status.phase or "Pending") == "Pending":
            with self._hold_lock:
                if uid in self.runs or self._holds(pod):
                    return
                run = _PodRun(self, pod)
                self.runs[uid] = run
            run.thread.start()

    def hold_pods(self, predicate: Callable[[client.V1Pod], bool] | None) -> None:
        """Leave every pod for which ``predicate(pod)`` is true unstarted (Pending, no container status), as
        a node that cannot pull the image or is out of resources would, until :meth:`release_held`; ``None``
        holds nothing new. A held pod that is deleted is released as the kubelet releases a pod it never
        started (grace 0, UID precondition), never started."""
        self._hold = predicate

    def release_held(self, uid: str | None = None) -> list[str]:
        """Start the held pod ``uid`` (``None``: every held pod) as if just observed; returns the UIDs
        started. A pod deleted meanwhile is not started (its next event releases it)."""
        runs = []
        with self._hold_lock:
            for held_uid in [u for u in list(self.held) if uid is None or u == uid]:
                pod = self.held.pop(held_uid)
                if held_uid not in self.runs and pod.metadata.deletion_timestamp is None:
                    runs.append(self.runs.setdefault(held_uid, _PodRun(self, pod)))
        for run in runs:
            run.thread.start()
        return [run.uid for run in runs]

    def _holds(self, pod: client.V1Pod) -> bool:
        """True (and the pod kept in :attr:`held`) when the hold predicate picks this new Pending pod."""
        uid = pod.metadata.uid
        if uid in self.held or (self._hold is not None and self._hold(pod)):
            self.held[uid] = pod
            return True
        return False

    def _watch(self) -> None:
        """Thread body: list + watch harness pods on our node until stop(); relist on 410 or errors."""
        sel = dict(field_selector=f"spec.nodeName={self.node_name}", label_selector=self.label_selector)
        while not self._stop.is_set():
            try:
                lst = self.core.list_pod_for_all_namespaces(**sel)
                for pod in lst.items:
                    self._handle(pod)
                rv = lst.metadata.resource_version
                w = self._stream = watch.Watch()
                if self._stop.is_set():
                    break
                for ev in w.stream(self.core.list_pod_for_all_namespaces, resource_version=rv,
                                   timeout_seconds=5, allow_watch_bookmarks=True, **sel):
                    if self._stop.is_set():
                        w.stop()
                        break
                    if ev["type"] in ("ADDED", "MODIFIED", "DELETED") and ev["type"] != "DELETED":
                        self._handle(ev["object"])
            except ApiException as e:
                if e.status != 410 and not self._stop.is_set():
                    self.errors.append(f"watch: {e.status} {e.reason}")
                    self._stop.wait(0.5)
            except Exception as e:  # noqa: BLE001 - keep watching; report at stop()
                if not self._stop.is_set():
                    self.errors.append(f"watch: {e!r}")
                    self._stop.wait(0.5)

    def stop(self, grace: float = 0.0, timeout: float = 15.0) -> None:
        """Stop watching and kill every process still running (SIGTERM, SIGKILL after ``grace`` seconds; 0:
        SIGKILL at once), waiting up to ``timeout`` seconds for the watcher and each pod's thread. Mount-point
        placeholders stay: see :meth:`ensure_mount_point`. Idempotent."""
        self._stop.set()
        for run in list(self.runs.values()):
            run._stop_procs(grace)
            run.done.set()
        self._disconnect(timeout)
        for run in list(self.runs.values()):
            run.thread.join(timeout)
        shutil.rmtree(Path("/run/leoflow-harness") / f"{os.getpid()}-{id(self):x}", ignore_errors=True)

    def __enter__(self) -> "NodeHarness":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def decode_jwt_claims(token: str) -> dict:
    """Return the (unverified) claims of a JWT, for assertions in tests."""
    payload = token.split(".")[1]
    return json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
