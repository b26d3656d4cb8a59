"""The warm pod's agent, ``python -m leoflow_agent warm-pod`` (issue 11 item 2), as a real process against a real
Execution API.

Real parts: an Airflow api-server and dag-processor (``devtools.stack``, SQLite, no scheduler) serving a DAG
bundle that holds ``tests/dags/leoflow_test_warm_pod.py``; the agent's command run from this checkout's venv with
the stack's Airflow config. The plugin app's three routes (register, await, outcome; branch warm-server) are
played by a small stdlib HTTP server in this test, narrow and wire-level: it checks what the agent sends (the
projected token in the register body, the bearer credential, the outcome records) and hands out two attempts
whose workloads are built here as the exchange builds them (an ``ExecuteTask`` with a workload token signed with
the stack's JWT secret). The attempts' task instances are made ``queued`` in Airflow's database by this test, in
place of a scheduler.

What a user would notice: the agent registers, parses its DAG file once (its top level runs once in the agent's
processes, and neither task process parses it), runs the two attempts one after another, each on a fresh
``HOME``/``TMPDIR``, with what the first left in ``/tmp`` (a private directory here, never the machine's /tmp)
gone before the second starts; each attempt's outcome record reaches the outcome route while its task instance
is still ``running`` (before the terminal PATCH it answers), the termination message keeps the last attempt's
record, and the agent exits 0 at ``max_attempts`` without asking for a third.
"""

from __future__ import annotations

import json
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from devtools.stack import REPO_ROOT, AirflowStack
from leoflow_agent import outcome, warmpod

pytestmark = [pytest.mark.airflow, pytest.mark.timeout(600)]

DAG_ID = "leoflow_test_warm_pod"
DAG_FILE = REPO_ROOT / "tests" / "dags" / f"{DAG_ID}.py"
PROJECTED_TOKEN = "projected-service-account-token"
CREDENTIAL = "warm-credential-" + "x" * 27
POD_UID = str(uuid.uuid4())


class PluginApp:
    """The plugin app's warm routes, played over HTTP on 127.0.0.1 (a ``ThreadingHTTPServer`` in a thread).

    Every request is kept in :attr:`events` as ``(route, details)``. ``assignments`` are handed out one per await
    in order; with none left an await answers 204 after 0.5 s, or 401 ``unknown_credential`` when ``retire``.
    ``ti_state(ti_id)`` is read when an outcome record arrives (the task instance's state in Airflow's database
    at that moment)."""

    def __init__(self, assignments: list[dict], ti_state, *, retire: bool = False) -> None:
        self.assignments = list(assignments)
        self.retire = retire
        self.events: list[tuple[str, dict]] = []
        self.problems: list[str] = []
        self.ti_state = ti_state
        app = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # quiet
                pass

            def _answer(self, status: int, body: dict | None = None) -> None:
                data = b"" if body is None else json.dumps(body).encode()
                self.send_response(status)
                if body is not None:
                    self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                bearer = self.headers.get("authorization")
                if self.path == "/leoflow" + warmpod.WARM_REGISTER_PATH:
                    sent = json.loads(body)
                    app.events.append(("register", {"token": sent.get("token"), "bearer": bearer}))
                    return self._answer(200, {"credential": CREDENTIAL, "pod_uid": POD_UID,
                                              "dag_version_id": "v", "await_seconds": 2})
                if bearer != f"Bearer {CREDENTIAL}":
                    app.problems.append(f"{self.path} without the credential: {bearer!r}")
                    return self._answer(401, {"error": "unknown_credential", "error_id": "00"})
                if self.path == "/leoflow" + warmpod.WARM_AWAIT_PATH:
                    app.events.append(("await", {"body": body.decode()}))
                    if app.assignments:
                        return self._answer(200, app.assignments.pop(0))
                    if app.retire:
                        return self._answer(401, {"error": "unknown_credential", "error_id": "0123abcd"})
                    time.sleep(0.5)
                    return self._answer(204)
                if self.path == "/leoflow" + warmpod.OUTCOME_PATH:
                    record = outcome.decode(body)
                    ti_id = record.ti_id if record else None
                    app.events.append(("outcome", {"record": record,
                                                   "ti_state": app.ti_state(ti_id) if ti_id else None}))
                    return self._answer(200, {"stored": True})
                app.problems.append(f"unexpected route {self.path}")
                return self._answer(404, {"error": "not_found", "error_id": "00"})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/leoflow"
        self.thread = threading.Thread(target=self.server.serve_forever, name="plugin-app", daemon=True)

    def __enter__(self) -> PluginApp:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory):
    """An api-server and dag-processor (no scheduler) on a bundle holding only the test DAG."""
    dags = tmp_path_factory.mktemp("warm-pod-dags")
    shutil.copy(DAG_FILE, dags / DAG_FILE.name)
    with AirflowStack(tmp_path_factory.mktemp("warm-pod-stack"), dags_folder=dags) as s:
        s.migrate()
        s.start(wait_for_dags=[DAG_ID], scheduler=False)
        yield s


def _db(stack: AirflowStack) -> sqlite3.Connection:
    conn = sqlite3.connect(stack.home / "airflow.db", timeout=60)
    conn.row_factory = sqlite3.Row
    return conn


def _queue_attempts(stack: AirflowStack, run_id: str) -> list[dict]:
    """Make the run's task instances ``queued`` at try 1 (a scheduler's work) and return, in task order, the
    await answers that assign them: ``{"ti_id", "try_number", "attempt_epoch", "workload"}`` with the
    ``ExecuteTask`` built as the exchange builds it (a fresh workload token signed with the stack's secret)."""
    from airflow.api_fastapi.auth.tokens import JWTGenerator
    from airflow.executors.workloads import BundleInfo, ExecuteTask
    from airflow.executors.workloads.task import TaskInstanceDTO

    deadline = time.monotonic() + 60
    while True:
        with _db(stack) as conn:
            rows = conn.execute("SELECT id, task_id, dag_version_id FROM task_instance WHERE dag_id=? AND run_id=? "
                                "ORDER BY task_id", (DAG_ID, run_id)).fetchall()
        if len(rows) == 2 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert [r["task_id"] for r in rows] == ["t0", "t1"], [dict(r) for r in rows]
    with _db(stack) as conn:
        conn.execute("UPDATE task_instance SET state='queued', try_number=1, queued_dttm=? WHERE dag_id=? AND "
                     "run_id=?", (datetime.now(timezone.utc).isoformat(" "), DAG_ID, run_id))
    generator = JWTGenerator(secret_key=stack._jwt_secret, valid_for=600, audience="urn:airflow.apache.org:task")
    answers = []
    for epoch, row in enumerate(rows, start=1):
        ti = TaskInstanceDTO(id=uuid.UUID(row["id"]), task_id=row["task_id"], dag_id=DAG_ID, run_id=run_id,
                             try_number=1, dag_version_id=uuid.UUID(row["dag_version_id"]), map_index=-1,
                             pool_slots=1, priority_weight=1, queue="default")
        ti_id = str(ti.id)  # SQLite keeps the uuid as 32 hex digits; the wire has its canonical form
        workload = ExecuteTask(token=ExecuteTask.generate_token(ti_id, generator), dag_rel_path=DAG_FILE.name,
                               bundle_info=BundleInfo(name="leoflow-dags"), ti=ti,
                               log_path=f"dag_id={DAG_ID}/run_id={run_id}/task_id={row['task_id']}/attempt=1.log")
        answers.append({"ti_id": ti_id, "try_number": 1, "attempt_epoch": epoch,
                        "workload": json.loads(workload.model_dump_json())})
    return answers


def _agent_env(stack: AirflowStack, app: PluginApp, tmp_path: Path, **extra: str) -> dict[str, str]:
    """The agent's environment: the stack's Airflow config, the cold pod's variables and the warm ones."""
    token = tmp_path / "token"
    token.write_text(PROJECTED_TOKEN + "\n")
    return {**stack.env(), "LEOFLOW_EXCHANGE_URL": app.url, "LEOFLOW_TOKEN_FILE": str(token),
            "LEOFLOW_CREDENTIAL_CEILING_SECONDS": "300", "LEOFLOW_WARM_BUNDLE": "leoflow-dags",
            "LEOFLOW_WARM_DAG_FILE": DAG_FILE.name, **extra}


AGENT = [sys.executable, "-m", "leoflow_agent", "warm-pod", "--termination-message-path"]


def test_a_retired_worker_and_a_sigterm_while_idle_each_end_it_with_exit_0(stack, tmp_path):
    """An await answered 401 (its row deleted: retired) ends the worker at once with exit 0; so does a SIGTERM
    while it waits for an attempt (the pod deleted). Neither touches the termination message."""
    term = tmp_path / "termination-log"
    with PluginApp([], lambda ti_id: None, retire=True) as app:
        retired = subprocess.run([*AGENT, str(term)], env=_agent_env(stack, app, tmp_path), capture_output=True,
                                 text=True, timeout=120)
    assert retired.returncode == 0, retired.stderr[-3000:]
    assert [route for route, _ in app.events] == ["register", "await"]
    assert "retired by the control plane (HTTP 401)" in retired.stdout + retired.stderr
    log = tmp_path / "agent.log"
    with PluginApp([], lambda ti_id: None) as app, open(log, "w") as out_file:
        agent = subprocess.Popen([*AGENT, str(term)], env=_agent_env(stack, app, tmp_path), stdout=out_file,
                                 stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 120
            while sum(route == "await" for route, _ in app.events) < 2 and time.monotonic() < deadline:
                assert agent.poll() is None, log.read_text()[-3000:]
                time.sleep(0.1)
            agent.send_signal(signal.SIGTERM)
            agent.wait(timeout=30)
        finally:
            if agent.poll() is None:
                agent.kill()
    out = log.read_text()
    assert agent.returncode == 0 and "stopped by SIGTERM while idle" in out, out[-3000:]
    assert not term.exists()


def test_a_warm_pod_agent_runs_two_attempts_from_one_parse_and_sweeps_between_them(stack, tmp_path):
    run_id = stack.trigger(DAG_ID)
    assignments = _queue_attempts(stack, run_id)
    ti_ids = [a["ti_id"] for a in assignments]

    def ti_state(ti_id: str) -> str | None:
        with _db(stack) as conn:
            row = conn.execute("SELECT state FROM task_instance WHERE id=?", (uuid.UUID(ti_id).hex,)).fetchone()
        return row["state"] if row else None

    private_tmp, private_shm, scratch = tmp_path / "tmp", tmp_path / "shm", tmp_path / "scratch"
    for d in (private_tmp, private_shm, scratch):
        d.mkdir()
    (private_tmp / "before-any-attempt").write_text("x")
    (private_shm / "sem.before").write_text("x")
    parse_log, probe, term = tmp_path / "parses", tmp_path / "probe.jsonl", tmp_path / "termination-log"
    with PluginApp(assignments, ti_state) as app:
        env = _agent_env(stack, app, tmp_path, **{
               "LEOFLOW_WARM_MAX_ATTEMPTS": "2",
               "LEOFLOW_WARM_MAX_LIFETIME_SECONDS": "600", "LEOFLOW_WARM_IDLE_TTL_SECONDS": "120",
               "LEOFLOW_WARM_ISOLATION": "read-only-root", "LEOFLOW_WARM_SCRATCH": str(scratch),
               "LEOFLOW_WARM_SWEEP_ROOTS": f"{private_tmp}:{private_shm}",
               "LEOFLOW_TEST_PARSE_LOG": str(parse_log), "LEOFLOW_TEST_PROBE": str(probe)})
        agent = subprocess.run([*AGENT, str(term)], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=400)
    log = agent.stdout + agent.stderr
    (tmp_path / "agent.log").write_text(log)  # kept by pytest for a failure's post-mortem
    assert agent.returncode == 0, log[-5000:]
    assert app.problems == [], app.problems

    # registered with the projected token, then: await, outcome of 1, await, outcome of 2, and no third await
    routes = [route for route, _ in app.events]
    assert routes == ["register", "await", "outcome", "await", "outcome"], (routes, log[-5000:])
    assert app.events[0][1] == {"token": PROJECTED_TOKEN, "bearer": None}
    # each await names the attempt handed to the worker last (none at first), so a lost answer is handed again
    assert json.loads(app.events[1][1]["body"]) == {"taken": None}
    first = {key: assignments[0][key] for key in ("ti_id", "try_number", "attempt_epoch")}
    second_await = json.loads(app.events[3][1]["body"])
    assert second_await["taken"] == first and set(second_await) == {"taken", "record"}, second_await
    # ... and carries the record of that attempt again (it lands even when its own POST was lost)
    again = outcome.decode(second_await["record"])
    assert again is not None and again.attempt() == outcome.AttemptIdentity(ti_ids[0], 1, 1), second_await
    outcomes = [details for route, details in app.events if route == "outcome"]
    for number, (ti_id, sent) in enumerate(zip(ti_ids, outcomes), start=1):
        record = sent["record"]
        assert record is not None and record.attempt() == outcome.AttemptIdentity(ti_id, 1, number), record
        assert (record.outcome, record.state) == (outcome.Outcome.SUCCESS, "success"), record
        assert sent["ti_state"] == "running", "the record must arrive before the PATCH it answers"
        assert ti_state(ti_id) == "success"
    assert "stops after 2 attempts (max_attempts)" in log
    assert CREDENTIAL not in log and PROJECTED_TOKEN not in log and "eyJ" not in log

    # the termination message holds the last attempt's record, as a cold pod's would
    assert outcome.decode(term.read_text(), expect=outcome.AttemptIdentity(ti_ids[1], 1, 2)).state == "success"

    # one parse: the DAG file's top level ran once in the agent's processes; neither task process parsed it
    parses = parse_log.read_text().split()
    lines = [json.loads(line) for line in probe.read_text().splitlines()]
    assert [line["task_id"] for line in lines] == ["t0", "t1"]
    assert len(parses) == 1, parses
    assert [(line["parsed_here"], str(line["parsed_in"])) for line in lines] == [(False, parses[0])] * 2

    # isolation: fresh HOME/TMPDIR per attempt under the scratch dir, removed after; /tmp swept between attempts
    first, second = lines
    assert first["found"] == ["before-any-attempt"] and second["found"] == [], lines
    assert first["home"] != second["home"] and first["tmpdir"] != second["tmpdir"]
    for line in lines:
        assert line["home"].startswith(str(scratch)) and line["tmp_file"].startswith(line["tmpdir"] + "/"), line
    assert list(scratch.iterdir()) == [], "each attempt's HOME/TMPDIR is removed after it"
    assert list(private_tmp.iterdir()) == [] and list(private_shm.iterdir()) == []


def _alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie counts as gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_sigterm_during_an_attempt_reaches_it_and_the_worker_takes_no_other(stack, tmp_path):
    """The pod is deleted while an attempt runs: the SIGTERM reaches the attempt's supervisor, which passes it on
    to the task (Airflow 3.3 then runs the operator's ``on_kill`` and lets the task go on, as in a cold pod, whose
    kubelet SIGKILLs it after the grace period). The worker takes no other attempt: once this one ends (the test
    lets the task finish) and its record is sent, once, it exits 0 without another await. The success the task
    reports after the signal is held as ``killed``."""
    run_id = stack.trigger(DAG_ID)
    assignments = _queue_attempts(stack, run_id)
    hold = tmp_path / "hold"
    hold.write_text("hold")
    log = tmp_path / "agent.log"
    with PluginApp(assignments, lambda ti_id: None) as app, open(log, "w") as out_file:
        env = _agent_env(stack, app, tmp_path, LEOFLOW_TEST_HOLD=str(hold),
                         LEOFLOW_WARM_SWEEP_ROOTS=str(tmp_path / "tmp"), LEOFLOW_TEST_PROBE=str(tmp_path / "probe"))
        (tmp_path / "tmp").mkdir()
        agent = subprocess.Popen([*AGENT, str(tmp_path / "termination-log")], env=env, stdout=out_file,
                                 stderr=subprocess.STDOUT)
        try:
            pid_file = Path(f"{hold}.pid")
            deadline = time.monotonic() + 120
            while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
                assert agent.poll() is None, log.read_text()[-3000:]
                time.sleep(0.1)
            task_pid = int(pid_file.read_text())
            agent.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + 30
            while "Received signal, forwarding to task subprocess" not in log.read_text():
                assert time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.1)
            assert agent.poll() is None, "the worker must wait for its attempt"
            hold.unlink()
            agent.wait(timeout=60)
        finally:
            if agent.poll() is None:
                agent.kill()
    out = log.read_text()
    assert agent.returncode == 0 and "stopped by SIGTERM after 1 attempts" in out, out[-3000:]
    assert not _alive(task_pid)
    assert [route for route, _ in app.events] == ["register", "await", "outcome"], app.events
    # the task went on after the SIGTERM and returned: that success is not trusted (DESIGN §2 "A success after
    # SIGTERM"), the record says killed and the scheduler re-runs the task on the infra budget
    [sent] = [details for route, details in app.events if route == "outcome"]
    assert sent["record"].reason == outcome.Reason.KILLED and sent["record"].state is None, sent
