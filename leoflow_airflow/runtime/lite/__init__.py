"""The Lite runtime: one local agent process per attempt, forked by a pre-imported zygote (DESIGN §3).

:class:`LiteRuntime` implements :class:`leoflow_airflow.lifecycle.runtime.Runtime`; :class:`ZygoteClient` is
the connection to the zygote it owns. Everything about zygotes, pids, proof of death by processes, held
launches and re-tokening lives here, behind the seam.
"""

from leoflow_airflow.runtime.lite.runtime import LiteRuntime
from leoflow_airflow.runtime.lite.zygote_client import LitePaths, ZygoteClient

__all__ = ["LitePaths", "LiteRuntime", "ZygoteClient"]
