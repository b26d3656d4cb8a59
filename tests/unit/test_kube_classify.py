"""Classifying a pod create's answer (issue 9 item 2, the pure half; research/k8s-runtime-facts.md "What the
spec must say" 10): backpressure never fails a task, refusals say why, a 409 on our own name asks for the
identity check, 5xx and transport errors defer. The same classifier meets the real kube-apiserver's answers in
``tests/k8s/test_kube_pod_admission.py``."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest
import urllib3
from kubernetes.client.rest import ApiException

from leoflow_airflow.dispatch.disposition import Disposition
from leoflow_airflow.runtime.kubernetes.classify import (
    CreateReply,
    Verdict,
    VerdictKind,
    classify_create,
    classify_exception,
    retry_after_seconds,
)

NAME = "etl-load-0190b6c27a1e7000800000000000abcd-1"


def status(code: int, reason: str, message: str, name: str = NAME) -> str:
    """A JSON ``Status`` body as the API server sends it."""
    return json.dumps({"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message,
                       "reason": reason, "details": {"name": name, "kind": "pods"}, "code": code})


def verdict(code: int, reason: str, message: str, *, headers=None, name: str = NAME) -> Verdict:
    return classify_create(CreateReply(code, status(code, reason, message, name), headers), pod_name=NAME)


@pytest.mark.parametrize(("code", "reason", "message", "kind"), [
    (429, "TooManyRequests", "Too many requests, please try again later.", VerdictKind.BACKPRESSURE),
    (403, "Forbidden", f'pods "{NAME}" is forbidden: exceeded quota: q, requested: pods=1, used: pods=1, '
                       "limited: pods=1", VerdictKind.BACKPRESSURE),
    (403, "Forbidden", f'pods "{NAME}" is forbidden: status unknown for quota: q, resources: pods',
     VerdictKind.BACKPRESSURE),
    (403, "Forbidden", f'pods "{NAME}" is forbidden: failed quota: q: must specify limits.cpu for: base; '
                       "requests.cpu for: base", VerdictKind.REFUSED),
    (403, "Forbidden", f'pods "{NAME}" is forbidden: violates PodSecurity "restricted:latest": host namespaces '
                       "(hostNetwork=true)", VerdictKind.REFUSED),
    (403, "Forbidden", 'pods is forbidden: User "system:serviceaccount:a:scheduler" cannot create resource "pods" '
                       'in API group "" in the namespace "tasks"', VerdictKind.REFUSED),
    (403, "Forbidden", f'pods "{NAME}" is forbidden: unable to create new content in namespace tasks because it '
                       "is being terminated", VerdictKind.REFUSED),
    (409, "AlreadyExists", f'pods "{NAME}" already exists', VerdictKind.CHECK_EXISTING),
    (422, "Invalid", f'Pod "{NAME}" is invalid: spec.containers[0].image: Required value', VerdictKind.REFUSED),
    (400, "BadRequest", "the body could not be decoded", VerdictKind.REFUSED),
    (404, "NotFound", 'namespaces "tasks" not found', VerdictKind.REFUSED),
    (401, "Unauthorized", "Unauthorized", VerdictKind.DEFERRED),
    (500, "InternalError", "Internal error occurred: etcdserver: request timed out", VerdictKind.DEFERRED),
    (503, "ServiceUnavailable", "the server is currently unable to handle the request", VerdictKind.DEFERRED),
    (504, "Timeout", "Timeout: request did not complete within requested timeout", VerdictKind.DEFERRED),
])
def test_the_dispositions_table(code, reason, message, kind):
    got = verdict(code, reason, message)
    assert got.kind is kind
    assert message in got.reason or message[:400] in got.reason


def test_success_is_dispatched_and_every_verdict_but_check_existing_is_a_dispatch_result():
    assert classify_create(CreateReply(201, "{}"), pod_name=NAME) == Verdict(VerdictKind.DISPATCHED)
    assert verdict(429, "TooManyRequests", "slow down").dispatch_result().disposition is Disposition.BACKPRESSURE
    refused = verdict(403, "Forbidden", 'violates PodSecurity "restricted:latest": x').dispatch_result()
    assert refused.disposition is Disposition.REFUSED and "violates PodSecurity" in refused.reason
    assert verdict(503, "ServiceUnavailable", "x").dispatch_result().disposition is Disposition.DEFERRED
    with pytest.raises(ValueError):
        verdict(409, "AlreadyExists", "exists").dispatch_result()


def test_exceeded_quota_with_nothing_used_can_never_pass_and_is_refused():
    message = ('pods "p" is forbidden: exceeded quota: q, requested: limits.cpu=4,pods=1, used: limits.cpu=0,pods=0, '
               "limited: limits.cpu=2,pods=10")
    got = verdict(403, "Forbidden", message)
    assert got.kind is VerdictKind.REFUSED and "this pod alone is over" in got.reason
    busy = message.replace("used: limits.cpu=0,pods=0", "used: limits.cpu=500m,pods=1")
    assert verdict(403, "Forbidden", busy).kind is VerdictKind.BACKPRESSURE


def test_a_conflict_about_another_name_or_reason_is_not_ours_to_check():
    assert verdict(409, "AlreadyExists", "exists", name="someone-else").kind is VerdictKind.DEFERRED
    assert verdict(409, "Conflict", "the object has been modified").kind is VerdictKind.DEFERRED


def test_retry_after_is_honoured_in_both_forms():
    now = datetime(2026, 1, 1, 12, 0, 0, tzinfo=timezone.utc)
    assert retry_after_seconds("7") == 7.0
    assert retry_after_seconds("Thu, 01 Jan 2026 12:00:30 GMT", now=now) == 30.0
    assert retry_after_seconds("Thu, 01 Jan 2026 11:00:00 GMT", now=now) == 0.0
    assert retry_after_seconds("soon") is None and retry_after_seconds(None) is None and retry_after_seconds("-1") is None
    got = classify_create(CreateReply(429, status(429, "TooManyRequests", "x"), {"retry-after": "3"}), pod_name=NAME)
    assert (got.kind, got.retry_after) == (VerdictKind.BACKPRESSURE, 3.0)
    quota = classify_create(CreateReply(403, status(403, "Forbidden", "exceeded quota: q, requested: pods=1, used: "
                                                    "pods=1, limited: pods=1")), pod_name=NAME)
    assert quota.retry_after is None  # the caller's own backoff


def test_a_body_that_is_no_status_still_classifies():
    assert classify_create(CreateReply(502, "<html>bad gateway</html>"), pod_name=NAME).kind is VerdictKind.DEFERRED
    got = classify_create(CreateReply(403, "exceeded quota: q, requested: pods=1, used: pods=1, limited: pods=1"),
                          pod_name=NAME)
    assert got.kind is VerdictKind.BACKPRESSURE
    assert classify_create(CreateReply(403, ""), pod_name=NAME) == Verdict(VerdictKind.REFUSED, "HTTP 403")
    long = classify_create(CreateReply(403, status(403, "Forbidden", "x" * 5000)), pod_name=NAME)
    assert len(long.reason) == 500


def test_exceptions_from_a_create():
    api = ApiException(status=429, reason="Too Many Requests")
    api.body, api.headers = status(429, "TooManyRequests", "x"), {"Retry-After": "2"}
    assert classify_exception(api, pod_name=NAME) == Verdict(VerdictKind.BACKPRESSURE, "x", 2.0)
    conflict = ApiException(status=409, reason="Conflict")
    conflict.body = status(409, "AlreadyExists", "exists")
    assert classify_exception(conflict, pod_name=NAME).kind is VerdictKind.CHECK_EXISTING
    pool = urllib3.HTTPConnectionPool("127.0.0.1", 1)
    transport = [
        urllib3.exceptions.MaxRetryError(pool, "/api/v1/namespaces/t/pods", reason=ConnectionRefusedError(111, "refused")),
        urllib3.exceptions.ReadTimeoutError(pool, "/", "read timed out"),
        urllib3.exceptions.ProtocolError("Connection aborted."),
        ConnectionResetError(104, "reset"),
        TimeoutError("timed out"),
        ApiException(status=0, reason="Unsupported content type"),
    ]
    for exc in transport:
        assert classify_exception(exc, pod_name=NAME).kind is VerdictKind.DEFERRED, exc
    bad = classify_exception(ValueError("Invalid value for `name`, must not be `None`"), pod_name=NAME)
    assert bad.kind is VerdictKind.REFUSED and bad.reason.startswith("ValueError: Invalid value")
