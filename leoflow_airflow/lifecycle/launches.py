"""Which launch holds which Airflow slot (DESIGN §3 "Slots"), in memory. Pure bookkeeping, no I/O.

Slots are accounted per attempt ``(ti_id, try_number, attempt_epoch)``: Airflow's ``running`` holds the key of
the launch that owns the key's slot plus an ``AttemptRef`` for every other attempt still alive (one being
killed), so two epochs of one key never share a slot. A slot is freed in one place, :meth:`LaunchTable.free`,
on the first of the terminal report, the exit, or the close.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from leoflow_airflow.ledger.states import AttemptRef
from leoflow_airflow.lifecycle.actions import Release, SchedulerAction


@dataclass
class Launch:
    """One launch the lifecycle knows. ``workload`` is None for an attempt adopted from a predecessor;
    ``launched_at`` is ``monotonic()`` seconds at its ``Started`` (None before); ``adopted``: a predecessor
    scheduler started it."""

    key: Any
    workload: Any
    ref: AttemptRef | None  # None for callbacks
    launched_at: float | None = None
    exited: bool = False
    adopted: bool = False


class LaunchTable:
    """launch id -> :class:`Launch`, and key -> the launch id owning its slot."""

    def __init__(self) -> None:
        self.launches: dict[str, Launch] = {}
        self.owner: dict[Any, str] = {}

    def add(self, launch_id: str, launch: Launch, *, owns_slot: bool = True) -> None:
        """Remember ``launch``; ``owns_slot``: its key's slot is now held by it."""
        self.launches[launch_id] = launch
        if owns_slot:
            self.owner[launch.key] = launch_id

    def get(self, launch_id: str) -> Launch | None:
        """The launch, or None."""
        return self.launches.get(launch_id)

    def holders(self) -> list[Launch]:
        """The launches that own their key's slot right now."""
        return [launch for lid, launch in self.launches.items() if self.owner.get(launch.key) == lid]

    def free(self, launch_id: str, launch: Launch, now: float) -> tuple[list[SchedulerAction], float | None]:
        """Free ``launch``'s slot if it holds it; the actions for Airflow's ``running`` and the seconds the slot
        was held since ``Started`` (None when it was not held or never started)."""
        actions: list[SchedulerAction] = []
        held_for = None
        if self.owner.get(launch.key) == launch_id:
            del self.owner[launch.key]
            actions.append(Release(launch.key))
            if launch.launched_at is not None:
                held_for = now - launch.launched_at
        if launch.ref is not None:
            actions.append(Release(launch.ref))
        return actions, held_for

    def pop(self, launch_id: str) -> Launch | None:
        """Forget a launch (its slot must be freed first)."""
        return self.launches.pop(launch_id, None)
