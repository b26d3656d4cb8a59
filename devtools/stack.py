"""A real Airflow 3.3 (scheduler, dag-processor, api-server) in a throwaway AIRFLOW_HOME.

All configuration goes through ``AIRFLOW__SECTION__KEY`` environment variables handed to each process; no
``airflow.cfg`` is written by us. The REST API v2 is reached with a SimpleAuthManager user whose password
the stack generates, through ``POST /auth/token``.

Typical use::

    with AirflowStack(home, executor="LocalExecutor", example_dags=["tutorial"]) as stack:
        stack.migrate()
        stack.start(wait_for_dags=["tutorial"])
        stack.unpause("tutorial")
        run_id = stack.trigger("tutorial")
        assert stack.wait_for_run("tutorial", run_id, timeout=120) == "success"
"""

from __future__ import annotations

import atexit
import json
import os
import secrets
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import httpx
import psutil

from devtools import procs, sqlite_tuning

REPO_ROOT = Path(__file__).resolve().parent.parent
OUR_DAGS = REPO_ROOT / "dags"
TERMINAL_RUN_STATES = frozenset({"success", "failed"})
API_USER = "leoflow"


class StackError(RuntimeError):
    """The stack could not be brought up, or an API call failed; the message names the log to read."""


def _record_timing(kind: str, seconds: float, home: Path) -> None:
    """Append ``<kind> <seconds> <home>`` to the file named by ``LEOFLOW_STACK_TIMINGS``, when it is set.

    For counting stack start-ups and what they cost over a test run (``kind``: ``migrate``, ``start``);
    nothing is written without the variable."""
    target = os.environ.get("LEOFLOW_STACK_TIMINGS")
    if target:
        with open(target, "a", encoding="utf-8") as out:
            out.write(f"{kind} {seconds:.2f} {home}\n")


# Config keys whose values ``airflow db migrate`` writes into a fresh database (the default pool's slots, the
# log template row, the default connections); a migrated SQLite file is reused only by stacks that agree on them.
_MIGRATE_WRITES_CONFIG = (
    "AIRFLOW__CORE__DEFAULT_POOL_TASK_SLOT_COUNT",
    "AIRFLOW__LOGGING__LOG_FILENAME_TEMPLATE",
    "AIRFLOW__ELASTICSEARCH__LOG_ID_TEMPLATE",
    "AIRFLOW__DATABASE__LOAD_DEFAULT_CONNECTIONS",
)
_sqlite_templates: dict[tuple[str | None, ...], Path] = {}
_template_dir: Path | None = None


def _template_path(key: tuple[str | None, ...]) -> Path:
    """Where this process keeps the migrated SQLite file for ``key`` (a temp dir removed at exit)."""
    global _template_dir
    if _template_dir is None:
        _template_dir = Path(tempfile.mkdtemp(prefix="leoflow-migrated-"))
        atexit.register(shutil.rmtree, _template_dir, True)
    return _template_dir / f"airflow-{len(_sqlite_templates)}.db"


PORT_DIR_ENV = "LEOFLOW_TEST_PORT_DIR"
"""Names a directory shared by every process of one test run (``scripts/run-tests all`` sets it for both pytest
sessions and what they start): :func:`free_port` reserves each port it hands out there."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS picked it).

    With ``LEOFLOW_TEST_PORT_DIR`` set, the port is also reserved there (a file named after it, created
    exclusively; ``scripts/k8senv`` does the same): a port one process of the run was handed is never handed to
    another, so two pytest sessions side by side cannot both get one port in the moment between the OS's pick
    and their server's bind. Raises ``RuntimeError`` when 200 picks in a row were reserved already."""
    reserve = os.environ.get(PORT_DIR_ENV)
    for _ in range(200):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        if not reserve:
            return port
        os.makedirs(reserve, exist_ok=True)
        try:
            os.close(os.open(os.path.join(reserve, str(port)), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            continue
        return port
    raise RuntimeError(f"200 ports in a row were reserved in {reserve} already")


def example_dag_file(name: str) -> Path:
    """Path of Airflow's bundled example DAG file ``name`` (without ``.py``) in the installed packages.

    Looks in ``airflow/example_dags`` and ``airflow/providers/standard/example_dags``. Raises
    ``FileNotFoundError`` when neither has it.
    """
    import airflow

    root = Path(airflow.__file__).resolve().parent
    for folder in (root / "example_dags", root / "providers" / "standard" / "example_dags"):
        candidate = folder / f"{name}.py"
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"no bundled example DAG file {name}.py under {root}")


def log_tail(path: Path, lines: int = 25, max_bytes: int = 64 * 1024) -> str:
    """The last ``lines`` lines of the log at ``path`` (read from its last ``max_bytes`` bytes), for an error
    message that must show why a process exited (CI keeps only the test output); ``""`` when unreadable."""
    try:
        with open(path, "rb") as fh:
            fh.seek(max(0, fh.seek(0, os.SEEK_END) - max_bytes))
            return "\n".join(fh.read().decode("utf-8", "replace").splitlines()[-lines:])
    except OSError:
        return ""


class AirflowStack:
    """A real Airflow with its own AIRFLOW_HOME, ports, JWT secret and admin user.

    ``home``: an empty or missing directory that the stack owns. ``executor``: the ``[core] executor``
    string, e.g. ``"LocalExecutor"`` or ``"leoflow_airflow.executor.LeoflowExecutor"``. ``parallelism``:
    ``[core] parallelism``. ``dags_folder``: our DAGs (a LocalDagBundle). ``example_dags``: names of Airflow's
    bundled example files (without ``.py``) copied into ``home/example_dags``, a second LocalDagBundle.
    ``sql_alchemy_conn``: a SQLAlchemy URL; ``None`` means SQLite at ``home/airflow.db`` with WAL and a 30 s
    busy timeout (``tune_sqlite=False`` keeps SQLite's defaults, for measuring). ``extra_env``: more variables
    for every process, applied last (they win). ``tls``: ``(cert, key)`` PEM paths: the api-server serves
    https with them (``[api] ssl_cert`` / ``ssl_key``, which the Task SDK also trusts as its CA), and this
    stack's own API calls verify against ``cert`` (``devtools.tls.self_signed_cert`` makes a pair).
    ``public_api_apart``: this stack's own public-API calls (triggers, user actions) go to a second api-server
    process (``public-api``: ``airflow api-server --apps core``), as a UI replica apart from the one tasks talk
    to. On SQLite a public-API write can otherwise stall its api-server for the 30 s busy timeout and answer
    500: Airflow 3.3's ``action_logging`` commits the audit row *on the event loop*
    (``api_fastapi/logging/decorators.py``), blocking the loop while it waits for the write lock, and the lock
    is held by an Execution API transaction of the same process whose commit (its session dependency's exit)
    needs that loop (CI: a ``PATCH`` marking a running task success answered "Database error"). Apart, the
    lock's holder commits on a loop that is not blocked.
    ``api_host``: the address the api-server listens on and everything reaches it at (the stack's URLs, the
    tasks' Execution API URL): loopback, or the real test node's bridge address so that pods reach it
    (:attr:`devtools.kube.KubeStack.api_host`).

    Use as a context manager or call ``stop()``: every process started is stopped, including task
    processes that left their parent's process group.
    """

    def __init__(
        self,
        home: Path,
        *,
        executor: str = "LocalExecutor",
        parallelism: int = 6,
        dags_folder: Path = OUR_DAGS,
        example_dags: list[str] | tuple[str, ...] = (),
        sql_alchemy_conn: str | None = None,
        extra_env: dict[str, str] | None = None,
        tune_sqlite: bool = True,
        tls: tuple[Path, Path] | None = None,
        public_api_apart: bool = False,
        api_host: str = "127.0.0.1",
    ) -> None:
        self.home = Path(home).resolve()
        self.executor = executor
        self.parallelism = parallelism
        self.dags_folder = Path(dags_folder).resolve()
        self.example_dags = list(example_dags)
        self.sqlite = sql_alchemy_conn is None
        self.sql_alchemy_conn = sql_alchemy_conn or f"sqlite:///{self.home / 'airflow.db'}"
        self.extra_env = dict(extra_env or {})
        self.tune_sqlite = tune_sqlite
        self.stack_id = uuid.uuid4().hex
        self.api_port = free_port()
        self.log_server_port = free_port()
        self.tls = None if tls is None else (Path(tls[0]).resolve(), Path(tls[1]).resolve())
        self._verify: str | bool = True if self.tls is None else str(self.tls[0])
        self.api_host = api_host
        self.base_url = f"{'http' if self.tls is None else 'https'}://{api_host}:{self.api_port}"
        self.public_api_apart = public_api_apart
        self.public_port = free_port() if public_api_apart else self.api_port
        self.public_url = f"{'http' if self.tls is None else 'https'}://{api_host}:{self.public_port}"
        self.process_logs = self.home / "process-logs"
        self.traces_dir = self.home / "traces"
        self.examples_folder = self.home / "example_dags"
        self._password = secrets.token_urlsafe(16)
        self._jwt_secret = secrets.token_urlsafe(64)  # 86 chars: above the 64-byte HS512 minimum
        self._popens: list[subprocess.Popen] = []
        self._names: list[str] = []
        self._client: httpx.Client | None = None
        self._prepared = False

    # ------------------------------------------------------------------ configuration

    def env(self) -> dict[str, str]:
        """The full environment every Airflow process of this stack gets (a fresh dict each call).

        Inherits the caller's environment minus any ``AIRFLOW__*``/``AIRFLOW_HOME``, then adds this stack's
        configuration, the stack marker, ``PYTHONPATH`` with the repo root, then ``extra_env``.
        """
        base = {
            key: value
            for key, value in os.environ.items()
            if not key.startswith("AIRFLOW__") and key not in {"AIRFLOW_HOME", "AIRFLOW_CONFIG"}
        }
        pythonpath = [str(REPO_ROOT)] + [p for p in base.get("PYTHONPATH", "").split(":") if p]
        bundles = [
            {
                "name": "leoflow-dags",
                "classpath": "airflow.dag_processing.bundles.local.LocalDagBundle",
                "kwargs": {"path": str(self.dags_folder), "refresh_interval": 30},
            }
        ]
        if self.example_dags:
            bundles.append(
                {
                    "name": "airflow-examples",
                    "classpath": "airflow.dag_processing.bundles.local.LocalDagBundle",
                    "kwargs": {"path": str(self.examples_folder), "refresh_interval": 30},
                }
            )
        cfg = {
            "AIRFLOW_HOME": str(self.home),
            "AIRFLOW_CONFIG": str(self.home / "airflow.cfg"),
            "PYTHONPATH": ":".join(pythonpath),
            procs.MARKER_VAR: self.stack_id,
            "AIRFLOW__CORE__EXECUTOR": self.executor,
            "AIRFLOW__CORE__PARALLELISM": str(self.parallelism),
            "AIRFLOW__CORE__DAGS_FOLDER": str(self.dags_folder),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "True",
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.base_url}/execution/",
            "AIRFLOW__CORE__AUTH_MANAGER": (
                "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager"
            ),
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{API_USER}:admin",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(self.home / "passwords.json"),
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": self.sql_alchemy_conn,
            "AIRFLOW__API__BASE_URL": self.base_url,
            "AIRFLOW__API__HOST": self.api_host,
            "AIRFLOW__API__PORT": str(self.api_port),
            "AIRFLOW__API__WORKERS": "1",
            # a 500 from a DB error names its statement and cause in the answer, so a failing test shows it
            "AIRFLOW__API__EXPOSE_STACKTRACE": "True",
            "AIRFLOW__API_AUTH__JWT_SECRET": self._jwt_secret,
            "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(self.log_server_port),
            "AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST": json.dumps(bundles),
            # Only the runs we trigger: unpausing a scheduled example must not add a scheduled run.
            "AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE": "False",
        }
        if self.tls is not None:
            cfg.update(AIRFLOW__API__SSL_CERT=str(self.tls[0]), AIRFLOW__API__SSL_KEY=str(self.tls[1]))
        if self.sqlite and self.tune_sqlite:
            cfg.update(sqlite_tuning.env())
        return {**base, **cfg, **self.extra_env}

    def prepare_home(self) -> None:
        """Write the home's files once (idempotent): the traces and process-log folders, the API user's password
        file, and the copies of the example DAG files (``example_dags``) in ``examples_folder``. Called by
        ``migrate``; call it earlier to read those files before (as the real node's ConfigMaps do)."""
        if self._prepared:
            return
        self.home.mkdir(parents=True, exist_ok=True)
        self.traces_dir.mkdir(exist_ok=True)
        self.process_logs.mkdir(exist_ok=True)
        (self.home / "passwords.json").write_text(json.dumps({API_USER: self._password}))
        if self.example_dags:
            self.examples_folder.mkdir(exist_ok=True)
            for name in self.example_dags:
                src = example_dag_file(name)
                (self.examples_folder / src.name).write_bytes(src.read_bytes())
        self._prepared = True

    def _airflow(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "airflow", *args]

    # ------------------------------------------------------------------ lifecycle

    def migrate(self, timeout: float = 180.0) -> None:
        """Run ``airflow db migrate`` (output to ``process-logs/migrate.log``); SQLite is switched to WAL.

        On SQLite (``tune_sqlite``) the first stack of this process that migrates keeps a copy of its freshly
        migrated file, and later stacks whose configuration writes the same rows (see
        ``_MIGRATE_WRITES_CONFIG``) start from a copy of it instead of running the command again: the same
        schema, ledger tables and rows, without a 10-30 s Airflow start-up per stack. Raises ``StackError``
        when the command fails or takes longer than ``timeout`` seconds.
        """
        t0 = time.monotonic()
        self.prepare_home()
        log_path = self.process_logs / "migrate.log"
        env = self.env()
        db_file = self.home / "airflow.db"
        template_key: tuple[str | None, ...] | None = None
        own_file = env.get("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN") == self.sql_alchemy_conn
        if self.sqlite and self.tune_sqlite and own_file and not db_file.exists():
            template_key = (sys.executable,) + tuple(env.get(key) for key in _MIGRATE_WRITES_CONFIG)
            template = _sqlite_templates.get(template_key)
            if template is not None:
                shutil.copyfile(template, db_file)
                log_path.write_text(f"copied {template} (made by airflow db migrate in this process)\n")
                self._switch_to_wal()
                _record_timing("migrate-copy", time.monotonic() - t0, self.home)
                return
        popen = procs.spawn(self._airflow("db", "migrate"), env=env, log_path=log_path, cwd=self.home)
        self._popens.append(popen)
        self._names.append("migrate")
        try:
            code = popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            procs.stop_all([popen], self._markers(), grace_seconds=5)
            raise StackError(f"airflow db migrate took over {timeout}s; see {log_path}") from None
        if code != 0:
            raise StackError(f"airflow db migrate exited {code}; see {log_path}")
        if template_key is not None:
            template = _template_path(template_key)
            shutil.copyfile(db_file, template)  # the command has exited: the file is complete, not in WAL yet
            _sqlite_templates[template_key] = template
        if self.sqlite and self.tune_sqlite:
            self._switch_to_wal()
        _record_timing("migrate", time.monotonic() - t0, self.home)

    def _switch_to_wal(self) -> None:
        # The journal mode is a property of the database file, so one switch here covers every process.
        with sqlite3.connect(self.home / "airflow.db") as conn:
            conn.execute("PRAGMA journal_mode=WAL")

    def start(self, *, wait_for_dags: list[str] | tuple[str, ...] = (), timeout: float = 180.0,
              scheduler: bool = True) -> None:
        """Start api-server, scheduler and dag-processor, each in its own process group.

        Returns once the api-server answers and every DAG in ``wait_for_dags`` is serialized. With
        ``scheduler=False`` the scheduler is left for :meth:`start_scheduler` (trigger and unpause first: see
        :func:`devtools.runs.run_all`). Raises ``StackError`` (naming the logs, and any DAG import errors) after
        ``timeout`` seconds or when a process exits early; the processes already started are left for ``stop()``.
        """
        t0 = time.monotonic()
        self.prepare_home()
        for name in ("api-server", "scheduler", "dag-processor"):
            if name != "scheduler" or scheduler:
                self._spawn(name)
        if self.public_api_apart:
            self._spawn("public-api", "api-server", "--apps", "core", "--port", str(self.public_port))
        deadline = time.monotonic() + timeout
        while not (self._api_up() and self._api_up(self.public_url)):
            self._check_alive()
            if time.monotonic() > deadline:
                raise StackError(f"api-server not answering on {self.base_url}; see {self.process_logs}")
            time.sleep(0.5)
        self.warm_execution_api(timeout=max(1.0, deadline - time.monotonic()))
        missing = set(wait_for_dags)
        while missing:
            self._check_alive()
            missing -= set(self.dag_ids())
            if not missing:
                break
            if time.monotonic() > deadline:
                errors = self.import_errors()
                raise StackError(
                    f"DAGs not serialized after {timeout}s: {sorted(missing)}; import errors: {errors}; "
                    f"see {self.process_logs}/dag-processor.log"
                )
            time.sleep(1.0)
        _record_timing("start", time.monotonic() - t0, self.home)

    def _spawn(self, name: str, *argv: str) -> None:
        """Start component ``name`` (``airflow <argv>``, by default ``airflow <name>``), logging to
        ``process-logs/<name>.log``."""
        popen = procs.spawn(self._airflow(*(argv or (name,))), env=self.env(),
                            log_path=self.process_logs / f"{name}.log", cwd=self.home)
        self._popens.append(popen)
        self._names.append(name)

    def start_scheduler(self) -> None:
        """Start the scheduler of a stack started with ``start(scheduler=False)``. Raises ``StackError`` when
        one is running already."""
        if any(n == "scheduler" and p.poll() is None for n, p in zip(self._names, self._popens)):
            raise StackError("the scheduler is running already")
        self._spawn("scheduler")

    def _markers(self) -> list[str]:
        return [f"{procs.MARKER_VAR}={self.stack_id}", f"AIRFLOW_HOME={self.home}"]

    def _check_alive(self) -> None:
        for name, popen in zip(self._names, self._popens):
            if name != "migrate" and popen.poll() is not None:
                raise StackError(f"{name} exited with {popen.returncode}; see {self.process_logs}/{name}.log; "
                                 f"its last lines:\n{log_tail(self.process_logs / f'{name}.log')}")

    def warm_execution_api(self, timeout: float = 180.0) -> None:
        """Have the api-server answer one Execution API request (``GET /execution/health``); ``start()`` does.

        A fresh api-server builds its Execution API sub-application on the first request to it, and that blocks
        every request it serves: 7 to 42 s on a loaded 2-core host. A long-running deployment paid that once,
        long ago; a scenario must not pay it while its first tasks start: every request queued behind it then
        lands at once, and on SQLite a public-API write (its audit row is written on the event loop) meeting an
        open ``/run`` transaction stalls the api-server for the 30 s busy timeout (CI: agents died before
        ``/run``, the harness's own ``PATCH`` got a 500). Raises ``StackError`` when it does not answer 2xx
        within ``timeout`` seconds.
        """
        try:
            httpx.get(f"{self.base_url}/execution/health", timeout=timeout,
                      verify=self._verify).raise_for_status()
        except httpx.HTTPError as exc:
            raise StackError(f"the Execution API did not answer ({exc!r}); see {self.process_logs}") from None

    def _api_up(self, base_url: str | None = None) -> bool:
        """True when the api-server at ``base_url`` (default: the one tasks talk to) answers
        ``/api/v2/version`` below 500 within 2 s."""
        try:
            return httpx.get(f"{base_url or self.base_url}/api/v2/version", timeout=2,
                             verify=self._verify).status_code < 500
        except httpx.HTTPError:
            return False

    def stop(self, grace_seconds: float = 20.0) -> list[str]:
        """Stop every process of the stack (SIGTERM, ``grace_seconds`` wait, SIGKILL); idempotent.

        Returns descriptions of processes that could not be stopped (empty when clean).
        """
        if self._client is not None:
            self._client.close()
            self._client = None
        self._stop_api_server(grace_seconds)
        left = procs.stop_all(self._popens, self._markers(), grace_seconds=grace_seconds)
        self._popens.clear()
        self._names.clear()
        return left

    def _stop_api_server(self, grace_seconds: float) -> None:
        """SIGTERM each running api-server's process group (``api-server``, then ``public-api``); once uvicorn
        has logged ``Finished server process [<pid>]`` (the application's shutdown is complete), SIGKILL the
        group.

        What follows that line is only the interpreter's exit, and its final garbage collection over the
        api-server's heap takes 5-17 s on a loaded 2-core host, a wait every stack's teardown paid. Anything
        that does not get that far within ``grace_seconds`` (a stopped process, a hung shutdown) is left to
        ``procs.stop_all``, which SIGKILLs it after its own grace.
        """
        for name in ("api-server", "public-api"):
            running = [p for n, p in zip(self._names, self._popens) if n == name and p.poll() is None]
            if running:
                self._stop_one_api_server(name, running[-1], grace_seconds)

    def _stop_one_api_server(self, name: str, popen: subprocess.Popen, grace_seconds: float) -> None:
        try:
            if psutil.Process(popen.pid).status() == psutil.STATUS_STOPPED:
                return  # SIGSTOPped by a test: it cannot act on SIGTERM, procs.stop_all SIGKILLs it
        except psutil.Error:
            return
        log_path = self.process_logs / f"{name}.log"
        offset = log_path.stat().st_size if log_path.exists() else 0
        try:
            os.killpg(popen.pid, signal.SIGTERM)
        except OSError:
            return
        finished = f"Finished server process [{popen.pid}]".encode()
        deadline = time.monotonic() + grace_seconds
        while popen.poll() is None and time.monotonic() < deadline:
            with open(log_path, "rb") as log:
                log.seek(offset)
                if finished in log.read():
                    try:
                        os.killpg(popen.pid, signal.SIGKILL)
                    except OSError:
                        pass
                    try:
                        popen.wait(timeout=10)
                    except subprocess.TimeoutExpired:
                        pass
                    return
            time.sleep(0.1)

    def __enter__(self) -> AirflowStack:
        return self

    def __exit__(self, *exc: object) -> None:
        left = self.stop()
        if left and exc[0] is None:
            raise StackError(f"processes left after stop: {left}")

    # ------------------------------------------------------------------ REST API v2

    def _api(self) -> httpx.Client:
        if self._client is None:
            try:
                token = httpx.post(
                    f"{self.public_url}/auth/token",
                    json={"username": API_USER, "password": self._password},
                    timeout=30,
                    verify=self._verify,
                )
            except httpx.HTTPError as exc:
                raise StackError(f"/auth/token failed: {exc!r}") from exc
            if token.status_code >= 300:
                raise StackError(f"/auth/token answered {token.status_code}: {token.text[:300]}")
            self._client = httpx.Client(
                base_url=f"{self.public_url}/api/v2",
                headers={"Authorization": f"Bearer {token.json()['access_token']}"},
                timeout=60,
                verify=self._verify,
            )
        return self._client

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self._api().request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise StackError(f"{method} {path} failed: {exc!r}; see {self.process_logs}/api-server.log") from exc
        if response.status_code >= 300:
            raise StackError(f"{method} {path} answered {response.status_code}: {response.text[:500]}")
        return response.json() if response.content else None

    def dag_ids(self) -> list[str]:
        """Ids of every DAG serialized so far (all bundles), sorted."""
        body = self._call("GET", "/dags", params={"limit": 1000})
        return sorted(dag["dag_id"] for dag in body["dags"])

    def import_errors(self) -> list[dict[str, str]]:
        """DAG import errors as ``[{"filename": ..., "stack_trace": ...}]`` (empty when all files parse)."""
        body = self._call("GET", "/importErrors", params={"limit": 1000})
        return [{"filename": e["filename"], "stack_trace": e["stack_trace"]} for e in body["import_errors"]]

    def unpause(self, dag_id: str, *, attempts: int = 4) -> None:
        """Unpause ``dag_id``; the call is idempotent, so a transport error or a 5xx (a busy SQLite: see
        :meth:`warm_execution_api`) is retried, up to ``attempts`` calls. Raises ``StackError`` if the API
        refuses (e.g. unknown DAG: 404) or every attempt failed."""
        self._set_paused(dag_id, False, attempts)

    def pause(self, dag_id: str, *, attempts: int = 4) -> None:
        """Pause ``dag_id`` (its runs then stay queued): as :meth:`unpause`, with the same retries and errors."""
        self._set_paused(dag_id, True, attempts)

    def _set_paused(self, dag_id: str, paused: bool, attempts: int) -> None:
        last: Exception | None = None
        for attempt in range(attempts):
            try:
                response = self._api().patch(f"/dags/{dag_id}", json={"is_paused": paused})
            except httpx.HTTPError as exc:
                last = exc
            else:
                if response.status_code < 300:
                    return
                if response.status_code < 500:
                    raise StackError(f"PATCH /dags/{dag_id} answered {response.status_code}: {response.text[:500]}")
                last = StackError(f"answered {response.status_code}")
            time.sleep(2 * (attempt + 1))
        raise StackError(f"PATCH /dags/{dag_id} failed {attempts} times ({last!r}); "
                         f"see {self.process_logs}/api-server.log")

    def trigger(self, dag_id: str, conf: dict[str, Any] | None = None, *, attempts: int = 4) -> str:
        """Trigger a manual run of ``dag_id`` with logical date now (so ``{{ ds }}`` renders); returns run_id.

        The run id is chosen here, so a call that timed out or failed with a 5xx on a busy SQLite can be
        retried safely: a 409 on a retry means the earlier call did create the run. Raises ``StackError``
        after ``attempts`` failed calls.
        """
        now = datetime.now(timezone.utc)
        run_id = f"manual__{now.isoformat()}__{uuid.uuid4().hex[:8]}"
        body = {"dag_run_id": run_id, "logical_date": now.isoformat(), "conf": conf or {}}
        last: Exception | None = None
        for attempt in range(attempts):
            try:
                response = self._api().post(f"/dags/{dag_id}/dagRuns", json=body)
            except httpx.HTTPError as exc:
                last = exc
            else:
                if response.status_code < 300 or (response.status_code == 409 and attempt > 0):
                    return run_id
                if response.status_code < 500:
                    raise StackError(f"POST /dags/{dag_id}/dagRuns answered {response.status_code}: "
                                     f"{response.text[:500]}")
                last = StackError(f"answered {response.status_code}")
            time.sleep(2 * (attempt + 1))
        raise StackError(f"POST /dags/{dag_id}/dagRuns failed {attempts} times ({last!r}); "
                         f"see {self.process_logs}/api-server.log")

    def run(self, dag_id: str, run_id: str) -> dict[str, Any]:
        """The DAG run as the API returns it (keys include ``state``, ``start_date``, ``end_date``)."""
        return self._call("GET", f"/dags/{dag_id}/dagRuns/{run_id}")

    def wait_for_run(self, dag_id: str, run_id: str, timeout: float, poll: float = 1.0) -> str:
        """Wait until the run is ``success`` or ``failed`` and return that state.

        Raises ``TimeoutError`` (with the last state) after ``timeout`` seconds.
        """
        return self.wait_for_runs({dag_id: run_id}, timeout=timeout, poll=poll)[dag_id]

    def wait_for_runs(self, runs: dict[str, str], timeout: float, poll: float = 2.0) -> dict[str, str]:
        """Wait for several runs (``{dag_id: run_id}``) to end; returns ``{dag_id: final state}``.

        A poll that fails (an api-server too busy to answer in 30 s) is retried until the deadline. Raises
        ``TimeoutError`` naming the unfinished runs and their last states after ``timeout`` seconds, and
        ``StackError`` at once when a stack process (scheduler, dag-processor, api-server) has exited.
        """
        deadline = time.monotonic() + timeout
        final: dict[str, str] = {}
        last: dict[str, str] = {}
        while True:
            self._check_alive()
            for dag_id, run_id in runs.items():
                if dag_id in final:
                    continue
                try:
                    state = self.run(dag_id, run_id)["state"]
                except StackError as exc:
                    last[dag_id] = f"unknown ({exc})"
                    continue
                last[dag_id] = state
                if state in TERMINAL_RUN_STATES:
                    final[dag_id] = state
            if len(final) == len(runs):
                return final
            if time.monotonic() > deadline:
                pending = {d: last.get(d) for d in runs if d not in final}
                raise TimeoutError(f"runs not finished after {timeout}s: {pending}")
            time.sleep(poll)

    def task_instances(self, dag_id: str, run_id: str) -> list[dict[str, Any]]:
        """Every task instance of one run as the REST API returns it (keys include ``task_id``, ``map_index``,
        ``try_number``, ``state``, ``operator``)."""
        body = self._call("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances", params={"limit": 1000})
        return list(body["task_instances"])

    def task_states(self, dag_id: str, run_id: str) -> dict[str, str]:
        """``{task key: state}`` for one run; key is ``task_id``, or ``task_id[map_index]`` for mapped TIs.

        A state of ``None`` (never scheduled) is reported as ``"none"``.
        """
        body = self._call(
            "GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances", params={"limit": 1000}
        )
        states = {}
        for ti in body["task_instances"]:
            key = ti["task_id"] if ti["map_index"] < 0 else f"{ti['task_id']}[{ti['map_index']}]"
            states[key] = ti["state"] or "none"
        return states

    def traces(self) -> list[str]:
        """All callback trace lines written under ``home/traces`` (sorted), see ``dags/_trace.py``."""
        lines: list[str] = []
        for path in sorted(self.traces_dir.glob("*")):
            lines.extend(line for line in path.read_text().splitlines() if line.strip())
        return sorted(lines)
