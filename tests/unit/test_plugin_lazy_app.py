"""The leoflow Airflow plugin builds its FastAPI app only when the api-server reads ``fastapi_apps``: every task
process loads every plugin (the Task SDK's listener manager), and must not pay FastAPI's and Airflow's
``api_fastapi`` imports for an app it never serves (issue 11, the Lite profile)."""

from __future__ import annotations

import json
import subprocess
import sys

PROBE = """
import json, sys
import leoflow_airflow.plugin as plugin
before = sorted(m for m in ("fastapi", "airflow.api_fastapi", "leoflow_airflow.api.app") if m in sys.modules)
apps = plugin.LeoflowPlugin.fastapi_apps
print(json.dumps({"before": before, "prefix": [a["url_prefix"] for a in apps],
                  "app": type(apps[0]["app"]).__name__, "same": plugin.LeoflowPlugin().fastapi_apps is apps}))
"""


def test_loading_the_plugin_imports_no_web_stack_and_the_api_server_still_gets_leoflows_app():
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120, check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["before"] == [], "importing the plugin imported the web stack"
    assert (got["prefix"], got["app"], got["same"]) == (["/leoflow"], "FastAPI", True)
