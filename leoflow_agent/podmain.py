"""``python -m leoflow_agent pod``: the agent of one Kubernetes task pod (DESIGN §3 "Start" and "Run"; issue 9 item 4).

What it does, in order:

1. reads its environment (:func:`config_from_env`; all of it public, set by the pod builder,
   ``leoflow_airflow.runtime.kubernetes.pod``): :data:`ENV_EXCHANGE_URL`, :data:`ENV_TOKEN_FILE`,
   :data:`ENV_MESSAGE_BUDGET`, :data:`ENV_CEILING`;
2. trades the pod's projected ServiceAccount token for its attempt's workload: ``POST <exchange_url>/v1/exchange``
   (:mod:`leoflow_agent.exchange`), re-reading the token file before every try (the kubelet rotates it). A 503,
   another 5xx, a 429, a transport error or a timeout is tried again after a capped exponential back-off with
   jitter that honours ``Retry-After`` (:func:`backoff_delay`), until a deadline derived from the credential
   ceiling (:func:`exchange_deadline_seconds`). Any other answer but 200 (a 403 above all) is final;
3. runs the granted workload under the Task SDK supervisor exactly as a Lite agent does
   (:func:`leoflow_agent.runner.supervise_attempt`), with one record sink: the termination message
   (:data:`TERMINATION_MESSAGE_PATH`), which holds exactly the outcome record, written whole before each terminal
   PATCH (:func:`leoflow_agent.outcome.write_termination_message`);
4. exits. The exit code says how far the agent got, never the task's outcome (:data:`EXIT_CODES`).

When the attempt never starts, the termination message says why, as a ``failed`` record with a classified reason
and no state (:func:`leoflow_agent.outcome.exchange_refused`, ``exchange_unreachable``, ``agent_start_failed``):
the reconciler re-dispatches an attempt whose TI Airflow still holds QUEUED (``leoflow_airflow.reconcile``), so a
refused pod never spends a user retry. Before a grant the agent does not know its attempt; such a record carries no
identity (the reader matches the pod by its labels).

Nothing secret is read from or written to argv or the environment, and nothing secret is logged: the projected
token travels only in the request body, and the grant's workload (which carries the workload token) only to the
supervisor (:class:`~leoflow_agent.exchange.Grant` hides it from ``repr``).
"""

from __future__ import annotations

import enum
import json
import logging
import os
import random
import socket
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any

from leoflow_agent import outcome
from leoflow_agent.exchange import EXCHANGE_PATH, Grant, GrantError, decode_grant, request_body
from leoflow_agent.lease import EXIT_LEASE_EXPIRED

__all__ = [
    "BACKOFF_BASE_SECONDS",
    "BACKOFF_CAP_SECONDS",
    "ENV_CEILING",
    "ENV_TEST_FAULT",
    "POD_FAULT_POINTS",
    "ENV_EXCHANGE_URL",
    "ENV_MESSAGE_BUDGET",
    "ENV_TOKEN_FILE",
    "EXCHANGE_DEADLINE_MAX_SECONDS",
    "EXIT_CODES",
    "EXIT_CONFIG",
    "EXIT_LEASE_EXPIRED",
    "EXIT_OK",
    "EXIT_REFUSED",
    "EXIT_START_FAILED",
    "EXIT_UNREACHABLE",
    "EXCHANGE_SERVER_SLACK_SECONDS",
    "REQUEST_TIMEOUT_SECONDS",
    "RETRY_AFTER_CAP_SECONDS",
    "TERMINATION_MESSAGE_PATH",
    "ExchangeResult",
    "PodConfig",
    "PodConfigError",
    "Verdict",
    "agent_main",
    "backoff_delay",
    "classify_status",
    "config_from_env",
    "exchange_deadline_seconds",
    "exchange_with_retries",
    "main",
    "parse_retry_after",
    "run_pod",
]

log = logging.getLogger("leoflow.agent.pod")

ENV_EXCHANGE_URL = "LEOFLOW_EXCHANGE_URL"
"""Base URL of leoflow's plugin app as the pod reaches it (``…/leoflow``); the agent posts to ``<it>/v1/exchange``."""
ENV_TOKEN_FILE = "LEOFLOW_TOKEN_FILE"
"""Path of the projected ServiceAccount token (audience ``[leoflow] exchange_audience``)."""
ENV_MESSAGE_BUDGET = "LEOFLOW_TERMINATION_MESSAGE_BUDGET"
"""Bytes the outcome record may take in the termination message (the pod builder computes it from the pod's final
container count)."""
ENV_CEILING = "LEOFLOW_CREDENTIAL_CEILING_SECONDS"
"""``[leoflow] credential_ceiling_seconds``: the pod's ``activeDeadlineSeconds`` (0: none)."""
ENV_LEASE = "LEOFLOW_AGENT_LEASE_SECONDS"
"""``[leoflow] agent_lease_seconds``: the agent kills its task and exits when the Execution API gave no answer for
that long (:mod:`leoflow_agent.lease`; k8s review §14). Absent or 0: no lease."""
ENV_TEST_FAULT = "LEOFLOW_TEST_FAULT"
"""TEST ONLY: a fault point (``leoflow_agent.protocol.FAULT_POINTS`` but ``mid_task`` / ``hang_before_run``) at
which the agent SIGKILLs itself. The Kubernetes runtime sets it only when ``[leoflow] test_fault_injection`` chose a
point for the attempt; it never ships enabled."""
POD_FAULT_POINTS = frozenset({"before_run", "after_run", "after_record", "after_patch"})
"""The fault points a pod agent honours (the transport's; the others need the Lite zygote's marker files)."""
TERMINATION_MESSAGE_PATH = "/dev/termination-log"
"""The agent container's ``terminationMessagePath``, pinned by the pod builder."""

EXIT_OK = 0
"""The supervisor ran and returned (whatever the task's outcome: exit codes are never the outcome)."""
EXIT_START_FAILED = 1
"""Granted, but the workload could not be started, or the supervisor raised (``agent_start_failed`` record when
the supervisor never started)."""
EXIT_CONFIG = 2
"""The agent's environment is unusable (a missing or malformed variable, an unreadable token file), or a usage
error (``agent_start_failed`` record)."""
EXIT_REFUSED = 3
"""The exchange was refused (``exchange_refused`` record)."""
EXIT_UNREACHABLE = 4
"""The exchange gave no usable answer before the deadline (``exchange_unreachable`` record)."""
EXIT_CODES: Mapping[int, str] = {
    EXIT_OK: "the supervisor returned", EXIT_START_FAILED: "the workload could not be run",
    EXIT_CONFIG: "the agent's environment is unusable", EXIT_REFUSED: "the exchange was refused",
    EXIT_UNREACHABLE: "the exchange did not answer before the deadline",
    EXIT_LEASE_EXPIRED: "the Execution API did not answer for the agent's lease: its task was killed "
                        "(heartbeat_lost record)",
}
"""Every exit code of ``python -m leoflow_agent pod`` and what it means."""

BACKOFF_BASE_SECONDS = 0.5
"""The first retry's back-off before jitter, in seconds; doubled per further failure."""
BACKOFF_CAP_SECONDS = 30.0
"""The longest back-off before jitter, in seconds."""
RETRY_AFTER_CAP_SECONDS = 60.0
"""A ``Retry-After`` longer than this, in seconds, is read as this (a proxy's hour-long value never idles a pod)."""
REQUEST_TIMEOUT_SECONDS = 30.0
"""Connect/read/write timeout of one exchange request, in seconds (never past the deadline). Above the server's
worst case (two Kubernetes calls of ``[leoflow] exchange_timeout_seconds`` each, plus the ledger and the mint),
which the settings bound by :data:`EXCHANGE_SERVER_SLACK_SECONDS` under this, so the agent does not give up on
an answer the server is still making (k8s review §4)."""
EXCHANGE_SERVER_SLACK_SECONDS = 5.0
"""What the server's exchange may take besides its two Kubernetes calls (ledger read and write, plugins, the
mint, the network), in seconds: ``[leoflow] exchange_timeout_seconds`` may be at most
``(REQUEST_TIMEOUT_SECONDS - EXCHANGE_SERVER_SLACK_SECONDS) / 2``."""
EXCHANGE_DEADLINE_MAX_SECONDS = 600.0
"""The longest the agent keeps trying to exchange, in seconds: Airflow's default ``[scheduler]
task_queued_timeout``, past which the scheduler itself stops waiting for a queued task."""

_ERROR_ID_CHARS = frozenset("0123456789abcdef")


class PodConfigError(ValueError):
    """The agent's environment is unusable; the message names the variable (never a secret: none is read)."""


@dataclass(frozen=True)
class PodConfig:
    """What the agent reads from its environment (:func:`config_from_env`).

    :param exchange_url: base URL of leoflow's plugin app (``…/leoflow``, no trailing slash).
    :param token_file: path of the projected ServiceAccount token.
    :param message_budget: bytes the record may take in the termination message (>= 1).
    :param ceiling_seconds: the credential ceiling, in seconds (0: none).
    :param fault: TEST ONLY fault point (:data:`ENV_TEST_FAULT`) or None.
    :param lease_seconds: the agent's lease (:data:`ENV_LEASE`), seconds > 0, or None: no lease.
    """

    exchange_url: str
    token_file: str
    message_budget: int
    ceiling_seconds: int
    fault: str | None = None
    lease_seconds: float | None = None

    @property
    def exchange_endpoint(self) -> str:
        """``<exchange_url>/v1/exchange``."""
        return self.exchange_url + EXCHANGE_PATH


def config_from_env(environ: Mapping[str, str]) -> PodConfig:
    """Read :class:`PodConfig` from ``environ``.

    :raises PodConfigError: :data:`ENV_EXCHANGE_URL` missing or not an ``http(s)://`` URL, :data:`ENV_TOKEN_FILE`
        missing, :data:`ENV_MESSAGE_BUDGET` not an integer >= 1 (an absent one reads as
        ``outcome.TERMINATION_MESSAGE_BUDGET``), :data:`ENV_CEILING` not an integer >= 0 (absent: 0),
        :data:`ENV_LEASE` not a number >= 0 (absent or 0: no lease).
    """
    url = environ.get(ENV_EXCHANGE_URL, "").strip().rstrip("/")
    if not url.startswith(("http://", "https://")) or len(url) <= len("https://"):
        raise PodConfigError(f"{ENV_EXCHANGE_URL} must be the http(s) URL of leoflow's app (…/leoflow), "
                             f"got {url[:200]!r}")
    token_file = environ.get(ENV_TOKEN_FILE, "").strip()
    if not token_file:
        raise PodConfigError(f"{ENV_TOKEN_FILE} must name the projected ServiceAccount token file")

    def integer(name: str, default: int, least: int) -> int:
        text = environ.get(name, "").strip()
        if not text:
            return default
        try:
            value = int(text)
        except ValueError:
            raise PodConfigError(f"{name} must be an integer, got {text[:50]!r}") from None
        if value < least:
            raise PodConfigError(f"{name} must be at least {least}, got {value}")
        return value

    fault = environ.get(ENV_TEST_FAULT, "").strip() or None
    if fault is not None and fault not in POD_FAULT_POINTS:
        raise PodConfigError(f"{ENV_TEST_FAULT} must be one of {sorted(POD_FAULT_POINTS)}, got {fault[:50]!r}")
    lease_text = environ.get(ENV_LEASE, "").strip()
    try:
        lease = float(lease_text) if lease_text else 0.0
    except ValueError:
        raise PodConfigError(f"{ENV_LEASE} must be a number of seconds, got {lease_text[:50]!r}") from None
    if not 0 <= lease < float("inf"):
        raise PodConfigError(f"{ENV_LEASE} must be at least 0 (0: no lease), got {lease_text[:50]!r}")
    return PodConfig(exchange_url=url, token_file=token_file,
                     message_budget=integer(ENV_MESSAGE_BUDGET, outcome.TERMINATION_MESSAGE_BUDGET, 1),
                     ceiling_seconds=integer(ENV_CEILING, 0, 0), fault=fault, lease_seconds=lease or None)


def exchange_deadline_seconds(ceiling_seconds: int) -> float:
    """How long the agent keeps trying to exchange, in seconds, from its start: half the credential ceiling
    (the pod's ``activeDeadlineSeconds``, which also covered the image pull), so the pod records why it never
    started well before the kubelet kills it, and at most :data:`EXCHANGE_DEADLINE_MAX_SECONDS`; that maximum
    when there is no ceiling (``ceiling_seconds <= 0``)."""
    if ceiling_seconds <= 0:
        return EXCHANGE_DEADLINE_MAX_SECONDS
    return min(EXCHANGE_DEADLINE_MAX_SECONDS, ceiling_seconds / 2)


def backoff_delay(failures: int, *, retry_after: float | None = None,
                  rng: Callable[[], float] = random.random) -> float:
    """Seconds to wait after the ``failures``-th failed try in a row (>= 1): ``min(BACKOFF_CAP_SECONDS,
    BACKOFF_BASE_SECONDS * 2 ** (failures - 1))`` scaled by a jitter factor in [0.5, 1) (``rng()`` in [0, 1)), so
    pods that failed together do not retry together and never retry at once; at least ``retry_after`` (the
    server's ``Retry-After``, capped at :data:`RETRY_AFTER_CAP_SECONDS`) when given. The caller cuts it to the
    time left before the deadline."""
    exponent = min(max(failures, 1) - 1, 32)
    delay = min(BACKOFF_CAP_SECONDS, BACKOFF_BASE_SECONDS * 2 ** exponent) * (0.5 + rng() / 2)
    if retry_after is not None:
        delay = max(delay, min(max(retry_after, 0.0), RETRY_AFTER_CAP_SECONDS))
    return delay


def parse_retry_after(value: str | None, *, now: Callable[[], float] = time.time) -> float | None:
    """A ``Retry-After`` header as seconds from now: delta-seconds (``"5"``) or an HTTP-date; ``None`` when absent
    or unreadable. A date in the past reads as 0. ``now()``: the wall clock (seconds since the epoch)."""
    if value is None:
        return None
    text = value.strip()
    if text.isdigit():
        return float(int(text))
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None or when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - now())


class Verdict(enum.Enum):
    """What one exchange answer means to the agent."""

    GRANTED = "granted"
    RETRY = "retry"
    REFUSED = "refused"


def classify_status(status: int) -> Verdict:
    """200: granted. 429 and every 5xx (the exchange's own 503, or a proxy's 502/504 while the api-server
    restarts): try again. Anything else (403 above all; a 404 from a wrong ``exchange_url``): refused for good.
    A retry after a grant whose answer was lost (a timeout, a dropped connection: :func:`exchange_with_retries`
    tries again) is granted again by the server to the same pod (k8s review §4)."""
    if status == 200:
        return Verdict.GRANTED
    if status == 429 or 500 <= status <= 599:
        return Verdict.RETRY
    return Verdict.REFUSED


@dataclass(frozen=True)
class ExchangeResult:
    """The end of :func:`exchange_with_retries`: ``grant`` when granted, else ``reason`` (``exchange_refused``,
    ``exchange_unreachable`` or ``agent_start_failed``) and the ``exit_code`` that goes with it; ``tries``
    requests sent; ``detail`` a short text for the log (a status and the answer's ``error_id``, an error class;
    never a token)."""

    grant: Grant | Any | None
    reason: outcome.Reason | None
    exit_code: int
    tries: int
    detail: str


Answer = tuple[int, Mapping[str, str], bytes]
"""``(status, headers with lower-case names, body)`` of one exchange request."""
Post = Callable[[str, bytes, float], Answer]
"""``post(url, body, timeout_seconds) -> Answer``; raises ``OSError`` or ``httpx.TransportError`` (timeouts
included) when no answer came."""


def _read_token(path: str) -> str:
    """The projected token file's content, stripped. Raises ``OSError`` (an empty file is ``ENODATA``)."""
    with open(path, encoding="utf-8", errors="strict") as fh:
        token = fh.read().strip()
    if not token:
        raise OSError(61, "empty token file", path)
    return token


def _error_id(body: bytes) -> str:
    """The ``error_id`` of a refusal's body when it is one (32 lower-case hex digits), else ``"-"``."""
    try:
        value = json.loads(body).get("error_id")
    except (ValueError, AttributeError, UnicodeDecodeError):
        return "-"
    if isinstance(value, str) and len(value) <= 64 and set(value) <= _ERROR_ID_CHARS:
        return value
    return "-"


def _transient_errors() -> tuple[type[BaseException], ...]:
    """What a :data:`Post` raises when no answer came: ``OSError``, and ``httpx.TransportError`` (its timeouts
    included) when httpx is importable."""
    try:
        import httpx
    except ImportError:  # pragma: no cover - httpx is a dependency of the agent
        return (OSError,)
    return (OSError, httpx.TransportError)


def exchange_with_retries(
    config: PodConfig,
    *,
    post: Post,
    read_token: Callable[[str], str] = _read_token,
    monotonic: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    rng: Callable[[], float] = random.random,
    started: float | None = None,
    url: str | None = None,
    decode: Callable[[bytes], Any] = decode_grant,
) -> ExchangeResult:
    """Exchange the pod's token until granted, refused, or the deadline (:func:`exchange_deadline_seconds` of
    ``config.ceiling_seconds``, counted from ``started``, a ``monotonic()`` time, default now).

    ``url`` (default ``config.exchange_endpoint``) and ``decode`` (default :func:`decode_grant`; raises
    :class:`GrantError` for a body it refuses) let a warm pod's registration (``leoflow_agent.warmpod``,
    ``POST …/v1/warm/register``, the same request body) reuse this retry schedule; ``ExchangeResult.grant``
    then holds what ``decode`` returned.

    Each try re-reads the token file (``read_token``; an unreadable or empty file ends it at once:
    ``agent_start_failed``, :data:`EXIT_CONFIG`) and sends one request, its timeout at most
    :data:`REQUEST_TIMEOUT_SECONDS` and never past the deadline. A failed try (:func:`classify_status` RETRY, or
    ``post`` raised a transient error) waits :func:`backoff_delay` (``Retry-After`` honoured), cut to the time
    left; once none is left it ends ``exchange_unreachable`` (:data:`EXIT_UNREACHABLE`). A refusal ends it
    ``exchange_refused`` (:data:`EXIT_REFUSED`); a 200 whose body is no grant ``agent_start_failed``
    (:data:`EXIT_START_FAILED`). Never raises for an answer or a transport error; logs each failed try (status,
    ``error_id``, error class) and never the token or the workload.
    """
    transient = _transient_errors()
    start = monotonic() if started is None else started
    deadline = start + exchange_deadline_seconds(config.ceiling_seconds)
    url = config.exchange_endpoint if url is None else url
    failures = tries = 0
    while True:
        try:
            token = read_token(config.token_file)
        except (OSError, ValueError) as exc:
            what = getattr(exc, "strerror", None) or type(exc).__name__
            return ExchangeResult(None, outcome.Reason.AGENT_START_FAILED, EXIT_CONFIG, tries,
                                  f"the token file {config.token_file} cannot be read: {what}")
        retry_after: float | None = None
        timeout = max(0.1, min(REQUEST_TIMEOUT_SECONDS, deadline - monotonic()))
        tries += 1
        try:
            status, headers, body = post(url, request_body(token), timeout)
        except transient as exc:
            what = f"no answer ({type(exc).__name__})"
        else:
            verdict = classify_status(status)
            if verdict is Verdict.GRANTED:
                try:
                    return ExchangeResult(decode(body), None, EXIT_OK, tries, "granted")
                except GrantError as exc:
                    return ExchangeResult(None, outcome.Reason.AGENT_START_FAILED, EXIT_START_FAILED, tries,
                                          f"the exchange's 200 answer is no grant: {exc}")
            if verdict is Verdict.REFUSED:
                return ExchangeResult(None, outcome.Reason.EXCHANGE_REFUSED, EXIT_REFUSED, tries,
                                      f"HTTP {status} error_id={_error_id(body)}")
            retry_after = parse_retry_after(headers.get("retry-after"))
            what = f"HTTP {status} error_id={_error_id(body)}"
        failures += 1
        left = deadline - monotonic()
        if left <= 0:
            return ExchangeResult(None, outcome.Reason.EXCHANGE_UNREACHABLE, EXIT_UNREACHABLE, tries,
                                  f"{what} after {tries} tries; the exchange deadline passed")
        delay = min(left, backoff_delay(failures, retry_after=retry_after, rng=rng))
        log.warning("token exchange at %s: %s; trying again in %.1f s (%d failed, giving up in %.0f s)",
                    url, what, delay, failures, left)
        sleep(delay)


def _httpx_post(config: PodConfig) -> tuple[Post, Callable[[], None]]:
    """A :data:`Post` over one ``httpx.Client`` (no redirects; the environment's proxy settings honoured as the
    Task SDK's client honours them; TLS verified with the Task SDK's own SSL context for an ``https`` URL), and
    its closer."""
    import httpx

    verify: Any = True
    if config.exchange_url.startswith("https://"):
        from leoflow_agent.runner import sdk_ssl_context

        verify = sdk_ssl_context()
    client = httpx.Client(verify=verify, follow_redirects=False)

    def post(url: str, body: bytes, timeout: float) -> Answer:
        response = client.post(url, content=body, timeout=timeout,
                               headers={"content-type": "application/json", "accept": "application/json"})
        return response.status_code, response.headers, response.content

    return post, client.close


_REFUSAL_RECORDS: Mapping[outcome.Reason, Callable[[outcome.AttemptIdentity | None], outcome.OutcomeRecord]] = {
    outcome.Reason.EXCHANGE_REFUSED: outcome.exchange_refused,
    outcome.Reason.EXCHANGE_UNREACHABLE: outcome.exchange_unreachable,
    outcome.Reason.AGENT_START_FAILED: outcome.agent_start_failed,
}
"""The record of each way :func:`exchange_with_retries` can end without a grant."""


def _write_record(path: str, record: outcome.OutcomeRecord, budget: int) -> bool:
    """Write ``record`` as the whole termination message; True when written (a failure is logged)."""
    try:
        outcome.write_termination_message(path, record, budget=budget)
    except (OSError, ValueError) as exc:
        log.error("could not write the outcome record (%s) to %s: %s", record.reason, path,
                  getattr(exc, "strerror", None) or exc)
        return False
    return True


def run_pod(config: PodConfig, *, termination_path: str = TERMINATION_MESSAGE_PATH,
            post: Post | None = None) -> int:
    """Exchange, then run the granted workload (module docstring); returns the exit code (:data:`EXIT_CODES`).

    :param config: from :func:`config_from_env`.
    :param termination_path: the termination-message file (the container's ``terminationMessagePath``).
    :param post: the exchange request (default: httpx, :func:`_httpx_post`).
    Never raises: an error after the grant is logged and ends the agent with :data:`EXIT_START_FAILED`.
    """
    started = time.monotonic()
    close: Callable[[], None] = lambda: None  # noqa: E731
    if post is None:
        post, close = _httpx_post(config)
    try:
        result = exchange_with_retries(config, post=post, started=started)
    finally:
        close()
    if result.grant is None:
        assert result.reason is not None
        log.error("token exchange: %s (%s); the attempt did not start, leoflow re-dispatches it", result.detail,
                  result.reason)
        _write_record(termination_path, _REFUSAL_RECORDS[result.reason](None), config.message_budget)
        return result.exit_code
    grant = result.grant
    attempt = outcome.AttemptIdentity(grant.ti_id, grant.try_number, grant.attempt_epoch)
    log.info("token exchange: granted %r after %d tries", grant, result.tries)
    try:
        workload, server = _start(grant)
    except Exception as exc:  # noqa: BLE001 - the workload carries a token: name the error class only
        log.error("attempt %s: its workload cannot be run: %s", attempt, type(exc).__name__)
        _write_record(termination_path, outcome.agent_start_failed(attempt), config.message_budget)
        return EXIT_START_FAILED

    from leoflow_agent.runner import supervise_attempt
    from leoflow_agent.transport import termination_sink

    def reported(state: str, recorded: bool) -> None:
        log.info("attempt %s: reported %s (outcome record %s)", attempt, state,
                 "written" if recorded else "NOT written")

    try:
        from airflow.sdk.log import configure_logging

        # as Airflow's execute_workload does in a KubernetesExecutor pod: the task's log lines also go to stdout,
        # so `kubectl logs` shows them
        configure_logging(output=sys.stdout.buffer, json_output=True)
        return supervise_attempt(workload, server=server, attempt=attempt,
                                 sinks=[termination_sink(termination_path, config.message_budget)],
                                 on_reported=reported, title="leoflow-agent pod", subprocess_logs_to_stdout=True,
                                 fault=config.fault, hostname=socket.gethostname(), watch_sigterm=True,
                                 lease_seconds=config.lease_seconds)
    except BaseException:  # noqa: BLE001 - an agent must always exit with a code
        log.exception("attempt %s: the supervisor failed", attempt)
        return EXIT_START_FAILED


def _start(grant: Grant) -> tuple[Any, str]:
    """The granted ``ExecuteTask`` and the Execution API URL it reports to (Airflow's own resolution,
    ``[core] execution_api_server_url`` else ``[api] base_url`` + ``/execution/``, from the pod's Airflow
    config). Raises when the workload is not an ``ExecuteTask`` of the granted ``ti_id``."""
    from airflow.executors.base_executor import get_execution_api_server_url
    from airflow.executors.workloads import ExecuteTask

    from leoflow_agent.runner import workload_decoder

    workload = workload_decoder()(grant.workload)
    if not isinstance(workload, ExecuteTask) or str(workload.ti.id) != grant.ti_id:
        raise TypeError("the granted workload is not an ExecuteTask of the granted ti_id")
    return workload, get_execution_api_server_url()


def main(environ: Mapping[str, str] | None = None, *, termination_path: str = TERMINATION_MESSAGE_PATH) -> int:
    """Entry point of ``python -m leoflow_agent pod``: log to stderr, read the environment, :func:`run_pod`.
    An unusable environment writes an ``agent_start_failed`` record (no identity) and returns :data:`EXIT_CONFIG`."""
    return agent_main(config_from_env, run_pod, environ, termination_path=termination_path)


def agent_main(read_config: Callable[[Mapping[str, str]], Any], run: Callable[..., int],
               environ: Mapping[str, str] | None, *, termination_path: str) -> int:
    """What every pod agent's entry point does (this module's :func:`main`, ``leoflow_agent.warmpod.main``): log
    to stderr, ``config = read_config(environ or os.environ)``, return ``run(config,
    termination_path=termination_path)``. A :class:`PodConfigError` from ``read_config`` is logged, leaves an
    ``agent_start_failed`` record (no identity) as the termination message and returns :data:`EXIT_CONFIG`."""
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    env = os.environ if environ is None else environ
    try:
        config = read_config(env)
    except PodConfigError as exc:
        log.error("leoflow agent: %s", exc)
        _write_record(termination_path, outcome.agent_start_failed(None), outcome.TERMINATION_MESSAGE_BUDGET)
        return EXIT_CONFIG
    return run(config, termination_path=termination_path)
