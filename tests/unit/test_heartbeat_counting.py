"""The agent counts failed heartbeats per supervisor call (after the SDK client's retries), never per HTTP
request, so a short api-server outage the supervisor survives never marks the attempt ``heartbeat_lost``; and a
call the task needed that went unanswered for good makes a later failure an infra loss (``api_unreachable``),
never a spent user retry (issue 10)."""

from __future__ import annotations

import httpx
import pytest

from leoflow_agent import outcome
from leoflow_agent.transport import RecordingTransport, heartbeat_counting_client

TI = "01900000-0000-7000-8000-000000000001"
ATTEMPT = outcome.AttemptIdentity(TI, 1, 1)
HB = f"task-instances/{TI}/heartbeat"


class RetryingClient(httpx.Client):
    """Stands in for the SDK client: raises on 4xx/5xx and retries transport errors and 5xx (3 tries)."""

    def __init__(self, **kwargs):
        super().__init__(base_url="http://api.test/execution/",
                         event_hooks={"response": [lambda r: r.raise_for_status()]}, **kwargs)

    def request(self, *args, **kwargs):
        for attempt in range(3):
            try:
                return super().request(*args, **kwargs)
            except (httpx.TransportError, httpx.HTTPStatusError) as exc:
                if isinstance(exc, httpx.HTTPStatusError) and exc.response.status_code < 500 or attempt == 2:
                    raise


def _client(answers: list, max_failed: int = 2):
    records: list[outcome.OutcomeRecord] = []

    def handler(request: httpx.Request) -> httpx.Response:
        answer = answers.pop(0)
        if answer == "down":
            raise httpx.ConnectError("refused", request=request)
        return httpx.Response(answer, json={})

    transport = RecordingTransport(httpx.MockTransport(handler), attempt=ATTEMPT, sinks=[records.append],
                                   on_reported=lambda state, recorded: None, max_failed_heartbeats=max_failed)
    client = heartbeat_counting_client(RetryingClient)(transport=transport)
    client.leoflow_transport = transport
    return client, transport, records


def test_request_failures_inside_one_call_are_one_heartbeat_at_most():
    client, transport, records = _client(["down", "down", 204, "down", "down", 204])
    client.put(HB)
    client.put(HB)
    assert not transport.heartbeat_lost and not records


def test_consecutive_failed_calls_mark_heartbeat_lost_and_refuse_the_terminal_report():
    client, transport, records = _client(["down"] * 3 + [503] * 3)
    for _ in range(2):
        with pytest.raises((httpx.TransportError, httpx.HTTPStatusError)):
            client.put(HB)
    assert transport.heartbeat_lost
    assert [r.reason for r in records] == [outcome.Reason.HEARTBEAT_LOST]
    refused = transport.handle_request(httpx.Request("PATCH", f"http://api.test/execution/task-instances/{TI}/state",
                                                     json={"state": "failed"}))
    assert refused.status_code == 409


def test_a_success_in_between_resets_and_server_terminated_answers_do_not_count():
    client, transport, records = _client(["down"] * 3 + [204] + ["down"] * 3 + [409])
    with pytest.raises(httpx.TransportError):
        client.put(HB)
    client.put(HB)
    with pytest.raises(httpx.TransportError):
        client.put(HB)
    with pytest.raises(httpx.HTTPStatusError):
        client.put(HB)  # 409: the server ended the task; the supervisor stops it, not a heartbeat failure
    assert not transport.heartbeat_lost and not records


STATE = f"task-instances/{TI}/state"
XCOM = "xcoms/dag/run/task/return_value"


def _report(client, state: str):
    return client.patch(STATE, json={"state": state})


def test_a_failure_after_an_unanswered_call_is_refused_and_recorded_api_unreachable():
    """The api-server is down while the task pushes an XCom (every retry refused): the SDK hands the task
    API_SERVER_ERROR and it fails; that up_for_retry report is refused here (409, never sent) and the record
    says api_unreachable, so the reconciler re-drives the attempt on the infra budget."""
    client, transport, records = _client(["down"] * 3)  # nothing more: a report that left would pop an empty list
    with pytest.raises(httpx.ConnectError):
        client.post(XCOM, json={})
    with pytest.raises(httpx.HTTPStatusError) as refused:
        _report(client, "up_for_retry")
    assert refused.value.response.status_code == 409
    assert refused.value.response.json()["detail"]["reason"] == "leoflow_api_unreachable"
    assert [(r.reason, r.state, r.payload) for r in records] == [(outcome.Reason.API_UNREACHABLE, None, None)]
    assert transport.unanswered == f"POST {XCOM} (ConnectError)"


def test_a_success_after_an_unanswered_call_lands_with_its_record():
    """The task caught the error and succeeded: its success report leaves and lands (the work is done)."""
    client, transport, records = _client([503] * 3 + [200])
    with pytest.raises(httpx.HTTPStatusError):
        client.get(XCOM)
    assert _report(client, "success").status_code == 200
    assert [r.state for r in records] == ["success"]
    assert transport.unanswered == f"GET {XCOM} (HTTPStatusError 503)"


def test_answered_errors_and_a_failed_report_itself_do_not_count():
    """A 404 (a missing Variable: the task's own problem) is an answer; a failed report that itself went
    unanswered is not a call the task needed. The failure then lands as the task's own, spending its retry."""
    client, transport, records = _client([404] + ["down"] * 3 + [200])
    with pytest.raises(httpx.HTTPStatusError):
        client.get("variables/missing")
    with pytest.raises(httpx.ConnectError):
        _report(client, "failed")
    assert transport.unanswered is None
    assert _report(client, "failed").status_code == 200
    assert records and {(r.state, r.reason) for r in records} == {("failed", None)}  # one write per try sent


RUN = f"task-instances/{TI}/run"


def _counting_client(answers: list, window: float):
    """A client whose transport logs every request that left (method, path)."""
    sent: list[tuple[str, str]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append((request.method, request.url.path.rsplit("/", 1)[-1]))
        return httpx.Response(answers.pop(0), json={})

    transport = RecordingTransport(httpx.MockTransport(handler), attempt=ATTEMPT, sinks=[],
                                   on_reported=lambda state, recorded: None, max_failed_heartbeats=2)
    client = heartbeat_counting_client(RetryingClient)(transport=transport)
    client.leoflow_transport = transport
    client.leoflow_first_heartbeat_window = window
    return client, sent


def test_the_first_heartbeat_right_after_the_run_call_is_not_sent_later_ones_are():
    """The supervisor heartbeats at once after ``PATCH …/run``, which set ``last_heartbeat_at`` already: that
    one is answered 204 without a request; the next heartbeat and every later one leave."""
    client, sent = _counting_client([200, 204, 204], window=2.5)
    client.patch(RUN, json={})
    assert client.put(HB).status_code == 204
    client.put(HB)
    client.put(HB)
    assert sent == [("PATCH", "run"), ("PUT", "heartbeat"), ("PUT", "heartbeat")]


@pytest.mark.parametrize("case", ["window 0", "run refused", "window passed", "other ti's run"])
def test_the_first_heartbeat_is_sent_unless_a_2xx_run_call_of_this_ti_just_answered(case, monkeypatch):
    import time as real_time

    client, sent = _counting_client([409 if case == "run refused" else 200, 204], window=0 if case == "window 0" else 2.5)
    run = RUN.replace(TI, "01900000-0000-7000-8000-000000000002") if case == "other ti's run" else RUN
    if case == "run refused":
        with pytest.raises(httpx.HTTPStatusError):
            client.patch(run, json={})
    else:
        client.patch(run, json={})
    if case == "window passed":
        later = real_time.monotonic() + 2.6
        monkeypatch.setattr("leoflow_agent.transport.time.monotonic", lambda: later)
    client.put(HB)
    assert sent[-1] == ("PUT", "heartbeat")
