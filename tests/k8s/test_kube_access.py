"""``airflow leoflow check``'s RBAC report against the real kube-apiserver (issue 9 item 6): each permission the
scheduler needs in the task namespace is asked with a SelfSubjectAccessReview, as the identity the runtime uses.

The test identity starts with no grants; a Role with exactly :data:`access.SCHEDULER_RULES` makes every answer
"allowed", and taking one verb away makes exactly that one "denied". An API server that does not answer gives
"undecided" for every rule instead of an exception.
"""

from __future__ import annotations

import pytest
from kubernetes import client

from leoflow_airflow.runtime.kubernetes import access

from .conftest import wait_for

pytestmark = pytest.mark.k8s


def _grant(api: client.ApiClient, namespace: str, user: str, rules: tuple[access.Rule, ...]) -> None:
    rbac = client.RbacAuthorizationV1Api(api)
    rbac.create_namespaced_role(namespace, client.V1Role(
        metadata=client.V1ObjectMeta(name="leoflow-scheduler"),
        rules=[client.V1PolicyRule(api_groups=[r.group], resources=[r.resource + (f"/{r.subresource}" if r.subresource
                                                                                   else "")],
                                   verbs=[r.verb]) for r in rules]))
    rbac.create_namespaced_role_binding(namespace, client.V1RoleBinding(
        metadata=client.V1ObjectMeta(name="leoflow-scheduler"),
        role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="Role", name="leoflow-scheduler"),
        subjects=[client.RbacV1Subject(kind="User", name=user, api_group="rbac.authorization.k8s.io")]))


def _answers(api_client: client.ApiClient, namespace: str) -> dict[str, bool | None]:
    return {str(r.rule): r.allowed for r in access.review_access(api_client, namespace)}


def test_the_report_names_exactly_the_permissions_the_identity_lacks(api, user_api, namespace, k8s_env):
    assert set(_answers(user_api, namespace).values()) == {False}, "the test identity starts with no grants"
    assert set(_answers(api, namespace).values()) == {True}, "cluster-admin may do everything"

    missing = access.Rule("delete", "pods", "")
    _grant(api, namespace, k8s_env.test_user, tuple(r for r in access.SCHEDULER_RULES if str(r) != str(missing)))
    answers = wait_for(lambda: (a := _answers(user_api, namespace)) and a["create pods"] and a, 15,
                       what="the Role binding to take effect")
    assert [name for name, allowed in answers.items() if not allowed] == ["delete pods"]
    assert [str(r.rule) for r in access.denied(access.review_access(user_api, namespace))] == ["delete pods"]


def test_an_api_server_that_does_not_answer_leaves_every_rule_undecided():
    configuration = client.Configuration()
    configuration.host = "https://127.0.0.1:9"  # discard port: nothing listens
    configuration.retries = 0
    with client.ApiClient(configuration) as unreachable:
        results = access.review_access(unreachable, "default", timeout=2.0)
    assert [r.allowed for r in results] == [None] * len(access.SCHEDULER_RULES)
    assert all("did not answer" in r.reason for r in results)
    assert [r.rule for r in access.denied(results)] == list(access.SCHEDULER_RULES)
