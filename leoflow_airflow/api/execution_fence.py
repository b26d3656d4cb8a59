"""The Execution API fence: a root ASGI middleware of leoflow's plugin (DESIGN §2 Invariant 1).

Airflow adds a plugin's ``fastapi_root_middlewares`` to the api-server's root app (``init_plugins``), whose
middleware stack wraps every mount, the Execution API's ``/execution`` among them; :mod:`leoflow_airflow.plugin`
registers :class:`ExecutionFence` there. For each ``/execution/...`` request whose bearer token names a
``ti_id`` it reads the ledger's current attempt of that ``ti_id`` and whether that id is a superseded try of
its task instance (ONE statement on three primary keys, in a worker thread, in a short transaction of its own, no
cache: a new epoch or a new try fences at once) and lets the pure decision
(:func:`leoflow_airflow.api.fence.decide`) pass the request or answer 409 with a leoflow reason. Anything else
passes untouched, without a read.

A ledger read that fails (database unreachable, leoflow's tables not migrated, a pool timeout) lets the request
pass, with a warning at most once a minute: the fence is a second line behind the ledger's guarded writes, the
proof of death before any same-``ti_id`` re-dispatch and Airflow's own ``ti_id``/host/pid checks, and a 5xx
would count as a failed heartbeat in every running agent, so a database blip would turn into heartbeat loss and
re-runs of every running task. Airflow's own route reads the same database and fails on its own when it is down.
An execution-only api-server (``airflow api-server --apps execution``) runs no plugin, hence no fence: there the
other lines hold alone (DESIGN §2).
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from leoflow_agent.fencing import ATTEMPT_HEADER
from leoflow_airflow.api.fence import Current, decide, is_execution_path, refusal_body, token_subject

log = logging.getLogger(__name__)

Lookup = Callable[[str], "tuple[int, int] | tuple[int, int, bool] | None"]
"""``lookup(ti_id) -> (try_number, attempt_epoch[, superseded]) | None``: the ledger's current attempt of ``ti_id``
(its highest epoch) and whether the ``ti_id`` is no longer its task instance's current try (absent: it is
current), ``None`` when leoflow has none (:class:`~leoflow_airflow.api.fence.Current`). Blocking; any exception
means "could not tell"."""

WARN_EVERY_SECONDS = 60.0
"""At most one "the fence could not read the ledger" warning per this many seconds (per worker)."""

_ATTEMPT_HEADER = ATTEMPT_HEADER.lower().encode("latin-1")


def ledger_lookup() -> Lookup:
    """The default :data:`Lookup`: :meth:`LedgerStore.current_ref` on a store built at first use
    (:meth:`LedgerStore.from_airflow`, Airflow's metadata DB; in the api-server worker that first needs it,
    never at import, so a gunicorn fork never shares its connections), with whether the ``ti_id`` is a superseded
    try asked in the same statement (:func:`superseded_try`). A store that cannot be built raises from the
    lookup, and the next lookup tries again."""
    lock = threading.Lock()
    holder: list[Any] = []

    def lookup(ti_id: str) -> Current | None:
        with lock:
            if not holder:
                from leoflow_airflow.ledger.store import LedgerStore

                holder.append(LedgerStore.from_airflow())
        found = holder[0].current_ref_and(ti_id, superseded_try(ti_id))
        if found is None:
            return None
        ref, superseded = found
        return Current(ref.try_number, ref.attempt_epoch, superseded=superseded)

    return lookup


HANDED_OVER_STATES = ("up_for_retry", "restarting")
"""States of a task instance's new try in which the archived try's execution may still act: Airflow archives the
id inside the execution's own ``up_for_retry`` report (its ``on_retry_callback`` then runs, reading Connections and
Variables with the old token), and at a clear of a running task (RESTARTING, until the executor hands it back)."""


def superseded_try(ti_id: str) -> Any:
    """A SQL boolean that is true when ``ti_id`` (a UUID string) is a superseded try of its task instance:
    ``task_instance_history`` holds it (Airflow 3.3 gives every new try a new id at once,
    ``TaskInstance.prepare_db_for_next_try``: a clear, a retry, leoflow's infra re-drive, and archives the old one
    there) and the task instance's current row, its newer try, is past :data:`HANDED_OVER_STATES`: scheduled,
    queued, running or ended. An id in neither table (a dag run deleted) is not judged here: Airflow answers for it
    (404). Primary-key and unique-key lookups, built on Airflow's own tables so that the id binds as Airflow stores
    it (native ``uuid`` on PostgreSQL, 32 hex characters on SQLite). Raises ``ValueError`` for a ``ti_id`` that is
    no UUID (:func:`~leoflow_airflow.api.fence.token_subject` hands over UUIDs only)."""
    import sqlalchemy as sa

    from airflow.models.taskinstance import TaskInstance
    from airflow.models.taskinstancehistory import TaskInstanceHistory

    ti, tih = TaskInstance.__table__, TaskInstanceHistory.__table__
    return sa.exists().where(
        tih.c.task_instance_id == uuid.UUID(ti_id),
        ti.c.dag_id == tih.c.dag_id, ti.c.run_id == tih.c.run_id, ti.c.task_id == tih.c.task_id,
        ti.c.map_index == tih.c.map_index,
        sa.or_(ti.c.state.is_(None), ti.c.state.not_in(HANDED_OVER_STATES)),
    )


class ExecutionFence:
    """ASGI middleware refusing Execution API calls of an execution that is not its ``ti_id``'s current one, or
    whose ``ti_id`` a newer try of its task instance superseded (every method and route under ``/execution``).

    :param app: the ASGI app it wraps (Starlette passes it).
    :param lookup: the ledger read (:data:`Lookup`); default :func:`ledger_lookup`. Tests pass their own.
    :param clock: monotonic seconds, for the warning's rate limit.

    A refusal is ``409`` with ``Content-Type: application/json``, ``Cache-Control: no-store`` and the body of
    :func:`~leoflow_airflow.api.fence.refusal_body`; it is logged at warning level with its ``error_id``, the
    ``ti_id``, the attempt sent, the current one, the method and the path.
    """

    def __init__(self, app: Any, *, lookup: Lookup | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.app = app
        self._lookup = lookup if lookup is not None else ledger_lookup()
        self._clock = clock
        self._warned_at: float | None = None
        self._unread = 0

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """Judge an ``/execution/...`` HTTP request (see the class); pass everything else on untouched."""
        if scope.get("type") != "http" or not is_execution_path(scope.get("path", ""), scope.get("root_path", "")):
            await self.app(scope, receive, send)
            return
        authorization, header = _request_headers(scope)
        ti_id = token_subject(authorization)
        if ti_id is None:
            await self.app(scope, receive, send)
            return
        import anyio.to_thread

        try:
            found = await anyio.to_thread.run_sync(self._lookup, ti_id)
            current = None if found is None else Current(*found)
        except Exception as exc:  # noqa: BLE001 - fail open (module docstring), never a 5xx of ours
            self._warn_unread(exc)
            await self.app(scope, receive, send)
            return
        verdict = decide(ti_id=ti_id, header=header,
                         current=None if current is None else (current.try_number, current.attempt_epoch),
                         superseded=current is not None and current.superseded)
        if verdict.allowed:
            await self.app(scope, receive, send)
            return
        error_id = uuid.uuid4().hex
        log.warning("execution fence: refused %s %s with 409 error_id=%s reason=%s ti_id=%s sent=%s current=%s",
                    scope.get("method"), scope.get("path"), error_id, verdict.reason, ti_id,
                    None if verdict.sent is None else f"try {verdict.sent.try_number} epoch {verdict.sent.attempt_epoch}",
                    f"try {verdict.current[0]} epoch {verdict.current[1]}" if verdict.current else None)
        body = json.dumps(refusal_body(verdict, error_id)).encode()
        await send({"type": "http.response.start", "status": 409, "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"cache-control", b"no-store"),
        ]})
        await send({"type": "http.response.body", "body": body})

    def _warn_unread(self, exc: BaseException) -> None:
        """Count a request passed because the ledger could not be read; warn at most every
        :data:`WARN_EVERY_SECONDS`, with how many passed unjudged since the last warning."""
        self._unread += 1
        now = self._clock()
        if self._warned_at is not None and now - self._warned_at < WARN_EVERY_SECONDS:
            return
        self._warned_at = now
        log.warning("execution fence: could not read the leoflow ledger (%s: %s); %d Execution API request(s) "
                    "passed unjudged since the last warning", type(exc).__name__, str(exc)[:300], self._unread)
        self._unread = 0


def _request_headers(scope: dict[str, Any]) -> tuple[str | None, str | None]:
    """``(Authorization, Leoflow-Attempt)`` of an ASGI scope, ``None`` when absent; a header sent more than once
    is joined with ``", "`` (RFC 9110 §5.3), which no valid attempt header matches."""
    found: dict[bytes, list[bytes]] = {}
    for name, value in scope.get("headers") or ():
        key = name.lower()
        if key in (b"authorization", _ATTEMPT_HEADER):
            found.setdefault(key, []).append(value)

    def one(key: bytes) -> str | None:
        values = found.get(key)
        return None if not values else b", ".join(values).decode("latin-1")

    return one(b"authorization"), one(_ATTEMPT_HEADER)
