"""The warm pod's agent, ``python -m leoflow_agent warm-pod`` (issue 11 item 2): its pure parts. Its environment
and the errors a bad one gets, the wire names the other branches import, the register and await answers, the
self-limits, the sweep between attempts (on a temporary directory, never the machine's /tmp) and the in-band
outcome sink (over a fake ``post``). ``tests/integration/test_warm_pod_agent_process.py`` runs the real command.
"""

from __future__ import annotations

import json
import os
import sys

import httpx
import pytest

from leoflow_agent import outcome, podmain, warmpod
from leoflow_agent.warmpod import (
    AnswerError,
    AwaitVerdict,
    LimitState,
    StopReason,
    WarmConfigError,
    classify_await,
    config_from_env,
    decide_limits,
    decode_assignment,
    decode_registration,
    outcome_post_sink,
    sweep,
)

URL = "http://exchange.invalid/leoflow"
TI_ID = "0190b6c2-7e4f-7a3c-9d1e-2b5f6a7c8d90"
CREDENTIAL = "c" * 43
GOOD_ENV = {
    "LEOFLOW_EXCHANGE_URL": URL,
    "LEOFLOW_TOKEN_FILE": "/var/run/secrets/leoflow/token",
    "LEOFLOW_CREDENTIAL_CEILING_SECONDS": "600",
    "LEOFLOW_WARM_BUNDLE": "dags",
    "LEOFLOW_WARM_BUNDLE_VERSION": "",
    "LEOFLOW_WARM_DAG_FILE": "sub/my_dag.py",
    "LEOFLOW_WARM_MAX_ATTEMPTS": "5",
    "LEOFLOW_WARM_MAX_LIFETIME_SECONDS": "1800",
    "LEOFLOW_WARM_IDLE_TTL_SECONDS": "120.5",
    "LEOFLOW_WARM_ISOLATION": "read-only-root",
    "LEOFLOW_WARM_SCRATCH": "/scratch/",
}


def test_the_wire_names_are_the_contracts():
    """The plugin app and the pod builder (other branches) import these strings: they must be exactly these."""
    assert (warmpod.WARM_REGISTER_PATH, warmpod.WARM_AWAIT_PATH, warmpod.OUTCOME_PATH) == (
        "/v1/warm/register", "/v1/warm/await", "/v1/outcome")
    assert (warmpod.ENV_WARM_BUNDLE, warmpod.ENV_WARM_BUNDLE_VERSION, warmpod.ENV_WARM_DAG_FILE,
            warmpod.ENV_WARM_MAX_ATTEMPTS, warmpod.ENV_WARM_MAX_LIFETIME, warmpod.ENV_WARM_IDLE_TTL,
            warmpod.ENV_WARM_ISOLATION, warmpod.ENV_WARM_SCRATCH) == (
        "LEOFLOW_WARM_BUNDLE", "LEOFLOW_WARM_BUNDLE_VERSION", "LEOFLOW_WARM_DAG_FILE", "LEOFLOW_WARM_MAX_ATTEMPTS",
        "LEOFLOW_WARM_MAX_LIFETIME_SECONDS", "LEOFLOW_WARM_IDLE_TTL_SECONDS", "LEOFLOW_WARM_ISOLATION",
        "LEOFLOW_WARM_SCRATCH")
    assert warmpod.ISOLATION_MODES == ("shared", "read-only-root")


def test_config_from_env():
    got = config_from_env(GOOD_ENV)
    assert got.pod == podmain.PodConfig(exchange_url=URL, token_file="/var/run/secrets/leoflow/token",
                                        message_budget=outcome.TERMINATION_MESSAGE_BUDGET, ceiling_seconds=600)
    assert (got.bundle, got.bundle_version, got.dag_file) == ("dags", None, "sub/my_dag.py")
    assert (got.max_attempts, got.max_lifetime_seconds, got.idle_ttl_seconds) == (5, 1800.0, 120.5)
    assert (got.isolation, got.scratch, got.sweep_roots) == ("read-only-root", "/scratch", ())  # none unless named
    assert got.endpoint(warmpod.WARM_AWAIT_PATH) == URL + "/v1/warm/await"
    key = got.file_key()
    assert (key.bundle, key.version, key.path) == ("dags", None, "sub/my_dag.py")
    assert config_from_env({**GOOD_ENV, "LEOFLOW_WARM_BUNDLE_VERSION": "v7"}).bundle_version == "v7"
    assert config_from_env({**GOOD_ENV, "LEOFLOW_WARM_SWEEP_ROOTS": "/a/tmp:/b/"}).sweep_roots == ("/a/tmp", "/b")
    shared = {**GOOD_ENV, "LEOFLOW_WARM_ISOLATION": "shared", "LEOFLOW_TOKEN_FILE": "/tmp/t",
              "LEOFLOW_WARM_SCRATCH": ""}
    assert config_from_env(shared).isolation == "shared", "nothing is swept: the sweep roots do not matter"


def test_absent_limits_and_isolation_read_as_the_defaults():
    bare = {k: v for k, v in GOOD_ENV.items()
            if k in ("LEOFLOW_EXCHANGE_URL", "LEOFLOW_TOKEN_FILE", "LEOFLOW_WARM_BUNDLE", "LEOFLOW_WARM_DAG_FILE")}
    got = config_from_env(bare)
    assert (got.max_attempts, got.max_lifetime_seconds, got.idle_ttl_seconds, got.isolation, got.scratch) == (
        warmpod.DEFAULT_MAX_ATTEMPTS, warmpod.DEFAULT_MAX_LIFETIME_SECONDS, warmpod.DEFAULT_IDLE_TTL_SECONDS,
        "shared", None)


@pytest.mark.parametrize(("change", "named"), [
    ({"LEOFLOW_EXCHANGE_URL": "ftp://x"}, "LEOFLOW_EXCHANGE_URL"),
    ({"LEOFLOW_CREDENTIAL_CEILING_SECONDS": "-1"}, "LEOFLOW_CREDENTIAL_CEILING_SECONDS"),
    ({"LEOFLOW_WARM_BUNDLE": " "}, "LEOFLOW_WARM_BUNDLE"),
    ({"LEOFLOW_WARM_DAG_FILE": ""}, "LEOFLOW_WARM_DAG_FILE"),
    ({"LEOFLOW_WARM_DAG_FILE": "/abs/dag.py"}, "LEOFLOW_WARM_DAG_FILE"),
    ({"LEOFLOW_WARM_DAG_FILE": "a/../../etc/passwd"}, "LEOFLOW_WARM_DAG_FILE"),
    ({"LEOFLOW_WARM_MAX_ATTEMPTS": "0"}, "LEOFLOW_WARM_MAX_ATTEMPTS"),
    ({"LEOFLOW_WARM_MAX_ATTEMPTS": "2.5"}, "LEOFLOW_WARM_MAX_ATTEMPTS"),
    ({"LEOFLOW_WARM_MAX_LIFETIME_SECONDS": "0"}, "LEOFLOW_WARM_MAX_LIFETIME_SECONDS"),
    ({"LEOFLOW_WARM_MAX_LIFETIME_SECONDS": "inf"}, "LEOFLOW_WARM_MAX_LIFETIME_SECONDS"),
    ({"LEOFLOW_WARM_IDLE_TTL_SECONDS": "nan"}, "LEOFLOW_WARM_IDLE_TTL_SECONDS"),
    ({"LEOFLOW_WARM_IDLE_TTL_SECONDS": "soon"}, "LEOFLOW_WARM_IDLE_TTL_SECONDS"),
    ({"LEOFLOW_WARM_ISOLATION": "strict"}, "LEOFLOW_WARM_ISOLATION"),
    ({"LEOFLOW_WARM_SCRATCH": ""}, "LEOFLOW_WARM_SCRATCH"),
    ({"LEOFLOW_WARM_SCRATCH": "scratch"}, "LEOFLOW_WARM_SCRATCH"),
    ({"LEOFLOW_WARM_SCRATCH": "/tmp/scratch", "LEOFLOW_WARM_SWEEP_ROOTS": "/tmp:/dev/shm"}, "LEOFLOW_WARM_SCRATCH"),
    ({"LEOFLOW_WARM_SWEEP_ROOTS": "/tmp:relative"}, "LEOFLOW_WARM_SWEEP_ROOTS"),
    ({"LEOFLOW_WARM_SWEEP_ROOTS": "/tmp:/"}, "LEOFLOW_WARM_SWEEP_ROOTS"),
    ({"LEOFLOW_WARM_SWEEP_ROOTS": "/scratch"}, "LEOFLOW_WARM_SCRATCH"),
    ({"LEOFLOW_TOKEN_FILE": "/tmp/token", "LEOFLOW_WARM_SWEEP_ROOTS": "/tmp:/dev/shm"}, "LEOFLOW_TOKEN_FILE"),
])
def test_a_bad_environment_is_refused_naming_the_variable(change, named):
    with pytest.raises(WarmConfigError, match=named):
        config_from_env({**GOOD_ENV, **change})


def test_a_bad_environment_ends_the_agent_with_exit_2_and_a_record(tmp_path):
    """Exit code 2 (podmain's EXIT_CONFIG) and an ``agent_start_failed`` record with no identity."""
    term = tmp_path / "termination-log"
    assert warmpod.main({**GOOD_ENV, "LEOFLOW_WARM_MAX_ATTEMPTS": "none"}, termination_path=str(term)) == 2
    assert outcome.decode(term.read_text()) == outcome.agent_start_failed(None)


# --- answers --------------------------------------------------------------------------------------------------

def test_decode_registration():
    body = json.dumps({"credential": CREDENTIAL, "pod_uid": "uid-1", "dag_version_id": "v-1", "await_seconds": 20})
    got = decode_registration(body)
    assert (got.credential, got.pod_uid, got.dag_version_id, got.await_seconds) == (CREDENTIAL, "uid-1", "v-1", 20.0)
    assert CREDENTIAL not in repr(got)
    for bad in ("[]", "nope", json.dumps({"pod_uid": "u", "dag_version_id": "v", "await_seconds": 20}),
                json.dumps({"credential": "c", "pod_uid": "u", "dag_version_id": "v", "await_seconds": 0}),
                json.dumps({"credential": "c", "pod_uid": "u", "dag_version_id": "v", "await_seconds": True})):
        with pytest.raises(AnswerError):
            decode_registration(bad)


def _workload(ti_id: str = TI_ID) -> dict:
    return {"type": "ExecuteTask", "token": "eyJ.secret.sig", "ti": {"id": ti_id}, "dag_rel_path": "d.py"}


def test_decode_assignment_reads_the_workload_as_an_object_or_as_text():
    body = {"ti_id": TI_ID, "try_number": 2, "attempt_epoch": 3, "workload": _workload()}
    got = decode_assignment(json.dumps(body))
    assert got.attempt == outcome.AttemptIdentity(TI_ID, 2, 3)
    assert json.loads(got.workload) == _workload()
    assert "eyJ" not in repr(got)
    assert decode_assignment(json.dumps({**body, "workload": json.dumps(_workload())})) == got


@pytest.mark.parametrize("change", [
    {"ti_id": ""}, {"try_number": 0}, {"attempt_epoch": "1"}, {"try_number": True}, {"workload": None},
    {"workload": "not json"}, {"workload": _workload("0190b6c2-0000-7000-8000-000000000001")},
])
def test_decode_assignment_refuses_what_is_no_assignment(change):
    body = {"ti_id": TI_ID, "try_number": 1, "attempt_epoch": 1, "workload": _workload(), **change}
    with pytest.raises(AnswerError):
        decode_assignment(json.dumps(body))


@pytest.mark.parametrize(("status", "verdict"), [
    (200, AwaitVerdict.ASSIGNED), (204, AwaitVerdict.EMPTY), (401, AwaitVerdict.RETIRED),
    (503, AwaitVerdict.RETRY), (502, AwaitVerdict.RETRY), (429, AwaitVerdict.RETRY), (404, AwaitVerdict.RETRY),
    (403, AwaitVerdict.RETRY), (None, AwaitVerdict.RETRY),
])
def test_classify_await(status, verdict):
    assert classify_await(status) is verdict


def test_registration_uses_the_exchanges_retries_on_the_register_route():
    """A 503 with Retry-After, then a grant: the same retry schedule as the exchange, on /v1/warm/register, with
    the projected token in the body."""
    config = config_from_env(GOOD_ENV)
    answers = [(503, {"retry-after": "2"}, b'{"error": "unavailable", "error_id": "ab"}'),
               (200, {}, json.dumps({"credential": CREDENTIAL, "pod_uid": "u", "dag_version_id": "v",
                                     "await_seconds": 20}).encode())]
    sent, slept = [], []

    def post(url, body, timeout):
        sent.append((url, json.loads(body)))
        return answers.pop(0)

    result = podmain.exchange_with_retries(config.pod, post=post, read_token=lambda path: "projected-token",
                                           sleep=slept.append, rng=lambda: 0.0,
                                           url=config.endpoint(warmpod.WARM_REGISTER_PATH),
                                           decode=decode_registration)
    assert sent == [(URL + "/v1/warm/register", {"token": "projected-token"})] * 2
    assert slept == [2.0] and result.exit_code == 0 and result.grant.credential == CREDENTIAL
    bad = podmain.exchange_with_retries(config.pod, post=lambda u, b, t: (200, {}, b"{}"),
                                        read_token=lambda path: "t", url="http://x/leoflow/v1/warm/register",
                                        decode=decode_registration)
    assert (bad.grant, bad.reason, bad.exit_code) == (None, outcome.Reason.AGENT_START_FAILED,
                                                      podmain.EXIT_START_FAILED)


# --- self-limits ----------------------------------------------------------------------------------------------

def _limits(attempts: int = 0, idle_since: float = 100.0) -> LimitState:
    return LimitState(started=100.0, attempts=attempts, idle_since=idle_since, max_attempts=3,
                      max_lifetime_seconds=1000.0, idle_ttl_seconds=60.0)


def test_decide_limits():
    assert decide_limits(_limits(), 100.0) is None
    assert decide_limits(_limits(attempts=2, idle_since=500.0), 559.9) is None
    assert decide_limits(_limits(attempts=3, idle_since=500.0), 501.0) is StopReason.MAX_ATTEMPTS
    assert decide_limits(_limits(attempts=1, idle_since=1090.0), 1100.0) is StopReason.MAX_LIFETIME
    assert decide_limits(_limits(attempts=1, idle_since=500.0), 560.0) is StopReason.IDLE_TTL
    assert decide_limits(_limits(), 160.0) is StopReason.IDLE_TTL  # never assigned since it became ready


# --- the sweep ------------------------------------------------------------------------------------------------

def test_sweep_empties_its_roots_and_leaves_everything_else(tmp_path):
    tmp, shm, outside = tmp_path / "tmp", tmp_path / "shm", tmp_path / "outside"
    for d in (tmp, shm, outside):
        d.mkdir()
    (outside / "keep.txt").write_text("keep")
    (tmp / "a.txt").write_text("x")
    (tmp / ".hidden").write_text("x")
    (tmp / "deep" / "er").mkdir(parents=True)
    (tmp / "deep" / "er" / "b.bin").write_bytes(b"x")
    (tmp / "link-to-outside").symlink_to(outside)
    (tmp / "dangling").symlink_to(tmp_path / "missing")
    (shm / "sem.x").write_bytes(b"x")
    os.mkfifo(tmp / "fifo")
    (tmp / "ro").mkdir()
    (tmp / "ro" / "f").write_text("x")
    (tmp / "ro").chmod(0o500)  # a directory the task made read-only: root removes it anyway; as a user too
    try:
        result = sweep([str(tmp), str(shm), str(tmp_path / "absent")])
    finally:
        if (tmp / "ro").exists():
            (tmp / "ro").chmod(0o700)
    assert sorted(os.listdir(tmp)) == [] or os.geteuid() != 0
    assert os.listdir(shm) == []
    assert tmp.is_dir() and shm.is_dir(), "the roots themselves stay"
    assert (outside / "keep.txt").read_text() == "keep", "a link is removed, never followed"
    if os.geteuid() == 0:
        assert result.failed == [] and result.removed == 11
    assert result.skipped == []


def test_sweep_with_remove_roots_removes_a_scratch_directory(tmp_path):
    scratch = tmp_path / "attempt-1"
    (scratch / "home" / ".cache").mkdir(parents=True)
    (scratch / "tmp").mkdir()
    (scratch / "home" / ".cache" / "x").write_text("x")
    result = sweep([str(scratch)], remove_roots=True)
    assert not scratch.exists() and result.failed == [] and result.removed == 5


def _mountinfo(tmp_path, *points: str):
    """A mountinfo file (proc(5) layout) listing ``points``."""
    path = tmp_path / "mountinfo"
    path.write_text("".join(f"{20 + i} 1 8:1 / {p.replace(' ', chr(92) + '040')} rw,relatime - ext4 /dev/sda1 rw\n"
                            for i, p in enumerate(["/", *points])))
    return str(path)


def test_mount_points_reads_the_fifth_field_and_undoes_octal_escapes(tmp_path):
    assert warmpod.mount_points(_mountinfo(tmp_path, "/tmp", "/data/a dir")) == {"/", "/tmp", "/data/a dir"}
    assert warmpod.mount_points(str(tmp_path / "absent")) is None


def test_a_bind_mount_below_a_root_is_left_whole(tmp_path):
    """A bind mount below a swept root (same device: st_dev cannot tell it; mountinfo does), as the harness binds
    the test's host paths back under a warm pod's /tmp, is skipped, never emptied."""
    own = tmp_path / "own"
    own.mkdir()
    (own / "left-by-the-attempt").write_text("x")
    (own / "bound").mkdir()
    (own / "bound" / "host-file").write_text("keep")
    info = _mountinfo(tmp_path, str(own), str(own / "bound"))
    result = sweep([str(own)], mountinfo=info)
    assert sorted(os.listdir(own)) == ["bound"] and (own / "bound" / "host-file").read_text() == "keep"
    assert result.skipped == [str(own / "bound")]


# --- the in-band outcome sink ---------------------------------------------------------------------------------

def _record() -> outcome.OutcomeRecord:
    return outcome.record_for_state("success", {"state": "success", "end_date": "2026-01-01T00:00:00Z"},
                                    attempt=outcome.AttemptIdentity(TI_ID, 1, 2), api_version="2026-06-30")


def test_outcome_post_sink_posts_the_record_with_the_bearer_credential():
    sent = []

    def post(url, body, headers, timeout):
        sent.append((url, body, dict(headers), timeout))
        return 200, {}, b'{"stored": true}'

    sink = outcome_post_sink(URL + "/v1/outcome", CREDENTIAL, post)
    assert sink(_record()) is None
    [(url, body, headers, timeout)] = sent
    assert url == URL + "/v1/outcome" and headers["authorization"] == f"Bearer {CREDENTIAL}"
    assert outcome.decode(body, expect=outcome.AttemptIdentity(TI_ID, 1, 2)) == _record()
    assert timeout == warmpod.OUTCOME_POST_TIMEOUT_SECONDS


@pytest.mark.parametrize("answer", [
    httpx.ConnectError("refused"), httpx.ReadTimeout("slow"), OSError(104, "reset"),
    (409, {}, b'{"error": "not_held", "error_id": "0123abcd"}'), (503, {}, b"{}"),
])
def test_a_failed_outcome_post_is_logged_and_never_raises(answer, caplog):
    def post(url, body, headers, timeout):
        if isinstance(answer, BaseException):
            raise answer
        return answer

    caplog.set_level("INFO", logger="leoflow.agent.warm_pod")
    assert outcome_post_sink(URL + "/v1/outcome", CREDENTIAL, post)(_record()) is None
    text = caplog.text
    assert "not sent in-band" in text or "refused in-band" in text
    assert CREDENTIAL not in text


# --- the per-attempt watchdog ---------------------------------------------------------------------------------

def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_the_watchdog_kills_the_attempts_whole_tree_at_the_ceiling(tmp_path):
    """A real child in its own session with a grandchild that left it (``setsid``): both are gone once the
    ceiling (1 s here) passed, and the wait reports the kill."""
    import subprocess
    import time

    marker = tmp_path / "grandchild.pid"
    child = subprocess.Popen(["sh", "-c", f"setsid sleep 60 & echo $! > {marker}; sleep 60"],
                             start_new_session=True)
    deadline = time.monotonic() + 10
    while not (marker.exists() and marker.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.05)
    grandchild = int(marker.read_text())
    t0 = time.monotonic()
    code, killed = warmpod._wait_child(child.pid, 1)
    assert killed and code == -9 and 0.9 <= time.monotonic() - t0 < 10
    deadline = time.monotonic() + 5
    while _alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(grandchild)


def test_without_a_ceiling_the_wait_returns_the_childs_exit_code():
    import subprocess

    child = subprocess.Popen(["sh", "-c", "exit 3"])
    assert warmpod._wait_child(child.pid, 0) == (3, False)


def test_a_child_that_reported_frees_the_wait_before_its_exit_which_the_finish_then_waits_for():
    """The attempt child writes its report byte (its terminal PATCH returned 2xx) and lingers, as the Task SDK's
    supervisor does: the wait returns at the report with no exit code, the child still running; the finish then
    waits for its exit (and sweeps nothing here: shared isolation)."""
    import subprocess

    read_fd, write_fd = os.pipe()
    child = subprocess.Popen([sys.executable, "-c", f"import os, time; os.write({write_fd}, b'R'); time.sleep(1); "
                              "raise SystemExit(5)"], pass_fds=(write_fd,))
    os.close(write_fd)
    assert warmpod._wait_child(child.pid, 0, reported_fd=read_fd) == (None, False)
    assert child.poll() is None, "the wait returned at the report, not at the exit"
    record = warmpod._Child(child.pid, 1, None, reported_fd=read_fd, reported=True)
    config = warmpod.config_from_env({**GOOD_ENV, "LEOFLOW_WARM_ISOLATION": "shared"})
    warmpod._finish(config, record)
    assert record.reported_fd is None and warmpod._exited(record) == 0  # reaped by the finish


def test_importing_the_wire_names_imports_nothing_but_the_standard_library():
    """The control plane imports the constants; the pod image runs the module: no Airflow, httpx or pydantic
    at import time."""
    import subprocess
    import sys

    code = ("import sys, leoflow_agent.warmpod; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'airflow', 'httpx', 'pydantic', 'sqlalchemy'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
