"""The warm-pool decision (issue 11 item 1; DESIGN §3 "Warm pools"; seed 002's ``WarmPoolReconciler``): pure.

Every tick a runtime reads its warm workers (from its cache) and the create expectations still open, and asks
:func:`decide` what to do. The rules, per DAG version (Airflow 3's ``dag_version_id``):

* A **target** (:class:`Target`) keeps ``min_idle`` workers ready to take an attempt: idle ones, ones still
  starting and creates not yet seen by the cache all count as ready. Busy workers do not, so under load the
  pool grows past ``min_idle``, but never past ``max_pool_size`` workers in all (idle, starting, busy,
  draining and pending creates).
* Idle workers beyond what the target needs are deleted, the longest idle first. A **busy worker is never
  deleted** (a scale-down or a drain never kills an attempt; seed 002 review M1), nor is a draining one (it
  finishes its attempt and exits by itself).
* A **terminal** worker (exited, its pod Succeeded or Failed) can never serve again: it is always reaped and
  never counted (seed 002 H1), so a dead worker is replaced at once.
* A worker **starting** for longer than ``start_timeout`` seconds (a pod stuck Pending or in ``ErrImagePull``,
  a Lite worker that never finished parsing its file) is deleted, so a broken worker cannot hold a pool's
  places forever.
* A version with **no target** (its DAG paused or deleted, a newer version current and no run of it active)
  drains: its idle and starting workers are deleted, busy ones finish. Once it has no worker and no create in
  flight it is **retired** (:class:`Retire`: on Kubernetes its anchor ConfigMap is deleted, which the
  garbage collector would otherwise use to cascade live pods away).
* The **tenant cap** (``tenant_cap``: workers of one tenant, the DAG's bundle or its team, across all its
  versions) bounds creates: a tenant's footprint counts every live worker and every create in flight, of every
  version, draining ones too. Creates are rationed in a stable order (targets of active runs before prewarm
  targets, then by ``dag_id`` and version), so the same pools keep their workers from one tick to the next. A
  tenant above its cap (the cap was lowered) loses idle workers, prewarm versions' first; a worker whose own
  label names no tenant is never deleted for the cap (seed 002: pods of an older release).
* Nothing at all is done from a cache that has not synced (``synced`` False): a worker it does not show could be
  busy (seed 002: do no harm).

Deletes and reaps come before creates in the returned list (seed 002: every delete of the tick runs before any
create), so a runtime acting in order never overshoots a cap for a moment.
"""

from __future__ import annotations

import enum
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from typing import Union

__all__ = ["Create", "Delete", "Pending", "PoolSettings", "PoolSnapshot", "Reap", "Retire", "Target", "Worker",
           "WorkerState", "decide"]


class WorkerState(str, enum.Enum):
    """Where a warm worker is, as its runtime sees it."""

    STARTING = "starting"
    """Created, not registered yet (a Pending pod, a Lite worker still parsing its file): it will be idle."""
    IDLE = "idle"
    """Registered and waiting for an assignment."""
    BUSY = "busy"
    """Running an attempt."""
    DRAINING = "draining"
    """Reached a self-limit (max attempts, lifetime): finishes what it runs and exits, takes nothing new."""
    TERMINAL = "terminal"
    """Exited (a pod in phase Succeeded or Failed, a dead process): it can never serve again."""


@dataclass(frozen=True)
class Target:
    """One DAG version to keep warm workers for.

    ``version``: the ``dag_version_id``; ``dag_id``: its DAG (orders rationing); ``tenant``: the DAG's bundle
    name, or its team under Airflow's multi-team mode; ``min_idle``: workers to keep ready (0 or more);
    ``max_pool_size``: the version's ceiling of workers in all (a ceiling below ``min_idle`` is taken as
    ``min_idle``: the ready buffer must always be creatable); ``prewarm``: held only because the version is its
    DAG's current one, no run of it active yet (yields to the others under the tenant cap)."""

    version: str
    dag_id: str
    tenant: str
    min_idle: int
    max_pool_size: int
    prewarm: bool = False

    @property
    def ceiling(self) -> int:
        """The version's ceiling of workers in all: ``max(min_idle, max_pool_size)``."""
        return max(self.min_idle, self.max_pool_size)


@dataclass(frozen=True)
class Worker:
    """One warm worker as the runtime's cache shows it: ``name`` (the pod's name, a Lite worker's id),
    ``version`` (the ``dag_version_id`` it serves), ``tenant`` (its own label; ``""``: none, an older
    release's), ``state`` and ``since`` (tz-aware UTC: when it entered ``state``; None: unknown)."""

    name: str
    version: str
    tenant: str
    state: WorkerState
    since: datetime | None = None


@dataclass(frozen=True)
class Pending:
    """A create in flight (:class:`~leoflow_airflow.warm.expectations.Expectations`): asked for, not yet in the
    cache. Counts as a ready worker of ``version`` and toward ``tenant``'s cap."""

    version: str
    tenant: str


@dataclass(frozen=True)
class PoolSnapshot:
    """What one tick decides on: the ``targets``, the ``workers`` the cache shows, the creates ``pending``,
    the versions that still have a pool (``pooled``: an anchor on Kubernetes; a version's pool exists from its
    first create until :class:`Retire`), and whether the cache has ``synced``."""

    targets: tuple[Target, ...]
    workers: tuple[Worker, ...]
    pending: tuple[Pending, ...] = ()
    pooled: frozenset[str] = frozenset()
    synced: bool = True


@dataclass(frozen=True)
class PoolSettings:
    """``tenant_cap``: workers one tenant may hold across its versions (None: no cap); ``start_timeout``:
    seconds a worker may stay STARTING before it is deleted as broken."""

    tenant_cap: int | None = None
    start_timeout: float = 300.0

    def __post_init__(self) -> None:
        if self.tenant_cap is not None and self.tenant_cap < 0:
            raise ValueError(f"tenant_cap must be 0 or more, got {self.tenant_cap}")
        if not self.start_timeout > 0:
            raise ValueError(f"start_timeout must be greater than 0, got {self.start_timeout}")


@dataclass(frozen=True)
class Create:
    """Start one new worker for ``version`` (of ``dag_id``, tenant ``tenant``)."""

    version: str
    dag_id: str
    tenant: str
    prewarm: bool
    why: str


@dataclass(frozen=True)
class Delete:
    """Stop the live, not busy worker ``name`` of ``version``; ``why`` is for the log."""

    name: str
    version: str
    why: str


@dataclass(frozen=True)
class Reap:
    """Remove the terminal worker ``name`` of ``version`` (its pod, its process entry)."""

    name: str
    version: str
    why: str


@dataclass(frozen=True)
class Retire:
    """``version`` has no target, no worker and no create in flight: its pool (anchor) goes."""

    version: str
    why: str


Action = Union[Create, Delete, Reap, Retire]


@dataclass
class _Pool:
    """One version's live workers by state (working data of :func:`decide`)."""

    idle: list[Worker] = field(default_factory=list)
    starting: list[Worker] = field(default_factory=list)
    held: list[Worker] = field(default_factory=list)  # busy or draining: never deleted
    going: list[Worker] = field(default_factory=list)  # deleted this tick: still there until the cache says gone
    pending: int = 0

    @property
    def ready(self) -> int:
        return len(self.idle) + len(self.starting) + self.pending

    @property
    def total(self) -> int:
        return self.ready + len(self.held) + len(self.going)


def _idle_order(worker: Worker) -> tuple[bool, float, str]:
    """Longest idle first (unknown ``since`` first), then by name: which idle worker goes first."""
    return (worker.since is not None, worker.since.timestamp() if worker.since is not None else 0.0, worker.name)


def decide(snapshot: PoolSnapshot, now: datetime, settings: PoolSettings) -> list[Action]:
    """What to do with the warm workers of ``snapshot`` at ``now`` (tz-aware UTC), by the rules of the module
    docstring: reaps, then deletes, then creates, then retirements; each version's actions in a stable order.
    Pure; raises nothing for a well-typed snapshot."""
    if not snapshot.synced:
        return []
    reaps: list[Action] = []
    deletes: list[Action] = []
    targets = {t.version: t for t in snapshot.targets}
    pools: dict[str, _Pool] = defaultdict(_Pool)
    seen_versions: set[str] = set()
    for w in sorted(snapshot.workers, key=lambda w: (w.version, w.name)):
        seen_versions.add(w.version)
        if w.state is WorkerState.TERMINAL:
            reaps.append(Reap(w.name, w.version, "the worker is terminal and can never serve again"))
        elif w.state is WorkerState.STARTING and w.since is not None and \
                (now - w.since).total_seconds() > settings.start_timeout:
            pools[w.version].going.append(w)
            deletes.append(Delete(w.name, w.version, (
                f"the worker did not register within start_timeout {settings.start_timeout:g} s")))
        elif w.state is WorkerState.IDLE:
            pools[w.version].idle.append(w)
        elif w.state is WorkerState.STARTING:
            pools[w.version].starting.append(w)
        else:
            pools[w.version].held.append(w)
    for p in snapshot.pending:
        pools[p.version].pending += 1
        seen_versions.add(p.version)

    tenant_of_version = {t.version: t.tenant for t in snapshot.targets}

    def delete(pool: _Pool, count: int, version: str, why: str) -> None:
        # a deleted worker still counts toward every ceiling this tick: the runtime's delete is guarded (a
        # worker that took an attempt since the cache was read is kept), so its place is freed only once the
        # cache shows it gone
        for w in sorted(pool.idle, key=_idle_order)[:max(0, count)]:
            pool.idle.remove(w)
            pool.going.append(w)
            deletes.append(Delete(w.name, version, why))

    # drains: a version with no target keeps only what is busy or draining
    for version in sorted(v for v in pools if v not in targets):
        pool = pools[version]
        for w in sorted(pool.starting, key=lambda w: w.name):
            deletes.append(Delete(w.name, version, "the version has no warm target any more (drained)"))
            pool.going.append(w)
        pool.starting.clear()
        delete(pool, len(pool.idle), version, "the version has no warm target any more (drained)")

    # per target: trim idle above the buffer or above the ceiling, then what is missing
    needs: dict[str, int] = {}
    for version in sorted(targets):
        t, pool = targets[version], pools[version]
        excess = max(pool.ready - t.min_idle, pool.total - len(pool.going) - t.ceiling, 0)
        if excess:
            delete(pool, excess, version, (
                f"{pool.ready} ready and {pool.total} in all for min_idle {t.min_idle}, "
                f"max_pool_size {t.max_pool_size}"))
        needs[version] = min(max(0, t.min_idle - pool.ready), max(0, t.ceiling - pool.total))

    # tenant caps: the footprint of every version of the tenant, creates rationed in a stable order
    creates: list[Action] = []
    footprint: dict[str, int] = defaultdict(int)
    leaving: dict[str, int] = defaultdict(int)  # of the footprint, the workers deleted this tick already
    labelled: dict[str, list[tuple[bool, Worker]]] = defaultdict(list)
    for version, pool in pools.items():
        for w in pool.idle + pool.starting + pool.held + pool.going:
            tenant = w.tenant or tenant_of_version.get(version, "")
            footprint[tenant] += 1
            leaving[tenant] += w in pool.going
            if w.tenant and w in pool.idle:
                labelled[w.tenant].append((version in targets and targets[version].prewarm, w))
    for p in snapshot.pending:
        footprint[p.tenant] += 1
    cap = settings.tenant_cap
    if cap is not None:
        for tenant in sorted(footprint):
            over = footprint[tenant] - leaving[tenant] - cap
            # prewarm versions' idle workers first, then the longest idle
            for _prewarm, w in sorted(labelled.get(tenant, []), key=lambda pw: (not pw[0], _idle_order(pw[1]))):
                if over <= 0:
                    break
                pools[w.version].idle.remove(w)
                pools[w.version].going.append(w)
                deletes.append(Delete(w.name, w.version, f"tenant {tenant!r} holds {footprint[tenant]} workers, "
                                                         f"above its cap {cap}"))
                over -= 1  # the footprint keeps it until the cache shows it gone (see delete())
    for t in sorted(snapshot.targets, key=lambda t: (t.prewarm, t.dag_id, t.version)):
        want = needs.get(t.version, 0)
        if cap is not None:
            want = min(want, max(0, cap - footprint[t.tenant]))
        footprint[t.tenant] += want
        pool = pools[t.version]
        for _ in range(want):
            creates.append(Create(t.version, t.dag_id, t.tenant, t.prewarm, (
                f"{pool.ready} of min_idle {t.min_idle} ready, {pool.total} of max_pool_size {t.ceiling} in all")))

    retires: list[Action] = []
    for version in sorted(snapshot.pooled):
        if version in targets or version in seen_versions:
            continue  # a target keeps its pool; a worker of any state (or a create in flight) is still there
        retires.append(Retire(version, "no warm target, no worker and no create in flight"))
    return reaps + deletes + creates + retires
