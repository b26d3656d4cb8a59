"""Layer one pod over another the way the cncf KubernetesExecutor does, so a ``pod_template_file`` and an
``executor_config={"pod_override": V1Pod(...)}`` written for KE mean the same under leoflow (DESIGN §3
"Dispatch" and "The pod, as built").

The semantics follow ``PodGenerator.reconcile_pods`` of apache-airflow-providers-cncf-kubernetes 10.25
(read, not copied):

* A field the later layer leaves *falsy* (``None``, ``""``, ``0``, ``False``, an empty list or map) keeps the
  earlier layer's value; anything else replaces it whole. The comparison is one level deep: a later
  ``securityContext`` object replaces the earlier one, it is not merged field by field.
* ``metadata.labels`` and ``metadata.annotations`` are merged key by key, the later layer winning;
  ``metadata.finalizers``, ``ownerReferences`` and ``managedFields`` are concatenated.
* ``spec.initContainers`` and ``spec.volumes`` are concatenated (earlier first).
* ``spec.containers`` are merged **by position, not by name**: the later layer's first container is merged
  into the earlier one's first container, and so on; the longer list's extra containers are kept. Within a
  container, ``env``, ``envFrom``, ``volumeMounts``, ``ports`` and ``volumeDevices`` are concatenated.

Pure: no input is modified; the result shares nothing with its inputs.
"""

from __future__ import annotations

import copy
from typing import Any

from kubernetes.client import models as k8s

__all__ = ["merge_pods"]

_META_CONCAT = ("finalizers", "owner_references", "managed_fields")
_META_MAPS = ("labels", "annotations")
_SPEC_CONCAT = ("init_containers", "volumes")
_CONTAINER_CONCAT = ("env", "env_from", "volume_mounts", "ports", "volume_devices")


def _fill(earlier: Any, later: Any, *, handled: tuple[str, ...] = ()) -> Any:
    """A copy of model object ``later`` whose falsy fields (outside ``handled``) take ``earlier``'s value."""
    out = copy.deepcopy(later)
    for attr in type(earlier).openapi_types:
        if attr in handled:
            continue
        mine, theirs = getattr(out, attr, None), getattr(earlier, attr, None)
        if not mine and theirs is not None:
            setattr(out, attr, copy.deepcopy(theirs))
    return out


def _concat(earlier: list | None, later: list | None) -> list | None:
    """``earlier + later`` as a new list (``None`` when both are empty)."""
    both = [*copy.deepcopy(earlier or []), *copy.deepcopy(later or [])]
    return both or None


def _merge_container(earlier: k8s.V1Container, later: k8s.V1Container) -> k8s.V1Container:
    out = _fill(earlier, later, handled=_CONTAINER_CONCAT)
    for attr in _CONTAINER_CONCAT:
        setattr(out, attr, _concat(getattr(earlier, attr), getattr(later, attr)))
    return out


def _merge_containers(earlier: list | None, later: list | None) -> list:
    """Position by position; the longer list's tail is kept as it is (``spec.containers`` is required: a list,
    possibly empty)."""
    earlier, later = earlier or [], later or []
    if not earlier or not later:
        return copy.deepcopy(later or earlier)
    merged = [_merge_container(e, lt) for e, lt in zip(earlier, later)]
    tail = earlier[len(later):] if len(earlier) > len(later) else later[len(earlier):]
    return merged + copy.deepcopy(tail)


def _merge_metadata(earlier: k8s.V1ObjectMeta | None, later: k8s.V1ObjectMeta | None) -> k8s.V1ObjectMeta | None:
    if earlier is None or later is None:
        return copy.deepcopy(later if later is not None else earlier)
    out = _fill(earlier, later, handled=_META_MAPS + _META_CONCAT)
    for attr in _META_MAPS:
        merged = {**(getattr(earlier, attr) or {}), **(getattr(later, attr) or {})}
        setattr(out, attr, merged or None)
    for attr in _META_CONCAT:
        setattr(out, attr, _concat(getattr(earlier, attr), getattr(later, attr)))
    return out


def _merge_spec(earlier: k8s.V1PodSpec | None, later: k8s.V1PodSpec | None) -> k8s.V1PodSpec | None:
    if earlier is None or later is None:
        return copy.deepcopy(later if later is not None else earlier)
    out = _fill(earlier, later, handled=("containers", *_SPEC_CONCAT))
    out.containers = _merge_containers(earlier.containers, later.containers)
    for attr in _SPEC_CONCAT:
        setattr(out, attr, _concat(getattr(earlier, attr), getattr(later, attr)))
    return out


def merge_pods(earlier: k8s.V1Pod | None, later: k8s.V1Pod | None) -> k8s.V1Pod | None:
    """Return ``later`` layered over ``earlier`` (a new object; either may be ``None``).

    Layers are applied left to right by the builder: pod template, then leoflow's own pod, then the task's
    ``pod_override`` (``leoflow_airflow.runtime.kubernetes.pod.build_pod``).
    """
    if earlier is None or later is None:
        return copy.deepcopy(later if later is not None else earlier)
    out = _fill(earlier, later, handled=("metadata", "spec"))
    out.metadata = _merge_metadata(earlier.metadata, later.metadata)
    out.spec = _merge_spec(earlier.spec, later.spec)
    return out
