"""In-band hand-off of held launches in the Lite zygote: which launch to fork next, and when.

The executor may hand the zygote more launches than ``[core] parallelism`` (``[leoflow] queue_ahead``). The
zygote forks at most ``limit`` agents that are *busy* (forked, not yet reported, not yet exited) and holds the
rest, first in first out. When a busy agent sends its terminal report (DESIGN §3: the slot is freed at the
terminal report) or exits, the next held launch is forked at once, in milliseconds, instead of waiting for the
scheduler's next loop (up to ``[scheduler] scheduler_idle_sleep_time``, 1 s by default), which is what a
LocalExecutor worker pulling from its queue also avoids. Pure state, no I/O: the zygote forks what the methods
return. Standard library only.

A failed fork (EAGAIN under a pids limit or systemd ``TasksMax``, ENOMEM) is an infrastructure fault, not the
task's (issue 8, hole 8): the launch whose fork failed goes back to the executor to be re-offered, and the
hand-off pauses, holding every other launch, for a bounded back-off (:func:`fork_backoff`) instead of draining
the whole queue into failed forks. Times are ``time.monotonic()`` seconds passed in by the caller.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

FORK_BACKOFF_BASE = 0.5
"""Seconds the hand-off pauses after the first failed fork in a row."""
FORK_BACKOFF_CAP = 30.0
"""Seconds the hand-off pauses at most, however many forks failed in a row."""


def fork_backoff(failures: int, *, base: float = FORK_BACKOFF_BASE, cap: float = FORK_BACKOFF_CAP) -> float:
    """Seconds to hold every launch after ``failures`` failed forks in a row: ``base`` doubled per further
    failure, never more than ``cap`` (a bounded exponential back-off, as Kubernetes' kubelet uses for a
    container that fails to start).

    :param failures: failed forks in a row, at least 1.
    :raises ValueError: when ``failures`` is below 1 or ``base``/``cap`` are not positive.
    """
    if failures < 1:
        raise ValueError(f"fork_backoff needs at least one failure, got {failures!r}")
    if base <= 0 or cap <= 0:
        raise ValueError(f"fork_backoff needs a positive base and cap, got base={base!r} cap={cap!r}")
    return min(cap, base * 2.0 ** min(failures - 1, 64))


class Handoff:
    """Held launches and busy agents of one zygote.

    :param limit: busy agents at most; ``None`` (until the executor sends a ``limit``) means no limit, every
        launch is forked on arrival.

    Launches are the executor's ``launch`` messages (dicts with a ``launch_id``); the methods return, in
    order, the ones to fork now. Every launch returned is counted busy until :meth:`freed` or
    :meth:`fork_failed` names it. While paused after a failed fork (:attr:`retry_at` set) nothing is returned
    until :meth:`due` is called at or after :attr:`retry_at`.
    """

    def __init__(self, limit: int | None = None) -> None:
        self.limit = limit
        self.held: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self.busy: set[str] = set()
        self.fork_failures = 0  # failed forks in a row; reset by the next fork that works
        self.retry_at: float | None = None  # monotonic seconds: paused until then after a failed fork

    def _ready(self) -> list[dict[str, Any]]:
        out = []
        if self.retry_at is not None:
            return out
        while self.held and (self.limit is None or len(self.busy) < self.limit):
            launch_id, message = self.held.popitem(last=False)
            self.busy.add(launch_id)
            out.append(message)
        return out

    def offer(self, message: dict[str, Any]) -> list[dict[str, Any]]:
        """A new launch arrived: hold it behind the others, then return what may be forked now."""
        self.held[message["launch_id"]] = message
        return self._ready()

    def freed(self, launch_id: str) -> list[dict[str, Any]]:
        """``launch_id``'s agent reported its terminal state or exited (either, or both, in any order), or
        its fork failed; a launch that was never busy is ignored. Return what may be forked now."""
        self.busy.discard(launch_id)
        return self._ready()

    def fork_failed(self, launch_id: str, now: float, not_tried: Sequence[dict[str, Any]] = ()) -> float:
        """``launch_id``'s fork failed (its launch goes back to the executor, which re-offers it): free its
        place and pause the hand-off for :func:`fork_backoff` seconds from ``now``; return that delay.

        :param not_tried: launches this hand-off released together with ``launch_id`` that the zygote did not
            try to fork yet; they are held again, first in the queue, in their order.
        """
        self.busy.discard(launch_id)
        for message in reversed(not_tried):
            self.busy.discard(message["launch_id"])
            self.held[message["launch_id"]] = message
            self.held.move_to_end(message["launch_id"], last=False)
        self.fork_failures += 1
        delay = fork_backoff(self.fork_failures)
        self.retry_at = now + delay
        return delay

    def forked(self) -> None:
        """A fork worked: the next failure starts the back-off from its base again."""
        self.fork_failures = 0

    def due(self, now: float) -> list[dict[str, Any]]:
        """Called by the zygote's loop: once ``now`` reaches :attr:`retry_at`, end the pause and return what
        may be forked now (the held launches get their retry); before that, or when not paused, return what
        :meth:`freed` would (nothing new while paused)."""
        if self.retry_at is not None and now >= self.retry_at:
            self.retry_at = None
        return self._ready()

    def wait_for(self, now: float) -> float | None:
        """Seconds until :meth:`due` would end the pause (0 when it is over, ``None`` when not paused or
        nothing is held): how long the zygote's loop may sleep without missing the retry."""
        if self.retry_at is None or not self.held:
            return None
        return max(0.0, self.retry_at - now)

    def set_limit(self, limit: int | None) -> list[dict[str, Any]]:
        """Change the limit (``None``: none; below 0 is taken as 0); return what may be forked now. A lower
        limit never stops a busy agent, it only holds later launches."""
        self.limit = None if limit is None else max(0, int(limit))
        return self._ready()

    def drop(self, launch_id: str) -> bool:
        """Forget a held launch (the executor revoked it before it was forked); True if it was held."""
        return self.held.pop(launch_id, None) is not None

    def retoken(self, launch_id: str, workload: str) -> bool:
        """Replace a held launch's workload (the same workload with a freshly minted token, so none waits
        long enough to expire); True if it was still held, False if it was forked already or is unknown."""
        message = self.held.get(launch_id)
        if message is None:
            return False
        message["workload"] = workload
        return True
