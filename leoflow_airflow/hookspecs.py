"""leoflow's extension points: pluggy hook specifications (issue 12 item 6; DESIGN §5 layout).

A plugin is any installed distribution that declares an entry point in the group :data:`ENTRY_POINT_GROUP`
(``leoflow``) whose object is a module or class carrying ``@hookimpl`` functions named as below::

    # pyproject.toml of the plugin
    [project.entry-points.leoflow]
    my_policy = "my_policy.plugin"

    # my_policy/plugin.py
    from leoflow_airflow.hookspecs import hookimpl

    @hookimpl
    def leoflow_mutate_pod(pod, attempt):
        pod.metadata.labels["team"] = "data"

The plugins are loaded once per process by :func:`leoflow_airflow.hooks.plugin_manager`
(``PluginManager.load_setuptools_entrypoints``, the way pytest and tox find theirs). Hooks are called with
keyword arguments only (pluggy's rule); an implementation may take any subset of a spec's arguments.

What no hook can do (the point of this module's shapes): weaken what leoflow pins. A pod hook runs before
leoflow re-applies every pin, so a changed pin is overridden (and the few things no pin can mend, a second
ServiceAccount token or one of Airflow's secrets in the environment, refuse the pod); an exchange hook can only
refuse or add log fields, never grant, widen a token's scope or change what is minted; the observe hooks get
copies of plain values and their return is ignored. How each caller treats a hook that raises is said on each
spec (and in the README, "Extension hooks").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pluggy

__all__ = [
    "ENTRY_POINT_GROUP",
    "PROJECT",
    "AttemptInfo",
    "ExchangeVerdict",
    "hookimpl",
    "hookspec",
]

PROJECT = "leoflow"
"""The pluggy project name: hook functions are marked with :data:`hookimpl` of this name."""
ENTRY_POINT_GROUP = "leoflow"
"""The entry point group plugins declare (``[project.entry-points.leoflow]``)."""

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@dataclass(frozen=True, slots=True)
class AttemptInfo:
    """One attempt as a hook sees it (DESIGN §2 "Attempt"): a frozen copy, so a hook cannot change the
    attempt leoflow acts on.

    :param ti_id: Airflow's ``TaskInstance.id`` (UUID text).
    :param try_number: Airflow's try number.
    :param attempt_epoch: leoflow's epoch of this ``ti_id`` (1 for the first dispatch).
    :param dag_id, task_id, run_id: the logical task instance.
    :param map_index: ``-1`` when not mapped.
    :param runtime: ``"lite"`` or ``"kubernetes"``.
    """

    ti_id: str
    try_number: int
    attempt_epoch: int
    dag_id: str
    task_id: str
    run_id: str
    map_index: int = -1
    runtime: str = ""


@dataclass(frozen=True, slots=True)
class ExchangeVerdict:
    """What an exchange hook answers (:func:`leoflow_exchange`); ``None`` means "no opinion".

    :param deny: a non-empty text refuses the exchange (HTTP 403, reason ``vetoed``); the text is logged under
        the answer's ``error_id`` with the plugin's name, never sent to the pod (DESIGN §3: a refusal shows only
        its ``error_id``). At most 200 characters are kept.
    :param log_fields: extra ``key=value`` fields for the exchange's log line (an audit trail: a ticket, a
        cost centre). They change nothing that is minted or granted: the workload token's claims and scope are
        Airflow's (``ExecuteTask.generate_token``), which no hook reaches.
    """

    deny: str = ""
    log_fields: Mapping[str, str] = field(default_factory=dict)


@hookspec
def leoflow_mutate_pod(pod: Any, attempt: AttemptInfo) -> None:
    """Change the pod of ``attempt`` in place before it is created (Kubernetes runtime).

    Called after Airflow's ``pod_mutation_hook``, on the merged pod (template, leoflow's layer, the task's
    ``pod_override``, the cluster policy). Afterwards leoflow sets again everything it pins (the pod's name,
    namespace, labels, identity annotation, finalizer, ServiceAccount and its one projected token,
    ``restartPolicy``, the security context, the agent container's arguments, termination message path and
    environment, ``activeDeadlineSeconds``): **a pinned field a hook changed is silently overridden**, as for
    Airflow's own hook, so the pod is the one the token exchange accepts. A hook that adds a second
    ServiceAccount token volume or one of Airflow's secrets to an environment gets the pod refused
    (``PodRefused``, the task fails as a pod that cannot be built).

    :param pod: the ``kubernetes.client.V1Pod`` to change in place; the return value is ignored.
    :param attempt: whose pod it is.
    :raises: anything a hook raises refuses the pod (``PodRefused`` naming ``leoflow_mutate_pod``), as a
        raising ``pod_mutation_hook`` does: fail-closed, a policy that could not run never lets a pod through.
    """


@hookspec
def leoflow_exchange(attempt: AttemptInfo, pod_name: str, pod_uid: str, namespace: str,
                     credential_id: str | None) -> ExchangeVerdict | None:
    """Veto or annotate a token exchange that passed every check of leoflow's (api-server side).

    Called after the pod, the ledger's attempt and its state were checked and before the workload token is
    minted and the exchange recorded, so a veto consumes nothing: any one :class:`ExchangeVerdict` with
    ``deny`` refuses the exchange (403, reason ``vetoed``). A hook that raises makes the exchange undecided
    (503, reason ``plugin_error``; the agent asks again): **fail-closed** (a policy that could not decide
    never grants a credential) but not final (a policy whose own back end blinked does not fail the task).

    :param attempt: the attempt the pod exchanges for.
    :param pod_name, pod_uid, namespace: the pod the token is bound to (TokenReview's answer).
    :param credential_id: the projected token's ``JTI`` when Kubernetes named one.
    :returns: an :class:`ExchangeVerdict`, or ``None`` for no opinion.
    """


@hookspec
def leoflow_attempt_settled(attempt: AttemptInfo, evidence: Mapping[str, Any], resolution: str,
                            detail: str) -> None:
    """Observe an attempt closed in the ledger (scheduler side, both runtimes).

    Called once per attempt, by the scheduler whose guarded write closed it. Observe only: the return value is
    ignored and an exception is logged (with its traceback) and never breaks settlement.

    :param attempt: the attempt (its ``ti_id``, ``try_number`` and ``attempt_epoch`` are the ti key and epoch).
    :param evidence: what the settle read, as plain values: ``record_state`` (the outcome record's Airflow state,
        or ``None`` when there was no usable record), ``exit_code`` (``None`` when unknown) and ``cause`` (the
        runtime's end cause, e.g. ``oom_killed``, or ``None``); all ``None`` for a close that read no evidence
        (a revoke, a launch that never started, a newer epoch).
    :param resolution: the ledger's resolution (``leoflow_airflow.ledger.states.Resolution`` value, e.g.
        ``reported``, ``replayed``, ``infra_redrive``, ``redispatched``).
    :param detail: why, as the ledger stores it.
    """


@hookspec
def leoflow_warm_pool_resized(pool_key: str, before: int, after: int) -> None:
    """Observe a warm pool's size change (scheduler side).

    Fired by the **Lite** runtime whenever the number of ready file workers changes (``pool_key``
    ``lite:file_workers``), and by the **Kubernetes** runtime's warm pool tick whenever the number of idle,
    registered warm pods of a DAG version changes (``pool_key`` ``kubernetes:<dag_version_id>``; on the
    runtime's request pool thread). Observe only: exceptions are logged, the return value is ignored.

    :param pool_key: which pool.
    :param before, after: its ready size before and after the change (>= 0).
    """
