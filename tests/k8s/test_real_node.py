"""The real node (``scripts/k8senv start --real-node``: a kubelet and containerd on this machine) behaves as the
node harness and leoflow assume, and leoflow's agent image is the Dockerfile's.

Every other Kubernetes test ran its pods in the node harness (``tests/k8s/harness.py``), a stand-in written here;
these put the same questions to a real kubelet (the facts the harness models are in
``shared/research/real-node-facts.md``):

* the termination message: the last 4,096 bytes of the file, the pod-wide 12,288 bytes cut keeping each
  container's head, the log tail under ``FallbackToLogsOnError``, as :func:`tests.k8s.harness.kubelet_message`
  computes it;
* the ends leoflow reads from pod status (:func:`leoflow_airflow.runtime.kubernetes.status.end_cause`):
  ``OOMKilled`` under a memory limit, ``DeadlineExceeded``, an eviction through the Eviction API;
* a pod no Node fits: the kube-scheduler's ``PodScheduled`` condition is what leoflow's start check reads as
  backpressure (:func:`leoflow_airflow.runtime.kubernetes.decide.start_progress`), and the pod runs once it fits;
* a deleted pod's container gets SIGTERM, and a finalizer keeps the ended pod (its record readable) until removed;
* pods reach this machine at the bridge address and nothing beyond it;
* the agent image (``scripts/k8senv image``) has the Dockerfile's user, entrypoint and command, and the Python
  packages constraints.txt pins.

Run with ``--real-node`` (root; builds the kubelet and the images on first use).
"""

from __future__ import annotations

import json
from datetime import timedelta
import re
import socket
import subprocess
import sys
import tarfile
import threading
import time
import tomllib
from pathlib import Path

import pytest
from kubernetes import client, config

from devtools import k8senv
from devtools.dockerfile import image_process
from leoflow_airflow.lifecycle.runtime import StartState
from leoflow_airflow.runtime.kubernetes.decide import start_progress
from leoflow_airflow.runtime.kubernetes.status import EndKind, end_cause, pod_view
from tests.k8s.harness import MAX_LOG_MESSAGE_BYTES, MAX_LOG_MESSAGE_LINES, kubelet_message

pytestmark = [pytest.mark.k8s, pytest.mark.real_node, pytest.mark.timeout(1800)]

REPO = Path(__file__).resolve().parents[2]
BUSYBOX = "leoflow.local/busybox:1"
NAMESPACE = "real-node"
FINALIZER = "leoflow.io/outcome-record"


def _release(core: client.CoreV1Api, name: str) -> None:
    """Remove pod ``name``'s finalizers (it goes, if deleted)."""
    core.patch_namespaced_pod(name, NAMESPACE, {"metadata": {"finalizers": None}})


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory):
    """A control plane with the real node, a kube-scheduler and no kwok Node, the agent image imported; yields
    ``(env, core, image)`` (the CoreV1Api as admin, the agent image's name) and stops it all at the end."""
    k8senv.build(with_node=True)
    archive, image = k8senv.agent_image()
    d = tmp_path_factory.mktemp("real-node")
    env = k8senv.start(d, nodes=0, real_node=True, images=(archive,), scheduler=True)
    api = config.new_client_from_config(config_file=str(env.kubeconfig))
    core = client.CoreV1Api(api)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=NAMESPACE)))
    try:
        yield env, core, image
    finally:
        api.close()
        problem = k8senv.stop(d)
        assert problem is None, problem


def _pod(core: client.CoreV1Api, env: k8senv.K8sEnv, name: str, script: str, *, containers: int = 1,
         finalizer: bool = False, **spec: object) -> None:
    """Create pod ``name`` on the real node: ``containers`` busybox containers (``base``, ``c1`` ...) running
    ``script`` under ``sh -c`` (``$C`` is the container's name), restartPolicy Never, more ``spec`` fields; with
    ``finalizer``, leoflow's finalizer :data:`FINALIZER` (the pod stays once deleted until it is removed)."""
    meta = {"name": name, "namespace": NAMESPACE, **({"finalizers": [FINALIZER]} if finalizer else {})}
    body = {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"nodeName": env.real_node["name"], "restartPolicy": "Never", "terminationGracePeriodSeconds": 5,
                     "containers": [{"name": c, "image": BUSYBOX, "command": ["/bin/sh", "-c", script],
                                     "env": [{"name": "C", "value": c}]}
                                    for c in ["base", *(f"c{i}" for i in range(1, containers))]], **spec}}
    container_fields = body["spec"].pop("container", None)
    if container_fields:
        for c in body["spec"]["containers"]:
            c.update(container_fields)
    core.create_namespaced_pod(NAMESPACE, body)


def _raw(core: client.CoreV1Api, name: str) -> dict:
    """Pod ``name`` as the API server's JSON (camelCase), as leoflow's informer reads it."""
    resp = core.read_namespaced_pod(name, NAMESPACE, _preload_content=False)
    return json.loads(resp.data)


def _wait(core: client.CoreV1Api, name: str, until, timeout: float = 120) -> dict:
    """Poll pod ``name`` until ``until(pod_json)``; return that JSON. Fails the test after ``timeout`` s."""
    deadline, pod = time.monotonic() + timeout, {}
    while time.monotonic() < deadline:
        pod = _raw(core, name)
        if until(pod):
            return pod
        time.sleep(0.3)
    pytest.fail(f"pod {name} did not get there in {timeout:g} s: {json.dumps(pod.get('status'))[:2000]}")


def _ended(pod: dict) -> bool:
    return pod.get("status", {}).get("phase") in ("Succeeded", "Failed")


def _messages(pod: dict) -> dict[str, str]:
    return {s["name"]: s["state"]["terminated"].get("message", "")
            for s in pod["status"]["containerStatuses"]}


def test_termination_messages_are_cut_as_the_harness_cuts_them(node) -> None:
    """The kubelet keeps the last 4,096 bytes of a termination file; with four containers each message is cut
    to 12,288 // 4 bytes keeping its head; a failed container with an empty file under FallbackToLogsOnError gets
    its log's last 80 lines. Each equals what the harness reports (``kubelet_message``)."""
    env, core, _ = node
    write = 'head -c {h} /dev/zero | tr "\\0" H > /dev/termination-log; head -c {t} /dev/zero | tr "\\0" T >> /dev/termination-log'
    _pod(core, env, "msg-one", write.format(h=3000, t=3000))
    _pod(core, env, "msg-four", write.format(h=2000, t=2000), containers=4)
    _pod(core, env, "msg-logs", 'for i in $(seq 1 100); do echo "log line $i of $C"; done; exit 1',
         container={"terminationMessagePolicy": "FallbackToLogsOnError"})
    one = _messages(_wait(core, "msg-one", _ended))
    assert one["base"] == kubelet_message(b"H" * 3000 + b"T" * 3000, containers=1)
    assert one["base"] == "H" * 1096 + "T" * 3000
    four = _messages(_wait(core, "msg-four", _ended))
    assert set(four) == {"base", "c1", "c2", "c3"}
    for message in four.values():
        assert message == kubelet_message(b"H" * 2000 + b"T" * 2000, containers=4)
    logs = _wait(core, "msg-logs", _ended)
    lines = [f"log line {i} of base".encode() for i in range(1, 101)]
    tail = b"\n".join(lines[-MAX_LOG_MESSAGE_LINES:])[-MAX_LOG_MESSAGE_BYTES:]
    assert _messages(logs)["base"].rstrip("\n") == kubelet_message(b"", containers=1, log_tail=tail)
    assert logs["status"]["phase"] == "Failed"


def test_the_ends_leoflow_reads_come_from_the_kubelet(node) -> None:
    """A container over its memory limit ends OOMKilled (exit 137), a pod past activeDeadlineSeconds ends
    DeadlineExceeded, a pod evicted through the Eviction API carries DisruptionTarget: leoflow's ``end_cause``
    reads each as its kind from the status the kubelet wrote."""
    env, core, _ = node
    _pod(core, env, "oom", 'x=$(head -c 300000000 /dev/zero | tr "\\0" a); echo survived',
         container={"resources": {"limits": {"memory": "64Mi"}}})
    _pod(core, env, "deadline", "sleep 600", activeDeadlineSeconds=3)
    _pod(core, env, "evicted", "trap 'exit 0' TERM; sleep 600 & wait", finalizer=True)
    _wait(core, "evicted", lambda p: any(s.get("state", {}).get("running")
                                         for s in p.get("status", {}).get("containerStatuses", [])))
    core.create_namespaced_pod_eviction("evicted", NAMESPACE, client.V1Eviction(
        metadata=client.V1ObjectMeta(name="evicted", namespace=NAMESPACE)))

    oom = _wait(core, "oom", _ended)
    terminated = oom["status"]["containerStatuses"][0]["state"]["terminated"]
    assert (terminated["reason"], terminated["exitCode"]) == ("OOMKilled", 137)
    assert end_cause(pod_view(oom)).kind is EndKind.OOM_KILLED

    deadline = _wait(core, "deadline", _ended)
    assert deadline["status"]["reason"] == "DeadlineExceeded"
    assert end_cause(pod_view(deadline)).kind is EndKind.DEADLINE_EXCEEDED

    evicted = _wait(core, "evicted", lambda p: any(
        c["type"] == "DisruptionTarget" for c in p.get("status", {}).get("conditions", [])), timeout=60)
    cause = end_cause(pod_view(evicted))
    assert cause is not None and cause.kind is EndKind.INFRA_LOSS, cause
    assert "EvictionByEvictionAPI" in cause.reason
    _release(core, "evicted")


def _condition(pod: dict, kind: str) -> dict | None:
    return next((c for c in pod.get("status", {}).get("conditions") or [] if c["type"] == kind), None)


def _unschedulable(pod: dict) -> bool:
    c = _condition(pod, "PodScheduled")
    return c is not None and c["status"] == "False" and c.get("reason") == "Unschedulable"


def test_a_pod_no_node_fits_waits_as_backpressure_and_runs_once_it_fits(node) -> None:
    """Two pods that name no Node, left to the kube-scheduler: one whose nodeSelector no Node matches, one asking
    for more CPU than the node has. Each stays Pending with condition ``PodScheduled`` False, reason
    ``Unschedulable``, the scheduler's "0/1 nodes are available" message; leoflow's start check reads each as
    ``NO_ROOM`` (backpressure, bounded by ``[leoflow] pod_unschedulable_timeout`` from the condition's
    ``lastTransitionTime``) naming that message. Once the Node carries the label, the first is bound to it and runs
    to its end; the second stays unschedulable."""
    env, core, _ = node
    label, node_name = "leoflow.test/room", env.real_node["name"]
    _pod(core, env, "no-node", "echo ran", nodeName=None, nodeSelector={label: "yes"})
    _pod(core, env, "no-cpu", "echo ran", nodeName=None, container={"resources": {"requests": {"cpu": "64"}}})
    try:
        for name, said in (("no-node", "didn't match Pod's node affinity/selector"), ("no-cpu", "Insufficient cpu")):
            pod = _wait(core, name, _unschedulable, timeout=60)
            assert pod["spec"].get("nodeName") is None
            message = _condition(pod, "PodScheduled")["message"]
            assert message.startswith("0/1 nodes are available") and said in message, message
            view = pod_view(pod)
            progress = start_progress(view, first_seen=view.created_at, unschedulable_timeout=300)
            assert progress.state is StartState.NO_ROOM, progress
            assert progress.since == view.unschedulable_since is not None
            assert progress.until - progress.since == timedelta(seconds=300)
            assert message in progress.reason and f"pod {name} is unschedulable" in progress.reason
        core.patch_node(node_name, {"metadata": {"labels": {label: "yes"}}})
        ran = _wait(core, "no-node", _ended, timeout=120)
        assert (ran["spec"]["nodeName"], ran["status"]["phase"]) == (node_name, "Succeeded")
        assert _condition(ran, "PodScheduled")["status"] == "True"
        assert _unschedulable(_raw(core, "no-cpu"))
    finally:
        core.patch_node(node_name, {"metadata": {"labels": {label: None}}})
        for name in ("no-node", "no-cpu"):
            core.delete_namespaced_pod(name, NAMESPACE, grace_period_seconds=0)


def test_a_deleted_pod_gets_sigterm_and_its_finalizer_keeps_its_record(node) -> None:
    """Deleting a running pod that holds a finalizer sends its container SIGTERM (its trap writes the
    termination message, as leoflow's agent does); the pod ends Failed with that message and stays readable,
    deletionTimestamp set, until the finalizer is removed; then it is gone."""
    env, core, _ = node
    _pod(core, env, "deleted", "trap 'echo -n got-sigterm > /dev/termination-log; exit 143' TERM; "
                               "sleep 600 & wait", finalizer=True)
    _wait(core, "deleted", lambda p: any(s.get("state", {}).get("running")
                                         for s in p.get("status", {}).get("containerStatuses", [])))
    core.delete_namespaced_pod("deleted", NAMESPACE)
    pod = _wait(core, "deleted", _ended, timeout=60)
    assert pod["metadata"].get("deletionTimestamp")
    terminated = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert (terminated["exitCode"], terminated.get("message")) == (143, "got-sigterm")
    time.sleep(2)
    assert _raw(core, "deleted")["metadata"]["finalizers"] == [FINALIZER]
    _release(core, "deleted")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            _raw(core, "deleted")
        except client.ApiException as exc:
            assert exc.status == 404
            return
        time.sleep(0.3)
    pytest.fail("the pod stayed after its finalizer was removed")


def _drop_count(rule: str) -> int:
    """Packets counted by the node's own iptables rule ``rule`` (its text in ``iptables -S -v``)."""
    out = subprocess.run(["iptables", "-S", "FORWARD", "-v"], capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        if rule in line:
            return int(re.search(r"-c (\d+) ", line).group(1))
    raise AssertionError(f"no rule {rule!r} in:\n{out}")


BEYOND_NS, BEYOND_HOST_IF, BEYOND_NS_IF = "lfbeyond", "lfbeyond0", "lfbeyond1"
BEYOND_GATEWAY, BEYOND_IP, BEYOND_PORT = "198.51.100.129", "198.51.100.130", 8080
"""A test host beyond the bridge: a network namespace of this test at 198.51.100.130/25 (the other half of the
documentation range the pod network takes half of), reached from this machine through a veth pair."""
LISTENER = """
import socket, sys, time
server = socket.create_server(("0.0.0.0", int(sys.argv[1])))
server.settimeout(0.5)
print("listening", flush=True)
end = time.monotonic() + float(sys.argv[2])
while time.monotonic() < end:
    try:
        conn, peer = server.accept()
    except TimeoutError:
        continue
    with conn:
        conn.settimeout(2)
        print(peer[0], conn.recv(100).decode().strip(), flush=True)
"""


@pytest.fixture
def beyond_host():
    """The test host beyond the bridge, with a TCP listener on BEYOND_PORT that prints ``<peer> <data>`` per
    connection for 60 s; yields the listener's process (its stdout) and removes the namespace afterwards."""
    ns = ["ip", "netns", "exec", BEYOND_NS]
    steps = [["ip", "netns", "add", BEYOND_NS],
             ["ip", "link", "add", BEYOND_HOST_IF, "type", "veth", "peer", "name", BEYOND_NS_IF],
             ["ip", "link", "set", BEYOND_NS_IF, "netns", BEYOND_NS],
             ["ip", "addr", "add", f"{BEYOND_GATEWAY}/25", "dev", BEYOND_HOST_IF],
             ["ip", "link", "set", BEYOND_HOST_IF, "up"],
             [*ns, "ip", "addr", "add", f"{BEYOND_IP}/25", "dev", BEYOND_NS_IF],
             [*ns, "ip", "link", "set", BEYOND_NS_IF, "up"],
             [*ns, "ip", "route", "add", "default", "via", BEYOND_GATEWAY]]
    listener = None
    try:
        for step in steps:
            subprocess.run(step, check=True, capture_output=True, text=True)
        listener = subprocess.Popen([*ns, sys.executable, "-c", LISTENER, str(BEYOND_PORT), "60"],
                                    stdout=subprocess.PIPE, text=True)
        assert listener.stdout.readline().strip() == "listening"
        yield listener
    finally:
        if listener is not None:
            listener.kill()
            listener.wait()
        subprocess.run(["ip", "netns", "del", BEYOND_NS], capture_output=True)
        subprocess.run(["ip", "link", "del", BEYOND_HOST_IF], capture_output=True)


def test_pods_reach_this_machine_at_the_bridge_address_and_nothing_beyond(node, beyond_host) -> None:
    """A pod connects to a listener at the bridge address (where a test's Airflow api-server listens). A host
    beyond the bridge, which this machine itself reaches, never hears from the pod: the node's FORWARD rule
    drops the pod's packets (its counter rises)."""
    env, core, _ = node
    ip = env.real_node["ip"]
    received: list[bytes] = []
    server = socket.create_server((ip, 0))
    server.settimeout(90)
    port = server.getsockname()[1]

    def accept() -> None:
        conn, _ = server.accept()
        with conn:
            received.append(conn.recv(100))

    listener = threading.Thread(target=accept, daemon=True)
    listener.start()
    with socket.create_connection((BEYOND_IP, BEYOND_PORT), timeout=10) as control:
        control.sendall(b"from-this-machine\n")
    rule = f"-i {env.real_node['bridge']} ! -o {env.real_node['bridge']}"
    before = _drop_count(rule)
    _pod(core, env, "net", f"echo hello-from-pod | nc -w 5 {ip} {port}; echo rc=$?; "
                           f"echo from-pod | nc -w 3 {BEYOND_IP} {BEYOND_PORT}; echo beyond=$?")
    pod = _wait(core, "net", _ended)
    listener.join(10)
    server.close()
    log = core.read_namespaced_pod_log("net", NAMESPACE)
    assert received == [b"hello-from-pod\n"], log
    assert "rc=0" in log and "beyond=0" not in log, log
    assert pod["status"]["phase"] == "Succeeded"
    assert _drop_count(rule) > before
    beyond_host.kill()
    heard = beyond_host.stdout.read().splitlines()
    assert heard == [f"{BEYOND_GATEWAY} from-this-machine"], heard


def test_a_pod_still_reaches_the_bridge_after_the_port_of_the_lowest_mac_left(node) -> None:
    """Issue 35, found in the chaos suite on the real node: a Linux bridge whose MAC was never set takes the lowest
    MAC of its ports. When the pod whose veth had the lowest MAC ended, the bridge's MAC changed under every pod that
    had resolved the bridge's address to the old one, which no port owned any more: their connections to this
    machine (Airflow's api-server) timed out until their neighbour entries expired (20-50 s; a ``ConnectTimeout``
    in the Task SDK, then the agent's lease killing a healthy task). The node sets the bridge's MAC, so it never
    changes: a pod that connected while a port with the lowest possible MAC was on the bridge connects again at once
    after that port left."""
    env, core, _ = node
    ip, bridge = env.real_node["ip"], env.real_node["bridge"]
    received: list[bytes] = []
    server = socket.create_server((ip, 0))
    server.settimeout(60)
    port = server.getsockname()[1]

    def accept() -> None:
        for _ in range(2):
            conn, _ = server.accept()
            with conn:
                received.append(conn.recv(100))

    listener = threading.Thread(target=accept, daemon=True)
    listener.start()
    subprocess.run(["ip", "link", "add", "lfmactest0", "address", "00:00:00:00:00:01", "type", "veth", "peer",
                    "name", "lfmactest1"], check=True)
    try:
        subprocess.run(["ip", "link", "set", "lfmactest0", "master", bridge, "up"], check=True)
        before = Path(f"/sys/class/net/{bridge}/address").read_text().strip()
        _pod(core, env, "mac", f"echo first | nc -w 5 {ip} {port}; while [ ! -e /flag/go ]; do sleep 0.2; done; "
                               f"echo second | nc -w 5 {ip} {port}; echo rc=$?",
             volumes=[{"name": "flag", "emptyDir": {}}],
             container={"volumeMounts": [{"name": "flag", "mountPath": "/flag"}]})
        deadline = time.monotonic() + 60
        while len(received) < 1 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert received == [b"first\n"], received
    finally:
        subprocess.run(["ip", "link", "del", "lfmactest0"], check=False, capture_output=True)
    try:
        after = Path(f"/sys/class/net/{bridge}/address").read_text().strip()
        uid = _raw(core, "mac")["metadata"]["uid"]
        flag = Path(env.real_node["dir"]) / "kubelet" / "root" / "pods" / uid / "volumes" / "kubernetes.io~empty-dir"
        (flag / "flag" / "go").write_text("go\n")  # the pod's second connection, now
        pod = _wait(core, "mac", _ended, timeout=60)
        listener.join(10)
    finally:
        server.close()
    log = core.read_namespaced_pod_log("mac", NAMESPACE)
    assert received == [b"first\n", b"second\n"] and "rc=0" in log, (received, log, before, after)
    assert after == before, f"the bridge's MAC changed from {before} to {after}"
    assert pod["status"]["phase"] == "Succeeded"


def _image_config(archive: Path) -> dict:
    """The image config (``config`` of the OCI image config JSON) in an OCI archive of ``scripts/k8senv image``."""
    with tarfile.open(archive) as tar:
        index = json.load(tar.extractfile("index.json"))
        manifest = json.load(tar.extractfile(f"blobs/sha256/{index['manifests'][0]['digest'].split(':')[1]}"))
        return json.load(tar.extractfile(f"blobs/sha256/{manifest['config']['digest'].split(':')[1]}"))["config"]


def test_the_agent_image_runs_as_the_dockerfile_says(node) -> None:
    """The agent image built without Docker has docker/Dockerfile's user, ENTRYPOINT and CMD, and running it on
    the node shows uid 50000 named airflow, the Airflow and leoflow versions the repository pins, and every installed
    distribution that constraints.txt pins at its pinned version."""
    env, core, image = node
    archive, _ = k8senv.agent_image()
    want = image_process(REPO / "docker" / "Dockerfile")
    got = _image_config(archive)
    assert got["User"] == want.user
    assert tuple(got["Entrypoint"]) == want.entrypoint
    assert tuple(got["Cmd"]) == want.cmd
    script = ("import getpass, importlib.metadata as m, json, os; "
              "print(json.dumps({'uid': os.getuid(), 'user': getpass.getuser(), 'home': os.environ['HOME'], "
              "'dists': {d.metadata['Name'].lower(): d.version for d in m.distributions()}}))")
    core.create_namespaced_pod(NAMESPACE, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "agent-image"},
        "spec": {"nodeName": env.real_node["name"], "restartPolicy": "Never",
                 "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
                 "containers": [{"name": "base", "image": image, "args": ["python", "-c", script],
                                 "securityContext": {"allowPrivilegeEscalation": False,
                                                     "capabilities": {"drop": ["ALL"]}}}]}})
    pod = _wait(core, "agent-image", _ended, timeout=180)
    log = core.read_namespaced_pod_log("agent-image", NAMESPACE)
    assert pod["status"]["phase"] == "Succeeded", log
    seen = json.loads(log.strip().splitlines()[-1])
    # the Task SDK refuses a uid without a name ("The user that Airflow is running as has no username"): the
    # official image's user is airflow, and so is this one's
    assert (seen["uid"], seen["user"], seen["home"]) == (50000, "airflow", "/home/airflow")
    pins = dict(re.match(r"([A-Za-z0-9_.-]+)==([^\s;]+)", line).groups()
                for line in (REPO / "constraints.txt").read_text().splitlines()
                if re.match(r"[A-Za-z0-9_.-]+==", line))
    pins = {re.sub(r"[-_.]+", "-", k).lower(): v for k, v in pins.items()}
    dists = {re.sub(r"[-_.]+", "-", k): v for k, v in seen["dists"].items()}
    assert dists["apache-airflow"] == pins["apache-airflow"]
    assert dists["leoflow"] == tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    off = {name: (version, pins[name]) for name, version in dists.items() if name in pins and pins[name] != version}
    assert not off, f"installed at other versions than constraints.txt pins: {off}"
