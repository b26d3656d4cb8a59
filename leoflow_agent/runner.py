"""Run one launched workload inside an agent process (Lite: a fork of the zygote).

The agent is the Task SDK supervisor: it calls ``supervise_task(..., client=...)`` with an SDK client whose
HTTP transport is a :class:`~leoflow_agent.transport.RecordingTransport` (DESIGN §3 "Run"). Callbacks and
connection tests run through ``BaseExecutor.run_workload`` unchanged. A task pod's agent runs its workload
through the same :func:`supervise_attempt` (:mod:`leoflow_agent.podmain`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from leoflow_agent import outcome
from leoflow_agent.protocol import Ev, agent_title_marker, ev_message

if TYPE_CHECKING:
    from leoflow_agent.transport import RecordSink

log = logging.getLogger(__name__)


def sdk_ssl_context() -> Any:
    """The SSL context the Task SDK's own client would use (``[api] ssl_cert`` / CA settings), cached per
    process by the SDK and pre-built in the zygote, so every agent inherits it instead of building it."""
    from airflow.sdk.api import client as sdk_client

    from leoflow_agent.transport import heartbeat_counting_client

    cls = heartbeat_counting_client(sdk_client.Client)
    return cls._get_ssl_context_cached(sdk_client.API_SSL_CA_FILE_PATH, sdk_client.API_SSL_CERT_PATH)


def workload_decoder() -> Callable[[str], Any]:
    """Return a function that parses an Airflow workload JSON string into its pydantic model.

    Built once in the zygote (pydantic schema building is slow), so every forked agent inherits it.
    Raises ``pydantic.ValidationError`` on a malformed workload.
    """
    from pydantic import TypeAdapter

    from airflow.executors import workloads

    adapter = TypeAdapter(workloads.All)
    return adapter.validate_json


def run_launch(
    message: dict[str, Any],
    *,
    decode_workload: Callable[[str], Any],
    report: Callable[[dict[str, Any]], None],
) -> int:
    """Run the workload of one ``launch`` message to completion; return the process exit code.

    :param message: the zygote's ``launch`` message (see :mod:`leoflow_agent.protocol`).
    :param decode_workload: from :func:`workload_decoder`.
    :param report: sends an event to the zygote (:func:`reported_event`).
    :returns: 0 when the supervisor returned (whatever the task's outcome: exit codes are never the outcome,
        DESIGN §3); 1 when the workload could not be started.
    """
    from airflow.executors.workloads import ExecuteTask

    workload = decode_workload(message["workload"])
    server = message["server"]
    if not isinstance(workload, ExecuteTask):
        from airflow.executors.base_executor import BaseExecutor

        code = BaseExecutor.run_workload(workload, server=server, subprocess_logs_to_stdout=False)
        return 0 if code in (0, None) else int(code)

    ti = workload.ti
    attempt = outcome.AttemptIdentity(str(ti.id), int(ti.try_number), int(message["attempt_epoch"]))
    sinks = []
    killed: Callable[[], bool] = _never_killed
    if message.get("record_path"):
        import functools

        from leoflow_agent.protocol import kill_marker_path
        from leoflow_agent.transport import file_sink

        sinks.append(file_sink(message["record_path"]))
        killed = functools.partial(os.path.exists, kill_marker_path(message["record_path"]))
    from leoflow_agent.proc import ATTEMPT_ENV

    os.environ[ATTEMPT_ENV] = str(message["launch_id"])  # lets a successor find this attempt's orphans
    if message.get("fault") == "mid_task":
        _arm_mid_task_fault(message)
    return supervise_attempt(
        workload,
        server=server,
        attempt=attempt,
        sinks=sinks,
        on_reported=lambda state, recorded: report(reported_event(state, recorded)),
        fault=message.get("fault"),
        killed=killed,
        title=agent_title_marker(message["launch_id"]),
    )


def supervise_attempt(
    workload: Any,
    *,
    server: str,
    attempt: outcome.AttemptIdentity,
    sinks: Sequence[RecordSink],
    on_reported: Callable[[str, bool], None],
    fault: str | None = None,
    killed: Callable[[], bool] | None = None,
    title: str = "",
    subprocess_logs_to_stdout: bool = False,
    hostname: str | None = None,
    lease_seconds: float | None = None,
    watch_sigterm: bool = False,
) -> int:
    """Run one ``ExecuteTask`` workload under the Task SDK supervisor with leoflow's wrapping transport; the one
    way every agent runs a task (a Lite agent: :func:`run_launch`; a task pod: :mod:`leoflow_agent.podmain`).

    The SDK client's HTTP transport is a :class:`~leoflow_agent.transport.RecordingTransport` over a plain
    ``httpx.HTTPTransport`` (the SDK's own SSL context, no transport retries: the SDK client retries), and the
    client class counts heartbeats as the supervisor does (:func:`~leoflow_agent.transport.heartbeat_counting_client`)
    and does not send the supervisor's first heartbeat when it comes within :func:`first_heartbeat_window` of
    the run call (that call set ``last_heartbeat_at`` already).

    :param workload: an ``airflow.executors.workloads.ExecuteTask`` carrying its workload token.
    :param server: the Execution API's base URL (``…/execution/``).
    :param attempt: the attempt stamped on every outcome record.
    :param sinks: where outcome records go, each written before a terminal PATCH leaves.
    :param on_reported: ``(state, recorded)`` once a terminal PATCH returned 2xx.
    :param fault: a fault-injection point (test mode only) or ``None``.
    :param killed: ``killed() -> bool`` (see ``RecordingTransport``); ``None``: never killed by leoflow.
    :param title: the process title's prefix (followed by ``dag_id.task_id map_index=N``).
    :param subprocess_logs_to_stdout: the task's log lines also go to stdout (a pod's log), as Airflow's
        ``execute_workload`` has them in a KubernetesExecutor pod.
    :param hostname: the hostname every call of the attempt reports (a pod's name); ``None``: Airflow's
        ``get_hostname()`` asked once. Pinned for the attempt (:func:`leoflow_agent.hostname.pin`).
    :param watch_sigterm: any SIGTERM the agent receives counts as a kill (task pods: a pod delete, an eviction, a
        drain reach the agent as SIGTERM, and leoflow writes no kill marker there;
        :class:`~leoflow_agent.transport.SigtermWatch`, DESIGN §2 "A success after SIGTERM"). Lite leaves it off:
        leoflow's own kills write the kill marker, and a SIGTERM from elsewhere (a service manager stopping the
        scheduler's unit) is no reason to doubt a body's success there.
    :param lease_seconds: ``[leoflow] agent_lease_seconds`` (task pods): when the Execution API gives no answer
        below 500 for that long, the agent marks the attempt ``heartbeat_lost``, kills its task's process groups
        (SIGTERM, then SIGKILL after ``[core] killed_task_cleanup_time``) and exits with
        :data:`leoflow_agent.lease.EXIT_LEASE_EXPIRED` (:class:`~leoflow_agent.lease.LeaseWatchdog`; k8s review
        §14). The lease ends once a terminal report was answered 2xx (the supervisor then sends nothing while its
        task ends, and the server holds the outcome). ``None``: no lease (Lite: the scheduler proves a death by
        pid there, and an API server outage must not kill healthy bodies).
    :returns: 0 once the supervisor returned, whatever the task's outcome (exit codes are never the outcome,
        DESIGN §3). Whatever the supervisor raises propagates.
    """
    import httpx

    from airflow.sdk.api.client import Client
    from airflow.sdk.execution_time import supervisor as sdk_supervisor

    from leoflow_agent.transport import RecordingTransport, SigtermWatch, heartbeat_counting_client

    from leoflow_agent.hostname import pin
    from leoflow_agent.oom import OomWatch

    pin(hostname)
    exit_watch = ExitWatch(sdk_supervisor)
    sigterm = SigtermWatch.install() if watch_sigterm else None  # a SIGTERM holds a later report as killed

    def reported(state: str, recorded: bool) -> None:
        if watchdog is not None:
            watchdog.stop()  # the server holds the outcome; the supervisor now sends nothing while its task ends
        on_reported(state, recorded)
        exit_watch.closely()

    ti = workload.ti
    watchdog: Any = None
    if lease_seconds is not None:
        from leoflow_agent.lease import LeaseWatchdog, exit_now

        watchdog = LeaseWatchdog(lease_seconds, cleanup=_conf_int("core", "killed_task_cleanup_time", 60),
                                 on_expired=lambda why: transport.lease_lost(why), exit=exit_now)
    transport = RecordingTransport(
        httpx.HTTPTransport(retries=0, verify=sdk_ssl_context()),
        attempt=attempt,
        sinks=sinks,
        on_reported=reported,
        fault=fault,
        max_failed_heartbeats=_conf_int("workers", "max_failed_heartbeats", 3),
        task_log=task_log_writer(workload.log_path),
        killed=lambda: (sigterm is not None and sigterm()) or (killed or _never_killed)(),
        on_answer=watchdog.answered if watchdog is not None else None,
        oom_killed=OomWatch(),  # counted from here: an OOM kill of this attempt (its task process at the limit)
    )
    client = heartbeat_counting_client(Client)(base_url=server, token=workload.token, transport=transport)
    client.leoflow_transport = transport
    # the supervisor's first heartbeat repeats what the run call just did (heartbeat_counting_client)
    client.leoflow_first_heartbeat_window = first_heartbeat_window()
    _set_title(f"{title} {ti.dag_id}.{ti.task_id} map_index={ti.map_index}".strip())
    if watchdog is not None:
        watchdog.start()
    try:
        sdk_supervisor.supervise_task(
            ti=ti,
            bundle_info=workload.bundle_info,
            dag_rel_path=workload.dag_rel_path,
            token=workload.token,
            server=server,
            log_path=workload.log_path,
            client=client,
            subprocess_logs_to_stdout=subprocess_logs_to_stdout,
            sentry_integration=getattr(workload, "sentry_integration", ""),
        )
    finally:
        if watchdog is not None:
            watchdog.stop()
        exit_watch.restore()
        if sigterm is not None:
            sigterm.uninstall()
    return 0


EXIT_POLL_INTERVAL = 0.05
"""Seconds between the supervisor's checks for its task process's exit once the attempt's terminal state is
reported (:class:`ExitWatch`)."""


class ExitWatch:
    """Once an attempt's terminal state is reported, have the Task SDK supervisor notice its task process's exit
    within :data:`EXIT_POLL_INTERVAL` seconds instead of up to ``[workers] min_heartbeat_interval`` (5 s).

    Why: the supervisor (Airflow 3.3 ``supervisor.py`` ``WatchedSubprocess._monitor_subprocess``) waits in its
    selector for ``min(…, MIN_HEARTBEAT_INTERVAL)`` seconds at a time and checks for the child's exit after each
    wait. The kernel delivers the end of file on the child's sockets a few microseconds before the child can be
    reaped (``exit_files`` comes before ``exit_notify``), so when the supervisor handles the last end of file
    first, its check finds the child still running, the ``SIGCHLD`` that follows only interrupts a wait that
    Python then resumes (PEP 475), and the supervisor sleeps a whole interval with nothing registered. Measured
    with ``strace`` on Lite (a 100 µs race: the check at .428350, the ``SIGCHLD`` at .428475, the next check
    5.005 s later) and in the logs: 28 of 50 Lite attempts and 402 of 834 task pods ended their "Workload
    finished" 5.0 s after the task's last line (LocalExecutor: 4 of 50). A task pod holds its executor slot, and
    a Lite agent, a warm pod's attempt child and their resources, until then.

    After the terminal state is reported the interval bounds nothing else: the supervisor sends no heartbeat in
    a terminal state (``_send_heartbeat_if_needed``), so lowering the module's ``MIN_HEARTBEAT_INTERVAL`` (read
    on every wait) only makes it wake every :data:`EXIT_POLL_INTERVAL` until the child has exited (at most
    ``[core] task_success_overtime``, after which the supervisor kills it). The agent is one attempt's process,
    and :meth:`restore` puts the value back anyway. Without the attribute (another Airflow) nothing changes.

    :param supervisor_module: ``airflow.sdk.execution_time.supervisor`` (any object with a numeric
        ``MIN_HEARTBEAT_INTERVAL`` attribute).
    """

    def __init__(self, supervisor_module: Any) -> None:
        self._module = supervisor_module
        self._saved: float | None = None
        value = getattr(supervisor_module, "MIN_HEARTBEAT_INTERVAL", None)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            self._saved = value

    def closely(self) -> bool:
        """Lower the supervisor's wait to :data:`EXIT_POLL_INTERVAL` (never raise it). Returns whether it
        changed anything (False without a numeric ``MIN_HEARTBEAT_INTERVAL``, or one already that low)."""
        if self._saved is None or self._saved <= EXIT_POLL_INTERVAL:
            return False
        self._module.MIN_HEARTBEAT_INTERVAL = EXIT_POLL_INTERVAL
        return True

    def restore(self) -> None:
        """Put back the value seen at construction (a no-op when there was none)."""
        if self._saved is not None:
            self._module.MIN_HEARTBEAT_INTERVAL = self._saved


def _never_killed() -> bool:
    """An attempt without a record file has no kill marker either: never killed gracefully by leoflow."""
    return False


def reported_event(state: str, recorded: bool) -> dict[str, Any]:
    """The agent's ``reported`` event to its zygote: ``{"ev": "reported", "state": <Airflow state sent>,
    "recorded": <bool>}``. ``recorded`` is False when the attempt's outcome record could not be written
    (issue 8 hole 12): the report landed, but a later record-based decision about this attempt has no record
    to go on. Additive: a reader treats an absent ``recorded`` as True (agents before it always recorded)."""
    return ev_message(Ev.REPORTED, state=state, recorded=bool(recorded))


def task_log_writer(log_path: str | None) -> Callable[[str, str], None]:
    """Return a :data:`leoflow_agent.transport.TaskLog` that appends one structured (JSON) line per call to
    the TI's log file, the same file and format the Task SDK supervisor writes (``log_path`` relative to
    ``[logging] base_log_folder``, as ``airflow.sdk.log.init_log_file`` resolves it), so the operator reads it
    in the UI next to the task's own lines. ``log_path`` ``None`` (no file): writes nothing. Each call opens
    the file in append mode and writes one line in one ``write``; an ``OSError`` propagates (the transport
    catches it and keeps it in the agent's log).
    """

    def write(level: str, message: str) -> None:
        if not log_path:
            return
        import structlog

        from airflow.sdk.log import init_log_file, logging_processors

        path = init_log_file(log_path)
        with open(path, "ab") as fh:
            logger = structlog.wrap_logger(structlog.BytesLogger(fh), processors=logging_processors(json_output=True),
                                           logger_name="leoflow.agent")
            getattr(logger, level)(message)

    return write


MID_TASK_MARKER_ENV = "LEOFLOW_FAULT_MARKER"
"""TEST ONLY: set for the task (fault point ``mid_task``): the path a test DAG touches once it is mid-task."""


def _arm_mid_task_fault(message: dict[str, Any]) -> None:
    """Fault point ``mid_task`` (DESIGN §3): SIGKILL this agent once the marker file appears.

    The marker's path reaches the task through the environment the task child inherits from this forked
    agent; a daemon thread polls for it every 50 ms. Only ever armed when the executor's test-only
    ``[leoflow] test_fault_injection`` put the point into the launch message.
    """
    import signal
    import threading
    import time

    record_path = message.get("record_path") or f"/tmp/leoflow-{os.getpid()}"
    marker = os.path.join(os.path.dirname(record_path), "mid_task.marker")
    os.environ[MID_TASK_MARKER_ENV] = marker

    def watch() -> None:
        while not os.path.exists(marker):
            time.sleep(0.05)
        log.warning("fault injection: killing the agent mid-task")
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="leoflow-mid-task-fault", daemon=True).start()


def first_heartbeat_window() -> float:
    """Seconds after a 2xx run call within which the supervisor's first heartbeat is not sent (see
    :func:`~leoflow_agent.transport.heartbeat_counting_client`): half ``[workers] min_heartbeat_interval``, at
    most ``[core] task_success_overtime + [workers] socket_cleanup_timeout`` (Airflow's defaults 5, 20, 60 s:
    2.5 s). A skipped heartbeat leaves the task instance at most ``min_heartbeat_interval`` + this without one
    after its start, which the boot-time ladder's lower bound for ``[leoflow] agent_lost_threshold``
    (``task_success_overtime + min_heartbeat_interval + socket_cleanup_timeout``) already exceeds, so the
    agent-lost reaper never takes a healthy starting agent for a hung one. Never negative."""
    interval = _conf_float("workers", "min_heartbeat_interval", 5.0)
    slack = _conf_float("core", "task_success_overtime", 20.0) + _conf_float("workers", "socket_cleanup_timeout", 60.0)
    return max(0.0, min(interval / 2, slack))


def _conf_float(section: str, key: str, fallback: float) -> float:
    """Read a number from the SDK's config (``AIRFLOW__SECTION__KEY`` or airflow.cfg); Airflow's default on a
    missing or odd value."""
    try:
        from airflow.sdk.configuration import conf

        return conf.getfloat(section, key, fallback=fallback)
    except Exception:  # noqa: BLE001 - a missing/odd value falls back to Airflow's default
        return fallback


def _conf_int(section: str, key: str, fallback: int) -> int:
    """Read an integer from the SDK's config (``AIRFLOW__SECTION__KEY`` or airflow.cfg)."""
    try:
        from airflow.sdk.configuration import conf

        return conf.getint(section, key, fallback=fallback)
    except Exception:  # noqa: BLE001 - a missing/odd value falls back to Airflow's default
        return fallback




def _set_title(title: str) -> None:
    try:
        from setproctitle import setproctitle

        setproctitle(title)
    except ImportError:
        pass


def agent_main(
    message: dict[str, Any],
    *,
    decode_workload: Callable[[str], Any],
    report_fd: int,
) -> int:
    """Entry point of a freshly forked agent: new session, subreaper, run, return the exit code.

    Never raises: any exception is logged and turned into exit code 1 (the reconciler then treats the
    attempt by what Airflow and the record say).
    """
    from leoflow_agent import proc, protocol

    _set_title(agent_title_marker(str(message.get("launch_id"))))  # first: lets a restarted executor find us
    os.setsid()
    proc.become_subreaper()

    def report(event: dict[str, Any]) -> None:
        event = dict(event, launch_id=message["launch_id"])
        os.write(report_fd, protocol.encode(event))

    try:
        return run_launch(message, decode_workload=decode_workload, report=report)
    except BaseException:  # noqa: BLE001 - an agent must always exit with a code
        log.exception("agent failed to run launch %s", message.get("launch_id"))
        return 1
