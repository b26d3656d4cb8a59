"""The agent's transport at its seam (issue 8 holes 5, 12 and 16h), with the real Lite record file as the sink.

* hole 5: a terminal record already written is never replaced by ``heartbeat_lost``; later reports are still
  refused, so the reconciler replays the recorded result instead of re-running the task;
* hole 12: a record that cannot be written never blocks the terminal PATCH: it is sent, the TI log says why the
  record is missing, and the zygote hears ``recorded: false``;
* hole 16h: a record that had to drop its asset events to fit says so in the TI log, while the PATCH that leaves
  still carries every event;
* hole 16 (kills): once leoflow killed the attempt gracefully (its kill marker exists) a failed / up_for_retry
  report, which the kill caused, is refused and a ``killed`` record written; so is a success whose report leaves
  after the kill (DESIGN §2 "A success after SIGTERM"); one reported before it stands.

The "api-server" is an ``httpx.MockTransport`` answering as a stopped or healthy one would; the SDK client is
stood in for by a small client that raises and retries as the SDK's does (as ``test_heartbeat_counting.py``).
"""

from __future__ import annotations

import json
import os

import httpx
import pytest

from leoflow_agent import outcome
from leoflow_agent.protocol import kill_marker_path
from leoflow_agent.transport import RecordingTransport, file_sink, heartbeat_counting_client

TI = "01900000-0000-7000-8000-0000000000b5"
ATTEMPT = outcome.AttemptIdentity(TI, 1, 1)
HB = f"task-instances/{TI}/heartbeat"
STATE = f"task-instances/{TI}/state"
SUCCESS = {"state": "success", "end_date": "2026-01-01T00:00:00Z", "task_outlets": [], "outlet_events": [],
           "rendered_map_index": None}


class SdkLikeClient(httpx.Client):
    """Raises on 4xx/5xx and on transport errors after one try (``[workers] execution_api_retries = 1``)."""

    def __init__(self, **kwargs):
        super().__init__(base_url="http://api.test/execution/",
                         event_hooks={"response": [lambda r: r.raise_for_status()]}, **kwargs)


class Harness:
    """A transport around a switchable api-server, the real record file, and what the agent told whom."""

    def __init__(self, record_path: str, *, max_failed: int = 3, also: tuple[str, ...] = ()) -> None:
        """``record_path``: the record file this harness reads back; ``also``: record files written first."""
        self.up = True
        self.sent: list[httpx.Request] = []  # requests that reached the api-server
        self.reported: list[tuple[str, bool]] = []
        self.ti_log: list[tuple[str, str]] = []
        self.record_path = record_path
        self.oom_killed = False

        def api_server(request: httpx.Request) -> httpx.Response:
            if not self.up:
                raise httpx.ReadTimeout("timed out", request=request)
            self.sent.append(request)
            return httpx.Response(204 if request.url.path.endswith("/heartbeat") else 200, json={})

        self.transport = RecordingTransport(
            httpx.MockTransport(api_server), attempt=ATTEMPT,
            sinks=[*(file_sink(path) for path in also), file_sink(record_path)],
            on_reported=lambda state, recorded: self.reported.append((state, recorded)),
            task_log=lambda level, message: self.ti_log.append((level, message)),
            max_failed_heartbeats=max_failed,
            killed=lambda: os.path.exists(kill_marker_path(record_path)),
            oom_killed=lambda: self.oom_killed,
        )
        self.client = heartbeat_counting_client(SdkLikeClient)(transport=self.transport)
        self.client.leoflow_transport = self.transport

    def heartbeat(self) -> None:
        try:
            self.client.put(HB, json={"pid": 1})
        except httpx.TransportError:
            pass

    def report(self, body: dict) -> httpx.Response:
        return self.client.patch(STATE, json=body)

    def record(self) -> outcome.OutcomeRecord | None:
        return outcome.read_record_file(self.record_path, expect=ATTEMPT)


def test_heartbeat_loss_after_an_unsent_success_keeps_the_success_record(tmp_path):
    """Hole 5: the outage spans the task's end. Two heartbeats failed, the success is recorded but its PATCH
    times out, the third heartbeat fails: the record must still be the success (the reconciler replays it),
    and the supervisor's own re-send of the success at exit is still refused locally."""
    h = Harness(str(tmp_path / "record.json"))
    h.heartbeat()
    h.up = False
    h.heartbeat()
    h.heartbeat()
    with pytest.raises(httpx.TransportError):
        h.report(SUCCESS)
    assert h.record().state == "success"
    h.heartbeat()  # the third failure in a row: the supervisor kills the task child here
    assert h.transport.heartbeat_lost
    kept = h.record()
    assert kept is not None and kept.state == "success" and kept.payload == SUCCESS, kept
    assert kept.reason is None
    h.up = True
    with pytest.raises(httpx.HTTPStatusError) as refused:
        h.report(SUCCESS)  # the supervisor re-sends its pending success at exit
    assert refused.value.response.status_code == 409
    assert h.record() == kept and h.reported == []
    assert not [r for r in h.sent if r.url.path.endswith("/state")], "a report left after heartbeat loss"
    assert any("heartbeat" in message for _, message in h.ti_log), h.ti_log


def test_heartbeat_loss_without_a_terminal_record_still_records_heartbeat_lost(tmp_path):
    h = Harness(str(tmp_path / "record.json"))
    h.up = False
    for _ in range(3):
        h.heartbeat()
    assert h.transport.heartbeat_lost
    assert h.record().reason == outcome.Reason.HEARTBEAT_LOST
    h.up = True
    with pytest.raises(httpx.HTTPStatusError):
        h.report({"state": "failed", "end_date": "2026-01-01T00:00:00Z", "rendered_map_index": None})
    assert h.record().reason == outcome.Reason.HEARTBEAT_LOST


def test_a_record_that_cannot_be_written_does_not_block_the_report(tmp_path):
    """Hole 12: the record directory is gone (the same ``OSError`` path as EROFS or ENOSPC). The PATCH is
    sent all the same, the zygote hears ``recorded: false`` and the TI log says the record is missing."""
    h = Harness(str(tmp_path / "gone" / "record.json"))
    response = h.report(SUCCESS)
    assert response.status_code == 200
    (patch,) = [r for r in h.sent if r.url.path.endswith("/state")]
    assert json.loads(patch.content) == SUCCESS
    assert h.reported == [("success", False)]
    (line,) = [m for _, m in h.ti_log if "outcome record" in m]
    assert "could not write" in line and "gone" in line, line
    assert not os.path.exists(tmp_path / "gone")


def test_a_written_record_reports_recorded_true_and_logs_nothing(tmp_path):
    h = Harness(str(tmp_path / "record.json"))
    assert h.report(SUCCESS).status_code == 200
    assert h.reported == [("success", True)] and h.ti_log == []
    assert h.record().payload == SUCCESS


def test_a_record_that_dropped_asset_events_says_so_in_the_ti_log(tmp_path):
    """Hole 16h: the body is over the record's 1 MiB, so the record drops its asset events; the TI log says
    how many and that a replay would register none, and the PATCH that leaves still carries all of them."""
    events = [{"dest_asset_key": {"name": f"a{i}", "uri": f"s3://bucket/{i}"}, "extra": {"blob": "x" * 2048}}
              for i in range(600)]
    outlets = [{"name": f"a{i}", "uri": f"s3://bucket/{i}", "type": "Asset"} for i in range(600)]
    body = dict(SUCCESS, outlet_events=events, task_outlets=outlets)
    h = Harness(str(tmp_path / "record.json"))
    assert h.report(body).status_code == 200
    (patch,) = [r for r in h.sent if r.url.path.endswith("/state")]
    assert json.loads(patch.content)["outlet_events"] == events
    kept = h.record()
    assert kept.assets_dropped and kept.payload["outlet_events"] == []
    assert h.reported == [("success", True)]
    (line,) = [m for level, m in h.ti_log if "asset" in m]
    assert "600 asset events" in line and "600 task outlets" in line, line


def test_small_asset_lists_are_kept_and_not_logged(tmp_path):
    events = [{"dest_asset_key": {"name": "a", "uri": "s3://bucket/a"}, "extra": {}}]
    h = Harness(str(tmp_path / "record.json"))
    assert h.report(dict(SUCCESS, outlet_events=events)).status_code == 200
    assert h.record().payload["outlet_events"] == events and h.ti_log == []


def test_task_log_writer_appends_json_lines_to_the_tis_own_log_file(tmp_path, monkeypatch):
    """The TI log lines land in the file the supervisor writes (``[logging] base_log_folder`` + the workload's
    ``log_path``), in its JSON-lines format, after what is already there; no ``log_path``, no file."""
    from leoflow_agent.runner import task_log_writer

    monkeypatch.setenv("AIRFLOW__LOGGING__BASE_LOG_FOLDER", str(tmp_path))
    rel = "dag_id=d/run_id=r/task_id=t/attempt=1.log"
    (tmp_path / rel).parent.mkdir(parents=True)
    (tmp_path / rel).write_text('{"event":"task line","level":"info"}\n')
    write = task_log_writer(rel)
    write("error", "leoflow could not write the outcome record of this attempt (Read-only file system)")
    write("warning", "second")
    lines = [json.loads(line) for line in (tmp_path / rel).read_text().splitlines()]
    assert [line["event"] for line in lines] == [
        "task line", "leoflow could not write the outcome record of this attempt (Read-only file system)", "second"]
    assert [line["level"] for line in lines[1:]] == ["error", "warning"]
    task_log_writer(None)("error", "nowhere")
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == ["attempt=1.log"]


def test_reported_event_carries_recorded():
    from leoflow_agent.runner import reported_event

    assert reported_event("success", False) == {"ev": "reported", "state": "success", "recorded": False}
    assert reported_event("deferred", True)["recorded"] is True


def test_one_sink_failing_still_keeps_the_others_terminal_record_through_heartbeat_loss(tmp_path):
    """Two sinks (a Kubernetes agent writes the termination message and posts to a warm worker): one fails.
    The report is unrecorded (``recorded`` false), and heartbeat loss afterwards writes ``heartbeat_lost`` to
    neither: the sink that holds the success keeps it, and no sink contradicts it."""
    kept = str(tmp_path / "kept.json")
    h = Harness(str(tmp_path / "gone" / "record.json"), also=(kept,))
    h.up = False
    h.heartbeat()
    h.heartbeat()
    with pytest.raises(httpx.TransportError):
        h.report(SUCCESS)
    h.heartbeat()
    assert h.transport.heartbeat_lost
    assert outcome.read_record_file(kept, expect=ATTEMPT).state == "success"
    assert not os.path.exists(tmp_path / "gone")
    h.up = True
    with pytest.raises(httpx.HTTPStatusError):
        h.report(SUCCESS)
    assert outcome.read_record_file(kept, expect=ATTEMPT).state == "success"


FAILED = {"state": "failed", "end_date": "2026-01-01T00:00:00Z", "rendered_map_index": None}
UP_FOR_RETRY = {"state": "up_for_retry", "end_date": "2026-01-01T00:00:00Z", "rendered_map_index": None}


def _kill(record_path: str) -> None:
    """What LiteRuntime.kill does before it signals a graceful kill: write the attempt's kill marker."""
    with open(kill_marker_path(record_path), "w") as fh:
        fh.write("killed\n")


@pytest.mark.parametrize("body", [FAILED, UP_FOR_RETRY], ids=["failed", "up_for_retry"])
def test_a_failure_after_leoflows_kill_is_refused_and_recorded_killed(tmp_path, body):
    """Hole 16: the kill's SIGTERM ran the operator's ``on_kill``, which stopped its work, so the task failed.
    That report would spend a user retry on an infra kill: it never leaves, the record says ``killed`` (the
    reconciler re-drives it on the infra budget) and the TI log says why."""
    h = Harness(str(tmp_path / "record.json"))
    _kill(h.record_path)
    with pytest.raises(httpx.HTTPStatusError) as refused:
        h.report(body)
    assert refused.value.response.status_code == 409
    assert not [r for r in h.sent if r.url.path.endswith("/state")], "a failure left after leoflow's kill"
    assert h.record().reason == outcome.Reason.KILLED and h.record().payload is None
    assert h.reported == []
    assert any("leoflow killed this attempt" in m for _, m in h.ti_log), h.ti_log


def test_a_success_whose_report_leaves_after_the_kill_is_held_as_killed(tmp_path):
    """DESIGN §2 "A success after SIGTERM" (apache/airflow#73006): an ``on_kill`` that cancels the work can let
    ``execute()`` return normally after the signal, so a success reported after it is not trusted: it never leaves,
    the record says ``killed`` and the reconciler re-runs the task on the infra budget (no user retry spent)."""
    h = Harness(str(tmp_path / "record.json"))
    _kill(h.record_path)
    with pytest.raises(httpx.HTTPStatusError) as refused:
        h.report(SUCCESS)
    assert refused.value.response.status_code == 409
    assert not [r for r in h.sent if r.url.path.endswith("/state")], "a success left after the kill"
    assert h.record().reason == outcome.Reason.KILLED and h.record().payload is None and h.reported == []


def test_a_success_reported_before_the_kill_stands(tmp_path):
    """The other side of the rule: a body that returned before the signal has reported already (the supervisor
    PATCHes as the body returns, before its callbacks); the kill that follows changes nothing."""
    h = Harness(str(tmp_path / "record.json"))
    assert h.report(SUCCESS).status_code == 200
    _kill(h.record_path)
    assert h.reported == [("success", True)] and h.record().state == "success"


def test_a_sigterm_the_agent_receives_counts_as_a_kill_under_any_handler():
    """On Kubernetes leoflow writes no kill marker: a pod delete, an eviction or a node drain reaches the agent as
    SIGTERM, while the Task SDK supervisor's own handler is installed (it forwards the signal to the task and
    calls no earlier handler). The wakeup-fd watch sees it all the same, and only SIGTERM counts."""
    import signal

    from leoflow_agent.transport import SigtermWatch

    forwarded: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: forwarded.append(signum))
    previous_usr1 = signal.signal(signal.SIGUSR1, lambda signum, frame: None)
    watch = SigtermWatch.install()
    try:
        assert watch() is False
        os.kill(os.getpid(), signal.SIGUSR1)
        assert watch() is False
        os.kill(os.getpid(), signal.SIGTERM)
        assert forwarded == [signal.SIGTERM] and watch() is True and watch() is True
    finally:
        watch.uninstall()
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGUSR1, previous_usr1)
    assert watch() is True  # what it saw is kept


def test_a_failure_without_a_kill_lands(tmp_path):
    """No kill marker: a task's own failure is reported as always (the user's retry is Airflow's to spend)."""
    h = Harness(str(tmp_path / "record.json"))
    assert h.report(UP_FOR_RETRY).status_code == 200
    assert h.reported == [("up_for_retry", True)] and h.record().state == "up_for_retry"


@pytest.mark.parametrize("body", [FAILED, UP_FOR_RETRY], ids=["failed", "up_for_retry"])
def test_a_failure_after_the_oom_killer_ended_a_process_of_the_attempt_is_refused(tmp_path, body):
    """Issue 35, the real node: at a container's memory limit a cgroup-v1 kernel kills the largest process, the task
    process, and the supervisor reports the task failed. That report would spend a user retry: it never leaves, the
    record says ``oom_killed`` (settled as an OOM kill) and the TI's log says why."""
    h = Harness(str(tmp_path / "record.json"))
    h.oom_killed = True
    with pytest.raises(httpx.HTTPStatusError) as refused:
        h.report(body)
    assert refused.value.response.status_code == 409
    assert not [r for r in h.sent if r.url.path.endswith("/state")], "a failure left after an OOM kill"
    assert h.record().reason == outcome.Reason.OOM_KILLED and h.record().payload is None and h.reported == []
    assert any("OOM killer" in m for _, m in h.ti_log), h.ti_log


def test_a_success_after_an_oom_kill_lands(tmp_path):
    """An OOM kill of some other process of the attempt (a subprocess the task tolerated) does not hold a success."""
    h = Harness(str(tmp_path / "record.json"))
    h.oom_killed = True
    assert h.report(SUCCESS).status_code == 200
    assert h.reported == [("success", True)] and h.record().state == "success"
