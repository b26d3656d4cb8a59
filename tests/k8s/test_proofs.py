"""Proofs that the k8senv control plane behaves like a real cluster where leoflow depends on it.

Each test checks the behaviour and its negative case against the real kube-apiserver.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from .conftest import wait_for

pytestmark = pytest.mark.k8s


def _pod(name: str, *, node: str | None = None, sa: str | None = None, labels=None, annotations=None,
         owner: client.V1OwnerReference | None = None) -> client.V1Pod:
    """A minimal one-container pod; bound to `node` if given (kwok animates pods on its nodes)."""
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, labels=labels, annotations=annotations,
                                     owner_references=[owner] if owner else None),
        spec=client.V1PodSpec(
            node_name=node, service_account_name=sa, restart_policy="Never",
            containers=[client.V1Container(name="main", image="leoflow.test/none:0",
                                           resources=client.V1ResourceRequirements(
                                               requests={"cpu": "10m", "memory": "16Mi"},
                                               limits={"cpu": "10m", "memory": "16Mi"}))]))


def _review(auth: client.AuthenticationV1Api, token: str, audiences: list[str]) -> client.V1TokenReviewStatus:
    """TokenReview `token` for `audiences`; return the review status."""
    return auth.create_token_review(client.V1TokenReview(
        spec=client.V1TokenReviewSpec(token=token, audiences=audiences))).status


def test_token_request_bound_to_pod_reviews_pod_identity_and_dies_with_the_pod(api, core, namespace, k8s_env):
    core.create_namespaced_service_account(namespace, client.V1ServiceAccount(
        metadata=client.V1ObjectMeta(name="runner")))
    pod = core.create_namespaced_pod(namespace, _pod("tok", node=k8s_env.nodes[0], sa="runner"))
    tr = core.create_namespaced_service_account_token("runner", namespace, client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(
            audiences=["leoflow-test"], expiration_seconds=600,
            bound_object_ref=client.V1BoundObjectReference(kind="Pod", api_version="v1", name="tok",
                                                           uid=pod.metadata.uid))))
    auth = client.AuthenticationV1Api(api)

    ok = _review(auth, tr.status.token, ["leoflow-test"])
    assert ok.authenticated is True
    assert ok.audiences == ["leoflow-test"]
    assert ok.user.username == f"system:serviceaccount:{namespace}:runner"
    assert ok.user.extra["authentication.kubernetes.io/pod-name"] == ["tok"]
    assert ok.user.extra["authentication.kubernetes.io/pod-uid"] == [pod.metadata.uid]
    assert ok.user.extra["authentication.kubernetes.io/node-name"] == [k8s_env.nodes[0]]

    wrong = _review(auth, tr.status.token, ["someone-else"])
    assert wrong.authenticated is not True
    assert "audience" in (wrong.error or "").lower()

    core.delete_namespaced_pod("tok", namespace, grace_period_seconds=0)
    wait_for(lambda: not core.list_namespaced_pod(namespace, field_selector="metadata.name=tok").items,
             30, what="pod deletion")
    gone = wait_for(lambda: (s := _review(auth, tr.status.token, ["leoflow-test"])).authenticated is not True and s,
                    30, what="token rejection after pod deletion")
    assert gone.user is None or not gone.user.username
    assert "tok" in (gone.error or "") or "not found" in (gone.error or "").lower()


def test_resource_quota_rejects_pod_over_quota_with_403(core, namespace):
    core.create_namespaced_resource_quota(namespace, client.V1ResourceQuota(
        metadata=client.V1ObjectMeta(name="q"), spec=client.V1ResourceQuotaSpec(hard={"pods": "1"})))
    # the resourcequota controller must have computed the status before admission enforces it
    wait_for(lambda: (core.read_namespaced_resource_quota("q", namespace).status.hard or {}).get("pods") == "1",
             30, what="quota status")
    created = core.create_namespaced_pod(namespace, _pod("under-quota"))
    assert created.metadata.uid

    with pytest.raises(ApiException) as exc:
        core.create_namespaced_pod(namespace, _pod("over-quota"))
    assert exc.value.status == 403
    assert "exceeded quota" in exc.value.body
    names = [p.metadata.name for p in core.list_namespaced_pod(namespace).items]
    assert names == ["under-quota"]


def test_priority_and_fairness_rejects_test_identity_with_429_but_not_admin(api, user_api, core, namespace, k8s_env):
    rbac = client.RbacAuthorizationV1Api(api)
    rbac.create_namespaced_role(namespace, client.V1Role(
        metadata=client.V1ObjectMeta(name="cm-writer"),
        rules=[client.V1PolicyRule(api_groups=[""], resources=["configmaps"], verbs=["create", "get", "list"])]))
    rbac.create_namespaced_role_binding(namespace, client.V1RoleBinding(
        metadata=client.V1ObjectMeta(name="cm-writer"),
        role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="Role", name="cm-writer"),
        subjects=[client.RbacV1Subject(kind="User", name=k8s_env.test_user,
                                       api_group="rbac.authorization.k8s.io")]))
    user_core = client.CoreV1Api(user_api)

    def user_create(name: str) -> None:
        user_core.create_namespaced_config_map(namespace, client.V1ConfigMap(
            metadata=client.V1ObjectMeta(name=name), data={"k": "v"}))

    # negative case first: without the FlowSchema the test identity may create (RBAC is not what rejects)
    wait_for(lambda: _try(user_create, "before-apf") is None, 15, what="RBAC binding to take effect")

    fc = client.FlowcontrolApiserverV1Api(api)
    suffix = uuid.uuid4().hex[:6]
    plc_name, fs_name = f"leoflow-reject-{suffix}", f"leoflow-test-user-{suffix}"
    fc.create_priority_level_configuration(client.V1PriorityLevelConfiguration(
        metadata=client.V1ObjectMeta(name=plc_name),
        spec=client.V1PriorityLevelConfigurationSpec(type="Limited", limited=client.V1LimitedPriorityLevelConfiguration(
            nominal_concurrency_shares=0, lendable_percent=0, borrowing_limit_percent=0,
            limit_response=client.V1LimitResponse(type="Reject")))))
    fc.create_flow_schema(client.V1FlowSchema(
        metadata=client.V1ObjectMeta(name=fs_name),
        spec=client.V1FlowSchemaSpec(
            matching_precedence=100, priority_level_configuration=client.V1PriorityLevelConfigurationReference(
                name=plc_name),
            distinguisher_method=client.V1FlowDistinguisherMethod(type="ByUser"),
            rules=[client.V1PolicyRulesWithSubjects(
                subjects=[client.FlowcontrolV1Subject(kind="User", user=client.V1UserSubject(name=k8s_env.test_user))],
                resource_rules=[client.V1ResourcePolicyRule(api_groups=["*"], resources=["*"], verbs=["*"],
                                                            namespaces=["*"], cluster_scope=True)])])))
    try:
        # A level with 0 seats still admits a request when none of its requests is executing (queueset
        # canAccommodateSeatsLocked), so only overlapping requests are rejected: send bursts.
        def burst(create) -> list[ApiException | None]:
            with ThreadPoolExecutor(16) as ex:
                return list(ex.map(lambda i: _try(create, f"burst-{uuid.uuid4().hex[:8]}"), range(48)))

        def rejected():
            errs = [e for e in burst(user_create) if e is not None]
            assert all(e.status == 429 for e in errs), [(e.status, e.reason) for e in errs]
            return errs
        errs = wait_for(rejected, 30, interval=0.3, what="429 from APF for the test identity")
        for e in errs:
            assert e.headers.get("Retry-After"), e.headers
            assert "too many requests" in e.body.lower(), e.body
        # the admin (exempt priority level) is unaffected by the same burst
        def admin_create(name: str) -> None:
            core.create_namespaced_config_map(namespace, client.V1ConfigMap(
                metadata=client.V1ObjectMeta(name=name), data={"k": "v"}))
        assert [e for e in burst(admin_create) if e is not None] == []
    finally:
        fc.delete_flow_schema(fs_name)
        fc.delete_priority_level_configuration(plc_name)
    wait_for(lambda: _try(user_create, f"after-{uuid.uuid4().hex[:6]}") is None, 30,
             what="test identity admitted again after the FlowSchema is gone")


def _try(fn, *args) -> ApiException | None:
    """Call fn(*args); return the ApiException it raised, or None."""
    try:
        fn(*args)
    except ApiException as e:
        return e
    return None


def test_delete_with_uid_precondition_fails_against_recreated_pod(core, namespace):
    old = core.create_namespaced_pod(namespace, _pod("same-name"))
    core.delete_namespaced_pod("same-name", namespace, grace_period_seconds=0)
    wait_for(lambda: not core.list_namespaced_pod(namespace).items, 30, what="first pod gone")
    new = core.create_namespaced_pod(namespace, _pod("same-name"))
    assert new.metadata.uid != old.metadata.uid

    with pytest.raises(ApiException) as exc:
        core.delete_namespaced_pod("same-name", namespace, body=client.V1DeleteOptions(
            grace_period_seconds=0, preconditions=client.V1Preconditions(uid=old.metadata.uid)))
    assert exc.value.status == 409
    assert "precondition" in exc.value.body.lower()
    assert core.read_namespaced_pod("same-name", namespace).metadata.uid == new.metadata.uid

    core.delete_namespaced_pod("same-name", namespace, body=client.V1DeleteOptions(
        grace_period_seconds=0, preconditions=client.V1Preconditions(uid=new.metadata.uid)))
    wait_for(lambda: not core.list_namespaced_pod(namespace).items, 30, what="pod deleted with matching UID")


def test_deleting_owner_configmap_cascades_to_owned_pods(core, namespace, k8s_env):
    owner = core.create_namespaced_config_map(namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="owner")))
    ref = client.V1OwnerReference(api_version="v1", kind="ConfigMap", name="owner", uid=owner.metadata.uid,
                                  block_owner_deletion=True)
    for i in range(3):
        core.create_namespaced_pod(namespace, _pod(f"owned-{i}", node=k8s_env.nodes[i % len(k8s_env.nodes)],
                                                   owner=ref))
    core.create_namespaced_pod(namespace, _pod("unowned", node=k8s_env.nodes[0]))

    core.delete_namespaced_config_map("owner", namespace)
    wait_for(lambda: sorted(p.metadata.name for p in core.list_namespaced_pod(namespace).items) == ["unowned"],
             60, what="garbage collector to delete the owned pods")
    time.sleep(2)  # the unowned pod must stay, not just be slower
    assert [p.metadata.name for p in core.list_namespaced_pod(namespace).items] == ["unowned"]


def _raw_watch_first_event(api: client.ApiClient, namespace: str, rv: str) -> dict:
    """Open a podtemplates watch from `rv` and return its first event as a dict (HTTP errors as
    {"type": "HTTP", "code": N})."""
    resp = None
    try:
        resp = client.CoreV1Api(api).list_namespaced_pod_template(
            namespace, watch=True, resource_version=rv, timeout_seconds=10, _preload_content=False)
        for line in resp:  # urllib3 response: one JSON event per line
            line = line.strip()
            if line:
                return json.loads(line)
        return {"type": "NONE"}
    except ApiException as e:
        return {"type": "HTTP", "code": e.status, "body": e.body}
    finally:
        if resp is not None:
            resp.release_conn()


def _pt(name: str) -> client.V1PodTemplate:
    return client.V1PodTemplate(metadata=client.V1ObjectMeta(name=name), template=client.V1PodTemplateSpec(
        spec=client.V1PodSpec(containers=[client.V1Container(name="c", image="x")])))


def test_watch_from_compacted_resource_version_gets_410_gone_and_fresh_watch_does_not(api, core, namespace, k8s_env):
    first = core.create_namespaced_pod_template(namespace, _pt("a"))
    old_rv = first.metadata.resource_version
    core.create_namespaced_pod_template(namespace, _pt("b"))
    third = core.create_namespaced_pod_template(namespace, _pt("c"))
    # compact etcd through etcd's own API (resourceVersion == etcd revision); compaction at R keeps R,
    # and a watch from old_rv starts at old_rv + 1 < R
    assert int(third.metadata.resource_version) > int(old_rv) + 1
    req = urllib.request.Request(f"{k8s_env.etcd}/v3/kv/compaction", method="POST",
                                 data=json.dumps({"revision": third.metadata.resource_version,
                                                  "physical": True}).encode())
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.status == 200

    ev = _raw_watch_first_event(api, namespace, old_rv)
    if ev["type"] == "HTTP":
        assert ev["code"] == 410, ev
    else:
        assert ev["type"] == "ERROR", ev
        assert ev["object"]["code"] == 410, ev
        assert ev["object"]["reason"] in ("Expired", "Gone"), ev

    lst = core.list_namespaced_pod_template(namespace)
    fresh_rv = lst.metadata.resource_version
    got: list[dict] = []
    t = threading.Thread(target=lambda: got.append(_raw_watch_first_event(api, namespace, fresh_rv)))
    t.start()
    time.sleep(0.5)
    core.create_namespaced_pod_template(namespace, _pt("d"))
    t.join(15)
    assert got and got[0]["type"] == "ADDED", got
    assert got[0]["object"]["metadata"]["name"] == "d"


def test_kwok_moves_1000_pods_pending_running_succeeded(api, core, namespace, k8s_env, record_property):
    n = 1000
    seen: dict[str, list[str]] = {}
    stop = threading.Event()
    lst = core.list_namespaced_pod(namespace)

    def watch_phases():
        from kubernetes import watch
        rv = lst.metadata.resource_version
        while not stop.is_set():
            w = watch.Watch()
            for ev in w.stream(core.list_namespaced_pod, namespace, resource_version=rv, timeout_seconds=5):
                p = ev["object"]
                rv = p.metadata.resource_version
                phases = seen.setdefault(p.metadata.name, [])
                ph = p.status.phase if ev["type"] != "DELETED" else "Deleted"
                if not phases or phases[-1] != ph:
                    phases.append(ph)
                if stop.is_set():
                    w.stop()

    watcher = threading.Thread(target=watch_phases, daemon=True)
    watcher.start()
    t0 = time.monotonic()

    def create(i: int) -> None:
        core.create_namespaced_pod(namespace, _pod(
            f"p-{i:04d}", node=k8s_env.nodes[i % len(k8s_env.nodes)],
            annotations={"kwok.leoflow.test/exit-code": "0"}))

    with ThreadPoolExecutor(8) as ex:
        list(ex.map(create, range(n)))
    created = time.monotonic() - t0
    # negative cases: no exit-code annotation stays Running; exit-code 3 fails with its message
    core.create_namespaced_pod(namespace, _pod("stays-running", node=k8s_env.nodes[0]))
    core.create_namespaced_pod(namespace, _pod("fails", node=k8s_env.nodes[0], annotations={
        "kwok.leoflow.test/exit-code": "3", "kwok.leoflow.test/message": "boom: \"quoted\"\nline2"}))

    def all_succeeded():
        pods = core.list_namespaced_pod(namespace, label_selector=None).items
        return sum(1 for p in pods if p.metadata.name.startswith("p-") and p.status.phase == "Succeeded") == n
    wait_for(all_succeeded, 600, interval=1.0, what=f"{n} pods Succeeded")
    elapsed = time.monotonic() - t0
    time.sleep(1)
    stop.set()
    watcher.join(10)
    record_property("kwok_1000_pods_seconds", round(elapsed, 1))
    record_property("kwok_1000_pods_create_seconds", round(created, 1))
    print(f"\nkwok: {n} pods created in {created:.1f}s, all Succeeded after {elapsed:.1f}s")

    for i in range(n):
        phases = [ph for ph in seen.get(f"p-{i:04d}", []) if ph]
        assert phases[-1] == "Succeeded", (i, phases)
        assert "Running" in phases and phases.index("Running") < phases.index("Succeeded"), (i, phases)
        assert phases[0] in ("Pending", "Running"), (i, phases)
    assert seen["p-0000"][0] == "Pending"

    running = core.read_namespaced_pod("stays-running", namespace)
    assert running.status.phase == "Running"
    failed = wait_for(lambda: (p := core.read_namespaced_pod("fails", namespace)).status.phase == "Failed" and p,
                      30, what="pod with exit-code 3 to fail")
    term = failed.status.container_statuses[0].state.terminated
    assert (term.exit_code, term.reason, term.message) == (3, "Error", 'boom: "quoted"\nline2')
