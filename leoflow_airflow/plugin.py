"""The leoflow Airflow plugin: mounts leoflow's FastAPI app under ``/leoflow`` on the api-server (DESIGN §1) and
adds the Execution API fence to the api-server's root app (DESIGN §2 Invariant 1).

Airflow applies no auth to plugin apps, so every route of :mod:`leoflow_airflow.api.app` authenticates
itself: the liveness probe reveals nothing, and the token exchange is authenticated by the pod's projected
ServiceAccount token (TokenReview). The app object is created here, at import, but builds its clients and
mint key only in its lifespan, in each api-server worker. The fence
(:class:`~leoflow_airflow.api.execution_fence.ExecutionFence`) is a root middleware (Airflow's
``fastapi_root_middlewares``): it sees every ``/execution/...`` request and opens its ledger connection at the
first one that names a task instance. The UI page (:mod:`leoflow_airflow.api.ui`) is an external view whose
JSON API is authorized by Airflow's auth manager.
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from leoflow_airflow.api.execution_fence import ExecutionFence

TI_QUERY = "dag_id={DAG_ID}&run_id={RUN_ID}&task_id={TASK_ID}&map_index={MAP_INDEX}"
"""The task instance an external view of destination ``task_instance`` names; the Airflow UI substitutes the
placeholders (URL-encoded), and leaves ``{MAP_INDEX}`` as is for an unmapped task (the page reads it as -1)."""


def _app():
    from leoflow_airflow.api.app import create_app

    return create_app()


class LeoflowPlugin(AirflowPlugin):
    """Registers ``/leoflow`` (Airflow's ``fastapi_apps``), the Execution API fence (its
    ``fastapi_root_middlewares``) and the attempt-timeline page in the Airflow UI (its ``external_views``: the
    navigation and a task instance tab; issue 12 item 5)."""

    name = "leoflow"
    fastapi_apps = [{"app": _app(), "url_prefix": "/leoflow", "name": "leoflow"}]
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
