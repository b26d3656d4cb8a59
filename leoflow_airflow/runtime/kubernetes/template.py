"""What the pod builder takes from outside: the operator's pod template file (``[leoflow] pod_template_file``)
and Airflow's ``pod_mutation_hook`` (DESIGN §3 "Dispatch").

Reading is kept here so :mod:`.pod` stays pure. A template is read once (at the runtime's start) and every
problem with it is a :class:`~leoflow_airflow.errors.ConfigError` naming the file and what to fix.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import yaml
from kubernetes.client import ApiClient
from kubernetes.client import models as k8s

from leoflow_airflow.errors import ConfigError
from leoflow_airflow.runtime.kubernetes.fields import unknown_keys

__all__ = ["airflow_pod_mutation_hook", "load_pod_template", "parse_pod_template"]

_KEY = "leoflow.pod_template_file"


def parse_pod_template(text: str, *, source: str = "<text>") -> k8s.V1Pod:
    """Parse a pod template (YAML or JSON text holding one ``Pod``) into a ``V1Pod``.

    :param source: the file's path, for messages.
    :raises ConfigError: (key ``leoflow.pod_template_file``) for text that is not YAML, a document that is not
        a mapping, a ``kind`` other than ``Pod``, a key that names no pod field (the client would drop it
        silently: a typo such as ``nodeSelectr``), or a value of the wrong shape.
    """
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(_KEY, source, f"is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(_KEY, source, f"must hold one Pod as a mapping, not {type(data).__name__}")
    if data.get("kind", "Pod") != "Pod":
        raise ConfigError(_KEY, source, f"must hold a Pod, not kind {data.get('kind')!r}")
    if bad := unknown_keys(data):
        raise ConfigError(_KEY, source, f"has keys that are no pod field: {', '.join(bad)} (names are camelCase, "
                          "as in the Kubernetes API)")
    try:
        pod = ApiClient().deserialize(json.dumps(data, default=str), "V1Pod", "application/json")
    except (ValueError, TypeError, AttributeError) as exc:
        raise ConfigError(_KEY, source, f"is not a valid pod: {exc}") from None
    if pod.spec is None or not pod.spec.containers:
        raise ConfigError(_KEY, source, "must have spec.containers (the first is merged into leoflow's agent "
                          "container `base`)")
    return pod


def load_pod_template(path: str) -> k8s.V1Pod | None:
    """Read the template at ``path`` (``[leoflow] pod_template_file``); ``None`` for an empty path.

    :raises ConfigError: when the file cannot be read, or as :func:`parse_pod_template`.
    """
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise ConfigError(_KEY, path, f"cannot be read: {exc.strerror or exc}") from None
    return parse_pod_template(text, source=path)


def airflow_pod_mutation_hook() -> Callable[[Any], Any]:
    """Airflow's ``pod_mutation_hook`` (``airflow.settings``: the cluster policy from ``airflow_local_settings``
    or a policy plugin), to hand to ``build_pod``, as the KubernetesExecutor calls it."""
    from airflow.settings import pod_mutation_hook

    return pod_mutation_hook
