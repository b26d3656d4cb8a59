"""More than one scheduler (issue 8 hole 14): which host an attempt runs on, and when another host's may be
acted on.

Every attempt is stamped at claim with ``<hostname>/<boot id>`` (``leoflow_attempt.host``, ledger revision
0003). A pid means something only on the host (and boot) that recorded it, so the Lite runtime answers UNKNOWN
for another host's attempt: the lifecycle neither settles, re-drives, kills nor reaps it by process checks. It
is acted on only after heartbeat silence (:func:`decide_foreign`): its TI's heartbeat silent past ``[leoflow]
agent_lost_threshold`` *and* its owner scheduler job not alive (Airflow's ``Job`` row, as
``SchedulerJobRunner.adopt_or_reset_orphaned_tasks`` judges it). Otherwise Airflow's own adoption hands a dead
scheduler's TIs to a survivor. Rows without a stamp (written before revision 0003) count as this host's.

:func:`decide_foreign` is pure; :func:`this_host` reads ``/proc`` once per process.
"""

from __future__ import annotations

import functools
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from leoflow_airflow.ledger.states import AttemptRef

__all__ = ["BOOT_ID_PATH", "ForeignView", "SettleForeign", "decide_foreign", "is_foreign", "this_host"]

BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"
"""Linux's random id of the current boot (a reboot makes every recorded pid meaningless too)."""


@functools.cache
def _real_host() -> str:
    try:
        with open(BOOT_ID_PATH) as fh:
            boot_id = fh.read().strip()
    except OSError:
        boot_id = "unknown-boot"
    return f"{socket.gethostname()}/{boot_id}"


def this_host(override: str | None = None) -> str:
    """``<hostname>/<boot id>`` of this machine's current boot (e.g. ``node-1/4f0c…``), the value stamped on
    every attempt this scheduler claims. ``override`` (TEST ONLY: ``[leoflow] test_host``, honoured only with
    ``test_fault_injection``) replaces it when non-empty, to simulate a second host on one machine.
    Never raises: without ``/proc`` the boot id reads ``unknown-boot``."""
    return override or _real_host()


def is_foreign(attempt_host: str | None, here: str | None) -> bool:
    """True when an attempt stamped ``attempt_host`` runs on another host (or boot) than ``here``. An
    unstamped row (``None``, written before ledger revision 0003) is this host's; a runtime that stamps
    nothing (``here`` None) judges every row as its own."""
    return attempt_host is not None and here is not None and attempt_host != here


@dataclass(frozen=True, slots=True)
class ForeignView:
    """One open attempt of another host, as :func:`decide_foreign` sees it.

    :param ti_state: Airflow's state of that exact ``ti_id`` (None when the row is gone).
    :param last_heartbeat_at: its ``last_heartbeat_at`` (tz-aware UTC) or None.
    :param owner_alive: whether the attempt's ``scheduler_job_id`` names a ``Job`` Airflow deems alive
        (state running, heartbeat within ``[scheduler] scheduler_health_check_threshold``); False for no job.
    """

    ref: AttemptRef
    ti_state: str | None
    last_heartbeat_at: datetime | None
    owner_alive: bool


@dataclass(frozen=True, slots=True)
class SettleForeign:
    """Settle this attempt from DB-only evidence (its record, if any, is on the other host): move it to
    EXITED so the reconciler's table runs (no record and TI RUNNING: infra re-drive on the budget)."""

    ref: AttemptRef
    why: str


def decide_foreign(views: Sequence[ForeignView], now: datetime, agent_lost_threshold: float) -> list[SettleForeign]:
    """The other hosts' attempts that may be settled here: TI RUNNING, its heartbeat silent for more than
    ``agent_lost_threshold`` seconds, and its owner scheduler job not alive. Pure; ``now`` is tz-aware UTC.

    Everything else is left alone: a live owner reaps its own agents (DESIGN §3 "Reap"); a TI that is not
    RUNNING (queued, moved on) is Airflow's to time out or adopt.
    """
    out: list[SettleForeign] = []
    for view in views:
        if view.owner_alive or view.ti_state != "running" or view.last_heartbeat_at is None:
            continue
        silent = (now - view.last_heartbeat_at).total_seconds()
        if silent > agent_lost_threshold:
            out.append(SettleForeign(view.ref, f"another host's attempt: heartbeat silent for {silent:.0f} s "
                                               f"(> agent_lost_threshold {agent_lost_threshold:g} s) and its "
                                               f"scheduler job is not alive"))
    return out
