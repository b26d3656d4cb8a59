"""The node harness (tests/k8s/harness.py) against the real apiserver: it must behave like a kubelet for
the pods it owns, keep pods apart, and leave every other pod alone."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
from kubernetes import client

from .conftest import HARNESS_NODE, wait_for
from .harness import HarnessError, NodeHarness, decode_jwt_claims, kubelet_message

pytestmark = pytest.mark.k8s

TOKEN_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"

# Runs inside the pod: reads the projected token at the standard path, checks it is bound to this pod,
# and writes "<pod name> <token's pod name> <SA>" to the termination message path.
POD_SCRIPT = r"""
import base64, json, os, sys, time
T = "/dev/termination-log"
open(T, "w").write("claim:" + os.environ["POD_NAME"])   # a shared file would be overwritten by the other pod
tok = open(os.environ["TOKEN_FILE"]).read()
p = tok.split(".")[1]
k = json.loads(base64.urlsafe_b64decode(p + "=" * (-len(p) % 4)))["kubernetes.io"]
time.sleep(float(os.environ.get("HOLD", "0")))      # overlap with the other pod
seen = open(T).read()
open(T, "w").write(f"{os.environ['POD_NAME']} {k['pod']['name']} {k['serviceaccount']['name']} seen={seen!r}")
sys.exit(int(os.environ.get("EXIT", "0")))
"""


def _harness_pod(h: NodeHarness, name: str, *, env: dict[str, str], audience: str | None = "leoflow-agent",
                 command: list[str] | None = None, labels: dict | None = None, policy: str | None = None,
                 sa: str = "default") -> client.V1Pod:
    """A pod for the harness: bound to its node, labelled for it, with a projected token volume."""
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, labels=h.pod_labels if labels is None else labels),
        spec=client.V1PodSpec(
            node_name=h.node_name, restart_policy="Never", service_account_name=sa,
            automount_service_account_token=False,
            volumes=[client.V1Volume(name="token", projected=client.V1ProjectedVolumeSource(sources=[
                client.V1VolumeProjection(service_account_token=client.V1ServiceAccountTokenProjection(
                    path="token", audience=audience, expiration_seconds=600))]))],
            containers=[client.V1Container(
                name="main", image="leoflow.test/agent:0",
                command=command or [sys.executable, "-c", POD_SCRIPT],
                termination_message_policy=policy,
                env=[client.V1EnvVar(name="POD_NAME", value_from=client.V1EnvVarSource(
                    field_ref=client.V1ObjectFieldSelector(field_path="metadata.name"))),
                     client.V1EnvVar(name="TOKEN_FILE", value=f"{TOKEN_DIR}/token")]
                + [client.V1EnvVar(name=k, value=v) for k, v in env.items()],
                volume_mounts=[client.V1VolumeMount(name="token", mount_path=TOKEN_DIR, read_only=True)])]))


def _terminated(core, ns: str, name: str, timeout: float = 60) -> client.V1Pod:
    """Wait until pod `name` is Succeeded or Failed and return it."""
    return wait_for(lambda: (p := core.read_namespaced_pod(name, ns)).status.phase in ("Succeeded", "Failed") and p,
                    timeout, what=f"pod {name} to finish")


def test_two_concurrent_pods_get_their_own_token_and_termination_message(harness, core, namespace):
    for name in ("pod-a", "pod-b"):
        core.create_namespaced_pod(namespace, _harness_pod(harness, name, env={"HOLD": "2"}))
    # both must be running at the same time (the commands hold for 2 s)
    wait_for(lambda: all(core.read_namespaced_pod(n, namespace).status.phase == "Running" for n in ("pod-a", "pod-b")),
             20, what="both pods Running at once")
    for name in ("pod-a", "pod-b"):
        pod = _terminated(core, namespace, name)
        assert pod.status.phase == "Succeeded"
        term = pod.status.container_statuses[0].state.terminated
        assert term.exit_code == 0 and term.reason == "Completed"
        assert term.message == f"{name} {name} default seen='claim:{name}'"
        assert pod.status.pod_ip == "127.0.0.1"  # written by the harness; kwok's pod IPs are 127.244.x.x
    # the host never sees the pods' files at the mount paths
    assert not Path(f"{TOKEN_DIR}/token").exists()
    assert not Path("/dev/termination-log").exists() or Path("/dev/termination-log").read_text() == ""


def test_failed_command_reports_exit_code_and_falls_back_to_logs(harness, core, namespace):
    core.create_namespaced_pod(namespace, _harness_pod(harness, "exit-7", env={"EXIT": "7"}))
    core.create_namespaced_pod(namespace, _harness_pod(
        harness, "logs", env={}, policy="FallbackToLogsOnError",
        command=["/bin/sh", "-c", "echo first; echo last-words >&2; exit 2"]))
    pod = _terminated(core, namespace, "exit-7")
    term = pod.status.container_statuses[0].state.terminated
    assert (pod.status.phase, term.exit_code, term.reason) == ("Failed", 7, "Error")
    assert term.message.startswith("exit-7 exit-7 default")
    pod = _terminated(core, namespace, "logs")
    term = pod.status.container_statuses[0].state.terminated
    assert (pod.status.phase, term.exit_code) == ("Failed", 2)
    assert term.message == "first\nlast-words"


WRITE_MESSAGE = "import os; open('/dev/termination-log', 'wb').write(bytes.fromhex(os.environ['CONTENT']))"


def _message_pod(h: NodeHarness, name: str, contents: list[bytes]) -> client.V1Pod:
    """A harness pod of one container per item of ``contents``, each writing its item as its whole termination
    message and exiting 0."""
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, labels=h.pod_labels),
        spec=client.V1PodSpec(node_name=h.node_name, restart_policy="Never", automount_service_account_token=False,
                              containers=[client.V1Container(
                                  name=f"c{i}", image="leoflow.test/none:0",
                                  command=[sys.executable, "-c", WRITE_MESSAGE],
                                  env=[client.V1EnvVar(name="CONTENT", value=content.hex())])
                                  for i, content in enumerate(contents)]))


def _messages(core, ns: str, name: str) -> dict[str, str]:
    pod = _terminated(core, ns, name)
    assert pod.status.phase == "Succeeded", pod.status
    return {s.name: s.state.terminated.message or "" for s in pod.status.container_statuses}


def test_kubelet_message_keeps_the_files_tail_then_the_pod_shares_head():
    """The kubelet's two cuts in their order (research/k8s-runtime-facts.md §6.1), without a cluster."""
    body = b"H" * 1000 + b"T" * 4000
    assert kubelet_message(body, containers=1) == "H" * 96 + "T" * 4000          # the last 4096 bytes
    assert kubelet_message(body, containers=4) == ("H" * 96 + "T" * 4000)[:3072]  # then 12288 // 4, the head
    assert kubelet_message(b"abc", containers=2, runtime_message="rt said") == "rt said: abc"
    assert kubelet_message(b"x" * 4096, containers=6, runtime_message="rt") == "rt: " + "x" * 2044
    assert kubelet_message("é".encode() * 2000, containers=5) == "é" * 1228 + "\ufffd"  # 2457 bytes: split
    assert kubelet_message(b"", containers=1, log_tail=b"last words") == "last words"


def test_a_long_termination_file_loses_its_head_not_its_tail(harness, core, namespace):
    """A file longer than 4096 bytes is reported by its last 4096 bytes, as tail.ReadAtMost reads it."""
    core.create_namespaced_pod(namespace, _message_pod(harness, "long", [b"HEAD" + b"h" * 2000 + b"t" * 4000 + b"END"]))
    assert _messages(core, namespace, "long") == {"c0": "h" * 93 + "t" * 4000 + "END"}


def test_every_containers_message_is_cut_to_its_share_of_the_pod_budget(harness, core, namespace):
    """Four containers: each message keeps its first 12288 // 4 = 3072 bytes (after the 4096-byte tail), a raw
    byte slice that can split a character; a message within its share is whole."""
    contents = [b"a" * 4000, b"b" + "é".encode() * 1999, b"short", b"z" * 3072]
    core.create_namespaced_pod(namespace, _message_pod(harness, "four", contents))
    assert _messages(core, namespace, "four") == {
        "c0": "a" * 3072, "c1": "b" + "é" * 1535 + "\ufffd", "c2": "short", "c3": "z" * 3072}


def test_the_runtime_prefix_switch_puts_the_runtimes_message_in_front(harness, core, namespace, monkeypatch):
    monkeypatch.setattr(harness, "runtime_message", "container runtime: OOM score adjusted")
    core.create_namespaced_pod(namespace, _message_pod(harness, "prefixed", [b'{"v":1,"outcome":"failed"}']))
    assert _messages(core, namespace, "prefixed") == {
        "c0": 'container runtime: OOM score adjusted: {"v":1,"outcome":"failed"}'}


def test_token_is_bound_to_pod_with_volume_audience_and_refreshed(harness, api, core, namespace):
    # the command reports the token it sees now and the one it sees 4 s later (harness refreshes every 3 s)
    script = ("import os, time, json; f=os.environ['TOKEN_FILE']; a=open(f).read(); time.sleep(4.5); "
              "b=open(f).read(); open('/dev/termination-log','w').write(json.dumps([a, b]))")
    core.create_namespaced_pod(namespace, _harness_pod(harness, "refresh", env={}, audience="leoflow-agent",
                                                       command=[sys.executable, "-c", script]))
    pod = _terminated(core, namespace, "refresh")
    assert pod.status.phase == "Succeeded", pod.status
    import json
    first, later = json.loads(pod.status.container_statuses[0].state.terminated.message)
    assert first != later, "token was not refreshed"
    for tok in (first, later):
        claims = decode_jwt_claims(tok)
        assert claims["aud"] == ["leoflow-agent"]
        assert claims["kubernetes.io"]["pod"] == {"name": "refresh", "uid": pod.metadata.uid}
        assert claims["exp"] - claims["iat"] == 600
    review = client.AuthenticationV1Api(api).create_token_review(client.V1TokenReview(
        spec=client.V1TokenReviewSpec(token=later, audiences=["leoflow-agent"]))).status
    # the pod is Succeeded but still exists, so its token is still valid
    assert review.authenticated is True
    assert review.user.extra["authentication.kubernetes.io/pod-name"] == ["refresh"]


def test_unlabelled_pod_on_harness_node_is_left_alone_by_harness_and_kwok(harness, core, namespace, k8s_env):
    core.create_namespaced_pod(namespace, _harness_pod(harness, "unlabelled", env={}, labels={}))
    # the same pod with the label, to know how long the harness takes to act
    core.create_namespaced_pod(namespace, _harness_pod(harness, "labelled", env={}))
    _terminated(core, namespace, "labelled")
    time.sleep(2)
    pod = core.read_namespaced_pod("unlabelled", namespace)
    assert pod.status.phase == "Pending"
    assert not pod.status.container_statuses
    assert not pod.status.pod_ip


def test_deleting_a_running_pod_stops_its_process_and_removes_the_pod(harness, core, namespace):
    core.create_namespaced_pod(namespace, _harness_pod(harness, "sleeper", env={},
                                                       command=["/bin/sh", "-c", "sleep 300"]))
    wait_for(lambda: core.read_namespaced_pod("sleeper", namespace).status.phase == "Running", 20,
             what="sleeper Running")
    core.delete_namespaced_pod("sleeper", namespace, grace_period_seconds=5)
    wait_for(lambda: not core.list_namespaced_pod(namespace, field_selector="metadata.name=sleeper").items, 30,
             what="sleeper removed after its process was stopped")


def test_held_pods_stay_pending_until_released_and_a_deleted_one_never_starts(harness, core, namespace, monkeypatch):
    """``hold_pods``: a pod the predicate picks stays Pending with no container status while others run; once
    released it runs to Succeeded; a held pod that is deleted is removed without ever starting."""
    monkeypatch.setattr(harness, "_hold", None)  # the session's harness: never leave a hold behind
    harness.hold_pods(lambda pod: pod.metadata.name.startswith("held-"))
    for name in ("held-run", "held-gone", "free"):
        core.create_namespaced_pod(namespace, _harness_pod(harness, name, env={}))
    _terminated(core, namespace, "free")  # the harness has seen all three (created before it)
    for name in ("held-run", "held-gone"):
        wait_for(lambda: any(p.metadata.name == name for p in harness.held.values()), 20, what=f"{name} held")
        pod = core.read_namespaced_pod(name, namespace)
        assert (pod.status.phase, pod.status.container_statuses) == ("Pending", None), pod.status
    gone_uid = core.read_namespaced_pod("held-gone", namespace).metadata.uid
    core.delete_namespaced_pod("held-gone", namespace, grace_period_seconds=30)
    wait_for(lambda: not core.list_namespaced_pod(namespace, field_selector="metadata.name=held-gone").items, 30,
             what="the held pod removed as a never-started pod")
    assert gone_uid not in harness.runs
    (run_uid,) = [uid for uid, p in harness.held.items() if p.metadata.name == "held-run"]
    assert harness.release_held(run_uid) == [run_uid]
    assert _terminated(core, namespace, "held-run").status.phase == "Succeeded"
    harness.hold_pods(None)


def test_unsupported_pod_feature_fails_the_pod_with_a_clear_message(harness, core, namespace):
    pod = _harness_pod(harness, "no-command", env={})
    pod.spec.containers[0].command = None
    core.create_namespaced_pod(namespace, pod)
    got = _terminated(core, namespace, "no-command")
    assert got.status.phase == "Failed"
    assert got.status.reason == "HarnessUnsupported"
    assert "no command" in got.status.message


def test_harness_fails_loudly_without_unshare(api, tmp_path):
    with pytest.raises(HarnessError, match="not found"):
        NodeHarness(api, "nowhere", tmp_path, unshare="/nonexistent/unshare")
    assert HARNESS_NODE  # the session harness uses a different node name


def test_pods_log_follows_a_running_container_through_the_api_server_until_it_ends(harness, core, namespace,
                                                                                    tmp_path):
    """``pods/log`` with ``follow=true`` is proxied to the harness's kubelet endpoint: it streams what the
    container writes while it runs and ends when the container ends."""
    go = tmp_path / "go"
    script = f"echo one; while [ ! -e {go} ]; do sleep 0.05; done; echo two"
    core.create_namespaced_pod(namespace, _harness_pod(harness, "follow", env={}, command=["/bin/sh", "-c", script]))
    wait_for(lambda: core.read_namespaced_pod("follow", namespace).status.phase == "Running", 30,
             what="pod follow Running")
    resp = core.read_namespaced_pod_log("follow", namespace, container="main", follow=True, _preload_content=False)
    seen = b""
    chunks = resp.stream(1)
    for chunk in chunks:
        seen += chunk
        if seen == b"one\n":
            break
    go.touch()  # only now does the container write its second line
    seen += b"".join(chunks)
    assert seen == b"one\ntwo\n"
    assert _terminated(core, namespace, "follow").status.phase == "Succeeded"
