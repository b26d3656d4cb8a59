"""Create expectations for warm workers (issue 11 item 1: "a lagging cache never pushes a pool past its caps";
seed 002's ``WarmPodCache``, the ``ControllerExpectations`` idea of Kubernetes' ReplicaSet controller).

A runtime's view of its warm workers lags its own creates: a pod created a moment ago is not in the informer's
cache yet, a Lite worker forked a moment ago has not said hello. Without bookkeeping the next tick would see the
pool short and create again, past ``max_pool_size`` and the tenant cap. So every create is an **expectation**
from the moment it is asked for until the cache shows the worker (or the create fails, or ``ttl`` seconds
pass): :meth:`Expectations.pending` lists them for :func:`leoflow_airflow.warm.pool.decide`, which counts each
as a ready worker of its version and toward its tenant's cap.

An expectation that times out (the cache never showed the worker: a lost watch event, a create that did happen
although the call failed) is dropped and counted once in :attr:`Expectations.expired`, so the caller can
re-read its cache from the source (a fresh LIST) before it trusts it again.

Pure state, no I/O; times are ``time.monotonic()`` seconds passed in by the caller.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Iterable

from leoflow_airflow.warm.pool import Pending

__all__ = ["Expectations"]


@dataclass
class _Expectation:
    version: str
    tenant: str
    since: float
    name: str | None = None  # known once the create returned it


class Expectations:
    """The creates in flight of one runtime's warm workers.

    :param ttl: seconds an expectation stays open without its worker showing in the cache (from the create's
        start); must be greater than 0.
    :raises ValueError: ``ttl`` not greater than 0.
    """

    def __init__(self, ttl: float) -> None:
        if not ttl > 0:
            raise ValueError(f"ttl must be greater than 0, got {ttl}")
        self.ttl = float(ttl)
        self._open: dict[int, _Expectation] = {}
        self._tickets = itertools.count(1)
        self.expired = 0
        """Expectations dropped by :meth:`pending` because ``ttl`` passed (a running count)."""

    def begin(self, version: str, tenant: str, now: float) -> int:
        """A create for ``version`` (of ``tenant``) is about to be asked for; returns its ticket for
        :meth:`created` or :meth:`failed`."""
        ticket = next(self._tickets)
        self._open[ticket] = _Expectation(version, tenant, now)
        return ticket

    def created(self, ticket: int, name: str) -> None:
        """The create of ``ticket`` returned the worker ``name``: the expectation is now met when the cache
        shows that name (:meth:`observe`). An unknown ticket (already met, expired) is ignored."""
        exp = self._open.get(ticket)
        if exp is not None:
            exp.name = name

    def failed(self, ticket: int) -> None:
        """The create of ``ticket`` failed (nothing was made): the expectation goes. Unknown tickets are
        ignored."""
        self._open.pop(ticket, None)

    def observe(self, names: Iterable[str]) -> int:
        """The cache shows the workers ``names`` (any state, terminal too): their expectations are met and
        go. Returns how many were met."""
        seen = set(names)
        met = [t for t, e in self._open.items() if e.name is not None and e.name in seen]
        for ticket in met:
            del self._open[ticket]
        return len(met)

    def pending(self, now: float) -> tuple[Pending, ...]:
        """The open expectations at ``now`` as :class:`~leoflow_airflow.warm.pool.Pending` rows, oldest first;
        those older than ``ttl`` are dropped first and counted in :attr:`expired`."""
        stale = [t for t, e in self._open.items() if now - e.since > self.ttl]
        for ticket in stale:
            del self._open[ticket]
        self.expired += len(stale)
        return tuple(Pending(e.version, e.tenant) for _, e in sorted(self._open.items()))

    def __len__(self) -> int:
        return len(self._open)
