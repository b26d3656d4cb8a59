"""``python -m leoflow_agent warm-pod``: the agent of one Kubernetes **warm pod** (issue 11 item 2; DESIGN §3
"Warm pools"; the contract between the warm branches: ``warm-contract.md``).

A warm pod is started for one DAG version before any attempt needs it, parses its DAG file once, and then runs
attempts of that version one after another, each as a cold task pod's agent would run it
(:mod:`leoflow_agent.podmain`), so an attempt placed on it skips the pod start, the image's Python start, the
imports and the parse. What it does, in order:

1. reads its environment (:func:`config_from_env`): the cold pod's variables keep their meaning
   (``LEOFLOW_EXCHANGE_URL``, ``LEOFLOW_TOKEN_FILE``, ``LEOFLOW_TERMINATION_MESSAGE_BUDGET``,
   ``LEOFLOW_CREDENTIAL_CEILING_SECONDS``, ``LEOFLOW_TEST_FAULT``), plus the ``LEOFLOW_WARM_*`` ones below;
2. **registers**: ``POST <exchange_url>/v1/warm/register`` with the projected ServiceAccount token in the body, as
   the exchange (``{"token": …}``), with the exchange's retry schedule, back-off, ``Retry-After`` and deadline
   (:func:`leoflow_agent.podmain.exchange_with_retries`). The answer's ``credential`` (a bearer secret that
   names this worker; held in memory only, never logged) authenticates every later call;
3. **prepares** the DAG file once (:func:`leoflow_agent.warm.prepare`, the Lite file worker's parse: a
   ``BundleDagBag`` that the task processes of every attempt are answered from while the file is unchanged), then
   readies the heap for forks (:func:`leoflow_agent.warm.ready_to_fork`);
4. **awaits** an attempt: ``POST <exchange_url>/v1/warm/await`` (``Authorization: Bearer <credential>``, body
   ``{"taken": <the last attempt handed to it, {ti_id, try_number, attempt_epoch}, or null>, "record": <that
   attempt's outcome record, when the termination-message file holds it>}``: an attempt whose answer was lost is
   handed again, one it ran is not, and its record lands even when its own POST was lost; k8s review §3, §4),
   a long poll of up to ``await_seconds``.
   204: nothing yet, ask again at once. 401: this worker was retired (its row deleted), exit 0. 429, a 5xx,
   another unexpected status, a transport error or a 200 that is no assignment: back off
   (:func:`leoflow_agent.podmain.backoff_delay`) and ask again (:func:`classify_await`);
5. on 200 **runs the attempt** in one forked child (:func:`run_attempt_child`): its own session, the workload
   run under the Task SDK supervisor exactly as ``podmain.run_pod`` runs a cold one
   (:func:`leoflow_agent.runner.supervise_attempt`), with two record sinks written before each terminal PATCH:
   the termination message (the whole file, truncate + write + fsync, as a cold pod; the last attempt's record
   is what stays there when the pod ends) and the in-band ``POST <exchange_url>/v1/outcome``
   (:func:`outcome_post_sink`; a failed POST is logged and never holds the PATCH back). The parent waits for the
   child; a per-attempt watchdog kills the child's whole process tree after the credential ceiling
   (:data:`leoflow_agent.podmain.ENV_CEILING`; 0: none). Then whatever of the attempt still runs is killed (the
   parent is a child subreaper, so a task process that left the child's session is reparented to it and found),
   and the attempt's files are swept (:func:`sweep`, isolation below). An attempt killed by the watchdog writes
   no record; the termination message may then still hold the previous attempt's record, which its identity
   (``ti_id``, ``try_number``, ``attempt_epoch``) tells apart. A worker never runs two attempts at once:
   it awaits only while no child lives;
6. **SIGTERM** (the pod is deleted): while an attempt runs it is passed on to the attempt's child, whose
   supervisor passes it on to the task as in a cold pod (Airflow 3.3 runs the operator's ``on_kill`` and lets the
   task go on; the kubelet's grace period then bounds it), and the worker takes no other attempt: it exits 0 once
   this one is over and swept. While idle it exits 0 at once;
7. **self-limits** with no control plane (:func:`decide_limits`): after ``LEOFLOW_WARM_MAX_ATTEMPTS`` attempts,
   past ``LEOFLOW_WARM_MAX_LIFETIME_SECONDS`` since it started, or idle (no attempt running or ended) for
   ``LEOFLOW_WARM_IDLE_TTL_SECONDS``, it exits 0 (the pod Succeeds). An attempt that started before a limit is
   never cut by it: the limits are checked between attempts only (the pod's ``activeDeadlineSeconds`` bounds the
   last one).

Isolation (``LEOFLOW_WARM_ISOLATION``), decided here where the contract leaves it open:

* ``read-only-root`` (for a pod whose root filesystem is read-only, its writable places being emptyDirs): each
  attempt gets its own ``HOME`` and ``TMPDIR``, fresh directories under ``LEOFLOW_WARM_SCRATCH`` (mode 0700),
  removed after it; and between attempts the sweep roots (``/tmp`` and ``/dev/shm``;
  :data:`ENV_WARM_SWEEP_ROOTS`) are emptied. What a task wrote in those places is gone before the next attempt
  starts. NOT guaranteed: files written elsewhere that is writable (another emptyDir or volume the pod template
  mounts, the DAG bundle's directory if writable), anything in memory of the warm parent that a DAG file's top
  level computed (it is computed once per worker, as in a DAG processor), kernel-level state (SysV IPC,
  abstract sockets), and the image's own ``HOME`` content (a per-attempt ``HOME`` starts empty: a config file
  baked into the image's home directory is not seen; use ``XDG_*``/tool variables for those);
* ``shared``: nothing per attempt and no sweep. Attempts see each other's files, as Lite attempts on one host (and
  LocalExecutor's) do; the cheapest mode, for DAGs whose tasks are trusted to clean up after themselves.

Files the worker itself needs never live in a sweep root: the termination message is ``/dev/termination-log``,
the token file the projected volume, and :data:`ENV_WARM_SCRATCH` must not be inside a sweep root (refused by
:func:`config_from_env`). The sweep never crosses a mount point (a volume mounted under ``/tmp`` is left alone)
and never follows a symbolic link.

Exit codes: :data:`leoflow_agent.podmain.EXIT_CODES`; 0 also for every self-limit and for a retired worker. When
registration fails, the termination message holds the classified record as a cold pod's would
(``exchange_refused``, ``exchange_unreachable``, ``agent_start_failed``; no identity).

Standard library only at import time (the wire constants are imported by the control plane); Airflow and httpx
are imported when the agent runs.
"""

from __future__ import annotations

import enum
import json
import logging
import os
import re
import stat
import socket
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from leoflow_agent import outcome, podmain
from leoflow_agent.exchange import GrantError

__all__ = [
    "AWAIT_MARGIN_SECONDS",
    "DEFAULT_IDLE_TTL_SECONDS",
    "DEFAULT_MAX_ATTEMPTS",
    "DEFAULT_MAX_LIFETIME_SECONDS",
    "DEFAULT_SWEEP_ROOTS",
    "ENV_WARM_BUNDLE",
    "ENV_WARM_BUNDLE_VERSION",
    "ENV_WARM_DAG_FILE",
    "ENV_WARM_IDLE_TTL",
    "ENV_WARM_ISOLATION",
    "ENV_WARM_MAX_ATTEMPTS",
    "ENV_WARM_MAX_LIFETIME",
    "ENV_WARM_SCRATCH",
    "ENV_WARM_SWEEP_ROOTS",
    "ISOLATION_MODES",
    "ISOLATION_READ_ONLY_ROOT",
    "ISOLATION_SHARED",
    "OUTCOME_PATH",
    "OUTCOME_POST_TIMEOUT_SECONDS",
    "WARM_AWAIT_PATH",
    "WARM_REGISTER_PATH",
    "AnswerError",
    "Assignment",
    "AwaitVerdict",
    "LimitState",
    "Registration",
    "StopReason",
    "SweepResult",
    "WarmConfig",
    "WarmConfigError",
    "classify_await",
    "config_from_env",
    "decide_limits",
    "decode_assignment",
    "decode_registration",
    "main",
    "outcome_post_sink",
    "run_attempt_child",
    "run_warm_pod",
    "sweep",
]

log = logging.getLogger("leoflow.agent.warm_pod")

# --- the wire (the plugin app's routes; relative to LEOFLOW_EXCHANGE_URL, i.e. under /leoflow) ----------------

WARM_REGISTER_PATH = "/v1/warm/register"
"""``POST``: body ``{"token": <projected token>}``; 200 ``{"credential", "pod_uid", "dag_version_id",
"await_seconds"}`` (:func:`decode_registration`)."""
WARM_AWAIT_PATH = "/v1/warm/await"
"""``POST`` with the bearer credential, body ``{}``: 200 an assignment (:func:`decode_assignment`), 204 nothing
within ``await_seconds``, 401 retired (:func:`classify_await`)."""
OUTCOME_PATH = "/v1/outcome"
"""``POST`` with the bearer credential, body the outcome record as :func:`leoflow_agent.outcome.encode` renders it
(the whole body, no budget): 200 ``{"stored": bool}``, 400 ``bad_record``, 409 ``not_held``."""

# --- the environment (set by the warm pod builder, leoflow_airflow.runtime.kubernetes.warmpods) ---------------

ENV_WARM_BUNDLE = "LEOFLOW_WARM_BUNDLE"
"""The DAG bundle's name (a workload's ``bundle_info.name``). Required."""
ENV_WARM_BUNDLE_VERSION = "LEOFLOW_WARM_BUNDLE_VERSION"
"""The bundle's version (``bundle_info.version``); empty or absent: unversioned."""
ENV_WARM_DAG_FILE = "LEOFLOW_WARM_DAG_FILE"
"""The DAG file relative to the bundle (a workload's ``dag_rel_path``). Required."""
ENV_WARM_MAX_ATTEMPTS = "LEOFLOW_WARM_MAX_ATTEMPTS"
"""Attempts this worker runs at most, an integer >= 1 (absent: :data:`DEFAULT_MAX_ATTEMPTS`)."""
ENV_WARM_MAX_LIFETIME = "LEOFLOW_WARM_MAX_LIFETIME_SECONDS"
"""Seconds after its start past which the worker takes no new attempt, a number > 0 (absent:
:data:`DEFAULT_MAX_LIFETIME_SECONDS`)."""
ENV_WARM_IDLE_TTL = "LEOFLOW_WARM_IDLE_TTL_SECONDS"
"""Seconds without an attempt after which the worker exits, a number > 0 (absent:
:data:`DEFAULT_IDLE_TTL_SECONDS`)."""
ENV_WARM_ISOLATION = "LEOFLOW_WARM_ISOLATION"
"""One of :data:`ISOLATION_MODES` (absent: ``shared``); see the module docstring."""
ENV_WARM_SCRATCH = "LEOFLOW_WARM_SCRATCH"
"""A writable directory (an emptyDir) for the per-attempt ``HOME`` and ``TMPDIR``; required for
``read-only-root``, never inside a sweep root."""
ENV_WARM_SWEEP_ROOTS = "LEOFLOW_WARM_SWEEP_ROOTS"
"""The directories emptied between attempts in ``read-only-root`` isolation, ``:``-separated absolute paths
(absent: :data:`DEFAULT_SWEEP_ROOTS`, none). The warm pod builder sets it to the volumes it gives the pod there
(``/tmp`` and ``/dev/shm`` as ``emptyDir``, ``leoflow_airflow.runtime.kubernetes.warmpods``): only a directory
that is known to be the pod's own is ever emptied, so an agent run outside a pod (on a host whose ``/dev/shm`` is
the host's) sweeps nothing but its per-attempt ``HOME``/``TMPDIR``. Tests point it at a private directory."""

ISOLATION_SHARED = "shared"
ISOLATION_READ_ONLY_ROOT = "read-only-root"
ISOLATION_MODES = (ISOLATION_SHARED, ISOLATION_READ_ONLY_ROOT)
"""The values of :data:`ENV_WARM_ISOLATION`."""

DEFAULT_MAX_ATTEMPTS = 100
DEFAULT_MAX_LIFETIME_SECONDS = 3600.0
DEFAULT_IDLE_TTL_SECONDS = 600.0
DEFAULT_SWEEP_ROOTS: tuple[str, ...] = ()
AWAIT_MARGIN_SECONDS = 10.0
"""An await request's timeout is the server's ``await_seconds`` plus this, in seconds (the long poll's answer
is not cut by the client)."""
OUTCOME_POST_TIMEOUT_SECONDS = 5.0
"""Timeout of the in-band outcome POST, in seconds: the terminal PATCH waits for it at most this long."""
WAIT_POLL_SECONDS = 0.5
"""How often the parent looks at its attempt child when the kernel gives no pidfd (seconds)."""


class WarmConfigError(podmain.PodConfigError):
    """The warm agent's environment is unusable; the message names the variable (never a secret)."""


@dataclass(frozen=True)
class WarmConfig:
    """What the warm agent reads from its environment (:func:`config_from_env`).

    :param pod: the cold pod's settings (:class:`leoflow_agent.podmain.PodConfig`): exchange URL, token file,
        termination message budget, credential ceiling (the per-attempt watchdog, seconds; 0: none), fault.
    :param bundle: the DAG bundle's name; ``bundle_version`` its version (None: unversioned).
    :param dag_file: the DAG file relative to the bundle.
    :param max_attempts: >= 1. ``max_lifetime_seconds``, ``idle_ttl_seconds``: > 0.
    :param isolation: one of :data:`ISOLATION_MODES`.
    :param scratch: absolute path of the scratch directory, or None (then ``isolation`` is ``shared``).
    :param sweep_roots: absolute paths emptied between attempts (``read-only-root`` only).
    """

    pod: podmain.PodConfig
    bundle: str
    bundle_version: str | None
    dag_file: str
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    max_lifetime_seconds: float = DEFAULT_MAX_LIFETIME_SECONDS
    idle_ttl_seconds: float = DEFAULT_IDLE_TTL_SECONDS
    isolation: str = ISOLATION_SHARED
    scratch: str | None = None
    sweep_roots: tuple[str, ...] = DEFAULT_SWEEP_ROOTS

    def endpoint(self, path: str) -> str:
        """``<exchange_url><path>`` (``path``: one of the ``*_PATH`` constants)."""
        return self.pod.exchange_url + path

    def file_key(self) -> Any:
        """The :class:`leoflow_agent.warm.FileKey` of the DAG file this worker serves."""
        from leoflow_agent.warm import FileKey

        return FileKey(self.bundle, self.bundle_version, self.dag_file)


def _inside(path: str, root: str) -> bool:
    """True when ``path`` is ``root`` or below it (both absolute, normalised)."""
    return path == root or path.startswith(root.rstrip("/") + "/")


def config_from_env(environ: Mapping[str, str]) -> WarmConfig:
    """Read :class:`WarmConfig` from ``environ``.

    :raises WarmConfigError: (a :class:`leoflow_agent.podmain.PodConfigError`) whatever
        :func:`leoflow_agent.podmain.config_from_env` refuses; :data:`ENV_WARM_BUNDLE` or :data:`ENV_WARM_DAG_FILE`
        missing, or the DAG file absolute or with a ``..`` part; :data:`ENV_WARM_MAX_ATTEMPTS` not an integer >= 1;
        :data:`ENV_WARM_MAX_LIFETIME` or :data:`ENV_WARM_IDLE_TTL` not a finite number > 0;
        :data:`ENV_WARM_ISOLATION` not one of :data:`ISOLATION_MODES`; ``read-only-root`` without
        :data:`ENV_WARM_SCRATCH`; a scratch directory or sweep root that is not absolute; the scratch directory
        or the token file inside a sweep root in ``read-only-root`` isolation (the sweep would delete it); a sweep
        root that is ``/``.
    """
    try:
        pod = podmain.config_from_env(environ)
    except WarmConfigError:
        raise
    except podmain.PodConfigError as exc:
        raise WarmConfigError(str(exc)) from None

    def text(name: str) -> str:
        return environ.get(name, "").strip()

    bundle = text(ENV_WARM_BUNDLE)
    if not bundle:
        raise WarmConfigError(f"{ENV_WARM_BUNDLE} must name the DAG bundle of this warm pod's DAG version")
    dag_file = text(ENV_WARM_DAG_FILE)
    if not dag_file or dag_file.startswith("/") or ".." in dag_file.split("/"):
        raise WarmConfigError(f"{ENV_WARM_DAG_FILE} must be the DAG file's path relative to its bundle, "
                              f"got {dag_file[:200]!r}")

    def positive(name: str, default: Any, convert: Callable[[str], Any], what: str) -> Any:
        """``convert`` of the variable ``name`` (absent: ``default``); refused unless finite and > 0."""
        raw = text(name)
        if not raw:
            return default
        try:
            value = convert(raw)
        except ValueError:
            value = None
        if value is None or not 0 < value < float("inf"):
            raise WarmConfigError(f"{name} must be {what}, got {raw[:50]!r}")
        return value

    isolation = text(ENV_WARM_ISOLATION) or ISOLATION_SHARED
    if isolation not in ISOLATION_MODES:
        raise WarmConfigError(f"{ENV_WARM_ISOLATION} must be one of {list(ISOLATION_MODES)}, got {isolation[:50]!r}")
    scratch = text(ENV_WARM_SCRATCH) or None
    if scratch is not None:
        if not scratch.startswith("/"):
            raise WarmConfigError(f"{ENV_WARM_SCRATCH} must be an absolute path, got {scratch[:200]!r}")
        scratch = os.path.normpath(scratch)
    if isolation == ISOLATION_READ_ONLY_ROOT and scratch is None:
        raise WarmConfigError(f"{ENV_WARM_ISOLATION}={ISOLATION_READ_ONLY_ROOT} needs {ENV_WARM_SCRATCH}, a "
                              "writable directory for each attempt's HOME and TMPDIR")
    raw_roots = text(ENV_WARM_SWEEP_ROOTS)
    roots = tuple(r for r in raw_roots.split(":") if r) if raw_roots else DEFAULT_SWEEP_ROOTS
    normalised = []
    for root in roots:
        if not root.startswith("/"):
            raise WarmConfigError(f"{ENV_WARM_SWEEP_ROOTS} must hold absolute paths, got {root[:200]!r}")
        root = os.path.normpath(root)
        if root == "/":
            raise WarmConfigError(f"{ENV_WARM_SWEEP_ROOTS} must not hold / (the sweep empties each root)")
        swept = isolation == ISOLATION_READ_ONLY_ROOT  # shared: nothing is swept, the roots do not matter
        if swept and _inside(os.path.normpath(pod.token_file), root):
            raise WarmConfigError(f"{podmain.ENV_TOKEN_FILE} ({pod.token_file}) must not be inside the sweep root "
                                  f"{root}: the sweep between attempts would delete it")
        if swept and scratch is not None and _inside(scratch, root):
            raise WarmConfigError(f"{ENV_WARM_SCRATCH} ({scratch}) must not be inside the sweep root {root}: "
                                  "the sweep between attempts would delete it")
        normalised.append(root)
    return WarmConfig(pod=pod, bundle=bundle, bundle_version=text(ENV_WARM_BUNDLE_VERSION) or None,
                      dag_file=dag_file,
                      max_attempts=positive(ENV_WARM_MAX_ATTEMPTS, DEFAULT_MAX_ATTEMPTS, int, "an integer >= 1"),
                      max_lifetime_seconds=positive(ENV_WARM_MAX_LIFETIME, DEFAULT_MAX_LIFETIME_SECONDS, float,
                                                    "a finite number of seconds > 0"),
                      idle_ttl_seconds=positive(ENV_WARM_IDLE_TTL, DEFAULT_IDLE_TTL_SECONDS, float,
                                                "a finite number of seconds > 0"),
                      isolation=isolation, scratch=scratch, sweep_roots=tuple(normalised))


# --- answers ---------------------------------------------------------------------------------------------------


class AnswerError(GrantError):
    """A 200 answer of the register or await route whose body is not what the contract says (a
    :class:`leoflow_agent.exchange.GrantError`: :func:`leoflow_agent.podmain.exchange_with_retries` ends
    ``agent_start_failed`` on it, as on a malformed grant)."""


@dataclass(frozen=True)
class Registration:
    """A 200 answer of :data:`WARM_REGISTER_PATH`: the bearer ``credential`` (hidden from ``repr``), the pod's
    ``pod_uid``, its ``dag_version_id``, and ``await_seconds`` (the long poll's length, > 0)."""

    credential: str
    pod_uid: str
    dag_version_id: str
    await_seconds: float

    def __repr__(self) -> str:
        """Never print the credential."""
        return (f"Registration(pod_uid={self.pod_uid!r}, dag_version_id={self.dag_version_id!r}, "
                f"await_seconds={self.await_seconds})")


def decode_registration(body: bytes | str) -> Registration:
    """Parse a register 200 body. Raises :class:`AnswerError` when it is not a JSON
    object with non-empty strings ``credential``, ``pod_uid``, ``dag_version_id`` and a number ``await_seconds``
    in (0, 600]."""
    try:
        data = json.loads(body)
    except ValueError:
        raise AnswerError("the register answer is not JSON") from None
    if not isinstance(data, dict):
        raise AnswerError("the register answer is not a JSON object")
    strings = [data.get(k) for k in ("credential", "pod_uid", "dag_version_id")]
    if not all(isinstance(v, str) and v for v in strings):
        raise AnswerError("the register answer lacks credential, pod_uid or dag_version_id")
    wait = data.get("await_seconds")
    if not isinstance(wait, (int, float)) or isinstance(wait, bool) or not 0 < wait <= 600:
        raise AnswerError("the register answer's await_seconds is not a number in (0, 600]")
    return Registration(strings[0], strings[1], strings[2], float(wait))


@dataclass(frozen=True)
class Assignment:
    """A 200 answer of :data:`WARM_AWAIT_PATH`: the attempt (``ti_id``, ``try_number``, ``attempt_epoch``) and
    its ``workload`` (the ``ExecuteTask`` JSON text with a fresh workload token; hidden from ``repr``)."""

    ti_id: str
    try_number: int
    attempt_epoch: int
    workload: str

    def __repr__(self) -> str:
        """Never print the workload: it carries a credential."""
        return f"Assignment(ti_id={self.ti_id!r}, try_number={self.try_number}, attempt_epoch={self.attempt_epoch})"

    @property
    def attempt(self) -> outcome.AttemptIdentity:
        """The attempt's identity, as stamped on its records."""
        return outcome.AttemptIdentity(self.ti_id, self.try_number, self.attempt_epoch)


def decode_assignment(body: bytes | str) -> Assignment:
    """Parse an await 200 body: ``{"ti_id", "try_number", "attempt_epoch", "workload"}`` with ``workload`` the
    ExecuteTask as a JSON object (the contract) or as JSON text (the exchange's form; both read). Raises
    :class:`AnswerError` when ``ti_id`` is no non-empty string, ``try_number``/``attempt_epoch`` no integers >= 1,
    or ``workload`` neither, or a workload whose ``ti.id`` is not ``ti_id``."""
    try:
        data = json.loads(body)
    except ValueError:
        raise AnswerError("the await answer is not JSON") from None
    if not isinstance(data, dict):
        raise AnswerError("the await answer is not a JSON object")
    ti_id, workload = data.get("ti_id"), data.get("workload")
    numbers = [data.get("try_number"), data.get("attempt_epoch")]
    if not isinstance(ti_id, str) or not ti_id:
        raise AnswerError("the await answer lacks ti_id")
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in numbers):
        raise AnswerError("the await answer lacks try_number or attempt_epoch")
    if isinstance(workload, str):
        try:
            workload = json.loads(workload)
        except ValueError:
            raise AnswerError("the await answer's workload is not JSON") from None
    if not isinstance(workload, dict):
        raise AnswerError("the await answer lacks its workload")
    ti = workload.get("ti")
    if not isinstance(ti, dict) or str(ti.get("id")) != ti_id:
        raise AnswerError("the await answer's workload is not of its ti_id")
    return Assignment(ti_id, numbers[0], numbers[1], json.dumps(workload, separators=(",", ":")))


class AwaitVerdict(enum.Enum):
    """What one await answer means to the worker (:func:`classify_await`)."""

    ASSIGNED = "assigned"
    """200: run the attempt."""
    EMPTY = "empty"
    """204: nothing assigned within the long poll; ask again at once."""
    RETIRED = "retired"
    """401: the credential is unknown (the worker's row was deleted, its pod retired); exit 0."""
    RETRY = "retry"
    """Anything else (429, 5xx, an unexpected status, no answer): back off, then ask again."""


def classify_await(status: int | None) -> AwaitVerdict:
    """The verdict of an await answer's HTTP ``status`` (None: no answer, a transport error or timeout).

    200 ASSIGNED, 204 EMPTY, 401 RETIRED; every other status (a 503 with ``Retry-After``, a proxy's 502, a 404 of
    a wrong URL, a 403) and no answer: RETRY after a back-off, so a control plane that is away or misconfigured
    costs one request per back-off step, and the idle limit (:func:`decide_limits`) ends the worker when it never
    comes back."""
    if status == 200:
        return AwaitVerdict.ASSIGNED
    if status == 204:
        return AwaitVerdict.EMPTY
    if status == 401:
        return AwaitVerdict.RETIRED
    return AwaitVerdict.RETRY


# --- self-limits -----------------------------------------------------------------------------------------------


class StopReason(enum.StrEnum):
    """Why a worker stops on its own (exit 0)."""

    MAX_ATTEMPTS = "max_attempts"
    MAX_LIFETIME = "max_lifetime"
    IDLE_TTL = "idle_ttl"


@dataclass(frozen=True)
class LimitState:
    """What :func:`decide_limits` reads: ``started`` (monotonic seconds when the worker started), ``attempts``
    run so far, ``idle_since`` (monotonic seconds when the last attempt ended, or when the worker became ready),
    and the limits ``max_attempts``, ``max_lifetime_seconds``, ``idle_ttl_seconds``."""

    started: float
    attempts: int
    idle_since: float
    max_attempts: int
    max_lifetime_seconds: float
    idle_ttl_seconds: float


def decide_limits(state: LimitState, now: float) -> StopReason | None:
    """Whether the worker must stop before it asks for another attempt (``now``: monotonic seconds).

    :data:`StopReason.MAX_ATTEMPTS` once ``attempts >= max_attempts``; else :data:`StopReason.MAX_LIFETIME` once
    ``now - started >= max_lifetime_seconds``; else :data:`StopReason.IDLE_TTL` once ``now - idle_since >=
    idle_ttl_seconds``; else None. Called between attempts only: a running attempt is never cut by a limit."""
    if state.attempts >= state.max_attempts:
        return StopReason.MAX_ATTEMPTS
    if now - state.started >= state.max_lifetime_seconds:
        return StopReason.MAX_LIFETIME
    if now - state.idle_since >= state.idle_ttl_seconds:
        return StopReason.IDLE_TTL
    return None


# --- the sweep -------------------------------------------------------------------------------------------------


@dataclass
class SweepResult:
    """What :func:`sweep` did: ``removed`` entries (files, links, directories, counted at every depth),
    ``skipped`` mount points left alone, and ``failed`` paths it could not remove (with the error text)."""

    removed: int = 0
    skipped: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)


MOUNTINFO = "/proc/self/mountinfo"
"""Where the kernel lists this process's mount points (proc(5)); field 5 is the mount point, octal-escaped."""


def mount_points(mountinfo: str = MOUNTINFO) -> frozenset[str] | None:
    """Every mount point of this process's mount namespace, read from ``mountinfo`` (proc(5): the fifth field,
    with ``\\040``-style octal escapes undone); None when it cannot be read. A bind mount of a directory of the
    same filesystem keeps its ``st_dev``, so only this list tells the sweep where another volume begins."""
    try:
        with open(mountinfo, encoding="utf-8", errors="surrogateescape") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return None
    points = set()
    for line in lines:
        fields = line.split(" ")
        if len(fields) > 4:
            points.add(re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4]))
    return frozenset(points)


def _remove_tree(path: str, device: int, result: SweepResult, mounts: frozenset[str]) -> bool:
    """Remove ``path`` (not following links; not crossing to another ``device`` or into a mount point of
    ``mounts``). True when it is gone."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return True
    except OSError as exc:
        result.failed.append(f"{path}: {exc.strerror}")
        return False
    if st.st_dev != device or path in mounts:
        result.skipped.append(path)
        return False
    if stat.S_ISDIR(st.st_mode):
        try:
            names = os.listdir(path)
        except OSError as exc:
            result.failed.append(f"{path}: {exc.strerror}")
            return False
        empty = all([_remove_tree(os.path.join(path, n), device, result, mounts) for n in names])
        if not empty:
            return False
        try:
            os.rmdir(path)
        except OSError as exc:
            result.failed.append(f"{path}: {exc.strerror}")
            return False
    else:
        try:
            os.unlink(path)
        except FileNotFoundError:
            return True
        except OSError as exc:
            result.failed.append(f"{path}: {exc.strerror}")
            return False
    result.removed += 1
    return True


def sweep(roots: Iterable[str], *, remove_roots: bool = False, mountinfo: str = MOUNTINFO) -> SweepResult:
    """Empty each directory of ``roots`` (absolute paths): remove every entry below it, never following a
    symbolic link (a link is removed, not its target) and never crossing a mount point (an entry on another
    device than its root, or one ``mountinfo`` lists, e.g. a volume or a bind mount under ``/tmp``, is left whole
    and listed in ``skipped``). A root that does not exist is skipped silently. ``remove_roots``: remove the roots
    themselves too (a per-attempt scratch directory). Only roots the pod builder names are ever passed
    (:data:`ENV_WARM_SWEEP_ROOTS`). Never raises: what cannot be removed is listed in ``SweepResult.failed``.

    Between attempts of a ``read-only-root`` warm pod the roots are ``/tmp`` and ``/dev/shm``
    (:data:`ENV_WARM_SWEEP_ROOTS`, as the pod builder names them), emptied once the attempt's processes are gone.
    """
    result = SweepResult()
    mounts = mount_points(mountinfo)
    for root in roots:
        root = os.path.normpath(root)
        try:
            device = os.lstat(root).st_dev
        except FileNotFoundError:
            continue
        except OSError as exc:
            result.failed.append(f"{root}: {exc.strerror}")
            continue
        if remove_roots:
            _remove_tree(root, device, result, (mounts or frozenset()) - {root})
            continue
        try:
            names = os.listdir(root)
        except OSError as exc:
            result.failed.append(f"{root}: {exc.strerror}")
            continue
        for name in names:
            _remove_tree(os.path.join(root, name), device, result, mounts or frozenset())
    return result


# --- the attempt child -----------------------------------------------------------------------------------------

Post = Callable[[str, bytes, Mapping[str, str], float], "podmain.Answer"]
"""``post(url, body, headers, timeout_seconds) -> (status, headers, body)``; raises ``OSError`` or
``httpx.TransportError`` when no answer came."""


def outcome_post_sink(url: str, credential: str, post: Post, *,
                      timeout: float = OUTCOME_POST_TIMEOUT_SECONDS) -> Callable[[outcome.OutcomeRecord], None]:
    """A :data:`leoflow_agent.transport.RecordSink` that sends each record in-band: ``POST url`` (the plugin
    app's :data:`OUTCOME_PATH`) with ``Authorization: Bearer <credential>`` and the record as
    :func:`leoflow_agent.outcome.encode` renders it (the whole body). The transport calls it before each terminal
    PATCH, as it writes the termination message, so the record keyed off the state the PATCH reports reaches the
    ledger even when the PATCH is lost.

    Never raises and never holds the PATCH back longer than ``timeout`` seconds: a refused (non-2xx) or
    unanswered POST is logged (status and ``error_id``, never the credential) and returns None, so the
    transport still counts the attempt recorded: the termination message holds the record either way."""

    def send(record: outcome.OutcomeRecord) -> None:
        try:
            body = outcome.encode(record).encode()
        except ValueError as exc:
            log.error("outcome record of %s not sent in-band: %s", record.attempt(), exc)
            return None
        try:
            status, _headers, answer = post(url, body, {"authorization": f"Bearer {credential}",
                                                        "content-type": "application/json"}, timeout)
        except Exception as exc:  # noqa: BLE001 - a sink that fails must never stop the PATCH
            log.warning("outcome record of %s (%s) not sent in-band: no answer (%s)", record.attempt(),
                        record.state or record.reason, type(exc).__name__)
            return None
        if 200 <= status < 300:
            log.info("outcome record of %s (%s) sent in-band", record.attempt(), record.state or record.reason)
        else:
            log.warning("outcome record of %s (%s) refused in-band: HTTP %d error_id=%s", record.attempt(),
                        record.state or record.reason, status, podmain._error_id(answer))
        return None

    return send


def _httpx_post(config: WarmConfig) -> tuple[Post, Callable[[], None]]:
    """A :data:`Post` over one ``httpx.Client`` (no redirects; TLS verified with the Task SDK's SSL context for an
    ``https`` URL, as :func:`leoflow_agent.podmain._httpx_post`), and its closer. Made once per process: a child
    never uses its parent's client (its connections are the parent's)."""
    import httpx

    verify: Any = True
    if config.pod.exchange_url.startswith("https://"):
        from leoflow_agent.runner import sdk_ssl_context

        verify = sdk_ssl_context()
    client = httpx.Client(verify=verify, follow_redirects=False)

    def post(url: str, body: bytes, headers: Mapping[str, str], timeout: float) -> podmain.Answer:
        response = client.post(url, content=body, timeout=timeout,
                               headers={"content-type": "application/json", "accept": "application/json",
                                        **headers})
        return response.status_code, response.headers, response.content

    return post, client.close


def _attempt_dirs(config: WarmConfig, number: int) -> dict[str, str]:
    """In ``read-only-root`` isolation, make the attempt's own ``HOME`` and ``TMPDIR`` (mode 0700) under the
    scratch directory and return them as environment overrides (``{"HOME", "TMPDIR"}``); ``{}`` otherwise.
    Raises ``OSError`` when they cannot be made."""
    if config.isolation != ISOLATION_READ_ONLY_ROOT or config.scratch is None:
        return {}
    base = os.path.join(config.scratch, f"attempt-{number}")
    sweep([base], remove_roots=True)  # a leftover of a crashed parent
    home, tmp = os.path.join(base, "home"), os.path.join(base, "tmp")
    os.makedirs(home, mode=0o700)
    os.makedirs(tmp, mode=0o700)
    return {"HOME": home, "TMPDIR": tmp}


def run_attempt_child(config: WarmConfig, registration: Registration, assignment: Assignment, *,
                      env: Mapping[str, str], termination_path: str, decode_workload: Callable[[str], Any],
                      server: str, reported_fd: int | None = None) -> int:
    """The body of the forked child that runs one attempt; returns its exit code (0 once the supervisor returned,
    whatever the task's outcome; :data:`leoflow_agent.podmain.EXIT_START_FAILED` when the workload cannot be run,
    after writing an ``agent_start_failed`` record of the attempt to both sinks).

    Makes its own session (the watchdog kills it by process tree) and becomes a child subreaper (as a Lite agent),
    applies ``env`` (the attempt's ``HOME``/``TMPDIR``; the ``tempfile`` module's cached directory is reset),
    makes its own HTTP client for the outcome POST, then runs the workload under
    :func:`leoflow_agent.runner.supervise_attempt` with the termination message and :func:`outcome_post_sink`
    as sinks, as ``podmain.run_pod`` does. ``decode_workload`` and ``server`` were prepared in the parent.
    ``reported_fd``: a pipe to the parent, written one byte once the attempt's terminal PATCH returned 2xx (the
    parent then frees the worker while the supervisor finishes, as a Lite agent frees its slot at the report).
    """
    import tempfile

    from leoflow_agent import proc
    from leoflow_agent.transport import termination_sink

    os.setsid()
    try:
        proc.become_subreaper()
    except OSError:
        pass
    os.environ.update(env)
    tempfile.tempdir = None
    attempt = assignment.attempt
    post, close = _httpx_post(config)
    sinks = [termination_sink(termination_path, config.pod.message_budget),
             outcome_post_sink(config.endpoint(OUTCOME_PATH), registration.credential, post)]
    try:
        try:
            from airflow.executors.workloads import ExecuteTask

            workload = decode_workload(assignment.workload)
            if not isinstance(workload, ExecuteTask) or str(workload.ti.id) != assignment.ti_id:
                raise TypeError("the assigned workload is not an ExecuteTask of the assigned ti_id")
        except Exception as exc:  # noqa: BLE001 - the workload carries a token: name the error class only
            log.error("attempt %s: its workload cannot be run: %s", attempt, type(exc).__name__)
            record = outcome.agent_start_failed(attempt)
            for sink in sinks:
                try:
                    sink(record)
                except (OSError, ValueError) as err:
                    log.error("could not write the %s record: %s", record.reason, err)
            return podmain.EXIT_START_FAILED

        from leoflow_agent.runner import supervise_attempt

        def reported(state: str, recorded: bool) -> None:
            log.info("attempt %s: reported %s (outcome record %s)", attempt, state,
                     "written" if recorded else "NOT written")
            if reported_fd is not None:
                try:
                    os.write(reported_fd, b"R")
                except OSError:
                    pass

        try:
            from airflow.sdk.log import configure_logging

            configure_logging(output=sys.stdout.buffer, json_output=True)
            return supervise_attempt(workload, server=server, attempt=attempt, sinks=sinks, on_reported=reported,
                                     title="leoflow-agent warm pod", subprocess_logs_to_stdout=True,
                                     fault=config.pod.fault, hostname=socket.gethostname(), watch_sigterm=True,
                                     lease_seconds=config.pod.lease_seconds)
        except BaseException:  # noqa: BLE001 - an agent must always exit with a code
            log.exception("attempt %s: the supervisor failed", attempt)
            return podmain.EXIT_START_FAILED
    finally:
        close()


@dataclass
class _Child:
    """An attempt child of the parent: its ``pid``, its ``number``, the watchdog's ``deadline``
    (``time.monotonic()``; None: no limit), the read end ``reported_fd`` of its report pipe (None once read or
    closed), and whether it ``reported`` (its terminal PATCH returned 2xx) or was ``killed`` by the watchdog."""

    pid: int
    number: int
    deadline: float | None
    reported_fd: int | None = None
    reported: bool = False
    killed: bool = False


def _wait_child(pid: int, ceiling_seconds: int, *, deadline: float | None = None,
                reported_fd: int | None = None) -> tuple[int | None, bool]:
    """Wait for the attempt child ``pid``; after ``ceiling_seconds`` (> 0; 0: no limit) from now, or at
    ``deadline`` (``time.monotonic()``) when given, kill its whole process tree
    (:func:`leoflow_agent.proc.kill_tree`: its own session and anything that left it). With ``reported_fd``,
    return as soon as a byte can be read there (the child reported its attempt) with exit code None. Returns
    ``(exit code or None, killed by the watchdog)``."""
    import select

    from leoflow_agent import proc

    if deadline is None:
        deadline = time.monotonic() + ceiling_seconds if ceiling_seconds > 0 else None
    try:
        pidfd: int | None = os.pidfd_open(pid)
    except (AttributeError, OSError):
        pidfd = None
    killed = False
    try:
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return os.waitstatus_to_exitcode(status), killed
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0 and not killed:
                log.error("attempt child %d passed the credential ceiling (%d s): killing its process tree", pid,
                          ceiling_seconds)
                proc.kill_tree(pid)
                killed = True
                continue
            wait = WAIT_POLL_SECONDS if pidfd is None else (left if left is not None and not killed else None)
            watched = [fd for fd in (pidfd, reported_fd) if fd is not None]
            if watched:
                ready, _, _ = select.select(watched, [], [], None if wait is None else max(0.0, wait))
                if reported_fd is not None and reported_fd in ready:
                    if os.read(reported_fd, 1):
                        return None, killed
                    reported_fd = None  # the child closed it without a report (it exits): wait for the exit
            else:
                time.sleep(wait if wait is not None else WAIT_POLL_SECONDS)
    finally:
        if pidfd is not None:
            os.close(pidfd)


def _kill_leftovers(child: int) -> int:
    """Kill what the attempt left running: its child's process group, and every process reparented to this
    (subreaper) parent; reap them. Returns how many processes were killed."""
    import signal

    from leoflow_agent import proc

    killed = 0
    try:
        os.killpg(child, signal.SIGKILL)
    except OSError:
        pass
    for pid in proc.children(os.getpid()):
        proc.kill_tree(pid)
        killed += 1
    while True:
        try:
            done, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if not done:
            break
    return killed


# --- the worker ------------------------------------------------------------------------------------------------


def _register(config: WarmConfig, post: Post, started: float) -> podmain.ExchangeResult:
    """Register with the exchange's retries (:func:`leoflow_agent.podmain.exchange_with_retries`)."""

    def plain(url: str, body: bytes, timeout: float) -> podmain.Answer:
        return post(url, body, {}, timeout)

    return podmain.exchange_with_retries(config.pod, post=plain, started=started,
                                         url=config.endpoint(WARM_REGISTER_PATH),
                                         decode=decode_registration)


def run_warm_pod(config: WarmConfig, *, termination_path: str = podmain.TERMINATION_MESSAGE_PATH,
                 monotonic: Callable[[], float] = time.monotonic) -> int:
    """Register, prepare, then serve attempts one at a time until retired or a self-limit (module docstring);
    returns the exit code (:data:`leoflow_agent.podmain.EXIT_CODES`; 0 when retired or stopped by a limit).

    Never raises for an answer, a transport error or a failing attempt; a DAG file whose bundle cannot be resolved
    ends the worker with :data:`leoflow_agent.podmain.EXIT_START_FAILED` (and an ``agent_start_failed`` record
    with no identity).
    """
    from leoflow_agent import proc

    started = monotonic()
    post, close = _httpx_post(config)
    try:
        result = _register(config, post, started)
        if result.grant is None:
            assert result.reason is not None
            log.error("warm registration: %s (%s); this warm pod serves no attempt", result.detail, result.reason)
            podmain._write_record(termination_path, podmain._REFUSAL_RECORDS[result.reason](None),
                                  config.pod.message_budget)
            return result.exit_code
        registration: Registration = result.grant
        log.info("warm registration: %r after %d tries", registration, result.tries)

        from leoflow_agent import warm

        key = config.file_key()
        try:
            from setproctitle import setproctitle

            setproctitle(f"leoflow-agent warm pod: {key.title()}")
        except ImportError:
            pass
        try:
            prepared = warm.prepare(key)
        except BaseException as exc:  # noqa: BLE001 - a DAG file's top level may raise anything, even SystemExit
            log.error("warm pod: %s cannot be prepared: %r", key.title(), exc)
            podmain._write_record(termination_path, outcome.agent_start_failed(None), config.pod.message_budget)
            return podmain.EXIT_START_FAILED
        if prepared.errors:
            log.warning("warm pod: the parse of %s left import errors, so each attempt's task process parses it "
                        "itself: %s", prepared.path, prepared.errors)
        log.info("warm pod: %s parsed in %.2f s (%d DAGs, cached for attempts: %s)", prepared.path,
                 prepared.seconds, prepared.dags, prepared.cached)
        from airflow.executors.base_executor import get_execution_api_server_url

        from leoflow_agent.runner import sdk_ssl_context, workload_decoder

        decode_workload = workload_decoder()
        server = get_execution_api_server_url()
        sdk_ssl_context()
        try:
            proc.become_subreaper()
        except OSError as exc:
            log.warning("warm pod: cannot become a child subreaper (%s): an attempt's detached processes are "
                        "not cleaned up", exc.strerror)
        warm.ready_to_fork()
        return _serve(config, registration, post, termination_path=termination_path, started=started,
                      monotonic=monotonic, decode_workload=decode_workload, server=server)
    finally:
        close()


class _Stopped(BaseException):
    """SIGTERM arrived while no attempt ran (a ``BaseException``: no ``except Exception`` of the await swallows
    it)."""


class _Termination:
    """The parent's SIGTERM handler (the pod is being deleted; dumb-init forwards the kubelet's SIGTERM).

    While an attempt runs (:attr:`busy`) the signal is passed on to its child (:attr:`child`), whose supervisor
    then ends the task as a cold pod's agent would, and the worker stops once the attempt is over; while none
    runs it stops at once (:class:`_Stopped`). SIGTERM is blocked around the fork so the child's pid is known
    before the handler can run."""

    def __init__(self) -> None:
        self.busy = False
        self.child: int | None = None
        self.requested = False

    def __call__(self, signum: int, frame: Any) -> None:
        import signal

        self.requested = True
        if not self.busy:
            raise _Stopped()
        if self.child is not None:
            try:
                os.kill(self.child, signal.SIGTERM)
            except OSError:
                pass


def _serve(config: WarmConfig, registration: Registration, post: Post, *, termination_path: str, started: float,
           monotonic: Callable[[], float], decode_workload: Callable[[str], Any], server: str) -> int:
    """The await loop (module docstring, steps 4 to 7) under the SIGTERM handler (:class:`_Termination`);
    returns the exit code."""
    import signal

    termination = _Termination()
    signal.signal(signal.SIGTERM, termination)
    try:
        return _await_loop(config, registration, post, termination=termination, termination_path=termination_path,
                           started=started, monotonic=monotonic, decode_workload=decode_workload, server=server)
    except _Stopped:
        log.info("warm pod: stopped by SIGTERM while idle")
        return podmain.EXIT_OK


def _await_loop(config: WarmConfig, registration: Registration, post: Post, *, termination: _Termination,
                termination_path: str, started: float, monotonic: Callable[[], float],
                decode_workload: Callable[[str], Any], server: str) -> int:
    """:func:`_serve`'s loop."""
    lingering: list[_Child] = []  # the last attempt's child, reported, not yet exited
    try:
        return _await_attempts(config, registration, post, termination=termination,
                               termination_path=termination_path, started=started, monotonic=monotonic,
                               decode_workload=decode_workload, server=server, lingering=lingering)
    finally:
        termination.busy = True  # a SIGTERM while the last child ends is passed on, not raised here
        for child in lingering:
            termination.child = child.pid
            _finish(config, child)


def _await_attempts(config: WarmConfig, registration: Registration, post: Post, *, termination: _Termination,
                    termination_path: str, started: float, monotonic: Callable[[], float],
                    decode_workload: Callable[[str], Any], server: str, lingering: list[_Child]) -> int:
    """:func:`_await_loop`'s body; ``lingering`` holds the child of an attempt that reported and has not exited
    yet (finished before the next fork, or by the caller)."""
    attempts = failures = 0
    idle_since = monotonic()
    await_url = config.endpoint(WARM_AWAIT_PATH)
    headers = {"authorization": f"Bearer {registration.credential}"}
    taken: dict[str, Any] | None = None  # the last attempt handed to this worker: a lost answer is re-delivered
    while True:
        if lingering and (code := _exited(lingering[0])) is not None:
            _finish(config, lingering.pop(), code=code)
        state = LimitState(started, attempts, idle_since, config.max_attempts, config.max_lifetime_seconds,
                           config.idle_ttl_seconds)
        stop = decide_limits(state, monotonic())
        if termination.requested:
            log.info("warm pod: stopped by SIGTERM after %d attempts", attempts)
            return podmain.EXIT_OK
        if stop is not None:
            log.info("warm pod: stops after %d attempts (%s)", attempts, stop)
            return podmain.EXIT_OK
        status: int | None = None
        answer_headers: Mapping[str, str] = {}
        body = b""
        try:
            status, answer_headers, body = post(await_url, await_body(taken, termination_path), headers,
                                                registration.await_seconds + AWAIT_MARGIN_SECONDS)
        except Exception as exc:  # noqa: BLE001 - a transport error of any kind is "no answer"
            what = f"no answer ({type(exc).__name__})"
        else:
            what = f"HTTP {status} error_id={podmain._error_id(body)}"
        verdict = classify_await(status)
        assignment = None
        if verdict is AwaitVerdict.ASSIGNED:
            try:
                assignment = decode_assignment(body)
            except AnswerError as exc:
                verdict, what = AwaitVerdict.RETRY, f"HTTP 200 that is no assignment ({exc})"
        if verdict is AwaitVerdict.EMPTY:
            failures = 0
            continue
        if verdict is AwaitVerdict.RETIRED:
            log.info("warm pod: retired by the control plane (HTTP 401) after %d attempts", attempts)
            return podmain.EXIT_OK
        if verdict is AwaitVerdict.RETRY:
            failures += 1
            delay = podmain.backoff_delay(failures, retry_after=podmain.parse_retry_after(
                answer_headers.get("retry-after")))
            log.warning("warm await at %s: %s; asking again in %.1f s (%d failed)", await_url, what, delay,
                        failures)
            time.sleep(delay)
            continue
        assert assignment is not None
        taken = {"ti_id": assignment.ti_id, "try_number": assignment.try_number,
                 "attempt_epoch": assignment.attempt_epoch}
        failures = 0
        attempts += 1
        termination.busy = True
        try:
            while lingering:  # never two attempts at once: the last one's child ends (and is swept) first
                termination.child = lingering[0].pid
                _finish(config, lingering.pop())
            child = _run_one(config, registration, assignment, attempts, termination=termination,
                             termination_path=termination_path, decode_workload=decode_workload, server=server)
            if child.reported:
                lingering.append(child)
        finally:
            termination.busy, termination.child = False, None
        idle_since = monotonic()


def await_body(taken: dict[str, Any] | None, termination_path: str) -> bytes:
    """The body of an ``await``: ``{"taken": taken}`` and, when the termination-message file holds the record of
    that attempt (its child writes it before its terminal PATCH), ``"record": <its text>``: the in-band record is
    sent again with every await until the control plane releases the worker, so a record whose own POST was lost
    (an api-server outage across the attempt's end) still lands, and the attempt is never read GONE without it
    (k8s review §3). A file that cannot be read, or holds another attempt's record or none, adds nothing."""
    body: dict[str, Any] = {"taken": taken}
    if taken is not None:
        try:
            with open(termination_path, encoding="utf-8") as fh:
                text = fh.read(outcome.MAX_RECORD_BYTES + 1).strip()
        except (OSError, UnicodeDecodeError):
            text = ""
        record = outcome.decode(text) if text else None
        ident = None if record is None else record.attempt()
        if ident is not None and (ident.ti_id, ident.try_number, ident.attempt_epoch) == (
                taken.get("ti_id"), taken.get("try_number"), taken.get("attempt_epoch")):
            body["record"] = text
    return json.dumps(body).encode()


def _run_one(config: WarmConfig, registration: Registration, assignment: Assignment, number: int, *,
             termination: _Termination, termination_path: str, decode_workload: Callable[[str], Any],
             server: str) -> _Child:
    """Fork the child of attempt ``number`` and wait for it (the watchdog) until it exits or reports its attempt
    (its terminal PATCH returned 2xx). Returns the child: :func:`_finish` it (its exit, its leftovers, the sweep)
    before the next attempt forks. Between its report and its exit the Task SDK's supervisor waits for the task
    process's exit (50 ms at a time: :class:`~leoflow_agent.runner.ExitWatch`) and uploads the task's log; the
    worker awaits its next attempt meanwhile, so it is free at the report, as a Lite slot is (DESIGN §3 "Run")."""
    import signal

    from leoflow_agent import proc

    log.info("warm pod: attempt %d is %r", number, assignment)
    try:
        env = _attempt_dirs(config, number)
    except OSError as exc:
        log.error("warm pod: cannot make the attempt's HOME/TMPDIR under %s (%s); the attempt runs without",
                  config.scratch, exc.strerror)
        env = {}
    sys.stdout.flush()
    sys.stderr.flush()
    read_fd, write_fd = os.pipe()
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        proc.exit_child(lambda: run_attempt_child(config, registration, assignment, env=env,
                                                  termination_path=termination_path,
                                                  decode_workload=decode_workload, server=server,
                                                  reported_fd=write_fd),
                        f"the attempt child of {assignment!r}")
    os.close(write_fd)
    ceiling = config.pod.ceiling_seconds
    child = _Child(pid, number, time.monotonic() + ceiling if ceiling > 0 else None, reported_fd=read_fd)
    termination.child = pid
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    code, child.killed = _wait_child(pid, ceiling, deadline=child.deadline, reported_fd=read_fd)
    if code is None:
        child.reported = True
        log.info("warm pod: attempt %d reported: the worker takes its next attempt once this one exits", number)
    else:
        _finish(config, child, code=code)
    return child


def _finish(config: WarmConfig, child: _Child, *, code: int | None = None) -> None:
    """End attempt child ``child``: wait for its exit (the watchdog still armed) unless ``code`` says it was seen,
    kill its leftovers, and in ``read-only-root`` isolation sweep ``/tmp`` and ``/dev/shm`` (the pod's own
    volumes only) and remove the attempt's ``HOME``/``TMPDIR``. Idempotent through ``child.reported_fd``."""
    if code is None:
        code, killed = _wait_child(child.pid, 0, deadline=child.deadline)
        child.killed = child.killed or killed
    if child.reported_fd is not None:
        os.close(child.reported_fd)
        child.reported_fd = None
    number = child.number
    leftovers = _kill_leftovers(child.pid)
    log.info("warm pod: attempt %d ended: exit code %d%s%s", number, code,
             " (killed at the credential ceiling)" if child.killed else "",
             f", {leftovers} leftover processes killed" if leftovers else "")
    if config.isolation == ISOLATION_READ_ONLY_ROOT:
        roots = list(config.sweep_roots)
        swept = sweep(roots)
        scratch = sweep([os.path.join(config.scratch, f"attempt-{number}")], remove_roots=True) \
            if config.scratch else SweepResult()
        log.info("warm pod: swept %s (%d entries removed) and the attempt's HOME/TMPDIR", ":".join(roots),
                 swept.removed + scratch.removed)
        for what in swept.failed + scratch.failed:
            log.warning("warm pod: the sweep could not remove %s", what)


def _exited(child: _Child) -> int | None:
    """The exit code of ``child`` when it has exited (reaped now), else None; never blocks."""
    try:
        done, status = os.waitpid(child.pid, os.WNOHANG)
    except ChildProcessError:
        return 0
    return os.waitstatus_to_exitcode(status) if done else None


def main(environ: Mapping[str, str] | None = None, *,
         termination_path: str = podmain.TERMINATION_MESSAGE_PATH) -> int:
    """Entry point of ``python -m leoflow_agent warm-pod``: log to stderr, read the environment,
    :func:`run_warm_pod`. An unusable environment writes an ``agent_start_failed`` record (no identity) and
    returns :data:`leoflow_agent.podmain.EXIT_CONFIG`."""
    return podmain.agent_main(config_from_env, run_warm_pod, environ, termination_path=termination_path)
