"""The leoflow Airflow plugin: mounts leoflow's FastAPI app under ``/leoflow`` on the api-server (DESIGN §1).

Airflow applies no auth to plugin apps, so every route of :mod:`leoflow_airflow.api.app` authenticates
itself: the liveness probe reveals nothing, and the token exchange is authenticated by the pod's projected
ServiceAccount token (TokenReview). The app object is created here, at import, but builds its clients and
mint key only in its lifespan, in each api-server worker.
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin


def _app():
    from leoflow_airflow.api.app import create_app

    return create_app()


class LeoflowPlugin(AirflowPlugin):
    """Registers ``/leoflow`` (Airflow's ``fastapi_apps``)."""

    name = "leoflow"
    fastapi_apps = [{"app": _app(), "url_prefix": "/leoflow", "name": "leoflow"}]
