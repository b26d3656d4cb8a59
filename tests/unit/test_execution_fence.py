"""The Execution API fence (issue 10 item 6, DESIGN §2 Invariant 1): the attempt header's wire form, the pure
decision (token subject, header, ledger row → pass or 409), the middleware around a small ASGI app with the
ledger read stood in for (:data:`leoflow_airflow.api.execution_fence.Lookup`), and the agent's side: its
transport names the attempt on every request and notes the fence's refusal, whose record cannot pass for
the newer epoch's.

The integration test with a real Airflow is ``tests/integration/test_lite_execution_fence.py``.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging

import httpx
import pytest

from leoflow_agent import fencing, outcome
from leoflow_agent.transport import RecordingTransport, file_sink
from leoflow_airflow.api.execution_fence import ExecutionFence
from leoflow_airflow.api.fence import PASS, decide, is_execution_path, refusal_body, token_subject

TI = "0190abcd-0000-7000-8000-0000000000f1"
OTHER = "0190abcd-0000-7000-8000-0000000000f2"


def _jwt(claims: dict) -> str:
    def seg(obj: dict) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).rstrip(b"=").decode()

    return f"{seg({'alg': 'HS512', 'typ': 'JWT'})}.{seg(claims)}.c2lnbmF0dXJl"


def _header(ti_id: str = TI, try_number: int = 1, epoch: int = 2) -> str:
    return fencing.format_attempt(outcome.AttemptIdentity(ti_id, try_number, epoch))


# --- the header's wire form --------------------------------------------------------------------------------

def test_the_attempt_header_round_trips_and_refuses_what_it_could_not_read_back():
    attempt = outcome.AttemptIdentity(TI.upper(), 3, 12)
    value = fencing.format_attempt(attempt)
    assert value == f"ti_id={TI}; try_number=3; attempt_epoch=12"
    assert fencing.parse_attempt(value) == outcome.AttemptIdentity(TI, 3, 12)
    assert fencing.parse_attempt(f"  ti_id={TI};try_number=3;attempt_epoch=12 ") == outcome.AttemptIdentity(TI, 3, 12)
    for bad in (outcome.AttemptIdentity("ti-1", 1, 1), outcome.AttemptIdentity(TI, 0, 1),
                outcome.AttemptIdentity(TI, 1, 0)):
        with pytest.raises(ValueError):
            fencing.format_attempt(bad)


@pytest.mark.parametrize("value", [
    None, "", "garbage", f"ti_id={TI}; try_number=1", f"ti_id={TI}; try_number=1; attempt_epoch=0",
    f"ti_id={TI}; try_number=-1; attempt_epoch=2", f"ti_id={TI}; try_number=1; attempt_epoch=2; x=1",
    f"{_header()}, {_header()}", "ti_id=" + "a" * 300,
])
def test_a_malformed_attempt_header_names_no_attempt(value):
    assert fencing.parse_attempt(value) is None


# --- the pure decision ---------------------------------------------------------------------------------

def test_the_token_subject_is_read_without_verification_and_only_when_it_is_a_ti_id():
    assert token_subject(f"Bearer {_jwt({'sub': TI.upper(), 'scope': 'execution'})}") == TI
    assert token_subject(f"bearer  {_jwt({'sub': TI})}") == TI
    for value in (None, "", f"Basic {_jwt({'sub': TI})}", "Bearer not-a-jwt", "Bearer a.!!!.c",
                  f"Bearer {_jwt({'sub': 'conn-test-1'})}", f"Bearer {_jwt({'sub': 7})}", f"Bearer {_jwt({})}",
                  "Bearer a.W10.c", "Bearer " + "a" * 20000):
        assert token_subject(value) is None, value


@pytest.mark.parametrize("path, root, expected", [
    ("/execution/task-instances/x/heartbeat", "", True),
    ("/execution", "", True),
    ("/base/execution/task-instances/x/state", "/base", True),
    ("/execution/xcoms/d/r/t/k", "/base", True),   # a proxy stripped the root path
    ("/executions/x", "", False),
    ("/api/v2/dags", "", False),
    ("/leoflow/v1/exchange", "", False),
    ("/base/api/v2/execution", "/base", False),
])
def test_only_the_execution_api_is_judged(path, root, expected):
    assert is_execution_path(path, root) is expected


@pytest.mark.parametrize("header, current, allowed, reason", [
    (None, None, True, None),                       # no leoflow attempt: another executor's task
    (_header(epoch=1), None, True, None),
    (_header(epoch=2), (1, 2), True, None),         # the current execution
    (_header(epoch=1), (1, 2), False, fencing.STALE),   # an older epoch of the same ti_id
    (_header(epoch=3), (1, 2), False, fencing.STALE),   # one the ledger never claimed
    (_header(try_number=2, epoch=2), (1, 2), False, fencing.STALE),
    (None, (1, 2), False, fencing.UNIDENTIFIED),    # every leoflow agent sends it
    ("garbage", (1, 2), False, fencing.UNIDENTIFIED),
    (_header(ti_id=OTHER), (1, 2), False, fencing.UNIDENTIFIED),
])
def test_decide(header, current, allowed, reason):
    verdict = decide(ti_id=TI, header=header, current=current)
    assert (verdict.allowed, verdict.reason) == (allowed, reason)
    if allowed:
        assert verdict == PASS
    else:
        assert verdict.current == current and "leoflow" in verdict.message and TI in verdict.message


def test_a_stale_refusal_names_leoflow_both_epochs_and_the_error_id():
    verdict = decide(ti_id=TI, header=_header(epoch=1), current=(1, 2))
    body = refusal_body(verdict, "e1")
    assert body == {"detail": {
        "reason": "leoflow_stale_execution", "message": verdict.message, "ti_id": TI,
        "sent": {"ti_id": TI, "try_number": 1, "attempt_epoch": 1},
        "current": {"try_number": 1, "attempt_epoch": 2}, "error_id": "e1",
    }}
    assert "epoch 1 of try 1" in verdict.message and "epoch 2 of try 1" in verdict.message
    assert fencing.fence_reason(body) == fencing.STALE
    assert fencing.fence_reason({"detail": {"reason": "invalid_state"}}) is None
    assert fencing.fence_reason({"detail": "Not found"}) is None and fencing.fence_reason([]) is None
    with pytest.raises(ValueError):
        refusal_body(PASS, "e2")


# --- the middleware ----------------------------------------------------------------------------------

class Ledger:
    """The ledger read, stood in for: ``{ti_id: (try_number, attempt_epoch[, superseded])}``; ``broken`` raises
    instead."""

    def __init__(self, rows: dict[str, tuple[int, ...]]) -> None:
        self.rows, self.reads, self.broken = rows, [], False

    def __call__(self, ti_id: str) -> tuple[int, ...] | None:
        self.reads.append(ti_id)
        if self.broken:
            raise OSError("database unreachable")
        return self.rows.get(ti_id)


def _served(fence: ExecutionFence, reached: list[str]):
    async def app(scope, receive, send):
        reached.append(scope["path"])
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    fence.app = app
    return fence


def _call(fence: ExecutionFence, path: str, *, token_sub: str | None = TI, header: str | None = None,
          root_path: str = "") -> tuple[int, dict, dict]:
    """One request through ``fence``; ``(status, headers, json body or {})``."""
    headers = []
    if token_sub is not None:
        headers.append((b"authorization", f"Bearer {_jwt({'sub': token_sub, 'scope': 'execution'})}".encode()))
    if header is not None:
        headers.append((b"leoflow-attempt", header.encode()))
    scope = {"type": "http", "method": "PUT", "path": path, "root_path": root_path, "headers": headers}
    sent: list[dict] = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    asyncio.run(fence(scope, receive, send))
    start = sent[0]
    body = b"".join(m.get("body", b"") for m in sent[1:])
    return start["status"], dict(start["headers"]), json.loads(body) if body else {}


HB = f"/execution/task-instances/{TI}/heartbeat"


def test_the_middleware_refuses_a_stale_execution_and_passes_the_current_one(caplog):
    ledger, reached = Ledger({TI: (1, 2)}), []
    fence = _served(ExecutionFence(None, lookup=ledger), reached)
    with caplog.at_level(logging.WARNING, logger="leoflow_airflow.api.execution_fence"):
        status, headers, body = _call(fence, HB, header=_header(epoch=1))
    assert status == 409 and reached == []
    assert headers[b"content-type"] == b"application/json" and headers[b"cache-control"] == b"no-store"
    assert body["detail"]["reason"] == fencing.STALE and body["detail"]["current"]["attempt_epoch"] == 2
    assert body["detail"]["error_id"] in caplog.text and "reason=leoflow_stale_execution" in caplog.text

    assert _call(fence, HB, header=_header(epoch=2))[0] == 204
    assert _call(fence, f"/execution/xcoms/d/r/t/k", header=None)[2]["detail"]["reason"] == fencing.UNIDENTIFIED
    assert reached == [HB] and ledger.reads == [TI, TI, TI]


def test_the_middleware_reads_nothing_for_requests_it_does_not_judge():
    ledger, reached = Ledger({TI: (1, 2)}), []
    fence = _served(ExecutionFence(None, lookup=ledger), reached)
    assert _call(fence, "/api/v2/dags", header=None)[0] == 204                       # not the Execution API
    assert _call(fence, "/execution/health", token_sub=None)[0] == 204               # no token
    assert _call(fence, HB, token_sub="ct-1", header=None)[0] == 204                  # no ti_id in the token
    assert ledger.reads == []
    assert _call(fence, f"/execution/task-instances/{OTHER}/heartbeat", token_sub=OTHER)[0] == 204  # not leoflow's
    assert ledger.reads == [OTHER]
    assert _call(fence, f"/base{HB}", header=_header(epoch=1), root_path="/base")[0] == 409


def test_a_ledger_read_error_fails_open_with_one_warning_a_minute(caplog):
    ledger, reached, now = Ledger({TI: (1, 2)}), [], [1000.0]
    ledger.broken = True
    fence = _served(ExecutionFence(None, lookup=ledger, clock=lambda: now[0]), reached)
    with caplog.at_level(logging.WARNING, logger="leoflow_airflow.api.execution_fence"):
        assert [_call(fence, HB, header=_header(epoch=1))[0] for _ in range(3)] == [204, 204, 204]
        now[0] += 61
        assert _call(fence, HB, header=_header(epoch=1))[0] == 204
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 2 and "OSError: database unreachable" in warnings[0], warnings
    assert "1 Execution API request(s)" in warnings[0] and "3 Execution API request(s)" in warnings[1]
    ledger.broken = False
    assert _call(fence, HB, header=_header(epoch=1))[0] == 409  # no cache: judged again at once


def test_a_superseded_try_is_refused_whatever_its_header_says():
    """A clear, a retry or an infra re-drive gave the task instance a new ``ti_id``: every call of the old one is
    refused, even one naming the epoch that was current, because Airflow takes a superseded try's XCom and
    Variable writes (k8s review; DESIGN §2 Invariant 1)."""
    for header in (_header(epoch=2), _header(epoch=1), None):
        verdict = decide(ti_id=TI, header=header, current=(1, 2), superseded=True)
        assert (verdict.allowed, verdict.reason) == (False, fencing.SUPERSEDED)
        assert "no longer its task's current try" in verdict.message and TI in verdict.message
        assert refusal_body(verdict, "e9")["detail"]["reason"] == "leoflow_superseded_try"
    assert decide(ti_id=TI, header=None, current=None, superseded=True) == PASS  # not leoflow's task
    assert fencing.fence_reason({"detail": {"reason": fencing.SUPERSEDED}}) == fencing.SUPERSEDED


def test_the_middleware_refuses_every_route_of_a_superseded_try():
    ledger, reached = Ledger({TI: (1, 2, True), OTHER: (1, 1, False)}), []
    fence = _served(ExecutionFence(None, lookup=ledger), reached)
    for path in (HB, "/execution/xcoms/d/r/t/return_value", "/execution/variables/k",
                 "/execution/asset-events/by-asset", f"/execution/task-instances/{TI}/state"):
        status, _, body = _call(fence, path, header=_header(epoch=2))
        assert (status, body["detail"]["reason"]) == (409, fencing.SUPERSEDED), path
    assert reached == []
    other = f"/execution/task-instances/{OTHER}/heartbeat"
    assert _call(fence, other, token_sub=OTHER, header=_header(ti_id=OTHER, epoch=1))[0] == 204


# --- the agent's side --------------------------------------------------------------------------------

def test_the_agent_names_its_attempt_on_every_request_and_a_fenced_report_lands_nowhere(tmp_path):
    """A stale agent (epoch 1) whose ``ti_id`` leoflow moved to epoch 2: every request carries its header; the
    fence refuses its success report, so nothing is reported to the zygote, and the success record it wrote
    first names epoch 1, which a read for epoch 2 does not accept as its own."""
    stale = outcome.AttemptIdentity(TI, 1, 1)
    seen: list[httpx.Request] = []

    def api_server(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        verdict = decide(ti_id=TI, header=request.headers.get(fencing.ATTEMPT_HEADER), current=(1, 2))
        if verdict.allowed:
            return httpx.Response(204)
        return httpx.Response(409, json=refusal_body(verdict, "e3"))

    record_path = str(tmp_path / "record.json")
    reported: list[tuple[str, bool]] = []
    transport = RecordingTransport(httpx.MockTransport(api_server), attempt=stale, sinks=[file_sink(record_path)],
                                   on_reported=lambda state, recorded: reported.append((state, recorded)))
    client = httpx.Client(base_url="http://api.test/execution/", transport=transport)
    assert client.put(f"task-instances/{TI}/heartbeat", json={"pid": 1}).status_code == 409
    assert client.get("xcoms/d/r/t/k").status_code == 409
    response = client.patch(f"task-instances/{TI}/state", json={"state": "success",
                                                                "end_date": "2026-01-01T00:00:00Z"})
    assert response.status_code == 409 and response.json()["detail"]["reason"] == fencing.STALE
    assert {r.headers[fencing.ATTEMPT_HEADER] for r in seen} == {_header(epoch=1)} and len(seen) == 3
    assert transport.fenced == fencing.STALE and reported == []
    assert outcome.read_record_file(record_path, expect=stale).state == "success"
    assert outcome.read_record_file(record_path, expect=outcome.AttemptIdentity(TI, 1, 2)) is None
