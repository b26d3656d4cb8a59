"""Issue 10 item 6 acceptance, on a real Airflow (scheduler, dag-processor, api-server; SQLite) with Lite: a stale
execution's heartbeat and state PATCH are refused by the Execution API with 409 while the current epoch runs to
success (DESIGN §2 Invariant 1, "Fencing at the Execution API").

Epoch 1 of ``lf_fence.work`` is SIGKILLed before ``/run`` (test-only fault injection), so leoflow dispatches the
same ``ti_id`` again as epoch 2, whose body waits for the test's go file. While it waits, the test speaks as
epoch 1 would: the api-server's real ``/execution`` routes, an execution token validly signed for that
``ti_id`` (minted with the stack's own JWT secret, as the scheduler mints one), and epoch 1's
``Leoflow-Attempt`` header. Airflow alone would accept that PATCH (the TI is RUNNING, and the state route
checks nothing else), and it would end the current execution's TI as a success its body never reached.

Then the task is cleared once it succeeded: the new try runs under a new ``ti_id``, and the old ``ti_id``'s execution,
replayed with its own valid token and its last current header, is refused with 409 ``leoflow_superseded_try`` on
every route that writes (XCom, Variable, heartbeat, state), where Airflow alone would have taken the XCom and the
Variable (k8s review, "the fence judges a call only against the ledger rows of its token's own ti_id").

DAG: ``tests/fault_dags/leoflow_more.py`` (``lf_fence``). Helpers: ``fault_helpers.py``.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timezone

import httpx
import pytest

from fault_helpers import FaultStack, executions, wait_until
from leoflow_agent import fencing, outcome

pytestmark = pytest.mark.airflow


def _token(stack: FaultStack, ti_id: str) -> str:
    """An execution token for ``ti_id`` signed as Airflow signs one (``[api_auth] jwt_secret``, the first
    ``[execution_api] jwt_audience``), what a stale agent holds after its own ``/run``."""
    from airflow.api_fastapi.auth.tokens import JWTGenerator

    generator = JWTGenerator(secret_key=stack._jwt_secret, valid_for=600, audience="urn:airflow.apache.org:task")
    return generator.generate(extras={"sub": ti_id, "scope": "execution"})


def test_a_stale_executions_heartbeat_and_patch_get_409_while_the_current_epoch_succeeds(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    from airflow.sdk.api.datamodels._generated import API_VERSION

    with FaultStack(tmp_path_factory.mktemp("exec-fence"), parallelism=2) as stack:
        stack.up(["lf_fence"])
        run = stack.trigger_with("lf_fence", {"work/1/1": "before_run"})
        wait_until(lambda: executions(stack, "lf_fence", "work", run), 180, "epoch 2's body to start")
        # the body can reach /run before the scheduler's next cycle records epoch 2's launch (CLAIMED until then)
        rows = wait_until(lambda: (r := stack.attempts("lf_fence", run, "work"))
                          and [(x["attempt_epoch"], x["state"]) for x in r] == [(1, "closed"), (2, "dispatched")]
                          and r, 60, "epoch 2's launch to be recorded")
        ti_id = rows[0]["ti_id"]
        assert rows[1]["ti_id"] == ti_id and stack.ti_row("lf_fence", run, "work")["state"] == "running"

        api = httpx.Client(base_url=f"{stack.base_url}/execution/", timeout=30, headers={
            "authorization": f"Bearer {_token(stack, ti_id)}", "airflow-api-version": API_VERSION})
        stale = {fencing.ATTEMPT_HEADER: fencing.format_attempt(outcome.AttemptIdentity(ti_id, 1, 1))}
        heartbeat = {"hostname": "stale-host", "pid": 4242}
        success = {"state": "success", "end_date": datetime.now(timezone.utc).isoformat(),
                   "task_outlets": [], "outlet_events": []}
        answers = {
            "heartbeat": api.put(f"task-instances/{ti_id}/heartbeat", json=heartbeat, headers=stale),
            "patch": api.patch(f"task-instances/{ti_id}/state", json=success, headers=stale),
            "patch without header": api.patch(f"task-instances/{ti_id}/state", json=success),
        }
        for what, answer in answers.items():
            assert answer.status_code == 409, (what, answer.status_code, answer.text)
        for what in ("heartbeat", "patch"):
            detail = answers[what].json()["detail"]
            assert detail["reason"] == "leoflow_stale_execution", (what, detail)
            assert detail["sent"]["attempt_epoch"] == 1 and detail["current"] == {"try_number": 1, "attempt_epoch": 2}
            assert "leoflow" in detail["message"] and "epoch 1" in detail["message"] and "epoch 2" in detail["message"]
        assert answers["patch without header"].json()["detail"]["reason"] == "leoflow_unidentified_execution"
        assert stack.ti_row("lf_fence", run, "work")["state"] == "running", "the stale PATCH landed"
        error_id = answers["patch"].json()["detail"]["error_id"]
        assert error_id in (stack.process_logs / "api-server.log").read_text()

        # the current epoch's header passes the fence: Airflow's own check answers (another pid: its own 409)
        current = {fencing.ATTEMPT_HEADER: fencing.format_attempt(outcome.AttemptIdentity(ti_id, 1, 2))}
        own = api.put(f"task-instances/{ti_id}/heartbeat", json=heartbeat, headers=current)
        assert own.status_code == 409 and fencing.fence_reason(own.json()) is None, own.text
        # a ti_id leoflow never ran passes untouched: Airflow answers for itself
        other = str(uuid.uuid4())
        foreign = api.put(f"task-instances/{other}/heartbeat", json=heartbeat,
                          headers={"authorization": f"Bearer {_token(stack, other)}"})
        assert foreign.status_code == 404 and fencing.fence_reason(foreign.json()) is None, foreign.text

        stack.release(run, "go")
        assert stack.wait_for_run("lf_fence", run, timeout=180) == "success"
        ti = stack.ti_row("lf_fence", run, "work")
        assert (ti["state"], ti["try_number"], ti["max_tries"]) == ("success", 1, 0), ti
        rows = wait_until(lambda: (r := stack.attempts("lf_fence", run, "work")) and r[-1]["state"] == "closed" and r,
                          60, "epoch 2's ledger row to close")
        assert [(r["attempt_epoch"], r["resolution"]) for r in rows] == [(1, "redispatched"), (2, "reported")], rows
        [body] = executions(stack, "lf_fence", "work", run)
        assert body.ended, body

        # a newer try supersedes the ti_id: the old execution's writes are refused on every route
        stack._call("POST", "/dags/lf_fence/clearTaskInstances", json={
            "dry_run": False, "dag_run_id": run, "task_ids": ["work"], "only_failed": False, "reset_dag_runs": True})
        new = wait_until(lambda: (t := stack.ti_row("lf_fence", run, "work"))["id"] != ti_id.replace("-", "") and t, 60,
                         "the clear to give the task instance a new ti_id")
        assert stack.wait_for_run("lf_fence", run, timeout=180) == "success"
        assert stack.ti_row("lf_fence", run, "work")["try_number"] == 2
        was_current = {fencing.ATTEMPT_HEADER: fencing.format_attempt(outcome.AttemptIdentity(ti_id, 1, 2))}
        late = {
            "xcom": api.post(f"xcoms/lf_fence/{run}/work/return_value", json="from the superseded try",
                             headers=was_current),
            "variable": api.put("variables/lf_fence_superseded", json={"value": "x"}, headers=was_current),
            "heartbeat": api.put(f"task-instances/{ti_id}/heartbeat", json=heartbeat, headers=was_current),
            "patch": api.patch(f"task-instances/{ti_id}/state", json=success, headers=was_current),
        }
        for what, answer in late.items():
            assert answer.status_code == 409, (what, answer.status_code, answer.text)
            detail = answer.json()["detail"]
            assert detail["reason"] == "leoflow_superseded_try" and "no longer its task's current try" in \
                detail["message"], (what, detail)
        assert stack.db("select count(*) from xcom where run_id=? and task_id='work' and key='return_value' "
                        "and value like '%superseded%'", run) == [(0,)]
        assert stack.db("select count(*) from variable where key='lf_fence_superseded'") == [(0,)]
        # the new try's own ti_id is not judged superseded: Airflow answers its (header-less) call for itself
        new_id = str(uuid.UUID(new["id"]))  # SQLite keeps Airflow's UUIDs as 32 hex digits
        mine = httpx.get(f"{stack.base_url}/execution/xcoms/lf_fence/{run}/work/return_value", timeout=30, headers={
            "authorization": f"Bearer {_token(stack, new_id)}", "airflow-api-version": API_VERSION,
            fencing.ATTEMPT_HEADER: fencing.format_attempt(outcome.AttemptIdentity(new_id, 2, 1))})
        assert fencing.fence_reason(mine.json() if mine.headers.get("content-type", "").startswith(
            "application/json") else {}) is None, mine.text
