"""The pre-launch guard (DESIGN §3 "Dispatch"): launch only if Airflow still wants exactly this attempt."""

from __future__ import annotations

import pytest

from leoflow_airflow.dispatch.guard import TIRow, guard

TI_ID = "0190b6c2-7e4f-7a3c-9d1e-2b5f6a7c8d90"


def row(**kw) -> TIRow:
    """A QUEUED row of try 2, queued by job 7, unless overridden."""
    base = dict(id=TI_ID, state="queued", try_number=2, max_tries=3, queued_by_job_id=7)
    base.update(kw)
    return TIRow(**base)


def test_queued_same_attempt_same_job_launches():
    """The one case that launches."""
    assert guard(row(), ti_id=TI_ID, try_number=2, job_id=7) is None


def test_no_job_id_skips_the_job_check():
    """Outside a scheduler job (job_id None) the queued_by check is skipped."""
    assert guard(row(queued_by_job_id=99), ti_id=TI_ID, try_number=2, job_id=None) is None
    assert guard(row(queued_by_job_id=None), ti_id=TI_ID, try_number=2, job_id=None) is None


@pytest.mark.parametrize(
    ("the_row", "needle"),
    [
        (None, "gone or has a new id"),
        (row(id="0190b6c2-7e4f-7a3c-9d1e-2b5f6a7c8d91"), "gone or has a new id"),
        (row(state="running"), "is running, not queued"),
        (row(state="scheduled"), "is scheduled, not queued"),
        (row(state=None), "is None, not queued"),
        (row(state="success"), "is success, not queued"),
        (row(try_number=3), "try_number moved on to 3"),
        (row(queued_by_job_id=8), "queued by job 8, not this scheduler's job 7"),
        (row(queued_by_job_id=None), "queued by job None"),
    ],
)
def test_stale_reasons(the_row, needle):
    """Every way Airflow moved on yields a reason that says which."""
    reason = guard(the_row, ti_id=TI_ID, try_number=2, job_id=7)
    assert reason is not None and needle in reason
