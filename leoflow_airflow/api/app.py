"""leoflow's FastAPI app, mounted by the api-server under ``/leoflow`` (DESIGN §1).

Routes authenticate themselves (Airflow applies no auth to plugin apps):

- ``GET /leoflow/v1/health``: liveness, reveals nothing.
- ``POST /leoflow/v1/exchange``: the token exchange (:mod:`leoflow_airflow.api.exchange`; wire contract
  :mod:`leoflow_agent.exchange`), authenticated by the projected ServiceAccount token in its body.

The app is built at import (Airflow's plugin manager needs the object) but holds nothing then: the exchange's
JWT generator, Kubernetes client and ledger engine are built in its lifespan, which the api-server runs in
every worker (after a gunicorn fork, too), and released when the worker stops.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from leoflow_agent.exchange import EXCHANGE_PATH, MAX_REQUEST_BYTES
from leoflow_airflow.api.exchange import RETRY_AFTER_SECONDS, ExchangeService

log = logging.getLogger(__name__)


async def _read_body(request: Request, limit: int) -> bytes:
    """The request body, but never more than ``limit + 1`` bytes of it (a larger body is refused as such)."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:
            break
    return b"".join(chunks)[: limit + 1]


def create_app(*, exchange_factory: Callable[[], ExchangeService] | None = None) -> FastAPI:
    """Build the app. ``GET /v1/health`` answers ``{"status": "ok", "version": ...}``; ``POST /v1/exchange``
    answers as :meth:`ExchangeService.handle` does.

    :param exchange_factory: builds the worker's :class:`ExchangeService` in the lifespan (blocking, run in a
        thread); default :func:`leoflow_airflow.api.exchange.from_airflow`. Tests pass their own.
    """
    from leoflow_airflow import __version__

    if exchange_factory is None:
        from leoflow_airflow.api.exchange import from_airflow

        exchange_factory = from_airflow

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        service = await run_in_threadpool(exchange_factory)
        app.state.leoflow_exchange = service
        try:
            yield
        finally:
            app.state.leoflow_exchange = None
            await run_in_threadpool(service.close)

    app = FastAPI(title="leoflow", version=__version__, docs_url=None, redoc_url=None, openapi_url=None,
                  lifespan=lifespan)

    @app.get("/v1/health")
    def health() -> dict[str, str]:
        return {"status": "ok", "version": __version__}

    @app.post(EXCHANGE_PATH)
    async def exchange(request: Request) -> JSONResponse:
        body = await _read_body(request, MAX_REQUEST_BYTES)
        service: ExchangeService | None = getattr(app.state, "leoflow_exchange", None)
        if service is None:  # the lifespan did not run (or the worker is stopping)
            error_id = uuid.uuid4().hex
            log.error("exchange undecided: error_id=%s reason=not_configured the app's lifespan has not run",
                      error_id)
            return JSONResponse({"error_id": error_id}, status_code=503,
                                headers={"Cache-Control": "no-store", "Retry-After": str(RETRY_AFTER_SECONDS)})
        answer = await run_in_threadpool(service.handle, body)
        return JSONResponse(answer.body, status_code=answer.status, headers=answer.headers)

    return app
