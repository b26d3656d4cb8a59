"""The messages between the executor and the Lite zygote, and between an agent and its zygote.

Standard library only. Framing: one JSON object per line (UTF-8, ``\\n``-terminated) over a 0600 Unix
stream socket (executor <-> zygote) or an inherited pipe (agent -> zygote). A workload and its token travel
only inside these messages, never on a command line or in an environment variable (DESIGN §3).

Kinds are typed: a sender builds a message with :func:`op_message` / :func:`ev_message` from an :class:`Op` /
:class:`Ev` member (a non-member is refused) and a receiver reads its kind with :func:`op_of` / :func:`ev_of`;
no module compares bare strings (``tests/unit/test_protocol.py`` checks the sources). The members' values are
the names below, so the wire is what it was.

Executor -> zygote ("op"):
  ``launch``  {"op","launch_id","workload","server","record_path","fault","dag_file"?}
  ``kill``    {"op","launch_id","grace"?}                    drop it if held; else SIGTERM + SIGCONT its
              agent (the supervisor forwards SIGTERM to the task: ``on_kill``) and SIGKILL the subtree after
              ``grace`` seconds (default ``[core] killed_task_cleanup_time``; 0: at once)
  ``limit``   {"op","max_agents"}                            busy agents at most (int, or null: no limit);
              launches beyond it are held and forked in-band, first in first out, as busy agents report
              or exit (:mod:`leoflow_agent.handoff`)
  ``retoken`` {"op","launch_id","workload"}                  a held launch's workload with a fresh token
Zygote -> executor ("ev"):
  ``hello``   {"ev","pid","start_time"}                      once per connection
  ``launched``{"ev","launch_id","pid","start_time","warm"?}  an agent was forked; ``warm`` (only with file
                                                             workers on, for a launch of a DAG file): true
                                                             when a file worker forked it, false when cold
  ``warm_pool`` {"ev","before","ready"}                      the number of ready file workers changed
  ``launch_failed`` {"ev","launch_id","error","retryable"?}  the fork or the message was refused, or a
                                                             held launch was killed before its fork;
                                                             ``retryable`` true: a transient fork failure
                                                             (EAGAIN/ENOMEM), the workload is re-offered
  ``reported``{"ev","launch_id","state","recorded"}          the agent's terminal PATCH returned 2xx;
                                                             ``recorded`` false: its outcome record could not
                                                             be written (absent from older zygotes: true)
  ``exited``  {"ev","launch_id","pid","exit_code"}           the agent was reaped, its subtree killed
                                                             (``exit_code`` null: unknown, its file worker
                                                             reaped it and died before saying)
Agent -> zygote (its report pipe):
  ``started`` {"ev","launch_id","pid","start_time"}          the first line of an agent forked by a file
                                                             worker (:mod:`leoflow_agent.warm`): the zygote
                                                             learns its pid from the agent itself
  ``reported``{"ev","launch_id","state","recorded"}          the terminal PATCH returned 2xx (forwarded as above)
Zygote <-> file worker (:mod:`leoflow_agent.warm`; one JSON object per ``SOCK_SEQPACKET`` packet, kinds
:class:`WarmOp` / :class:`WarmEv`):
  ``fork``    {"op","launch"} + the agent's report pipe      fork the agent of this launch message
              (``SCM_RIGHTS``)
  ``ready``   {"ev","cached","dags","seconds"}               the file is parsed (``cached``: task processes
                                                             get the parsed bag)
  ``failed``  {"ev","error"}                                 it could not prepare; it exits
  ``stale``   {"ev","launch_id","file"}                      a file changed: nothing forked; it exits
  ``fork_failed`` {"ev","launch_id","error"}                 the fork failed: nothing forked
  ``exited``  {"ev","pid","exit_code"}                       it reaped one of its agents
"""

from __future__ import annotations

import enum
import json
import os
import socket
from dataclasses import dataclass, field
from typing import Any, NotRequired, TypedDict

MAX_LINE_BYTES = 16 * 1024 * 1024
"""Largest accepted message line, in bytes; a longer line is a protocol error."""

FAULT_POINTS = frozenset({"before_run", "after_run", "mid_task", "after_record", "after_patch", "hang_before_run"})
"""The agent's fault-injection points (DESIGN §3 "Fault injection"), honoured only in test mode. Each kills the
agent with SIGKILL at its point, except ``hang_before_run``: the agent blocks before ``/run`` (bounded, then
kills itself), so a test can make Airflow requeue a stuck-queued task instance (a same-``ti_id`` epoch 2)."""


class ProtocolError(ValueError):
    """A message that is not valid JSON, not an object, too long, or lacks a required field."""


class Op(enum.StrEnum):
    """The ``op`` of an executor -> zygote message (see the module docstring for each one's fields)."""

    LAUNCH = "launch"
    KILL = "kill"
    LIMIT = "limit"
    RETOKEN = "retoken"


class Ev(enum.StrEnum):
    """The ``ev`` of a zygote -> executor message (see the module docstring for each one's fields)."""

    HELLO = "hello"
    LAUNCHED = "launched"
    LAUNCH_FAILED = "launch_failed"
    REPORTED = "reported"
    EXITED = "exited"
    STARTED = "started"
    WARM_POOL = "warm_pool"


class WarmOp(enum.StrEnum):
    """The ``op`` of a zygote -> file worker packet."""

    FORK = "fork"


class WarmEv(enum.StrEnum):
    """The ``ev`` of a file worker -> zygote packet."""

    READY = "ready"
    FAILED = "failed"
    STALE = "stale"
    FORK_FAILED = "fork_failed"
    EXITED = "exited"


def warm_message(kind: WarmOp | WarmEv, **fields: Any) -> dict[str, Any]:
    """A packet between the zygote and a file worker: ``{"op": …}`` for a :class:`WarmOp`, ``{"ev": …}`` for a
    :class:`WarmEv`.

    :raises ValueError: ``kind`` is neither a :class:`WarmOp` nor a :class:`WarmEv` member.
    """
    if isinstance(kind, WarmOp):
        return {**fields, "op": kind.value}
    return {**fields, "ev": WarmEv(kind).value}


def warm_op_of(message: dict[str, Any]) -> WarmOp | None:
    """The :class:`WarmOp` of a decoded packet, or ``None`` (none, or an unknown one)."""
    try:
        return WarmOp(message.get("op"))
    except (ValueError, TypeError):
        return None


def warm_ev_of(message: dict[str, Any]) -> WarmEv | None:
    """The :class:`WarmEv` of a decoded packet, or ``None`` (none, or an unknown one)."""
    try:
        return WarmEv(message.get("ev"))
    except (ValueError, TypeError):
        return None


def op_message(op: Op, **fields: Any) -> dict[str, Any]:
    """An executor -> zygote message: ``{"op": op.value, **fields}`` (the wire form is the enum's value).

    :raises ValueError: ``op`` is not an :class:`Op` member (a bare string that names one is accepted).
    """
    return {**fields, "op": Op(op).value}


def ev_message(ev: Ev, **fields: Any) -> dict[str, Any]:
    """A zygote -> executor (or agent -> zygote) message: ``{"ev": ev.value, **fields}``.

    :raises ValueError: ``ev`` is not an :class:`Ev` member (a bare string that names one is accepted).
    """
    return {**fields, "ev": Ev(ev).value}


def op_of(message: dict[str, Any]) -> Op | None:
    """The ``op`` of a decoded message as an :class:`Op`, or ``None`` when it has none or an unknown one
    (the receiver logs and ignores it; the wire format is never extended silently)."""
    try:
        return Op(message.get("op"))
    except (ValueError, TypeError):
        return None


def ev_of(message: dict[str, Any]) -> Ev | None:
    """The ``ev`` of a decoded message as an :class:`Ev`, or ``None`` when it has none or an unknown one."""
    try:
        return Ev(message.get("ev"))
    except (ValueError, TypeError):
        return None


class DagFile(TypedDict):
    """Which DAG file a task launch runs: its bundle's ``bundle`` name and ``version`` (None: unversioned) and
    the file's ``path`` in the bundle. The zygote's file workers are keyed by it (:mod:`leoflow_agent.warm`)."""

    bundle: str
    version: str | None
    path: str


class LaunchMessage(TypedDict):
    """The ``launch`` op's body (``op`` is added by the sender). ``workload`` is the workload's JSON with a
    freshly minted token; ``record_path`` is ``None`` for a callback; ``fault`` is TEST ONLY
    (:data:`FAULT_POINTS`) or ``None``; ``attempt_epoch`` is 0 for a callback; ``dag_file`` (optional, absent
    from older executors and for callbacks) lets a file worker fork the agent."""

    launch_id: str
    attempt_epoch: int
    workload: str
    server: str
    record_path: str | None
    fault: str | None
    dag_file: NotRequired[DagFile | None]


def launch_id_for(ti_id: str, try_number: int, attempt_epoch: int) -> str:
    """Return the launch id of a task attempt: ``"<ti_id>:<try_number>:<attempt_epoch>"``. The one builder
    of task launch ids; the control plane calls it with an attempt's ref fields."""
    return f"{ti_id}:{int(try_number)}:{int(attempt_epoch)}"


def callback_launch_id(callback_id: object, serial: int) -> str:
    """Return the launch id of a callback workload: ``"callback:<callback id>:<serial>"`` (``serial`` makes
    two launches of one callback distinct; the executor passes ``time.monotonic_ns()``)."""
    return f"callback:{callback_id}:{int(serial)}"


KILL_MARKER = "killed"
"""File name, beside an attempt's record file, of its kill marker: the executor writes it before it gives the
attempt a graceful kill (SIGTERM, then SIGKILL after a grace), and the agent reads it before a terminal report
(:func:`kill_marker_path`)."""


def kill_marker_path(record_path: str) -> str:
    """The kill marker of the attempt whose outcome record file is ``record_path``: ``<its dir>/killed``. While
    it exists the agent refuses a ``failed`` or ``up_for_retry`` report (the kill caused it; the reconciler
    re-drives the attempt as an infra loss) and lets every other terminal report through."""
    return os.path.join(os.path.dirname(record_path), KILL_MARKER)


def agent_title_marker(launch_id: str) -> str:
    """The text every agent's process title starts with, found by :func:`leoflow_agent.proc.find_by_title`
    (a restarted executor finds an agent whose launch it never heard of by it)."""
    return f"leoflow agent {launch_id}"


def encode(message: dict[str, Any]) -> bytes:
    """Serialize one message to a newline-terminated UTF-8 JSON line.

    :raises ProtocolError: when the result exceeds :data:`MAX_LINE_BYTES`.
    """
    line = json.dumps(message, separators=(",", ":"), sort_keys=True).encode() + b"\n"
    if len(line) > MAX_LINE_BYTES:
        raise ProtocolError(f"message of {len(line)} bytes exceeds {MAX_LINE_BYTES}")
    return line


def decode(line: bytes) -> dict[str, Any]:
    """Parse one line into a message dict.

    :raises ProtocolError: for invalid UTF-8/JSON, a non-object, or a line over :data:`MAX_LINE_BYTES`.
    """
    if len(line) > MAX_LINE_BYTES:
        raise ProtocolError("message line too long")
    try:
        msg = json.loads(line.decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProtocolError(f"not a JSON message: {exc}") from None
    if not isinstance(msg, dict) or not ("op" in msg or "ev" in msg):
        raise ProtocolError("a message is a JSON object with an 'op' or 'ev' field")
    return msg


@dataclass
class LineBuffer:
    """Accumulates bytes from a non-blocking stream and yields complete decoded messages.

    Malformed lines are returned as :class:`ProtocolError` instances in :attr:`errors` instead of raising,
    so one bad line never loses the good ones around it.
    """

    data: bytearray = field(default_factory=bytearray)
    errors: list[ProtocolError] = field(default_factory=list)

    def feed(self, chunk: bytes) -> list[dict[str, Any]]:
        """Add ``chunk`` and return every complete message now available, in order."""
        self.data.extend(chunk)
        out: list[dict[str, Any]] = []
        while True:
            idx = self.data.find(b"\n")
            if idx < 0:
                if len(self.data) > MAX_LINE_BYTES:
                    self.errors.append(ProtocolError("unterminated message over the size limit"))
                    self.data.clear()
                return out
            line = bytes(self.data[:idx])
            del self.data[: idx + 1]
            if not line.strip():
                continue
            try:
                out.append(decode(line))
            except ProtocolError as exc:
                self.errors.append(exc)


def send(sock: socket.socket, message: dict[str, Any]) -> None:
    """Write one message to a blocking socket. Raises :class:`OSError` when the peer is gone."""
    sock.sendall(encode(message))
