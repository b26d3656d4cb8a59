"""The attempt identity a task pod carries in its identity annotation (DESIGN §2 "Attempt", §3 "Start").

The one format of the identity annotation: the pod builder (:func:`~leoflow_airflow.runtime.kubernetes.pod.
build_pod`) stamps :data:`IDENTITY_ANNOTATION` on every task pod with :func:`identity_annotation`; the token
exchange reads it from the pod it fetched by the name in the TokenReview and requires it to name the ledger's
current epoch of that ``ti_id``; a 409 on create checks it the same way (``pod.is_attempt_pod``). The value is
compact JSON ``{"ti_id": str, "try_number": int, "attempt_epoch": int}`` (extra keys are ignored, so it can grow
additively): the attempt's identity only, about 100 characters whatever the DAG, task and run ids (those are on
the pod's labels and in the ledger row of the ``ti_id``), so it always fits :data:`MAX_IDENTITY_LEN`. Pure
module: no I/O.
"""

from __future__ import annotations

import json
import re

from leoflow_airflow.ledger.states import AttemptRef

__all__ = ["IDENTITY_ANNOTATION", "MAX_IDENTITY_LEN", "identity_annotation", "parse_identity_annotation"]

IDENTITY_ANNOTATION = "leoflow.io/attempt"
"""The annotation key holding the attempt identity of a task pod."""

MAX_IDENTITY_LEN = 1024
"""Longest annotation value :func:`parse_identity_annotation` reads, in characters; longer is no identity."""

_TI_ID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")


def identity_annotation(ref: AttemptRef) -> str:
    """The annotation value naming ``ref``: ``{"attempt_epoch":…,"ti_id":…,"try_number":…}`` (sorted keys)."""
    return json.dumps(
        {"ti_id": ref.ti_id, "try_number": ref.try_number, "attempt_epoch": ref.attempt_epoch},
        sort_keys=True,
        separators=(",", ":"),
    )


def parse_identity_annotation(value: object) -> AttemptRef | None:
    """The attempt named by an identity annotation value, or None when it names none.

    None for anything that is not a string of at most :data:`MAX_IDENTITY_LEN` characters holding a JSON
    object whose ``ti_id`` is a UUID string and whose ``try_number`` and ``attempt_epoch`` are integers >= 1
    (booleans are not integers here). Never raises.
    """
    if not isinstance(value, str) or len(value) > MAX_IDENTITY_LEN:
        return None
    try:
        data = json.loads(value)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    ti_id, try_number, epoch = data.get("ti_id"), data.get("try_number"), data.get("attempt_epoch")
    if not isinstance(ti_id, str) or not _TI_ID.fullmatch(ti_id):
        return None
    for n in (try_number, epoch):
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            return None
    return AttemptRef(ti_id.lower(), try_number, epoch)
