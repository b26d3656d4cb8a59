"""How many workloads the executor may accept beyond its free slots right now: the queue-ahead depth.

Held workloads are task instances in Airflow's QUEUED state. Airflow's stuck-in-queued handling (``[scheduler]
task_queued_timeout``, 600 s by default) revokes, re-schedules and finally fails a task instance that stays
QUEUED too long, and it does so for any executor that implements ``revoke_task``, as leoflow does
(LocalExecutor does not, so its unbounded queue ahead is never revoked). So the depth adapts to how long
attempts take: a held workload should expect to start within ``horizon`` seconds. With ``parallelism`` slots
and attempts of ``d`` seconds, a slot frees every ``d / parallelism`` seconds, so the depth is
``min(cap, floor(horizon * parallelism / d))``. ``d`` is the larger of two figures: the recent attempt
duration (an exponential moving average of finished attempts) and the mean age of the attempts running now,
so a run of long tasks after short ones empties the queue-ahead at once. Before the first attempt
finishes, the depth is one slot's worth (``min(cap, parallelism)``), lowered as the first attempts age. At
scheduler start, then, up to ``parallelism`` workloads can be held QUEUED for one attempt's length. Short
tasks get a deep queue and start in-band the moment a slot frees. Long tasks get none, so they wait in SCHEDULED, where no timeout applies.
Pure: the caller passes durations and ages in seconds.
"""

from __future__ import annotations

import math
from collections.abc import Iterable


class QueueAhead:
    """The adaptive queue-ahead depth.

    :param cap: the most workloads ever held ahead (``[leoflow] queue_ahead``); 0 disables queueing ahead.
    :param horizon: seconds a held workload may expect to wait for a slot; keep it well under ``[scheduler]
        task_queued_timeout`` (the executor uses ``min(60, task_queued_timeout / 10)``).
    :param smoothing: weight of the newest duration in the moving average (0 < smoothing <= 1).
    :raises ValueError: for a negative ``cap``, a ``horizon`` that is not positive, or a bad ``smoothing``.
    """

    def __init__(self, cap: int, horizon: float, smoothing: float = 0.2) -> None:
        if cap < 0:
            raise ValueError(f"cap must be 0 or more, got {cap}")
        if not horizon > 0:
            raise ValueError(f"horizon must be positive, got {horizon}")
        if not 0 < smoothing <= 1:
            raise ValueError(f"smoothing must be in (0, 1], got {smoothing}")
        self.cap = cap
        self.horizon = horizon
        self.smoothing = smoothing
        self.duration: float | None = None  # moving average of finished attempts, seconds

    def finished(self, duration: float) -> None:
        """An attempt held its slot for ``duration`` seconds (from its fork to its terminal report)."""
        duration = max(0.0, float(duration))
        if self.duration is None:
            self.duration = duration
        else:
            self.duration += self.smoothing * (duration - self.duration)

    def depth(self, parallelism: int, running_ages: Iterable[float] = ()) -> int:
        """Workloads that may be held ahead: ``min(cap, floor(horizon * parallelism / d))``; 0 for ``cap`` 0
        or ``parallelism`` below 1. Before any attempt has finished (cold start) it is ``min(cap,
        parallelism)``, lowered by the age of the attempts running: a burst of short tasks at scheduler
        start is held ahead at once, and if the first attempts turn out to be long, nothing more is.

        :param parallelism: the executor's slots.
        :param running_ages: seconds each attempt running now has held its slot.
        """
        if self.cap == 0 or parallelism < 1:
            return 0
        ages = list(running_ages)
        mean_age = sum(ages) / len(ages) if ages else 0.0
        if self.duration is None:  # cold start: one slot's worth, less as the first attempts age
            cold = min(self.cap, parallelism)
            return cold if mean_age <= 0 else min(cold, math.floor(self.horizon * parallelism / mean_age))
        d = max(self.duration, mean_age, 1e-3)
        return min(self.cap, math.floor(self.horizon * parallelism / d))


def retoken_due(held: Iterable[tuple[str, float]], now: float, after: float) -> list[str]:
    """Launch ids whose workload token should be re-minted: those in ``held`` (``(launch_id, handed_at)``
    pairs of task launches the zygote has not forked yet; ``time.monotonic()`` seconds) handed over
    ``after`` seconds or more before ``now``. The executor uses ``after = min(60, task_queued_timeout / 4)``:
    a workload token lives ``task_queued_timeout`` seconds, so a held launch never holds an expired one."""
    return [launch_id for launch_id, handed_at in held if now - handed_at >= after]
