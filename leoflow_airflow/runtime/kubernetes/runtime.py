"""``KubernetesRuntime``: the :class:`~leoflow_airflow.lifecycle.runtime.Runtime` of a pod per attempt
(``[leoflow] runtime = kubernetes``; DESIGN §1 "Runtimes", §3; issue 9 items 2 and 6).

Threads. The scheduler thread never calls the API server. Every request (pod create, the live read that
confirms a pod is gone, delete, the start-up check) runs on a small worker pool (``[leoflow] kube_api_workers``
threads) and its answer comes back through one queue that :meth:`KubernetesRuntime.poll` drains; the pod
informer (:mod:`.informer`) keeps a watch-fed cache on its own thread. So ``launch``, ``poll``, ``observe``,
``locate``, ``evidence``, ``kill`` and ``collect`` read memory and the cache only and return in
milliseconds whatever the API server does.

Dispatch (issue 9 item 2). ``launch`` builds the pod with the pure :func:`.pod.build_pod` (a ``PodRefused`` is
REFUSED at once, naming the field), submits its create and answers DISPATCHED; the create's answer, classified
by :mod:`.classify` and mapped by :func:`.decide.create_event`, comes back from :meth:`poll` as ``Started``
(``pod_name``, ``pod_uid``) or ``LaunchFailed`` (retryable for backpressure and deferred: the lifecycle
re-offers the workload; not for refused: the task instance fails with the API server's reason). A 409 on the
attempt's own deterministic name, and a 5xx or transport error after which the create may have landed, are
settled by a live read of the pod by name: this attempt's by its identity annotation → ``Started`` with that
pod's UID; none → a retryable failure. Backpressure and deferred answers close a back-off window
(:class:`.decide.CreateWindow`, honouring ``Retry-After``) during which :meth:`admit` answers BACKPRESSURE or
DEFERRED, so the scheduler loop re-offers without calling the API server; at most ``[leoflow]
launch_queue_size`` creates are in flight (beyond: DEFERRED).

Presence (DESIGN §2 "proof of death"): LIVE while the attempt's pod (by UID) is in the cache and not
terminal; GONE when the cache shows it terminal (``Succeeded``/``Failed``), or when it is absent from the cache
and a live read on the pool confirmed it (404, or the name now holds another UID); UNKNOWN until that read
answers, while a create is in flight, and while the cache has not synced. The cache is trusted only to defer.
One exception, the confirmation valve (issue 10 item 3): a pod that is being deleted and goes ``[leoflow]
pod_termination_valve`` seconds past its deletion grace period without a terminated status (its node is
unreachable: no kubelet will report its end, and leoflow's finalizer keeps the object) is GONE, and its evidence
says so (:func:`.status.unconfirmed_cause`, an infra loss), so its task instance is re-run on the infra budget
before Airflow's heartbeat purge would fail it. No pod object alone proves a death while the attempt's task
instance heartbeats (k8s review §14, :func:`.decide.heartbeat_silent`): the valve, a terminal pod whose agent
container reported no end (PodGC's ``Failed`` on a lost node) and a pod gone from the API server read LIVE until
the heartbeat :meth:`observe` is given is older than ``[leoflow] agent_lost_threshold``.

Kills delete exactly the attempt's pod: ``grace_period_seconds`` = the kill's grace and a UID precondition,
so a newer epoch's pod (another name) or a pod re-created under the same name (another UID) is never touched.
``stop()``/``end()`` never delete pods: they keep running for a successor, which adopts them from the ledger
and the pods' labels. Settled pods are deleted after ``[leoflow] pod_retention_success`` /
``pod_retention_failure`` seconds (:meth:`collect`, UID precondition).

The evidence is kept alive (issue 10 item 4): every pod carries leoflow's finalizer (``pod.OUTCOME_FINALIZER``),
so a deleted pod (PodGC, a user, a kill) stays readable, terminal and ``deleting``, until its record was read.
:meth:`collect` takes the finalizer off (:mod:`.finalizer`, on the pool) once the attempt's ledger row is closed
and the pod is terminal or deleting (:func:`.decide.release_due`): at once for the attempts the lifecycle just
closed (:meth:`forget`), and by a sweep of the cache every :data:`COLLECT_INTERVAL_SECONDS` for every other pod
(a predecessor's settled attempts, a failed release), so no settled pod keeps it.

Warm pods (issue 11; :mod:`.warmpods`, :mod:`.warmdecide`; ``[leoflow] warm_min_idle`` or ``warm_pools``): a
second informer watches the warm pods; every :data:`WARM_TICK_SECONDS` :meth:`poll` submits one pool tick
(:meth:`.warmpods.WarmPool.tick`) to the request pool, single-flight, and :meth:`start` submits the sweep of dead
schedulers' anchors. :meth:`launch` places an attempt on an idle registered worker of its ``dag_version_id``
(no ``executor_config`` asking for anything: :func:`.warmdecide.cold_reason`) with the guarded
``WarmLedger.assign``, answers ``Started`` with the warm pod's name and UID (through :meth:`poll`) and submits
the deadline PATCH (:func:`.warmdecide.lowered_deadline`); anything else is a cold pod as before. A warm
attempt's presence, evidence and start progress come from its ledger row and its pod
(:func:`.warmdecide.warm_presence`, :func:`~.warmdecide.warm_evidence`, :func:`~.warmdecide.warm_start_progress`:
an assignment not taken within 60 s is taken back and reads GONE; a deleted warm pod gets the confirmation valve
as a cold one, k8s review §6); a kill deletes its worker pod (a worker never outlives a killed attempt) only after
the guarded ``WarmLedger.mark_killing`` proved the row still holds that attempt (k8s review §7: never the pod of a
newer one); warm pods are never collected here (the pool reaps them).

Before the pod cache's first LIST ended (at most :data:`EVIDENCE_SYNC_WAIT_SECONDS` after :meth:`start`),
:meth:`~KubernetesRuntime.evidence` answers ``Evidence.unknown()`` rather than "no record", so adoption and
settling wait instead of re-running a recorded success (k8s review §2). :meth:`~KubernetesRuntime.collect` settles
only pods whose attempt the ledger holds CLOSED: a pod naming an attempt it does not hold is another
installation's (k8s review §5).

Callbacks (``ExecuteCallback``: deadline callbacks) do not get a pod: they run on the scheduler's host as a
local child process (:mod:`.callback`: ``BaseExecutor.run_workload``), the workload JSON handed over on its
stdin from an unlinked 0600 temporary file (never argv or the environment), the environment filtered as
Lite's (Airflow's own secrets withheld), its exit code reported as ``CallbackDone``.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import json
import logging
import os
import queue
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from leoflow_airflow import hooks, metrics
from leoflow_airflow.dispatch.disposition import Disposition, DispatchResult
from leoflow_airflow.errors import ConfigError, PodRefused
from leoflow_airflow.hookspecs import AttemptInfo
from leoflow_airflow.ledger.states import AttemptRef
from leoflow_airflow.lifecycle.runtime import (
    CallbackDone,
    EndCause,
    Evidence,
    Exited,
    LaunchSpec,
    LedgerRow,
    Presence,
    RuntimeEvent,
    RuntimeFacts,
    Started,
    StartProgress,
    StartState,
    launch_id,
)
from leoflow_airflow.runtime.kubernetes import decide, status, warmdecide, warmpods
from leoflow_airflow.runtime.kubernetes.classify import Verdict, VerdictKind, classify_exception
from leoflow_airflow.runtime.kubernetes.finalizer import Release, ReleaseOutcome, release_finalizer
from leoflow_airflow.runtime.kubernetes.launches import PodLaunch, PodLaunches
from leoflow_airflow.runtime.kubernetes.logsalvage import SalvageTarget, salvage_pod_log, salvage_target
from leoflow_airflow.runtime.kubernetes.pod import APP_LABELS, INSTANCE_LABEL, PodAttempt, build_pod, pod_name

if TYPE_CHECKING:
    from leoflow_airflow.ledger.store import Attempt
    from leoflow_airflow.runtime.kubernetes.informer import PodInformer
    from leoflow_airflow.runtime.kubernetes.status import PodView
    from leoflow_airflow.settings import LeoflowSettings

__all__ = ["KubernetesRuntime", "attempt_pod_name", "label_selector"]

log = logging.getLogger(__name__)

REQUEST_TIMEOUT_SECONDS = 30.0
"""Seconds one API request on the pool may take in all (connect + read)."""
START_RETRY_SECONDS = 30.0
"""Seconds between two start-up checks while the last one found a problem."""
READ_REUSE_SECONDS = 10.0
"""Seconds a confirming read that found the pod still there is reused before the next one is sent."""
DELETE_RETRY_SECONDS = 5.0
"""Seconds after a delete that got no answer before it is sent again."""
COLLECT_INTERVAL_SECONDS = 30.0
"""Seconds between two passes of the settled-pod GC (retention deletes, the finalizer sweep)."""
POLL_NO_PROOF = 0.0
"""The heartbeat age :meth:`KubernetesRuntime.poll` judges with: a fresh heartbeat, so that only the kubelet's word
(or a pod that never bound) ends an attempt there, and the pod object's word waits for ``observe()``'s real ages
(issue 33 partition wave: PodGC's ``Failed`` on a partitioned node's pod re-ran a body that still heartbeat)."""
RELEASE_SOON_SECONDS = 30.0
"""Seconds after :meth:`KubernetesRuntime.forget` during which every :meth:`~KubernetesRuntime.collect` checks
whether that attempt's pod may lose its finalizer (it may turn ``deleting`` only after the forget: a revoke's
kill); later, the sweep does."""
STUCK_REASONS = decide.STUCK_REASONS
"""Waiting reasons of the agent container that do not pass by themselves: logged once per pod as an error, and
the attempt rejected (:func:`.decide.start_progress`)."""

EVIDENCE_SYNC_WAIT_SECONDS = 120.0
"""Seconds after :meth:`KubernetesRuntime.start` during which the evidence of an attempt whose pod the unsynced
cache cannot show is :meth:`Evidence.unknown` rather than "no record" (k8s review §2): adoption and settling wait
for the first LIST instead of resetting a recorded success as lost. Below Airflow's default
``task_instance_heartbeat_timeout`` (300 s), which adoption restarts (``last_heartbeat_at = now``), so the
wait never ends in Airflow's purge. Past it (an API server still unreachable) the cache's answer is taken."""

WARM_TICK_SECONDS = 2.0
"""Seconds between two warm pool ticks (each one reads the targets and the ledger's warm rows, then acts)."""


@dataclass
class _WarmLaunch:
    """A warm attempt this runtime knows: its pod ``name``/``uid``, when it was assigned (``monotonic()``; None:
    adopted), and whether it was taken back (``revoked``: GONE) or reported ``exited``."""

    ref: AttemptRef
    name: str
    uid: str
    assigned_at: float | None = None
    revoked: bool = False
    exited: bool = False


@dataclass(frozen=True)
class _Ticked:
    """A warm pool tick (or the start sweep) returned: the next may be submitted."""

    what: str


POLL_TURN_SHARE = 0.1
"""The share of ``[leoflow] reap_page_size`` that :meth:`KubernetesRuntime.poll` looks at in turn beyond what
changed (its safety net; the lifecycle's LIVE page is the first one)."""


def label_selector(instance: str | None) -> str:
    """The label selector of the task pods installation ``instance`` (``[leoflow] instance``) creates:
    :data:`.pod.APP_LABELS` and :data:`.pod.INSTANCE_LABEL` ``=instance``, ``k=v`` joined by commas. The informer
    watches exactly these, so the pods of another installation sharing the namespace are never seen, adopted,
    released or deleted (k8s review §5). ``None``: every installation's, and pods of a leoflow older than the
    label (an uninstall's cleanup, ``release-pods --all-instances``); never the runtime's."""
    labels = dict(APP_LABELS) if instance is None else {**APP_LABELS, INSTANCE_LABEL: instance}
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


_Launch = PodLaunch  # the runtime's name for it (tests build them)


@dataclass(frozen=True)
class _Read:
    """A confirming read of pod ``name``: ``view`` None for 404; ``error`` when it got no answer."""

    name: str
    at: float
    view: PodView | None
    error: str = ""


@dataclass(frozen=True)
class _Deleted:
    """The answer to one delete: ``error`` empty when the pod is deleted or was gone already."""

    name: str
    uid: str | None
    why: str
    error: str = ""


@dataclass(frozen=True)
class _Released:
    """The answer to one finalizer release (:func:`.finalizer.release_finalizer`)."""

    release: Release


@dataclass(frozen=True)
class _StartCheck:
    """The start-up check's answer: ``problem`` empty when the namespace, pods and ServiceAccount are reachable."""

    problem: str
    notes: tuple[str, ...] = ()


class KubernetesRuntime:
    """A pod per attempt (module docstring).

    :param settings: the parsed ``[leoflow]`` section (``kubernetes.exchange_url`` derived: ``settings.load``).
    :param server: ``server() -> str``: the Execution API URL (callbacks only; task pods get theirs at exchange).
    :param api_client_factory: ``() -> kubernetes.client.ApiClient``; default: ``[leoflow] in_cluster`` /
        ``kube_config`` through :meth:`.review.KubeClient.from_config`.
    :param informer_factory: ``(api_client, namespace, label_selector) -> PodInformer``; default :class:`.informer.
        PodInformer`.
    :param mutation_hook: Airflow's ``pod_mutation_hook``; default: read at :meth:`start`
        (:func:`.template.airflow_pod_mutation_hook`). Pass ``False`` for none.
    :param monotonic: the clock of back-offs and intervals (seconds).
    :param environ: the environment callback children start from (filtered; default ``os.environ``).
    :param warm_ledger_factory: ``() -> WarmLedger`` (default ``WarmLedger.from_airflow()``); warm pods only.
    :param warm_versions: ``() -> [PoolVersion]`` (default :func:`.warmpods.airflow_versions`).
    :param jobs_alive: ``(job ids) -> the alive ones`` (default: Airflow's ``Job.is_alive`` of each job row).
    """

    kind = "kubernetes"
    host: str | None = None
    """Pods are not tied to the scheduler's host: attempts are unstamped and observed from any scheduler."""

    def __init__(self, settings: LeoflowSettings, *, server: Callable[[], str] = lambda: "",
                 api_client_factory: Callable[[], Any] | None = None,
                 informer_factory: Callable[[Any, str, str], PodInformer] | None = None,
                 mutation_hook: Callable[[Any], Any] | bool | None = None,
                 monotonic: Callable[[], float] = time.monotonic, environ: Mapping[str, str] | None = None,
                 warm_ledger_factory: Callable[[], Any] | None = None,
                 warm_versions: Callable[[], list[warmpods.PoolVersion]] | None = None,
                 jobs_alive: Callable[[set[str]], set[str]] | None = None) -> None:
        self.settings = settings
        self.kube = settings.kubernetes
        self._server = server
        self._api_client_factory = api_client_factory
        self._informer_factory = informer_factory
        self._hook_arg = mutation_hook
        self._hook: Callable[[Any], Any] | None = None
        self._template: Any = None
        self._forward_env: dict[str, str] = {}  # the scheduler's remote-logging settings, for every pod
        self._monotonic = monotonic
        self._environ = environ
        self._api: Any = None
        self._core: Any = None
        self.informer: PodInformer | None = None
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._results: queue.SimpleQueue[Any] = queue.SimpleQueue()  # create answers: become events in poll()
        self._facts: queue.SimpleQueue[_Read | _Deleted | _Released] = queue.SimpleQueue()  # taken anywhere
        self._futures: set[concurrent.futures.Future[Any]] = set()
        self._window = decide.CreateWindow()
        self._launches = PodLaunches()
        self._reads: dict[str, _Read] = {}
        self._reading: set[str] = set()
        self._deleting: dict[tuple[str, str | None], float | None] = {}  # deletes on the pool -> their grace
        self._delete_again: dict[tuple[str, str | None], tuple[float, float | None, str]] = {}
        self._terminal_seen: dict[tuple[str, str], datetime] = {}
        self._releasing: set[tuple[str, str]] = set()  # finalizer releases on the pool
        self._released: set[tuple[str, str]] = set()  # released; the cache may still show the finalizer
        self._release_soon: dict[tuple[str, str], tuple[AttemptRef, float]] = {}  # forgotten -> (ref, until)
        self._workload_of: Callable[[str, int], str | None] | None = None  # collect()'s: the salvage's log_path
        self._remote_logging = False  # start(): [logging] remote_logging (an ended pod's log is kept only then)
        self._start_seen: dict[str, tuple[str, datetime]] = {}  # pod uid -> (its start key, first seen at it)
        self._stop_due: dict[str, float] = {}  # deleted pod's uid -> monotonic time it should have stopped by
        self._unconfirmed: dict[str, float] = {}  # pod uid -> seconds past its grace when the valve opened
        self._held: set[str] = set()  # pod uids whose open valve a fresh heartbeat held shut (said once each)
        self._callbacks: dict[str, subprocess.Popen[bytes]] = {}
        self._checked = False  # the start-up check passed
        self._checking = False
        self._check_answer: _StartCheck | None = None
        self._problem = ""  # the start-up check's last problem (logged once)
        self._next_check = 0.0
        self._next_collect = 0.0
        self._started = False
        self._started_at: float | None = None  # monotonic() of start(): bounds the unsynced-evidence wait
        self._said_unsynced = False
        self._stopped = False
        self.job_id: int | None = None
        """This scheduler's Airflow job id (the executor sets it before :meth:`start`); warm pods need it."""
        self._warm_ledger_factory = warm_ledger_factory
        self._warm_versions = warm_versions
        self._jobs_alive = jobs_alive
        self.warm: warmpods.WarmPool | None = None
        self.warm_informer: PodInformer | None = None
        self._warm_ledger: Any = None
        self._warm_launches: dict[str, _WarmLaunch] = {}  # launch id -> the warm attempt
        self._warm_busy = False  # a tick (or the start sweep) is on the pool
        self._next_warm_tick = 0.0

    # --- the runtime itself ---------------------------------------------------------------------------
    def start(self) -> None:
        """Read the pod template and the ``pod_mutation_hook`` (once), build the API client, start the pod
        informer and the worker pool, and submit the start-up check; returns at once. :meth:`admit` answers
        DEFERRED until the check passed and the informer synced. An unreachable API server, a missing
        namespace or ServiceAccount, or missing RBAC are logged once as an error naming what to fix, and
        dispatch stays DEFERRED (nothing is lost) while the check is repeated every
        :data:`START_RETRY_SECONDS`.

        :raises ConfigError: the pod template is malformed (``[leoflow] pod_template_file``), the client
            configuration cannot be loaded (``[leoflow] in_cluster`` / ``kube_config``), or a ``[logging]``
            remote-logging option the pods would get carries a credential (:func:`.logenv.logging_env`).
        """
        from leoflow_airflow.runtime.kubernetes import template

        self._template = template.load_pod_template(self.kube.pod_template_file)
        self._forward_env = _remote_logging_env()
        self._remote_logging = _remote_logging_on()
        if self._hook_arg is None:
            self._hook = template.airflow_pod_mutation_hook()
        elif callable(self._hook_arg):
            self._hook = self._hook_arg
        self._api = self._make_api_client()
        from kubernetes import client

        self._core = client.CoreV1Api(self._api)
        self._pool = concurrent.futures.ThreadPoolExecutor(self.kube.kube_api_workers,
                                                           thread_name_prefix="leoflow-kube")
        selector = label_selector(self.kube.instance)
        if self._informer_factory is not None:
            self.informer = self._informer_factory(self._api, self.kube.namespace, selector)
        else:
            from leoflow_airflow.runtime.kubernetes.informer import PodInformer

            self.informer = PodInformer(self._api, self.kube.namespace, selector,
                                        request_timeout_seconds=REQUEST_TIMEOUT_SECONDS)
        self.informer.start()
        self._started_at = self._monotonic()
        self._start_warm()
        self._started = True
        self._start_check()

    def _start_warm(self) -> None:
        """Start warm pods when ``[leoflow] warm_*`` asks for any (module docstring): the warm ledger, the warm
        informer, the pool, and the sweep of dead schedulers' anchors on the pool. Without a job id or a warm
        ledger the runtime runs cold only, and says so once."""
        warm = self.settings.warm
        if not warm.enabled:
            return
        if self.job_id is None:
            log.error("leoflow warm pods are configured but this runtime has no scheduler job id: cold pods only")
            return
        try:
            if self._warm_ledger_factory is not None:
                self._warm_ledger = self._warm_ledger_factory()
            else:
                from leoflow_airflow.ledger.warm import WarmLedger  # type: ignore[import-not-found]

                self._warm_ledger = WarmLedger.from_airflow()
        except Exception as exc:  # noqa: BLE001 - the ledger is missing or unreachable: cold pods only
            log.error("leoflow warm pods: the warm ledger cannot be used (%s): cold pods only", _short(exc))
            return
        selector = warmpods.warm_selector(self.kube.instance)
        if self._informer_factory is not None:
            self.warm_informer = self._informer_factory(self._api, self.kube.namespace, selector)
        else:
            from leoflow_airflow.runtime.kubernetes.informer import PodInformer

            self.warm_informer = PodInformer(self._api, self.kube.namespace, selector,
                                             request_timeout_seconds=REQUEST_TIMEOUT_SECONDS)
        self.warm_informer.start()
        self.warm = warmpods.WarmPool(
            self._core, self.kube, warm, job_id=str(self.job_id), ledger=self._warm_ledger,
            informer=self.warm_informer, versions=self._warm_versions, template=self._template,
            mutation_hook=self._hook, held=self._warm_held_uids, request_timeout=REQUEST_TIMEOUT_SECONDS,
            monotonic=self._monotonic, forward_env=self._forward_env)
        self._warm_busy = True
        if not self._submit(self._warm_sweep_job):
            self._warm_busy = False

    def _warm_held_uids(self) -> set[str]:
        """Pod UIDs of warm attempts this runtime placed or adopted and has not forgotten (any thread: a copy)."""
        return {w.uid for w in list(self._warm_launches.values())}

    def _warm_sweep_job(self) -> _Ticked:
        """Pool: delete the anchors of scheduler jobs that are not alive (:meth:`.warmpods.WarmPool.sweep_dead_anchors`)."""
        assert self.warm is not None
        try:
            self.warm.sweep_dead_anchors(self._jobs_alive or _airflow_jobs_alive)
        except Exception as exc:  # noqa: BLE001 - logged; the next start sweeps again
            log.warning("leoflow warm pods: the sweep of dead schedulers' anchors failed: %s", _short(exc))
        return _Ticked("sweep")

    def _warm_tick_job(self) -> _Ticked:
        """Pool: one warm pool tick."""
        assert self.warm is not None
        report = self.warm.tick()
        if report.created or report.deleted or report.reaped or report.retired:
            log.info("leoflow warm pods: created %s, deleted %s, reaped %s, retired %s", report.created,
                     report.deleted, report.reaped, report.retired)
        return _Ticked("tick")

    def _make_api_client(self) -> Any:
        if self._api_client_factory is not None:
            return self._api_client_factory()
        from leoflow_airflow.runtime.kubernetes.review import KubeClient

        try:
            return KubeClient.from_config(in_cluster=self.kube.in_cluster, kube_config=self.kube.kube_config,
                                          timeout=REQUEST_TIMEOUT_SECONDS).api_client
        except Exception as exc:  # ConfigException, OSError: the configuration, not the network
            key = "leoflow.in_cluster" if self.kube.in_cluster else "leoflow.kube_config"
            value = str(self.kube.in_cluster) if self.kube.in_cluster else (self.kube.kube_config or "<default>")
            raise ConfigError(key, value, f"the Kubernetes client configuration cannot be loaded: {exc}") from None

    def stop(self, timeout: float) -> list[RuntimeEvent]:
        """Stop launching; wait up to ``timeout`` seconds for the creates in flight and return the events still
        owed (a ``Started`` records a pod so a successor adopts it); stop the informer and the pool. Pods are
        never deleted here: they keep running for a successor scheduler."""
        self._stopped = True
        creates = [f for f in self._futures if not f.done()]
        if creates:
            concurrent.futures.wait(creates, timeout=max(0.0, timeout))
        events = self._drain()
        self._shutdown(wait_informer=min(1.0, max(0.0, timeout)))
        return events

    def terminate(self) -> None:
        """Stop at once: the informer, the pool (queued requests cancelled) and the callback children (SIGKILL).
        Task pods were deleted by the lifecycle's kills first."""
        self._stopped = True
        for proc in self._callbacks.values():
            if proc.poll() is None:
                proc.kill()
        self._shutdown(wait_informer=0.0)

    def _shutdown(self, *, wait_informer: float) -> None:
        if self.informer is not None:
            self.informer.stop(wait_informer)
        if self.warm_informer is not None:
            self.warm_informer.stop(wait_informer)
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    # --- the worker pool ------------------------------------------------------------------------------
    def _submit(self, fn: Callable[..., Any], *args: Any) -> bool:
        """Run ``fn(*args)`` on the pool; its return value (never an exception) goes to the results queue.
        False when the pool is gone (stopped)."""
        if self._pool is None:
            return False

        def job() -> None:
            try:
                result = fn(*args)
                if isinstance(result, _Ticked):
                    self._warm_busy = False  # a plain assignment: the scheduler thread reads it
                elif isinstance(result, (_Read, _Deleted, _Released)):
                    self._facts.put(result)
                elif result is not None:
                    self._results.put(result)
            except Exception as exc:  # noqa: BLE001 - every job answers; a bug must not lose the fact
                log.exception("leoflow Kubernetes request %s failed unexpectedly", getattr(fn, "__name__", fn))
                if getattr(fn, "__name__", "") in ("_warm_tick_job", "_warm_sweep_job"):
                    self._warm_busy = False
                else:
                    self._results.put(("error", args, exc))

        try:
            future = self._pool.submit(job)
        except RuntimeError:  # shut down
            return False
        self._futures.add(future)
        future.add_done_callback(self._futures.discard)
        return True

    def _start_check(self) -> None:
        if self._checking or self._stopped:
            return
        self._checking = True
        if not self._submit(self._check_job):
            self._checking = False

    def _check_job(self) -> None:
        """Pool: run the start-up check and hand its answer over in one attribute (a reference assignment:
        :meth:`admit` and :meth:`poll` take it without waiting for the results queue)."""
        self._check_answer = self._check()

    def _take_check(self) -> None:
        """Scheduler thread: act on a start-up check's answer once it is there."""
        answer, self._check_answer = self._check_answer, None
        if answer is not None:
            self._started_checked(answer)

    def _check(self) -> _StartCheck:
        """Pool: can the scheduler use ``[leoflow] namespace`` (pods listable) and does ``[leoflow]
        service_account`` exist there? A 403 on the namespace or ServiceAccount read only means the scheduler
        may not look (least privilege): noted, not a problem."""
        ns, sa, t = self.kube.namespace, self.kube.service_account, REQUEST_TIMEOUT_SECONDS
        host = getattr(getattr(self._api, "configuration", None), "host", "?")
        notes: list[str] = []
        try:
            self._core.list_namespaced_pod(ns, limit=1, label_selector=label_selector(self.kube.instance),
                                           _request_timeout=t)
        except Exception as exc:  # noqa: BLE001 - sorted here
            code = getattr(exc, "status", None)
            if code in (401, 403):
                return _StartCheck(f"the scheduler's Kubernetes identity may not list pods in namespace {ns!r} "
                                   f"(HTTP {code}): grant it pods create, get, list, watch, delete, patch there")
            return _StartCheck(f"the Kubernetes API server at {host} does not answer ({_short(exc)}): check "
                               "[leoflow] in_cluster / kube_config and that the API server is reachable")
        for what, call in (("namespace", lambda: self._core.read_namespace(ns, _request_timeout=t)),
                           ("ServiceAccount", lambda: self._core.read_namespaced_service_account(
                               sa, ns, _request_timeout=t))):
            try:
                call()
            except Exception as exc:  # noqa: BLE001 - sorted here
                code = getattr(exc, "status", None)
                if code == 404 and what == "namespace":
                    return _StartCheck(f"namespace {ns!r} does not exist: create it or set [leoflow] namespace")
                if code == 404:
                    return _StartCheck(f"ServiceAccount {ns}/{sa} does not exist: create it (task pods run as it "
                                       "and the token exchange accepts only its tokens) or set [leoflow] "
                                       "service_account")
                if code in (401, 403):
                    notes.append(f"the {what} was not checked: the scheduler may not read it (HTTP {code})")
                    continue
                return _StartCheck(f"the Kubernetes API server at {host} does not answer ({_short(exc)})")
        return _StartCheck("", tuple(notes))

    def _create(self, lid: str, name: str, ref: AttemptRef, pod: Any) -> decide.CreateResult:
        """Pool: create ``pod``; where the answer leaves it open (409 on our name, 5xx, transport), read the pod
        by name to learn whether it is ours."""
        try:
            with metrics.timed("leoflow.pod.create"):
                created = self._core.create_namespaced_pod(self.kube.namespace, pod,
                                                           _request_timeout=REQUEST_TIMEOUT_SECONDS)
        except Exception as exc:  # noqa: BLE001 - classified
            verdict = classify_exception(exc, pod_name=name)
        else:
            return decide.CreateResult(lid, name, Verdict(VerdictKind.DISPATCHED), uid=created.metadata.uid)
        if verdict.kind not in (VerdictKind.CHECK_EXISTING, VerdictKind.DEFERRED):
            return decide.CreateResult(lid, name, verdict)
        read = self._read(name)
        if read.error:
            return decide.CreateResult(lid, name, verdict, lookup=decide.Lookup.FAILED, detail=read.error)
        if read.view is None:
            return decide.CreateResult(lid, name, verdict, lookup=decide.Lookup.ABSENT)
        if read.view.ref == ref and not read.view.deleting:
            return decide.CreateResult(lid, name, verdict, uid=read.view.uid, lookup=decide.Lookup.OURS)
        held = f"pod {name} uid {read.view.uid} names attempt {read.view.ref}"
        if read.view.ref == ref:  # ours, being deleted (a kill of an earlier create): it will not run the task
            return decide.CreateResult(lid, name, verdict, lookup=decide.Lookup.FAILED, detail=held + ", deleting")
        return decide.CreateResult(lid, name, verdict, lookup=decide.Lookup.OTHER, detail=held)

    def _read(self, name: str) -> _Read:
        """Pool: GET pod ``name`` (raw JSON → :func:`.status.pod_view`); ``view`` None for 404."""
        try:
            resp = self._core.read_namespaced_pod(name, self.kube.namespace, _preload_content=False,
                                                  _request_timeout=REQUEST_TIMEOUT_SECONDS)
            obj = json.loads(resp.data)
        except Exception as exc:  # noqa: BLE001 - sorted here
            if getattr(exc, "status", None) == 404:
                return _Read(name, self._monotonic(), None)
            return _Read(name, self._monotonic(), None, error=_short(exc))
        return _Read(name, self._monotonic(), status.pod_view(obj))

    def _delete(self, name: str, uid: str | None, grace: float | None, why: str) -> _Deleted:
        """Pool: delete pod ``name`` with the UID precondition (when ``uid``) and ``grace`` seconds (None: the
        pod's own). 404 (gone) and 409 (that UID is gone: the name holds another pod) count as done."""
        from kubernetes import client

        body = client.V1DeleteOptions(
            grace_period_seconds=None if grace is None else max(0, int(grace)),
            preconditions=client.V1Preconditions(uid=uid) if uid else None)
        try:
            self._core.delete_namespaced_pod(name, self.kube.namespace, body=body,
                                             _request_timeout=REQUEST_TIMEOUT_SECONDS)
        except Exception as exc:  # noqa: BLE001 - sorted here
            if getattr(exc, "status", None) not in (404, 409):
                return _Deleted(name, uid, why, error=_short(exc))
        return _Deleted(name, uid, why)

    def _request_delete(self, name: str, uid: str | None, grace: float | None, why: str) -> None:
        """Submit a delete unless one with the same or a shorter grace is on its way."""
        key = (name, uid)
        if key in self._deleting:
            earlier = self._deleting[key]  # None: the pod's own grace, the longest
            if grace is None or (earlier is not None and earlier <= grace):
                return
        self._deleting[key] = grace
        if not self._submit(self._delete, name, uid, grace, why):
            self._deleting.pop(key, None)

    def _release_job(self, name: str, uid: str, index: int, ref: AttemptRef | None = None,
                     target: SalvageTarget | None = None) -> _Released:
        """Pool: keep the pod's log where Airflow's log view reads it when ``target`` says where
        (:func:`.logsalvage.salvage_pod_log`; a failure is logged, never holds the pod), then take leoflow's
        finalizer off pod ``name`` uid ``uid`` (:func:`.finalizer.release_finalizer`)."""
        if target is not None and ref is not None:
            self._salvage(name, uid, ref, target)
        return _Released(release_finalizer(self._core, self.kube.namespace, name, uid, index=index,
                                           timeout=REQUEST_TIMEOUT_SECONDS))

    def _salvage(self, name: str, uid: str, ref: AttemptRef, target: SalvageTarget) -> None:
        """Pool: :func:`.logsalvage.salvage_pod_log` of one ended task pod, with Airflow's ``[logging]`` settings
        and ``REMOTE_TASK_LOG`` as this scheduler has them (only asked with remote logging on:
        :meth:`_salvage_target`); logs the outcome, never raises."""
        try:
            from airflow.configuration import conf
            from airflow.logging_config import get_remote_task_log

            remote = get_remote_task_log()
            done = salvage_pod_log(self._core, self.kube.namespace, name, uid, ref, target,
                                   base_log_folder=conf.get("logging", "base_log_folder"), remote=remote,
                                   now=datetime.now(timezone.utc), timeout=REQUEST_TIMEOUT_SECONDS)
        except Exception as exc:  # noqa: BLE001 - a log that cannot be kept never holds the pod
            log.warning("leoflow: the log of pod %s (attempt %s) was not kept: %s", name, ref, _short(exc))
            return
        if done.place is None:
            log.debug("leoflow: the log of pod %s (attempt %s) left as it is: %s", name, ref, done.why)
        else:
            log.info("leoflow: the log of pod %s (attempt %s) %s at %s", name, ref, done.why, target.log_path)

    def _salvage_target(self, view: PodView) -> SalvageTarget | None:
        """Where ``view``'s log goes when its finalizer is released (``[leoflow] pod_log_salvage`` with ``[logging]
        remote_logging`` on, a task pod whose attempt's ledger row names a ``log_path``); None: not kept. A DB read,
        on the scheduler loop."""
        if not (self.kube.pod_log_salvage and self._remote_logging) or view.ref is None or self._workload_of is None:
            return None
        try:
            return salvage_target(self._workload_of(view.ref.ti_id, view.ref.attempt_epoch))
        except Exception as exc:  # noqa: BLE001 - the ledger is unreachable: the pod is released all the same
            log.warning("leoflow: the workload of pod %s could not be read to keep its log: %s", view.name,
                        _short(exc))
            return None

    def _request_release(self, view: PodView) -> bool:
        """Submit the release of ``view``'s finalizer unless one is on its way or done already; True if submitted."""
        key = (view.name, view.uid)
        index = decide.finalizer_index(view.finalizers)
        if index is None or key in self._releasing or key in self._released:
            return False
        if not self._submit(self._release_job, view.name, view.uid, index, view.ref, self._salvage_target(view)):
            return False
        self._releasing.add(key)
        return True

    def _request_read(self, name: str) -> None:
        if name not in self._reading and self._submit(self._read, name):
            self._reading.add(name)

    # --- launching --------------------------------------------------------------------------------------
    def admit(self) -> DispatchResult | None:
        """None when a pod create may be submitted now; else DEFERRED (not started or stopped, the start-up
        check not passed, the pod cache not synced, ``[leoflow] launch_queue_size`` creates in flight, a 5xx or
        transport back-off open) or BACKPRESSURE (a 429 / quota back-off open, ``Retry-After`` honoured)."""
        if not self._started or self._stopped:
            return DispatchResult(Disposition.DEFERRED, "the Kubernetes runtime is not running")
        self._take_check()
        if not self._checked:
            return DispatchResult(Disposition.DEFERRED, self._problem or "checking the Kubernetes namespace")
        if self.informer is None or not self.informer.synced:
            error = getattr(self.informer, "last_error", None)
            return DispatchResult(Disposition.DEFERRED, "the pod cache has not synced" + (f": {error}" if error else ""))
        if self._launches.creating >= self.settings.launch_queue_size:
            return DispatchResult(Disposition.DEFERRED, "[leoflow] launch_queue_size pod creates are in flight")
        return self._window.admit(self._monotonic())

    def record_path(self, ti_id: str, attempt_epoch: int) -> None:
        """None: a pod's outcome record is its termination message, read from the pod's status."""
        return None

    def launch(self, spec: LaunchSpec) -> DispatchResult:
        """Build the attempt's pod and submit its create (module docstring); REFUSED at once for a pod that
        cannot be built (the reason names the field); DEFERRED when the runtime cannot take it now."""
        ti = spec.workload.ti
        if self.warm is not None and spec.fault is None:
            placed = self._launch_warm(spec)
            if placed is not None:
                return placed
        attempt = PodAttempt(spec.ref.ti_id, spec.ref.try_number, spec.ref.attempt_epoch, ti.dag_id, ti.task_id,
                             ti.run_id, ti.map_index)
        try:
            pod = build_pod(attempt, self.kube, template=self._template,
                            executor_config=getattr(ti, "executor_config", None), mutation_hook=self._hook,
                            plugin_hook=_plugin_hook(), forward_env=self._forward_env)
        except PodRefused as exc:
            return DispatchResult(Disposition.REFUSED, str(exc))
        if spec.fault is not None:  # TEST ONLY: set by [leoflow] test_fault_injection, never in production
            from kubernetes.client import V1EnvVar

            from leoflow_agent.podmain import ENV_TEST_FAULT

            agent = pod.spec.containers[0]
            agent.env = [*(agent.env or []), V1EnvVar(name=ENV_TEST_FAULT, value=spec.fault)]
        if (wait := self.admit()) is not None:
            return wait
        name = pod.metadata.name
        self._launches[spec.launch_id] = _Launch(spec.ref, name, creating=True)
        if not self._submit(self._create, spec.launch_id, name, spec.ref, pod):
            del self._launches[spec.launch_id]
            return DispatchResult(Disposition.DEFERRED, "the Kubernetes runtime is stopping")
        return DispatchResult(Disposition.DISPATCHED)

    def _launch_warm(self, spec: LaunchSpec) -> DispatchResult | None:
        """Place ``spec`` on an idle warm worker (module docstring): DISPATCHED with a ``Started`` queued for
        :meth:`poll` and the deadline PATCH submitted; None when it goes cold (its ``executor_config`` asks for
        something, no idle Running worker of its version, every assignment lost its race, the ledger failed)."""
        assert self.warm is not None
        ti = spec.workload.ti
        version = getattr(ti, "dag_version_id", None)
        if version is None or self.warm_informer is None or not self.warm_informer.synced or self._stopped:
            return None
        if (why := warmdecide.cold_reason(getattr(ti, "executor_config", None))) is not None:
            log.debug("attempt %s goes to a cold pod: %s", spec.ref, why)
            metrics.incr("leoflow.warm.kubernetes.miss")
            return None
        rows, _ = self.warm.read_rows()
        try:
            placed = self._place_warm(spec, str(version), rows)
            if placed is None and any(r.dag_version_id == str(version) for r in rows):
                # the version has a pool but the last tick's rows (up to WARM_TICK_SECONDS old) gave no worker: one
                # that finished an attempt since is idle now; one fresh read of the rows before going cold
                placed = self._place_warm(spec, str(version), self._warm_ledger.workers(self.kube.namespace))
        except Exception as exc:  # noqa: BLE001 - the ledger failed: cold
            log.warning("attempt %s: warm assignment failed (%s): a cold pod", spec.ref, _short(exc))
            placed = None
        if placed is not None:
            return placed
        metrics.incr("leoflow.warm.kubernetes.miss")
        return None

    def _place_warm(self, spec: LaunchSpec, version: str, rows: Sequence[Any]) -> DispatchResult | None:
        """Assign ``spec`` to one of the idle workers of ``version`` in ``rows`` whose pod is Running in the warm
        informer (at most three tries of the guarded :meth:`WarmLedger.assign`): DISPATCHED, or None. A row read
        before another launch took its worker loses its guard (``row_version``) and the next one is tried; a
        worker whose earlier attempt this runtime has not closed yet may take a new one once its row is idle
        again (that attempt is then GONE by its row, which holds another)."""
        mine = [r for r in rows if r.state == warmdecide.IDLE and r.dag_version_id == version]
        views = {r.pod_name: v for r in mine if (v := self.warm_informer.get(r.pod_name)) is not None}
        for row in warmdecide.candidates(mine, views, version)[:3]:
            won = self._warm_ledger.assign(row.pod_uid, spec.ref, row_version=row.row_version)
            if not won:
                continue
            self._warm_launches[spec.launch_id] = _WarmLaunch(spec.ref, row.pod_name, row.pod_uid,
                                                              assigned_at=self._monotonic())
            self._results.put(Started(spec.launch_id, {"pod_name": row.pod_name, "pod_uid": row.pod_uid}))
            self._submit(self._deadline_job, row.pod_name, row.pod_uid)
            log.info("attempt %s: assigned to warm pod %s", spec.ref, row.pod_name)
            metrics.incr("leoflow.warm.kubernetes.hit")
            return DispatchResult(Disposition.DISPATCHED)
        return None

    def _deadline_job(self, name: str, uid: str) -> None:
        """Pool: lower warm pod ``name``'s ``activeDeadlineSeconds`` to its age + the credential ceiling
        (:func:`.warmdecide.lowered_deadline`; never raised), by a UID- and value-tested JSON patch."""
        from leoflow_airflow.runtime.kubernetes.finalizer import JSON_PATCH

        ceiling = self.kube.credential_ceiling_seconds
        if ceiling <= 0:
            return
        try:
            resp = self._core.read_namespaced_pod(name, self.kube.namespace, _preload_content=False,
                                                  _request_timeout=REQUEST_TIMEOUT_SECONDS)
            obj = json.loads(resp.data)
            if (obj.get("metadata") or {}).get("uid") != uid:
                return
            current = (obj.get("spec") or {}).get("activeDeadlineSeconds")
            view = status.pod_view(obj)
            start = view.started_at if view is not None else None
            age = (datetime.now(timezone.utc) - start).total_seconds() if start is not None else 0.0
            seconds = warmdecide.lowered_deadline(current, age, ceiling)
            if seconds is None:
                return
            self._core.patch_namespaced_pod(name, self.kube.namespace,
                                            warmdecide.deadline_patch(uid, current, seconds),
                                            _request_timeout=REQUEST_TIMEOUT_SECONDS, _content_type=JSON_PATCH)
        except Exception as exc:  # noqa: BLE001 - logged: the create deadline still bounds the pod
            log.warning("warm pod %s: could not lower its activeDeadlineSeconds: %s", name, _short(exc))

    def launch_callback(self, launch_id: str, workload: Any) -> DispatchResult:
        """Run a callback workload as a local child (module docstring); DISPATCHED, or DEFERRED when it could
        not be started (logged)."""
        from leoflow_airflow.runtime.environment import agent_environment

        env = agent_environment(dict(os.environ if self._environ is None else self._environ),
                                self.settings.agent_env_passthrough, self.settings.agent_env_deny)
        try:
            with tempfile.TemporaryFile() as fh:  # 0600 and unlinked: the token in it is never on a path
                fh.write(workload.model_dump_json().encode())
                fh.seek(0)
                proc = subprocess.Popen(
                    [sys.executable, "-m", "leoflow_airflow.runtime.kubernetes.callback", "--server", self._server()],
                    stdin=fh, env=env, start_new_session=True)
        except OSError as exc:
            log.warning("callback %s: could not start its process (%s); re-offered", launch_id, exc)
            return DispatchResult(Disposition.DEFERRED, f"could not start the callback process: {exc}")
        self._callbacks[launch_id] = proc
        return DispatchResult(Disposition.DISPATCHED)

    # --- facts ------------------------------------------------------------------------------------------
    def poll(self) -> list[RuntimeEvent]:
        """The pool's answers as events (``Started``/``LaunchFailed`` of creates), then ``Exited`` for every
        launch whose pod turned terminal in the cache or was confirmed gone, ``CallbackDone`` of finished
        callback children; and the upkeep: repeat a failed start-up check and deletes that got no answer.
        Never blocks."""
        events = self._drain()
        self._take_check()
        self._retry_deletes()
        if self._started and not self._stopped and not self._checked and not self._checking \
                and self._monotonic() >= self._next_check:
            self._start_check()
        self._absorb()
        now = self._monotonic()
        for lid, launch in self._to_poll():
            launch.polled = True
            # poll() knows no heartbeat: it takes only the kubelet's word of an end (the agent container
            # terminated) and a deleted pod never bound; what the pod object alone says (PodGC's Failed, a pod gone,
            # the valve) waits for observe(), which judges it against the task's heartbeat (k8s review §14)
            presence, view = self._presence(launch.name, launch.uid, launch.ref, now, heartbeat_age=POLL_NO_PROOF)
            if presence is Presence.GONE:
                launch.exited = True
                code = view.agent.exit_code if view is not None and view.agent is not None else None
                log.info("attempt %s: pod %s ended: %s", launch.ref, launch.name,
                         status.describe_end(view) if view is not None else "it is gone")
                events.append(Exited(lid, code))
            elif view is not None and view.waiting_reason in STUCK_REASONS and not launch.warned:
                launch.warned = True
                log.error("attempt %s: pod %s cannot start its agent container: %s: %s (fix the image or "
                          "[leoflow] image / the pod template; unless it passes, the task instance fails with it)",
                          launch.ref, launch.name, view.waiting_reason, view.waiting_message or "")
        if self.warm is not None and not self._warm_busy and not self._stopped and now >= self._next_warm_tick:
            self._next_warm_tick = now + WARM_TICK_SECONDS
            self._warm_busy = True
            if not self._submit(self._warm_tick_job):
                self._warm_busy = False
        for lid, w in list(self._warm_launches.items()):
            if not w.exited and w.assigned_at is not None and \
                    self._warm_presence(w.name, w.uid, w.ref, heartbeat_age=POLL_NO_PROOF) is Presence.GONE:
                w.exited = True
                events.append(Exited(lid, None))
        for lid, proc in list(self._callbacks.items()):
            code = proc.poll()
            if code is not None:
                del self._callbacks[lid]
                events.append(CallbackDone(lid, code == 0))
        return events

    def _to_poll(self) -> list[tuple[str, _Launch]]:
        """The launches :meth:`poll` looks at now (each with a pod UID, not exited, no create in flight): those
        whose pod an informer event touched since the last poll (all of them after a LIST), those whose
        presence hangs on something no event announces (a confirming read asked or answered, a deleted pod's
        confirmation valve, a UID learnt since the last poll), and, as a safety net, the next
        :data:`POLL_TURN_SHARE` of ``[leoflow] reap_page_size`` of the rest in turn (at least one), so every
        launch is looked at within ``ceil(launches / turn)`` polls whatever the informer said. The net is thin
        because it is a second one: the lifecycle observes a ``reap_page_size`` keyset page of the LIVE rows
        every ``sync()`` from the same cache and settles the ended ones it finds. The cost of a poll follows
        what changed, not how many pods run (issue 10, "Benchmark")."""
        changed = self.informer.take_changed() if self.informer is not None and self.informer.synced else None
        return self._launches.to_poll(changed, itertools.chain(self._reading, self._reads), self._stop_due,
                                      max(1, int(self.settings.reap_page_size * POLL_TURN_SHARE)))

    def _drain(self) -> list[RuntimeEvent]:
        self._absorb()
        events: list[RuntimeEvent] = []
        while True:
            try:
                item = self._results.get_nowait()
            except queue.Empty:
                return events
            if isinstance(item, decide.CreateResult):
                events.extend(self._created(item))
            elif isinstance(item, Started):  # a warm assignment (launch())
                events.append(item)
            else:  # ("error", args, exc): a bug in a job; a create's launch must not wait forever
                for launch_id_ in [a for a in item[1] if isinstance(a, str) and a in self._launches]:
                    if self._launches[launch_id_].creating:
                        result = decide.CreateResult(launch_id_, self._launches[launch_id_].name,
                                                     Verdict(VerdictKind.DEFERRED, _short(item[2])),
                                                     lookup=decide.Lookup.FAILED, detail="internal error")
                        events.extend(self._created(result))

    def _absorb(self) -> None:
        """Scheduler thread: take the answers of confirming reads and deletes (any scheduler-side method may).
        Cheap when there are none (``_presence`` calls it per attempt): no exception is raised to find out."""
        while not self._facts.empty():  # this thread is the only consumer: not empty means a get succeeds
            try:
                item = self._facts.get_nowait()
            except queue.Empty:
                return
            if isinstance(item, _Read):
                self._reading.discard(item.name)
                if not item.error:
                    self._reads[item.name] = item
            elif isinstance(item, _Released):
                rel = item.release
                key = (rel.name, rel.uid or "")
                self._releasing.discard(key)
                if rel.done:
                    self._released.add(key)
                    what = "released" if rel.outcome is ReleaseOutcome.RELEASED else f"needed no release ({rel.outcome})"
                    log.info("pod %s uid %s: leoflow's finalizer %s", rel.name, rel.uid, what)
                else:
                    log.warning("could not release leoflow's finalizer of pod %s uid %s: %s %s; trying again at "
                                "the next pass", rel.name, rel.uid, rel.outcome, rel.detail)
            else:
                grace = self._deleting.pop((item.name, item.uid), None)
                if item.error:
                    log.warning("could not delete pod %s uid %s (%s): %s; trying again in %.0f s", item.name,
                                item.uid, item.why, item.error, DELETE_RETRY_SECONDS)
                    self._delete_again[(item.name, item.uid)] = (self._monotonic() + DELETE_RETRY_SECONDS, grace,
                                                                 item.why)

    def _retry_deletes(self) -> None:
        """Submit again the deletes that got no answer once :data:`DELETE_RETRY_SECONDS` passed (a kill must not
        be lost to one failed request; the UID precondition keeps a late one harmless)."""
        now = self._monotonic()
        for key, (due, grace, why) in list(self._delete_again.items()):
            if now >= due:
                del self._delete_again[key]
                self._request_delete(key[0], key[1], grace, why)

    def _created(self, result: decide.CreateResult) -> list[RuntimeEvent]:
        self._window.note(result.verdict, self._monotonic())
        event = decide.create_event(result)
        launch = self._launches.get(result.launch_id)
        if launch is None:
            return [event]
        if isinstance(event, Started):
            self._launches.created(result.launch_id, result.uid)
            if launch.cancelled:  # killed while its create was in flight: it must not run
                self._request_delete(launch.name, launch.uid, 0, "killed while its create was in flight")
        else:
            self._launches.create_failed(result.launch_id)
        return [event]

    def _started_checked(self, check: _StartCheck) -> None:
        self._checking = False
        if not check.problem:
            self._checked = True
            for note in check.notes:
                log.info("leoflow Kubernetes runtime: %s", note)
            log.info("leoflow Kubernetes runtime: namespace %s reachable%s; dispatching pods", self.kube.namespace,
                     ", ServiceAccount " + self.kube.service_account + " present" if not check.notes else "")
            self._problem = ""
            return
        if check.problem != self._problem:
            log.error("leoflow cannot start task pods: %s. Task instances stay queued (nothing is lost) and the "
                      "check is repeated every %.0f s", check.problem, START_RETRY_SECONDS)
        self._problem = check.problem
        self._next_check = self._monotonic() + START_RETRY_SECONDS

    # --- presence, evidence, kill ----------------------------------------------------------------------
    def _presence(self, name: str, uid: str | None, ref: AttemptRef, now: float | None = None,
                  heartbeat_age: float | None = None) -> tuple[Presence, PodView | None]:
        """The presence of ``ref``'s pod ``name`` (``uid`` when recorded) and the freshest view of it; asks the
        pool for a confirming read when the cache does not hold it (module docstring).

        :param now: ``monotonic()`` seconds of a pass over many attempts whose caller took the pool's answers
            (:meth:`_absorb`) once before it; None (one attempt): both are done here. A scheduler loop looks up
            a page of attempts at a time, and one answer more or less within the pass changes nothing that the
            next pass does not see (issue 10, "Benchmark": the per-attempt cost of a sweep).
        :param heartbeat_age: seconds since the attempt's TI last heartbeat (None: unknown); while it is at most
            ``[leoflow] agent_lost_threshold`` no pod object alone makes the attempt GONE (k8s review §14)."""
        if self.informer is None or not self.informer.synced:
            return Presence.UNKNOWN, None
        if now is None:
            self._absorb()
            now = self._monotonic()
        presence, view, need_read = decide.presence(
            self.informer.get(name), self._reads.get(name), uid=uid, ref=ref, now=now,
            read_reuse=READ_REUSE_SECONDS, heartbeat_age=heartbeat_age, silent_after=self.settings.agent_lost_threshold)
        if need_read:
            self._request_read(name)
        if presence is Presence.LIVE and view is not None and self._valve_opened(view, now, heartbeat_age):
            presence = Presence.GONE
        if view is None and uid is not None:
            view = self.informer.tombstone(name, uid)
        return presence, view

    def _valve_opened(self, view: PodView, now: float, heartbeat_age: float | None = None) -> bool:
        """The confirmation valve (issue 10 item 3, :func:`.decide.valve_open`): whether the live ``view`` is of
        a pod deleted ``[leoflow] pod_termination_valve`` seconds past its grace period that never reported its
        end, and whose task instance's heartbeat (``heartbeat_age`` seconds old, None: unknown) is silent past
        ``[leoflow] agent_lost_threshold`` (k8s review §14: a fresh heartbeat keeps it shut, even after it opened
        once). Notes when each deleted pod should have stopped; a pod whose valve opened is remembered, so its
        :meth:`evidence` names why it counts as ended."""
        silent_after = self.settings.agent_lost_threshold
        due = decide.deletion_deadline(view, seen=now, earlier=self._stop_due.get(view.uid))
        if due is not None:
            self._stop_due[view.uid] = due
        if not decide.heartbeat_silent(heartbeat_age, silent_after=silent_after):
            if view.uid not in self._held and decide.valve_open(due, now=now, valve=self.kube.pod_termination_valve):
                self._held.add(view.uid)
                log.warning("pod %s (uid %s) on %s reported no end %.0f s past its deletion grace period, but its "
                            "attempt %s heartbeated %.0f s ago: it still runs, so it is not re-run until its "
                            "heartbeat is silent for [leoflow] agent_lost_threshold (%g s)", view.name, view.uid,
                            view.node_name or "no node", now - (due or now), view.ref, heartbeat_age or 0.0,
                            silent_after)
            return False
        if view.uid in self._unconfirmed:
            return True
        if not decide.valve_open(due, now=now, valve=self.kube.pod_termination_valve, heartbeat_age=heartbeat_age,
                                 silent_after=silent_after):
            return False
        assert due is not None
        self._unconfirmed[view.uid] = now - due
        log.warning("pod %s (uid %s) on %s reported no end %.0f s past its deletion grace period: its attempt %s "
                    "counts as ended with no record ([leoflow] pod_termination_valve %g s)", view.name, view.uid,
                    view.node_name or "no node", now - due, view.ref, self.kube.pod_termination_valve)
        return True

    def _where(self, attempt: Attempt) -> tuple[str, str | None, _Launch | None]:
        """The attempt's pod name, its UID when known (ledger, else our launch), and our launch of it."""
        launch = self._launches.get(launch_id(attempt.ref))
        name = attempt.pod_name or (launch.name if launch is not None else attempt_pod_name(attempt))
        uid = attempt.pod_uid or (launch.uid if launch is not None else None)
        return name, uid, launch

    def observe(self, attempts: Sequence[Attempt],
                heartbeats: Mapping[AttemptRef, float | None] | None = None) -> Mapping[AttemptRef, Presence]:
        """LIVE / GONE / UNKNOWN per attempt from the cache (module docstring); a create in flight is UNKNOWN.
        ``heartbeats``: seconds since each attempt's TI last heartbeat (None or absent: unknown); an attempt
        whose heartbeat is fresh is never GONE on its pod object's word alone (k8s review §14)."""
        out: dict[AttemptRef, Presence] = {}
        beats = heartbeats or {}
        self._absorb()
        now = self._monotonic()
        for attempt in attempts:
            age = beats.get(attempt.ref)
            if (w := self._warm_of(attempt)) is not None:
                out[attempt.ref] = self._warm_presence(w.name, w.uid, attempt.ref, now, age)
                continue
            name, uid, launch = self._where(attempt)
            if launch is not None and launch.creating:
                out[attempt.ref] = Presence.UNKNOWN
                continue
            out[attempt.ref] = self._presence(name, uid, attempt.ref, now, age)[0]
        return out

    # --- warm attempts ---------------------------------------------------------------------------------
    def _warm_of(self, attempt: Attempt) -> _WarmLaunch | None:
        """The warm attempt ``attempt`` is (this runtime's placement, or a ledger row naming a warm pod: adopted),
        or None for a cold one. With warm pods off, a warm attempt is watched as a cold one (its pod's end)."""
        w = self._warm_launches.get(launch_id(attempt.ref))
        if w is not None:
            return w
        if self.warm is None or not warmpods.is_warm_name(attempt.pod_name) or not attempt.pod_uid:
            return None
        return _WarmLaunch(attempt.ref, attempt.pod_name or "", attempt.pod_uid)

    def _warm_row(self, uid: str, w: _WarmLaunch) -> tuple[Any, bool]:
        """The last tick's ledger row of pod ``uid`` and whether that read started after ``w``'s assignment."""
        assert self.warm is not None
        row, read_at = self.warm.row(uid)
        return row, w.assigned_at is None or read_at >= w.assigned_at

    def _warm_view(self, name: str, uid: str, now: float) -> tuple[PodView | None, bool]:
        """The freshest view of warm pod ``name`` with ``uid`` (the warm cache, its tombstone, the last confirming
        read) and whether a confirming read found it gone (404, or another UID under the name). Asks for a read
        when the cache does not hold it."""
        assert self.warm_informer is not None
        view = self.warm_informer.get(name)
        if view is not None and view.uid == uid:
            return view, False
        read = self._reads.get(name)
        if read is None or now - read.at >= READ_REUSE_SECONDS:
            self._request_read(name)
        tomb = self.warm_informer.tombstone(name, uid)
        if read is not None and read.view is not None and read.view.uid == uid:
            return read.view, False
        return tomb, read is not None

    def _warm_presence(self, name: str, uid: str, ref: AttemptRef, now: float | None = None,
                       heartbeat_age: float | None = None) -> Presence:
        """The presence of warm attempt ``ref`` on pod ``name``/``uid`` (:func:`.warmdecide.warm_presence`), and
        GONE once its deleted pod went ``[leoflow] pod_termination_valve`` seconds past its grace period without
        an end (the confirmation valve, as for a cold pod: :meth:`_valve_opened`; k8s review §6). While the TI's
        heartbeat is fresh (``heartbeat_age`` at most ``[leoflow] agent_lost_threshold``) and the ledger row still
        holds ``ref``, the pod object alone (terminal with no end of its agent container, or gone) is no proof:
        LIVE (k8s review §14)."""
        if self.warm is None or self.warm_informer is None or not self.warm_informer.synced:
            return Presence.UNKNOWN
        w = self._warm_launches.get(launch_id(ref)) or _WarmLaunch(ref, name, uid)
        if w.revoked:
            return Presence.GONE
        if now is None:
            self._absorb()
            now = self._monotonic()
        row, fresh = self._warm_row(uid, w)
        view, gone = self._warm_view(name, uid, now)
        if gone and view is not None and not view.terminal:
            view = None  # a tombstone's last view says nothing of a pod a live read found gone
        presence = warmdecide.warm_presence(row, view, ref, row_fresh=fresh, pod_confirmed_gone=gone)
        held = row is not None and row.ref == ref and row.state in (warmdecide.ASSIGNED, warmdecide.BUSY,
                                                                      warmdecide.KILLING)
        if presence is Presence.GONE and held and (view is None or view.agent is None) and \
                not decide.heartbeat_silent(heartbeat_age, silent_after=self.settings.agent_lost_threshold):
            return Presence.LIVE  # only the pod object says it ended; its body still heartbeats (k8s review §14)
        if presence is Presence.LIVE and view is not None and self._valve_opened(view, now, heartbeat_age):
            return Presence.GONE  # deleted, and no kubelet reported its end in time (k8s review §6)
        return presence

    def _warm_unconfirmed(self, view: PodView | None, now: float) -> EndCause | None:
        """The infra loss of a warm pod whose confirmation valve opened (:func:`.status.unconfirmed_cause`), or
        None (no view, terminal, or its valve is closed). k8s review §6."""
        if view is None or view.terminal or not self._valve_opened(view, now):
            return None
        return status.unconfirmed_cause(view, waited=self._unconfirmed[view.uid],
                                        valve=self.kube.pod_termination_valve)

    def start_progress(self, attempts: Sequence[Attempt]) -> Mapping[AttemptRef, StartProgress]:
        """How far each attempt's pod got toward running its agent (:func:`.decide.start_progress` of the view
        its presence is decided from, with ``[leoflow] pod_unschedulable_timeout``); an attempt with no view of
        its pod, or a terminal one, is left out. Remembers when each pod was first seen at its start step (the
        waiting reasons carry no time): a pod's entry is renewed when it is asked again and kept meanwhile (the
        lifecycle asks one keyset page per ``sync()``), dropped once its attempt is forgotten."""
        now = datetime.now(timezone.utc)
        out: dict[AttemptRef, StartProgress] = {}
        seen: dict[str, tuple[str, datetime]] = {}
        asked: set[str] = set()
        self._absorb()
        tick = self._monotonic()
        for attempt in attempts:
            if (w := self._warm_of(attempt)) is not None:
                if (progress := self._warm_progress(w, now)) is not None:
                    out[attempt.ref] = progress
                continue
            name, uid, _ = self._where(attempt)
            presence, view = self._presence(name, uid, attempt.ref, tick)
            if view is not None:
                asked.add(view.uid)
            if presence is not Presence.LIVE or view is None:
                continue
            key = decide.start_key(view)
            earlier = self._start_seen.get(view.uid)
            first = earlier[1] if earlier is not None and earlier[0] == key else now
            seen[view.uid] = (key, first)
            out[attempt.ref] = decide.start_progress(
                view, first_seen=first, unschedulable_timeout=self.kube.pod_unschedulable_timeout)
        # this call's pods replace their entries; the others' are kept (the lifecycle asks one keyset page of
        # attempts per sync(), so a pod is asked again only a sweep later) until their attempt is forgotten
        self._start_seen = {k: v for k, v in self._start_seen.items() if k not in asked} | seen
        return out

    def _warm_progress(self, w: _WarmLaunch, now: datetime) -> StartProgress | None:
        """A warm attempt's start progress (:func:`.warmdecide.warm_start_progress`); an assignment not taken in
        time is taken back here (``WarmLedger.unassign``, guarded): it then reads GONE with no record."""
        if w.revoked:
            return None
        row, fresh = self._warm_row(w.uid, w)
        if not fresh:
            return StartProgress(StartState.STARTING, since=now)
        progress, unassign = warmdecide.warm_start_progress(row, w.ref, now)
        if unassign:
            try:
                taken_back = self._warm_ledger.unassign(w.uid, w.ref)
            except Exception as exc:  # noqa: BLE001 - next time
                log.warning("attempt %s: could not take back its warm assignment: %s", w.ref, _short(exc))
                return StartProgress(StartState.STARTING, since=now)
            if taken_back:
                w.revoked = True
                self._warm_launches.setdefault(launch_id(w.ref), w)
                log.warning("attempt %s: warm pod %s did not take it within %.0f s; taken back and re-dispatched",
                            w.ref, w.name, warmdecide.ASSIGN_TIMEOUT_SECONDS)
        return progress

    def locate(self, attempt: Attempt) -> RuntimeFacts | None:
        """The pod of an attempt with no recorded pod, from the cache: its deterministic name, holding this
        attempt's identity annotation → ``{pod_name, pod_uid}``; else None."""
        if self.informer is None:
            return None
        name = attempt_pod_name(attempt)
        view = self.informer.get(name)
        if view is None or view.ref != attempt.ref:
            return None
        return {"pod_name": view.name, "pod_uid": view.uid}

    def evidence(self, attempt: Attempt) -> Evidence:
        """The record in the pod's termination message (the cached view, its tombstone, or the last confirming
        read), decoded against the attempt's identity (:func:`.status.pod_evidence`); ``Evidence.unknown()`` while
        the cache has not synced, for at most :data:`EVIDENCE_SYNC_WAIT_SECONDS` after :meth:`start` (k8s review
        §2); never raises."""
        self._absorb()
        if (w := self._warm_of(attempt)) is not None:
            return self._warm_evidence(w)
        if self._cache_pending(self.informer):
            return Evidence.unknown()
        name, uid, _ = self._where(attempt)
        view = None
        if self.informer is not None:
            cached = self.informer.get(name)
            if cached is not None and (cached.uid == uid if uid else cached.ref == attempt.ref):
                view = cached
            elif uid is not None:
                view = self.informer.tombstone(name, uid)
        read = self._reads.get(name)
        if view is None and read is not None and read.view is not None and \
                (read.view.uid == uid if uid else read.view.ref == attempt.ref):
            view = read.view
        try:
            evidence = status.pod_evidence(view, attempt.ref)
            if view is not None and view.uid in self._unconfirmed and not view.terminal and evidence.record is None:
                cause = status.unconfirmed_cause(view, waited=self._unconfirmed[view.uid],
                                                 valve=self.kube.pod_termination_valve)
                return Evidence(None, evidence.exit_code, cause)
            return evidence
        except Exception:  # noqa: BLE001 - evidence never raises: no usable record
            log.exception("reading the evidence of %s failed", attempt.ref)
            return Evidence(None, None)

    def _cache_pending(self, informer: PodInformer | None) -> bool:
        """Whether evidence read from ``informer`` would be a guess: it has not synced yet and
        :data:`EVIDENCE_SYNC_WAIT_SECONDS` have not passed since :meth:`start` (k8s review §2). Past the bound the
        cache's answer is taken, and that is said once."""
        if (informer is not None and informer.synced) or self._started_at is None:
            return False
        if self._monotonic() - self._started_at < EVIDENCE_SYNC_WAIT_SECONDS:
            return True
        if not self._said_unsynced:
            self._said_unsynced = True
            log.error("the pod cache has not synced %.0f s after start (%s): evidence of ended attempts is read "
                      "from what it holds", EVIDENCE_SYNC_WAIT_SECONDS,
                      getattr(informer, "last_error", None) or "no error reported")
        return False

    def _warm_evidence(self, w: _WarmLaunch) -> Evidence:
        """A warm attempt's evidence (:func:`.warmdecide.warm_evidence`): the in-band record from the ledger, then
        the pod's termination message when it is this attempt's, then the pod's end. Never raises."""
        try:
            text = self._warm_ledger.outcomes([w.ref]).get(w.ref)
        except Exception as exc:  # noqa: BLE001 - the pod may still hold the record
            log.warning("attempt %s: could not read its in-band record: %s", w.ref, _short(exc))
            text = None
        if not text and self._cache_pending(self.warm_informer):
            return Evidence.unknown()
        view = None
        now = self._monotonic()
        if self.warm_informer is not None:
            view, _ = self._warm_view(w.name, w.uid, now)
        try:
            return warmdecide.warm_evidence(text, view, w.ref, unconfirmed=self._warm_unconfirmed(view, now))
        except Exception:  # noqa: BLE001 - evidence never raises
            log.exception("reading the evidence of warm attempt %s failed", w.ref)
            return Evidence(None, None)

    def _warm_kill(self, w: _WarmLaunch, grace: float) -> Presence:
        """Kill a warm attempt by guarded ledger writes first, then its pod (k8s review §7). The tick's rows may be
        :data:`WARM_TICK_SECONDS` old, so they only say GONE (a row never holds an attempt again once it let it
        go); the writes read the row as it is now:

        * ``assigned(ref) -> idle`` (``WarmLedger.unassign``) changed it: nothing ran, GONE;
        * ``busy(ref) -> killing(ref)`` (``WarmLedger.mark_killing``) changed it: the pod runs this attempt and
          takes no other, so it is deleted (UID precondition, ``grace``): LIVE until it ends;
        * neither: the row holds no ``ref`` (its child ended and the worker awaited, maybe took a newer attempt):
          GONE, and no delete is sent.

        A ledger that fails: nothing is deleted (LIVE; the lifecycle's kill escalation asks again)."""
        presence = self._warm_presence(w.name, w.uid, w.ref)
        if presence is Presence.GONE:
            return Presence.GONE
        try:
            if self._warm_ledger.unassign(w.uid, w.ref):
                w.revoked = True
                self._warm_launches.setdefault(launch_id(w.ref), w)
                return Presence.GONE
            held = self._warm_ledger.mark_killing(w.uid, w.ref)
        except Exception as exc:  # noqa: BLE001 - no proof the pod runs this attempt: delete nothing
            log.warning("attempt %s: could not mark its warm pod %s killing: %s; the kill is asked again", w.ref,
                        w.name, _short(exc))
            return Presence.LIVE
        if not held:
            w.revoked = True  # the row let it go: GONE from now on, whatever the tick's rows still say
            self._warm_launches.setdefault(launch_id(w.ref), w)
            log.info("attempt %s: its warm pod %s holds it no more; nothing to kill", w.ref, w.name)
            return Presence.GONE
        self._request_delete(w.name, w.uid, grace, f"kill of warm attempt {w.ref}")
        log.info("attempt %s: deleting its warm pod %s uid %s (grace %.0f s)", w.ref, w.name, w.uid, grace)
        return Presence.LIVE

    def kill(self, attempt: Attempt, *, grace: float) -> Presence:
        """Delete the attempt's pod: ``grace_period_seconds=grace`` and a UID precondition, on the pool; never
        waits. GONE when the pod is terminal or confirmed gone, or when nothing of the attempt exists (a create
        still in flight is marked: its pod is deleted the moment the create answers); else LIVE (its end comes
        through :meth:`poll` / :meth:`observe`). A warm attempt: :meth:`_warm_kill`."""
        if (w := self._warm_of(attempt)) is not None:
            return self._warm_kill(w, grace)
        name, uid, launch = self._where(attempt)
        if uid is None:
            if launch is not None and launch.creating:
                launch.cancelled = True
                return Presence.GONE
            view = self.informer.get(name) if self.informer is not None else None
            if view is None or view.ref != attempt.ref:
                self._request_delete(name, None, grace, "kill of an attempt with no pod known")  # a lagging cache
                return Presence.GONE
            uid = view.uid
        presence, _ = self._presence(name, uid, attempt.ref)
        if presence is Presence.GONE:
            return Presence.GONE
        self._request_delete(name, uid, grace, f"kill of attempt {attempt.ref}")
        log.info("attempt %s: deleting pod %s uid %s (grace %.0f s)", attempt.ref, name, uid, grace)
        return Presence.LIVE

    def kill_launch(self, launch_id: str) -> None:
        """Delete a launch's pod at once (grace 0, UID precondition); a create in flight is deleted as soon as
        it answers."""
        launch = self._launches.get(launch_id)
        if launch is None:
            return
        if launch.creating:
            launch.cancelled = True
        elif launch.uid is not None:
            self._request_delete(launch.name, launch.uid, 0, f"launch {launch_id} must not run")

    def forget(self, ref: AttemptRef) -> None:
        """Drop what is remembered of ``ref`` (its launch and the confirming read of its pod); its pod's finalizer
        is released by the next :meth:`collect` once the row is closed and the pod terminal or deleting. A warm
        attempt's pod is left to its pool (it serves the next attempt, or the pool reaps it)."""
        self._warm_launches.pop(launch_id(ref), None)
        launch = self._launches.pop(launch_id(ref), None)
        if launch is not None and not launch.creating:
            self._reads.pop(launch.name, None)
            self._delete_again = {k: v for k, v in self._delete_again.items() if k[0] != launch.name}
            if launch.uid is not None:
                self._release_soon[(launch.name, launch.uid)] = (ref, self._monotonic() + RELEASE_SOON_SECONDS)
                self._stop_due.pop(launch.uid, None)
                self._unconfirmed.pop(launch.uid, None)
                self._held.discard(launch.uid)
                self._start_seen.pop(launch.uid, None)

    def adopt(self, attempt: Attempt) -> None:
        """Watch a predecessor's pod: its end is reported as ``Exited`` like our own (a warm attempt: its row's
        release, or its pod's end)."""
        if (w := self._warm_of(attempt)) is not None:
            self._warm_launches.setdefault(launch_id(attempt.ref), w)
            return
        name, uid, launch = self._where(attempt)
        if launch is None:
            self._launches[launch_id(attempt.ref)] = _Launch(attempt.ref, name, uid)

    # --- housekeeping -----------------------------------------------------------------------------------
    def collect(self, is_closed: Callable[[str, int], bool],
                workload_of: Callable[[str, int], str | None] | None = None) -> int:
        """Release and delete what settled attempts left (module docstring), on the pool; returns the number of
        pods acted on (a pod released and deleted in one pass counts once).

        Every call: the pods of attempts :meth:`forget` named in the last :data:`RELEASE_SOON_SECONDS` lose
        leoflow's finalizer once :func:`.decide.release_due` holds (``is_closed`` of their attempt). Every
        :data:`COLLECT_INTERVAL_SECONDS`, a sweep of the cache: every pod holding the finalizer that is terminal
        or deleting is released when its attempt is closed (or it names none); terminal pods of closed attempts
        are deleted (UID precondition) once ``[leoflow] pod_retention_success`` (Succeeded) or
        ``pod_retention_failure`` (otherwise) seconds passed since they ended (:func:`.decide.retention_due`).

        :param is_closed: ``is_closed(ti_id, attempt_epoch)``: a :class:`~leoflow_airflow.lifecycle.runtime.
            LedgerRow` (``True`` counts as CLOSED; a DB read: asked only of pods that hold the finalizer and are
            terminal or deleting, or whose retention is over). CLOSED and ABSENT settle a pod: the informer lists
            only this installation's pods (``leoflow.io/instance``, k8s review §5), so a pod of an attempt the
            ledger no longer holds is one whose closed row retention removed; OPEN keeps it.
        :param workload_of: ``workload_of(ti_id, attempt_epoch)``: the attempt's ledger ``workload_json`` or None;
            asked once for each pod about to be released, so its log is kept first (``[leoflow]
            pod_log_salvage``, :mod:`.logsalvage`). None: no log is kept.
        """
        self._workload_of = workload_of
        self._absorb()
        if self.informer is None or not self.informer.synced:
            return 0
        acted = self._release_forgotten(is_closed)
        now_m = self._monotonic()
        if now_m < self._next_collect:
            return len(acted)
        self._next_collect = now_m + COLLECT_INTERVAL_SECONDS
        now = datetime.now(timezone.utc)
        seen: set[tuple[str, str]] = set()
        closed: dict[tuple[str, int], bool] = {}

        def settled(ref: AttemptRef | None) -> bool:
            if ref is None:  # names no attempt: nothing can ever read it as evidence
                return True
            at = (ref.ti_id, ref.attempt_epoch)
            if at not in closed:  # only this installation's pods are listed (k8s review §5)
                closed[at] = _settles(is_closed(*at))
            return closed[at]

        informer = self.informer
        for view in informer.ending():  # terminal or deleting: the only pods released or deleted here
            key = (view.name, view.uid)
            if decide.finalizer_index(view.finalizers) is not None:
                asked = key in self._releasing or key in self._released
                if not asked and decide.release_due(
                        finalizers=view.finalizers, terminal=view.terminal, deleting=view.deleting,
                        closed=settled(view.ref)) and self._request_release(view):
                    acted.add(key)
            if not view.terminal or view.ref is None or view.deleting:
                continue
            seen.add(key)
            first = self._terminal_seen.setdefault(key, now)
            if key in self._deleting or not decide.retention_due(
                    phase=view.phase, finished_at=view.finished_at, first_seen_terminal=first, now=now,
                    success_seconds=self.kube.pod_retention_success,
                    failure_seconds=self.kube.pod_retention_failure):
                continue
            if settled(view.ref):
                self._request_delete(view.name, view.uid, None, "settled; its retention is over")
                acted.add(key)
        self._terminal_seen = {k: v for k, v in self._terminal_seen.items() if k in seen}
        # gone from the cache: nothing to confirm, and no memo needed once the cache shows the finalizer gone
        warm = self.warm_informer

        def cached(uid: str) -> bool:  # a warm pod's valve clock lives here too (k8s review §6)
            return informer.has_uid(uid) or (warm is not None and warm.has_uid(uid))

        self._stop_due = {uid: due for uid, due in self._stop_due.items() if cached(uid)}
        self._unconfirmed = {uid: waited for uid, waited in self._unconfirmed.items() if cached(uid)}
        self._held = {uid for uid in self._held if cached(uid)}
        self._released = {key for key in self._released if _holds_finalizer(informer.get(key[0]), key[1])}
        return len(acted)

    def _release_forgotten(self, is_closed: Callable[[str, int], bool]) -> set[tuple[str, str]]:
        """Release the finalizers of pods whose attempts :meth:`forget` named, once their rows are closed and the
        pods terminal or deleting (the prompt path of :meth:`collect`); the keys released."""
        assert self.informer is not None
        acted: set[tuple[str, str]] = set()
        now_m = self._monotonic()
        for key, (ref, until) in list(self._release_soon.items()):
            view = self.informer.get(key[0])
            if view is None or view.uid != key[1] or decide.finalizer_index(view.finalizers) is None \
                    or key in self._released:
                del self._release_soon[key]  # gone, or released: nothing to do
                continue
            if (view.terminal or view.deleting) and decide.release_due(
                    finalizers=view.finalizers, terminal=view.terminal, deleting=view.deleting,
                    closed=_settles(is_closed(ref.ti_id, ref.attempt_epoch))):
                if self._request_release(view):
                    acted.add(key)
                del self._release_soon[key]
            elif now_m >= until:
                del self._release_soon[key]  # still running or still open: the sweep takes it over
        return acted

    def extra_capacity(self, parallelism: int, running_ages: Sequence[float]) -> int:
        """0: no queue-ahead; a pod starts in the API server's time, not the scheduler's."""
        return 0

    def slot_freed(self, held_for: float) -> None:
        """Nothing to learn from it here."""


def _airflow_jobs_alive(job_ids: set[str]) -> set[str]:
    """The ids among ``job_ids`` (text; non-numeric ones are not Airflow jobs: dead) whose Airflow ``Job`` row is
    alive (``Job.is_alive``: state running and a recent heartbeat)."""
    from sqlalchemy import select

    from airflow.jobs.job import Job
    from airflow.utils.session import create_session

    numeric = sorted({int(j) for j in job_ids if j.isdigit()})
    if not numeric:
        return set()
    with create_session(scoped=False) as session:
        return {str(job.id) for job in session.scalars(select(Job).where(Job.id.in_(numeric))) if job.is_alive()}


def _holds_finalizer(view: PodView | None, uid: str) -> bool:
    """Whether ``view`` is of the pod with ``uid`` and still lists leoflow's finalizer."""
    return view is not None and view.uid == uid and decide.finalizer_index(view.finalizers) is not None


def attempt_pod_name(attempt: Attempt) -> str:
    """The deterministic pod name of a ledger attempt (:func:`.pod.pod_name`), whether or not it has a pod."""
    return pod_name(_pod_attempt(attempt))


def _pod_attempt(attempt: Attempt) -> PodAttempt:
    ref = attempt.ref
    return PodAttempt(ref.ti_id, ref.try_number, ref.attempt_epoch, attempt.dag_id, attempt.task_id,
                      attempt.run_id, attempt.map_index)


def _remote_logging_env() -> dict[str, str]:
    """The scheduler's ``[logging]`` remote-logging settings as every task pod gets them
    (:func:`.logenv.logging_env` of the options of :data:`.logenv.FORWARDED_OPTIONS` as Airflow reads them:
    ``airflow.cfg``, ``AIRFLOW__LOGGING__*``, ``_CMD``/``_SECRET``); ``{}`` when ``remote_logging`` is off.

    :raises ConfigError: an option carries a credential."""
    from airflow.configuration import conf

    from leoflow_airflow.runtime.kubernetes.logenv import FORWARDED_OPTIONS, logging_env

    return logging_env({o: conf.get("logging", o, fallback="") or "" for o in FORWARDED_OPTIONS})


def _remote_logging_on() -> bool:
    """``[logging] remote_logging`` as this process's Airflow reads it (False when it cannot be read)."""
    try:
        from airflow.configuration import conf

        return conf.getboolean("logging", "remote_logging", fallback=False)
    except Exception:  # noqa: BLE001 - a malformed value: no log is kept, nothing else changes
        return False


def _plugin_hook() -> Callable[[Any, PodAttempt], None] | None:
    """The plugins' ``leoflow_mutate_pod`` as :func:`.pod.build_pod` takes it, or None when no plugin has one."""
    if not hooks.has_implementations("leoflow_mutate_pod"):
        return None

    def call(pod: Any, attempt: PodAttempt) -> None:
        hooks.mutate_pod(pod, AttemptInfo(attempt.ti_id, attempt.try_number, attempt.attempt_epoch, attempt.dag_id,
                                          attempt.task_id, attempt.run_id, attempt.map_index, "kubernetes"))

    return call


def _short(exc: BaseException) -> str:
    code = getattr(exc, "status", None)
    text = f"HTTP {code} {getattr(exc, 'reason', '')}".strip() if isinstance(code, int) and code else str(exc)
    return f"{type(exc).__name__}: {text}"[:300]


def _settles(answer: object) -> bool:
    """Whether ``collect``'s ``is_closed`` answer lets a pod of this installation go: CLOSED (or ``True``), or
    ABSENT (its closed row was removed by the ledger's retention); OPEN (or ``False``) keeps it."""
    return answer is True or answer in (LedgerRow.CLOSED, LedgerRow.ABSENT)
