"""The pure decisions of Kubernetes warm pods (issue 11 items 2 and 4; ``warm-contract.md`` "Runtime"): where an
attempt goes (placement), how a warm attempt's presence, evidence and start progress read, how a warm pod's
deadline is lowered at assignment, which anchors belong to a dead scheduler, and how a pod and its ledger row
map onto a :class:`~leoflow_airflow.warm.pool.Worker` for :func:`leoflow_airflow.warm.pool.decide`.

No I/O and no Airflow or database import: :mod:`.warmpods` and :mod:`.runtime` read the cache and the ledger and
act. A ledger row is anything with the attributes of the contract's ``WarmWorker`` (``pod_uid``, ``pod_name``,
``dag_version_id``, ``state``, ``ref``, ``assigned_at``, ``taken_at``, ``registered_at``, ``last_seen_at``,
``attempts_taken``, ``row_version``); a pod is a :class:`~.status.PodView`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol

from leoflow_agent import outcome
from leoflow_airflow.ledger.states import AttemptRef
from leoflow_airflow.lifecycle.runtime import EndCause, Evidence, Presence, StartProgress, StartState
from leoflow_airflow.runtime.kubernetes import status
from leoflow_airflow.runtime.kubernetes.decide import _operation

WARM_LABEL = "leoflow.io/warm"
"""``"true"`` on every warm pod (the pool's informer selects on it; the api-server registers only such a pod)."""
VERSION_LABEL = "leoflow.io/dag-version"
"""A warm pod's DAG version (Airflow's ``dag_version_id``), the pool it belongs to."""
TENANT_LABEL = "leoflow.io/tenant"
"""A warm pod's tenant (label-safe): its bundle, or its team."""
JOB_LABEL = "leoflow.io/scheduler-job"
"""The scheduler job whose pool created the warm pod (and whose anchor owns it)."""
ANCHOR_LABEL = "leoflow.io/warm-anchor"
"""``"true"`` on every anchor ConfigMap."""
from leoflow_airflow.runtime.kubernetes.fields import set_paths
from leoflow_airflow.warm.pool import Worker, WorkerState

__all__ = ["ASSIGN_TIMEOUT_SECONDS", "IDLE", "ASSIGNED", "BUSY", "KILLING", "WarmRow", "cold_reason", "candidates",
           "dead_anchors", "deadline_patch", "lowered_deadline", "create_deadline", "pool_worker", "warm_evidence",
           "warm_presence", "warm_start_progress"]

IDLE, ASSIGNED, BUSY, KILLING = "idle", "assigned", "busy", "killing"
"""The ledger row states of a warm worker (``leoflow_warm_worker.state``; ``killing``: the scheduler deletes its
pod, which runs the attempt it holds; k8s review §7)."""

ASSIGN_TIMEOUT_SECONDS = 60.0
"""Seconds an attempt may stay ``assigned`` to a warm worker that does not take it (its long poll is gone: the
pod is wedged, or lost its credential) before the runtime takes it back (``unassign``): the attempt then reads
GONE with no record and is re-dispatched on a new epoch without spending a user retry (the contract)."""


class WarmRow(Protocol):
    """The attributes of the contract's ``WarmWorker`` row that the decisions read."""

    pod_uid: str
    pod_name: str
    dag_version_id: str
    state: str
    ref: AttemptRef | None
    assigned_at: datetime | None
    taken_at: datetime | None
    registered_at: datetime
    last_seen_at: datetime | None
    attempts_taken: int
    row_version: int


# --- placement ------------------------------------------------------------------------------------------------

def cold_reason(executor_config: Any) -> str | None:
    """Why the task instance with this ``executor_config`` must get a cold pod of its own, or None when a warm
    pod (built from the pool template alone) gives it everything it asks for.

    A warm pod is built before any attempt is known, from ``[leoflow] pod_template_file`` and leoflow's pins:
    a ``pod_override`` that sets any field (resources, image, node selector, volumes, …) asks for what the pool
    does not give, as do the keys :func:`.pod.build_pod` refuses (its error then reaches the task on the cold
    path). Other keys belong to other executors and are ignored, as the cold builder ignores them. An empty
    ``V1Pod()`` override asks for nothing. Never raises.
    """
    if not executor_config:
        return None
    if not isinstance(executor_config, Mapping):
        return "executor_config is not a dict"
    for key in ("pod_template_file", "KubernetesExecutor"):
        if key in executor_config:
            return f"executor_config sets {key}"
    override = executor_config.get("pod_override")
    if override is None:
        return None
    try:
        paths = [p for p in set_paths(override) if p not in ("apiVersion", "kind", "spec.containers.name")]
    except Exception:  # noqa: BLE001 - not a V1Pod: the cold builder names the problem
        return "executor_config pod_override is not a V1Pod"
    return f"executor_config pod_override sets {paths[0]}" if paths else None


def candidates(rows: Iterable[WarmRow], views: Mapping[str, status.PodView], version: str) -> list[WarmRow]:
    """The warm workers an attempt of DAG version ``version`` may be assigned to, best first: rows ``idle`` of
    that version that have awaited at least once (``last_seen_at``: the worker registers before it parses its DAG
    file, and awaits only once it is ready) whose pod (``views`` by pod name) is the row's (same UID), ``Running``
    and not being deleted.
    Best first: the most recently seen (its long poll most likely open now, so it takes the attempt at once),
    then by pod name (stable)."""
    out = []
    for row in rows:
        view = views.get(row.pod_name)
        if row.state != IDLE or row.dag_version_id != version or view is None or view.uid != row.pod_uid:
            continue
        if row.last_seen_at is None:
            continue
        if view.phase != "Running" or view.deleting:
            continue
        out.append(row)
    out.sort(key=lambda r: (-(r.last_seen_at.timestamp() if r.last_seen_at else 0.0), r.pod_name))
    return out


# --- deadlines ------------------------------------------------------------------------------------------------

def create_deadline(max_lifetime_seconds: float, ceiling_seconds: int) -> int | None:
    """A warm pod's ``activeDeadlineSeconds`` at create: ``ceil(max_lifetime_seconds) + ceiling_seconds`` (the
    worker stops taking attempts after ``max_lifetime``; its last attempt may then run for the ceiling), or None
    when ``ceiling_seconds`` is 0 (no deadline, as a cold pod's)."""
    if ceiling_seconds <= 0:
        return None
    return int(math.ceil(max_lifetime_seconds)) + int(ceiling_seconds)


def lowered_deadline(current: int | None, pod_age_seconds: float, ceiling_seconds: int) -> int | None:
    """The ``activeDeadlineSeconds`` to PATCH when an attempt is assigned to a warm pod that has run for
    ``pod_age_seconds`` (since its ``status.startTime``, which the deadline counts from), or None when no PATCH
    is due: ``ceil(pod_age + ceiling)`` when that is lower than ``current`` (None: no deadline yet), so the
    attempt never outlives its credential ceiling; never a raise (the API server refuses raising it; facts
    §6.6-6.7), and none when ``ceiling_seconds`` is 0."""
    if ceiling_seconds <= 0:
        return None
    wanted = int(math.ceil(max(0.0, pod_age_seconds) + ceiling_seconds))
    if current is not None and current <= wanted:
        return None
    return wanted


def deadline_patch(uid: str, current: int | None, seconds: int) -> list[dict[str, Any]]:
    """The RFC 6902 patch that sets pod ``uid``'s ``activeDeadlineSeconds`` from ``current`` to ``seconds``: it
    ``test``s the UID and the current value first (a pod re-created under the name, or a deadline another
    writer lowered meanwhile, fails the patch with 422 instead of being raised)."""
    path = "/spec/activeDeadlineSeconds"
    ops: list[dict[str, Any]] = [_operation("test", "/metadata/uid", value=uid)]
    if current is None:
        ops.append(_operation("add", path, value=seconds))
    else:
        ops += [_operation("test", path, value=current), _operation("replace", path, value=seconds)]
    return ops


# --- the attempt side -----------------------------------------------------------------------------------------

def warm_presence(row: WarmRow | None, view: status.PodView | None, ref: AttemptRef, *, row_fresh: bool,
                  pod_confirmed_gone: bool) -> Presence:
    """The presence of attempt ``ref`` run by a warm worker.

    ==================================================  ===========================================================
    ledger rows read before the assignment was made     UNKNOWN (``row_fresh`` False: the row may not show it yet)
    ``view`` terminal (its pod Succeeded/Failed)        GONE (nothing of the pod runs)
    pod absent, and a live read confirmed it            GONE (``pod_confirmed_gone``)
    pod absent, not confirmed                           UNKNOWN (the cache only defers)
    row gone, or not holding ``ref`` (released,         GONE: the worker awaits again only once the attempt's
    unassigned, holding another attempt)                child ended, so nothing of this attempt runs
    row ``assigned``/``busy``/``killing`` with ``ref``,  LIVE
    pod live
    ==================================================  ===========================================================
    """
    if not row_fresh:
        return Presence.UNKNOWN
    if view is not None and view.terminal:
        return Presence.GONE
    if view is None:
        return Presence.GONE if pod_confirmed_gone else Presence.UNKNOWN
    if row is None or row.ref != ref or row.state not in (ASSIGNED, BUSY, KILLING):
        return Presence.GONE
    return Presence.LIVE


def warm_evidence(outcome_json: str | None, view: status.PodView | None, ref: AttemptRef, *,
                  unconfirmed: EndCause | None = None) -> Evidence:
    """The evidence of a warm attempt, first usable source wins: the record the worker posted in-band
    (``outcome_json``, the ledger's ``leoflow_attempt.outcome_json``), decoded against ``ref``; then the pod's
    termination message, only when the record in it is this attempt's (:func:`.status.pod_evidence` decodes
    against ``ref``; a warm pod ran other attempts before, whose records are never evidence for this one); then
    the pod's end (:func:`.status.end_cause`: OOMKilled named, the deadline, an infra loss) when the pod ended;
    else ``unconfirmed``, the infra loss of a deleted pod whose confirmation valve opened
    (:func:`.status.unconfirmed_cause`; k8s review §6). Never raises."""
    expect = outcome.AttemptIdentity(ref.ti_id, ref.try_number, ref.attempt_epoch)
    if outcome_json:
        try:
            record = outcome.decode(outcome_json, expect=expect)
        except Exception:  # noqa: BLE001 - a bad row is no record; the pod may still hold one
            record = None
        if record is not None:
            return Evidence(record, None, status.end_cause(view) if view is not None and view.terminal else None)
    if view is None:
        return Evidence(None)
    evidence = status.pod_evidence(view, expect)
    if evidence.record is not None and _same(evidence.record.attempt(), expect):
        return evidence
    if not view.terminal:
        return Evidence(None, None, unconfirmed)
    return Evidence(None, evidence.exit_code, evidence.cause)


def _same(found: outcome.AttemptIdentity | None, expect: outcome.AttemptIdentity) -> bool:
    """A termination message's record counts only with its whole identity present and equal: ``decode`` accepts
    absent fields, which on a pod that ran other attempts could be anyone's."""
    return found is not None and (found.ti_id.lower(), found.try_number, found.attempt_epoch) == \
        (expect.ti_id.lower(), expect.try_number, expect.attempt_epoch)


def warm_start_progress(row: WarmRow | None, ref: AttemptRef, now: datetime, *,
                        assign_timeout: float = ASSIGN_TIMEOUT_SECONDS) -> tuple[StartProgress | None, bool]:
    """How far a warm attempt got, and whether the runtime must take it back (``unassign``).

    ``busy`` with ``ref`` → ``STARTED`` since ``taken_at``; ``assigned`` with ``ref`` → ``STARTING`` since
    ``assigned_at``, or, past ``assign_timeout`` seconds, (None, True): the worker never took it, so it is
    unassigned and reads GONE (re-dispatched without a user retry). Anything else → (None, False): presence
    decides."""
    if row is None or row.ref != ref:
        return None, False
    if row.state == BUSY:
        return StartProgress(StartState.STARTED, since=row.taken_at or row.assigned_at), False
    if row.state == ASSIGNED:
        since = row.assigned_at
        if since is not None and (now - since).total_seconds() > assign_timeout:
            return None, True
        return StartProgress(StartState.STARTING, since=since), False
    return None, False


# --- the pool ---------------------------------------------------------------------------------------------------

def pool_worker(view: status.PodView, row: WarmRow | None, *, version: str, tenant: str, now: datetime,
                max_attempts: int, max_lifetime: float) -> Worker:
    """The :class:`~leoflow_airflow.warm.pool.Worker` of warm pod ``view`` (``version`` and ``tenant`` from its
    labels) with its ledger ``row`` (None: not registered yet, or a row of an older pod of that name):

    * terminal → TERMINAL (reaped);
    * being deleted, or its row ``killing`` (its delete is on its way) → DRAINING (already going; never counted
      as ready);
    * no row of this UID, or a row that never awaited (registered, still parsing its DAG file) → STARTING since
      the pod's creation (``warm_start_timeout_seconds`` bounds both);
    * row ``assigned``/``busy`` → BUSY (never deleted);
    * ``idle`` but at its ``max_attempts`` or past ``max_lifetime`` seconds since its start → DRAINING (it exits
      by itself; not ready);
    * else IDLE since it last took an attempt (else since it registered).
    """
    name = view.name
    if view.terminal:
        return Worker(name, version, tenant, WorkerState.TERMINAL)
    if view.deleting or (row is not None and row.pod_uid == view.uid and row.state == KILLING):
        return Worker(name, version, tenant, WorkerState.DRAINING)
    if row is None or row.pod_uid != view.uid:
        return Worker(name, version, tenant, WorkerState.STARTING, view.created_at)
    if row.state in (ASSIGNED, BUSY):
        return Worker(name, version, tenant, WorkerState.BUSY, row.assigned_at)
    if row.last_seen_at is None:
        return Worker(name, version, tenant, WorkerState.STARTING, view.created_at)
    age = (now - view.started_at).total_seconds() if view.started_at is not None else 0.0
    if row.attempts_taken >= max_attempts or age > max_lifetime:
        return Worker(name, version, tenant, WorkerState.DRAINING)
    return Worker(name, version, tenant, WorkerState.IDLE, row.taken_at or row.registered_at)


def dead_anchors(anchors: Sequence[tuple[str, str]], alive: set[str], own_job: str | None) -> list[str]:
    """The names of the anchors to delete at :meth:`start`: ``anchors`` is ``(name, scheduler-job label)``;
    an anchor whose job is neither ``own_job`` nor in ``alive`` (the job ids whose Airflow ``Job`` row
    :meth:`airflow.jobs.job.Job.is_alive`) belongs to a scheduler that is gone: its warm pods can never be
    assigned again, and the garbage collector removes them with it. An anchor with no job label is left
    alone (not leoflow's to judge)."""
    return sorted(name for name, job in anchors if job and job != own_job and job not in alive)
