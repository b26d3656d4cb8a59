"""TEST ONLY: which fault point (DESIGN §3 "Fault injection") one attempt's agent is killed at."""

from __future__ import annotations

import json
import logging
from typing import Any

from leoflow_agent.protocol import FAULT_POINTS

log = logging.getLogger(__name__)


def fault_for(ti: Any, attempt_epoch: int, *, plan_path: str) -> str | None:
    """The fault point for attempt ``attempt_epoch`` of ``ti`` (an ``ExecuteTask.ti``): from the JSON file
    ``plan_path`` (``[leoflow] test_fault_plan``, key ``dag_id/run_id/task_id/try_number/attempt_epoch``,
    read at each call) or the task's ``executor_config={"leoflow": {"fault": ...}}`` (first epoch only).
    ``None`` when neither names a point of ``FAULT_POINTS``; an unreadable plan counts as empty."""
    fault = None
    if plan_path:
        try:
            with open(plan_path) as fh:
                plan = json.load(fh)
        except (OSError, ValueError):
            plan = {}
        key = f"{ti.dag_id}/{ti.run_id}/{ti.task_id}/{ti.try_number}/{attempt_epoch}"
        fault = plan.get(key) if isinstance(plan, dict) else None
    if fault is None and attempt_epoch == 1:
        config = getattr(ti, "executor_config", None) or {}
        fault = (config.get("leoflow") or {}).get("fault") if isinstance(config, dict) else None
    if fault is not None:
        log.warning("TEST fault injection: attempt %s/%s epoch %d will be killed at %s",
                    ti.dag_id, ti.task_id, attempt_epoch, fault)
    return fault if fault in FAULT_POINTS else None
