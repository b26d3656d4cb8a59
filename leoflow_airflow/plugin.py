"""The leoflow Airflow plugin: mounts leoflow's FastAPI app under ``/leoflow`` on the api-server (DESIGN §1) and
adds the Execution API fence to the api-server's root app (DESIGN §2 Invariant 1).

Airflow applies no auth to plugin apps, so every route of :mod:`leoflow_airflow.api.app` authenticates
itself: the liveness probe reveals nothing, and the token exchange is authenticated by the pod's projected
ServiceAccount token (TokenReview). The app object is created when the api-server first reads
``fastapi_apps`` (never in a task process, which loads every plugin too), and builds its clients and mint key
only in its lifespan, in each api-server worker. The fence
(:class:`~leoflow_airflow.api.execution_fence.ExecutionFence`) is a root middleware (Airflow's
``fastapi_root_middlewares``): it sees every ``/execution/...`` request and opens its ledger connection at the
first one that names a task instance. The UI page (:mod:`leoflow_airflow.api.ui`) is an external view whose
JSON API is authorized by Airflow's auth manager.
"""

from __future__ import annotations

import threading
from typing import Any

from airflow.plugins_manager import AirflowPlugin

from leoflow_airflow.api.execution_fence import ExecutionFence

TI_QUERY = "dag_id={DAG_ID}&run_id={RUN_ID}&task_id={TASK_ID}&map_index={MAP_INDEX}"
"""The task instance an external view of destination ``task_instance`` names; the Airflow UI substitutes the
placeholders (URL-encoded), and leaves ``{MAP_INDEX}`` as is for an unmapped task (the page reads it as -1)."""


class _LazyApps:
    """``LeoflowPlugin.fastapi_apps``, built on first read: ``[{"app": <the /leoflow FastAPI app>, "url_prefix":
    "/leoflow", "name": "leoflow"}]``. Only the api-server reads it (Airflow's ``get_fastapi_plugins``); every
    task process loads the plugin too (the Task SDK's listener manager loads every plugin), and building the app
    there cost each attempt its import of FastAPI and Airflow's ``api_fastapi`` (issue 11's Lite profile)."""

    def __init__(self) -> None:
        self._apps: list[dict[str, Any]] | None = None
        self._lock = threading.Lock()

    def __get__(self, obj: object, owner: type | None = None) -> list[dict[str, Any]]:
        with self._lock:
            if self._apps is None:
                from leoflow_airflow.api.app import create_app

                self._apps = [{"app": create_app(), "url_prefix": "/leoflow", "name": "leoflow"}]
            return self._apps


class LeoflowPlugin(AirflowPlugin):
    """Registers ``/leoflow`` (Airflow's ``fastapi_apps``), the Execution API fence (its
    ``fastapi_root_middlewares``) and the attempt-timeline page in the Airflow UI (its ``external_views``: the
    navigation and a task instance tab; issue 12 item 5)."""

    name = "leoflow"
    fastapi_apps = _LazyApps()
    fastapi_root_middlewares = [{"middleware": ExecutionFence, "args": [], "kwargs": {},
                                 "name": "leoflow-execution-fence"}]
    external_views = [
        # Airflow 3's UI shows an external view in an iframe at /plugin/<url_route>: "nav" in the navigation
        # (Browse), "task_instance" as a tab of every task instance, with {DAG_ID} etc. filled in by the UI.
        {"name": "leoflow", "href": "/leoflow/ui/timeline", "destination": "nav", "category": "browse",
         "url_route": "leoflow"},
        {"name": "Attempts (leoflow)", "destination": "task_instance", "url_route": "leoflow-attempts",
         "href": f"/leoflow/ui/timeline?{TI_QUERY}"},
    ]
