"""The typed result of one dispatch (seed 002 ``Disposition``; DESIGN §3 "Dispatch").

The runtime classifies WHY a dispatch did not happen, so the executor acts on a closed set instead of
runtime-specific errors.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Disposition(enum.StrEnum):
    """What happened to one workload handed to :meth:`LeoflowExecutor._process_workloads`.

    A pod that is created but can never start (an image that cannot be pulled, a container that cannot be
    configured: DESIGN's "rejected") is no dispatch result: its create answers ``dispatched``, and the
    start-rejected reaper fails its task instance after a bounded grace (:class:`~leoflow_airflow.lifecycle.
    runtime.StartState` ``REJECTED``)."""

    DISPATCHED = "dispatched"      # handed to the runtime; the attempt holds a slot
    BACKPRESSURE = "backpressure"  # the cluster said not now (ResourceQuota 403, APF 429): re-offer, never fail
    DEFERRED = "deferred"          # nothing happened (local queue full, client rate limit): re-offer
    REFUSED = "refused"            # can never run here: fail at once with the reason
    STALE = "stale"                # the pre-launch guard found Airflow moved on: drop silently


@dataclass(frozen=True)
class DispatchResult:
    """A :class:`Disposition` plus a short operator-facing reason (empty for ``dispatched``)."""

    disposition: Disposition
    reason: str = ""
