"""The attempt ledger's vocabulary: attempt states, their transition table, resolutions, attempt refs.

DESIGN §2: an attempt is (ti_id, try_number, attempt_epoch). Its ledger row moves through the states
below only along the edges of ``TRANSITIONS``; every write that moves it is a guarded write whose
expected states must each be allowed to reach the target (``check_transition``). Pure module: no I/O.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from leoflow_agent.outcome import AttemptIdentity
from leoflow_airflow.errors import LeoflowError

__all__ = [
    "LIVE_STATES",
    "OPEN_STATES",
    "SETTLE_STATES",
    "TRANSITIONS",
    "AttemptRef",
    "AttemptState",
    "IllegalTransition",
    "Resolution",
    "check_transition",
]


class AttemptState(enum.StrEnum):
    """Where one attempt stands in leoflow's ledger (the ``state`` column of ``leoflow_attempt``).

    The values are the strings stored in the database; renaming one needs a migration.
    """

    CLAIMED = "claimed"
    """Epoch claimed, workload stored (token stripped), not yet handed to the runtime."""
    DISPATCHED = "dispatched"
    """Handed to the runtime (Lite: agent forked, pid + process create time known)."""
    REPORTED = "reported"
    """The agent's terminal ``PATCH …/state`` returned 2xx: the attempt's slot is freed."""
    EXITED = "exited"
    """Proof of death: no process of the attempt's subtree is left, or its pod is terminal/gone."""
    SETTLING = "settling"
    """The reconciler committed its settling mark before replaying (DESIGN §2 settle mechanics); the row stays
    here while the replay is retried: a replay was sent and may have landed."""
    CLOSED = "closed"
    """Final. ``resolution`` says how the attempt ended."""


class Resolution(enum.StrEnum):
    """How a CLOSED attempt ended (the ``resolution`` column); one value per row of DESIGN §2's table."""

    REPORTED = "reported"
    """Airflow got the agent's own terminal report: the normal path."""
    REPLAYED = "replayed"
    """The reconciler replayed the recorded terminal ``PATCH`` body through the Execution API."""
    INFRA_REDRIVE = "infra_redrive"
    """No usable evidence: the TI was reset as an infra loss and re-runs as a new try."""
    OOM_REDRIVE = "oom_redrive"
    """An infra re-drive of an attempt whose container was OOM-killed (``EndKind.OOM_KILLED``): the durable mark
    that the next try of the logical TI was that one re-drive, so an OOM kill of that try fails the task."""
    REDISPATCHED = "redispatched"
    """The agent died before ``/run``: the same ``ti_id`` was dispatched again as epoch + 1."""
    EXECUTOR_FAILED = "executor_failed"
    """``executor.fail(key)`` handed the TI to Airflow's killed-externally path: a budget was spent, or the
    runtime's status says the task itself failed (a pod's ``DeadlineExceeded``, an OOM kill of a try that was
    already re-driven for one)."""
    RESTARTING = "restarting"
    """A user cleared the running task: ``executor.success(key)`` let Airflow's RESTARTING branch re-run it."""
    MOVED_ON = "moved_on"
    """Airflow's TI was already terminal or belongs to another attempt: closed, nothing else done."""
    REVOKED = "revoked"
    """``revoke_task``/``terminate`` killed the attempt's subtree."""
    LAUNCH_FAILED = "launch_failed"
    """The runtime never started the attempt (a rejected or refused dispatch)."""
    ABANDONED = "abandoned"
    """Given up without evidence either way (for example the row outlived every bound)."""


class IllegalTransition(LeoflowError, ValueError):
    """A move between two attempt states that ``TRANSITIONS`` does not allow: a programming error."""


_S = AttemptState

TRANSITIONS: Mapping[AttemptState, frozenset[AttemptState]] = MappingProxyType(
    {
        # CLAIMED -> EXITED: its agent ran unrecorded (Airflow's TI shows it reached /run) and is gone
        _S.CLAIMED: frozenset({_S.DISPATCHED, _S.EXITED, _S.CLOSED}),
        _S.DISPATCHED: frozenset({_S.REPORTED, _S.EXITED, _S.CLOSED}),
        _S.REPORTED: frozenset({_S.EXITED, _S.CLOSED}),
        _S.EXITED: frozenset({_S.SETTLING, _S.CLOSED}),
        # SETTLING -> EXITED: a settle gives the row back (the lifecycle itself keeps a row SETTLING while it
        # retries its replay, so a later settle knows one was sent).
        _S.SETTLING: frozenset({_S.CLOSED, _S.EXITED}),
        _S.CLOSED: frozenset(),
    }
)
"""Allowed moves, ``from -> {to, …}``. Read-only; every state has an entry."""

OPEN_STATES: frozenset[AttemptState] = frozenset(s for s, nxt in TRANSITIONS.items() if nxt)
"""Every state with a way out (all but CLOSED): the rows the reconciler still looks at."""

LIVE_STATES: frozenset[AttemptState] = frozenset({_S.DISPATCHED, _S.REPORTED})
"""Handed to the runtime and not yet proven dead: presence decides what happens next."""

SETTLE_STATES: frozenset[AttemptState] = frozenset({_S.EXITED, _S.SETTLING})
"""Proven dead and not yet closed: the reconciler settles them; no new epoch of the ti_id may be claimed."""


def check_transition(frm: AttemptState | str, to: AttemptState | str) -> None:
    """Raise unless ``frm -> to`` is an edge of ``TRANSITIONS``.

    Both arguments may be members or their string values. Raises ``IllegalTransition`` (a
    ``ValueError``) naming both states; an unknown state string raises ``ValueError`` from the enum.
    A self-loop is illegal.
    """
    frm_state = AttemptState(frm)
    to_state = AttemptState(to)
    if to_state not in TRANSITIONS[frm_state]:
        raise IllegalTransition(f"illegal attempt transition {frm_state.value!r} -> {to_state.value!r}")


@dataclass(frozen=True, slots=True)
class AttemptRef(AttemptIdentity):
    """The identity of one execution (DESIGN §2 "Attempt"); every guarded write names one.

    The wire contract's :class:`~leoflow_agent.outcome.AttemptIdentity` (one identity type: an ``AttemptRef`` is
    the ``expect`` of a record decode as it is) with one rendering for logs. ``ti_id`` is Airflow's
    ``TaskInstance.id`` as ``str(uuid)``; ``try_number`` is Airflow's try (>= 1); ``attempt_epoch`` counts
    dispatches of the same ``ti_id``, starting at 1.
    """

    def __str__(self) -> str:
        """Render as ``ti_id/try/epoch`` for log lines."""
        return f"{self.ti_id}/{self.try_number}/{self.attempt_epoch}"

    def __hash__(self) -> int:
        """The hash of its three fields, computed once: refs key the dicts a scheduler loop looks every running
        attempt up in, several times per loop (issue 10, "Benchmark")."""
        try:
            return self.__dict__["_hash"]  # type: ignore[no-any-return]
        except KeyError:
            value = hash((self.ti_id, self.try_number, self.attempt_epoch))
            object.__setattr__(self, "_hash", value)
            return value

    def __reduce__(self) -> tuple[type[AttemptRef], tuple[str, int, int]]:
        """Pickle and copy by the three fields only (a cached hash is of this process's string hashing)."""
        return type(self), (self.ti_id, self.try_number, self.attempt_epoch)
