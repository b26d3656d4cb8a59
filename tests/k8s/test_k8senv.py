"""scripts/k8senv itself: start gives a working kubeconfig for the official client, stop leaves nothing."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from .conftest import _k8senv

pytestmark = pytest.mark.k8s


def _running(pid: int) -> bool:
    """True if `pid` is a live (non-zombie) process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] not in "ZX"


def test_start_gives_admin_and_user_kubeconfigs_and_stop_leaves_no_process(k8s_env, tmp_path):
    d = tmp_path / "cp"
    r = _k8senv("start", "--dir", str(d), "--nodes", "1", timeout=300)
    assert r.returncode == 0, r.stderr
    env = json.loads((d / "env.json").read_text())
    pids = [p["pid"] for p in env["processes"]]
    try:
        assert sorted(p["name"] for p in env["processes"]) == ["etcd", "kube-apiserver", "kube-controller-manager", "kwok"]
        assert all(_running(p) for p in pids)
        admin = config.new_client_from_config(config_file=str(d / "kubeconfig"))
        assert client.VersionApi(admin).get_code().git_version == env["versions"]["kubernetes"]
        nodes = client.CoreV1Api(admin).list_node().items
        assert [n.metadata.name for n in nodes] == ["kwok-node-0"]
        assert {c.type: c.status for c in nodes[0].status.conditions}["Ready"] == "True"
        user = client.CoreV1Api(config.new_client_from_config(config_file=str(d / "user.kubeconfig")))
        with pytest.raises(ApiException) as exc:
            user.list_namespaced_pod("default")
        assert exc.value.status == 403
        assert env["test_user"] in exc.value.body
        # a second start on a running dir is refused
        again = _k8senv("start", "--dir", str(d), timeout=60)
        assert again.returncode == 1 and "still running" in again.stderr
    finally:
        r = _k8senv("stop", "--dir", str(d), timeout=120)
    assert r.returncode == 0, r.stderr
    assert "kube-apiserver" in r.stderr
    assert [p for p in pids if _running(p)] == []
    r = _k8senv("stop", "--dir", str(d), timeout=60)
    assert r.returncode == 0 and "nothing" in r.stderr


def test_stop_of_unknown_dir_and_bad_usage_fail_clearly(tmp_path):
    r = _k8senv("stop", "--dir", str(tmp_path), timeout=60)
    assert r.returncode == 1
    assert "nothing was started" in r.stderr
    r = _k8senv("start", timeout=60)
    assert r.returncode == 2
    assert "--dir" in r.stderr
    r = _k8senv("start", "--dir", str(tmp_path / "x"), "--nodes", "-1", timeout=60)
    assert r.returncode == 1 and "--nodes must be >= 0" in r.stderr
    assert not (tmp_path / "x" / "env.json").exists()


def test_build_is_idempotent_when_binaries_exist(k8s_env):
    r = _k8senv("build", timeout=60)
    assert r.returncode == 0, r.stderr
    assert "already built" in r.stderr
    assert Path(r.stdout.strip(), "kube-apiserver").is_file()
    assert os.access(Path(r.stdout.strip(), "kube-apiserver"), os.X_OK)
