"""The api-server mounts leoflow's app under ``/leoflow`` (issue 9 item 3), and adds the Execution API fence to its
root app (issue 10 item 6), with Airflow's default config.

Airflow loads a provider's plugins only with ``[core] lazy_discover_providers = False`` (default True), so
the plugin is registered through the ``airflow.plugins`` entry point of the installed distribution. Each case
asks Airflow's own plugins manager, in a fresh process and AIRFLOW_HOME, what it would mount. The process runs
outside the source checkout, as an installed Airflow does: from the checkout, its ``leoflow.egg-info`` (an
editable install's build artifact) is a second copy of the distribution on ``sys.path``, which Airflow's
entry-point scan does not deduplicate ("Plugin 'leoflow' already registered", still mounted once).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

PROBE = """
import json
from airflow import plugins_manager as pm
apps, middlewares = pm.get_fastapi_plugins()
print(json.dumps({"prefixes": [a["url_prefix"] for a in apps], "middlewares": [m["name"] for m in middlewares],
                  "errors": pm.get_import_errors()}))
"""


@pytest.mark.parametrize("lazy", ["True", "False"])
def test_the_plugin_app_is_mounted_once_whatever_the_provider_discovery(tmp_path, lazy):
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env.update(AIRFLOW_HOME=str(tmp_path), AIRFLOW__CORE__LAZY_DISCOVER_PROVIDERS=lazy,
               AIRFLOW__CORE__LOAD_EXAMPLES="False")
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True,
                         timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["prefixes"].count("/leoflow") == 1, result
    assert result["middlewares"].count("leoflow-execution-fence") == 1, result  # the Execution API fence
    assert result["errors"] == {}, result
