"""Loads leoflow's plugins and calls their hooks (:mod:`leoflow_airflow.hookspecs` has the specs).

One :class:`pluggy.PluginManager` per process (:func:`plugin_manager`, cached), holding the specs and every
plugin of the entry point group ``leoflow`` (``load_setuptools_entrypoints``). A plugin that fails to import
or does not match the specs (pluggy's ``PluginValidationError``) is logged and left out; leoflow runs on.

The callers here keep each hook's failure rule (the specs say why):

* :func:`mutate_pod` and :func:`exchange_verdicts` let a hook's exception through to their caller, which
  refuses (the pod) or answers undecided (the exchange): fail-closed;
* :func:`attempt_settled` and :func:`warm_pool_resized` are observe-only: an exception is logged with its
  traceback and swallowed, so a broken plugin never breaks settlement or the warm pool.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping
from typing import Any

import pluggy

from leoflow_airflow import hookspecs
from leoflow_airflow.hookspecs import AttemptInfo, ExchangeVerdict

__all__ = [
    "attempt_settled",
    "exchange_verdicts",
    "has_implementations",
    "mutate_pod",
    "plugin_manager",
    "warm_pool_resized",
]

log = logging.getLogger(__name__)


@functools.cache
def plugin_manager() -> pluggy.PluginManager:
    """The process's plugin manager: the specs plus every plugin of the ``leoflow`` entry point group.

    Cached: entry points are read once (``plugin_manager.cache_clear()`` reloads them, for tests)."""
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    try:
        count = pm.load_setuptools_entrypoints(hookspecs.ENTRY_POINT_GROUP)
    except Exception:  # noqa: BLE001 - a broken plugin distribution never stops leoflow
        log.exception("leoflow: loading the plugins of entry point group %r failed; running without the rest",
                      hookspecs.ENTRY_POINT_GROUP)
        count = len(pm.get_plugins())
    if count:
        log.info("leoflow: %d plugin(s) loaded: %s", count,
                 ", ".join(sorted(n for n, _ in pm.list_name_plugin())))
    return pm


def has_implementations(hook_name: str) -> bool:
    """Whether any loaded plugin implements ``hook_name`` (callers skip building arguments otherwise)."""
    return bool(getattr(plugin_manager().hook, hook_name).get_hookimpls())


def mutate_pod(pod: Any, attempt: AttemptInfo) -> None:
    """Call every ``leoflow_mutate_pod``; a hook's exception propagates (the pod builder refuses the pod)."""
    plugin_manager().hook.leoflow_mutate_pod(pod=pod, attempt=attempt)


def exchange_verdicts(attempt: AttemptInfo, *, pod_name: str, pod_uid: str, namespace: str,
                      credential_id: str | None) -> list[tuple[str, ExchangeVerdict]]:
    """Call every ``leoflow_exchange`` one by one; ``[(plugin name, verdict)]`` of those that answered.

    The implementations are called here rather than through ``pm.hook`` so that each verdict and each exception
    names its plugin (pluggy's call collects results without saying whose); the order is pluggy's (last
    registered first).

    :raises Exception: whatever a hook raised, with its plugin's name in a note (the exchange answers 503).
    :raises TypeError: a hook returned something else than an :class:`ExchangeVerdict` or ``None``.
    """
    pm = plugin_manager()
    out: list[tuple[str, ExchangeVerdict]] = []
    for impl in reversed(pm.hook.leoflow_exchange.get_hookimpls()):
        kwargs = {"attempt": attempt, "pod_name": pod_name, "pod_uid": pod_uid, "namespace": namespace,
                  "credential_id": credential_id}
        try:
            answer = impl.function(**{k: kwargs[k] for k in impl.argnames})
        except Exception as exc:
            exc.add_note(f"in leoflow_exchange of plugin {impl.plugin_name}")
            raise
        if answer is None:
            continue
        if not isinstance(answer, ExchangeVerdict):
            raise TypeError(f"leoflow_exchange of plugin {impl.plugin_name} returned {type(answer).__name__}, "
                            "not an ExchangeVerdict or None")
        out.append((impl.plugin_name, answer))
    return out


def attempt_settled(attempt: AttemptInfo, *, evidence: Mapping[str, Any], resolution: str, detail: str) -> None:
    """Call every ``leoflow_attempt_settled``; never raises (a hook's exception is logged)."""
    try:
        if not has_implementations("leoflow_attempt_settled"):
            return
        plugin_manager().hook.leoflow_attempt_settled(attempt=attempt, evidence=dict(evidence),
                                                      resolution=resolution, detail=detail)
    except Exception:  # noqa: BLE001 - observe-only: a plugin never breaks settlement
        log.exception("leoflow: a leoflow_attempt_settled hook raised (attempt %s/%s/%s); ignored",
                      attempt.ti_id, attempt.try_number, attempt.attempt_epoch)


def warm_pool_resized(pool_key: str, *, before: int, after: int) -> None:
    """Call every ``leoflow_warm_pool_resized``; never raises (a hook's exception is logged)."""
    try:
        if not has_implementations("leoflow_warm_pool_resized"):
            return
        plugin_manager().hook.leoflow_warm_pool_resized(pool_key=pool_key, before=before, after=after)
    except Exception:  # noqa: BLE001 - observe-only
        log.exception("leoflow: a leoflow_warm_pool_resized hook raised (pool %s); ignored", pool_key)
