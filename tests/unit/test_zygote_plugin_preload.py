"""The zygote imports the installed Airflow plugins' modules before it forks (``leoflow_agent.zygote.
preload_plugin_modules``), so a task process's plugin load (the Task SDK's ``get_listener_manager`` at task
start-up) imports nothing: found with py-spy on ``bench_chain``, where importing leoflow's own plugin (its
FastAPI app, Airflow's ``api_fastapi``) was 95% of every Lite task process's CPU."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import json, sys
    from leoflow_agent.zygote import preload_plugin_modules

    loaded = preload_plugin_modules()
    before = set(sys.modules)
    from airflow.sdk.plugins_manager import _get_plugins
    cache_empty = _get_plugins.cache_info().currsize == 0
    plugins, errors = _get_plugins()   # what a task process does at start-up
    print(json.dumps({"loaded": loaded, "cache_empty_after_preload": cache_empty,
                      "plugins": [p.name for p in plugins], "errors": errors,
                      "imported_by_task": sorted(set(sys.modules) - before)}))
""")


def test_a_forked_task_loads_the_plugins_without_importing_them_again(tmp_path):
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120,
                         env={"AIRFLOW_HOME": str(tmp_path), "PATH": "/usr/bin:/bin",
                              "AIRFLOW__CORE__LOAD_EXAMPLES": "False"}, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert "leoflow" in result["loaded"]
    # the task process still builds and registers its own plugin instances (listeners, on_load run there)
    assert result["cache_empty_after_preload"] is True
    assert "leoflow" in result["plugins"] and not result["errors"]
    heavy = [m for m in result["imported_by_task"] if m.startswith(("leoflow_airflow", "fastapi", "airflow.api_fastapi"))]
    assert heavy == []
