"""A warm pod's busy attempt whose outcome is unknown (k8s review §3 and §4): the worker's next ``await`` never
lets go of it (the scheduler would read GONE and re-drive an attempt whose body may have completed), and when
the worker says it never got the attempt (the 200 that delivered it was lost) the same attempt is handed again
with a freshly minted workload token.

The ledger is the real ``LedgerStore``/``WarmLedger`` on SQLite (``test_warm_api``'s ``env``); the await loop
runs on a fake clock.
"""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest
from test_warm_api import Loop, dispatched, env, inline  # noqa: F401 - env is a fixture
from test_warm_kubernetes import view

from leoflow_airflow.api.warm import HOLD, REDELIVER, RELEASE, UNSAID, WarmService, await_taken, judge_busy
from leoflow_airflow.ledger.states import AttemptRef, AttemptState, Resolution
from leoflow_airflow.runtime.kubernetes import warmdecide
from leoflow_airflow.runtime.kubernetes.decide import Presence


def await_with(pods, auth: str, body: bytes, *, seconds: float = 1.0):
    """One ``await`` with ``body``, on a fake clock; the answer."""
    loop = Loop()

    async def gone() -> bool:
        return False

    return asyncio.run(WarmService(pods, await_seconds=seconds, poll_interval=0.25).await_(
        auth, body, gone, to_thread=inline, sleep=loop.sleep, monotonic=loop.monotonic))


def taken_body(ref: AttemptRef | None) -> bytes:
    """The await body of an agent that took ``ref`` last (None: nothing since it registered)."""
    taken = None if ref is None else {"ti_id": ref.ti_id, "try_number": ref.try_number,
                                      "attempt_epoch": ref.attempt_epoch}
    return json.dumps({"taken": taken}).encode()


@pytest.fixture
def delivered(env):  # noqa: F811 - the imported fixture
    """A worker that was handed a dispatched attempt (its row busy, the attempt exchanged as ``warm:uid-1``);
    the mint counts its calls and mints a distinct token each time."""
    store, workers, attempts, pods, auth = env
    minted = []

    def mint(attempt):
        minted.append(str(uuid.uuid4()))
        return json.dumps({"ti": attempt.ref.ti_id, "token": minted[-1]})

    pods.mint = mint
    ref = dispatched(store)
    assert workers.assign("uid-1", ref, row_version=workers.get("uid-1").row_version)
    first = await_with(pods, auth, taken_body(None))
    assert first.status == 200 and first.body["ti_id"] == ref.ti_id
    return store, workers, pods, auth, ref, minted, first


def test_a_lost_await_answer_is_delivered_again_with_a_fresh_token(delivered):
    """k8s review §4: the 200 that delivered the attempt never reached the worker, which awaits again saying it
    took nothing (or an earlier attempt): the same attempt comes back with a newly minted token, the row stays
    busy with it and counts one take."""
    store, workers, pods, auth, ref, minted, first = delivered
    earlier = AttemptRef(str(uuid.uuid4()), 1, 1)
    for body in (taken_body(None), taken_body(earlier)):
        again = await_with(pods, auth, body)
        assert again.status == 200, again
        assert (again.body["ti_id"], again.body["try_number"], again.body["attempt_epoch"]) == \
            (ref.ti_id, ref.try_number, ref.attempt_epoch)
        assert again.body["workload"]["token"] == minted[-1] != first.body["workload"]["token"]
    assert len(set(minted)) == 3
    row = workers.get("uid-1")
    assert (row.state, row.ref, row.attempts_taken) == ("busy", ref, 1)


def test_a_warm_attempt_whose_inband_record_and_report_were_lost_is_not_redriven(delivered):
    """k8s review §3: the worker ran the attempt (or, an older agent, does not say), its outcome POST and its
    report were lost; its next await keeps the busy row (answered 204 after the wait, nothing handed again), so
    the scheduler reads the attempt LIVE while the pod runs, not GONE (which, with no record, re-drives a body
    that may have completed). Once the record lands, the next await releases the row."""
    store, workers, pods, auth, ref, minted, _ = delivered
    for body in (taken_body(ref), b"{}"):
        answer = await_with(pods, auth, body)
        assert answer.status == 204 and len(minted) == 1
        row = workers.get("uid-1")
        assert (row.state, row.ref) == ("busy", ref)
    presence = warmdecide.warm_presence(workers.get("uid-1"), view("w", "uid-1"), ref, row_fresh=True,
                                        pod_confirmed_gone=False)
    assert presence is Presence.LIVE
    assert workers.store_outcome(ref, '{"state": "success"}')
    assert await_with(pods, auth, taken_body(ref)).status == 204
    assert (workers.get("uid-1").state, workers.get("uid-1").ref) == ("idle", None)


def test_a_record_whose_own_post_was_lost_lands_with_the_next_await(delivered, tmp_path):
    """k8s review §3, the fix's other half: the worker keeps its last attempt's record (the termination-message
    file its child wrote before its report) and sends it with every await; the control plane stores it (first
    write wins) and releases the worker, so the attempt's success is read from the record, not re-driven. A
    record of another attempt, or a body that is no record, stores nothing."""
    from leoflow_agent import outcome
    from leoflow_agent.warmpod import await_body

    store, workers, pods, auth, ref, minted, _ = delivered
    taken = {"ti_id": ref.ti_id, "try_number": ref.try_number, "attempt_epoch": ref.attempt_epoch}
    termination = tmp_path / "termination-log"
    other = outcome.record_for_state("success", {"state": "success", "end_date": "2026-12-07T00:00:00Z"},
                                     attempt=outcome.AttemptIdentity(str(uuid.uuid4()), 1, 1), api_version="2026-06-30")
    termination.write_text(outcome.encode(other))
    assert json.loads(await_body(taken, str(termination))) == {"taken": taken}  # another attempt's: not sent
    assert await_with(pods, auth, json.dumps({"taken": taken, "record": "garbage"}).encode()).status == 204
    assert workers.outcomes([ref]) == {} and workers.get("uid-1").state == "busy"

    mine = outcome.record_for_state("success", {"state": "success", "end_date": "2026-12-07T00:00:00Z"},
                                    attempt=outcome.AttemptIdentity(ref.ti_id, ref.try_number, ref.attempt_epoch),
                                    api_version="2026-06-30")
    termination.write_text(outcome.encode(mine) + "\n")
    body = await_body(taken, str(termination))
    assert json.loads(body) == {"taken": taken, "record": outcome.encode(mine)}
    assert await_with(pods, auth, body).status == 204 and len(minted) == 1
    assert workers.outcomes([ref]) == {ref: outcome.encode(mine)}
    assert (workers.get("uid-1").state, workers.get("uid-1").ref) == ("idle", None)
    assert json.loads(await_body(None, str(termination))) == {"taken": None}
    assert json.loads(await_body(taken, str(tmp_path / "missing"))) == {"taken": taken}


def test_a_busy_attempt_that_moved_on_is_released_whatever_the_worker_says(delivered):
    """The attempt's report landed (REPORTED) or it was settled: nothing of it is left to lose, so the next
    await releases the row, and a worker that says it took nothing is not handed a finished attempt."""
    store, workers, pods, auth, ref, minted, _ = delivered
    assert store.transition(ref, expected=[AttemptState.DISPATCHED], to=AttemptState.CLOSED,
                            resolution=Resolution.MOVED_ON)
    assert await_with(pods, auth, taken_body(None)).status == 204
    assert workers.get("uid-1").state == "idle" and len(minted) == 1


def test_judge_busy():
    ref = AttemptRef(str(uuid.uuid4()), 1, 2)

    class A:
        pass

    a = A()
    a.ref, a.state, a.exchanged_at, a.exchange_credential_id = ref, AttemptState.DISPATCHED, object(), "warm:u"

    def judge(attempt=a, *, stored=False, taken=None):
        return judge_busy(attempt, ref, "u", outcome_stored=stored, taken=taken)[0]

    assert judge() == REDELIVER
    assert judge(taken=AttemptRef(ref.ti_id, 1, 1)) == REDELIVER  # an earlier epoch of the same ti
    assert judge(taken=ref) == HOLD and judge(taken=UNSAID) == HOLD
    assert judge(stored=True) == RELEASE and judge(None) == RELEASE
    newer = replace_attrs(a, ref=AttemptRef(ref.ti_id, 1, 3))
    assert judge(newer) == RELEASE
    for state in (AttemptState.REPORTED, AttemptState.EXITED, AttemptState.CLOSED):
        assert judge(replace_attrs(a, state=state)) == RELEASE
    assert judge(replace_attrs(a, exchange_credential_id="warm:other")) == RELEASE  # not delivered here
    assert judge(replace_attrs(a, exchanged_at=None)) == RELEASE


def replace_attrs(obj, **changes):
    """A copy of a plain object with ``changes`` set."""
    new = type(obj)()
    new.__dict__.update({**obj.__dict__, **changes})
    return new


@pytest.mark.parametrize(("body", "taken"), [
    (b"{}", UNSAID), (b'{"taken": null}', None), (b"[]", UNSAID), (b"nope", UNSAID),
    (b'{"taken": {"ti_id": "t", "try_number": 1, "attempt_epoch": 2}}', AttemptRef("t", 1, 2)),
    (b'{"taken": {"ti_id": "t", "try_number": true, "attempt_epoch": 2}}', UNSAID),
    (b'{"taken": {"ti_id": "", "try_number": 1, "attempt_epoch": 2}}', UNSAID),
    (b'{"taken": "t/1/2"}', UNSAID),
])
def test_await_taken(body, taken):
    """What the worker says it took last: a ref, None (nothing yet), or UNSAID (an older agent, or garbage)."""
    got = await_taken(body)
    assert got is UNSAID if taken is UNSAID else got == taken
