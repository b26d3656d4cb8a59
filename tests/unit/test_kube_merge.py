"""Layering pods the way the cncf KubernetesExecutor's ``PodGenerator.reconcile_pods`` does (10.25, read),
field paths for the pod_override allowlist, and the pod template reader (issue 9 item 1)."""

from __future__ import annotations

import copy

import pytest
from kubernetes.client import models as k8s

from leoflow_airflow.errors import ConfigError
from leoflow_airflow.runtime.kubernetes.fields import allowed, check_path, set_paths, unknown_keys
from leoflow_airflow.runtime.kubernetes.merge import merge_pods
from leoflow_airflow.runtime.kubernetes.template import load_pod_template, parse_pod_template


def pod(meta=None, **spec) -> k8s.V1Pod:
    return k8s.V1Pod(metadata=meta, spec=k8s.V1PodSpec(**{"containers": [], **spec}))


def test_later_layer_wins_where_it_sets_a_truthy_value_and_keeps_the_earlier_elsewhere():
    earlier = pod(node_name="n1", priority_class_name="low", host_network=True, termination_grace_period_seconds=30)
    later = pod(priority_class_name="high", host_network=False, termination_grace_period_seconds=0)
    got = merge_pods(earlier, later)
    assert got.spec.node_name == "n1" and got.spec.priority_class_name == "high"
    # as in KE: a falsy value (False, 0) in the later layer does not override the earlier one
    assert got.spec.host_network is True and got.spec.termination_grace_period_seconds == 30


def test_metadata_maps_merge_key_by_key_and_lists_concatenate():
    ref = lambda n: k8s.V1OwnerReference(api_version="v1", kind="ConfigMap", name=n, uid=n)  # noqa: E731
    earlier = pod(k8s.V1ObjectMeta(name="a", labels={"x": "1", "y": "1"}, annotations={"p": "1"},
                                   finalizers=["f1"], owner_references=[ref("o1")]))
    later = pod(k8s.V1ObjectMeta(labels={"y": "2", "z": "2"}, finalizers=["f2"], owner_references=[ref("o2")]))
    got = merge_pods(earlier, later).metadata
    assert got.name == "a"
    assert got.labels == {"x": "1", "y": "2", "z": "2"} and got.annotations == {"p": "1"}
    assert got.finalizers == ["f1", "f2"] and [o.name for o in got.owner_references] == ["o1", "o2"]


def test_containers_merge_by_position_and_their_lists_concatenate():
    e0 = k8s.V1Container(name="base", image="e", env=[k8s.V1EnvVar(name="A", value="1")],
                         volume_mounts=[k8s.V1VolumeMount(name="v1", mount_path="/a")],
                         resources=k8s.V1ResourceRequirements(requests={"cpu": "1"}))
    e1 = k8s.V1Container(name="sidecar", image="s")
    l0 = k8s.V1Container(name="other-name", env=[k8s.V1EnvVar(name="B", value="2")],
                         resources=k8s.V1ResourceRequirements(limits={"memory": "1Gi"}))
    earlier = pod(containers=[e0, e1], volumes=[k8s.V1Volume(name="v1")], init_containers=[k8s.V1Container(name="i1")])
    later = pod(containers=[l0], volumes=[k8s.V1Volume(name="v2")], init_containers=[k8s.V1Container(name="i2")])
    got = merge_pods(earlier, later).spec
    first, second = got.containers
    assert first.name == "other-name" and first.image == "e"  # by position, not by name
    assert [e.name for e in first.env] == ["A", "B"] and [m.name for m in first.volume_mounts] == ["v1"]
    assert first.resources.limits == {"memory": "1Gi"} and first.resources.requests is None  # one level deep
    assert second.name == "sidecar"  # the longer list's tail is kept
    assert [v.name for v in got.volumes] == ["v1", "v2"]
    assert [c.name for c in got.init_containers] == ["i1", "i2"]
    longer_later = merge_pods(pod(containers=[e0]), pod(containers=[l0, e1])).spec.containers
    assert [c.name for c in longer_later] == ["other-name", "sidecar"]


def test_merge_leaves_its_inputs_alone_and_handles_missing_layers():
    earlier = pod(k8s.V1ObjectMeta(labels={"a": "1"}), containers=[k8s.V1Container(name="c", env=[])])
    later = pod(k8s.V1ObjectMeta(labels={"b": "2"}))
    before = (copy.deepcopy(earlier), copy.deepcopy(later))
    got = merge_pods(earlier, later)
    got.metadata.labels["c"] = "3"
    got.spec.containers[0].name = "changed"
    assert (earlier, later) == before
    assert merge_pods(None, later) == later and merge_pods(earlier, None) == earlier
    assert merge_pods(None, later) is not later and merge_pods(None, None) is None


def test_field_paths():
    assert check_path("spec.containers.resources.limits") is None
    assert check_path("metadata.labels") is None
    assert "no indexes" in check_path("spec.containers[0].image")
    assert "no field 'nodeSelectr'" in check_path("spec.nodeSelectr")
    assert "no fields below it" in check_path("metadata.labels.team")
    assert check_path("") is not None and check_path(" spec") is not None
    override = k8s.V1Pod(metadata=k8s.V1ObjectMeta(labels={"a": "b"}), spec=k8s.V1PodSpec(
        containers=[k8s.V1Container(name="base", resources=k8s.V1ResourceRequirements(limits={"cpu": "1"}), env=[]),
                    k8s.V1Container(name="s", security_context=k8s.V1SecurityContext(run_as_user=0))],
        tolerations=[k8s.V1Toleration(key="k")]))
    assert list(set_paths(override)) == [
        "metadata.labels", "spec.containers.name", "spec.containers.resources.limits", "spec.containers.name",
        "spec.containers.securityContext.runAsUser", "spec.tolerations.key"]
    assert allowed("spec.containers.resources.limits", ["spec.containers.resources"])
    assert allowed("spec.containers", ["spec.containers"])
    assert not allowed("spec.containersX", ["spec.containers"])
    assert not allowed("spec", ["spec.containers"])


def test_unknown_keys_of_a_pod_document():
    doc = {"metadata": {"labels": {"anyKey": "ok"}, "nmae": "x"},
           "spec": {"nodeSelectr": {}, "containers": [{"name": "a", "imag": "x", "env": [{"name": "A", "vlaue": 1}]}]}}
    assert unknown_keys(doc) == ["metadata.nmae", "spec.nodeSelectr", "spec.containers.imag",
                                 "spec.containers.env.vlaue"]
    assert unknown_keys({"apiVersion": "v1", "kind": "Pod", "spec": {"containers": []}}) == []


HARNESS_TEMPLATE = """
apiVersion: v1
kind: Pod
metadata:
  labels:
    leoflow.test/harness: harness-node
spec:
  nodeName: harness-node
  containers:
    - name: base
      command: ["/usr/bin/env", "PATH=/venv/bin:/usr/bin:/bin"]
      resources:
        requests: {cpu: 100m, memory: 64Mi}
"""


def test_a_pod_template_parses_into_a_v1pod(tmp_path):
    path = tmp_path / "pod.yaml"
    path.write_text(HARNESS_TEMPLATE)
    got = load_pod_template(str(path))
    assert got.spec.node_name == "harness-node" and got.metadata.labels == {"leoflow.test/harness": "harness-node"}
    base = got.spec.containers[0]
    assert base.command[0] == "/usr/bin/env" and base.resources.requests == {"cpu": "100m", "memory": "64Mi"}
    assert load_pod_template("") is None


@pytest.mark.parametrize(("text", "why"), [
    ("spec: [unclosed", "is not valid YAML"),
    ("- a\n- b\n", "must hold one Pod as a mapping"),
    ("kind: Deployment\nspec: {}\n", "not kind 'Deployment'"),
    ("spec:\n  nodeSelectr: {a: b}\n  containers: [{name: base}]\n", "spec.nodeSelectr"),
    ("spec:\n  containers: [{name: base, imag: x}]\n", "spec.containers.imag"),
    ("spec:\n  containers: [{image: x}]\n", "not a valid pod"),  # a container needs a name
    ("metadata: {name: x}\n", "must have spec.containers"),
])
def test_a_malformed_pod_template_is_a_config_error_naming_the_file_and_the_problem(text, why, tmp_path):
    path = tmp_path / "pod.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_pod_template(str(path))
    assert err.value.key == "leoflow.pod_template_file" and err.value.value == str(path)
    assert why in str(err.value), str(err.value)


def test_a_missing_pod_template_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot be read"):
        load_pod_template(str(tmp_path / "nope.yaml"))
    assert parse_pod_template(HARNESS_TEMPLATE).spec.node_name == "harness-node"
