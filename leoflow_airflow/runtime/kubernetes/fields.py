"""Pod field paths: the names an operator writes in ``[leoflow] pod_override_allow`` and leoflow writes in a
refusal, walked over the official ``kubernetes`` client's model classes (DESIGN §3 "Dispatch").

A path is dotted and uses the Kubernetes API's own (camelCase) names, as in a pod's YAML:
``metadata.labels``, ``spec.nodeSelector``, ``spec.containers.resources.limits``. A list of objects is walked
element by element without an index (``spec.containers.env`` is the ``env`` of every container); a map
(``labels``, ``nodeSelector``, ``limits``) and a list of scalars (``args``) end a path. An allowlist entry
allows itself and everything below it.

Pure: it reads the client's class metadata (``openapi_types``, ``attribute_map``) and never talks to a cluster.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import Any

from kubernetes.client import models

__all__ = ["allowed", "check_path", "set_paths", "unknown_keys"]

_LIST = re.compile(r"list\[(.+)\]", re.IGNORECASE)
_SEGMENT = re.compile(r"[a-z][A-Za-z0-9]*")


def _model(type_name: str) -> type | None:
    """The model class a client type string names (``V1Container``, ``List[V1Container]``), else ``None``
    (a scalar, a map, a list of scalars, ``object``)."""
    inner = _LIST.fullmatch(type_name)
    name = inner.group(1) if inner else type_name
    cls = getattr(models, name, None)
    return cls if isinstance(cls, type) and hasattr(cls, "openapi_types") else None


def _json_names(cls: type) -> dict[str, str]:
    """``{camelCase API name: python attribute}`` of model class ``cls``."""
    return {json: attr for attr, json in cls.attribute_map.items()}


def check_path(path: str) -> str | None:
    """Return what is wrong with ``path`` as a field path of a ``V1Pod``, or ``None`` when it names a field.

    ``"spec.containers.resources"`` is fine; ``"spec.containers[0].image"``, ``"spec.node_selector"`` (the
    Python name) and ``"spec.nodeSelector.disktype"`` (a key inside a map) are not.
    """
    if not path or path != path.strip():
        return "empty or padded path"
    cls: type | None = models.V1Pod
    walked: list[str] = []
    for segment in path.split("."):
        if cls is None:
            return f"{'.'.join(walked)!r} has no fields below it (a map, a list of values or a scalar)"
        if not _SEGMENT.fullmatch(segment):
            return f"{segment!r} is not a field name (camelCase, as in a pod's YAML; no indexes)"
        attr = _json_names(cls).get(segment)
        if attr is None:
            where = ".".join(walked) or "a pod"
            return f"{where} has no field {segment!r}"
        walked.append(segment)
        cls = _model(cls.openapi_types[attr])
    return None


def set_paths(obj: Any, prefix: str = "") -> Iterator[str]:
    """Yield the path of every field set in model object ``obj`` down to its leaves, in the client's
    declaration order; an element of a list of objects contributes the paths of its own fields.

    "Set" means not ``None`` and not an empty list or map. ``prefix`` is the path of ``obj`` itself (``""``
    for a pod). Paths repeat when several list elements set the same field.
    """
    cls = type(obj)
    for attr, type_name in cls.openapi_types.items():
        value = getattr(obj, attr, None)
        if value is None or (isinstance(value, (list, dict)) and not value):
            continue
        path = f"{prefix}.{cls.attribute_map[attr]}" if prefix else cls.attribute_map[attr]
        if _model(type_name) is None:
            yield path
        elif isinstance(value, list):
            for item in value:
                if hasattr(type(item), "openapi_types"):
                    yield from set_paths(item, path)
                else:  # a dict where an object belongs: the whole element counts
                    yield path
        elif hasattr(type(value), "openapi_types"):
            yield from set_paths(value, path)
        else:
            yield path


def allowed(path: str, allowlist: Iterable[str]) -> bool:
    """Whether ``path`` is covered by an entry of ``allowlist`` (the entry itself or anything below it)."""
    return any(path == entry or path.startswith(entry + ".") for entry in allowlist)


def unknown_keys(data: Any, cls: type | None = None, prefix: str = "") -> list[str]:
    """Return the paths of keys in ``data`` (a pod as parsed from YAML or JSON: dicts and lists) that name no
    field of the model ``cls`` (default ``V1Pod``), in document order. The client's deserializer drops such
    keys without a word, so a typo (``nodeSelectr``) would otherwise vanish from a pod template.

    Keys of maps (``labels``) are not checked; non-dict values where an object belongs are left to the
    deserializer, which refuses them.
    """
    cls = models.V1Pod if cls is None else cls
    if not isinstance(data, dict):
        return []
    names = _json_names(cls)
    bad: list[str] = []
    for key, value in data.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        attr = names.get(key)
        if attr is None:
            bad.append(path)
            continue
        sub = _model(cls.openapi_types[attr])
        if sub is None:
            continue
        for item in value if isinstance(value, list) else [value]:
            bad.extend(unknown_keys(item, sub, path))
    return bad
