"""The outcome record: the durable wire contract between an agent and the reconciler.

An agent writes one record immediately before a terminal ``PATCH /execution/task-instances/{id}/state``
leaves, so a report lost in flight (agent killed, api-server down, pod evicted) still leaves the task's
true result behind. The reconciler reads it back and replays ``payload`` instead of recomputing anything
(DESIGN §2, §4; ADR 0052). Correctness never depends on the record: "no record" just means the attempt
is treated as an infra loss and re-driven (DESIGN §2, Invariant 3).

The format follows seed 003 (the Go ``taskoutcome`` package): compact, versioned JSON, ``v`` = 1,
``outcome`` one of a closed set, every other field optional and additive (an old reader ignores keys it
does not know). DESIGN §4 adds, still at v 1: ``ti_id``, ``try_number``, ``state``, ``payload``,
``api_version``, ``callbacks_pending``, ``assets_dropped`` and a fourth outcome, ``deferred``.

Two sinks, two sizes: the Lite record file holds the whole body (:func:`write_record_file`, bounded only
by :data:`MAX_RECORD_BYTES`); a Kubernetes termination message keeps what fits the pod's byte budget
(:func:`write_termination_message`, :func:`encode` with ``budget=``).

This module is standard library only: the in-pod agent and the control plane both import it.

Example::

    >>> a = AttemptIdentity("0190b6c2-0000-7000-8000-000000000001", 1, 1)
    >>> r = record_for_state("success", {"state": "success", "end_date": "2025-01-01T00:00:00Z"},
    ...                      attempt=a, api_version="2026-06-30")
    >>> decode(encode(r), expect=a) == r
    True
"""

from __future__ import annotations

import enum
import json
import os
import re
import stat
import tempfile
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

__all__ = [
    "CALLBACKS_PENDING_STATES",
    "MAX_REASON_LEN",
    "MAX_RECORD_BYTES",
    "MIN_TERMINATION_MESSAGE_BUDGET",
    "STATE_OUTCOMES",
    "TERMINATION_MESSAGE_BUDGET",
    "VERSION",
    "AttemptIdentity",
    "Outcome",
    "OutcomeRecord",
    "Reason",
    "RecordTooLarge",
    "WrittenRecord",
    "agent_start_failed",
    "api_unreachable",
    "decode",
    "encode",
    "exchange_refused",
    "exchange_unreachable",
    "format_rfc3339",
    "heartbeat_lost",
    "killed",
    "parse_rfc3339",
    "read_record_file",
    "record_for_state",
    "truncate_utf8",
    "write_record_file",
    "write_termination_message",
]

VERSION = 1
"""Record schema version (seed 003). :func:`decode` rejects any other, so a stale reader never misreads
a newer record; new fields are added without bumping it."""

MAX_REASON_LEN = 240
"""Upper bound, in UTF-8 bytes, of ``reason`` (seed 003 ``MaxReasonLen``). Writer and reader both clamp
to it with :func:`truncate_utf8`."""

TERMINATION_MESSAGE_BUDGET = 2048
"""Byte budget for a record written to a Kubernetes termination message: far under the kubelet's
4096-byte cap, leaving room for whatever else a container might write there (DESIGN §4)."""

MIN_TERMINATION_MESSAGE_BUDGET = 1536
"""The fewest bytes a termination message may offer a record (1.5 KiB). Every terminal record of today's
supervisor fits it once asset events and ``reason`` are dropped (:func:`encode`), with ``rendered_map_index``
at Airflow's column limit of 250 characters of 4 UTF-8 bytes each and every number at its widest (about
1,350 bytes; ``tests/unit/test_outcome.py`` holds the worst case). The Kubernetes pod builder refuses a pod whose
container count leaves the agent less than this (``leoflow_airflow.runtime.kubernetes.pod``)."""

MAX_RECORD_BYTES = 1024 * 1024
"""Hard ceiling, in bytes, on any encoded record (1 MiB). :func:`decode` treats a larger input as "no
record" without parsing it, and :func:`encode` never produces one (it drops asset events first), so
writer and reader agree on what is readable."""


class Outcome(enum.StrEnum):
    """A task attempt's coarse, true result, independent of whether its report was delivered.

    Seed 003 defines ``success``, ``failed`` and ``reschedule``; DESIGN §4 adds ``deferred`` (the task
    handed off to a trigger or to a human). :func:`decode` accepts exactly these four.
    """

    SUCCESS = "success"
    FAILED = "failed"
    RESCHEDULE = "reschedule"
    DEFERRED = "deferred"


class Reason(enum.StrEnum):
    """The closed set of classifications an agent may put in ``reason`` (DESIGN §4, seed 003).

    A reason is a classification chosen by the agent, never raw error text, so nothing derived from a
    credential or an internal error path reaches this durable, user-visible field. Readers still bound
    whatever arrives (:data:`MAX_REASON_LEN`) and keep unknown values, which a newer agent may send.
    """

    HEARTBEAT_LOST = "heartbeat_lost"
    KILLED = "killed"
    EXECUTION_TIMEOUT = "execution_timeout"
    AGENT_START_FAILED = "agent_start_failed"
    RUN_REFUSED = "run_refused"
    EXCHANGE_REFUSED = "exchange_refused"
    """A task pod's token exchange was answered 403 (or another final refusal): the attempt never started."""
    EXCHANGE_UNREACHABLE = "exchange_unreachable"
    """A task pod's token exchange got no usable answer before the agent's exchange deadline."""
    API_UNREACHABLE = "api_unreachable"
    """An Execution API call the task needed went unanswered (a transport error or a 5xx after the Task SDK's
    retries) and the task then ended ``failed`` or ``up_for_retry``: the outage, not the task, failed it."""
    OOM_KILLED = "oom_killed"
    """The kernel's OOM killer ended a process of the attempt's memory cgroup (its container's, on a node: the task
    process at the container's memory limit) and the task then ended ``failed`` or ``up_for_retry``: settled as
    an OOM kill, like a container the runtime reports ``OOMKilled`` (``leoflow_agent.oom``)."""


CALLBACKS_PENDING_STATES = frozenset({"success", "up_for_retry"})
"""Airflow states the supervisor PATCHes *before* the task child runs its callbacks (DESIGN §2
"Callbacks"): a record for one of these carries ``callbacks_pending = True``."""

STATE_OUTCOMES: dict[str, Outcome] = {
    "success": Outcome.SUCCESS,
    "skipped": Outcome.SUCCESS,
    "removed": Outcome.SUCCESS,
    "failed": Outcome.FAILED,
    "up_for_retry": Outcome.FAILED,
    # Not sent by today's supervisor, but a terminal body the Execution API accepts
    # (TerminalStateNonSuccess); if one is ever reported it is a failure.
    "upstream_failed": Outcome.FAILED,
    "up_for_reschedule": Outcome.RESCHEDULE,
    "deferred": Outcome.DEFERRED,
    "awaiting_input": Outcome.DEFERRED,
}
"""The Airflow state a supervisor reported -> the record's coarse outcome (DESIGN §4). Any state not in
this table (running, queued, scheduled, restarting, ...) is not something a record is written for."""

# Payload keys of TISuccessStatePayload (airflow.sdk.api.datamodels._generated) that carry asset
# information; dropped together, first, when a record does not fit its budget (DESIGN §4).
_ASSET_KEYS = ("outlet_events", "task_outlets")

_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1

_RFC3339 = re.compile(
    r"\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(?P<frac>\.\d{1,9})?(?:[Zz]|[+-]\d{2}:\d{2})",
    re.ASCII,
)


class RecordTooLarge(ValueError):
    """Raised by :func:`encode` when a record cannot be made to fit its byte budget.

    Even with asset events dropped and ``reason`` cut to nothing it is still too big: a programming
    error signal (as seed 003's ``Encode`` error), never an outcome to report. ``size`` is the smallest
    size reached and ``budget`` the limit, both in bytes.
    """

    def __init__(self, size: int, budget: int) -> None:
        """``size``: the smallest encoding reached, in bytes; ``budget``: the limit, in bytes."""
        super().__init__(f"outcome record needs at least {size} bytes, budget is {budget} bytes")
        self.size = size
        self.budget = budget


@dataclass(frozen=True)
class AttemptIdentity:
    """One execution of a task instance: (``ti_id``, ``try_number``, ``attempt_epoch``) (DESIGN §2).

    ``ti_id`` is Airflow's ``TaskInstance.id`` (a uuid7 string), ``try_number`` Airflow's try (>= 1),
    ``attempt_epoch`` leoflow's dispatch counter for that ``ti_id`` (>= 1).
    """

    ti_id: str
    try_number: int
    attempt_epoch: int


@dataclass(frozen=True)
class OutcomeRecord:
    """The decoded outcome record (DESIGN §4, seed 003 ``Record``).

    Fields (``None`` means absent; absent fields are omitted on the wire):

    - ``outcome``: the coarse :class:`Outcome`.
    - ``ti_id``, ``try_number``, ``attempt_epoch``: the attempt that wrote it (see :meth:`attempt`).
    - ``state``: the exact Airflow state the supervisor sent (e.g. ``"up_for_retry"``).
    - ``payload``: the exact ``PATCH .../state`` JSON body, for the reconciler to replay verbatim.
      Treat it as read-only (the dataclass is frozen, the dict inside is not).
    - ``api_version``: the ``airflow-api-version`` header that body went with.
    - ``callbacks_pending``: the PATCH left before the task child ran its callbacks (DESIGN §2).
    - ``exit_code``: the user process exit code, when known (seed 003; never the outcome itself).
    - ``reschedule_at``: next poke time, RFC3339 UTC; required for ``outcome == reschedule``.
    - ``reason``: a :class:`Reason` value, at most :data:`MAX_REASON_LEN` bytes.
    - ``assets_dropped``: the encoder dropped asset outlets/events to fit a byte budget; the
      reconciler logs it.

    Instances compare by value; one carrying a ``payload`` is not hashable (the body is a dict).
    """

    outcome: Outcome
    ti_id: str | None = None
    try_number: int | None = None
    attempt_epoch: int | None = None
    state: str | None = None
    payload: dict | None = None
    api_version: str | None = None
    callbacks_pending: bool = False
    exit_code: int | None = None
    reschedule_at: str | None = None
    reason: str | None = None
    assets_dropped: bool = False

    def attempt(self) -> AttemptIdentity | None:
        """The full attempt identity, or ``None`` when any of its three fields is absent."""
        if self.ti_id is None or self.try_number is None or self.attempt_epoch is None:
            return None
        return AttemptIdentity(self.ti_id, self.try_number, self.attempt_epoch)

    def reschedule_time(self) -> datetime | None:
        """The next-poke time as a timezone-aware UTC ``datetime``.

        ``None`` unless this is a ``reschedule`` record carrying a parseable RFC3339 time (seed 003
        ``Record.At``). Never raises.
        """
        if self.outcome != Outcome.RESCHEDULE or not isinstance(self.reschedule_at, str):
            return None
        return parse_rfc3339(self.reschedule_at)


# --------------------------------------------------------------------------------------------------
# helpers


def truncate_utf8(text: str, limit_bytes: int) -> str:
    """Clamp ``text`` to at most ``limit_bytes`` bytes of UTF-8, cutting on a character boundary.

    A multi-byte character that would straddle the limit is dropped whole, so the result is always a
    prefix of ``text`` made of complete characters (seed 003 ``TruncateReason``). Lone surrogates (which
    ``json.loads`` can produce from ``\\udXXX`` escapes) count as 3 bytes and are kept. A negative limit
    behaves as 0. Never raises for ``str`` input.
    """
    limit = max(0, limit_bytes)
    if len(text) <= limit // 4:  # at most 4 bytes per character: certainly fits
        return text
    raw = text.encode("utf-8", "surrogatepass")
    if len(raw) <= limit:
        return text
    cut = limit
    while cut > 0 and (raw[cut] & 0xC0) == 0x80:  # raw[cut] continues a character begun before it
        cut -= 1
    return raw[:cut].decode("utf-8", "surrogatepass")


def parse_rfc3339(value: str) -> datetime | None:
    """Parse an RFC3339 timestamp (``2025-01-02T03:04:05.678Z``, or with ``+hh:mm``) to aware UTC.

    Returns ``None``, never raises, for anything else: wrong type, no offset, a date alone, ISO 8601
    basic format, impossible dates. Fractional seconds beyond microseconds are truncated. This is the
    reading rule for ``reschedule_at`` (seed 003 ``Record.At``: RFC3339, Go's ``RFC3339Nano`` included).
    """
    if not isinstance(value, str) or not _RFC3339.fullmatch(value):
        return None
    try:
        text = value.upper()
        frac = _RFC3339.fullmatch(value).group("frac")  # type: ignore[union-attr]
        if frac and len(frac) > 7:  # '.' + more than 6 digits
            text = text.replace(frac, frac[:7], 1)
        parsed = datetime.fromisoformat(text)
        if parsed.tzinfo is None:  # pragma: no cover - the pattern requires an offset
            return None
        return parsed.astimezone(timezone.utc)
    except (ValueError, OverflowError):
        return None


def format_rfc3339(when: datetime) -> str:
    """Render an aware ``datetime`` as RFC3339 in UTC with microseconds: ``2025-01-02T03:04:05.000000Z``.

    Raises ``ValueError`` for a naive datetime (its instant is unknowable). The writing rule for
    ``reschedule_at`` (seed 003 ``RescheduledAt``: stored in UTC).
    """
    if when.tzinfo is None or when.utcoffset() is None:
        raise ValueError("reschedule time must be timezone-aware")
    utc = when.astimezone(timezone.utc).replace(tzinfo=None)
    return utc.isoformat(timespec="microseconds") + "Z"


def _state_value(state: Any) -> Any:
    """An enum's value (``TaskInstanceState.SUCCESS`` -> ``"success"``), anything else unchanged."""
    return state.value if isinstance(state, enum.Enum) else state


# --------------------------------------------------------------------------------------------------
# constructors


def record_for_state(
    state: str,
    payload: dict,
    *,
    attempt: AttemptIdentity,
    api_version: str | None,
) -> OutcomeRecord:
    """Build the record for a terminal or handing-off ``PATCH .../state`` about to be sent.

    ``state`` is the Airflow state in the body (a string or a ``TaskInstanceState``-like enum),
    ``payload`` the exact JSON body as a dict (for example ``json.loads(request.content)``), and
    ``api_version`` the ``airflow-api-version`` header it goes with. The outcome follows DESIGN §4
    (:data:`STATE_OUTCOMES`); ``callbacks_pending`` is set for :data:`CALLBACKS_PENDING_STATES`; for
    ``up_for_reschedule`` ``reschedule_at`` is ``payload["reschedule_date"]`` normalised to RFC3339 UTC.
    The record keeps its own deep copy of ``payload``.

    Raises ``ValueError`` when the record could not be replayed or decoded: a state that is neither
    terminal nor handing off (``running``, ``queued``, ...), a payload that is not a JSON object, whose
    ``"state"`` differs from ``state``, that is not JSON-serialisable, or (for a reschedule) lacks a
    parseable, timezone-aware ``reschedule_date``.
    """
    state = _state_value(state)
    outcome = STATE_OUTCOMES.get(state) if isinstance(state, str) else None
    if outcome is None:
        raise ValueError(f"no outcome record for state {state!r}: not terminal or handing off")
    if not isinstance(payload, dict):
        raise ValueError(f"payload must be the JSON object of the PATCH body, got {type(payload).__name__}")
    if _state_value(payload.get("state")) != state:
        raise ValueError(f"payload state {payload.get('state')!r} differs from reported state {state!r}")
    try:
        body = json.loads(json.dumps(payload, allow_nan=False, default=_json_default))
    except (TypeError, ValueError, RecursionError) as exc:
        raise ValueError(f"payload is not a JSON body: {exc}") from exc
    reschedule_at = None
    if outcome is Outcome.RESCHEDULE:
        when = body.get("reschedule_date")
        parsed = parse_rfc3339(when) if isinstance(when, str) else None
        if parsed is None:
            raise ValueError(f"up_for_reschedule payload lacks a parseable reschedule_date: {when!r}")
        reschedule_at = format_rfc3339(parsed)
    return OutcomeRecord(
        outcome=outcome,
        ti_id=attempt.ti_id,
        try_number=attempt.try_number,
        attempt_epoch=attempt.attempt_epoch,
        state=state,
        payload=body,
        api_version=api_version,
        callbacks_pending=state in CALLBACKS_PENDING_STATES,
        reschedule_at=reschedule_at,
    )


def _json_default(value: Any) -> Any:
    """``json.dumps`` fallback for a payload built in Python mode: aware datetimes become RFC3339 text
    (as pydantic's JSON mode renders them), enums their value. Anything else raises ``TypeError``."""
    if isinstance(value, datetime):
        return format_rfc3339(value)
    if isinstance(value, enum.Enum):
        return value.value
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def _refusal(attempt: AttemptIdentity | None, reason: Reason) -> OutcomeRecord:
    """A ``failed`` record with ``reason`` and no state or payload: the agent refused the attempt's terminal
    report (or never started it), and the reconciler treats the attempt as an infra loss, or re-dispatches it
    when Airflow still holds it QUEUED. ``attempt`` ``None``: the agent does not know its attempt (a task pod
    before its exchange); the record then carries no identity, which :func:`decode` accepts (the reader checks
    the pod's labels)."""
    return OutcomeRecord(
        outcome=Outcome.FAILED,
        ti_id=attempt.ti_id if attempt else None,
        try_number=attempt.try_number if attempt else None,
        attempt_epoch=attempt.attempt_epoch if attempt else None,
        reason=reason.value,
    )


def heartbeat_lost(attempt: AttemptIdentity) -> OutcomeRecord:
    """The record an agent writes when the supervisor gave up heartbeating (DESIGN §2 "Heartbeat loss").

    Outcome ``failed``, reason ``heartbeat_lost``, no state and no payload: the agent refuses the
    attempt's later terminal PATCH, and the reconciler treats the attempt as an infra loss.
    """
    return _refusal(attempt, Reason.HEARTBEAT_LOST)


def api_unreachable(attempt: AttemptIdentity) -> OutcomeRecord:
    """The record an agent writes when a call of its task to the Execution API went unanswered (the api-server
    down or failing: a transport error or a 5xx after the Task SDK client's retries) and the task then ended
    ``failed`` or ``up_for_retry`` (issue 10: the Task SDK turns the unanswered call into ``API_SERVER_ERROR`` in
    the task, which fails it).

    Outcome ``failed``, reason ``api_unreachable``, no state and no payload: the agent refuses that report, and
    the reconciler re-drives the attempt as an infra loss instead of spending a user retry, as for
    :func:`heartbeat_lost`.
    """
    return _refusal(attempt, Reason.API_UNREACHABLE)


def killed(attempt: AttemptIdentity) -> OutcomeRecord:
    """The record an agent writes when leoflow killed its attempt gracefully (its kill marker exists,
    ``leoflow_agent.protocol.kill_marker_path``) and the task then ended ``failed`` or ``up_for_retry``.

    Outcome ``failed``, reason ``killed``, no state and no payload: the agent refuses that report, which the
    kill caused, and the reconciler re-drives the attempt as an infra loss (issue 8 hole 16), as it did when
    every kill was a SIGKILL that left no record at all.
    """
    return _refusal(attempt, Reason.KILLED)


def oom_killed(attempt: AttemptIdentity) -> OutcomeRecord:
    """The record an agent writes when the kernel's OOM killer ended a process of its attempt and the task then
    reported ``failed`` or ``up_for_retry`` (:class:`leoflow_agent.oom.OomWatch`).

    Outcome ``failed``, reason ``oom_killed``, no state and no payload: the agent refuses that report, and the
    reconciler settles the attempt as an OOM kill (re-driven once on the infra budget; failed if the re-driven
    try is OOM-killed too), not as the task's own failure."""
    return _refusal(attempt, Reason.OOM_KILLED)


def exchange_refused(attempt: AttemptIdentity | None = None) -> OutcomeRecord:
    """The record a task pod's agent writes when its token exchange was refused for good (HTTP 403: a stale
    epoch, a second exchange, a replaced or terminating pod, ...). The agent never reached ``/run``.

    Outcome ``failed``, reason ``exchange_refused``, no state, no payload, and (before a grant) no attempt
    identity: the reconciler re-dispatches the attempt when Airflow still holds its TI QUEUED (never a user
    retry), and otherwise closes it (DESIGN §2's table).
    """
    return _refusal(attempt, Reason.EXCHANGE_REFUSED)


def exchange_unreachable(attempt: AttemptIdentity | None = None) -> OutcomeRecord:
    """The record a task pod's agent writes when its token exchange got no usable answer (transport errors,
    timeouts, 5xx) until its exchange deadline ran out. Read like :func:`exchange_refused`."""
    return _refusal(attempt, Reason.EXCHANGE_UNREACHABLE)


def agent_start_failed(attempt: AttemptIdentity | None = None) -> OutcomeRecord:
    """The record an agent writes when it could not start its attempt's supervisor (a malformed environment
    or workload); ``attempt`` ``None`` when it failed before it knew its attempt. Read like
    :func:`exchange_refused`."""
    return _refusal(attempt, Reason.AGENT_START_FAILED)


# --------------------------------------------------------------------------------------------------
# encode


def _fields(record: OutcomeRecord) -> dict[str, Any]:
    """The record's wire fields except ``v``: ``None`` and ``False`` flags omitted, enums as values."""
    out: dict[str, Any] = {"outcome": Outcome(_state_value(record.outcome)).value}
    for name in ("ti_id", "try_number", "attempt_epoch", "state", "payload", "api_version",
                 "exit_code", "reschedule_at", "reason"):
        value = getattr(record, name)
        if value is not None:
            out[name] = _state_value(value)
    if record.attempt_epoch == 0:  # seed 003: epoch 0 is left out, the label is the safer answer
        del out["attempt_epoch"]
    for flag in ("callbacks_pending", "assets_dropped"):
        if getattr(record, flag):
            out[flag] = True
    return out


def _render(fields: dict[str, Any]) -> bytes:
    """Compact JSON, ``v`` first then sorted keys, no spaces, as UTF-8 bytes.

    Non-ASCII text is written as UTF-8; a string that cannot be UTF-8 (a lone surrogate) makes the
    whole document fall back to ``\\u`` escapes, which is still valid JSON with the same meaning.
    Raises ``ValueError`` for NaN/Infinity, values JSON cannot carry, or nesting too deep to render.
    """
    opts: dict[str, Any] = {"sort_keys": True, "separators": (",", ":"), "allow_nan": False}
    try:
        try:
            body = json.dumps(fields, ensure_ascii=False, **opts).encode("utf-8")
        except UnicodeEncodeError:
            body = json.dumps(fields, ensure_ascii=True, **opts).encode("ascii")
    except (TypeError, RecursionError) as exc:
        raise ValueError(f"outcome record is not JSON-serialisable: {exc}") from exc
    return b'{"v":%d,' % VERSION + body[1:]


def encode(record: OutcomeRecord, *, budget: int | None = None) -> str:
    """Render ``record`` as compact JSON text for a record file or a termination message.

    ``budget`` is a limit in bytes of the UTF-8 encoding (``TERMINATION_MESSAGE_BUDGET`` for a
    termination message); ``None`` means the whole body (the Lite record file), still bounded by
    :data:`MAX_RECORD_BYTES`. ``reason`` is always clamped to :data:`MAX_REASON_LEN` bytes. When the
    record does not fit, in this order (DESIGN §4):

    1. asset information is dropped: ``payload["outlet_events"]`` and ``payload["task_outlets"]``
       (the asset fields of Airflow's ``TISuccessStatePayload``) become ``[]`` together, so a replay
       never registers half of a task's asset events, and ``assets_dropped`` is set;
    2. ``reason`` is cut on a UTF-8 character boundary, down to nothing (then omitted).

    Raises :class:`RecordTooLarge` if it still does not fit, and ``ValueError`` if the record is one
    :func:`decode` would reject (unknown outcome, a reschedule without a parseable ``reschedule_at``,
    a state inconsistent with the outcome, a payload that is not JSON, ...): both are programming
    errors, never an outcome (seed 003 ``Encode``).
    """
    return _encode_bytes(record, budget=budget)[0].decode("utf-8")


def _encode_bytes(record: OutcomeRecord, *, budget: int | None) -> tuple[bytes, bool]:
    """:func:`encode`'s work: the UTF-8 bytes, and whether what they carry is flagged ``assets_dropped``
    (asset events dropped to fit ``budget`` bytes). Raises as :func:`encode` does."""
    limit = MAX_RECORD_BYTES if budget is None else min(budget, MAX_RECORD_BYTES)
    fields = _fields(record)
    if isinstance(fields.get("reason"), str):  # a non-string reason is refused just below
        fields["reason"] = truncate_utf8(fields["reason"], MAX_REASON_LEN)
    data = _render(fields)
    _check_decodable(data)
    if len(data) <= limit:
        return data, bool(fields.get("assets_dropped"))

    payload = fields.get("payload")
    if isinstance(payload, dict) and any(payload.get(k) for k in _ASSET_KEYS):
        payload = dict(payload)
        for key in _ASSET_KEYS:
            if key in payload:
                payload[key] = []
        fields["payload"] = payload
        fields["assets_dropped"] = True
        data = _render(fields)
        if len(data) <= limit:
            return data, True

    reason = fields.get("reason")
    if reason:
        raw_len = len(reason.encode("utf-8", "surrogatepass"))
        lo, hi = 0, raw_len  # largest byte length of reason that fits; monotone in the cut
        best: bytes | None = None
        while lo <= hi:
            mid = (lo + hi) // 2
            cut = truncate_utf8(reason, mid)
            trial = dict(fields)
            if cut:
                trial["reason"] = cut
            else:
                trial.pop("reason")
            rendered = _render(trial)
            if len(rendered) <= limit:
                best, lo = rendered, mid + 1
            else:
                hi = mid - 1
        if best is not None:
            return best, bool(fields.get("assets_dropped"))
        fields.pop("reason")
        data = _render(fields)
    raise RecordTooLarge(len(data), limit)


def _check_decodable(data: bytes) -> None:
    """Raise ``ValueError`` unless ``data`` decodes as a record: the encoder never writes what the
    reader would silently take for "no record"."""
    if _decode_fields(data, ceiling=None) is None:
        raise ValueError("outcome record is inconsistent and would not decode: " + data[:200].decode("utf-8", "replace"))


# --------------------------------------------------------------------------------------------------
# decode


def decode(text: str | bytes | None, *, expect: AttemptIdentity | None = None) -> OutcomeRecord | None:
    """Parse a record file or termination message; ``None`` means "no record". Never raises.

    ``text`` may be ``str``, ``bytes`` (strict UTF-8), or ``None``. "No record" for: empty or
    whitespace, over :data:`MAX_RECORD_BYTES`, invalid UTF-8, not JSON (a log tail, a truncated
    write), JSON that is not an object, ``v`` not exactly the integer 1 (``true`` and ``1.0`` too),
    an outcome outside :class:`Outcome`, a field of the wrong type, a state not consistent with the
    outcome or with ``payload["state"]``, a reschedule without a parseable RFC3339 ``reschedule_at``,
    and an attempt different from ``expect``: any of ``ti_id``/``try_number``/``attempt_epoch`` that
    is present and differs (an absent one is accepted; the caller has checked it against the pod's
    labels or the ledger, seed 003). Unknown keys are ignored (additive evolution); ``reason`` longer
    than :data:`MAX_REASON_LEN` bytes is truncated, not rejected; ``attempt_epoch`` 0 reads as absent.

    A termination message may arrive as ``"<runtime message>: <record>"`` (the kubelet prepends the container
    runtime's own message when there is one): when the whole text is no record, the record is read from a
    later ``{"v":1`` (the last one that starts a valid record to the end of the text, at most
    :data:`_MAX_PREFIX_CANDIDATES` tried). A message the kubelet cut, at its head (it keeps a file's last 4096
    bytes) or at its tail (the pod-wide 12288-byte share keeps the head), is not valid JSON and stays "no
    record".
    """
    try:
        try:
            record = _decode_fields(text, ceiling=MAX_RECORD_BYTES)
        except Exception:  # noqa: BLE001 - not a record as a whole; perhaps after a prefix
            record = None
        if record is None:
            record = _decode_after_prefix(text)
        if record is None or expect is None:
            return record
        for name in ("ti_id", "try_number", "attempt_epoch"):
            got = getattr(record, name)
            if got is not None and got != getattr(expect, name):
                return None
        return record
    except Exception:  # noqa: BLE001 - the contract: bad input is "no record", whatever it is
        return None


_RECORD_START = '{"v":%d' % VERSION
_MAX_PREFIX_CANDIDATES = 16
"""How many ``{"v":1`` positions :func:`decode` tries after a prefix (from the last one back): a record has one at
its start and one per nested object with a ``v`` key, so a few suffice, and a hostile text is never parsed
more than this many times."""


def _decode_after_prefix(text: str | bytes | None) -> OutcomeRecord | None:
    """The record that ends ``text`` after some prefix (a runtime message), or ``None``. Tries each
    :data:`_RECORD_START` after position 0, last first: a suffix starting at a nested object's ``{"v":1`` is never
    valid JSON (the outer object's closing braces follow it), so the first suffix that decodes starts at the
    record's own opening brace. May raise on pathological input (:func:`decode` catches it)."""
    text = _as_text(text, ceiling=MAX_RECORD_BYTES)
    if text is None:
        return None
    end = len(text)
    for _ in range(_MAX_PREFIX_CANDIDATES):
        start = text.rfind(_RECORD_START, 1, end)
        if start < 0:
            return None
        try:
            record = _decode_fields(text[start:], ceiling=MAX_RECORD_BYTES)
        except ValueError:  # not JSON from there (json.JSONDecodeError is one): try an earlier opening
            record = None
        if record is not None:
            return record
        end = start + len(_RECORD_START) - 1
    return None


def _as_text(text: Any, *, ceiling: int | None) -> str | None:
    """``text`` as ``str``: bytes-like decoded as strict UTF-8; ``None`` for anything else, invalid UTF-8, or
    more than ``ceiling`` bytes (``None``: no limit)."""
    if isinstance(text, (bytes, bytearray, memoryview)):
        raw = bytes(text)
        if ceiling is not None and len(raw) > ceiling:
            return None
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return None
    if not isinstance(text, str):
        return None
    if ceiling is not None and (len(text) > ceiling or len(text.encode("utf-8", "surrogatepass")) > ceiling):
        return None
    return text


def _reject_constant(name: str) -> Any:
    """``json.loads`` hook: NaN/Infinity are not JSON; refuse them."""
    raise ValueError(f"not JSON: {name}")


def _is_int(value: Any) -> bool:
    """True for a JSON integer (``bool`` is an ``int`` in Python but not here)."""
    return type(value) is int


def _decode_fields(text: str | bytes | None, *, ceiling: int | None) -> OutcomeRecord | None:
    """The validating core of :func:`decode` (no attempt check). May raise on pathological input;
    :func:`decode` catches everything."""
    text = _as_text(text, ceiling=ceiling)
    if text is None or not text.strip():
        return None
    doc = json.loads(text, parse_constant=_reject_constant)
    if not isinstance(doc, dict):
        return None
    if not _is_int(doc.get("v")) or doc["v"] != VERSION:
        return None
    try:
        outcome = Outcome(doc.get("outcome"))
    except ValueError:
        return None

    def opt(name: str, ok: Any) -> tuple[bool, Any]:
        """(valid, value) of an optional field: JSON null or absent is valid and ``None``."""
        value = doc.get(name)
        if value is None:
            return True, None
        return bool(ok(value)), value

    checks = {
        "ti_id": lambda v: isinstance(v, str) and v != "",
        "try_number": lambda v: _is_int(v) and v >= 0,
        "attempt_epoch": lambda v: _is_int(v) and v >= 0,
        "state": lambda v: isinstance(v, str),
        "payload": lambda v: isinstance(v, dict),
        "api_version": lambda v: isinstance(v, str),
        "exit_code": lambda v: _is_int(v) and _INT32_MIN <= v <= _INT32_MAX,
        "reschedule_at": lambda v: isinstance(v, str),
        "reason": lambda v: isinstance(v, str),
        "callbacks_pending": lambda v: isinstance(v, bool),
        "assets_dropped": lambda v: isinstance(v, bool),
    }
    values: dict[str, Any] = {}
    for name, ok in checks.items():
        good, value = opt(name, ok)
        if not good:
            return None
        values[name] = value

    state = values["state"]
    if state is not None and STATE_OUTCOMES.get(state) is not outcome:
        return None
    payload = values["payload"]
    if payload is not None and (state is None or payload.get("state") != state):
        return None
    if outcome is Outcome.RESCHEDULE and parse_rfc3339(values["reschedule_at"]) is None:
        return None
    if values["attempt_epoch"] == 0:
        values["attempt_epoch"] = None
    reason = values["reason"]
    if reason is not None:
        reason = truncate_utf8(reason, MAX_REASON_LEN) or None
    return OutcomeRecord(
        outcome=outcome,
        ti_id=values["ti_id"],
        try_number=values["try_number"],
        attempt_epoch=values["attempt_epoch"],
        state=state,
        payload=payload,
        api_version=values["api_version"],
        callbacks_pending=bool(values["callbacks_pending"]),
        exit_code=values["exit_code"],
        reschedule_at=values["reschedule_at"],
        reason=reason,
        assets_dropped=bool(values["assets_dropped"]),
    )


# --------------------------------------------------------------------------------------------------
# the Lite record file


@dataclass(frozen=True)
class WrittenRecord:
    """What :func:`write_record_file` wrote: ``size`` in bytes, and ``assets_dropped`` when the record had
    to leave out the body's asset events to stay within :data:`MAX_RECORD_BYTES` (a replay of it would
    register none, so the agent says so in the TI's log; DESIGN §4)."""

    size: int
    assets_dropped: bool


def write_record_file(path: str | os.PathLike, record: OutcomeRecord) -> WrittenRecord:
    """Atomically replace the file at ``path`` with ``encode(record)`` (the whole body, UTF-8); returns
    what was written (:class:`WrittenRecord`).

    A temporary file is created in the same directory with mode 0600, written, fsynced, renamed over
    ``path`` with ``os.replace``, and the directory is fsynced, so a reader sees either the old file
    or the complete new record, even across a crash (DESIGN §3 "Run": the record is durable before the
    terminal PATCH leaves). Raises ``OSError`` on any I/O failure (the temporary file is removed), and
    :class:`RecordTooLarge`/``ValueError`` from :func:`encode` for a record that cannot be written.
    """
    data, assets_dropped = _encode_bytes(record, budget=None)
    target = os.fspath(path)
    directory = os.path.dirname(target) or "."
    fd, tmp = tempfile.mkstemp(dir=directory, prefix="." + os.path.basename(target) + ".", suffix=".tmp")
    try:
        try:
            _write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    dir_fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return WrittenRecord(size=len(data), assets_dropped=assets_dropped)


def _write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` to ``fd`` (``os.write`` may write less than asked). Raises ``OSError``."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def write_termination_message(path: str | os.PathLike, record: OutcomeRecord, *, budget: int) -> WrittenRecord:
    """Make the file at ``path`` (a container's ``terminationMessagePath``) hold exactly ``encode(record,
    budget=budget)``; returns what was written (:class:`WrittenRecord`).

    The whole file, never appended to: opened ``O_WRONLY | O_CREAT | O_TRUNC`` (mode 0644 when created), written,
    fsynced, closed. The kubelet keeps the file's last 4096 bytes and cuts the pod's messages to 12288 bytes over
    its containers, so what it reports is the record only when the file holds nothing else, within ``budget``
    (the pod builder's ``LEOFLOW_TERMINATION_MESSAGE_BUDGET``). Not a rename: the file is a bind mount, which
    cannot be replaced. A crash between the truncation and the write leaves an empty or cut file, which reads as
    "no record" (never a wrong one).

    Raises ``OSError`` on any I/O failure, :class:`RecordTooLarge`/``ValueError`` from :func:`encode` for a record
    that cannot be written within ``budget`` (the file is then left as it was).
    """
    data, assets_dropped = _encode_bytes(record, budget=budget)
    fd = os.open(os.fspath(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0), 0o644)
    try:
        _write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    return WrittenRecord(size=len(data), assets_dropped=assets_dropped)


def read_record_file(path: str | os.PathLike, *, expect: AttemptIdentity | None = None) -> OutcomeRecord | None:
    """Read and :func:`decode` the record file at ``path``. Never raises.

    ``None`` ("no record") for a missing, unreadable or corrupt file, a path that is not a regular file
    (a FIFO is never blocked on), a file over :data:`MAX_RECORD_BYTES`, and everything :func:`decode`
    rejects, including an attempt different from ``expect``. The reconciler's reading of a Lite
    attempt's record (DESIGN §3 "Reconcile": decoding never raises).
    """
    try:
        fd = os.open(os.fspath(path), os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except Exception:  # noqa: BLE001 - missing, permission, bad path type: all "no record"
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        chunks: list[bytes] = []
        size = 0
        while size <= MAX_RECORD_BYTES:
            chunk = os.read(fd, MAX_RECORD_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > MAX_RECORD_BYTES:
            return None
        return decode(b"".join(chunks), expect=expect)
    except Exception:  # noqa: BLE001
        return None
    finally:
        os.close(fd)
