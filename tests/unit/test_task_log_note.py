"""leoflow's note in the task log of an attempt that never started (leoflow_airflow/task_log.py): what Airflow's
own log reader (``FileTaskHandler``'s parser) makes of the line, where it goes, and what it refuses."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from airflow.utils.log.file_task_handler import StructuredLogMessage

from leoflow_airflow.task_log import note_line, write_note

NOW = datetime(2026, 12, 1, 18, 30, 5, 123000, tzinfo=timezone.utc)
LOG_PATH = "dag_id=d/run_id=r/task_id=t/attempt=1.log"


def test_the_line_parses_as_airflow_reads_a_task_log_line():
    line = note_line("pod refused: violates PodSecurity", now=NOW.astimezone(timezone(timedelta(hours=2))))
    msg = StructuredLogMessage.model_validate_json(line)
    assert msg.event == "pod refused: violates PodSecurity"
    assert msg.timestamp == NOW
    assert json.loads(line)["level"] == "error" and json.loads(line)["logger"] == "leoflow.executor"
    with pytest.raises(ValueError):
        note_line("x", now=datetime(2026, 12, 1))


def test_write_note_appends_under_the_log_folder(tmp_path: Path):
    assert write_note(LOG_PATH, "first", base_log_folder=str(tmp_path), remote_logging=False, now=NOW)
    assert write_note(LOG_PATH, "second", base_log_folder=str(tmp_path), remote_logging=False, now=NOW)
    lines = (tmp_path / LOG_PATH).read_text().splitlines()
    assert [StructuredLogMessage.model_validate_json(x).event for x in lines] == ["first", "second"]


@pytest.mark.parametrize("log_path", [None, "", "/etc/passwd", "../outside.log", "a/../../outside.log"])
def test_write_note_refuses_paths_outside_the_log_folder(tmp_path: Path, log_path):
    base = tmp_path / "logs"
    base.mkdir()
    assert not write_note(log_path, "x", base_log_folder=str(base), remote_logging=False, now=NOW)
    assert not (tmp_path / "outside.log").exists() and list(base.iterdir()) == []


def test_write_note_never_raises_on_an_unwritable_folder(tmp_path: Path):
    blocker = tmp_path / "file"
    blocker.write_text("")  # a file where the log folder's subfolder must go
    assert not write_note("file/attempt=1.log", "x", base_log_folder=str(tmp_path), remote_logging=False, now=NOW)
