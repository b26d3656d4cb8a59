"""The settling gate (DESIGN §3 "Reap"): reapers act only after one full reconcile sweep has completed and a
grace period has elapsed since start or adoption, so nothing is reaped from a half-built picture."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SettlingGate:
    """Opens once :meth:`swept` was called after the last :meth:`reset` and ``grace`` seconds have passed.

    :param grace: seconds after start/adoption before any reaper may act.
    """

    grace: float
    since: float = 0.0
    sweeps: int = 0

    def reset(self, now: float) -> None:
        """Close the gate (at start, after adoption). ``now`` is ``time.monotonic()`` seconds."""
        self.since = now
        self.sweeps = 0

    def swept(self) -> None:
        """Record one completed full reconcile sweep."""
        self.sweeps += 1

    def is_open(self, now: float) -> bool:
        """True when at least one sweep completed and ``grace`` seconds passed since the last reset."""
        return self.sweeps > 0 and now - self.since >= self.grace
