"""``[leoflow] zygote_preload``: the modules it names are imported once in the zygote, so every task process
starts with them; a name that cannot be imported is logged and skipped, and work goes on."""

from __future__ import annotations

import pytest

from lite_procs import lite_stack, zygote_file

DAG = "leoflow_test_preloaded"


@pytest.mark.airflow
@pytest.mark.timeout(300)
def test_zygote_preload_reaches_every_task_and_a_bad_name_is_skipped(tmp_path):
    """``wave`` (stdlib, imported by nothing in Airflow) is listed and must be in the task's ``sys.modules``;
    as a control, ``imaplib`` is not listed and must not be; ``leoflow_no_such_module`` is listed,
    cannot import, and is named in the zygote's log while tasks still run."""
    env = {"AIRFLOW__LEOFLOW__ZYGOTE_PRELOAD": "wave, leoflow_no_such_module"}
    with lite_stack(tmp_path / "home", extra_env=env) as stack:
        stack.migrate()
        stack.start(wait_for_dags=[DAG])
        stack.unpause(DAG)
        listed = stack.trigger(DAG, conf={"module": "wave"})
        unlisted = stack.trigger(DAG, conf={"module": "imaplib"})
        assert stack.wait_for_run(DAG, listed, timeout=120) == "success", stack.task_states(DAG, listed)
        assert stack.wait_for_run(DAG, unlisted, timeout=120) == "failed", stack.task_states(DAG, unlisted)
        zlog = zygote_file(stack, "zygote.log").read_text()
        assert "zygote_preload: could not import leoflow_no_such_module" in zlog, zlog[-2000:]
