"""The operator's view of leoflow in the Airflow UI (issue 12 item 5): a JSON API and the page that reads it.

Routes (all under the plugin app's ``/leoflow`` prefix):

- ``GET /v1/ui/timeline?dag_id&run_id&task_id[&map_index]``: every attempt of that task instance in epoch
  order with its events (:func:`leoflow_airflow.api.timeline.build_timeline`).
- ``GET /v1/ui/pools``: warm pools as far as the api-server can observe them (see :func:`pools`): Kubernetes
  warm pods from the ledger, per DAG version, only those of the DAGs the caller may read (k8s review §16b).
- ``GET /ui/timeline`` and ``GET /ui/timeline.js``: a plain HTML page and its script (no build step), shown
  inside the Airflow UI as an external view (``LeoflowPlugin.external_views``): in the navigation and as a tab
  of every task instance.

Airflow applies no auth to plugin apps, so the JSON routes depend on Airflow's own
(``airflow.api_fastapi.core_api.security``): :func:`~airflow.api_fastapi.core_api.security.requires_access_dag`
asks the configured auth manager whether the caller may read the DAG's task instances. The caller is the
bearer token, else the UI session's ``_token`` cookie (``get_user``), so the page's same-origin ``fetch`` is
the logged-in user. No credential: 401; a bad token or a DAG the user may not read: 403. The pools route has no
``dag_id``, so its check is the general DAG-read grant; its rows are then filtered by the auth manager's
``get_authorized_dag_ids`` for the caller (:func:`readable_pools`), so that grant alone shows no other team's DAG
ids or ``dag_version_id``s (k8s review §16b). The page and its script are static and reveal nothing.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection
from importlib import resources
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Depends, HTTPException, Query
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from leoflow_airflow.api.timeline import TryTimes, build_timeline, parse_ti_query

if TYPE_CHECKING:
    from leoflow_airflow.ledger.store import LedgerStore

__all__ = ["LedgerHolder", "airflow_readable_dag_ids", "airflow_try_times", "create_router", "ledger_warm_rows",
           "pools", "readable_pools"]

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
        """Dispose the store's engines, if one was built."""
        with self._lock:
            if self._store is not None:
                self._store.dispose()
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


def pools(get: Callable[[str, str, str], str] | None = None, *,
          warm_rows: Callable[[str], list[dict[str, Any]]] | None = None) -> dict[str, Any]:
    """What the api-server can tell about warm pools: ``{"runtime", "source", "note", "pools": [...]}``.

    Kubernetes: warm pods register in the ledger (``leoflow_warm_worker``, the channel between the scheduler and
    the api-servers), so ``pools`` lists each DAG version's registered workers
    (:func:`~leoflow_airflow.api.timeline.warm_pool_rows`, read by ``warm_rows(namespace)``; default
    :func:`ledger_warm_rows`); pods still starting (not registered) are not counted, and ``note`` says so. Lite:
    its file workers are processes forked inside the scheduler's zygote (DESIGN §3 "Warm pools"), not observable
    from an api-server: ``pools`` is empty and ``source``/``note`` say why, rather than a guess.
    ``get(section, key, fallback)`` reads config (default Airflow's ``conf.get``). Raises what the ledger read
    raises (the route answers 503).
    """
    if get is None:
        from airflow.configuration import conf

        def get(section: str, key: str, fallback: str) -> str:
            return conf.get(section, key, fallback=fallback)

    runtime = (get("leoflow", "runtime", "lite") or "lite").strip().lower()
    if runtime == "kubernetes":
        namespace = (get("leoflow", "namespace", "default") or "default").strip()
        rows = (warm_rows or ledger_warm_rows)(namespace)
        note = ("warm pods registered with the api-server (ready: awaiting an attempt; starting: parsing their DAG "
                "file; busy: running one); pods not registered yet are not counted")
        return {"runtime": runtime, "source": f"ledger: leoflow_warm_worker, namespace {namespace}", "note": note,
                "pools": rows}
    note = ("Lite warm workers are processes forked inside the scheduler's zygote; nothing about them is "
            "observable from the api-server, so no pool is shown here")
    return {"runtime": runtime, "source": "none: not observable from the api-server", "note": note, "pools": []}


def readable_pools(body: dict[str, Any], readable: Collection[str]) -> dict[str, Any]:
    """``body`` (a :func:`pools` answer) with only the pools whose ``dag_id`` is in ``readable`` (the DAG ids the
    caller may read); a pool whose version names no known DAG (its ``dag_id`` is the version itself) is dropped
    too. Pure; a new dict. k8s review §16b: the general DAG-read grant must not list every team's versions."""
    allowed = set(readable)
    return {**body, "pools": [p for p in body.get("pools", []) if p.get("dag_id") in allowed]}


def airflow_readable_dag_ids(user: Any) -> set[str]:
    """The DAG ids ``user`` may read (``GET``), as Airflow's own list routes filter them
    (``permitted_dag_filter_factory``: the configured auth manager's ``get_authorized_dag_ids``; blocking, reads
    Airflow's DB)."""
    from airflow.api_fastapi.app import get_auth_manager

    return set(get_auth_manager().get_authorized_dag_ids(user=user, method="GET"))


def _airflow_readable_dags() -> Callable[..., set[str]]:
    """The default ``readable_dags`` dependency of :func:`create_router`: the caller (Airflow's ``get_user``:
    bearer token, else the UI's cookie) → :func:`airflow_readable_dag_ids` (a sync dependency: FastAPI runs it in
    its thread pool)."""
    from airflow.api_fastapi.core_api.security import get_user

    def readable_dags(user: Any = Depends(get_user)) -> set[str]:
        return airflow_readable_dag_ids(user)

    return readable_dags


def ledger_warm_rows(namespace: str, engine: Any = None) -> list[dict[str, Any]]:
    """The warm pools of ``namespace`` from the ledger's worker rows, each version named by its DAG (Airflow's
    ``dag_version`` table): :func:`~leoflow_airflow.api.timeline.warm_pool_rows`. One read of each table, on
    ``engine`` (the UI's ledger store's; None: a warm ledger of its own)."""
    from airflow.models.dag_version import DagVersion
    from airflow.utils.session import create_session
    from sqlalchemy import select

    from leoflow_airflow.api.timeline import warm_pool_rows
    from leoflow_airflow.ledger.warm import WarmLedger

    workers = (WarmLedger(engine) if engine is not None else WarmLedger.from_airflow()).workers(namespace)
    versions = {str(w.dag_version_id) for w in workers}
    dag_ids: dict[str, str] = {}
    if versions:
        import uuid

        ids = []
        for v in versions:
            try:
                ids.append(uuid.UUID(v))
            except ValueError:
                continue
        with create_session() as session:
            for vid, dag_id in session.execute(select(DagVersion.id, DagVersion.dag_id).where(DagVersion.id.in_(ids))):
                dag_ids[str(vid)] = dag_id
    return warm_pool_rows(workers, dag_ids)


def _asset(name: str) -> bytes:
    return resources.files("leoflow_airflow.api").joinpath("static", name).read_bytes()


def create_router(ledger: LedgerHolder, *,
                  try_times: Callable[[str, str, str, int], list[TryTimes]] = airflow_try_times,
                  read_access: Callable[..., Any] | None = None,
                  readable_dags: Callable[..., Collection[str]] | None = None) -> APIRouter:
    """The UI routes, reading ``ledger``.

    :param try_times: Airflow's per-try times (default :func:`airflow_try_times`).
    :param read_access: the FastAPI dependency that authorizes a read; default Airflow's
        ``requires_access_dag("GET", DagAccessEntity.TASK_INSTANCE)`` (the ``dag_id`` comes from the query; the
        pools route passes none, which asks for DAGs in general). Tests of the routes alone pass their own.
    :param readable_dags: the FastAPI dependency giving the DAG ids the caller may read, by which the pools
        route filters its rows (:func:`readable_pools`); default :func:`airflow_readable_dag_ids` of Airflow's
        ``get_user`` (k8s review §16b).
    """
    if readable_dags is None:
        readable_dags = _airflow_readable_dags()
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
    async def warm_pools(readable: Collection[str] = Depends(readable_dags)) -> Response:
        def read() -> dict[str, Any]:
            body = pools(warm_rows=lambda namespace: ledger_warm_rows(namespace, ledger.get().engine))
            return readable_pools(body, readable)

        try:
            body = await run_in_threadpool(read)
        except Exception as exc:  # noqa: BLE001 - the ledger or Airflow's DB cannot be read: say so
            log.error("leoflow UI: the warm pools cannot be read: %s", exc)
            raise HTTPException(status_code=503, detail="the leoflow ledger cannot be read") from exc
        return JSONResponse(body, headers=_NO_STORE)

    @router.get("/ui/timeline")
    def page() -> Response:
        return Response(_asset("timeline.html"), media_type="text/html; charset=utf-8")

    @router.get("/ui/timeline.js")
    def script() -> Response:
        return Response(_asset("timeline.js"), media_type="text/javascript; charset=utf-8")

    return router
