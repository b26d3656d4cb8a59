"""In-band hand-off of held launches in the Lite zygote: which launch to fork next, and when.

The executor may hand the zygote more launches than ``[core] parallelism`` (``[leoflow] queue_ahead``). The
zygote forks at most ``limit`` agents that are *busy* (forked, not yet reported, not yet exited) and holds the
rest, first in first out. When a busy agent sends its terminal report (DESIGN §3: the slot is freed at the
terminal report) or exits, the next held launch is forked at once, in milliseconds, instead of waiting for the
scheduler's next loop (up to ``[scheduler] scheduler_idle_sleep_time``, 1 s by default), which is what a
LocalExecutor worker pulling from its queue also avoids. Pure state, no I/O: the zygote forks what the methods
return. Standard library only.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any


class Handoff:
    """Held launches and busy agents of one zygote.

    :param limit: busy agents at most; ``None`` (until the executor sends a ``limit``) means no limit, every
        launch is forked on arrival.

    Launches are the executor's ``launch`` messages (dicts with a ``launch_id``); the methods return, in
    order, the ones to fork now. Every launch returned is counted busy until :meth:`freed` names it.
    """

    def __init__(self, limit: int | None = None) -> None:
        self.limit = limit
        self.held: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self.busy: set[str] = set()

    def _ready(self) -> list[dict[str, Any]]:
        out = []
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
