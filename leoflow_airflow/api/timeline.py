"""A task instance's attempt timeline, built from its ledger rows and Airflow's per-try times (issue 12 item 5).

Pure module: no I/O. :func:`build_timeline` turns the ledger's attempts of one logical task instance (every
``ti_id``, try and epoch of ``(dag_id, run_id, task_id, map_index)``) into the JSON the UI page draws: one entry per
attempt in (try_number, attempt_epoch) order, each with its events in the order DESIGN §2 names them:

===========  =====================================================  ==========================================
event        time (source)                                          what it carries
===========  =====================================================  ==========================================
claim        ``created_at`` (ledger)                                the claiming scheduler's host
dispatch     ``dispatched_at`` (ledger; see below)                  the pod name/UID or the pid/host
exchange     ``exchanged_at`` (ledger, revision 0004)               the TokenReview credential id (Kubernetes)
run          Airflow's ``start_date`` of the try (``/run``)         only on the try's last dispatched epoch
report       ``reported_at`` (ledger)                               the state the agent reported itself
exit         ``exited_at`` (ledger)                                 the exit status (proof of death)
record       Airflow's ``end_date`` of the try (derived)            only when the attempt's report was replayed
settle       ``closed_at`` (ledger)                                 resolution, evidence, detail
override     ``closed_at`` (ledger)                                 when a user or Airflow decided instead
===========  =====================================================  ==========================================

Every time is derived from existing columns (no ledger revision): ``run`` is the ``start_date`` Airflow stored
when the attempt's agent called ``/run``, and ``record`` is the ``end_date`` of the terminal body the reconciler
replayed from the attempt's outcome record (the agent wrote that time into the record; Airflow stores it as the
TI's ``end_date``). ``dispatched_at`` is when the scheduler recorded the runtime's start of the attempt (the
pid or pod known), so a fast agent's ``run`` may come before it: events keep the lifecycle's order, not the
clock's. A SETTLING row (a replay sent, not yet closed) shows ``settle`` with no time. An event
whose fact the ledger does not hold is left out, never invented.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from leoflow_airflow.ledger.states import AttemptState, Resolution

if TYPE_CHECKING:
    from leoflow_airflow.ledger.store import Attempt

__all__ = ["EVIDENCE", "OVERRIDES", "TryTimes", "build_timeline", "parse_ti_query", "warm_pool_rows"]

EVIDENCE: Mapping[Resolution, str] = {
    Resolution.REPORTED: "the agent's own terminal report",
    Resolution.REPLAYED: "replayed record",
    Resolution.INFRA_REDRIVE: "infra re-drive",
    Resolution.OOM_REDRIVE: "infra re-drive (OOM kill)",
    Resolution.REDISPATCHED: "re-dispatch",
    Resolution.EXECUTOR_FAILED: "executor failed the task",
    Resolution.RESTARTING: "override",
    Resolution.MOVED_ON: "override",
    Resolution.REVOKED: "override",
    Resolution.LAUNCH_FAILED: "launch failed",
    Resolution.ABANDONED: "abandoned",
}
"""The evidence each resolution settled on, in the terms of issue 12's "recoveries by evidence" (replayed
record, infra re-drive, re-dispatch, override)."""

OVERRIDES: frozenset[Resolution] = frozenset({Resolution.RESTARTING, Resolution.MOVED_ON, Resolution.REVOKED})
"""Resolutions where a user or Airflow decided instead of the attempt's evidence: a clear (RESTARTING), a TI
already moved on (MOVED_ON, e.g. marked by a user), a revoke (REVOKED). Shown as an ``override`` event."""


@dataclass(frozen=True, slots=True)
class TryTimes:
    """Airflow's own times of one try of the task instance (``task_instance`` or ``task_instance_history``):
    ``start_date`` is set at ``/run``, ``end_date`` from the terminal body; both aware UTC or None."""

    try_number: int
    start_date: datetime | None
    end_date: datetime | None
    state: str | None


def parse_ti_query(dag_id: str | None, run_id: str | None, task_id: str | None,
                   map_index: str | int | None) -> tuple[str, str, str, int]:
    """Check the query of ``GET …/timeline`` and return ``(dag_id, run_id, task_id, map_index)``.

    ``map_index`` may be missing, empty or a non-integer placeholder (the Airflow UI leaves ``{MAP_INDEX}`` in an
    external view's URL for an unmapped task): all mean ``-1``. Raises ``ValueError`` naming the missing id, or
    a ``map_index`` below -1.
    """
    for name, value in (("dag_id", dag_id), ("run_id", run_id), ("task_id", task_id)):
        if not value:
            raise ValueError(f"{name} is required")
    index = -1
    if isinstance(map_index, int):
        index = map_index
    elif map_index not in (None, "") and map_index.lstrip("-").isdigit():
        index = int(map_index)
    if index < -1:
        raise ValueError(f"map_index must be -1 or more, got {index}")
    return dag_id, run_id, task_id, index  # type: ignore[return-value]


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def _event(name: str, at: datetime | None, attempt: Attempt, source: str, **facts: Any) -> dict[str, Any]:
    ref = attempt.ref
    return {"event": name, "time": _iso(at), "epoch": ref.attempt_epoch, "try_number": ref.try_number,
            "source": source, **{k: v for k, v in facts.items() if v is not None}}


def _where(attempt: Attempt) -> dict[str, Any]:
    """Where the attempt ran: its pod (Kubernetes) or its process (Lite)."""
    if attempt.pod_name or attempt.pod_uid:
        return {"pod_name": attempt.pod_name, "pod_uid": attempt.pod_uid}
    return {"pid": attempt.pid, "host": attempt.host}


def _events(attempt: Attempt, times: TryTimes | None, runs_here: bool) -> list[dict[str, Any]]:
    out = [_event("claim", attempt.created_at, attempt, "ledger", host=attempt.host)]
    if attempt.dispatched_at is not None:
        out.append(_event("dispatch", attempt.dispatched_at, attempt, "ledger", runtime=attempt.runtime,
                          **_where(attempt)))
    if attempt.exchanged_at is not None:
        out.append(_event("exchange", attempt.exchanged_at, attempt, "ledger",
                          credential_id=attempt.exchange_credential_id))
    if runs_here and times is not None and times.start_date is not None:
        out.append(_event("run", times.start_date, attempt, "airflow"))
    if attempt.reported_at is not None:
        out.append(_event("report", attempt.reported_at, attempt, "ledger", reported_state=attempt.reported_state))
    if attempt.exited_at is not None:
        out.append(_event("exit", attempt.exited_at, attempt, "ledger", exit_status=attempt.exit_status))
    resolution = attempt.resolution
    if resolution is Resolution.REPLAYED:
        end = times.end_date if times is not None else None
        out.append(_event("record", end, attempt, "airflow", record_path=attempt.record_path,
                          note="end_date of the replayed terminal body"))
    if attempt.state is AttemptState.SETTLING:
        out.append(_event("settle", None, attempt, "ledger", note="a replay was sent and may have landed",
                          detail=attempt.detail))
    elif attempt.state is AttemptState.CLOSED and resolution is not None:
        name = "override" if resolution in OVERRIDES else "settle"
        out.append(_event(name, attempt.closed_at, attempt, "ledger", resolution=resolution.value,
                          evidence=EVIDENCE[resolution], detail=attempt.detail))
    return out


def build_timeline(attempts: Iterable[Attempt], tries: Sequence[TryTimes]) -> list[dict[str, Any]]:
    """The attempt timeline of one logical task instance.

    :param attempts: its ledger rows (any order; rows of several ``ti_id`` s after a clear are fine).
    :param tries: Airflow's times per try (``try_number`` unique; missing tries are fine).
    :returns: one dict per attempt ordered by (try_number, attempt_epoch): ``ti_id``, ``try_number``,
        ``attempt_epoch``, ``state``, ``runtime``, ``resolution``, ``evidence`` (or None while open) and
        ``events``, a list of ``{"event", "time" (ISO 8601 UTC or None), "epoch", "try_number", "source"
        ("ledger" or "airflow"), …facts}`` in the order of the module's table. Airflow's ``run`` is put on the
        highest epoch of its try that was dispatched (an earlier epoch of the same try never reached ``/run``
        or was re-dispatched).
    """
    ordered = sorted(attempts, key=lambda a: (a.ref.try_number, a.ref.attempt_epoch, a.ref.ti_id))
    by_try = {t.try_number: t for t in tries}
    last_dispatched: dict[int, tuple[int, str]] = {}
    for a in ordered:
        if a.dispatched_at is not None:
            last_dispatched[a.ref.try_number] = (a.ref.attempt_epoch, a.ref.ti_id)
    out = []
    for a in ordered:
        runs_here = last_dispatched.get(a.ref.try_number) == (a.ref.attempt_epoch, a.ref.ti_id)
        out.append({
            "ti_id": a.ref.ti_id,
            "try_number": a.ref.try_number,
            "attempt_epoch": a.ref.attempt_epoch,
            "state": a.state.value,
            "runtime": a.runtime,
            "resolution": a.resolution.value if a.resolution is not None else None,
            "evidence": EVIDENCE[a.resolution] if a.resolution is not None else None,
            "events": _events(a, by_try.get(a.ref.try_number), runs_here),
        })
    return out


def warm_pool_rows(workers: Iterable[Any], dag_ids: Mapping[str, str]) -> list[dict[str, Any]]:
    """The UI's warm pools from the ledger's warm worker rows (``ledger.warm.WarmWorker``: ``dag_version_id``,
    ``state``, ``last_seen_at``, ``attempts_taken``), one entry per DAG version, ordered by DAG and version:
    ``{"dag_id", "dag_version_id", "ready", "starting", "busy", "attempts_taken"}``. ``ready``: idle workers that
    await (they took or will take an attempt at once); ``starting``: registered, still parsing their DAG file (no
    await yet); ``busy``: assigned or running an attempt. ``dag_ids``: ``dag_version_id`` -> its DAG (a version
    Airflow no longer knows shows its id). Workers not registered yet (pods starting) are not in the ledger and
    not counted."""
    pools: dict[str, dict[str, Any]] = {}
    for w in workers:
        version = str(w.dag_version_id)
        pool = pools.setdefault(version, {"dag_id": dag_ids.get(version, version), "dag_version_id": version,
                                           "ready": 0, "starting": 0, "busy": 0, "attempts_taken": 0})
        if w.state in ("assigned", "busy"):
            pool["busy"] += 1
        elif w.last_seen_at is None:
            pool["starting"] += 1
        else:
            pool["ready"] += 1
        pool["attempts_taken"] += int(w.attempts_taken or 0)
    return sorted(pools.values(), key=lambda p: (p["dag_id"], p["dag_version_id"]))
