"""The agent's wrapper around the Task SDK client's HTTP transport (DESIGN §3 "Run").

Keying off the requests the supervisor actually sends covers every sink without enumerating call sites:

* immediately before a terminal ``PATCH /task-instances/{id}/state`` leaves, the outcome record of that exact
  body is written to every configured sink (Lite: the attempt's record file);
* when that PATCH returns 2xx the agent tells its zygote (``reported``), which frees the attempt's slot;
* the named fault-injection points SIGKILL the agent, only when the launch message asked for one (test mode).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import re
import signal
from collections.abc import Callable, Sequence
from typing import Any

import httpx

from leoflow_agent import outcome

log = logging.getLogger(__name__)

_STATE_PATH = re.compile(r"/task-instances/(?P<ti_id>[0-9a-fA-F-]{36})/state$")
_RUN_PATH = re.compile(r"/task-instances/(?P<ti_id>[0-9a-fA-F-]{36})/run$")
_HEARTBEAT_CALL = re.compile(r"(?:^|/)task-instances/(?P<ti_id>[0-9a-fA-F-]{36})/heartbeat$")
_TERMINATED_STATUSES = frozenset({404, 409, 410})  # the supervisor's "stop, the server says so" answers

RecordSink = Callable[[outcome.OutcomeRecord], None]
"""Writes one outcome record durably; raises :class:`OSError` when it cannot."""


def file_sink(path: str) -> RecordSink:
    """Return a sink that writes the whole record body atomically to ``path`` (the Lite record file)."""

    def write(record: outcome.OutcomeRecord) -> None:
        outcome.write_record_file(path, record)

    return write


HANG_SECONDS = 600.0
"""How long the ``hang_before_run`` fault point blocks before the agent kills itself (bounded, test only)."""


def _hang(point: str) -> None:
    import time

    log.warning("fault injection: the agent hangs at %s (up to %.0f s)", point, HANG_SECONDS)
    deadline = time.monotonic() + HANG_SECONDS
    while time.monotonic() < deadline:
        time.sleep(1.0)
    _suicide(point)


def _suicide(point: str) -> None:
    log.warning("fault injection: killing the agent at %s", point)
    os.kill(os.getpid(), signal.SIGKILL)


class RecordingTransport(httpx.BaseTransport):
    """An ``httpx`` transport that records terminal states before they leave and reports them after.

    :param inner: the transport that really sends (an ``httpx.HTTPTransport``).
    :param attempt: the attempt this agent runs; requests for any other ``ti_id`` pass through untouched.
    :param sinks: where outcome records go, each written before the PATCH leaves. A sink that fails makes
        the PATCH fail too (``httpx.TransportError``), so no report ever leaves without its record.
    :param on_reported: called with the Airflow state once a terminal PATCH returned 2xx.
    :param fault: one of :data:`leoflow_agent.protocol.FAULT_POINTS` or ``None``.
    :param max_failed_heartbeats: ``[workers] max_failed_heartbeats``: after this many consecutive failed
        heartbeats the supervisor kills the task; the wrapper then writes a ``heartbeat_lost`` record and
        refuses every later terminal PATCH of the attempt locally (DESIGN §2 "Heartbeat loss"), so the
        reconciler, not a late report, decides. A heartbeat counts as the supervisor counts it: one SDK
        call, after the SDK client's own retries (:meth:`heartbeat_result`), never one HTTP request.
    """

    def __init__(
        self,
        inner: httpx.BaseTransport,
        *,
        attempt: outcome.AttemptIdentity,
        sinks: Sequence[RecordSink],
        on_reported: Callable[[str], None],
        fault: str | None = None,
        max_failed_heartbeats: int = 3,
    ) -> None:
        self._inner = inner
        self._max_failed_heartbeats = max(1, int(max_failed_heartbeats))
        self._failed_heartbeats = 0
        self.heartbeat_lost = False
        self._attempt = attempt
        self._sinks = list(sinks)
        self._on_reported = on_reported
        self._fault = fault

    @property
    def attempt_ti_id(self) -> str:
        """The ``ti_id`` of the attempt this transport serves."""
        return self._attempt.ti_id

    def _record(self, request: httpx.Request) -> str | None:
        try:
            body = json.loads(request.content or b"{}")
        except (ValueError, UnicodeDecodeError):
            return None
        state = body.get("state") if isinstance(body, dict) else None
        if not isinstance(state, str):
            return None
        try:
            record = outcome.record_for_state(
                state, body, attempt=self._attempt, api_version=request.headers.get("airflow-api-version")
            )
        except ValueError:
            return None  # not a terminal / hand-off state: nothing to record
        for sink in self._sinks:
            try:
                sink(record)
            except (OSError, ValueError) as exc:  # ValueError: RecordTooLarge, a record the reader would refuse
                raise httpx.TransportError(f"could not write the outcome record: {exc}") from exc
        return state

    def _write_all(self, record: outcome.OutcomeRecord) -> None:
        for sink in self._sinks:
            try:
                sink(record)
            except (OSError, ValueError):
                log.exception("could not write the heartbeat_lost record")

    def heartbeat_result(self, ok: bool) -> None:
        """Count one heartbeat call of the supervisor as it does: ``ok`` resets the streak; a failure (any
        error but 404/409/410, after the SDK client's retries) adds one, and at ``max_failed_heartbeats`` in a
        row (when the supervisor kills the task) the attempt is marked ``heartbeat_lost`` for good."""
        if ok:
            self._failed_heartbeats = 0
            return
        self._failed_heartbeats += 1
        if self._failed_heartbeats >= self._max_failed_heartbeats and not self.heartbeat_lost:
            self.heartbeat_lost = True
            log.error("heartbeat lost %d times in a row: recording heartbeat_lost; later terminal reports of "
                      "this attempt are refused locally", self._failed_heartbeats)
            self._write_all(outcome.heartbeat_lost(self._attempt))

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        """Send ``request``, recording/reporting terminal states and honouring the fault point."""
        path = request.url.path
        is_state = request.method == "PATCH" and (m := _STATE_PATH.search(path)) and m["ti_id"] == self._attempt.ti_id
        is_run = request.method == "PATCH" and (m := _RUN_PATH.search(path)) and m["ti_id"] == self._attempt.ti_id
        state = None
        if is_run and self._fault == "before_run":
            _suicide("before_run")
        if is_run and self._fault == "hang_before_run":
            _hang("hang_before_run")
        if is_state and self.heartbeat_lost:
            log.warning("refusing a terminal report after heartbeat loss; the reconciler decides")
            return httpx.Response(
                409, json={"detail": {"reason": "leoflow_heartbeat_lost",
                                      "message": "refused locally by the leoflow agent after heartbeat loss"}},
                request=request,
            )
        if is_state:
            request.read()
            state = self._record(request)
            if state is not None and self._fault == "after_record":
                _suicide("after_record")
        response = self._inner.handle_request(request)
        if is_run and self._fault == "after_run" and response.status_code < 300:
            response.read()
            _suicide("after_run")
        if state is not None and 200 <= response.status_code < 300:
            try:
                self._on_reported(state)
            except OSError:
                log.warning("could not tell the zygote about the report; the reconciler will see it")
            if self._fault == "after_patch":
                response.read()
                _suicide("after_patch")
        return response

    def close(self) -> None:
        """Close the wrapped transport."""
        self._inner.close()


@functools.cache
def heartbeat_counting_client(base: type) -> type:
    """Return (one per ``base``, cached) a subclass of the SDK ``Client`` class ``base`` that reports every
    heartbeat call of the attempt to its ``leoflow_transport.heartbeat_result`` once the call's outcome is
    final (after the client's own retries). Set ``client.leoflow_transport`` right after constructing it.

    The supervisor counts a failed heartbeat per call, not per HTTP request; counting requests in the
    transport would mark ``heartbeat_lost`` during a short api-server outage the supervisor survives, and
    then refuse (and re-run) a task that succeeded. One class per base (not per attempt) lets the zygote
    pre-build the class's cached SSL context once for every agent it forks.
    """

    class HeartbeatCountingClient(base):  # type: ignore[misc, valid-type]
        leoflow_transport: RecordingTransport | None = None

        def request(self, method: str, url: Any, *args: Any, **kwargs: Any) -> httpx.Response:
            transport = self.leoflow_transport
            match = _HEARTBEAT_CALL.search(str(url).split("?", 1)[0]) if str(method).upper() == "PUT" else None
            if transport is None or match is None or match["ti_id"] != transport.attempt_ti_id:
                return super().request(method, url, *args, **kwargs)
            try:
                response = super().request(method, url, *args, **kwargs)
            except httpx.HTTPStatusError as exc:
                if exc.response.status_code not in _TERMINATED_STATUSES:
                    transport.heartbeat_result(False)
                raise
            except Exception:
                transport.heartbeat_result(False)
                raise
            transport.heartbeat_result(True)
            return response

    return HeartbeatCountingClient
