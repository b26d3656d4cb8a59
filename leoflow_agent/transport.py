"""The agent's wrapper around the Task SDK client's HTTP transport (DESIGN §3 "Run").

Keying off the requests the supervisor actually sends covers every sink without enumerating call sites:

* immediately before a terminal ``PATCH /task-instances/{id}/state`` leaves, the outcome record of that exact
  body is written to every configured sink (Lite: the attempt's record file). A record that cannot be written
  never holds the PATCH back (the record only spares re-runs, DESIGN §2 Invariant 3): the TI's log says so and
  the attempt is reported unrecorded;
* when that PATCH returns 2xx the agent tells its zygote (``reported``, with ``recorded``), which frees the
  attempt's slot;
* once a terminal record is written it is never replaced: heartbeat loss after it refuses later reports but
  keeps the record, so the reconciler replays it (issue 8 hole 5);
* after leoflow killed the attempt gracefully (its kill marker exists) a ``failed`` or ``up_for_retry`` report is
  refused locally and a ``killed`` record written instead: the kill caused it, and the reconciler re-drives the
  attempt as an infra loss rather than spend a user retry (issue 8 hole 16);
* when a call the task needed went unanswered (:meth:`RecordingTransport.call_failed`: a transport error or a
  5xx after the Task SDK client's retries, which the SDK hands the task as ``API_SERVER_ERROR``), a later
  ``failed`` or ``up_for_retry`` report is refused locally and an ``api_unreachable`` record written instead:
  the api-server outage failed the task, and the reconciler re-drives the attempt as an infra loss (issue 10);
* every request carries the ``Leoflow-Attempt`` header naming this attempt (:mod:`leoflow_agent.fencing`), so
  the api-server's fence refuses it with 409 once leoflow has moved the ``ti_id`` to a newer epoch (DESIGN §2
  Invariant 1). The supervisor stops on that 409 as on Airflow's own (a heartbeat's kills the task, a terminal
  report's is never retried into success); the transport says so in the agent's log;
* the named fault-injection points SIGKILL the agent, only when the launch message asked for one (test mode).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import re
import signal
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import httpx

from leoflow_agent import fencing, outcome

log = logging.getLogger(__name__)

_STATE_PATH = re.compile(r"(?:^|/)task-instances/(?P<ti_id>[0-9a-fA-F-]{36})/state$")
_RUN_PATH = re.compile(r"(?:^|/)task-instances/(?P<ti_id>[0-9a-fA-F-]{36})/run$")
_HEARTBEAT_CALL = re.compile(r"(?:^|/)task-instances/(?P<ti_id>[0-9a-fA-F-]{36})/heartbeat$")
_TERMINATED_STATUSES = frozenset({404, 409, 410})  # the supervisor's "stop, the server says so" answers
REFUSED_AFTER_API_LOSS = frozenset({"failed", "up_for_retry"})
"""Terminal states an unanswered Execution API call causes (the Task SDK fails the task): refused once a call of
the attempt went unanswered. Success, skips and hand-offs still land."""

REFUSED_AFTER_KILL = frozenset({"failed", "up_for_retry", "success"})
"""Terminal states refused once the attempt was signalled to stop (leoflow's graceful kill, or on Kubernetes any
SIGTERM: a pod delete, an eviction, a node drain). A failure is what the kill caused (the operator's ``on_kill``
stopped the work). A success whose report leaves after the signal is a body that returned after it, which
apache/airflow#73006 shows can be false: an ``on_kill`` that cancels the work can let ``execute()`` return
normally. It is held as ``killed`` and re-run on the infra budget (DESIGN §2 "A success after SIGTERM"). A body
that returned before the signal has reported already: its success is never refused. Skips and hand-offs
(deferral, reschedule) still land."""
REFUSED_AFTER_OOM = frozenset({"failed", "up_for_retry"})
"""Terminal states refused once the OOM killer ended a process of the attempt (``leoflow_agent.oom``): the
memory limit, not the task's code, failed it."""

RecordSink = Callable[[outcome.OutcomeRecord], "outcome.WrittenRecord | None"]
"""Writes one outcome record durably and returns what it wrote (``None``: nothing to say); raises
:class:`OSError` when it cannot, ``ValueError`` (:class:`~leoflow_agent.outcome.RecordTooLarge`) for a record
it refuses."""

TaskLog = Callable[[str, str], None]
"""Writes one line into the task instance's own log, the one the operator reads: ``(level, message)`` with
``level`` a structlog method name (``"warning"``, ``"error"``). Must not raise."""


def file_sink(path: str) -> RecordSink:
    """Return a sink that writes the whole record body atomically to ``path`` (the Lite record file)."""

    def write(record: outcome.OutcomeRecord) -> outcome.WrittenRecord:
        return outcome.write_record_file(path, record)

    return write


def termination_sink(path: str, budget: int) -> RecordSink:
    """Return a sink that makes the file at ``path`` (a task pod's termination message) hold exactly the record,
    encoded within ``budget`` bytes (:func:`~leoflow_agent.outcome.write_termination_message`: truncate, write,
    fsync; never append)."""

    def write(record: outcome.OutcomeRecord) -> outcome.WrittenRecord:
        return outcome.write_termination_message(path, record, budget=budget)

    return write


def _no_task_log(level: str, message: str) -> None:
    """The default :data:`TaskLog`: the agent's own log only."""


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
    :param sinks: where outcome records go, each written before the PATCH leaves. A sink that fails does not
        stop the PATCH (issue 8 hole 12): the failure goes to ``task_log`` and the attempt is reported with
        ``recorded=False``; if that report is lost too, the attempt is an infra loss (DESIGN §2, no record).
    :param on_reported: ``on_reported(state, recorded)`` once a terminal PATCH returned 2xx: the Airflow state
        sent, and whether every sink holds its record.
    :param task_log: writes a line into the TI's log (:data:`TaskLog`): a record not written, a record that
        dropped asset events, heartbeat loss.
    :param fault: one of :data:`leoflow_agent.protocol.FAULT_POINTS` or ``None``.
    :param killed: ``killed() -> bool``: True once the attempt was signalled to stop (leoflow's kill marker
        exists, or the agent got SIGTERM: :class:`SigtermWatch`). A terminal report of a state in
        :data:`REFUSED_AFTER_KILL` is then refused locally and a
        ``killed`` record written (unless a terminal record is kept), so the reconciler re-drives the attempt
        as an infra loss. Read only when a terminal report leaves.
    :param max_failed_heartbeats: ``[workers] max_failed_heartbeats``: after this many consecutive failed
        heartbeats the supervisor kills the task; the wrapper then writes a ``heartbeat_lost`` record and
        refuses every later terminal PATCH of the attempt locally (DESIGN §2 "Heartbeat loss"), so the
        reconciler, not a late report, decides. A terminal record already written is kept, never replaced
        by ``heartbeat_lost`` (the supervisor heartbeats on while its success PATCH fails; the reconciler then
        replays that success). A heartbeat counts as the supervisor counts it: one SDK call, after the SDK
        client's own retries (:meth:`heartbeat_result`), never one HTTP request.
    :param oom_killed: ``oom_killed() -> bool``: True once the kernel's OOM killer ended a process of the
        attempt's memory cgroup (:class:`leoflow_agent.oom.OomWatch`). A terminal report of a state in
        :data:`REFUSED_AFTER_OOM` is then refused locally and an ``oom_killed`` record written (unless a terminal
        record is kept). Read only when a terminal report leaves.
    :param on_answer: ``on_answer(status_code)`` for every response the server sent (not for transport errors,
        nor for the refusals this wrapper answers locally): the agent's lease (``leoflow_agent.lease``) renews
        on it. ``None``: nobody listens (Lite).
    """

    def __init__(
        self,
        inner: httpx.BaseTransport,
        *,
        attempt: outcome.AttemptIdentity,
        sinks: Sequence[RecordSink],
        on_reported: Callable[[str, bool], None],
        fault: str | None = None,
        max_failed_heartbeats: int = 3,
        task_log: TaskLog = _no_task_log,
        killed: Callable[[], bool] = lambda: False,
        on_answer: Callable[[int], None] | None = None,
        oom_killed: Callable[[], bool] = lambda: False,
    ) -> None:
        self._inner = inner
        self._oom_killed = oom_killed
        self._on_answer = on_answer
        self._killed = killed
        self._max_failed_heartbeats = max(1, int(max_failed_heartbeats))
        self._failed_heartbeats = 0
        self.heartbeat_lost = False
        self._attempt = attempt
        self._sinks = list(sinks)
        self._terminal_lock = threading.RLock()  # a terminal report and a lease expiry: one after the other
        self._on_reported = on_reported
        self._fault = fault
        self._task_log = task_log
        try:
            self._attempt_header: str | None = fencing.format_attempt(attempt)
        except ValueError:  # not a UUID ti_id: no ledger row can name it, so no fence can judge it either
            log.warning("attempt %s cannot be named in the %s header; requests go without it", attempt,
                        fencing.ATTEMPT_HEADER)
            self._attempt_header = None
        self.fenced: str | None = None
        """The fence's reason once the api-server refused a request of this attempt as not current (then this
        execution is stale: a newer epoch of its ``ti_id`` runs), else ``None``."""
        self.unanswered: str | None = None
        """``"<METHOD> <path> (<error>)"`` of the first call of this attempt that went unanswered for good
        (:meth:`call_failed`), else ``None``."""
        self.terminal_recorded: str | None = None
        """The state of the last terminal record written to at least one sink. Once set, heartbeat loss writes
        no ``heartbeat_lost`` to any sink: a record that contradicts a kept terminal one would be re-driven."""
        self._refusal_written: str | None = None  # the reason of the refusal record written last (written once)

    @property
    def attempt_ti_id(self) -> str:
        """The ``ti_id`` of the attempt this transport serves."""
        return self._attempt.ti_id

    def _record(self, request: httpx.Request) -> tuple[str, bool] | None:
        """Write the record of a terminal ``PATCH …/state`` to every sink; ``(state, recorded)``, or ``None``
        when the body is not a terminal or handing-off state (nothing to record). Never raises."""
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
        failures = []
        dropped = False
        for sink in self._sinks:
            try:
                written = sink(record)
            except (OSError, ValueError) as exc:  # ValueError: RecordTooLarge, a record the reader would refuse
                failures.append(exc)
                continue
            self.terminal_recorded = state
            dropped = dropped or bool(written is not None and written.assets_dropped)
        if failures:
            self._tell(
                "error",
                f"leoflow could not write the outcome record of this attempt ({_reasons(failures)}); the "
                f"{state} report is sent anyway. If that report is lost too, leoflow cannot replay it and runs "
                "the task again as an infra loss.",
            )
        if dropped:
            events, outlets = (len(body.get(key) or ()) for key in ("outlet_events", "task_outlets"))
            self._tell(
                "warning",
                f"leoflow's outcome record of this attempt left out its {events} asset events and {outlets} task "
                f"outlets to fit its size limit. The {state} report sent now carries them all; "
                "only if that report is lost does leoflow replay the record, and then no asset event is registered.",
            )
        return state, not failures

    def _write_refusal(self, record: outcome.OutcomeRecord) -> None:
        """Write a refusal ``record`` (``heartbeat_lost``, ``killed``, ``oom_killed``, ``api_unreachable``: no
        state) to every sink, telling the TI's log about a sink that fails. Callers write one only before any
        terminal record. The same refusal is written once: the supervisor re-sends a refused report at its exit,
        which changes nothing (a warm pod would POST the record again). Never raises."""
        if self._refusal_written == record.reason:
            return
        self._refusal_written = record.reason
        for sink in self._sinks:
            try:
                sink(record)
            except (OSError, ValueError) as exc:
                self._tell("error", f"leoflow could not write the {record.reason} record ({_reasons([exc])}).")

    def call_failed(self, method: str, path: str, error: BaseException) -> None:
        """Note that a call of this attempt other than a heartbeat or a terminal report went unanswered for
        good: ``error`` (an ``httpx.RequestError``, or an ``httpx.HTTPStatusError`` of a 5xx) came out of the
        Task SDK client after its retries, so the supervisor hands the task ``API_SERVER_ERROR``. Only the first
        is kept (:attr:`unanswered`); a later ``failed``/``up_for_retry`` report is then refused
        (:meth:`_refused_after_api_loss`). Never raises."""
        if self.unanswered is not None:
            return
        status = getattr(getattr(error, "response", None), "status_code", None)
        self.unanswered = f"{method.upper()} {path} ({type(error).__name__}{f' {status}' if status else ''})"
        log.warning("attempt %s: the Execution API did not answer %s after the client's retries", self._attempt,
                    self.unanswered)

    def _refused_after_api_loss(self, request: httpx.Request) -> bool:
        """True (``api_unreachable`` record written unless a terminal one is kept, the TI's log told) when a call
        of this attempt went unanswered (:attr:`unanswered`) and ``request`` reports a state of
        :data:`REFUSED_AFTER_API_LOSS`. Never raises."""
        if self.unanswered is None:
            return False
        state = _reported_state(request)
        if state not in REFUSED_AFTER_API_LOSS:
            return False
        if self.terminal_recorded is None:
            self._write_refusal(outcome.api_unreachable(self._attempt))
        self._tell("warning", f"the Execution API did not answer {self.unanswered}, and the task then ended "
                              f"{state}; that report is refused here, so the scheduler runs the task again as an "
                              "infra loss, without spending a retry.")
        return True

    def _refused_after_kill(self, request: httpx.Request) -> bool:
        """True (``killed`` record written, the TI's log told) when leoflow killed this attempt and ``request``
        reports a state of :data:`REFUSED_AFTER_KILL`. Never raises."""
        try:
            if not self._killed():
                return False
        except OSError:
            return False
        state = _reported_state(request)
        if state not in REFUSED_AFTER_KILL:
            return False
        if self.terminal_recorded is None:
            self._write_refusal(outcome.killed(self._attempt))
        self._tell("warning", f"leoflow killed this attempt, or its pod was deleted or evicted (SIGTERM, so on_kill "
                              f"ran), before its {state} report left; the report is refused here, so the scheduler "
                              "runs the task again as an infra loss, without spending a retry.")
        return True

    def _refused_after_oom(self, request: httpx.Request) -> bool:
        """True (``oom_killed`` record written unless a terminal one is kept, the TI's log told) when the OOM
        killer ended a process of this attempt and ``request`` reports a state of :data:`REFUSED_AFTER_OOM`.
        Never raises."""
        state = _reported_state(request)
        if state not in REFUSED_AFTER_OOM:
            return False
        try:
            if not self._oom_killed():
                return False
        except OSError:
            return False
        if self.terminal_recorded is None:
            self._write_refusal(outcome.oom_killed(self._attempt))
        self._tell("warning", f"the kernel's OOM killer ended a process of this attempt (its container's memory "
                              f"limit), and the task then ended {state}; that report is refused here, so the "
                              "scheduler settles it as an OOM kill: run again once without spending a retry, "
                              "failed if that try is OOM-killed too.")
        return True

    def _tell(self, level: str, message: str) -> None:
        """Log ``message`` in the agent's log and in the TI's log (which the operator reads)."""
        getattr(log, level)("%s", message)
        try:
            self._task_log(level, message)
        except Exception:  # noqa: BLE001 - the TI's log is help for the operator, never a reason to stop
            log.exception("could not write to the task instance's log")

    def heartbeat_started(self) -> None:
        """Note that the supervisor starts a heartbeat call. After a failed one it says so in the agent's log
        (``heartbeat of <ti_id>: trying again after N failed in a row (gives up at M)``): during an outage
        that line shows how close the attempt is to heartbeat loss."""
        if self._failed_heartbeats and not self.heartbeat_lost:
            log.warning("heartbeat of %s: trying again after %d failed in a row (gives up at %d)",
                        self._attempt.ti_id, self._failed_heartbeats, self._max_failed_heartbeats)

    def heartbeat_result(self, ok: bool) -> None:
        """Count one heartbeat call of the supervisor as it does: ``ok`` resets the streak; a failure (any
        error but 404/409/410, after the SDK client's retries) adds one, and at ``max_failed_heartbeats`` in a
        row (when the supervisor kills the task) the attempt is marked ``heartbeat_lost`` for good."""
        if ok:
            self._failed_heartbeats = 0
            return
        self._failed_heartbeats += 1
        if self._failed_heartbeats < self._max_failed_heartbeats or self.heartbeat_lost:
            return
        self._mark_heartbeat_lost(
            kept=f"leoflow: {self._failed_heartbeats} heartbeats in a row failed after this attempt recorded "
                 f"{self.terminal_recorded}; that record is kept and later reports are refused here, so the "
                 "scheduler replays it once the API server answers.",
            lost=f"leoflow: {self._failed_heartbeats} heartbeats in a row failed; this attempt is recorded as "
                 "heartbeat_lost and later reports are refused here, so the scheduler runs it again as an infra "
                 "loss, without spending a retry.")

    def lease_lost(self, why: str) -> None:
        """Mark the attempt ``heartbeat_lost`` because its lease expired (``leoflow_agent.lease``: the Execution
        API gave no answer for ``[leoflow] agent_lease_seconds``, and the agent now kills its task): the
        ``heartbeat_lost`` record is written unless a terminal record is kept, every later terminal report is
        refused here, and the TI's log says why (k8s review §14). Idempotent; never raises."""
        if self.heartbeat_lost:
            return
        self._mark_heartbeat_lost(
            kept=f"leoflow: {why} after this attempt recorded {self.terminal_recorded}; the agent kills the task, "
                 "keeps that record and refuses later reports, so the scheduler replays it once the API server "
                 "answers.",
            lost=f"leoflow: {why}; the agent kills the task and records heartbeat_lost, so the scheduler runs it "
                 "again as an infra loss, without spending a retry, and never beside this one.")

    def _mark_heartbeat_lost(self, *, kept: str, lost: str) -> None:
        """Set :attr:`heartbeat_lost`; tell the TI's log ``kept`` when a terminal record is kept (it stays), else
        ``lost`` and write the ``heartbeat_lost`` record. Under the terminal lock: a terminal report being recorded
        on another thread is either recorded first (and kept) or refused after this."""
        with self._terminal_lock:
            self.heartbeat_lost = True
            if self.terminal_recorded is not None:
                self._tell("error", kept)
                return
            self._tell("error", lost)
            self._write_refusal(outcome.heartbeat_lost(self._attempt))

    def _refusal(self, request: httpx.Request) -> httpx.Response | None:
        """The local 409 that refuses terminal report ``request`` (after heartbeat loss, after a kill, after an OOM
        kill, after an unanswered call: records written as each rule says), or None to let it go. Its body has
        Airflow's ``{"detail": {"reason", "message"}}`` shape, reason ``leoflow_<why>``."""
        if self.heartbeat_lost:
            log.warning("refusing a terminal report after heartbeat loss; the reconciler decides")
            why, message = "heartbeat_lost", " after heartbeat loss"
        elif self._refused_after_kill(request):
            why, message = "killed", ": leoflow killed this attempt"
        elif self._refused_after_oom(request):
            why, message = "oom_killed", ": the OOM killer ended a process of this attempt before the task failed"
        elif self._refused_after_api_loss(request):
            why, message = "api_unreachable", (": an Execution API call of this attempt went unanswered before the "
                                               "task failed")
        else:
            return None
        return httpx.Response(409, json={"detail": {"reason": f"leoflow_{why}",
                                                    "message": f"refused locally by the leoflow agent{message}"}},
                              request=request)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        """Send ``request`` with the attempt header, recording/reporting terminal states and honouring the fault
        point."""
        if self._attempt_header is not None:
            request.headers[fencing.ATTEMPT_HEADER] = self._attempt_header
        path = request.url.path
        is_state = request.method == "PATCH" and (m := _STATE_PATH.search(path)) and m["ti_id"] == self._attempt.ti_id
        is_run = request.method == "PATCH" and (m := _RUN_PATH.search(path)) and m["ti_id"] == self._attempt.ti_id
        recorded: tuple[str, bool] | None = None
        if is_run and self._fault == "before_run":
            _suicide("before_run")
        if is_run and self._fault == "hang_before_run":
            _hang("hang_before_run")
        if is_state:
            with self._terminal_lock:  # a lease expiring on its own thread waits for this report, or refuses it
                refusal = self._refusal(request)
                if refusal is not None:
                    return refusal
                request.read()
                recorded = self._record(request)
            if recorded is not None and self._fault == "after_record":
                _suicide("after_record")
        response = self._inner.handle_request(request)
        if self._on_answer is not None:
            try:
                self._on_answer(response.status_code)
            except Exception:  # noqa: BLE001 - a listener never fails the request
                log.exception("the answer listener failed")
        if response.status_code == 409:
            self._note_fenced(request, response)
        if is_run and self._fault == "after_run" and response.status_code < 300:
            response.read()
            _suicide("after_run")
        if recorded is not None and 200 <= response.status_code < 300:
            try:
                self._on_reported(*recorded)
            except OSError:
                log.warning("could not tell the zygote about the report; the reconciler will see it")
            if self._fault == "after_patch":
                response.read()
                _suicide("after_patch")
        return response

    def _note_fenced(self, request: httpx.Request, response: httpx.Response) -> None:
        """When a 409 is the api-server fence's refusal (:func:`leoflow_agent.fencing.fence_reason`), remember
        it in :attr:`fenced` and say once in the agent's log that this execution is stale. The response is read
        (a 409 body is small); a body that is not JSON is Airflow's own 409, left alone. Never raises."""
        try:
            response.read()
            body = json.loads(response.content or b"{}")
        except (httpx.HTTPError, ValueError, UnicodeDecodeError):
            return
        reason = fencing.fence_reason(body)
        if reason is None or self.fenced is not None:
            return
        self.fenced = reason
        log.warning("leoflow's fence refused %s %s of attempt %s: %s", request.method, request.url.path,
                    self._attempt, (body.get("detail") or {}).get("message"))

    def close(self) -> None:
        """Close the wrapped transport."""
        self._inner.close()


class SigtermWatch:
    """Whether this process has received SIGTERM since :meth:`install`, seen through the signal wakeup fd
    (``signal.set_wakeup_fd``), so it works under whatever Python handler is installed at the time: the Task SDK
    supervisor installs its own while it waits (``WatchedSubprocess.wait`` forwards SIGTERM to the task and calls
    no earlier handler), and a kubelet's SIGTERM (pod delete, eviction, node drain) reaches the agent through
    dumb-init. Call it as ``watch() -> bool`` (the transport's ``killed``). Main thread only. Never raises
    once installed."""

    def __init__(self, read_fd: int, write_fd: int, previous_fd: int) -> None:
        self._read_fd, self._write_fd, self._previous_fd = read_fd, write_fd, previous_fd
        self._seen = False

    @classmethod
    def install(cls) -> SigtermWatch:
        """Start watching (a non-blocking pipe becomes the wakeup fd; the previous one is kept for
        :meth:`uninstall`). Raises ``ValueError`` off the main thread, ``OSError`` when no pipe can be made."""
        read_fd, write_fd = os.pipe()
        os.set_blocking(read_fd, False)
        os.set_blocking(write_fd, False)
        try:
            previous = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        except ValueError:
            os.close(read_fd)
            os.close(write_fd)
            raise
        return cls(read_fd, write_fd, previous)

    def __call__(self) -> bool:
        """True once a SIGTERM arrived (the answer never goes back to False)."""
        while not self._seen:
            try:
                data = os.read(self._read_fd, 512)
            except (BlockingIOError, OSError):
                break
            if not data:
                break
            self._seen = signal.SIGTERM.value in data
        return self._seen

    def uninstall(self) -> None:
        """Put the previous wakeup fd back and close the pipe (what :meth:`__call__` saw is kept)."""
        self()
        try:
            signal.set_wakeup_fd(self._previous_fd)
        except ValueError:
            pass
        for fd in (self._read_fd, self._write_fd):
            try:
                os.close(fd)
            except OSError:
                pass


def _reported_state(request: httpx.Request) -> str | None:
    """The ``state`` a ``PATCH …/state`` request's JSON body reports, or ``None`` (no JSON object, no string
    ``state``). Reads the request body. Never raises."""
    try:
        request.read()
        body = json.loads(request.content or b"{}")
    except (httpx.HTTPError, ValueError, UnicodeDecodeError):
        return None
    state = body.get("state") if isinstance(body, dict) else None
    return state if isinstance(state, str) else None


def _reasons(errors: Sequence[BaseException]) -> str:
    """One short text for the sink errors: ``strerror`` and the file for an ``OSError``, else the message."""
    texts = []
    for exc in errors:
        if isinstance(exc, OSError) and exc.strerror:
            texts.append(f"{exc.strerror}: {exc.filename}" if exc.filename else exc.strerror)
        else:
            texts.append(str(exc) or type(exc).__name__)
    return "; ".join(texts)


@functools.cache
def heartbeat_counting_client(base: type) -> type:
    """Return (one per ``base``, cached) a subclass of the SDK ``Client`` class ``base`` that reports every
    heartbeat call of the attempt to its ``leoflow_transport.heartbeat_result`` once the call's outcome is
    final (after the client's own retries), and every other call that went unanswered for good (a transport
    error or a 5xx after those retries; terminal reports excepted) to ``leoflow_transport.call_failed``. Set
    ``client.leoflow_transport`` right after constructing it.

    The supervisor counts a failed heartbeat per call, not per HTTP request; counting requests in the
    transport would mark ``heartbeat_lost`` during a short api-server outage the supervisor survives, and
    then refuse (and re-run) a task that succeeded. One class per base (not per attempt) lets the zygote
    pre-build the class's cached SSL context once for every agent it forks.

    The first heartbeat right after the start is not sent: the supervisor sends its first heartbeat at its
    first wake-up after ``PATCH …/run`` (its last attempt starts at 0), a few milliseconds later, and that call
    only sets again the ``last_heartbeat_at`` the run has just set (Airflow 3.3 ``ti_run``). A heartbeat of the
    attempt's task instance made less than ``leoflow_first_heartbeat_window`` seconds (set it after
    constructing; 0, the default, sends every heartbeat) after its run call answered 2xx is answered 204 here,
    once, and is not counted; the supervisor's next one comes ``[workers] min_heartbeat_interval`` later, so
    Airflow sees at most that interval plus the window without a heartbeat after the start. One request (and
    the api-server's work for it) fewer per attempt, a quarter of a short task's Execution API calls.
    """

    class HeartbeatCountingClient(base):  # type: ignore[misc, valid-type]
        leoflow_transport: RecordingTransport | None = None
        leoflow_first_heartbeat_window: float = 0.0
        _leoflow_run_at: float | None = None  # time.monotonic() of the attempt's 2xx run call, until a heartbeat

        def request(self, method: str, url: Any, *args: Any, **kwargs: Any) -> httpx.Response:
            transport = self.leoflow_transport
            path = str(url).split("?", 1)[0]
            verb = str(method).upper()
            match = _HEARTBEAT_CALL.search(path) if verb == "PUT" else None
            if transport is None:
                return super().request(method, url, *args, **kwargs)
            if match is None:
                if verb == "PATCH" and _STATE_PATH.search(path):
                    return super().request(method, url, *args, **kwargs)  # the report itself: never counted
                try:
                    response = super().request(method, url, *args, **kwargs)
                except httpx.RequestError as exc:  # what the client retries, as for a 5xx
                    transport.call_failed(str(method), path, exc)
                    raise
                except httpx.HTTPStatusError as exc:
                    if exc.response.status_code >= 500:
                        transport.call_failed(str(method), path, exc)
                    raise
                run = _RUN_PATH.search(path) if verb == "PATCH" else None
                if run is not None and run["ti_id"] == transport.attempt_ti_id and response.is_success:
                    self._leoflow_run_at = time.monotonic()
                return response
            if match["ti_id"] != transport.attempt_ti_id:
                return super().request(method, url, *args, **kwargs)
            ran, self._leoflow_run_at = self._leoflow_run_at, None
            if ran is not None and time.monotonic() - ran < self.leoflow_first_heartbeat_window:
                log.debug("heartbeat of %s not sent: its run call answered %.3f s ago", transport.attempt_ti_id,
                          time.monotonic() - ran)
                return httpx.Response(204, request=self.build_request(method, url))
            transport.heartbeat_started()
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
