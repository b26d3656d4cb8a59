"""The errors leoflow raises on purpose, in one tree, split by what the caller does next (httpx's
``_exceptions.py`` layout). Expected outcomes of dispatch, settle and re-drive are values, not errors
(``Disposition``, ``SettleResult``, ``RedriveResult``).

::

    LeoflowError
    ├── ConfigError (ValueError)       an operator fixes a [leoflow] value: start() refuses (key and value named)
    ├── LadderViolation                an operator fixes the recovery window: start() refuses
    ├── ZygoteError                    the Lite zygote did not come up: logged, spawned again
    └── IllegalTransition (ValueError) a programming error: an attempt-state move TRANSITIONS does not allow
                                       (``leoflow_airflow.ledger.states``)

``LedgerConflict`` (``ledger.store``) and ``ProtocolError`` (``leoflow_agent.protocol``; the agent never imports
the control plane) stand outside it.
"""

from __future__ import annotations


class LeoflowError(Exception):
    """Base class of every error leoflow raises on purpose."""


class ConfigError(LeoflowError, ValueError):
    """A ``[leoflow]`` (or related Airflow) option has a value leoflow cannot use.

    :param key: ``section.option``, e.g. ``leoflow.runtime``.
    :param value: the raw value as configured.
    :param reason: what is wrong and what is accepted.
    """

    def __init__(self, key: str, value: object, reason: str) -> None:
        self.key, self.value, self.reason = key, value, reason
        super().__init__(f"[{key.split('.')[0]}] {key.split('.', 1)[1]} = {value!r}: {reason}")


class LadderViolation(LeoflowError):
    """The resilience ladder's hard rung is broken: the executor refuses to start (DESIGN §2, §3)."""


class ZygoteError(LeoflowError):
    """The Lite zygote could not be started or reached."""
