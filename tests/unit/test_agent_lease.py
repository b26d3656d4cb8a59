"""The task pod agent's lease on its task (k8s review §14; ``leoflow_agent.lease``): an agent that hears no answer
from the Execution API for ``[leoflow] agent_lease_seconds`` kills its task's process group (SIGTERM, then SIGKILL
after ``[core] killed_task_cleanup_time``), records ``heartbeat_lost`` and exits, so a partitioned pod never runs
beside the re-run the scheduler starts once the heartbeat is silent.

The lease's clock is a fake one; the kill is a real one, of real child process groups (``sleep``, ``sh``). The
transport's api-server is an ``httpx.MockTransport``; the record sink the real Lite record file.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest

from leoflow_agent import lease, outcome, podmain
from leoflow_agent.transport import RecordingTransport, file_sink

TI = "01900000-0000-7000-8000-0000000000c7"
ATTEMPT = outcome.AttemptIdentity(TI, 1, 1)
SUCCESS = {"state": "success", "end_date": "2026-01-01T00:00:00Z", "task_outlets": [], "outlet_events": [],
           "rendered_map_index": None}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _watchdog(clock: Clock, **kw) -> tuple[lease.LeaseWatchdog, list[str]]:
    said: list[tuple[str, str]] = []
    kw.setdefault("targets", lambda: [])
    dog = lease.LeaseWatchdog(60, cleanup=0.5, on_expired=lambda why: said.append(("expired", why)),
                              exit=lambda why: said.append(("exit", why)), clock=clock, **kw)
    return dog, said


def test_a_reachable_answer_renews_the_lease_and_errors_or_5xx_do_not():
    """Any answer below 500 (a 204 heartbeat, a 409 of the fence: the server is there) renews the lease; a 503 of
    a proxy, or no answer at all, does not. It expires ``lease`` seconds after the last reachable answer, once."""
    clock = Clock()
    dog, said = _watchdog(clock)
    clock.now += 59
    dog.answered(204)
    clock.now += 59
    dog.answered(409)
    clock.now += 59
    assert not dog.check() and said == []
    dog.answered(503)
    dog.answered(502)
    clock.now += 1
    assert dog.check()
    assert [kind for kind, _ in said] == ["expired", "exit"]
    assert "agent_lease_seconds = 60" in said[0][1]
    clock.now += 100
    assert dog.check() and len(said) == 2  # once


def test_bad_leases_are_refused():
    with pytest.raises(ValueError, match="lease"):
        lease.LeaseWatchdog(0, cleanup=1)
    with pytest.raises(ValueError, match="cleanup"):
        lease.LeaseWatchdog(10, cleanup=-1)


def _reaped(proc: subprocess.Popen) -> threading.Thread:
    """Reap ``proc`` as the supervisor reaps its task process (a zombie would still be in its group)."""
    t = threading.Thread(target=proc.wait, daemon=True)
    t.start()
    return t


def test_at_expiry_the_task_group_gets_sigterm_and_goes():
    """A task that obeys SIGTERM ends with it; no SIGKILL follows, and the kill does not wait out the grace."""
    task = subprocess.Popen(["sleep", "60"], start_new_session=True)
    reaper = _reaped(task)
    clock = Clock()
    dog, said = _watchdog(clock, targets=lambda: [task.pid])
    dog.cleanup = 30.0
    clock.now += 61
    started = time.monotonic()
    assert dog.check()
    reaper.join(5)
    assert task.returncode == -signal.SIGTERM
    assert time.monotonic() - started < 10


def test_a_task_that_outlives_sigterm_gets_sigkill_after_the_cleanup_time(tmp_path):
    """The whole group is signalled (the shell and the ``sleep`` it started); what ignores SIGTERM is SIGKILLed
    ``killed_task_cleanup_time`` later."""
    termed = tmp_path / "termed"
    script = f"trap 'echo term > {termed}' TERM; while :; do sleep 0.05; done"
    task = subprocess.Popen(["sh", "-c", script], start_new_session=True)
    reaper = _reaped(task)
    time.sleep(0.2)  # the trap is installed
    clock = Clock()
    dog, _ = _watchdog(clock, targets=lambda: [task.pid])
    clock.now += 61
    started = time.monotonic()
    dog.check()
    reaper.join(5)
    assert termed.read_text().strip() == "term"  # SIGTERM came first
    assert task.returncode == -signal.SIGKILL
    assert time.monotonic() - started >= dog.cleanup


def test_the_watchdog_finds_the_task_process_groups_of_its_children():
    """The Task SDK supervisor puts its task process in a group of its own: that group is the target, never the
    agent's own (a child left in it is named by its pid alone)."""
    own = subprocess.Popen(["sleep", "30"])
    grouped = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        groups = lease.child_process_groups()
        assert grouped.pid in groups and -own.pid in groups and os.getpgid(0) not in groups
    finally:
        for p in (own, grouped):
            p.kill()
            p.wait()


def _transport(tmp_path, answer, watchdog):
    record = str(tmp_path / "record.json")
    return record, RecordingTransport(httpx.MockTransport(answer), attempt=ATTEMPT, sinks=[file_sink(record)],
                                      on_reported=lambda state, recorded: None, on_answer=watchdog.answered)


def test_the_transport_feeds_the_lease_and_its_expiry_records_heartbeat_lost(tmp_path):
    """Every answer the server sent renews the lease through ``RecordingTransport``; a transport error does not.
    At expiry the attempt is recorded ``heartbeat_lost`` and a terminal report the dying task still sends is
    refused here: the scheduler re-runs it as an infra loss, never replays it."""
    clock = Clock()
    up = [True]

    def api_server(request: httpx.Request) -> httpx.Response:
        if not up[0]:
            raise httpx.ConnectError("no route to host", request=request)
        return httpx.Response(204)

    holder: list[RecordingTransport] = []
    dog = lease.LeaseWatchdog(60, cleanup=0, on_expired=lambda why: holder[0].lease_lost(why), clock=clock)
    record, transport = _transport(tmp_path, api_server, dog)
    holder.append(transport)
    client = httpx.Client(base_url="http://api.test/execution/", transport=transport)
    clock.now += 50
    client.put(f"task-instances/{TI}/heartbeat", json={})
    clock.now += 50
    assert not dog.check()
    up[0] = False
    with pytest.raises(httpx.ConnectError):
        client.put(f"task-instances/{TI}/heartbeat", json={})
    clock.now += 11
    assert dog.check()
    with open(record) as fh:
        assert json.load(fh)["reason"] == "heartbeat_lost"
    up[0] = True
    refused = client.patch(f"task-instances/{TI}/state", json=SUCCESS)
    assert refused.status_code == 409 and "heartbeat" in refused.text


def test_an_expiry_after_a_terminal_record_keeps_it(tmp_path):
    """A success recorded before the lease ran out stays the record (the scheduler replays it)."""
    clock = Clock()
    dog = lease.LeaseWatchdog(60, cleanup=0, clock=clock)
    record, transport = _transport(tmp_path, lambda request: httpx.Response(503), dog)
    client = httpx.Client(base_url="http://api.test/execution/", transport=transport)
    assert client.patch(f"task-instances/{TI}/state", json=SUCCESS).status_code == 503
    clock.now += 61
    transport.lease_lost("the Execution API gave no answer for 61 s")
    with open(record) as fh:
        assert json.load(fh)["state"] == "success"


def test_the_pod_agent_reads_its_lease_from_the_environment():
    base = {podmain.ENV_EXCHANGE_URL: "http://x/leoflow", podmain.ENV_TOKEN_FILE: "/t"}
    assert podmain.config_from_env(base).lease_seconds is None  # an older pod spec: no lease
    assert podmain.config_from_env({**base, podmain.ENV_LEASE: "45"}).lease_seconds == 45.0
    assert podmain.config_from_env({**base, podmain.ENV_LEASE: "0"}).lease_seconds is None
    with pytest.raises(podmain.PodConfigError, match=podmain.ENV_LEASE):
        podmain.config_from_env({**base, podmain.ENV_LEASE: "soon"})
    with pytest.raises(podmain.PodConfigError, match=podmain.ENV_LEASE):
        podmain.config_from_env({**base, podmain.ENV_LEASE: "-1"})


def test_exit_now_ends_the_process_with_the_lease_code():
    code = "from leoflow_agent import lease; lease.exit_now('x'); print('not reached')"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == lease.EXIT_LEASE_EXPIRED == podmain.EXIT_LEASE_EXPIRED
    assert "not reached" not in done.stdout


def test_supervise_attempt_with_a_lease_kills_a_task_cut_off_from_the_api_server(tmp_path, monkeypatch):
    """The wiring a task pod runs (``podmain.run_pod`` / the warm attempt child pass ``lease_seconds``): the
    supervisor's calls get no answer (nothing listens), so after the lease the task's process group is killed,
    the record says ``heartbeat_lost`` and the agent exits. Without a lease (Lite) nothing of this happens."""
    from types import SimpleNamespace

    from airflow.sdk.execution_time import supervisor as sdk_supervisor

    from leoflow_agent import runner

    exits: list[str] = []
    monkeypatch.setattr(lease, "exit_now", exits.append)
    monkeypatch.setenv("AIRFLOW__CORE__KILLED_TASK_CLEANUP_TIME", "1")
    tasks: list[subprocess.Popen] = []

    def supervise_task(*, client, **kw):
        task = subprocess.Popen(["sleep", "60"], start_new_session=True)  # the task process, in its own group
        tasks.append(task)
        calls = httpx.Client(base_url=str(client.base_url), transport=client.leoflow_transport)  # no SDK retries
        deadline = time.monotonic() + 20
        while task.poll() is None and time.monotonic() < deadline:
            try:
                calls.put(f"task-instances/{TI}/heartbeat", json={})
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        if task.poll() is None:
            task.kill()
        task.wait()
        return 0

    monkeypatch.setattr(sdk_supervisor, "supervise_task", supervise_task)
    ti = SimpleNamespace(id=TI, dag_id="d", task_id="t", map_index=-1)
    workload = SimpleNamespace(ti=ti, token="x", log_path=str(tmp_path / "ti.log"), bundle_info=None,
                               dag_rel_path="d.py")
    record = str(tmp_path / "record.json")
    runner.supervise_attempt(workload, server="http://127.0.0.1:9/execution/", attempt=ATTEMPT,
                             sinks=[file_sink(record)], on_reported=lambda s, r: None, lease_seconds=0.5)
    assert tasks[0].returncode == -signal.SIGTERM
    assert len(exits) == 1 and "agent_lease_seconds = 0.5" in exits[0]
    with open(record) as fh:
        assert json.load(fh)["reason"] == "heartbeat_lost"
