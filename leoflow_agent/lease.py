"""The agent's lease on its task (DESIGN §2 "proof of death"; k8s review §14): a task pod whose agent cannot
reach the Execution API for ``[leoflow] agent_lease_seconds`` kills its own task and exits.

Why: the scheduler re-runs an attempt whose pod it cannot confirm ended once the task instance's heartbeat has
been silent past ``[leoflow] agent_lost_threshold`` (the confirmation valve, PodGC's ``Failed`` on a lost node).
A silent heartbeat proves nothing about a body cut off from the API server: a partitioned node runs it on. The
lease makes the body's end follow from the silence: an agent that heard no answer from the API server for the
lease kills its task's process groups (SIGTERM, then SIGKILL after ``[core] killed_task_cleanup_time``), so by
``lease + cleanup`` seconds after the last answer nothing of the attempt runs. The boot ladder keeps that sum
below ``agent_lost_threshold`` (``leoflow_airflow.ladder``, rung ``agent_lease``).

What counts as an answer: any HTTP response the server sent with a status below 500 (2xx, and 4xx too: the
server is there and judged the request). Transport errors (no connection, a timeout) and 5xx (a proxy's 502/503
while the API server is away, or the API server failing) are no answer.

Only task pods (cold and warm) take a lease. Lite does not: the scheduler proves a death there by pid on the same
machine, and a long api-server outage must not kill healthy bodies.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable

__all__ = ["EXIT_LEASE_EXPIRED", "LeaseWatchdog", "child_process_groups", "exit_now", "reachable"]

log = logging.getLogger(__name__)

CHECK_INTERVAL_SECONDS = 1.0
"""How often the watchdog thread compares the time since the last answer with the lease, at most."""
KILL_POLL_SECONDS = 0.05
"""How often the kill checks whether a signalled process group is gone, in seconds."""


EXIT_LEASE_EXPIRED = 5
"""The agent's exit code after its lease expired and it killed its task (``podmain.EXIT_CODES``)."""


def exit_now(why: str) -> None:
    """End this agent process at once with :data:`EXIT_LEASE_EXPIRED` (``os._exit``: the supervisor is blocked
    on an API server that does not answer, and its task is dead already); the logs are flushed first."""
    for handler in logging.getLogger().handlers:
        try:
            handler.flush()
        except Exception:  # noqa: BLE001 - exiting anyway
            pass
    os._exit(EXIT_LEASE_EXPIRED)


def reachable(status_code: int) -> bool:
    """Whether an HTTP answer with ``status_code`` proves the Execution API reachable: any status below 500
    (2xx, 3xx, 4xx: the server answered and judged the request). A 5xx does not (a proxy answering for an API
    server that is away, or an API server that cannot work). Pure."""
    return status_code < 500


def child_process_groups(pid: int | None = None) -> list[int]:
    """The process groups of ``pid``'s (default: this process's) children other than its own group: where the
    Task SDK supervisor puts each task process (``new_process_group``), so a ``killpg`` reaches what the task
    started too. A child still in our own group is named by its negative pid (signal it alone, never our group).
    Read from ``/proc`` (:func:`leoflow_agent.proc.children`); a child that vanished meanwhile is left out."""
    from leoflow_agent import proc

    me = os.getpid() if pid is None else pid
    own = os.getpgid(me)
    groups: list[int] = []
    for child in proc.children(me):
        try:
            group = os.getpgid(child)
        except OSError:
            continue
        target = group if group != own else -child
        if target not in groups:
            groups.append(target)
    return groups


def _signal(target: int, sig: int) -> bool:
    """Send ``sig`` to process group ``target`` (> 0) or to the single process ``-target``; False when none is
    left (or it is not ours to signal)."""
    try:
        if target > 0:
            os.killpg(target, sig)
        else:
            os.kill(-target, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


class LeaseWatchdog:
    """Kills the attempt's task when the Execution API stayed unreachable for ``lease`` seconds.

    The transport tells it every answer (:meth:`answered`, from ``RecordingTransport.handle_request``); a thread
    (:meth:`start`) or the caller (:meth:`check`) compares the time since the last reachable answer, or since the
    watchdog was made, with ``lease``. At expiry, once: ``on_expired(why)`` (the transport marks the attempt
    ``heartbeat_lost``: its record is written unless a terminal one is kept, later reports are refused), then
    SIGTERM to every process group ``targets()`` names, then, after ``cleanup`` seconds for those still
    alive, SIGKILL, then ``exit(why)`` (the agent ends; default: nothing, the caller decides).

    :param lease: seconds (> 0): ``[leoflow] agent_lease_seconds``.
    :param cleanup: seconds (>= 0) between SIGTERM and SIGKILL: ``[core] killed_task_cleanup_time``.
    :param targets: ``targets() -> [group]`` (:func:`child_process_groups`: > 0 a process group, < 0 one pid).
    :param on_expired: called with a one-line reason before the kill; must not raise (what it raises is
        logged and the kill goes on).
    :param exit: called with the reason after the kill (``podmain``: ``os._exit``).
    :param clock: ``monotonic()`` seconds of the lease (injected by tests).
    :raises ValueError: ``lease`` not > 0 or ``cleanup`` < 0.
    """

    def __init__(self, lease: float, *, cleanup: float, targets: Callable[[], Iterable[int]] = child_process_groups,
                 on_expired: Callable[[str], None] = lambda why: None, exit: Callable[[str], None] = lambda why: None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not lease > 0:
            raise ValueError(f"the agent's lease must be > 0 seconds, got {lease!r}")
        if not cleanup >= 0:
            raise ValueError(f"the kill's cleanup time must be >= 0 seconds, got {cleanup!r}")
        self.lease, self.cleanup = float(lease), float(cleanup)
        self._targets, self._on_expired, self._exit, self._clock = targets, on_expired, exit, clock
        self._last = clock()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.expired: str | None = None
        """The reason once the lease expired (the kill was started), else None."""

    def answered(self, status_code: int) -> None:
        """Note one HTTP answer of the Execution API; a reachable one (:func:`reachable`) renews the lease."""
        if reachable(status_code):
            with self._lock:
                self._last = self._clock()

    def silent_for(self) -> float:
        """Seconds since the last reachable answer (or since the watchdog was made)."""
        with self._lock:
            return self._clock() - self._last

    def check(self) -> bool:
        """Expire the lease when it ran out (:meth:`expire`); True once it has expired (now or before)."""
        if self.expired is None and self.silent_for() >= self.lease:
            self.expire(f"the Execution API gave no answer for {self.silent_for():.0f} s (lease [leoflow] "
                        f"agent_lease_seconds = {self.lease:g} s)")
        return self.expired is not None

    def expire(self, why: str) -> None:
        """Do the expiry once (class docstring): ``on_expired``, SIGTERM, SIGKILL after ``cleanup``, ``exit``."""
        if self.expired is not None:
            return
        self.expired = why
        log.error("leoflow agent: %s; killing the task (SIGTERM, then SIGKILL after %g s) so that the scheduler's "
                  "re-run cannot run beside it", why, self.cleanup)
        try:
            self._on_expired(why)
        except Exception:  # noqa: BLE001 - the kill must happen whatever the record's fate
            log.exception("leoflow agent: marking the attempt heartbeat_lost failed")
        self.kill()
        self._exit(why)

    def kill(self) -> None:
        """SIGTERM every target group, wait up to ``cleanup`` seconds (real time) for them to go, SIGKILL the
        rest. Never raises for a group that is gone."""
        targets = list(self._targets())
        alive = [t for t in targets if _signal(t, signal.SIGTERM)]
        deadline = time.monotonic() + self.cleanup
        while alive and time.monotonic() < deadline:
            time.sleep(KILL_POLL_SECONDS)
            alive = [t for t in alive if _signal(t, 0)]
        for target in alive:
            if _signal(target, signal.SIGKILL):
                log.warning("leoflow agent: %s %d outlived SIGTERM by %g s; SIGKILLed",
                            "process group" if target > 0 else "process", abs(target), self.cleanup)

    def start(self) -> LeaseWatchdog:
        """Start the watchdog thread (daemon): :meth:`check` every :data:`CHECK_INTERVAL_SECONDS` until
        :meth:`stop` or expiry. Returns self."""
        def run() -> None:
            while not self._stop.wait(min(CHECK_INTERVAL_SECONDS, self.lease)):
                if self.check():
                    return

        self._thread = threading.Thread(target=run, name="leoflow-agent-lease", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread (the attempt is over). An expiry under way is waited for (at most ``cleanup`` + 5
        seconds), so the agent ends the way the expiry says (``exit``), not as if the supervisor had returned."""
        self._stop.set()
        thread = self._thread
        if thread is not None and self.expired is not None and thread is not threading.current_thread():
            thread.join(self.cleanup + 5)
