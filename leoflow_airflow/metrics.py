"""leoflow's metrics, emitted through Airflow's own Stats (issue 12 item 4).

Airflow 3.3 exposes its metrics front end as ``airflow.observability.stats`` (``incr``, ``gauge``, ``timing``;
``airflow.stats.Stats`` is a deprecated shim). It sends to whatever ``[metrics]`` configures (StatsD, Datadog,
OpenTelemetry) with ``[metrics] statsd_prefix`` in front (``airflow.`` by default) and applies the operator's
``metrics_allow_list`` / ``metrics_block_list``, so leoflow's names live under ``<prefix>.leoflow.``.

:data:`METRICS` is the one list of every name: the README's "Metrics" table and the metrics test's expected
set both come from it, so they cannot drift. A name with a ``<placeholder>`` is a family, one name per value
(StatsD has no tags; the value sits in the name, as Airflow's own ``ti.finish.<dag_id>...``).

Metrics are off the hot path's failure modes: every emit here catches every exception (a broken StatsD
client, a bad name) and logs it at most once per name; none raises into a dispatch, an exchange or a settle.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from time import monotonic

__all__ = [
    "METRICS",
    "Metric",
    "gauge",
    "incr",
    "markdown_table",
    "timed",
    "timing",
]

log = logging.getLogger(__name__)

PREFIX = "leoflow"


@dataclass(frozen=True, slots=True)
class Metric:
    """One documented metric (family).

    :param name: the name after Airflow's prefix; ``<x>`` marks a family's variable part.
    :param kind: ``counter``, ``gauge`` or ``timer`` (milliseconds, as Airflow's timers).
    :param runtimes: which runtimes emit it: ``("lite", "kubernetes")`` or one of them.
    :param meaning: what it counts or measures, and where.
    :param values: a family's values (empty for a plain name).
    """

    name: str
    kind: str
    runtimes: tuple[str, ...]
    meaning: str
    values: tuple[str, ...] = ()

    def matches(self, emitted: str) -> bool:
        """Whether ``emitted`` (without Airflow's prefix) is this metric or a member of its family."""
        pattern = re.escape(self.name)
        pattern = re.sub(r"<[a-z_]+>", "[A-Za-z0-9_.-]+", pattern.replace(r"\<", "<").replace(r"\>", ">"))
        return re.fullmatch(pattern, emitted) is not None


_BOTH = ("lite", "kubernetes")
_KUBE = ("kubernetes",)
_LITE = ("lite",)

METRICS: tuple[Metric, ...] = (
    Metric("leoflow.executor.sync", "timer", _BOTH,
           "Wall time of one `LeoflowExecutor.sync()` (the scheduler loop's time in leoflow: events, reconcile, "
           "settle, reap, hand-over)."),
    Metric("leoflow.dispatch.<disposition>", "counter", _BOTH,
           "Dispatch results by disposition (`dispatched`, `backpressure`, `deferred`, `refused`, "
           "`stale`).",
           ("dispatched", "backpressure", "deferred", "refused", "stale")),
    Metric("leoflow.attempt.settled.<resolution>", "counter", _BOTH,
           "Attempts closed in the ledger by this scheduler, by resolution (`reported`, `replayed`, "
           "`infra_redrive`, ...; the `Resolution` values)."),
    Metric("leoflow.recovery.<evidence>", "counter", _BOTH,
           "Recoveries by what they acted on: `replayed` (a lost report replayed from its outcome record), "
           "`infra_redrive` / `oom_redrive` (no usable evidence: a new try on the infra budget), `redispatched` "
           "(the agent died before `/run`: the same ti_id again as epoch + 1), `orphan_redrive` (the orphan-run "
           "reaper re-drove a task instance with no attempt), `orphan_restore` (it PATCHed again a terminal report "
           "(success, failed, skipped, removed) a late call of the same execution had overwritten).",
           ("replayed", "infra_redrive", "oom_redrive", "redispatched", "orphan_redrive", "orphan_restore")),
    Metric("leoflow.reaper.<reaper>", "counter", _BOTH,
           "Reaper actions: a kill by `agent-lost`, `dispatch-lost`, `start-rejected`, `start-backpressure`, or a "
           "re-drive or restore by `orphan-run`.",
           ("agent-lost", "dispatch-lost", "start-rejected", "start-backpressure", "orphan-run")),
    Metric("leoflow.warm.lite.file_workers", "gauge", _LITE,
           "Ready Lite file workers (warm DAG-file parents), sent by the zygote on every change."),
    Metric("leoflow.warm.lite.hit", "counter", _LITE,
           "Lite attempts forked by a ready file worker (warm; needs `[leoflow] lite_warm_files` > 0)."),
    Metric("leoflow.warm.lite.miss", "counter", _LITE,
           "Lite attempts forked cold by the zygote while file workers are on (no ready worker for the file)."),
    Metric("leoflow.warm.kubernetes.<result>", "counter", _KUBE,
           "Kubernetes attempts by placement while warm pods are on: `hit` (assigned to an idle warm pod) or "
           "`miss` (a cold pod: no idle warm pod of its DAG version, or its executor_config asks for one).",
           ("hit", "miss")),
    Metric("leoflow.warm.kubernetes.pods.<state>", "gauge", _KUBE,
           "This scheduler's warm pods by state, sent on every pool tick once its pod cache has synced: `idle` "
           "(registered, awaiting an attempt), `starting` (created, not registered yet), `busy` (assigned or "
           "running an attempt), `draining` (at a self-limit, finishing its attempt). Totals over every DAG "
           "version (StatsD has no tags, and a name per `dag_version_id` would grow without bound; per version "
           "see the UI's pools page or the `leoflow_warm_pool_resized` hook).",
           ("idle", "starting", "busy", "draining")),
    Metric("leoflow.pod.create", "timer", _KUBE,
           "Latency of one pod create call to the API server (success or not)."),
    Metric("leoflow.exchange.<result>", "counter", _KUBE,
           "Token exchanges answered by this api-server: `ok`, `denied.<reason>` (403; `REFUSALS`, `vetoed` "
           "for a plugin's veto) or `undecided.<reason>` (503; `UNAVAILABLE`, `plugin_error`)."),
    Metric("leoflow.warm.<route>.<result>", "counter", _KUBE,
           "Warm pods' requests answered by this api-server (`api/warm.py`), `<route>` `register`, `await` or "
           "`outcome`: `ok` (register, outcome), `delivered` (an await handed out an attempt), `lost` (an await took "
           "an attempt whose exchange write changed nothing), `denied.<reason>` (4xx; `WARM_REFUSALS` and the "
           "exchange's) or `undecided.<reason>` (503)."),
)
"""Every metric leoflow emits (README "Metrics" is rendered from this; ``tests`` assert against it)."""

_warned: set[str] = set()


_checked: set[str] = set()
"""Names already found in :data:`METRICS` (a family has few members): the check costs a set lookup after the
first emit of a name."""


def _known(name: str) -> None:
    if name in _checked:
        return
    if not any(m.matches(name) for m in METRICS):
        raise ValueError(f"metric {name!r} is not documented in leoflow_airflow.metrics.METRICS")
    _checked.add(name)


def _stats():  # noqa: ANN202 - Airflow's module
    from airflow.observability import stats

    return stats


def _failed(name: str) -> None:
    if name not in _warned:
        _warned.add(name)
        log.warning("leoflow metric %s could not be emitted (later failures of it are not logged)", name,
                    exc_info=True)


def incr(name: str, count: int = 1) -> None:
    """Add ``count`` to counter ``name`` (a :data:`METRICS` name or family member). Never raises."""
    try:
        _known(name)
        _stats().incr(name, count)
    except Exception:  # noqa: BLE001 - metrics never break what they measure
        _failed(name)


def gauge(name: str, value: float) -> None:
    """Set gauge ``name`` to ``value``. Never raises."""
    try:
        _known(name)
        _stats().gauge(name, value)
    except Exception:  # noqa: BLE001
        _failed(name)


def timing(name: str, seconds: float) -> None:
    """Send ``seconds`` of timer ``name`` (in milliseconds, as Airflow's timers). Never raises."""
    try:
        _known(name)
        _stats().timing(name, seconds * 1000.0)
    except Exception:  # noqa: BLE001
        _failed(name)


@contextmanager
def timed(name: str) -> Iterator[None]:
    """Time the ``with`` block into timer ``name``, whether it raises or not (its exception passes on)."""
    start = monotonic()
    try:
        yield
    finally:
        timing(name, monotonic() - start)


def markdown_table() -> str:
    """The README's "Metrics" table (name, type, runtimes, meaning), one row per :data:`METRICS` entry."""
    rows = ["| Name (after `[metrics] statsd_prefix`) | Type | Runtimes | Meaning |", "|---|---|---|---|"]
    rows += [f"| `{m.name}` | {m.kind} | {', '.join(m.runtimes)} | {m.meaning} |" for m in METRICS]
    return "\n".join(rows)
