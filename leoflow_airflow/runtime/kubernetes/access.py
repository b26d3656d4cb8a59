"""What the scheduler's Kubernetes identity may do in the task namespace, asked of the API server itself with a
``SelfSubjectAccessReview`` per rule (``airflow leoflow check``; issue 9 item 6).

The rules are the scheduler's half of leoflow's least-privilege RBAC (DESIGN §3 "The Kubernetes runtime, as
built"; README "Deploying on a real cluster"): the runtime creates, watches, reads, patches (only to take
leoflow's finalizer off) and deletes task pods and reads the task ServiceAccount at start; nothing else (no
``secrets``, no ``pods/exec``, no ``update``). The api-server's half
(``create tokenreviews`` cluster-wide and ``get pods`` in the task namespace, for the token exchange; ``get
pods/log`` there, for the log view of running tasks) belongs to another identity, so it cannot be asked from
here: :data:`EXCHANGE_RULES` names it for the report.

:func:`review_access` is the I/O; everything else is pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["EXCHANGE_RULES", "SCHEDULER_RULES", "AccessResult", "Rule", "denied", "review_access"]


@dataclass(frozen=True, slots=True)
class Rule:
    """One permission: ``verb`` on ``resource`` (its ``subresource``, "" for none; API ``group``, "" for core)
    and why leoflow needs it."""

    verb: str
    resource: str
    why: str
    group: str = ""
    subresource: str = ""

    def __str__(self) -> str:
        """``verb resource`` (``create pods``), ``/subresource`` after it (``get pods/log``), the group when not
        core (``create tokenreviews.authentication.k8s.io``)."""
        return f"{self.verb} {self.resource}" + (f"/{self.subresource}" if self.subresource else "") + \
            (f".{self.group}" if self.group else "")


SCHEDULER_RULES: tuple[Rule, ...] = (
    Rule("create", "pods", "create one pod per task attempt"),
    Rule("get", "pods", "read a pod back after a 409 or a lost create answer, and before a destructive decision"),
    Rule("list", "pods", "the pod informer's (re)list"),
    Rule("watch", "pods", "the pod informer's watch"),
    Rule("delete", "pods", "revoke_task, terminate() and the retention GC (UID precondition)"),
    Rule("patch", "pods", "release leoflow's finalizer once the attempt is settled (UID-tested JSON patch)"),
    Rule("get", "serviceaccounts", "start() checks the task ServiceAccount exists"),
)
"""What the scheduler needs in the task namespace (least privilege, scheduler side)."""

EXCHANGE_RULES: tuple[Rule, ...] = (
    Rule("create", "tokenreviews", "the exchange reviews each pod's projected token (cluster-wide)",
         group="authentication.k8s.io"),
    Rule("get", "pods", "the exchange reads the pod named by the review, in the task namespace; get_task_log "
         "finds a running attempt's pod"),
    Rule("get", "pods", "get_task_log reads a running attempt's pod log (the log view), in the task namespace",
         subresource="log"),
)
"""What the api-server's identity needs for the token exchange and the log view (least privilege, api-server
side; DESIGN §3 "The token exchange, as built")."""


@dataclass(frozen=True, slots=True)
class AccessResult:
    """The answer for one :class:`Rule`: ``allowed`` True/False, or None when the review could not be made
    (``reason`` then says why: the API server unreachable, the review itself forbidden)."""

    rule: Rule
    allowed: bool | None
    reason: str = ""


def denied(results: Sequence[AccessResult]) -> list[AccessResult]:
    """The results that are not a clear "allowed" (denied, or not decidable)."""
    return [r for r in results if r.allowed is not True]


def review_access(api_client: Any, namespace: str, rules: Sequence[Rule] = SCHEDULER_RULES, *,
                  timeout: float = 10.0) -> list[AccessResult]:
    """Ask the API server, as ``api_client``'s identity, whether each rule is allowed in ``namespace``.

    :param api_client: a ``kubernetes.client.ApiClient``.
    :param timeout: seconds per review request.
    :returns: one :class:`AccessResult` per rule, in order. Never raises for an API or transport error: once
        one review fails that way, it and the rest are answered ``None`` with the error (the server is not
        asked again for each rule).
    """
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    authz = client.AuthorizationV1Api(api_client)
    results: list[AccessResult] = []
    failure: str | None = None
    for rule in rules:
        if failure is not None:
            results.append(AccessResult(rule, None, failure))
            continue
        body = client.V1SelfSubjectAccessReview(spec=client.V1SelfSubjectAccessReviewSpec(
            resource_attributes=client.V1ResourceAttributes(
                namespace=namespace, verb=rule.verb, resource=rule.resource, group=rule.group,
                subresource=rule.subresource or None)))
        try:
            status = authz.create_self_subject_access_review(body, _request_timeout=timeout).status
        except ApiException as exc:
            failure = f"the review itself failed: HTTP {exc.status} {exc.reason}"
            results.append(AccessResult(rule, None, failure))
            continue
        except Exception as exc:  # noqa: BLE001 - transport errors of urllib3: the server did not answer
            failure = f"the API server did not answer: {type(exc).__name__}: {str(exc)[:200]}"
            results.append(AccessResult(rule, None, failure))
            continue
        reason = status.reason or status.evaluation_error or ""
        results.append(AccessResult(rule, bool(status.allowed), reason))
    return results
