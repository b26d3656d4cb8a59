"""The Kubernetes runtime's table of the attempts it created or adopted, indexed for a scheduler loop whose cost
follows what changed, not how many pods run (issue 10, "Benchmark").

:class:`PodLaunches` maps a launch id to its :class:`PodLaunch` like a dict, and keeps beside it what
``KubernetesRuntime.poll()`` and ``admit()`` ask every loop: the launch of a pod name or UID, the number of creates
in flight, the launches not looked at since their UID was learnt, and a round-robin turn over all of them (the
safety net that finds an end no watch event announced). Each of those answers costs what it returns, not the
table's size. Scheduler thread only (no lock).
"""

from __future__ import annotations

import collections
import itertools
from collections.abc import Iterable, Iterator, MutableMapping
from dataclasses import dataclass

from leoflow_airflow.ledger.states import AttemptRef

__all__ = ["PodLaunch", "PodLaunches"]


@dataclass
class PodLaunch:
    """What the runtime remembers of one attempt it created or adopted (in memory, scheduler thread only).

    Change ``uid`` and ``creating`` through :meth:`PodLaunches.created` (the table's indexes follow them); the
    other flags are the runtime's own."""

    ref: AttemptRef
    name: str
    uid: str | None = None
    creating: bool = False  # its create is on the pool
    cancelled: bool = False  # killed while its create was on the pool: delete the pod as soon as it exists
    exited: bool = False  # ``Exited`` was reported
    warned: bool = False  # its agent container's stuck waiting reason was logged
    polled: bool = False  # poll() looked at it since its UID was known (events before that were not its)


class PodLaunches(MutableMapping[str, PodLaunch]):
    """``launch id -> PodLaunch``, in insertion order, with the indexes :meth:`to_poll` and :attr:`creating`
    answer from. A launch stored under an id replaces the one before (its index entries with it)."""

    def __init__(self) -> None:
        self._by_id: dict[str, PodLaunch] = {}
        self._seq: dict[str, int] = {}  # launch id -> insertion number (the order poll() reports in)
        self._by_name: dict[str, str] = {}
        self._by_uid: dict[str, str] = {}
        self._creating: set[str] = set()
        self._fresh: set[str] = set()  # stored or given a UID since poll() last looked at them
        self._turn: collections.deque[str] = collections.deque()  # round-robin; ids of removed launches linger
        self._count = itertools.count()

    # --- the mapping -----------------------------------------------------------------------------------
    def __getitem__(self, launch_id: str) -> PodLaunch:
        return self._by_id[launch_id]

    def __setitem__(self, launch_id: str, launch: PodLaunch) -> None:
        if launch_id in self._by_id:
            self._unindex(launch_id, self._by_id[launch_id])
        else:
            self._turn.append(launch_id)
        self._by_id[launch_id] = launch
        self._seq[launch_id] = next(self._count)
        self._by_name[launch.name] = launch_id
        if launch.uid is not None:
            self._by_uid[launch.uid] = launch_id
        if launch.creating:
            self._creating.add(launch_id)
        self._fresh.add(launch_id)

    def __delitem__(self, launch_id: str) -> None:
        launch = self._by_id.pop(launch_id)
        self._seq.pop(launch_id, None)
        self._unindex(launch_id, launch)

    def get(self, launch_id: str, default: PodLaunch | None = None) -> PodLaunch | None:  # type: ignore[override]
        """The launch of ``launch_id``, or ``default`` (a dict's lookup: the scheduler loop asks it per attempt)."""
        return self._by_id.get(launch_id, default)

    def __contains__(self, launch_id: object) -> bool:
        return launch_id in self._by_id

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_id)

    def __len__(self) -> int:
        return len(self._by_id)

    def _unindex(self, launch_id: str, launch: PodLaunch) -> None:
        if self._by_name.get(launch.name) == launch_id:
            del self._by_name[launch.name]
        if launch.uid is not None and self._by_uid.get(launch.uid) == launch_id:
            del self._by_uid[launch.uid]
        self._creating.discard(launch_id)
        self._fresh.discard(launch_id)

    # --- the indexes -----------------------------------------------------------------------------------
    @property
    def creating(self) -> int:
        """How many launches have their create on the pool."""
        return len(self._creating)

    def created(self, launch_id: str, uid: str) -> PodLaunch:
        """The create of ``launch_id`` answered with pod UID ``uid``: ``creating`` turns False, ``uid`` is set and
        the launch is due at the next :meth:`to_poll`. Raises ``KeyError`` for an unknown id."""
        launch = self._by_id[launch_id]
        launch.creating = False
        self._creating.discard(launch_id)
        launch.uid = uid
        self._by_uid[uid] = launch_id
        launch.polled = False
        self._fresh.add(launch_id)
        return launch

    def create_failed(self, launch_id: str) -> None:
        """The create of ``launch_id`` failed: the launch is dropped (a no-op for an unknown id)."""
        self.pop(launch_id, None)

    def to_poll(self, changed: set[str] | None, names: Iterable[str], uids: Iterable[str],
                page: int) -> list[tuple[str, PodLaunch]]:
        """The launches to look at now, in insertion order, each with a UID, not exited and no create in flight:
        every one when ``changed`` is None (a LIST: any pod may have changed); else those whose pod name is in
        ``changed`` or ``names``, whose UID is in ``uids``, those stored or given a UID and not looked at since
        (``polled`` False), and the next ``page`` of the table in round-robin turn, so every launch is
        returned within ``ceil(len / page)`` calls whatever ``changed`` says. Costs what it returns plus
        ``page``, not ``len(self)``. Raises ``ValueError`` for ``page`` below 1."""
        if page < 1:
            raise ValueError(f"page must be >= 1, got {page}")
        if changed is None:
            wanted: Iterable[str] = list(self._by_id)
        else:
            picked = {self._by_name[n] for n in itertools.chain(changed, names) if n in self._by_name}
            picked.update(self._by_uid[u] for u in uids if u in self._by_uid)
            for lid in list(self._fresh):
                if self._by_id[lid].polled:
                    self._fresh.discard(lid)  # looked at already (stored as polled): nothing new to see
                else:
                    picked.add(lid)
            picked.update(self._take_turn(page))
            wanted = sorted(picked, key=self._seq.__getitem__)
        out = []
        for lid in wanted:
            launch = self._by_id[lid]
            if launch.creating or launch.uid is None:
                continue  # fresh until its create answers
            self._fresh.discard(lid)
            if not launch.exited:
                out.append((lid, launch))
        return out

    def _take_turn(self, page: int) -> set[str]:
        """The next ``page`` launch ids of the round-robin turn (ids of removed launches are dropped as met)."""
        out: set[str] = set()
        for _ in range(len(self._turn)):
            if len(out) >= page:
                break
            lid = self._turn.popleft()
            if lid in self._by_id and lid not in out:  # a re-stored id may stand twice: kept once
                out.add(lid)
                self._turn.append(lid)
        return out
