"""SQLite settings for the demo stack: a 30 s busy timeout for every Airflow DB connection.

SQLite lets one writer in at a time. pysqlite's default busy timeout is 5 s, after which a waiting writer
fails with ``database is locked``; with LocalExecutor at ``[core] parallelism`` 32 on 2 cores that happened.
Airflow takes connect args only as an import path (``[database] sql_alchemy_connect_args`` and its async
twin), so the dicts live here and the stack puts the repo root on ``PYTHONPATH``. WAL mode (readers never
block the writer) is switched on once per database file by ``AirflowStack.migrate()``.
"""

from __future__ import annotations

BUSY_TIMEOUT_SECONDS = 30.0
"""How long a connection waits for SQLite's write lock before ``database is locked`` (seconds)."""

CONNECT_ARGS: dict[str, object] = {"timeout": BUSY_TIMEOUT_SECONDS}
"""Connect args of Airflow's synchronous engine (pysqlite: ``timeout`` in seconds)."""

CONNECT_ARGS_ASYNC: dict[str, object] = {"timeout": BUSY_TIMEOUT_SECONDS}
"""Connect args of Airflow's async engine (aiosqlite: ``timeout`` in seconds)."""

OUTAGE_BUSY_TIMEOUT_SECONDS = 120.0
"""The busy timeout of a stack whose test SIGSTOPs its api-server (seconds). A stopped api-server inside a write
transaction holds SQLite's one write lock for the whole stop, and when it resumes, the requests that queued up
behind it take the lock first; with 30 s, a 22 s stop on a loaded 2-core machine left Airflow's scheduler loop
waiting past the timeout, and it exited on "database is locked" (the Lite chaos loop's api_sigstop wave). That is
SQLite's single writer, not the outage under test: on PostgreSQL a stopped api-server holds only its rows."""

CONNECT_ARGS_OUTAGE: dict[str, object] = {"timeout": OUTAGE_BUSY_TIMEOUT_SECONDS}
"""Connect args of the synchronous engine of a stack whose api-server a test stops."""

CONNECT_ARGS_ASYNC_OUTAGE: dict[str, object] = {"timeout": OUTAGE_BUSY_TIMEOUT_SECONDS}
"""Connect args of the async engine of a stack whose api-server a test stops."""


def env(*, outage: bool = False) -> dict[str, str]:
    """The ``AIRFLOW__DATABASE__*`` variables that point Airflow at the connect args above (``outage``: the
    ``…_OUTAGE`` ones, for a stack whose api-server a test SIGSTOPs)."""
    suffix = "_OUTAGE" if outage else ""
    return {
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS": f"{__name__}.CONNECT_ARGS{suffix}",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS_ASYNC": f"{__name__}.CONNECT_ARGS_ASYNC{suffix}",
    }
