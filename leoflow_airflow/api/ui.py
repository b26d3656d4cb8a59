"""The operator's view of leoflow in the Airflow UI (issue 12 item 5): a JSON API and the page that reads it.

Routes (all under the plugin app's ``/leoflow`` prefix):

- ``GET /v1/ui/timeline?dag_id&run_id&task_id[&map_index]``: every attempt of that task instance in epoch
  order with its events (:func:`leoflow_airflow.api.timeline.build_timeline`).
- ``GET /v1/ui/pools``: warm pools as far as the api-server can observe them (see :func:`pools`).
- ``GET /ui/timeline`` and ``GET /ui/timeline.js``: a plain HTML page and its script (no build step), shown
  inside the Airflow UI as an external view (``LeoflowPlugin.external_views``): in the navigation and as a tab
  of every task instance.

Airflow applies no auth to plugin apps, so the JSON routes depend on Airflow's own
(``airflow.api_fastapi.core_api.security``): :func:`~airflow.api_fastapi.core_api.security.requires_access_dag`
asks the configured auth manager whether the caller may read the DAG's task instances. The caller is the
bearer token, else the UI session's ``_token`` cookie (``get_user``), so the page's same-origin ``fetch`` is
the logged-in user. No credential: 401; a bad token or a DAG the user may not read: 403. The page and its
script are static and reveal nothing.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from importlib import resources
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Depends, HTTPException, Query
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from leoflow_airflow.api.timeline import TryTimes, build_timeline, parse_ti_query

if TYPE_CHECKING:
    from leoflow_airflow.ledger.store import LedgerStore

__all__ = ["LedgerHolder", "airflow_try_times", "create_router", "pools"]

log = logging.getLogger(__name__)

_NO_STORE = {"Cache-Control": "no-store"}


class LedgerHolder:
    """One :class:`~leoflow_airflow.ledger.store.LedgerStore` per api-server worker, built at the first UI read
    (never at import: the app object is built before a gunicorn fork) and disposed by the app's lifespan.

    :param factory: builds the store (default ``LedgerStore.from_airflow``); may raise ``RuntimeError`` when
        Airflow has no DB URL, which the route turns into a 503.
    """

    def __init__(self, factory: Callable[[], LedgerStore] | None = None) -> None:
        self._factory = factory
        self._store: LedgerStore | None = None
        self._lock = threading.Lock()

    def get(self) -> LedgerStore:
        """The worker's store, built once (thread-safe)."""
        with self._lock:
            if self._store is None:
                factory = self._factory
                if factory is None:
                    from leoflow_airflow.ledger.store import LedgerStore

                    factory = LedgerStore.from_airflow
                self._store = factory()
            return self._store

    def close(self) -> None:
        """Dispose the store's engine, if one was built."""
        with self._lock:
            if self._store is not None:
                self._store.engine.dispose()
                self._store = None


def airflow_try_times(dag_id: str, run_id: str, task_id: str, map_index: int) -> list[TryTimes]:
    """Airflow's ``start_date``/``end_date``/``state`` of every try of the task instance: the finished tries
    from ``task_instance_history``, the current one from ``task_instance`` (Airflow 3's models, read in one
    session of Airflow's own). A try found in both keeps the ``task_instance`` row."""
    from airflow.models.taskinstance import TaskInstance
    from airflow.models.taskinstancehistory import TaskInstanceHistory
    from airflow.utils.session import create_session
    from sqlalchemy import select

    out: dict[int, TryTimes] = {}
    with create_session() as session:
        for model in (TaskInstanceHistory, TaskInstance):
            rows = session.execute(
                select(model.try_number, model.start_date, model.end_date, model.state).where(
                    model.dag_id == dag_id, model.run_id == run_id, model.task_id == task_id,
                    model.map_index == map_index)
            ).all()
            for try_number, start, end, state in rows:
                out[try_number] = TryTimes(try_number, start, end, str(state) if state is not None else None)
    return [out[k] for k in sorted(out)]


def pools(get: Callable[[str, str, str], str] | None = None) -> dict[str, Any]:
    """What the api-server can tell about warm pools: ``{"runtime", "source", "note", "pools": [...]}``.

    Today nothing about a warm worker is observable from an api-server: Lite's file workers are processes
    forked inside the scheduler's zygote (DESIGN §3 "Warm pools"), and the Kubernetes runtime's warm pods are
    known to the scheduler's informer, not stored. So ``pools`` is empty and ``source``/``note`` say why,
    rather than a guess. ``get(section, key, fallback)`` reads config (default Airflow's ``conf.get``).
    """
    if get is None:
        from airflow.configuration import conf

        def get(section: str, key: str, fallback: str) -> str:
            return conf.get(section, key, fallback=fallback)

    runtime = (get("leoflow", "runtime", "lite") or "lite").strip().lower()
    if runtime == "kubernetes":
        note = ("warm pods are watched by the scheduler's informer and not stored; the api-server does not list "
                "pods, so no pool is shown here")
    else:
        note = ("Lite warm workers are processes forked inside the scheduler's zygote; nothing about them is "
                "observable from the api-server, so no pool is shown here")
    return {"runtime": runtime, "source": "none: not observable from the api-server", "note": note, "pools": []}


def _asset(name: str) -> bytes:
    return resources.files("leoflow_airflow.api").joinpath("static", name).read_bytes()


def create_router(ledger: LedgerHolder, *,
                  try_times: Callable[[str, str, str, int], list[TryTimes]] = airflow_try_times,
                  read_access: Callable[..., Any] | None = None) -> APIRouter:
    """The UI routes, reading ``ledger``.

    :param try_times: Airflow's per-try times (default :func:`airflow_try_times`).
    :param read_access: the FastAPI dependency that authorizes a read; default Airflow's
        ``requires_access_dag("GET", DagAccessEntity.TASK_INSTANCE)`` (the ``dag_id`` comes from the query; the
        pools route passes none, which asks for DAGs in general). Tests of the routes alone pass their own.
    """
    if read_access is None:
        from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
        from airflow.api_fastapi.core_api.security import requires_access_dag

        read_access = requires_access_dag("GET", DagAccessEntity.TASK_INSTANCE)

    router = APIRouter()

    @router.get("/v1/ui/timeline", dependencies=[Depends(read_access)])
    async def timeline(dag_id: str | None = Query(None), run_id: str | None = Query(None),
                       task_id: str | None = Query(None), map_index: str | None = Query(None)) -> Response:
        try:
            key = parse_ti_query(dag_id, run_id, task_id, map_index)
        except ValueError as exc:
            raise HTTPException(status_code=400, detail=str(exc)) from exc

        def read() -> dict[str, Any]:
            attempts = ledger.get().attempts_of_task(*key)
            return {"dag_id": key[0], "run_id": key[1], "task_id": key[2], "map_index": key[3],
                    "attempts": build_timeline(attempts, try_times(*key))}

        try:
            body = await run_in_threadpool(read)
        except RuntimeError as exc:
            log.error("leoflow UI: the ledger cannot be read: %s", exc)
            raise HTTPException(status_code=503, detail="the leoflow ledger cannot be read") from exc
        return JSONResponse(body, headers=_NO_STORE)

    @router.get("/v1/ui/pools", dependencies=[Depends(read_access)])
    async def warm_pools() -> Response:
        return JSONResponse(await run_in_threadpool(pools), headers=_NO_STORE)

    @router.get("/ui/timeline")
    def page() -> Response:
        return Response(_asset("timeline.html"), media_type="text/html; charset=utf-8")

    @router.get("/ui/timeline.js")
    def script() -> Response:
        return Response(_asset("timeline.js"), media_type="text/javascript; charset=utf-8")

    return router
