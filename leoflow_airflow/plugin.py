"""The leoflow Airflow plugin: mounts leoflow's FastAPI app under ``/leoflow`` on the api-server (DESIGN §1) and
adds the Execution API fence to the api-server's root app (DESIGN §2 Invariant 1).

Airflow applies no auth to plugin apps, so every route of :mod:`leoflow_airflow.api.app` authenticates
itself: the liveness probe reveals nothing, and the token exchange is authenticated by the pod's projected
ServiceAccount token (TokenReview). The app object is created here, at import, but builds its clients and
mint key only in its lifespan, in each api-server worker. The fence
(:class:`~leoflow_airflow.api.execution_fence.ExecutionFence`) is a root middleware (Airflow's
``fastapi_root_middlewares``): it sees every ``/execution/...`` request and opens its ledger connection at the
first one that names a task instance.
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from leoflow_airflow.api.execution_fence import ExecutionFence


def _app():
    from leoflow_airflow.api.app import create_app

    return create_app()


class LeoflowPlugin(AirflowPlugin):
    """Registers ``/leoflow`` (Airflow's ``fastapi_apps``) and the Execution API fence (its
    ``fastapi_root_middlewares``)."""

    name = "leoflow"
    fastapi_apps = [{"app": _app(), "url_prefix": "/leoflow", "name": "leoflow"}]
    fastapi_root_middlewares = [{"middleware": ExecutionFence, "args": [], "kwargs": {},
                                 "name": "leoflow-execution-fence"}]
