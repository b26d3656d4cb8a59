"""STUB (wip/kruntime): a minimal stand-in for wip/kinformer's ``status.py`` so the runtime can run before theirs
lands; the lead merges theirs over this one. Same interface: :class:`PodView` of a pod's JSON (pure) and the
:class:`~leoflow_airflow.lifecycle.runtime.Evidence` it holds."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from leoflow_agent import outcome
from leoflow_airflow.ledger.states import AttemptRef
from leoflow_airflow.lifecycle.runtime import Evidence
from leoflow_airflow.runtime.kubernetes.identity import IDENTITY_ANNOTATION, parse_identity_annotation

__all__ = ["ContainerEnd", "PodView", "describe_end", "pod_evidence", "pod_view"]

AGENT_CONTAINER = "base"


@dataclass(frozen=True, slots=True)
class ContainerEnd:
    """The agent container's ``state.terminated``: exit code, reason, termination message."""

    exit_code: int | None
    reason: str | None
    message: str | None


@dataclass(frozen=True, slots=True)
class PodView:
    """What leoflow reads of one pod (timestamps are the API's RFC 3339 strings)."""

    name: str
    uid: str
    namespace: str
    ref: AttemptRef | None
    phase: str | None
    deleting: bool
    node_name: str | None
    reason: str | None
    disruption: str | None
    agent: ContainerEnd | None
    waiting_reason: str | None
    waiting_message: str | None
    started_at: str | None
    finished_at: str | None
    resource_version: str | None

    @property
    def terminal(self) -> bool:
        """Succeeded or Failed: nothing of the pod runs any more."""
        return self.phase in ("Succeeded", "Failed")


def pod_view(obj: Mapping[str, Any]) -> PodView | None:
    """The view of a pod's JSON object (camelCase, as the API serves it), or None when it has no name/uid."""
    meta = obj.get("metadata") or {}
    status = obj.get("status") or {}
    spec = obj.get("spec") or {}
    if not meta.get("name") or not meta.get("uid"):
        return None
    agent = waiting_reason = waiting_message = started = finished = None
    for cs in status.get("containerStatuses") or []:
        if cs.get("name") != AGENT_CONTAINER:
            continue
        state = cs.get("state") or {}
        if term := state.get("terminated"):
            agent = ContainerEnd(term.get("exitCode"), term.get("reason"), term.get("message"))
            started, finished = term.get("startedAt"), term.get("finishedAt")
        if wait := state.get("waiting"):
            waiting_reason, waiting_message = wait.get("reason"), wait.get("message")
        if run := state.get("running"):
            started = run.get("startedAt")
    disruption = next((c.get("reason") for c in status.get("conditions") or []
                       if c.get("type") == "DisruptionTarget" and c.get("status") == "True"), None)
    return PodView(
        name=meta["name"], uid=meta["uid"], namespace=meta.get("namespace") or "",
        ref=parse_identity_annotation((meta.get("annotations") or {}).get(IDENTITY_ANNOTATION)),
        phase=status.get("phase"), deleting=bool(meta.get("deletionTimestamp")), node_name=spec.get("nodeName"),
        reason=status.get("reason"), disruption=disruption, agent=agent, waiting_reason=waiting_reason,
        waiting_message=waiting_message, started_at=started, finished_at=finished,
        resource_version=meta.get("resourceVersion"),
    )


def pod_evidence(view: PodView | None, expect: outcome.AttemptIdentity) -> Evidence:
    """The record in the agent container's termination message, decoded against ``expect``, and its exit code."""
    if view is None or view.agent is None:
        return Evidence(None, None)
    return Evidence(outcome.decode(view.agent.message, expect=expect), view.agent.exit_code)


def describe_end(view: PodView | None) -> str:
    """One line saying how the pod ended."""
    if view is None:
        return "the pod is gone"
    parts = [f"phase {view.phase}"]
    if view.agent is not None:
        parts.append(f"exit code {view.agent.exit_code} ({view.agent.reason})")
    if view.reason:
        parts.append(f"reason {view.reason}")
    return ", ".join(parts)
