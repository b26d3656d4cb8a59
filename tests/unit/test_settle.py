"""Replay status codes and TLS (issue 8 holes 7a and 16d; DESIGN §2 "Settle mechanics").

``classify`` is a pure map from the Execution API's answer to what the reconciler does next; the TLS test
replays against a real local https server whose certificate is self-signed and generated here, as an
api-server serving ``[api] ssl_cert`` would be.
"""

from __future__ import annotations

import http.server
import json
import ssl
import threading

import pytest

from devtools.tls import self_signed_cert
from leoflow_agent.outcome import Outcome, OutcomeRecord
from leoflow_airflow.settle import SettleResult, classify, replay_state

TI_ID = "01a226c6-736e-7f99-8b42-e24b62c2f224"


# --- the status matrix ----------------------------------------------------------------------------------

@pytest.mark.parametrize("status, settled, applied", [
    (204, True, True),      # applied
    (200, True, False),     # Airflow already had that state
    (409, True, False),     # someone settled first
    (404, True, False),     # archived
    (410, True, False),     # archived
])
def test_settled_codes(status, settled, applied):
    """What ends the attempt's settle: nothing to retry, nothing to re-drive."""
    result = classify(status)
    assert (result.settled, result.applied, result.retryable) == (settled, applied, False)
    assert str(status) in result.detail


@pytest.mark.parametrize("status", [400, 401, 403, 405, 413, 415, 422, 301, 307, 308, 201, 202, 100])
def test_codes_a_retry_cannot_change_are_not_retried(status):
    """401/403/422 (and any other answer a retry of the same body and token cannot change) are final:
    the reconciler takes the infra re-drive path with the detail instead of retrying until the purge."""
    result = classify(status)
    assert (result.settled, result.applied, result.retryable) == (False, False, False)
    assert str(status) in result.detail


@pytest.mark.parametrize("status", [500, 502, 503, 504, 408, 425, 429])
def test_server_errors_and_throttling_are_retried(status):
    """5xx (the Task SDK retries these too: ``sdk/api/client.py`` ``_should_retry_api_request``), request
    timeout, too early and too many requests may answer differently next time."""
    result = classify(status)
    assert (result.settled, result.applied, result.retryable) == (False, False, True)


def test_settle_result_defaults_to_not_retryable():
    """A settled result never asks for a retry; ``retryable`` defaults to False."""
    assert SettleResult(True, True, "x").retryable is False


# --- replay_state against a real https server -----------------------------------------------------------

ANSWER: dict[int, tuple[int, bytes]] = {}
"""``{port: (status, JSON body)}``: what the https server on that port answers instead of 204."""


@pytest.fixture
def https_server(tmp_path):
    """A real https server on 127.0.0.1 that records each PATCH and answers 204."""
    cert_path, key_path = self_signed_cert(tmp_path)
    seen: list[dict] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_PATCH(self):  # noqa: N802 (http.server's naming)
            body = self.rfile.read(int(self.headers["content-length"]))
            seen.append({"path": self.path, "body": json.loads(body), "auth": self.headers["authorization"],
                         "version": self.headers.get("airflow-api-version"),
                         "attempt": self.headers.get("leoflow-attempt")})
            status, answer = ANSWER.get(self.server.server_address[1], (204, b""))
            self.send_response(status)
            if answer:
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert_path, key_path)
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}/execution/", cert_path, seen
    finally:
        server.shutdown()
        server.server_close()


def _record() -> OutcomeRecord:
    return OutcomeRecord(
        outcome=Outcome.SUCCESS, ti_id=TI_ID, try_number=1, attempt_epoch=1, state="success",
        payload={"state": "success", "end_date": "2026-12-01T00:00:00Z"}, api_version="2025-09-23",
    )


def _jwt_generator():
    from airflow.api_fastapi.auth.tokens import JWTGenerator

    return JWTGenerator(secret_key="s" * 64, valid_for=60, audience="urn:airflow.apache.org:task")


def test_replay_verifies_with_the_sdk_ca_settings(https_server, monkeypatch):
    """With ``[api] ssl_cert`` naming the api-server's self-signed certificate (what the Task SDK's client
    trusts), the replay lands; with no such setting the same replay fails certificate verification and is
    retryable (a transport error)."""
    from airflow.sdk.api import client as sdk_client

    url, cert_path, seen = https_server
    monkeypatch.setattr(sdk_client, "API_SSL_CERT_PATH", "")
    monkeypatch.setattr(sdk_client, "API_SSL_CA_FILE_PATH", None)
    untrusted = replay_state(_record(), jwt_generator=_jwt_generator(), server=url, timeout=10)
    assert (untrusted.settled, untrusted.retryable) == (False, True), untrusted
    assert "transport error" in untrusted.detail and seen == []

    monkeypatch.setattr(sdk_client, "API_SSL_CERT_PATH", str(cert_path))
    result = replay_state(_record(), jwt_generator=_jwt_generator(), server=url, timeout=10)
    assert (result.settled, result.applied) == (True, True), result
    [call] = seen
    assert call["path"] == f"/execution/task-instances/{TI_ID}/state"
    assert call["body"] == _record().payload and call["version"] == "2025-09-23"
    assert call["auth"].startswith("Bearer ey")
    assert call["attempt"] == f"ti_id={TI_ID}; try_number=1; attempt_epoch=1"  # the fence lets it through


def test_a_replay_the_fence_refuses_is_settled_as_moved_on(https_server, monkeypatch):
    """The api-server's fence answers 409 when the record's attempt is no longer its ti_id's current one: the
    replay is over (nothing of it landed) and its detail names the fence."""
    from airflow.sdk.api import client as sdk_client

    url, cert_path, seen = https_server
    monkeypatch.setattr(sdk_client, "API_SSL_CERT_PATH", str(cert_path))
    monkeypatch.setitem(ANSWER, int(url.split(":")[2].split("/")[0]), (409, json.dumps(
        {"detail": {"reason": "leoflow_stale_execution", "message": "leoflow refused this request"}}).encode()))
    result = replay_state(_record(), jwt_generator=_jwt_generator(), server=url, timeout=10)
    assert (result.settled, result.applied) == (True, False), result
    assert "leoflow's fence refused it (leoflow_stale_execution)" in result.detail and len(seen) == 1


def test_replay_trusts_ssl_ca_file_too(https_server, monkeypatch):
    """``[api] ssl_ca_file`` alone is enough, as for the SDK's client."""
    from airflow.sdk.api import client as sdk_client

    url, cert_path, seen = https_server
    monkeypatch.setattr(sdk_client, "API_SSL_CERT_PATH", "")
    monkeypatch.setattr(sdk_client, "API_SSL_CA_FILE_PATH", str(cert_path))
    result = replay_state(_record(), jwt_generator=_jwt_generator(), server=url, timeout=10)
    assert result.settled and len(seen) == 1


def test_a_record_without_payload_is_not_retried():
    """Nothing to replay can never become replayable: not settled, not retryable."""
    record = OutcomeRecord(outcome=Outcome.SUCCESS, ti_id=TI_ID, try_number=1, attempt_epoch=1, state="success", payload=None)
    result = replay_state(record, jwt_generator=None, server="https://unused/", timeout=1)
    assert (result.settled, result.retryable) == (False, False)


def test_unusable_tls_settings_are_retried_with_a_clear_detail(monkeypatch, tmp_path):
    """A CA file that cannot be read is a configuration error: reported, retried, never a crash of the
    scheduler loop and never a re-run of the task."""
    from airflow.sdk.api import client as sdk_client

    missing = tmp_path / "no-such-ca.pem"
    monkeypatch.setattr(sdk_client, "API_SSL_CERT_PATH", "")
    monkeypatch.setattr(sdk_client, "API_SSL_CA_FILE_PATH", str(missing))
    result = replay_state(_record(), jwt_generator=_jwt_generator(), server="https://127.0.0.1:9/execution/",
                          timeout=1)
    assert (result.settled, result.retryable) == (False, True)
    assert "TLS settings are unusable" in result.detail


def test_half_a_client_certificate_pair_is_refused_like_the_sdk_does(monkeypatch):
    from airflow.sdk.api import client as sdk_client

    from leoflow_airflow.settle import sdk_tls_options

    monkeypatch.setattr(sdk_client, "API_CLIENT_SSL_CERT", "/c.pem")
    monkeypatch.setattr(sdk_client, "API_CLIENT_SSL_KEY", None)
    with pytest.raises(ValueError, match="client_ssl_cert and client_ssl_key"):
        sdk_tls_options()
    monkeypatch.setattr(sdk_client, "API_CLIENT_SSL_KEY", "/k.pem")
    assert sdk_tls_options()["cert"] == ("/c.pem", "/k.pem")


@pytest.mark.parametrize("version", ["2025-09-23\u00e9", "2025-09-23\r\nx-injected: 1", "\u2028"])
def test_a_record_whose_api_version_cannot_be_a_header_is_final_and_never_raises(version):
    """Issue 8 hole 6: httpx raises ``UnicodeEncodeError`` (not an ``httpx.HTTPError``) for a non-ASCII header
    value, and h11 refuses a line break only when sending (a transport error, retried for ever). Either way no
    retry can send the record: it is final (the infra re-drive path), decided before any connection, and never
    an exception, which would end Airflow's scheduler loop and make every successor replay it again."""
    import dataclasses

    record = dataclasses.replace(_record(), api_version=version)
    result = replay_state(record, jwt_generator=_jwt_generator(), server="http://127.0.0.1:9/execution/", timeout=1)
    assert (result.settled, result.retryable) == (False, False), result
    assert "airflow-api-version" in result.detail and "not a valid header value" in result.detail


def test_an_api_version_with_inner_spaces_is_still_sent(https_server, monkeypatch):
    """The header check refuses only what cannot be sent: a visible-ASCII value with inner blanks is sent."""
    import dataclasses

    from airflow.sdk.api import client as sdk_client

    url, cert_path, seen = https_server
    monkeypatch.setattr(sdk_client, "API_SSL_CERT_PATH", str(cert_path))
    record = dataclasses.replace(_record(), api_version="2025-09-23 beta")
    result = replay_state(record, jwt_generator=_jwt_generator(), server=url, timeout=10)
    assert result.settled and [c["version"] for c in seen] == ["2025-09-23 beta"]
