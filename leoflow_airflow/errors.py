"""The errors leoflow raises on purpose, in one tree, split by what the caller does next (httpx's
``_exceptions.py`` layout). Expected outcomes of dispatch, settle and re-drive are values, not errors
(``Disposition``, ``SettleResult``, ``RedriveResult``).

::

    LeoflowError
    ├── ConfigError (ValueError)       an operator fixes a [leoflow] value: start() refuses (key and value named)
    ├── LadderViolation                an operator fixes the recovery window: start() refuses
    ├── ZygoteError                    the Lite zygote did not come up: logged, spawned again
    ├── PodRefused                     this attempt's pod can never be built as asked (a forbidden pod_override
    │                                  field, too many containers for the outcome record): refused, the TI fails
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


class PodRefused(LeoflowError):
    """The pod of one attempt cannot be built as asked, and asking again will not change that: the dispatch is
    ``refused`` and the task instance fails at once with this message in its log (DESIGN §3 "Dispatch").

    Raised by :func:`leoflow_airflow.runtime.kubernetes.pod.build_pod` for a ``pod_override`` field outside
    ``[leoflow] pod_override_allow``, an ``executor_config`` it cannot use, a ``pod_mutation_hook`` that raised,
    a second ServiceAccount token or one of Airflow's own secrets on the pod, and a final container count that
    leaves the termination message too few bytes for an outcome record.

    :param field: what is refused, as a pod field path in the Kubernetes API's names
        (``spec.containers.securityContext``) or an ``executor_config`` key (``executor_config.pod_override``).
    :param reason: what is wrong and what the operator or DAG author can do about it.
    """

    def __init__(self, field: str, reason: str) -> None:
        self.field, self.reason = field, reason
        super().__init__(f"{field}: {reason}")
