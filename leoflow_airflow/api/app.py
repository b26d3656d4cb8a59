"""leoflow's FastAPI app, mounted by the api-server under ``/leoflow`` (DESIGN §1).

Routes authenticate themselves (Airflow applies no auth to plugin apps):

- ``GET /leoflow/v1/health``: liveness, reveals nothing.
- ``GET /leoflow/v1/ui/timeline``, ``GET /leoflow/v1/ui/pools``: the UI's JSON API, authorized by Airflow's
  auth manager; ``GET /leoflow/ui/timeline``: the page that reads it (:mod:`leoflow_airflow.api.ui`).
- ``POST /leoflow/v1/exchange``: the token exchange (:mod:`leoflow_airflow.api.exchange`; wire contract
  :mod:`leoflow_agent.exchange`), authenticated by the projected ServiceAccount token in its body.
- ``POST /leoflow/v1/warm/register``, ``POST /leoflow/v1/warm/await``, ``POST /leoflow/v1/outcome``: the warm
  pods' registration, long poll and in-band outcome record (:mod:`leoflow_airflow.api.warm`), built in the
  lifespan on the exchange's parts; the first authenticated by a projected token, the others by the opaque
  credential registration hands out.
- ``POST /leoflow/v1/doctor/verify``: ``airflow leoflow doctor``'s mint-key probe
  (:mod:`leoflow_airflow.doctor.probe_token`): verifies a probe token as the Execution API would and answers
  only a reason; read-only, and it verifies nothing but probe tokens.

The app is built at import (Airflow's plugin manager needs the object) but holds nothing then: the exchange's
JWT generator, Kubernetes client and ledger engine are built in its lifespan, which the api-server runs in
every worker (after a gunicorn fork, too), and released when the worker stops.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from leoflow_agent.exchange import EXCHANGE_PATH, MAX_REQUEST_BYTES
from leoflow_airflow.api import warm
from leoflow_airflow.api.exchange import RETRY_AFTER_SECONDS, Answer, ExchangeService, Refused, parse_request
from leoflow_airflow.api.ui import LedgerHolder
from leoflow_airflow.doctor import probe_token

if TYPE_CHECKING:
    from leoflow_airflow.ledger.store import LedgerStore

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


def _respond(answer: Answer) -> Response:
    """The HTTP response of ``answer`` (204: no body)."""
    if answer.status == 204:
        return Response(status_code=204, headers=answer.headers)
    return JSONResponse(answer.body, status_code=answer.status, headers=answer.headers)


def _not_started(what: str) -> JSONResponse:
    """503 for a request the worker cannot serve because its lifespan has not run (or it is stopping)."""
    error_id = uuid.uuid4().hex
    log.error("%s undecided: error_id=%s reason=not_configured the app's lifespan has not run", what, error_id)
    return JSONResponse({"error_id": error_id}, status_code=503,
                        headers={"Cache-Control": "no-store", "Retry-After": str(RETRY_AFTER_SECONDS)})


def create_app(*, exchange_factory: Callable[[], ExchangeService] | None = None,
               ledger_factory: Callable[[], LedgerStore] | None = None, ui: bool = True,
               warm_factory: Callable[[ExchangeService], warm.WarmService] | None = None) -> FastAPI:
    """Build the app. ``GET /v1/health`` answers ``{"status": "ok", "version": ...}``; ``POST /v1/exchange``
    answers as :meth:`ExchangeService.handle` does.

    :param exchange_factory: builds the worker's :class:`ExchangeService` in the lifespan (blocking, run in a
        thread); default :func:`leoflow_airflow.api.exchange.from_airflow`. Tests pass their own.
    :param ledger_factory: builds the ledger store the UI routes read, at their first request (default
        ``LedgerStore.from_airflow``); disposed in the lifespan.
    :param warm_factory: builds the worker's :class:`~leoflow_airflow.api.warm.WarmService` from its exchange
        service in the lifespan (default :func:`leoflow_airflow.api.warm.from_exchange`; tests shorten the wait).
    :param ui: mount the UI routes (:mod:`leoflow_airflow.api.ui`: ``/v1/ui/*`` behind Airflow's auth manager,
        ``/ui/timeline``); they import Airflow's API security, so tests of the exchange alone pass False.
    """
    from leoflow_airflow import __version__

    if exchange_factory is None:
        from leoflow_airflow.api.exchange import from_airflow

        exchange_factory = from_airflow

    if warm_factory is None:
        warm_factory = warm.from_exchange
    ledger = LedgerHolder(ledger_factory)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        service = await run_in_threadpool(exchange_factory)
        app.state.leoflow_exchange = service
        app.state.leoflow_warm = await run_in_threadpool(warm_factory, service)
        try:
            yield
        finally:
            app.state.leoflow_warm = None
            app.state.leoflow_exchange = None
            await run_in_threadpool(service.close)
            await run_in_threadpool(ledger.close)

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
            return _not_started("exchange")
        answer = await run_in_threadpool(service.handle, body)
        return JSONResponse(answer.body, status_code=answer.status, headers=answer.headers)

    @app.post(warm.WARM_REGISTER_PATH)
    async def warm_register(request: Request) -> Response:
        body = await _read_body(request, MAX_REQUEST_BYTES)
        service: warm.WarmService | None = getattr(app.state, "leoflow_warm", None)
        if service is None:
            return _not_started("warm register")
        return _respond(await run_in_threadpool(service.register, body))

    @app.post(warm.WARM_AWAIT_PATH)
    async def warm_await(request: Request) -> Response:
        body = await _read_body(request, warm.MAX_AWAIT_BYTES)
        service: warm.WarmService | None = getattr(app.state, "leoflow_warm", None)
        if service is None:
            return _not_started("warm await")
        return _respond(await service.await_(request.headers.get("authorization"), body, request.is_disconnected))

    @app.post(warm.OUTCOME_PATH)
    async def warm_outcome(request: Request) -> Response:
        body = await _read_body(request, warm.MAX_OUTCOME_BYTES)
        service: warm.WarmService | None = getattr(app.state, "leoflow_warm", None)
        if service is None:
            return _not_started("warm outcome")
        return _respond(await run_in_threadpool(service.outcome, request.headers.get("authorization"), body))

    if ui:
        from leoflow_airflow.api.ui import create_router

        app.include_router(create_router(ledger))

    @app.post(probe_token.VERIFY_PATH)
    async def doctor_verify(request: Request) -> JSONResponse:
        body = await _read_body(request, MAX_REQUEST_BYTES)
        answer = await run_in_threadpool(_verify_answer, body)
        return JSONResponse(answer, headers={"Cache-Control": "no-store"})

    return app


def _verify_answer(body: bytes) -> dict[str, object]:
    """The doctor's verify answer for a request body ``{"token": ...}`` (blocking: reads Airflow's config, builds
    the validator when that changed, :func:`~leoflow_airflow.doctor.probe_token.cached_validator`): ``{"reason": r, "version": v}`` with ``r`` from ``probe_token.VERIFY_REASONS``; with
    ``audience`` also ``accepted_audiences`` (this api-server's ``[execution_api] jwt_audience``), with
    ``verified`` also ``leoflow`` (this api-server's ``[leoflow]`` runtime and, on Kubernetes, the namespace,
    ServiceAccount and exchange audience its token exchange checks), so the doctor can compare them with the
    scheduler's. None of it is secret; it is answered only to a caller that holds a valid probe token, except
    the reason."""
    from leoflow_airflow import __version__

    try:
        token = parse_request(body)
    except Refused:
        return {"reason": "malformed", "version": __version__}
    probe = probe_token.claims_a_probe(token)  # k8s review §16a: no key, no verification for a non-probe
    if not probe:
        return {"reason": "malformed" if probe is None else "not_a_probe", "version": __version__}
    try:
        validator = probe_token.cached_validator()
    except Exception as exc:  # noqa: BLE001 - ValueError (no key) or OSError (unreadable key file)
        log.warning("doctor probe: this api-server cannot validate task tokens: %s: %s", type(exc).__name__, exc)
        return {"reason": "no_key", "version": __version__}
    reason = probe_token.verify_probe(token, validator)
    answer: dict[str, object] = {"reason": reason, "version": __version__}
    if reason == "audience":
        from airflow.configuration import conf

        answer["accepted_audiences"] = conf.get_mandatory_list_value("execution_api", "jwt_audience")
    elif reason == "verified":
        answer["leoflow"] = _leoflow_view()
    return answer


def _leoflow_view() -> dict[str, str]:
    """This api-server's ``[leoflow]`` as its token exchange reads it: ``runtime``, and with ``kubernetes`` the
    ``namespace``, ``service_account`` and ``exchange_audience``; ``{"error": ...}`` when it does not parse."""
    from leoflow_airflow import settings
    from leoflow_airflow.errors import ConfigError

    try:
        kube = settings.load_exchange()
    except ConfigError as exc:
        return {"error": str(exc)[:300]}
    if kube is None:
        return {"runtime": "lite"}
    return {"runtime": "kubernetes", "namespace": kube.namespace, "service_account": kube.service_account,
            "exchange_audience": kube.exchange_audience}
