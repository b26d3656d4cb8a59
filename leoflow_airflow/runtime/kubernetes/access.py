"""What the scheduler's Kubernetes identity may do in the task namespace, asked of the API server itself with a
``SelfSubjectAccessReview`` per rule (``airflow leoflow check``; issue 9 item 6).

The rules are the scheduler's half of leoflow's least-privilege RBAC (DESIGN §3 "The Kubernetes runtime, as
built"; README "Deploying on a real cluster"): the runtime creates, watches, reads, patches (only to take
leoflow's finalizer off) and deletes task pods and reads the task ServiceAccount at start; nothing else (no
``secrets``, no ``pods/exec``, no ``update``). The api-server's half
(``create tokenreviews`` cluster-wide and ``get pods`` in the task namespace, for the token exchange; ``get
pods/log`` there, for the log view of running tasks) belongs to another identity, so it cannot be asked from
here: :data:`EXCHANGE_RULES` names it for the report, and ``airflow leoflow doctor`` asks about it with a
``SubjectAccessReview`` for the api-server's user it is given (:func:`review_subject_access`).

:func:`review_access` and :func:`review_subject_access` are the I/O; everything else is pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["EXCHANGE_RULES", "SCHEDULER_RULES", "AccessResult", "Rule", "denied", "review_access",
           "review_subject_access", "user_groups"]


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
    Rule("patch", "pods", "release leoflow's finalizer once the attempt is settled (UID-tested JSON patch); "
         "lower a warm pod's activeDeadlineSeconds when it takes an attempt; move a dead scheduler's busy warm pod under "
         "this scheduler's anchor"),
    Rule("get", "pods", "keep an ended task pod's log where Airflow's log view reads it, before its finalizer is "
         "released ([leoflow] pod_log_salvage)", subresource="log"),
    Rule("get", "serviceaccounts", "start() checks the task ServiceAccount exists"),
    Rule("create", "configmaps", "warm pods: one anchor ConfigMap per (scheduler job, DAG version) owns its pool"),
    Rule("list", "configmaps", "warm pods: start() finds the anchors of scheduler jobs that are not alive"),
    Rule("get", "configmaps", "warm pods: re-read this scheduler's anchor before creating pods under it (a "
         "deleted anchor is recreated; k8s review §11), and read it back after a 409"),
    Rule("delete", "configmaps", "warm pods: a drained pool's anchor, and a dead scheduler's (the garbage "
         "collector then removes their pods)"),
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

    authz = client.AuthorizationV1Api(api_client)

    def ask(attributes: Any) -> Any:
        body = client.V1SelfSubjectAccessReview(spec=client.V1SelfSubjectAccessReviewSpec(
            resource_attributes=attributes))
        return authz.create_self_subject_access_review(body, _request_timeout=timeout).status

    return _review_each(rules, namespace, ask, forbidden="")


def _review_each(rules: Sequence[Rule], namespace: str, ask: Any, *, forbidden: str) -> list[AccessResult]:
    """Call ``ask(V1ResourceAttributes) -> V1SubjectAccessReviewStatus`` for each rule in ``namespace``; the
    first API or transport error answers its rule and the rest None (``forbidden``, when not empty, is the reason
    given for an HTTP 403)."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    results: list[AccessResult] = []
    failure: str | None = None
    for rule in rules:
        if failure is not None:
            results.append(AccessResult(rule, None, failure))
            continue
        attributes = client.V1ResourceAttributes(namespace=namespace, verb=rule.verb, resource=rule.resource,
                                                 group=rule.group, subresource=rule.subresource or None)
        try:
            status = ask(attributes)
        except ApiException as exc:
            failure = (forbidden if forbidden and exc.status == 403
                       else f"the review itself failed: HTTP {exc.status} {exc.reason}")
            results.append(AccessResult(rule, None, failure))
            continue
        except Exception as exc:  # noqa: BLE001 - transport errors of urllib3: the server did not answer
            failure = f"the API server did not answer: {type(exc).__name__}: {str(exc)[:200]}"
            results.append(AccessResult(rule, None, failure))
            continue
        reason = status.reason or status.evaluation_error or ""
        results.append(AccessResult(rule, bool(status.allowed), reason))
    return results


def user_groups(user: str) -> list[str]:
    """The groups Kubernetes gives a ServiceAccount user (``system:serviceaccount:<ns>:<name>`` →
    ``system:serviceaccounts``, ``system:serviceaccounts:<ns>``, ``system:authenticated``), so a
    ``SubjectAccessReview`` for it sees the bindings to those groups too; ``[system:authenticated]`` for any
    other user name. Pure."""
    parts = user.split(":")
    if len(parts) == 4 and parts[:2] == ["system", "serviceaccount"] and parts[2]:
        return ["system:serviceaccounts", f"system:serviceaccounts:{parts[2]}", "system:authenticated"]
    return ["system:authenticated"]


def review_subject_access(api_client: Any, user: str, namespace: str, rules: Sequence[Rule] = EXCHANGE_RULES, *,
                          groups: Sequence[str] | None = None, timeout: float = 10.0) -> list[AccessResult]:
    """Ask the API server whether ``user`` (with ``groups``; default :func:`user_groups`) may do each rule in
    ``namespace`` (a ``SubjectAccessReview`` per rule, created as ``api_client``'s identity, which needs
    ``create subjectaccessreviews.authorization.k8s.io``).

    :returns: one :class:`AccessResult` per rule, in order; never raises for an API or transport error: as
        :func:`review_access`, the first such error answers it and the rest None, a 403 saying that the asking
        identity may not create subjectaccessreviews.
    """
    from kubernetes import client

    authz = client.AuthorizationV1Api(api_client)
    groups = list(user_groups(user) if groups is None else groups)

    def ask(attributes: Any) -> Any:
        body = client.V1SubjectAccessReview(spec=client.V1SubjectAccessReviewSpec(
            user=user, groups=groups, resource_attributes=attributes))
        return authz.create_subject_access_review(body, _request_timeout=timeout).status

    return _review_each(rules, namespace, ask, forbidden="the doctor's identity may not create "
                        "subjectaccessreviews.authorization.k8s.io (HTTP 403)")
