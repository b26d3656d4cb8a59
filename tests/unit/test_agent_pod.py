"""The task pod's agent, ``python -m leoflow_agent pod`` (issue 9 item 4): its environment, the exchange's retry
schedule and deadline, the records it leaves when its attempt never starts, and its exit codes.

The exchange answers are a fake ``post`` over a fake clock here (pure retry logic); one test runs the real command
against a port nobody listens on. ``tests/k8s/test_agent_pod.py`` runs the agent in a real pod against a real
exchange.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from email.utils import format_datetime
from datetime import datetime, timedelta, timezone

import httpx
import pytest

from leoflow_agent import outcome, podmain
from leoflow_agent.__main__ import main as agent_main
from leoflow_agent.exchange import Grant, encode_grant
from leoflow_agent.podmain import (
    EXIT_CONFIG,
    EXIT_REFUSED,
    EXIT_START_FAILED,
    EXIT_UNREACHABLE,
    PodConfig,
    PodConfigError,
    Verdict,
    backoff_delay,
    classify_status,
    config_from_env,
    exchange_deadline_seconds,
    exchange_with_retries,
    parse_retry_after,
    run_pod,
)

URL = "http://exchange.invalid/leoflow"
GOOD_ENV = {
    "LEOFLOW_EXCHANGE_URL": URL + "/",
    "LEOFLOW_TOKEN_FILE": "/var/run/secrets/leoflow/token",
    "LEOFLOW_TERMINATION_MESSAGE_BUDGET": "2048",
    "LEOFLOW_CREDENTIAL_CEILING_SECONDS": "600",
}
TI_ID = "0190b6c2-7e4f-7a3c-9d1e-2b5f6a7c8d90"
SECRET_WORKLOAD = '{"token": "eyJ.workload-token-that-must-never-be-logged.sig"}'


def config(ceiling: int = 600, budget: int = 2048) -> PodConfig:
    return PodConfig(exchange_url=URL, token_file="/token", message_budget=budget, ceiling_seconds=ceiling)


# --- the contract with the pod builder ---------------------------------------------------------------------

def test_the_agent_reads_what_the_pod_builder_sets():
    """The pod builder (control plane) and the agent cannot import each other's modules: the names must agree."""
    from leoflow_airflow.runtime.kubernetes import pod

    assert (pod.ENV_EXCHANGE_URL, pod.ENV_TOKEN_FILE, pod.ENV_MESSAGE_BUDGET, pod.ENV_CEILING, pod.ENV_LEASE) == (
        podmain.ENV_EXCHANGE_URL, podmain.ENV_TOKEN_FILE, podmain.ENV_MESSAGE_BUDGET, podmain.ENV_CEILING,
        podmain.ENV_LEASE)
    assert pod.TERMINATION_MESSAGE_PATH == podmain.TERMINATION_MESSAGE_PATH
    assert pod.AGENT_ARGS[-3:] == ("-m", "leoflow_agent", "pod")
    with pytest.raises(SystemExit) as exc:
        agent_main(["pod", "--help"])
    assert exc.value.code == 0


def test_config_from_env():
    got = config_from_env(GOOD_ENV)
    assert got == PodConfig(exchange_url=URL, token_file="/var/run/secrets/leoflow/token", message_budget=2048,
                            ceiling_seconds=600)
    assert got.exchange_endpoint == URL + "/v1/exchange"
    bare = {k: v for k, v in GOOD_ENV.items() if k in ("LEOFLOW_EXCHANGE_URL", "LEOFLOW_TOKEN_FILE")}
    assert (config_from_env(bare).message_budget, config_from_env(bare).ceiling_seconds) == (
        outcome.TERMINATION_MESSAGE_BUDGET, 0)
    assert got.fault is None
    assert config_from_env({**GOOD_ENV, "LEOFLOW_TEST_FAULT": "after_record"}).fault == "after_record"


@pytest.mark.parametrize(("name", "value", "says"), [
    ("LEOFLOW_EXCHANGE_URL", None, "LEOFLOW_EXCHANGE_URL"),
    ("LEOFLOW_EXCHANGE_URL", "exchange:8080/leoflow", "http(s) URL"),
    ("LEOFLOW_EXCHANGE_URL", "https://", "http(s) URL"),
    ("LEOFLOW_TOKEN_FILE", " ", "LEOFLOW_TOKEN_FILE"),
    ("LEOFLOW_TERMINATION_MESSAGE_BUDGET", "2k", "must be an integer"),
    ("LEOFLOW_TERMINATION_MESSAGE_BUDGET", "0", "at least 1"),
    ("LEOFLOW_CREDENTIAL_CEILING_SECONDS", "-1", "at least 0"),
    ("LEOFLOW_TEST_FAULT", "mid_task", "must be one of"),
])
def test_config_from_env_names_what_is_wrong(name, value, says):
    env = {k: v for k, v in GOOD_ENV.items() if k != name}
    if value is not None:
        env[name] = value
    with pytest.raises(PodConfigError, match=name) as exc:
        config_from_env(env)
    assert says in str(exc.value)


# --- schedule and deadline ----------------------------------------------------------------------------------

def test_exchange_deadline_is_half_the_ceiling_at_most_ten_minutes():
    assert exchange_deadline_seconds(0) == 600  # no ceiling: Airflow's default task_queued_timeout
    assert exchange_deadline_seconds(600) == 300  # the shortest ceiling the settings allow
    assert exchange_deadline_seconds(604800) == 600  # the default ceiling, a week
    assert exchange_deadline_seconds(3) == 1.5


def test_backoff_doubles_from_half_a_second_to_a_cap_with_jitter_in_the_upper_half():
    low = [backoff_delay(n, rng=lambda: 0.0) for n in range(1, 10)]
    high = [backoff_delay(n, rng=lambda: 0.999999) for n in range(1, 10)]
    assert low == [0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 15.0, 15.0]
    assert [round(h, 3) for h in high] == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]
    assert backoff_delay(10_000, rng=lambda: 0.5) == 22.5  # no overflow far out


def test_backoff_honours_retry_after_and_caps_it():
    assert backoff_delay(1, retry_after=5, rng=lambda: 0.0) == 5
    assert backoff_delay(8, retry_after=5, rng=lambda: 0.0) == 15  # the back-off is longer already
    assert backoff_delay(1, retry_after=3600, rng=lambda: 0.0) == 60
    assert backoff_delay(1, retry_after=-4, rng=lambda: 0.0) == 0.25


def test_parse_retry_after():
    now = datetime(2026, 12, 1, 12, 0, 0, tzinfo=timezone.utc)
    clock = now.timestamp
    assert parse_retry_after("5") == 5.0 and parse_retry_after(" 12 ") == 12.0
    assert parse_retry_after(format_datetime(now + timedelta(seconds=30), usegmt=True), now=clock) == 30.0
    assert parse_retry_after(format_datetime(now - timedelta(seconds=30), usegmt=True), now=clock) == 0.0
    for junk in (None, "", "soon", "-5", "1.5", "Tue, 99 Foo 2026"):
        assert parse_retry_after(junk) is None, junk


@pytest.mark.parametrize(("status", "verdict"), [
    (200, Verdict.GRANTED), (503, Verdict.RETRY), (502, Verdict.RETRY), (504, Verdict.RETRY), (500, Verdict.RETRY),
    (429, Verdict.RETRY), (403, Verdict.REFUSED), (404, Verdict.REFUSED), (401, Verdict.REFUSED),
    (400, Verdict.REFUSED), (201, Verdict.REFUSED), (301, Verdict.REFUSED)])
def test_classify_status(status, verdict):
    assert classify_status(status) is verdict


# --- the retry loop, over a fake clock -----------------------------------------------------------------------

class Clock:
    """A monotonic clock that only ``sleep`` moves; keeps every sleep."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0
        self.sleeps.append(seconds)
        self.now += seconds


class Server:
    """Answers one scripted item per request (an ``Answer`` tuple, or an exception to raise); the last repeats.
    Keeps each request's token and timeout."""

    def __init__(self, clock: Clock, *script) -> None:
        self.clock, self.script = clock, list(script)
        self.tokens: list[str] = []
        self.timeouts: list[float] = []

    def post(self, url: str, body: bytes, timeout: float):
        assert url == URL + "/v1/exchange"
        self.tokens.append(json.loads(body)["token"])
        self.timeouts.append(timeout)
        item = self.script.pop(0) if len(self.script) > 1 else self.script[0]
        if isinstance(item, BaseException):
            self.clock.now += 0.01
            raise item
        return item


def grant_answer() -> tuple:
    grant = Grant(workload=SECRET_WORKLOAD, ti_id=TI_ID, try_number=2, attempt_epoch=3)
    return 200, {}, json.dumps(encode_grant(grant)).encode()


def unavailable(retry_after: str | None = "5") -> tuple:
    return 503, ({"retry-after": retry_after} if retry_after else {}), b'{"error_id":"' + b"a" * 32 + b'"}'


def run(server: Server, clock: Clock, cfg: PodConfig | None = None, tokens=None):
    issued = iter(tokens or (f"tok{i}.a.b" for i in range(10_000)))
    return exchange_with_retries(cfg or config(), post=server.post, read_token=lambda path: next(issued),
                                 monotonic=clock.monotonic, sleep=clock.sleep, rng=lambda: 0.0)


def test_unavailable_then_granted_honours_retry_after_and_rereads_the_token_every_try():
    """503 (the attempt not yet dispatched, or Kubernetes slow) twice, a proxy's 502 once, then granted: waits at
    least Retry-After after each 503, the back-off after the 502, and sends the token file's content of the
    moment each time (the kubelet rotates it)."""
    clock = Clock()
    server = Server(clock, unavailable("5"), unavailable("1"), (502, {}, b"bad gateway"), grant_answer())
    result = run(server, clock)
    assert result.grant == Grant(workload=SECRET_WORKLOAD, ti_id=TI_ID, try_number=2, attempt_epoch=3)
    assert (result.reason, result.exit_code, result.tries) == (None, 0, 4)
    assert clock.sleeps == [5.0, 1.0, 1.0]  # Retry-After 5; Retry-After 1 over a 0.5 s back-off; back-off 1 s
    assert server.tokens == ["tok0.a.b", "tok1.a.b", "tok2.a.b", "tok3.a.b"]


def test_an_exchange_that_never_answers_ends_unreachable_at_the_deadline(caplog):
    """Connection refused, timeouts, 503s: tried with growing back-off until the deadline (half the ceiling),
    the last wait cut to what is left, no request timeout past it; then ``exchange_unreachable``."""
    clock = Clock()
    start = clock.now
    server = Server(clock, httpx.ConnectError("refused"), httpx.ReadTimeout("slow"), unavailable(None),
                    ConnectionResetError(104, "reset"), httpx.ConnectError("refused"))
    result = run(server, clock, config(ceiling=120))
    assert (result.grant, result.reason, result.exit_code) == (None, outcome.Reason.EXCHANGE_UNREACHABLE,
                                                               EXIT_UNREACHABLE)
    assert clock.now - start == pytest.approx(60, abs=0.1)
    assert clock.sleeps[:7] == [0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0] and max(clock.sleeps) == 15.0
    assert result.tries == len(clock.sleeps) + 1
    assert all(t <= podmain.REQUEST_TIMEOUT_SECONDS for t in server.timeouts) and server.timeouts[-1] <= 0.25
    assert "ConnectError" in caplog.text and "ReadTimeout" in caplog.text and "HTTP 503" in caplog.text


def test_a_refusal_is_final_at_once():
    clock = Clock()
    server = Server(clock, unavailable(), (403, {}, b'{"error_id":"' + b"f" * 32 + b'"}'), grant_answer())
    result = run(server, clock)
    assert (result.grant, result.reason, result.exit_code, result.tries) == (
        None, outcome.Reason.EXCHANGE_REFUSED, EXIT_REFUSED, 2)
    assert result.detail == "HTTP 403 error_id=" + "f" * 32
    assert clock.sleeps == [5.0]


def test_a_grant_that_does_not_decode_and_an_unreadable_token_never_retry():
    clock = Clock()
    result = run(Server(clock, (200, {}, b'{"workload": ""}')), clock)
    assert (result.reason, result.exit_code, result.tries) == (outcome.Reason.AGENT_START_FAILED, EXIT_START_FAILED, 1)

    def unreadable(path):
        raise FileNotFoundError(2, "No such file or directory", path)

    server = Server(clock, grant_answer())
    result = exchange_with_retries(config(), post=server.post, read_token=unreadable, monotonic=clock.monotonic,
                                   sleep=clock.sleep)
    assert (result.reason, result.exit_code, result.tries, server.tokens) == (
        outcome.Reason.AGENT_START_FAILED, EXIT_CONFIG, 0, [])
    assert "No such file or directory" in result.detail


# --- the records it leaves ----------------------------------------------------------------------------------

def test_a_refused_pod_leaves_only_its_refusal_record_and_no_secret(tmp_path, caplog):
    """The termination message held something longer before (say a stale write): after a refused exchange it
    holds exactly the ``exchange_refused`` record, which ``outcome.decode`` reads back; the token is in no log."""
    token_file = tmp_path / "token"
    token_file.write_text("eyJhbGciOi.projected-token-secret.sig\n")
    message = tmp_path / "termination-log"
    message.write_bytes(b"y" * 4000)
    cfg = PodConfig(exchange_url=URL, token_file=str(token_file), message_budget=1536, ceiling_seconds=600)
    sent = []

    def post(url, body, timeout):
        sent.append(json.loads(body))
        return 403, {}, b'{"error_id":"0123456789abcdef0123456789abcdef"}'

    assert run_pod(cfg, termination_path=str(message), post=post) == EXIT_REFUSED
    assert sent == [{"token": "eyJhbGciOi.projected-token-secret.sig"}]
    assert message.read_bytes() == b'{"v":1,"outcome":"failed","reason":"exchange_refused"}'
    assert outcome.decode(message.read_bytes()) == outcome.exchange_refused()
    assert "projected-token-secret" not in caplog.text and "0123456789abcdef0123456789abcdef" in caplog.text


def test_a_granted_workload_that_cannot_run_leaves_agent_start_failed_with_the_attempt(tmp_path, caplog):
    token_file = tmp_path / "token"
    token_file.write_text("a.b.c")
    message = tmp_path / "termination-log"
    cfg = PodConfig(exchange_url=URL, token_file=str(token_file), message_budget=1536, ceiling_seconds=600)
    assert run_pod(cfg, termination_path=str(message), post=lambda *a: grant_answer()) == EXIT_START_FAILED
    attempt = outcome.AttemptIdentity(TI_ID, 2, 3)
    assert outcome.decode(message.read_bytes(), expect=attempt) == outcome.agent_start_failed(attempt)
    assert "workload-token-that-must-never-be-logged" not in caplog.text


def test_an_unusable_environment_leaves_agent_start_failed(tmp_path):
    message = tmp_path / "termination-log"
    env = {k: v for k, v in GOOD_ENV.items() if k != "LEOFLOW_EXCHANGE_URL"}
    assert podmain.main(env, termination_path=str(message)) == EXIT_CONFIG
    assert outcome.decode(message.read_bytes()) == outcome.agent_start_failed()


def test_the_command_against_a_closed_port_retries_until_its_deadline_then_records_unreachable(tmp_path):
    """The real command, as the pod runs it (settings from the environment only), against a port nobody listens
    on and a 6 s ceiling: it tries at least three times within its 3 s deadline (back-offs of at most 0.5 s and
    1 s come first), exits 4 and leaves
    ``exchange_unreachable`` as the whole termination message."""
    from devtools.stack import free_port

    port = free_port()  # a free port, closed again: connection refused
    token_file = tmp_path / "token"
    token_file.write_text("a.b.c")
    message = tmp_path / "termination-log"
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LEOFLOW_EXCHANGE_URL": f"http://127.0.0.1:{port}/leoflow",
           "LEOFLOW_TOKEN_FILE": str(token_file), "LEOFLOW_TERMINATION_MESSAGE_BUDGET": "1536",
           "LEOFLOW_CREDENTIAL_CEILING_SECONDS": "6"}
    began = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "leoflow_agent", "pod", "--termination-message-path", str(message)],
                          env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == EXIT_UNREACHABLE, proc.stderr
    assert time.monotonic() - began >= 3.0
    assert outcome.decode(message.read_text()) == outcome.exchange_unreachable()
    assert proc.stderr.count("trying again in") >= 2 and "ConnectError" in proc.stderr
