"""The test Kubernetes control plane of ``scripts/k8senv`` from Python: its binaries, one started control plane
and what ``start`` wrote about it (``DIR/env.json``).

Shared by the k8s test tier (``tests/k8s/conftest.py``) and the Kubernetes demo stack (:mod:`devtools.kube`).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
K8SENV = REPO_ROOT / "scripts" / "k8senv"
BUILD_MAX_MINUTES = 40.0
"""Wall-time cap of a cold ``scripts/k8senv build`` (about 6.5 min on 2 cores; as ``scripts/run-tests``)."""


class K8sEnvError(RuntimeError):
    """``scripts/k8senv`` failed; the message carries its stderr."""


@dataclass(frozen=True)
class K8sEnv:
    """A running control plane, as described by DIR/env.json of ``scripts/k8senv start``.

    Attributes: dir (Path), server (https URL), kubeconfig / user_kubeconfig (Path), etcd (http URL of the
    etcd client endpoint), nodes (names of the kwok fake Nodes), test_user / test_group (the non-admin
    identity), start_seconds (float, wall time of ``start``; 0 when reused), raw (the whole env.json dict).
    :attr:`real_node` is env.json's record of the real node (``start --real-node``), or None.
    """

    dir: Path
    server: str
    kubeconfig: Path
    user_kubeconfig: Path
    etcd: str
    nodes: tuple[str, ...]
    test_user: str
    test_group: str
    start_seconds: float
    raw: dict

    @classmethod
    def load(cls, d: Path, start_seconds: float) -> "K8sEnv":
        """Read DIR/env.json; raise FileNotFoundError if start never wrote it."""
        e = json.loads((d / "env.json").read_text())
        return cls(dir=d, server=e["server"], kubeconfig=Path(e["kubeconfig"]),
                   user_kubeconfig=Path(e["user_kubeconfig"]), etcd=e["etcd"], nodes=tuple(e["nodes"]),
                   test_user=e["test_user"], test_group=e["test_group"], start_seconds=start_seconds, raw=e)

    @property
    def real_node(self) -> dict | None:
        """The real node (``scripts/k8senv.d/node.py``): ``name``, ``ip`` (the bridge address pods reach this
        machine at), ``subnet``, ``kubelet_port``, ``containerd_socket``, ``dir``, ``images``; None without one."""
        return self.raw.get("real_node")


def run_k8senv(*args: str, timeout: float) -> subprocess.CompletedProcess:
    """Run scripts/k8senv with `args`; return the completed process (never raises on exit status)."""
    return subprocess.run([sys.executable, str(K8SENV), *args], capture_output=True, text=True, timeout=timeout)


def bindir() -> Path | None:
    """The directory of the built binaries, or ``None`` when they are not built (``scripts/k8senv bindir``)."""
    r = run_k8senv("bindir", timeout=60)
    return Path(r.stdout.strip()) if r.returncode == 0 else None


def helm() -> Path | None:
    """The helm binary ``scripts/k8senv build`` built at its pinned version, or ``None`` when it is not built
    (``scripts/k8senv helm``). Run it with ``--kube-version`` (:data:`HELM_KUBE_VERSION`)."""
    r = run_k8senv("helm", timeout=120)
    return Path(r.stdout.strip()) if r.returncode == 0 else None


HELM_KUBE_VERSION = "1.35.4"
"""What ``helm lint``/``template`` are told the cluster runs (``--kube-version``): the k8senv control plane's
Kubernetes version, which a helm built without it would take for v1.20.0."""


def build(max_minutes: float = BUILD_MAX_MINUTES, *, with_helm: bool = False, with_node: bool = False) -> Path:
    """Build the control plane's binaries, helm when ``with_helm`` (only the chart's tests need it), and the real
    node's kubelet and images when ``with_node``, or reuse them (instant when built).

    Returns their directory. Raises :class:`K8sEnvError` with k8senv's stderr when the build fails.
    """
    r = run_k8senv("build", "--max-minutes", str(max_minutes), *([] if with_helm else ["--no-helm"]),
                   *(["--node"] if with_node else []), timeout=max_minutes * 60 + 120)
    if r.returncode != 0:
        raise K8sEnvError(f"scripts/k8senv build failed:\n{r.stderr.strip()}")
    return Path(r.stdout.strip().splitlines()[-1])


IMAGE_MAX_SECONDS = 1200.0
"""Wall-time cap of a cold agent image build (about 3 min; most of it downloads)."""


def agent_image() -> tuple[Path, str]:
    """Build (or reuse: instant when its sources did not change) leoflow's agent image for the real node
    (``scripts/k8senv image``). Returns its OCI archive and the image name (``leoflow.local/leoflow-agent:<key>``).
    Raises :class:`K8sEnvError` with k8senv's stderr when the build fails.
    """
    r = run_k8senv("image", timeout=IMAGE_MAX_SECONDS)
    if r.returncode != 0:
        raise K8sEnvError(f"scripts/k8senv image failed:\n{r.stderr.strip()}")
    archive = Path(r.stdout.strip().splitlines()[-1])
    return archive, "leoflow.local/leoflow-agent:" + archive.stem.removeprefix("leoflow-agent-")


def start(d: Path, *, timeout: float = 400.0, nodes: int | None = None, real_node: bool = False,
          images: tuple[Path, ...] = (), scheduler: bool = False) -> K8sEnv:
    """Start a control plane with its state in directory ``d`` (``scripts/k8senv start --dir d``, about 4 s),
    with ``nodes`` kwok Nodes (``--nodes``; None: k8senv's default, 3; each has room for 2,000 pods), and with
    ``real_node`` the real node (a kubelet and containerd; ``images``, OCI archives, imported into it), and with
    ``scheduler`` (real node only) a kube-scheduler, which binds the pods that name no Node (``--scheduler``).

    Raises :class:`K8sEnvError` with k8senv's stderr when it does not come up; whatever it started is then
    stopped again.
    """
    t0 = time.monotonic()
    r = run_k8senv("start", "--dir", str(d), *(["--nodes", str(nodes)] if nodes is not None else []),
                   *(["--real-node"] if real_node else []), *(a for i in images for a in ("--image", str(i))),
                   *(["--scheduler"] if scheduler else []),
                   timeout=timeout)
    if r.returncode != 0:
        stop(d)
        raise K8sEnvError(f"scripts/k8senv start failed:\n{r.stderr.strip()}")
    return K8sEnv.load(d, time.monotonic() - t0)


def stop(d: Path) -> str | None:
    """Stop the control plane started with ``--dir d`` and wait for it; idempotent.

    Returns ``None`` when stopped, else k8senv's error text (never raises on its exit status).
    """
    r = run_k8senv("stop", "--dir", str(d), timeout=120)
    return None if r.returncode == 0 else f"scripts/k8senv stop failed: {r.stderr.strip()}"


NODE_ACTIONS = ("freeze", "thaw", "restart-kubelet", "cut", "uncut", "lose", "revive")
"""The faults ``scripts/k8senv node`` applies to a running real node (``scripts/k8senv.d/node.py``'s ``ACTIONS``):
``freeze``/``thaw`` SIGSTOP/SIGCONT its kubelet (a node cut off from the control plane whose pods run on),
``restart-kubelet`` a new kubelet (the Node registered again if deleted), ``cut``/``uncut`` the pods' packets to a
TCP port of this machine dropped/let through, ``lose`` every node process and container SIGKILLed, ``revive``
containerd and the kubelet started again."""


def node_action(d: Path, action: str, *, port: int | None = None, timeout: float = 120.0) -> str:
    """Apply ``action`` (:data:`NODE_ACTIONS`) to the real node of the control plane in ``d``; ``port`` for
    ``cut``/``uncut``; ``timeout`` seconds for ``restart-kubelet``/``revive`` to see the Node Ready. Returns k8senv's
    line saying what it did. Raises :class:`K8sEnvError` with k8senv's stderr when it fails."""
    r = run_k8senv("node", "--dir", str(d), action, *(["--port", str(port)] if port is not None else []),
                   "--timeout", str(timeout), timeout=timeout + 60)
    if r.returncode != 0:
        raise K8sEnvError(f"scripts/k8senv node {action} failed:\n{r.stderr.strip()}")
    return r.stderr.strip().splitlines()[-1] if r.stderr.strip() else action
