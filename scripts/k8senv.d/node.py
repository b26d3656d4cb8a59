"""The real test node of scripts/k8senv: a kubelet and containerd on this machine, joined to the control plane.

`scripts/k8senv start --real-node` calls :func:`start_node` once the control plane is ready, and `stop` calls
:func:`stop_node` before it stops the control plane. The recipe, and why each setting is needed on this kind of
machine, is ``shared/research/real-node-facts.md``:

- containerd (Debian's 1.6, with runc and the CNI plugins) runs as a plain process with its root, state and
  socket under DIR/node/containerd; ``restrict_oom_score_adj = true`` because the machine lacks
  CAP_SYS_RESOURCE; its sandbox image is the locally built ``leoflow.local/pause:1``;
- the kubelet (built by ``scripts/k8senv build --node`` at the control plane's pin) runs with its root under
  DIR/node/kubelet, ``failCgroupV1: false`` (a cgroup v1 host), ``cgroupDriver: cgroupfs``, authenticating as
  ``system:node:<name>`` in group ``system:nodes`` (bound to the ``system:node`` ClusterRole here, since the
  control plane runs RBAC without the Node authorizer);
- the pod network is the bridge ``lfnode0`` at 198.51.100.1/25 (half of a documentation range; not 192.0.2.0/24,
  which this kind of machine's own network may use: :func:`check_subnet_free`), pods from 198.51.100.16 up.
  Pods reach this machine at 198.51.100.1 (an Airflow api-server or exchange listening there) and nothing else:
  forwarding out of the bridge is dropped, pods get no DNS, and the kubelet's port is closed to them.

`scripts/k8senv node ACTION` calls :func:`node_action`: the faults a test plays on a running node (its kubelet
stopped or restarted, its pods cut off from a port of this machine, the node lost and revived; :data:`ACTIONS`).

A kubelet changes the machine (iptables chains, cgroups, mounts, network namespaces) and leaves its containers
running when stopped, so only one real node runs on a machine at a time (:data:`LOCK`), and :func:`stop_node`
undoes all of it: containers killed through containerd, the shims, mounts under DIR/node and the pods' network
namespaces, the bridge, the iptables rules and chains, the kubepods cgroups. Only the standard library is used,
plus `ip`, `iptables`, `ctr` and `mount`/`umount`.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import signal
import subprocess
import time
import urllib.error
from pathlib import Path
from typing import Any, Callable

import oci

NODE_NAME = "leoflow-node"
NODE_LABEL = "leoflow.test/real-node"
BRIDGE = "lfnode0"
NODE_IP = "198.51.100.1"
BRIDGE_MAC = "02:00:c6:33:64:01"
"""The bridge's MAC, set explicitly (locally administered; the last four bytes are NODE_IP). A Linux bridge whose
MAC was not set takes the lowest MAC of its ports, so it changed as pods' veths came and went: once the pod whose
veth had the lowest MAC ended, every pod that had resolved NODE_IP to it sent to a MAC no port owned until its
neighbour entry expired, 20-50 s in which its connections to this machine timed out (the real node's
ConnectTimeouts, issue 35; tests/k8s/test_real_node.py)."""
POD_SUBNET = "198.51.100.0/25"
POD_PREFIX = 25
POD_RANGE_START, POD_RANGE_END = "198.51.100.16", "198.51.100.126"
CNI_NETWORK = "leoflow-k8senv"
CNI_BIN_DIR = Path("/usr/lib/cni")
PAUSE_IMAGE = "leoflow.local/pause:1"
BUSYBOX_IMAGE = "leoflow.local/busybox:1"
LOCK = Path("/run/leoflow-k8senv-real-node.json")
"""Which env directory holds this machine's real node: one at a time (its iptables chains and cgroups are the
machine's)."""
PACKAGES = ("containerd", "runc", "containernetworking-plugins", "iptables", "busybox-static")
"""Debian packages the real node needs (``scripts/run-tests`` installs them)."""
NETNS_DIR = Path("/var/run/netns").resolve()
"""Where the CRI puts each pod sandbox's network namespace (``cni-<uuid>``), as mountinfo names it (/var/run is a
link to /run)."""
CGROUP_ROOT = Path("/sys/fs/cgroup")
KUBELET_CHAINS = ("KUBE-IPTABLES-HINT", "KUBE-KUBELET-CANARY", "KUBE-FIREWALL")


class NodeError(Exception):
    """The real node could not be set up or torn down; the message says why (and how to fix it)."""


def check_prerequisites(bins: Path) -> None:
    """Raise NodeError unless this process is root and the kubelet, containerd, runc, ctr, the CNI plugins,
    `ip` and `iptables` are all present."""
    if os.geteuid() != 0:
        raise NodeError("a real node needs root (containerd, the kubelet, a bridge and iptables)")
    missing = [b for b in ("containerd", "runc", "ctr", "ip", "iptables") if not shutil.which(b)]
    missing += [str(CNI_BIN_DIR / p) for p in ("bridge", "host-local", "loopback") if not (CNI_BIN_DIR / p).exists()]
    if missing:
        raise NodeError(f"missing {', '.join(missing)}: apt-get install {' '.join(PACKAGES)}")
    for b in ("kubelet", "pause"):
        if not (bins / b).is_file():
            raise NodeError(f"{bins / b} is not built; run `scripts/k8senv build --node`")


def _run(*argv: str, check: bool = True, timeout: float = 60, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run a command, capturing its output; raise NodeError when `check` and it fails."""
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
    if check and r.returncode != 0:
        raise NodeError(f"{' '.join(argv)} failed (exit {r.returncode}): {(r.stderr or r.stdout).strip()}")
    return r


def _claim_lock(d: Path, alive: Callable[[int, int], bool]) -> None:
    """Record `d` as the machine's real node in LOCK; raise NodeError while another env's node still runs."""
    if LOCK.exists():
        try:
            held = json.loads(LOCK.read_text())
        except (OSError, ValueError):
            held = {}
        other = held.get("dir")
        if other and other != str(d) and any(alive(p["pid"], p["start_ticks"]) for p in held.get("processes", [])):
            raise NodeError(f"a real node from {other} is running; `scripts/k8senv stop --dir {other}` first")
    LOCK.write_text(json.dumps({"dir": str(d), "processes": []}))


def _update_lock(d: Path, processes: list[dict]) -> None:
    """Record the node's processes in LOCK (for :func:`_claim_lock`'s liveness check)."""
    LOCK.write_text(json.dumps({"dir": str(d), "processes": processes}))


def containerd_config(nd: Path, root: Path) -> str:
    """Return containerd's configuration for node directory `nd`: containerd's own defaults with its root
    (`root`: images and snapshots, kept between nodes), state, socket (under `nd`), sandbox image, CNI
    directories and ``restrict_oom_score_adj`` replaced."""
    default = _run("containerd", "config", "default").stdout
    replacements = [
        ('root = "/var/lib/containerd"', f'root = "{root}"'),
        ('state = "/run/containerd"', f'state = "{nd}/containerd/state"'),
        ('address = "/run/containerd/containerd.sock"', f'address = "{nd}/containerd/containerd.sock"'),
        ('sandbox_image = "registry.k8s.io/pause:3.6"', f'sandbox_image = "{PAUSE_IMAGE}"'),
        ('bin_dir = "/opt/cni/bin"', f'bin_dir = "{CNI_BIN_DIR}"'),
        ('conf_dir = "/etc/cni/net.d"', f'conf_dir = "{nd}/cni/net.d"'),
        ("restrict_oom_score_adj = false", "restrict_oom_score_adj = true"),
    ]
    for old, new in replacements:
        if old not in default:
            raise NodeError(f"containerd's default configuration has no `{old}` (containerd version changed?)")
        default = default.replace(old, new, 1)
    return default


def cni_config(nd: Path) -> dict[str, Any]:
    """Return the CNI network configuration list: a bridge at NODE_IP, host-local addresses in POD_SUBNET (state
    under `nd`), a default route to the bridge, no masquerade."""
    return {"cniVersion": "1.0.0", "name": CNI_NETWORK, "plugins": [
        {"type": "bridge", "bridge": BRIDGE, "isGateway": True, "ipMasq": False, "hairpinMode": True,
         "ipam": {"type": "host-local", "dataDir": str(nd / "cni" / "ipam"),
                  "ranges": [[{"subnet": POD_SUBNET, "rangeStart": POD_RANGE_START, "rangeEnd": POD_RANGE_END,
                               "gateway": NODE_IP}]],
                  "routes": [{"dst": "0.0.0.0/0"}]}},
        {"type": "loopback"}]}


def kubelet_config(nd: Path, port: int, healthz_port: int) -> dict[str, Any]:
    """Return the KubeletConfiguration (kubelet.config.k8s.io/v1beta1) for node directory `nd`, serving on
    NODE_IP:`port` (the API server's pods/log goes there), healthz on 127.0.0.1:`healthz_port`."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
        "failCgroupV1": False, "cgroupDriver": "cgroupfs", "failSwapOn": False,
        "containerRuntimeEndpoint": f"unix://{nd}/containerd/containerd.sock",
        # the API server presents no client certificate to kubelets here (scripts/k8senv, pods/log)
        "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
        "authorization": {"mode": "AlwaysAllow"},
        "address": NODE_IP, "port": port, "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1", "healthzPort": healthz_port,
        "resolvConf": "",  # pods get no DNS server: their traffic stays on the bridge
        "volumePluginDir": str(nd / "kubelet" / "volume-plugins"),
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%",
                         "nodefs.inodesFree": "1%"},
        "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
        "registerNode": True, "maxPods": 110, "podPidsLimit": 4096,
        "serializeImagePulls": False,
    }


def check_subnet_free() -> None:
    """Raise NodeError when an address or route of this machine, on another device than BRIDGE, falls in
    POD_SUBNET: the bridge would then take traffic meant for this machine's own network."""
    net = ipaddress.ip_network(POD_SUBNET)
    clashes = []
    for line in _run("ip", "-o", "-4", "addr", "show").stdout.splitlines():
        parts = line.split()
        dev, cidr = parts[1], parts[3]
        if dev != BRIDGE and ipaddress.ip_interface(cidr).network.overlaps(net):
            clashes.append(f"address {cidr} on {dev}")
    for line in _run("ip", "-4", "route", "show").stdout.splitlines():
        parts = line.split()
        dest = parts[0]
        dev = parts[parts.index("dev") + 1] if "dev" in parts else ""
        if dest != "default" and dev != BRIDGE and ipaddress.ip_network(dest, strict=False).overlaps(net):
            clashes.append(f"route {dest} via {dev}")
    if clashes:
        raise NodeError(f"the pod network {POD_SUBNET} overlaps this machine's network ({'; '.join(clashes)})")


def _setup_network(kubelet_port: int) -> None:
    """Create the bridge at NODE_IP and the iptables rules that keep pods to it (see the module docstring)."""
    check_subnet_free()
    if _run("ip", "link", "show", BRIDGE, check=False).returncode != 0:
        _run("ip", "link", "add", BRIDGE, "type", "bridge")
    _run("ip", "link", "set", BRIDGE, "address", BRIDGE_MAC)  # never the lowest port's: see BRIDGE_MAC
    if NODE_IP not in _run("ip", "-o", "addr", "show", "dev", BRIDGE).stdout:
        _run("ip", "addr", "add", f"{NODE_IP}/{POD_PREFIX}", "dev", BRIDGE)
    _run("ip", "link", "set", BRIDGE, "up")
    for rule in _iptables_rules(kubelet_port):
        if _run("iptables", "-C", *rule, check=False).returncode != 0:
            _run("iptables", "-I", *rule)


def _iptables_rules(kubelet_port: int) -> list[list[str]]:
    """The node's own iptables rules: nothing routed out of the bridge, no pod at the kubelet's port."""
    return [["FORWARD", "-i", BRIDGE, "!", "-o", BRIDGE, "-j", "DROP"],
            ["INPUT", "-i", BRIDGE, "-p", "tcp", "--dport", str(kubelet_port), "-j", "DROP"]]


def _ctr(sock: str, *args: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run ``ctr`` against the node's containerd, namespace k8s.io (the CRI's)."""
    return _run("ctr", "--address", sock, "-n", "k8s.io", *args, check=check, timeout=timeout)


def sync_images(sock: str, images: list[Path]) -> dict[str, float]:
    """Make the node's containerd hold exactly the images of the OCI archives `images`, as far as leoflow's own
    names go: an archive whose image (name and manifest digest, :func:`oci.archive_image`) is there already is
    not imported again (containerd's root is kept between nodes: importing the agent image costs 10-50 s);
    images under ``leoflow.local/`` that no archive names are removed (containerd collects their content).
    Returns seconds spent per archive name (0 when reused). Raises NodeError when an import fails."""
    have = {}
    for line in _ctr(sock, "images", "ls").stdout.splitlines()[1:]:
        parts = line.split()
        if len(parts) >= 3:
            have[parts[0]] = parts[2]
    wanted, spent = {}, {}
    for archive in images:
        name, digest = oci.archive_image(archive)
        wanted[name] = digest
        ts = time.monotonic()
        if have.get(name) != digest:
            _ctr(sock, "images", "import", str(archive), timeout=600)
        spent[archive.name] = round(time.monotonic() - ts, 2)
    stale = [name for name in have if name.startswith("leoflow.local/") and name not in wanted]
    if stale:
        _ctr(sock, "images", "rm", *stale, check=False)
    return spent


def start_node(starter: Any, api: Callable[..., dict], images: list[Path], node_token: str,
               free_port: Callable[[], int], alive: Callable[[int, int], bool], containerd_root: Path,
               timeout: float = 120) -> dict:
    """Start containerd and the kubelet for the control plane that `starter` (k8senv's _Starter) just started,
    bring `images` (OCI archives; the pause and busybox images come first) into containerd (:func:`sync_images`),
    and wait until the Node is Ready. containerd keeps its images in `containerd_root` between nodes; containers
    a node that was killed left there are removed before the kubelet starts.

    `api(env, method, path, body)` calls the API server as admin; `node_token` is the kubelet's bearer token
    (listed in the control plane's token file as system:node:NODE_NAME, group system:nodes). Records the node in
    env.json under "real_node" and returns that record. Raises NodeError (with the end of the failing
    component's log) on a missing prerequisite, a failing component or `timeout` seconds without a Ready Node;
    the caller then stops everything.
    """
    d, env, bins = starter.d, starter.env, starter.bins
    check_prerequisites(bins)
    _claim_lock(d, alive)
    nd = d / "node"
    for sub in ("containerd", "cni/net.d", "cni/ipam", "kubelet/root", "kubelet/pki", "kubelet/volume-plugins"):
        (nd / sub).mkdir(parents=True, exist_ok=True)
    kubelet_port, healthz_port = free_port(), free_port()
    record = {"name": NODE_NAME, "ip": NODE_IP, "bridge": BRIDGE, "subnet": POD_SUBNET, "dir": str(nd),
              "kubelet_port": kubelet_port, "containerd_socket": str(nd / "containerd" / "containerd.sock"),
              "images": {}}
    env["real_node"] = record
    starter.save()
    _setup_network(kubelet_port)
    containerd_root.mkdir(parents=True, exist_ok=True)
    record["containerd_root"] = str(containerd_root)
    (nd / "containerd" / "config.toml").write_text(containerd_config(nd, containerd_root))
    (nd / "cni" / "net.d" / "10-leoflow.conflist").write_text(json.dumps(cni_config(nd), indent=2))
    containerd = _spawn_containerd(starter, record)
    record["images"] = sync_images(record["containerd_socket"], images)
    starter.save()

    api(env, "POST", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "k8senv-system-nodes"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:node"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:nodes"}]})
    (nd / "kubelet" / "kubeconfig").write_text(starter.kubeconfig(f"system:node:{NODE_NAME}", node_token))
    os.chmod(nd / "kubelet" / "kubeconfig", 0o600)
    (nd / "kubelet" / "config.yaml").write_text(json.dumps(kubelet_config(nd, kubelet_port, healthz_port), indent=2))
    kubelet = _spawn(starter, "kubelet", _kubelet_argv(nd))
    _wait_ready(starter, api, {"kubelet": kubelet, "containerd": containerd}, timeout)
    env["nodes"] = [*env.get("nodes", []), NODE_NAME]
    starter.save()
    return record


def _spawn(starter: Any, name: str, argv: list[str]) -> Any:
    """Start component `name` (replacing env.json's record of an earlier one of that name) and record it in LOCK."""
    starter.env["processes"] = [p for p in starter.env["processes"] if p["name"] != name]
    proc = starter.spawn(name, argv)
    _update_lock(starter.d, starter.env["processes"])
    return proc


def _spawn_containerd(starter: Any, record: dict, timeout: float = 30) -> Any:
    """Start the node's containerd, wait until it answers on its socket, and remove the containers a node that
    was killed left in its root (the kubelet that starts next creates its pods' sandboxes anew). Raises
    NodeError when it exits or does not answer within `timeout` seconds."""
    nd = Path(record["dir"])
    containerd = _spawn(starter, "containerd", ["/usr/bin/containerd", "--config", str(nd / "containerd/config.toml")])
    deadline = time.monotonic() + timeout
    while _run("ctr", "--address", record["containerd_socket"], "version", check=False).returncode != 0:
        if containerd.poll() is not None or time.monotonic() > deadline:
            raise NodeError(f"containerd did not answer on its socket:\n{_tail(starter.d / 'containerd.log')}")
        time.sleep(0.2)
    _remove_containers(record["containerd_socket"])
    return containerd


def _kubelet_argv(nd: Path) -> list[str]:
    """The kubelet's command line (its kubeconfig and config file written by :func:`start_node`)."""
    return ["kubelet", f"--kubeconfig={nd}/kubelet/kubeconfig", f"--config={nd}/kubelet/config.yaml",
            f"--root-dir={nd}/kubelet/root", f"--cert-dir={nd}/kubelet/pki", f"--hostname-override={NODE_NAME}",
            f"--node-ip={NODE_IP}", f"--node-labels={NODE_LABEL}=true", "--v=2"]


NOT_READY_TAINT = "node.kubernetes.io/not-ready"
"""The taint a kubelet registers its Node with; the node lifecycle controller removes it once the Node is Ready.
k8senv runs no such controller (it would also taint a frozen node unreachable and evict its pods: the chaos
suite's partitions are the tests' to play), so :func:`_wait_ready` removes it, as that controller would: a
kube-scheduler (``start --scheduler``) places no pod on a Node that carries it."""


def _wait_ready(starter: Any, api: Callable[..., dict], procs: dict[str, Any], timeout: float) -> None:
    """Wait until the Node is Ready (registered again, if it was deleted) and carries no NOT_READY_TAINT (removed
    here). Raises NodeError when one of `procs` (name -> Popen) exits or `timeout` seconds pass."""
    deadline = time.monotonic() + timeout
    while True:
        for name, p in procs.items():
            if p.poll() is not None:
                raise NodeError(f"{name} exited with {p.returncode}:\n{_tail(starter.d / f'{name}.log')}")
        try:
            node = api(starter.env, "GET", f"/api/v1/nodes/{NODE_NAME}")
            conds = {c["type"]: c["status"] for c in node.get("status", {}).get("conditions", [])}
            if conds.get("Ready") == "True":
                taints = node.get("spec", {}).get("taints") or []
                kept = [t for t in taints if t.get("key") != NOT_READY_TAINT]
                if kept == taints:
                    return
                node["spec"]["taints"] = kept or None  # PUT with its resourceVersion: a 409 is tried again
                api(starter.env, "PUT", f"/api/v1/nodes/{NODE_NAME}", node)
        except urllib.error.HTTPError as e:
            if e.code not in (404, 409):
                raise
        if time.monotonic() > deadline:
            raise NodeError(f"Node {NODE_NAME} not Ready after {timeout:g}s:\n{_tail(starter.d / 'kubelet.log')}")
        time.sleep(0.2)


ACTIONS = ("freeze", "thaw", "restart-kubelet", "cut", "uncut", "lose", "revive")
"""What `scripts/k8senv node ACTION` does to a running real node (the faults of the tests that need a real one):

- ``freeze``: SIGSTOP the kubelet: the node is cut off from its control plane (no status, no Node lease, no
  reaction to a delete) while its containers run on and their traffic still flows; ``thaw``: SIGCONT it;
- ``restart-kubelet``: SIGKILL the kubelet (frozen or not) and start a new one, which registers the Node again
  if it was deleted, then wait until the Node is Ready;
- ``cut --port P``: drop every packet from the pod network to this machine's TCP port P (the pods lose an
  Airflow api-server listening there, established connections included); ``uncut --port P`` undoes it;
- ``lose``: the node is lost whole: SIGKILL the kubelet, containerd, its shims and every process of every
  container (nothing reports; the pod objects stay as they were); ``revive``: start containerd and the kubelet
  again (the containers the lost node left are removed first), then wait until the Node is Ready."""
CUT_COMMENT = "leoflow-k8senv-cut"
"""The comment on the iptables rules of ``cut`` (:func:`stop_node` removes any that is left)."""


def node_action(starter: Any, api: Callable[..., dict], action: str, alive: Callable[[int, int], bool],
                port: int | None = None, timeout: float = 120) -> str:
    """Apply `action` (:data:`ACTIONS`) to the real node of the control plane whose env.json `starter` holds
    (its ``env`` loaded, so :meth:`spawn` records new processes there). Returns a line saying what was done.
    Raises NodeError without a real node, on an unknown action, a missing `port` for ``cut``/``uncut``, a
    component that is not running, or one that does not come back within `timeout` seconds."""
    env = starter.env
    record = env.get("real_node")
    if not record:
        raise NodeError(f"{starter.d} has no real node (start --real-node)")
    procs = {p["name"]: p for p in env.get("processes", [])}

    def running(name: str) -> dict:
        proc = procs.get(name)
        if not proc or proc.get("start_ticks") is None or not alive(proc["pid"], proc["start_ticks"]):
            raise NodeError(f"the real node's {name} is not running")
        return proc

    if action in ("freeze", "thaw"):
        os.kill(running("kubelet")["pid"], signal.SIGSTOP if action == "freeze" else signal.SIGCONT)
        return f"kubelet {'stopped (SIGSTOP)' if action == 'freeze' else 'continued (SIGCONT)'}"
    if action in ("cut", "uncut"):
        if port is None:
            raise NodeError(f"node {action} needs --port")
        rule = _cut_rule(record["bridge"], port)
        if action == "cut" and _run("iptables", "-C", *rule, check=False).returncode != 0:
            _run("iptables", "-I", *rule)
        while action == "uncut" and _run("iptables", "-C", *rule, check=False).returncode == 0:
            _run("iptables", "-D", *rule)
        return f"pods {'cut off from' if action == 'cut' else 'reach'} {record['ip']}:{port}"
    if action == "restart-kubelet":
        old = running("kubelet")
        os.kill(old["pid"], signal.SIGKILL)
        os.kill(old["pid"], signal.SIGCONT)
        _wait_gone(old, alive)
        containerd = running("containerd")
        kubelet = _spawn(starter, "kubelet", _kubelet_argv(Path(record["dir"])))
        _wait_ready(starter, api, {"kubelet": kubelet}, timeout)
        return f"kubelet restarted (pid {kubelet.pid}; containerd {containerd['pid']} kept); Node Ready"
    if action == "lose":
        killed = []
        for name in ("kubelet", "containerd"):
            proc = procs.get(name)
            if proc and proc.get("start_ticks") is not None and alive(proc["pid"], proc["start_ticks"]):
                os.kill(proc["pid"], signal.SIGKILL)
                os.kill(proc["pid"], signal.SIGCONT)
                _wait_gone(proc, alive)
                killed.append(name)
        shims = _pids_with_arg(record["containerd_socket"])
        members = _kubepods_pids()
        for pid in [*shims, *members]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return f"node lost: SIGKILL to {', '.join(killed) or 'nothing'}, {len(shims)} shims, {len(members)} " \
               "container processes"
    if action == "revive":
        if any(procs.get(n) and alive(procs[n]["pid"], procs[n]["start_ticks"]) for n in ("kubelet", "containerd")):
            raise NodeError("revive needs a lost node: its kubelet or containerd still runs")
        containerd = _spawn_containerd(starter, record)
        kubelet = _spawn(starter, "kubelet", _kubelet_argv(Path(record["dir"])))
        _wait_ready(starter, api, {"kubelet": kubelet, "containerd": containerd}, timeout)
        return f"node revived (containerd {containerd.pid}, kubelet {kubelet.pid}); Node Ready"
    raise NodeError(f"unknown node action {action!r} (one of {', '.join(ACTIONS)})")


def _cut_rule(bridge: str, port: int) -> list[str]:
    """The iptables rule of ``cut``: packets from the pod network to this machine's TCP `port` dropped."""
    return ["INPUT", "-i", bridge, "-p", "tcp", "--dport", str(port), "-m", "comment", "--comment", CUT_COMMENT,
            "-j", "DROP"]


def _wait_gone(proc: dict, alive: Callable[[int, int], bool], timeout: float = 10) -> None:
    """Wait until the recorded process `proc` has exited (it was sent SIGKILL). Raises NodeError after `timeout`."""
    deadline = time.monotonic() + timeout
    while alive(proc["pid"], proc["start_ticks"]):
        if time.monotonic() > deadline:
            raise NodeError(f"pid {proc['pid']} outlived SIGKILL for {timeout:g}s")
        time.sleep(0.05)


def _kubepods_pids() -> list[int]:
    """PIDs of every process in the kubelet's ``kubepods`` cgroups (the pods' containers), from the pids hierarchy."""
    pids: set[int] = set()
    for root in (CGROUP_ROOT / "pids" / "kubepods", CGROUP_ROOT / "kubepods"):
        for procs in root.rglob("cgroup.procs") if root.is_dir() else []:
            try:
                pids.update(int(x) for x in procs.read_text().split())
            except (OSError, ValueError):
                pass
    return sorted(pids)


def stop_node(d: Path, env: dict, alive: Callable[[int, int], bool], timeout: float = 20) -> list[str]:
    """Stop the real node of env directory `d` and undo what it changed on this machine.

    In order: the kubelet (SIGTERM, SIGKILL after `timeout` s); every container through containerd (SIGKILL,
    then deleted); containerd; any shim left; every mount under DIR/node and each pod network namespace; the
    bridge, the node's iptables rules and the kubelet's chains; the kubepods cgroups; LOCK. Returns the names of
    the processes it stopped. A step that fails is logged in the returned list as "cleanup: ..." and the others
    still run, so a half-started node is torn down as far as possible.
    """
    record = env.get("real_node")
    if not record:
        return []
    nd, sock = Path(record["dir"]), record["containerd_socket"]
    procs = {p["name"]: p for p in env.get("processes", [])}
    stopped: list[str] = []
    kubelet = procs.get("kubelet")
    if kubelet and kubelet.get("start_ticks") is not None and alive(kubelet["pid"], kubelet["start_ticks"]):
        os.kill(kubelet["pid"], signal.SIGCONT)  # frozen by `node freeze`: a stopped process holds its SIGTERM
    if _signal_and_wait(procs.get("kubelet"), alive, timeout):
        stopped.append("kubelet")
    if procs.get("containerd") and alive(procs["containerd"]["pid"], procs["containerd"]["start_ticks"]):
        stopped += _remove_containers(sock)
    if _signal_and_wait(procs.get("containerd"), alive, timeout):
        stopped.append("containerd")
    for pid in _pids_with_arg(sock):  # shims outlive containerd
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    stopped += _cleanup_host(nd, record)
    if LOCK.exists():
        try:
            if json.loads(LOCK.read_text()).get("dir") == str(d):
                LOCK.unlink()
        except (OSError, ValueError):
            pass
    return stopped


def _signal_and_wait(proc: dict | None, alive: Callable[[int, int], bool], timeout: float) -> bool:
    """SIGTERM the recorded process `proc` (SIGKILL after `timeout` s) and wait for it; False if it was gone."""
    if not proc or proc.get("start_ticks") is None or not alive(proc["pid"], proc["start_ticks"]):
        return False
    os.kill(proc["pid"], signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while alive(proc["pid"], proc["start_ticks"]):
        if time.monotonic() > deadline:
            os.kill(proc["pid"], signal.SIGKILL)
            deadline = time.monotonic() + 10
        time.sleep(0.05)
    return True


def _remove_containers(sock: str) -> list[str]:
    """Kill and delete every container of the node's containerd (namespace k8s.io); return any failure."""
    ctr = ("ctr", "--address", sock, "-n", "k8s.io")
    failures = []
    tasks = _run(*ctr, "tasks", "ls", "-q", check=False).stdout.split()
    for task in tasks:
        _run(*ctr, "tasks", "kill", "-a", "-s", "SIGKILL", task, check=False)
    for task in tasks:
        r = _run(*ctr, "tasks", "delete", "-f", task, check=False, timeout=30)
        if r.returncode != 0 and "not found" not in r.stderr:
            failures.append(f"cleanup: task {task}: {r.stderr.strip()}")
    for container in _run(*ctr, "containers", "ls", "-q", check=False).stdout.split():
        _run(*ctr, "containers", "delete", container, check=False)
    return failures


def _pids_with_arg(arg: str) -> list[int]:
    """PIDs of the processes whose command line contains `arg` (containerd's shims name its socket)."""
    pids = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit() and int(p.name) != os.getpid():
            try:
                if arg.encode() in (p / "cmdline").read_bytes():
                    pids.append(int(p.name))
            except OSError:
                pass
    return pids


def _mounts_under(prefixes: tuple[str, ...]) -> list[str]:
    """Mount points (from /proc/self/mountinfo) at or under any of `prefixes`, deepest first."""
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if any(point == pre or point.startswith(pre.rstrip("/") + "/") for pre in prefixes):
            points.append(point)
    return sorted(set(points), key=lambda m: (-m.count("/"), m))


def _cleanup_host(nd: Path, record: dict) -> list[str]:
    """Undo the node's changes to the machine (mounts, network namespaces, bridge, iptables, cgroups); return
    "cleanup: ..." for each step that failed."""
    failures = []
    netns = [str(p) for p in NETNS_DIR.glob("cni-*")] if NETNS_DIR.is_dir() else []
    for _ in range(3):  # a mount can hide another under the same point
        points = _mounts_under((str(nd), *([record["containerd_root"]] if "containerd_root" in record else []),
                                *netns))
        if not points:
            break
        for point in points:
            _run("umount", "-l", point, check=False)
    for p in netns:
        try:
            Path(p).unlink(missing_ok=True)
        except OSError as e:
            failures.append(f"cleanup: network namespace {p}: {e.strerror}")
    if _run("ip", "link", "show", record["bridge"], check=False).returncode == 0:
        r = _run("ip", "link", "delete", record["bridge"], check=False)
        if r.returncode != 0:
            failures.append(f"cleanup: bridge {record['bridge']}: {r.stderr.strip()}")
    for rule in _iptables_rules(record["kubelet_port"]):
        while _run("iptables", "-C", *rule, check=False).returncode == 0:
            _run("iptables", "-D", *rule, check=False)
    for line in _run("iptables", "-S", "INPUT", check=False).stdout.splitlines():
        if CUT_COMMENT in line and line.startswith("-A "):  # left by `node cut`
            _run("iptables", "-D", *line.split()[1:], check=False)
    failures += _remove_kubelet_chains()
    failures += _remove_cgroups()
    results = Path("/var/lib/cni/results")
    for f in results.glob(f"{CNI_NETWORK}-*") if results.is_dir() else []:
        f.unlink(missing_ok=True)
    if NETNS_DIR.is_dir() and not any(NETNS_DIR.iterdir()) and _mounts_under((str(NETNS_DIR),)):
        _run("umount", str(NETNS_DIR), check=False)  # the CRI mounts the directory on itself, as `ip netns` does
    for empty in (results, results.parent, NETNS_DIR):  # left by libcni and the CRI; removed when empty
        try:
            empty.rmdir()
        except OSError:
            pass
    return failures


def _remove_kubelet_chains() -> list[str]:
    """Delete the iptables chains the kubelet creates (KUBELET_CHAINS, every table, IPv4 and IPv6) and the
    rules that jump to them."""
    failures = []
    for tool in ("iptables", "ip6tables"):
        if not shutil.which(tool):
            continue
        for table in ("filter", "nat", "mangle"):
            listing = _run(tool, "-t", table, "-S", check=False).stdout.splitlines()
            for line in listing:
                parts = line.split()
                if parts[:1] == ["-A"] and "-j" in parts and parts[parts.index("-j") + 1] in KUBELET_CHAINS \
                        and parts[1] not in KUBELET_CHAINS:
                    _run(tool, "-t", table, "-D", *parts[1:], check=False)
            for chain in KUBELET_CHAINS:
                if _run(tool, "-t", table, "-F", chain, check=False).returncode == 0:
                    r = _run(tool, "-t", table, "-X", chain, check=False)
                    if r.returncode != 0:
                        failures.append(f"cleanup: {tool} -t {table} -X {chain}: {r.stderr.strip()}")
    return failures


def _remove_cgroups() -> list[str]:
    """Remove the kubelet's ``kubepods`` cgroups (and containerd's ``k8s.io``) in every hierarchy, deepest
    first; return a failure for each that stays (a process still in it)."""
    failures = []
    roots = [p / name for p in CGROUP_ROOT.iterdir() if p.is_dir() for name in ("kubepods", "k8s.io")]
    roots += [CGROUP_ROOT / "kubepods", CGROUP_ROOT / "k8s.io"]
    for root in roots:
        if not root.is_dir():
            continue
        dirs = sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)) + [root]
        for p in dirs:
            try:
                p.rmdir()
            except OSError as e:
                failures.append(f"cleanup: cgroup {p}: {e.strerror}")
    return failures


def _tail(path: Path, n: int = 25) -> str:
    """The last `n` lines of a log file ('' if missing)."""
    if not path.exists():
        return ""
    return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
