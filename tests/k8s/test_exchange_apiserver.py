"""The token exchange served by a real Airflow api-server with two workers (issue 9 item 3), and its token
used on Airflow's real Execution API.

A real Airflow (``devtools.stack.AirflowStack``: api-server with ``[api] workers = 2``, scheduler,
dag-processor) whose api-server mounts leoflow's plugin with ``[leoflow] runtime = kubernetes``; the ledger is
the one ``airflow db migrate`` created in Airflow's own metadata DB; the pods, tokens and TokenReview are the
real kube-apiserver's. The scheduler runs LocalExecutor: only the api-server's side is under test here.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timezone

import httpx
import pytest
import sqlalchemy as sa

from leoflow_agent.exchange import decode_grant, request_body
from leoflow_agent.fencing import ATTEMPT_HEADER, format_attempt
from leoflow_agent.outcome import AttemptIdentity
from leoflow_airflow.ledger.states import AttemptState
from leoflow_airflow.ledger.store import LedgerStore
from leoflow_airflow.ledger.warm import WarmLedger

from .exchange_wiring import (
    AUDIENCE,
    TASK_SA,
    kube_attempt,
    make_pod,
    make_warm_pod,
    pod_token,
    wire_namespace,
    workload_json,
)

pytestmark = [pytest.mark.k8s, pytest.mark.airflow]


def test_exchange_in_a_real_api_server_and_its_token_on_the_execution_api(
        airflow_stack_factory, api, core, namespace, k8s_env, tmp_path):
    """Six attempts exchanged through the api-server's two workers: each granted once and refused the second
    time, whichever worker answers (the state is the ledger's); each worker built the exchange in its own
    lifespan. The granted workload token passes the Execution API's own auth on ``PATCH /run`` of its
    ``ti_id`` (404: no such task instance in this database, so the call got past authentication), while a
    token of another ``ti_id`` and a tampered one get 403. A warm pod (issue 11) registers through the same
    api-server, and its await hands it an attempt assigned to it in the ledger (the table ``airflow db migrate``
    created), with a workload token the Execution API accepts likewise."""
    kubeconfig, unwire = wire_namespace(api, core, namespace, k8s_env, tmp_path / "api-server.kubeconfig")
    try:
        stack = airflow_stack_factory("exchange", executor="LocalExecutor", extra_env={
            "AIRFLOW__API__WORKERS": "2",
            "AIRFLOW__LEOFLOW__RUNTIME": "kubernetes",
            "AIRFLOW__LEOFLOW__NAMESPACE": namespace,
            "AIRFLOW__LEOFLOW__SERVICE_ACCOUNT": TASK_SA,
            "AIRFLOW__LEOFLOW__EXCHANGE_AUDIENCE": AUDIENCE,
            "AIRFLOW__LEOFLOW__IN_CLUSTER": "False",
            "AIRFLOW__LEOFLOW__KUBE_CONFIG": str(kubeconfig),
        })
        stack.migrate()
        engine = sa.create_engine(stack.sql_alchemy_conn, poolclass=sa.NullPool)
        store = LedgerStore(engine)
        attempts = []
        for _ in range(6):
            ti_id = str(uuid.uuid4())
            a = store.claim_epoch(ti_id=ti_id, try_number=1, dag_id="dag", task_id="task", run_id="run",
                                  map_index=-1, runtime="kubernetes", workload_json=workload_json(ti_id),
                                  scheduler_job_id=1)
            assert store.transition(a.ref, expected=[AttemptState.CLAIMED], to=AttemptState.DISPATCHED)
            pod = make_pod(core, namespace, a.ref, node=k8s_env.nodes[0])
            attempts.append((a.ref, pod_token(core, namespace, pod)))
        stack.start()

        url = f"{stack.base_url}/leoflow/v1/exchange"
        granted = {}
        with httpx.Client(timeout=30) as http:
            for ref, token in attempts:
                r = http.post(url, content=request_body(token), headers={"content-type": "application/json"})
                assert r.status_code == 200, r.text
                assert r.headers["cache-control"] == "no-store"
                grant = decode_grant(r.content)
                assert (grant.ti_id, grant.attempt_epoch) == (ref.ti_id, ref.attempt_epoch)
                granted[ref.ti_id] = grant
            for ref, token in attempts:  # a connection each: the workers share the listening socket
                r = httpx.post(url, content=request_body(token), headers={"content-type": "application/json"},
                               timeout=30)
                assert r.status_code == 403 and r.json().keys() == {"error_id"}, r.text
            assert http.post(url, content=b"").status_code == 403
            for ref, _ in attempts:
                assert store.get(ref).exchanged_at is not None

            from airflow.executors.workloads import ExecuteTask

            body = {"state": "running", "hostname": "h", "unixname": "u", "pid": 1,
                    "start_date": datetime.now(timezone.utc).isoformat()}
            (ti_a, grant_a), (ti_b, _) = list(granted.items())[:2]
            token_a = ExecuteTask.model_validate_json(grant_a.workload).token
            run = f"{stack.base_url}/execution/task-instances/{{}}/run"
            ref_a = next(ref for ref, _ in attempts if ref.ti_id == ti_a)
            # the agent names its attempt on every Execution API call (leoflow's fence lets the current one by)
            who = {ATTEMPT_HEADER: format_attempt(AttemptIdentity(ref_a.ti_id, ref_a.try_number,
                                                                   ref_a.attempt_epoch))}
            auth = {"Authorization": f"Bearer {token_a}", **who}
            assert http.patch(run.format(ti_a), json=body, headers=auth).status_code == 404
            assert http.patch(run.format(ti_b), json=body, headers=auth).status_code == 403
            tampered = token_a[:-4] + ("AAAA" if not token_a.endswith("AAAA") else "BBBB")
            assert http.patch(run.format(ti_a), json=body,
                              headers={"Authorization": f"Bearer {tampered}", **who}).status_code == 403
            unnamed = http.patch(run.format(ti_a), json=body, headers={"Authorization": f"Bearer {token_a}"})
            assert unnamed.status_code == 409, unnamed.text  # leoflow's fence: a call naming no attempt
            # a warm pod (issue 11) registers and is handed an attempt assigned to it, through the same api-server
            warm_pod = make_warm_pod(core, namespace, node=k8s_env.nodes[0])
            r = http.post(f"{stack.base_url}/leoflow/v1/warm/register",
                          content=request_body(pod_token(core, namespace, warm_pod)))
            assert r.status_code == 200, r.text
            credential = r.json()["credential"]
            warm_ref = kube_attempt(store)
            warm_ti = warm_ref.ti_id
            workers = WarmLedger(engine)
            version = workers.get(warm_pod.metadata.uid).row_version
            assert workers.assign(warm_pod.metadata.uid, warm_ref, row_version=version)
            r = http.post(f"{stack.base_url}/leoflow/v1/warm/await", content=b"{}",
                          headers={"authorization": f"Bearer {credential}"})
            assert r.status_code == 200 and r.json()["ti_id"] == warm_ti, r.text
            warm_token = ExecuteTask.model_validate(r.json()["workload"]).token
            warm_who = {ATTEMPT_HEADER: format_attempt(AttemptIdentity(warm_ti, 1, 1))}
            assert http.patch(run.format(warm_ti), json=body,
                              headers={"Authorization": f"Bearer {warm_token}", **warm_who}).status_code == 404
        engine.dispose()
        log = (stack.process_logs / "api-server.log").read_text(errors="replace")
        assert log.count("leoflow token exchange serving") == 2, log[-3000:]
        assert "reason=already_exchanged" in log
        for _, token in attempts:
            assert token not in log
    finally:
        unwire()
