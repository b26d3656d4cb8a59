"""leoflow's FastAPI app, mounted by the api-server under ``/leoflow`` (DESIGN §1).

Routes authenticate themselves (Airflow applies no auth to plugin apps). This release serves only
``GET /leoflow/v1/health``; the exchange and in-band outcome routes come with the Kubernetes runtime.
"""

from __future__ import annotations

from fastapi import FastAPI


def create_app() -> FastAPI:
    """Build the app. ``GET /v1/health`` answers ``{"status": "ok", "version": ...}`` and nothing else."""
    from leoflow_airflow import __version__

    app = FastAPI(title="leoflow", version=__version__, docs_url=None, redoc_url=None, openapi_url=None)

    @app.get("/v1/health")
    def health() -> dict[str, str]:
        return {"status": "ok", "version": __version__}

    return app
