"""pytest fixtures for tests against a real Kubernetes control plane (``scripts/k8senv``).

Tests using them carry the ``k8s`` marker (``pytestmark = pytest.mark.k8s``), so a fast tier runs with
``-m "not k8s"``. The control plane starts once per session (about 4 s) and every test gets a fresh
namespace.

Environment:
    K8SENV_DIR       reuse a control plane already started with ``scripts/k8senv start --dir DIR``
                     (it is then neither started nor stopped here).
    K8SENV_REQUIRED  "1" (set it in CI): missing binaries fail the session instead of skipping it.
"""

from __future__ import annotations

import os
import re
import sys
import time
import uuid
from pathlib import Path

import pytest
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from devtools.k8senv import K8SENV, K8sEnv, run_k8senv  # noqa: F401  (K8SENV, K8sEnv: for the tests)

HARNESS_NODE = "harness-node"


def pytest_configure(config: pytest.Config) -> None:
    """Register the ``k8s`` marker (also listed in pyproject.toml)."""
    config.addinivalue_line("markers", "k8s: needs the real Kubernetes control plane of scripts/k8senv")


_k8senv = run_k8senv
"""Run scripts/k8senv with `args` (:func:`devtools.k8senv.run_k8senv`, kept under this name for the tests)."""


@pytest.fixture(scope="session")
def k8s_env(tmp_path_factory: pytest.TempPathFactory) -> K8sEnv:
    """Start one control plane for the session (or reuse $K8SENV_DIR) and stop it at the end.

    Skips the k8s tests when the binaries are not built, unless K8SENV_REQUIRED=1 (then it fails).
    """
    reuse = os.environ.get("K8SENV_DIR")
    if reuse:
        yield K8sEnv.load(Path(reuse), 0.0)
        return
    r = _k8senv("bindir", timeout=60)
    if r.returncode != 0:
        msg = f"k8senv binaries are not built ({r.stderr.strip()}); run `scripts/k8senv build`"
        if os.environ.get("K8SENV_REQUIRED") == "1":
            pytest.fail(msg)
        pytest.skip(msg)
    d = tmp_path_factory.mktemp("k8senv")
    t0 = time.monotonic()
    r = _k8senv("start", "--dir", str(d), timeout=400)
    if r.returncode != 0:
        pytest.fail(f"scripts/k8senv start failed:\n{r.stderr}")
    env = K8sEnv.load(d, time.monotonic() - t0)
    try:
        yield env
    finally:
        r = _k8senv("stop", "--dir", str(d), timeout=120)
        if r.returncode != 0:
            print(f"scripts/k8senv stop failed: {r.stderr}", file=sys.stderr)


@pytest.fixture(scope="session")
def api(k8s_env: K8sEnv) -> client.ApiClient:
    """An ApiClient of the official kubernetes client, authenticated as cluster-admin."""
    return config.new_client_from_config(config_file=str(k8s_env.kubeconfig))


@pytest.fixture(scope="session")
def user_api(k8s_env: K8sEnv) -> client.ApiClient:
    """An ApiClient authenticated as the non-admin test identity (no RBAC grants unless a test adds them)."""
    return config.new_client_from_config(config_file=str(k8s_env.user_kubeconfig))


@pytest.fixture(scope="session")
def core(api: client.ApiClient) -> client.CoreV1Api:
    """CoreV1Api as cluster-admin."""
    return client.CoreV1Api(api)


def _fresh_namespace(core: client.CoreV1Api, request: pytest.FixtureRequest, labels: dict[str, str] | None = None):
    """Create a namespace named after the test (with ``labels``), wait for its ``default`` ServiceAccount, yield
    its name, then delete it without waiting."""
    slug = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower()).strip("-")[:40].rstrip("-")
    name = f"{slug}-{uuid.uuid4().hex[:6]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name, labels=labels)))
    deadline = time.monotonic() + 30
    while True:
        try:
            core.read_namespaced_service_account("default", name)
            break
        except ApiException as e:
            if e.status != 404 or time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    yield name
    try:
        core.delete_namespace(name)
    except ApiException as e:
        if e.status != 404:
            raise
    release_leoflow_pods(core, name)


def release_leoflow_pods(core: client.CoreV1Api, namespace: str) -> None:
    """Strip leoflow's finalizer from every leoflow pod of ``namespace`` (``airflow leoflow release-pods``'s
    function), so a deleted namespace goes: called after its deletion, when no pod can be added any more. Fails
    the test naming a pod it could not release."""
    from leoflow_airflow.runtime.kubernetes.finalizer import release_pods
    from leoflow_airflow.runtime.kubernetes.runtime import label_selector

    failed = [r for r in release_pods(core, namespace, label_selector(None)) if not r.done]
    assert not failed, f"leoflow's finalizer could not be released in {namespace}: {failed}"


@pytest.fixture
def namespace(core: client.CoreV1Api, request: pytest.FixtureRequest) -> str:
    """A fresh namespace for this test, with its ``default`` ServiceAccount in place; deleted afterwards
    (without waiting: the namespace controller finishes it in the background), leoflow's finalizers released
    (:func:`release_leoflow_pods`) so its pods can go."""
    yield from _fresh_namespace(core, request)


PSA_RESTRICTED = {"pod-security.kubernetes.io/enforce": "restricted",
                  "pod-security.kubernetes.io/enforce-version": "latest"}


@pytest.fixture
def restricted_namespace(core: client.CoreV1Api, request: pytest.FixtureRequest) -> str:
    """Like ``namespace``, labelled ``pod-security.kubernetes.io/enforce=restricted`` (``latest``) from its
    creation, so the API server's Pod Security admission refuses any pod below the ``restricted`` level (it reads
    the namespace live when its cache has not seen it yet)."""
    yield from _fresh_namespace(core, request, PSA_RESTRICTED)


@pytest.fixture(scope="session")
def harness(api: client.ApiClient, tmp_path_factory: pytest.TempPathFactory):
    """The node harness serving Node ``harness-node`` for the whole session (see tests/k8s/harness.py).

    Token refresh runs every 3 s here instead of at 80 % of the token's life, so tests can see it.
    Fails (never skips) when ``unshare`` cannot make mount namespaces.
    """
    from .harness import NodeHarness

    h = NodeHarness(api, HARNESS_NODE, tmp_path_factory.mktemp("harness"), refresh_after_seconds=3.0)
    h.start()
    try:
        yield h
    finally:
        h.stop()
    assert not h.errors, f"node harness errors: {h.errors}"


def wait_for(predicate, timeout: float, interval: float = 0.2, what: str = "condition"):
    """Call `predicate()` until it returns a truthy value and return that value.

    Raises AssertionError naming `what` (and the last value) after `timeout` seconds.
    """
    deadline, last = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last value: {last!r}")


@pytest.fixture
def statsd(monkeypatch):
    """Airflow's Stats in this process sending to a fresh :class:`~devtools.statsd.StatsdListener` (prefix
    ``airflow.``), through Airflow's own StatsD factory; the previous Stats are restored afterwards."""
    from airflow._shared.observability.metrics import stats as shared
    from airflow.observability import stats
    from airflow.observability.metrics import stats_utils

    from devtools.statsd import StatsdListener, airflow_env

    with StatsdListener() as listener:
        for key, value in airflow_env(listener.port).items():
            monkeypatch.setenv(key, value)
        before = shared._factory
        stats.initialize(factory=stats_utils.get_stats_factory(), export_legacy_names=False)
        try:
            yield listener
        finally:
            stats.initialize(factory=before or shared.NoStatsLogger, export_legacy_names=True)
