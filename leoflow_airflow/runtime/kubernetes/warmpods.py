"""Kubernetes warm pods, the scheduler side (issue 11 items 2 and 4; ``warm-contract.md`` "Names" and "Runtime";
DESIGN §3 "Warm pools").

A **warm pod** is a pod of leoflow's agent (``python -m leoflow_agent warm-pod``) started before any attempt for
one DAG version (``dag_version_id``): it registers with the plugin app, parses its DAG file once, and long-polls
for attempts, which the scheduler hands it through the ledger (``WarmLedger.assign``). This module holds:

* the **names** of the contract (labels, the anchor's name, the container args, the agent's ``LEOFLOW_WARM_*``
  variables) and the **pod builder** :func:`build_warm_pod`: the same template, layers and hardening as a task pod
  (:func:`.pod.build_pod`, Airflow's ``pod_mutation_hook`` included), then the warm pins: no attempt labels and no
  identity annotation (a warm pod is nobody's until assigned), the warm labels, an ``emptyDir`` scratch volume,
  ``activeDeadlineSeconds`` = ``warm_max_lifetime_seconds`` + the credential ceiling
  (:func:`.warmdecide.create_deadline`), and one ownerReference to its anchor;
* the **anchors**: one ConfigMap per (scheduler job, version) in the task namespace that every warm pod of that pool
  is owned by (``controller: true``, ``blockOwnerDeletion: false``), so deleting it makes Kubernetes' garbage
  collector delete the pool (k8s-runtime-facts §6.6-6.7): a lost scheduler's pools go with its anchors, which the
  next scheduler deletes at start (:meth:`WarmPool.sweep_dead_anchors`: a job Airflow's ``Job.is_alive`` says is
  not alive), after moving the live pods whose ledger rows hold an attempt under its own anchors (a running
  attempt survives its scheduler's restart, as on a task pod); a drained version's anchor is deleted on
  :class:`~leoflow_airflow.warm.pool.Retire`;
* :class:`WarmPool`: one **tick** (on the runtime's request pool, never on the scheduler loop): snapshot = this
  job's warm pods from the warm informer + the ledger's rows → :func:`leoflow_airflow.warm.pool.decide` → creates
  (with :class:`~leoflow_airflow.warm.expectations.Expectations`, so a lagging cache never overshoots a cap),
  guarded deletes, reaps and retirements;
* :func:`airflow_versions`: the targets' inputs from Airflow's DB.

Decisions of this module (the contract is silent on them):

* Warm pods carry **no** ``leoflow.io/outcome-record`` finalizer: their attempts' records go in-band to the ledger
  (``leoflow_attempt.outcome_json``) before the terminal PATCH, so the pod is not the only copy, and a finalizer
  would keep a garbage-collected pool's pods (and a retired anchor's) until a scheduler released them.
* Warm pods carry ``app.kubernetes.io/component: warm-pod``, not ``task-attempt``: the task pods' informer never
  sees them (its retention GC and finalizer sweep stay task pods' only); a second informer watches
  :func:`warm_selector`.
* Warm pod names are ``lfw-<job id>-<12 hex of the version>-<8 random hex>`` (:func:`is_warm_name` tells them
  from a task pod's ``<slug>-<32 hex>-<epoch>``); a ledger attempt that names one was placed warm.
* Airflow's ``leoflow_mutate_pod`` plugin hook is not called for warm pods (it is given an attempt; a warm pod
  has none); ``pod_mutation_hook`` is.
* Placement may use an idle worker of any scheduler's pool in the namespace (the assignment is guarded); the pool
  decision counts only this job's pods, so two schedulers never fight over one pool.
"""

from __future__ import annotations

import logging
import re
import secrets
import threading
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from kubernetes.client import models as k8s

from leoflow_agent.warmpod import (
    ENV_WARM_BUNDLE,
    ENV_WARM_BUNDLE_VERSION,
    ENV_WARM_DAG_FILE,
    ENV_WARM_IDLE_TTL,
    ENV_WARM_ISOLATION,
    ENV_WARM_MAX_ATTEMPTS,
    ENV_WARM_MAX_LIFETIME,
    ENV_WARM_SCRATCH,
    ENV_WARM_SWEEP_ROOTS,
)
from leoflow_airflow.runtime.kubernetes import warmdecide
from leoflow_airflow.runtime.kubernetes.warmdecide import ANCHOR_LABEL, JOB_LABEL, TENANT_LABEL, VERSION_LABEL, WARM_LABEL
from leoflow_airflow.runtime.kubernetes.identity import IDENTITY_ANNOTATION
from leoflow_airflow.runtime.kubernetes.pod import (
    AGENT_CONTAINER,
    APP_LABELS,
    INSTANCE_LABEL,
    OUTCOME_FINALIZER,
    PodAttempt,
    attempt_labels,
    build_pod,
    label_value,
)
from leoflow_airflow.warm import pool as warm_pool
from leoflow_airflow.warm.expectations import Expectations
from leoflow_airflow.warm.targets import PoolDefaults, VersionInfo, parse_overrides, resolve, tenant_of

if TYPE_CHECKING:
    from leoflow_airflow.runtime.kubernetes.status import PodView
    from leoflow_airflow.settings import KubernetesSettings, WarmSettings

__all__ = ["ANCHOR_LABEL", "GAUGED_STATES", "JOB_LABEL", "TENANT_LABEL", "VERSION_LABEL", "WARM_ARGS", "WARM_LABEL",
           "PoolVersion", "TickReport", "WarmPool", "airflow_versions", "anchor_name", "anchor_selector",
           "build_anchor", "build_warm_pod", "is_warm_name", "pod_state_counts", "warm_pod_name", "warm_selector"]

log = logging.getLogger(__name__)

WARM_COMPONENT = "warm-pod"
WARM_APP_LABELS = {**APP_LABELS, "app.kubernetes.io/component": WARM_COMPONENT}
WARM_ARGS = ("python", "-m", "leoflow_agent", "warm-pod")
"""The agent container's arguments on a warm pod (the image's ENTRYPOINT, dumb-init, runs them)."""
SCRATCH_VOLUME = "leoflow-scratch"
SCRATCH_DIR = "/leoflow-scratch"
ISOLATION_VOLUMES = {"leoflow-tmp": ("/tmp", None), "leoflow-shm": ("/dev/shm", "Memory")}
"""``read-only-root`` isolation's volumes: name -> (mount path, ``emptyDir`` medium)."""
"""An ``emptyDir`` mounted here: the agent's per-attempt HOME and TMPDIR in ``read-only-root`` isolation."""
EXPECTATION_TTL_SECONDS = 120.0
"""Seconds a create stays expected without the warm informer showing its pod (then the cache is re-listed)."""

DEAD_JOB_GRACE_FACTOR = 2.0
"""A scheduler job's anchors are kept while its last heartbeat (``job.latest_heartbeat``) is younger than this many
times ``[scheduler] scheduler_health_check_threshold``, although Airflow's ``Job.is_alive`` (that threshold) says
it is not alive: a DB stall or a slow heartbeat up to twice the threshold is not death (k8s review §11). Past it,
the job's anchors go (:meth:`WarmPool.sweep_dead_anchors`), and the garbage collector their pods: a crashed
scheduler's idle warm pods are gone within about three thresholds (90 s at Airflow's default 30 s)."""
DEAD_JOB_GRACE_SECONDS = 60.0
"""The grace at Airflow's default threshold (30 s × :data:`DEAD_JOB_GRACE_FACTOR`)."""
DEAD_ANCHOR_SWEEP_SECONDS = 30.0
"""Seconds between two sweeps of dead jobs' anchors after the start sweep (on the pool tick) at Airflow's default
threshold (one threshold), so anchors kept by the grace at start go once the job stays dead."""


def health_check_threshold() -> float:
    """Airflow's ``[scheduler] scheduler_health_check_threshold`` in seconds (30 when Airflow's configuration
    cannot be read or the value is not a positive number)."""
    try:
        from airflow.configuration import conf

        value = conf.getfloat("scheduler", "scheduler_health_check_threshold", fallback=30.0)
    except Exception:  # noqa: BLE001 - a missing or malformed value: Airflow's default
        return 30.0
    return value if value > 0 else 30.0

_WARM_NAME = re.compile(r"lfw-[0-9]+-[0-9a-f]{12}-[0-9a-f]{8}")
_PLACEHOLDER_TI = "00000000-0000-0000-0000-000000000000"


def warm_selector(instance: str | None) -> str:
    """The label selector of the warm pods of installation ``instance`` (``[leoflow] instance``; any scheduler's of
    it): the warm informer watches exactly these, so another installation's warm pods in the namespace are never
    counted, placed on or deleted (k8s review §5). ``None``: every installation's (tests, cleanup)."""
    labels = {"app.kubernetes.io/managed-by": "leoflow", WARM_LABEL: "true"}
    if instance is not None:
        labels[INSTANCE_LABEL] = instance
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def anchor_selector(instance: str) -> str:
    """The label selector of installation ``instance``'s anchor ConfigMaps (:func:`build_anchor`): the dead-anchor
    sweep lists only these, so it never judges, and deletes, another installation's anchors, whose scheduler jobs
    are never alive in this installation's ``job`` table (k8s review §5)."""
    return f"{ANCHOR_LABEL}=true,{INSTANCE_LABEL}={instance}"


def anchor_name(job_id: str, version: str) -> str:
    """The anchor ConfigMap of scheduler job ``job_id``'s pool of ``version``: ``leoflow-warm-<job>-<version>``."""
    return f"leoflow-warm-{job_id}-{version}"


def warm_pod_name(job_id: str, version: str, token: str | None = None) -> str:
    """A new warm pod's name, ``lfw-<job id>-<12 hex of the version's UUID>-<8 hex>`` (random unless ``token``)."""
    return f"lfw-{job_id}-{uuid.UUID(version).hex[:12]}-{token or secrets.token_hex(4)}"


def is_warm_name(name: str | None) -> bool:
    """Whether ``name`` is a warm pod's (:func:`warm_pod_name`); a task pod's name never is."""
    return bool(name) and _WARM_NAME.fullmatch(name or "") is not None


@dataclass(frozen=True)
class PoolVersion:
    """A DAG version a warm pod is built for: ``version`` (``dag_version_id``), its ``dag_id``, its ``bundle``
    name and ``bundle_version`` (``""``: unversioned), its DAG file relative to the bundle (``dag_file``, the
    workload's ``dag_rel_path``), its ``team`` (multi-team mode, else None), whether a dag run of it is queued or
    running (``active_run``) and whether it is its unpaused DAG's latest version (``current``)."""

    version: str
    dag_id: str
    bundle: str
    bundle_version: str
    dag_file: str
    team: str | None = None
    active_run: bool = False
    current: bool = False

    @property
    def tenant(self) -> str:
        """:func:`leoflow_airflow.warm.targets.tenant_of` of it."""
        return tenant_of(self.bundle, self.team)

    def info(self) -> VersionInfo:
        """Its :class:`~leoflow_airflow.warm.targets.VersionInfo` for :func:`~leoflow_airflow.warm.targets.resolve`."""
        return VersionInfo(self.version, self.dag_id, self.bundle, self.team, self.active_run, self.current)


def build_anchor(job_id: str, version: str, namespace: str, *, instance: str) -> k8s.V1ConfigMap:
    """The anchor ConfigMap of ``job_id``'s pool of ``version`` in installation ``instance`` (labels
    ``leoflow.io/warm-anchor``, ``leoflow.io/scheduler-job``, ``leoflow.io/dag-version`` and
    ``leoflow.io/instance``, :func:`anchor_selector`); it holds no data."""
    return k8s.V1ConfigMap(api_version="v1", kind="ConfigMap", metadata=k8s.V1ObjectMeta(
        name=anchor_name(job_id, version), namespace=namespace,
        labels={**WARM_APP_LABELS, ANCHOR_LABEL: "true", JOB_LABEL: label_value(job_id),
                VERSION_LABEL: label_value(version), INSTANCE_LABEL: label_value(instance)}))


def build_warm_pod(pv: PoolVersion, settings: KubernetesSettings, warm: WarmSettings, *, job_id: str, name: str,
                   anchor_uid: str, template: k8s.V1Pod | None = None,
                   mutation_hook: Callable[[k8s.V1Pod], Any] | None = None,
                   forward_env: Mapping[str, str] | None = None) -> k8s.V1Pod:
    """The warm pod ``name`` of ``pv``'s pool of scheduler job ``job_id`` (module docstring).

    Built as a task pod is (:func:`.pod.build_pod`: the template, leoflow's layer, ``mutation_hook``, the pins
    and final checks) for a placeholder attempt, then pinned as a warm pod: the name, labels ``leoflow.io/warm``,
    ``leoflow.io/dag-version``, ``leoflow.io/tenant``, ``leoflow.io/scheduler-job`` and ``leoflow.io/instance``
    (``settings.instance``, :func:`warm_selector`; k8s review §5) in place of the attempt labels,
    no identity annotation and no outcome finalizer, args :data:`WARM_ARGS`, the ``LEOFLOW_WARM_*`` environment
    next to the cold pod's, the scratch ``emptyDir`` (:data:`SCRATCH_DIR`), ``activeDeadlineSeconds``
    :func:`.warmdecide.create_deadline` (None when the ceiling is 0), and one ownerReference to the anchor
    (``anchor_uid``). ``forward_env``: the scheduler's remote-logging settings (``.logenv``), as a task pod gets
    them. In ``read-only-root`` isolation the agent container's root filesystem is read-only and ``/tmp`` and
    ``/dev/shm`` are ``emptyDir`` volumes of the pod (the latter in memory), unless the template mounts something
    there already: the agent empties them between attempts, so they must be the pod's own, never a node's.

    :raises PodRefused: what :func:`.pod.build_pod` refuses of the template or the hook.
    """
    placeholder = PodAttempt(_PLACEHOLDER_TI, 1, 1, pv.dag_id, "warm-pod", "warm-pod")
    pod = build_pod(placeholder, settings, template=template, mutation_hook=mutation_hook,
                    forward_env=forward_env)
    meta = pod.metadata
    ours = set(attempt_labels(placeholder, instance=settings.instance))
    meta.name = name
    meta.labels = {**{k: v for k, v in (meta.labels or {}).items() if k not in ours}, **WARM_APP_LABELS,
                   WARM_LABEL: "true", VERSION_LABEL: label_value(pv.version), TENANT_LABEL: label_value(pv.tenant),
                   JOB_LABEL: label_value(job_id), INSTANCE_LABEL: label_value(settings.instance)}
    meta.annotations = {k: v for k, v in (meta.annotations or {}).items() if k != IDENTITY_ANNOTATION} or None
    meta.finalizers = [f for f in meta.finalizers or [] if f != OUTCOME_FINALIZER] or None
    meta.owner_references = [k8s.V1OwnerReference(api_version="v1", kind="ConfigMap",
                                                  name=anchor_name(job_id, pv.version), uid=anchor_uid,
                                                  controller=True, block_owner_deletion=False)]
    spec = pod.spec
    spec.active_deadline_seconds = warmdecide.create_deadline(warm.warm_max_lifetime_seconds,
                                                              settings.credential_ceiling_seconds)
    spec.volumes = [v for v in spec.volumes or [] if v.name != SCRATCH_VOLUME] + [
        k8s.V1Volume(name=SCRATCH_VOLUME, empty_dir=k8s.V1EmptyDirVolumeSource())]
    agent = spec.containers[0]
    assert agent.name == AGENT_CONTAINER
    agent.args = list(WARM_ARGS)
    agent.volume_mounts = [m for m in agent.volume_mounts or [] if m.name != SCRATCH_VOLUME] + [
        k8s.V1VolumeMount(name=SCRATCH_VOLUME, mount_path=SCRATCH_DIR)]
    swept = _isolate(spec, agent) if warm.warm_isolation == "read-only-root" else []
    env = {
        ENV_WARM_BUNDLE: pv.bundle,
        ENV_WARM_BUNDLE_VERSION: pv.bundle_version,
        ENV_WARM_DAG_FILE: pv.dag_file,
        ENV_WARM_MAX_ATTEMPTS: str(warm.warm_max_attempts),
        ENV_WARM_MAX_LIFETIME: f"{warm.warm_max_lifetime_seconds:g}",
        ENV_WARM_IDLE_TTL: f"{warm.warm_idle_ttl_seconds:g}",
        ENV_WARM_ISOLATION: warm.warm_isolation,
        ENV_WARM_SCRATCH: SCRATCH_DIR,
    }
    if swept:
        env[ENV_WARM_SWEEP_ROOTS] = ":".join(swept)
    agent.env = [e for e in agent.env or [] if e.name not in env] + [k8s.V1EnvVar(name=k, value=v)
                                                                     for k, v in env.items()]
    return pod


def _isolate(spec: k8s.V1PodSpec, agent: k8s.V1Container) -> list[str]:
    """``read-only-root`` isolation (:func:`build_warm_pod`): a read-only root filesystem for the agent container,
    and ``/tmp`` and ``/dev/shm`` as the pod's own ``emptyDir`` volumes (:data:`ISOLATION_VOLUMES`) where the
    container mounts nothing yet. Returns the paths the agent may empty between attempts (its
    ``LEOFLOW_WARM_SWEEP_ROOTS``): both, each now a volume of this pod (ours, or the template's own)."""
    mounted = {m.mount_path.rstrip("/") for m in agent.volume_mounts or []}
    for volume, (path, medium) in ISOLATION_VOLUMES.items():
        if path in mounted:
            continue
        spec.volumes = [v for v in spec.volumes or [] if v.name != volume] + [
            k8s.V1Volume(name=volume, empty_dir=k8s.V1EmptyDirVolumeSource(medium=medium))]
        agent.volume_mounts = [*agent.volume_mounts, k8s.V1VolumeMount(name=volume, mount_path=path)]
    if agent.security_context is None:
        agent.security_context = k8s.V1SecurityContext()
    agent.security_context.read_only_root_filesystem = True
    return [path for path, _ in ISOLATION_VOLUMES.values()]


# --------------------------------------------------------------------------------------------------
# targets from Airflow's database


def airflow_versions(*, prewarm: bool) -> list[PoolVersion]:
    """The DAG versions that may keep a pool, read from Airflow's DB in one session: every version a dag run in
    state ``queued``/``running`` was created with (``dag_run.created_dag_version_id``) or a task instance of
    such a run is on (``task_instance.dag_version_id``: an unversioned bundle's re-parsed DAG), and, with
    ``prewarm``, the latest version of every unpaused, not stale DAG. Each with its bundle name, the bundle
    version it was parsed at (``dag_version.bundle_version``, ``""`` unversioned) and the DAG's
    ``relative_fileloc``. Airflow's own models; raises what SQLAlchemy raises (the caller logs and retries)."""
    from sqlalchemy import func, select

    from airflow.models.dag import DagModel
    from airflow.models.dag_version import DagVersion
    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session
    from airflow.utils.state import DagRunState

    active_states = (DagRunState.QUEUED, DagRunState.RUNNING)
    with create_session(scoped=False) as session:
        active = set(session.scalars(select(DagRun.created_dag_version_id).where(
            DagRun.state.in_(active_states), DagRun.created_dag_version_id.is_not(None)).distinct()))
        active |= set(session.scalars(select(TaskInstance.dag_version_id).join(
            DagRun, (DagRun.dag_id == TaskInstance.dag_id) & (DagRun.run_id == TaskInstance.run_id)).where(
            DagRun.state.in_(active_states), TaskInstance.dag_version_id.is_not(None)).distinct()))
        current: set[Any] = set()
        if prewarm:
            latest = select(DagVersion.dag_id, func.max(DagVersion.version_number).label("n")).group_by(
                DagVersion.dag_id).subquery()
            current = set(session.scalars(select(DagVersion.id).join(
                latest, (latest.c.dag_id == DagVersion.dag_id) & (latest.c.n == DagVersion.version_number)).join(
                DagModel, DagModel.dag_id == DagVersion.dag_id).where(
                DagModel.is_paused.is_(False), DagModel.is_stale.is_(False))))
        ids = active | current
        if not ids:
            return []
        rows = session.execute(select(DagVersion.id, DagVersion.dag_id, DagVersion.bundle_name,
                                      DagVersion.bundle_version, DagModel.bundle_name, DagModel.relative_fileloc)
                               .join(DagModel, DagModel.dag_id == DagVersion.dag_id)
                               .where(DagVersion.id.in_(sorted(ids, key=str)))).all()
    return [PoolVersion(str(vid), dag_id, vbundle or mbundle, bversion or "", fileloc or "",
                        active_run=vid in active, current=vid in current)
            for vid, dag_id, vbundle, bversion, mbundle, fileloc in rows]


def past_grace(jobs: Iterable[str], heartbeats: Mapping[str, datetime | None], now: datetime,
               grace_seconds: float = DEAD_JOB_GRACE_SECONDS) -> set[str]:
    """Of ``jobs`` (scheduler job ids Airflow's ``Job.is_alive`` says are not alive), those whose last heartbeat
    (``heartbeats``: job id -> ``latest_heartbeat``, aware UTC; a job missing from it has no ``job`` row) is
    older than ``grace_seconds`` before ``now``, or unknown: only those may lose their anchors. A job that
    heartbeat within the grace is kept (k8s review §11: a DB stall is not death). Pure."""
    out = set()
    for job in jobs:
        beat = heartbeats.get(job)
        if beat is not None and beat.tzinfo is None:
            beat = beat.replace(tzinfo=timezone.utc)
        if beat is None or (now - beat).total_seconds() > grace_seconds:
            out.add(job)
    return out


def airflow_job_heartbeats(job_ids: set[str]) -> dict[str, datetime | None]:
    """``{job id: latest_heartbeat}`` of those of ``job_ids`` (text; non-numeric ones are no Airflow job) that
    have an Airflow ``job`` row, in one read; raises what SQLAlchemy raises (the sweep then deletes nothing)."""
    from sqlalchemy import select

    from airflow.jobs.job import Job
    from airflow.utils.session import create_session

    numeric = sorted({int(j) for j in job_ids if j.isdigit()})
    if not numeric:
        return {}
    with create_session(scoped=False) as session:
        return {str(i): beat for i, beat in session.execute(
            select(Job.id, Job.latest_heartbeat).where(Job.id.in_(numeric)))}


GAUGED_STATES = (warm_pool.WorkerState.IDLE, warm_pool.WorkerState.STARTING, warm_pool.WorkerState.BUSY,
                 warm_pool.WorkerState.DRAINING)
"""The worker states the pool tick sends as gauges (a terminal pod is no worker any more: not counted)."""


def pod_state_counts(workers: Iterable[warm_pool.Worker]) -> dict[str, int]:
    """``{state value: count}`` of ``workers`` for each of :data:`GAUGED_STATES` (zeros included, so a pool
    that emptied sends 0), e.g. ``{"idle": 2, "starting": 1, "busy": 0, "draining": 0}``."""
    counts = {state.value: 0 for state in GAUGED_STATES}
    for w in workers:
        if w.state in GAUGED_STATES:
            counts[w.state.value] += 1
    return counts


# --------------------------------------------------------------------------------------------------
# the pool


@dataclass
class TickReport:
    """What one :meth:`WarmPool.tick` did (for the log and the tests): the actions decided, and the pods created,
    deleted and reaped, the anchors created and retired, and the errors met (one line each)."""

    actions: list[Any] = field(default_factory=list)
    created: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    reaped: list[str] = field(default_factory=list)
    anchors_created: list[str] = field(default_factory=list)
    retired: list[str] = field(default_factory=list)
    forgotten: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


class WarmPool:
    """The warm pools of one scheduler job (module docstring). Every method but :meth:`held` runs on the
    runtime's request pool, one call at a time (:meth:`tick` is single-flight: the runtime submits the next one
    only after the last one returned).

    :param core: a ``kubernetes.client.CoreV1Api``.
    :param settings: the Kubernetes ``[leoflow]`` options (namespace, ceiling, …).
    :param warm: the ``[leoflow] warm_*`` options.
    :param job_id: this scheduler's Airflow job id (text).
    :param ledger: the contract's ``WarmLedger`` (``workers``, ``get``, ``forget``, ``retire_idle``), or a stand-in
        with them.
    :param informer: the warm pods' informer (``synced``, ``views()``), :func:`warm_selector`.
    :param versions: ``() -> list[PoolVersion]`` (default :func:`airflow_versions`, with the current versions of unpaused DAGs when ``warm_prewarm`` or an override's ``prewarm`` is on).
    :param template: the operator's pod template; ``mutation_hook``: Airflow's ``pod_mutation_hook``.
    :param held: ``() -> set[str]``: pod UIDs this runtime assigned an attempt to and has not forgotten (never
        deleted by the pool, whatever a lagging ledger read says).
    :param request_timeout: seconds of one API request.
    :param monotonic: the expectations' clock.
    :param heartbeats: ``(job ids) -> {job id: latest heartbeat}`` (default :func:`airflow_job_heartbeats`): a job
        not alive but within :data:`DEAD_JOB_GRACE_FACTOR` health thresholds of its last heartbeat keeps its
        anchors.
    :param health_threshold: ``[scheduler] scheduler_health_check_threshold`` seconds (default: read from
        Airflow, :func:`health_check_threshold`); the dead-job grace and the re-sweep interval follow from it.
    :raises ConfigError: ``[leoflow] warm_pools`` is malformed.
    """

    def __init__(self, core: Any, settings: KubernetesSettings, warm: WarmSettings, *, job_id: str, ledger: Any,
                 informer: Any, versions: Callable[[], list[PoolVersion]] | None = None,
                 template: k8s.V1Pod | None = None, mutation_hook: Callable[[k8s.V1Pod], Any] | None = None,
                 held: Callable[[], set[str]] = set, request_timeout: float = 30.0,
                 monotonic: Callable[[], float] | None = None,
                 forward_env: Mapping[str, str] | None = None,
                 heartbeats: Callable[[set[str]], Mapping[str, datetime | None]] | None = None,
                 health_threshold: float | None = None) -> None:
        import time

        self.core, self.settings, self.warm, self.job_id = core, settings, warm, str(job_id)
        self.ledger, self.informer = ledger, informer
        self._versions = versions or (lambda: airflow_versions(prewarm=warm.prewarm_any))
        self._template, self._hook, self._held = template, mutation_hook, held
        self._forward_env = dict(forward_env or {})
        self._timeout = request_timeout
        self._monotonic = monotonic or time.monotonic
        self.defaults = PoolDefaults(warm.warm_min_idle, warm.warm_max_pool_size, warm.warm_prewarm)
        self.overrides = parse_overrides(warm.warm_pools)
        self.pool_settings = warm_pool.PoolSettings(tenant_cap=warm.warm_tenant_cap or None,
                                                    start_timeout=warm.warm_start_timeout_seconds)
        self.expectations = Expectations(EXPECTATION_TTL_SECONDS)
        self.anchors: dict[str, str] = {}  # version -> anchor uid (this job's), confirmed before each Create batch
        self._heartbeats = heartbeats or airflow_job_heartbeats
        threshold = health_threshold if health_threshold is not None else health_check_threshold()
        self.dead_job_grace = DEAD_JOB_GRACE_FACTOR * threshold
        self.dead_sweep_every = max(5.0, threshold)
        self._alive: Callable[[set[str]], set[str]] | None = None  # the start sweep's, for the later sweeps
        self._next_sweep = float("inf")
        self._lock = threading.Lock()
        self.rows: list[Any] = []
        """The ledger rows of the namespace as the last tick read them (placement reads them)."""
        self.rows_read_at = float("-inf")
        """``monotonic()`` when :attr:`rows` were read (started reading)."""
        self._by_uid: dict[str, Any] = {}
        self._ready: dict[str, int] = {}  # version -> ready warm pods at the last synced tick

    @property
    def namespace(self) -> str:
        """The task namespace."""
        return self.settings.namespace

    # --- anchors ---------------------------------------------------------------------------------------------
    def sweep_dead_anchors(self, alive: Callable[[set[str]], set[str]]) -> list[str]:
        """Delete the anchors whose ``leoflow.io/scheduler-job`` names a job that is not alive
        (:func:`.warmdecide.dead_anchors`; ``alive(job ids) -> the alive ones``, Airflow's ``Job.is_alive``); the
        garbage collector then removes their pods. Returns the names deleted; raises what the client raises on
        the LIST (the caller logs it). Only this installation's anchors are listed (:func:`anchor_selector`,
        k8s review §5): another's jobs are never alive here.

        k8s review §11: a job that is not alive but heartbeat within :attr:`dead_job_grace` seconds keeps its
        anchors (:func:`past_grace`), and ``alive`` is kept so that the pool tick sweeps again every
        :attr:`dead_sweep_every` seconds (such a job's anchors go once it stays dead)."""
        self._alive = alive
        self._next_sweep = self._monotonic() + self.dead_sweep_every
        listed = self.core.list_namespaced_config_map(self.namespace,
                                                      label_selector=anchor_selector(self.settings.instance),
                                                      _request_timeout=self._timeout)
        anchors = [(cm.metadata.name, (cm.metadata.labels or {}).get(JOB_LABEL, "")) for cm in listed.items]
        versions = {cm.metadata.name: (cm.metadata.labels or {}).get(VERSION_LABEL, "") for cm in listed.items}
        jobs = {job for _, job in anchors if job and job != self.job_id}
        dead = warmdecide.dead_anchors(anchors, alive(jobs) if jobs else set(), self.job_id)
        if dead:
            suspects = {job for name, job in anchors if name in dead}
            gone = past_grace(suspects, self._heartbeats(suspects), datetime.now(timezone.utc),
                              self.dead_job_grace)
            for job in sorted(suspects - gone):
                log.info("warm pods: scheduler job %s is not alive but heartbeat within %gs: its anchors stay",
                         job, self.dead_job_grace)
            dead = [name for name in dead if dict(anchors)[name] in gone]
        holding: dict[str, Any] | None = None
        for name in dead:
            job = dict(anchors)[name]
            if versions.get(name):
                if holding is None:
                    holding = {r.pod_uid: r for r in self.ledger.workers(self.namespace)
                               if r.state in (warmdecide.ASSIGNED, warmdecide.BUSY)}
                self._adopt_holding(job, versions[name], holding)
            self._delete_anchor(name)
            log.info("warm pods: deleted anchor %s of a scheduler job that is not alive (its pods go with it)", name)
        return dead

    def _adopt_holding(self, job: str, version: str, holding: Mapping[str, Any]) -> None:
        """Before a dead job's anchor goes: move each of its live warm pods of ``version`` whose ledger row holds
        an attempt under this job's anchor (ownerReference and ``leoflow.io/scheduler-job``, one UID-tested JSON
        patch), so the garbage collector does not kill a running attempt because its scheduler restarted (a task
        pod outlives its scheduler too); this pool then never deletes it while it is busy and reaps it once
        terminal. Idle pods are left to go with the anchor."""
        from leoflow_airflow.runtime.kubernetes.decide import _operation
        from leoflow_airflow.runtime.kubernetes.finalizer import JSON_PATCH

        selector = f"{warm_selector(self.settings.instance)},{JOB_LABEL}={job},{VERSION_LABEL}={version}"
        pods = self.core.list_namespaced_pod(self.namespace, label_selector=selector,
                                             _request_timeout=self._timeout).items
        for pod in pods:
            if pod.metadata.uid not in holding or (pod.status and pod.status.phase in ("Succeeded", "Failed")):
                continue
            report = TickReport()
            uid = self._ensure_anchor(version, report) if self._confirm_anchor(version, report) else None
            if uid is None:
                continue
            owner = {"apiVersion": "v1", "kind": "ConfigMap", "name": anchor_name(self.job_id, version), "uid": uid,
                     "controller": True, "blockOwnerDeletion": False}
            patch = [_operation("test", "/metadata/uid", value=pod.metadata.uid),
                     _operation("replace", "/metadata/ownerReferences", value=[owner]),
                     _operation("replace", "/metadata/labels/" + JOB_LABEL.replace("/", "~1"),
                                value=label_value(self.job_id))]
            try:
                self.core.patch_namespaced_pod(pod.metadata.name, self.namespace, patch,
                                               _request_timeout=self._timeout, _content_type=JSON_PATCH)
                log.info("warm pods: adopted %s (it holds an attempt) from dead scheduler job %s", pod.metadata.name,
                         job)
            except Exception as exc:  # noqa: BLE001 - 404/422: gone or another pod; else it goes with the anchor
                log.warning("warm pods: could not adopt %s from job %s: %s", pod.metadata.name, job, _short(exc))

    def _ensure_anchor(self, version: str, report: TickReport) -> str | None:
        """The uid of this job's anchor of ``version``, created when missing (409: read back); None on error."""
        uid = self.anchors.get(version)
        if uid is not None:
            return uid
        body = build_anchor(self.job_id, version, self.namespace, instance=self.settings.instance)
        try:
            uid = self.core.create_namespaced_config_map(self.namespace, body, _request_timeout=self._timeout).metadata.uid
            report.anchors_created.append(body.metadata.name)
        except Exception as exc:  # noqa: BLE001 - sorted here
            if getattr(exc, "status", None) != 409:
                report.errors.append(f"anchor {body.metadata.name}: {_short(exc)}")
                return None
            try:
                uid = self.core.read_namespaced_config_map(body.metadata.name, self.namespace,
                                                           _request_timeout=self._timeout).metadata.uid
            except Exception as exc2:  # noqa: BLE001
                report.errors.append(f"anchor {body.metadata.name}: {_short(exc2)}")
                return None
        self.anchors[version] = uid
        return uid

    def _confirm_anchor(self, version: str, report: TickReport) -> bool:
        """Before a Create batch of ``version``: re-read this job's cached anchor (one GET). Gone (404) or being
        deleted: the cache is dropped, so :meth:`_ensure_anchor` creates a new one (or, while the old one is still
        being deleted, the creates wait a tick); another UID under the name: the cache takes it. Whether the
        batch may go on; an error of the read is reported and the batch skipped. k8s review §11: a pod owned by a
        deleted anchor's UID is accepted by the API server and garbage-collected at once, for ever."""
        cached = self.anchors.get(version)
        if cached is None:
            return True
        name = anchor_name(self.job_id, version)
        try:
            found = self.core.read_namespaced_config_map(name, self.namespace, _request_timeout=self._timeout)
        except Exception as exc:  # noqa: BLE001 - sorted here
            if getattr(exc, "status", None) != 404:
                report.errors.append(f"anchor {name}: {_short(exc)}")
                return False
            self.anchors.pop(version, None)
            log.info("warm pods: anchor %s (uid %s) was deleted: creating a new one", name, cached)
            return True
        if found.metadata.deletion_timestamp is not None:
            self.anchors.pop(version, None)
            report.errors.append(f"anchor {name}: being deleted; its pool waits for it to go")
            return False
        self.anchors[version] = found.metadata.uid
        return True

    def _delete_anchor(self, name: str) -> None:
        from kubernetes import client

        try:
            self.core.delete_namespaced_config_map(name, self.namespace, body=client.V1DeleteOptions(
                propagation_policy="Background"), _request_timeout=self._timeout)
        except Exception as exc:  # noqa: BLE001 - 404: gone already
            if getattr(exc, "status", None) != 404:
                raise

    # --- the tick ------------------------------------------------------------------------------------------
    def snapshot(self, targets: tuple[warm_pool.Target, ...], views: Iterable[PodView], rows: Iterable[Any],
                 now: datetime) -> warm_pool.PoolSnapshot:
        """The :class:`~leoflow_airflow.warm.pool.PoolSnapshot` of this job's warm pods ``views`` with the
        ledger's ``rows`` (by pod UID) and the open expectations (met ones closed by the names seen)."""
        by_uid = {r.pod_uid: r for r in rows}
        mine = [v for v in views if v.label(JOB_LABEL) == label_value(self.job_id)]
        self.expectations.observe(v.name for v in mine)
        # a pod's tenant label is label_value(tenant): read it back as the targets name it, so a tenant's
        # footprint is counted under one key
        tenants = {label_value(t.tenant): t.tenant for t in targets}
        workers = []
        for v in mine:
            version = v.label(VERSION_LABEL) or ""
            label = v.label(TENANT_LABEL) or ""
            workers.append(warmdecide.pool_worker(
                v, by_uid.get(v.uid), version=version, tenant=tenants.get(label, label), now=now,
                max_attempts=self.warm.warm_max_attempts, max_lifetime=self.warm.warm_max_lifetime_seconds))
        return warm_pool.PoolSnapshot(targets=targets, workers=tuple(workers),
                                      pending=self.expectations.pending(self._monotonic()),
                                      pooled=frozenset(self.anchors), synced=bool(self.informer.synced))

    def tick(self, now: datetime | None = None) -> TickReport:
        """One pass (module docstring): read the targets and the ledger rows, decide, act in order (reaps and
        deletes before creates). Never raises: errors are logged and returned in the report."""
        report = TickReport()
        now = now or datetime.now(timezone.utc)
        try:
            pvs = {pv.version: pv for pv in self._versions()}
            started = self._monotonic()
            rows = list(self.ledger.workers(self.namespace))
            self.set_rows(rows, started)
        except Exception as exc:  # noqa: BLE001 - a DB hiccup: next tick
            log.warning("warm pods: could not read the targets or the ledger: %s", _short(exc))
            report.errors.append(_short(exc))
            return report
        targets = resolve((pv.info() for pv in pvs.values()), self.defaults, self.overrides)
        views = list(self.informer.views()) if self.informer.synced else []
        snapshot = self.snapshot(targets, views, rows, now)
        self._resized(snapshot)
        self._gauges(snapshot)
        report.actions = warm_pool.decide(snapshot, now, self.pool_settings)
        by_name = {v.name: v for v in views}
        confirmed: dict[str, bool] = {}  # version -> may create (its anchor was re-read this tick)
        for action in report.actions:
            try:
                if isinstance(action, warm_pool.Create) and action.version not in confirmed:
                    confirmed[action.version] = self._confirm_anchor(action.version, report)
                if isinstance(action, warm_pool.Create) and not confirmed[action.version]:
                    continue
                self._act(action, pvs, by_name, report)
            except Exception as exc:  # noqa: BLE001 - one failed action does not stop the others
                report.errors.append(f"{type(action).__name__} {action}: {_short(exc)}")
        if self.informer.synced:
            self._forget_rows(rows, by_name, now, report)
        if self._alive is not None and self._monotonic() >= self._next_sweep:
            try:
                self.sweep_dead_anchors(self._alive)
            except Exception as exc:  # noqa: BLE001 - the next sweep tries again
                self._next_sweep = self._monotonic() + self.dead_sweep_every
                report.errors.append(f"sweep of dead anchors: {_short(exc)}")
        for line in report.errors:
            log.warning("warm pods: %s", line)
        return report

    def _resized(self, snapshot: warm_pool.PoolSnapshot) -> None:
        """Fire the plugins' ``leoflow_warm_pool_resized`` for every version whose ready (idle, registered) warm
        pods changed since the last synced tick, ``pool_key`` ``kubernetes:<dag_version_id>`` (never raises)."""
        if not snapshot.synced:
            return
        from leoflow_airflow import hooks

        ready: dict[str, int] = {}
        for w in snapshot.workers:
            ready[w.version] = ready.get(w.version, 0) + (w.state is warm_pool.WorkerState.IDLE)
        for version in sorted(set(ready) | set(self._ready)):
            before, after = self._ready.get(version, 0), ready.get(version, 0)
            if before != after:
                hooks.warm_pool_resized(f"kubernetes:{version}", before=before, after=after)
        self._ready = {v: n for v, n in ready.items() if n}

    def _gauges(self, snapshot: warm_pool.PoolSnapshot) -> None:
        """Send ``leoflow.warm.kubernetes.pods.<state>`` (:data:`GAUGED_STATES`): this job's warm pods per state,
        totals over every version, on each synced tick (an unsynced cache shows no pods: nothing is sent rather
        than zeros). Every tick, not only on change: a StatsD server that restarted has them again within a tick.
        Never raises (:mod:`leoflow_airflow.metrics`)."""
        if not snapshot.synced:
            return
        from leoflow_airflow import metrics

        for state, count in pod_state_counts(snapshot.workers).items():
            metrics.gauge(f"leoflow.warm.kubernetes.pods.{state}", count)

    def _act(self, action: Any, pvs: Mapping[str, PoolVersion], views: Mapping[str, PodView],
             report: TickReport) -> None:
        if isinstance(action, warm_pool.Create):
            pv = pvs[action.version]
            anchor_uid = self._ensure_anchor(action.version, report)
            if anchor_uid is None:
                return
            name = warm_pod_name(self.job_id, action.version)
            ticket = self.expectations.begin(action.version, action.tenant, self._monotonic())
            pod = build_warm_pod(pv, self.settings, self.warm, job_id=self.job_id, name=name, anchor_uid=anchor_uid,
                                 template=self._template, mutation_hook=self._hook,
                                 forward_env=self._forward_env)
            try:
                self.core.create_namespaced_pod(self.namespace, pod, _request_timeout=self._timeout)
            except Exception:
                self.expectations.failed(ticket)
                raise
            self.expectations.created(ticket, name)
            report.created.append(name)
        elif isinstance(action, warm_pool.Delete):
            view = views.get(action.name)
            if view is None or not self._retire(view):
                return
            self._delete_pod(view.name, view.uid)
            report.deleted.append(view.name)
        elif isinstance(action, warm_pool.Reap):
            view = views.get(action.name)
            if view is None:
                return
            self._delete_pod(view.name, view.uid)
            report.reaped.append(view.name)
            if self.ledger.forget(view.uid):
                report.forgotten.append(view.name)
        elif isinstance(action, warm_pool.Retire):
            self._delete_anchor(anchor_name(self.job_id, action.version))
            self.anchors.pop(action.version, None)
            report.retired.append(anchor_name(self.job_id, action.version))

    def _retire(self, view: PodView) -> bool:
        """The delete guard, whether the pool may delete ``view``'s pod: not held by this runtime, and its ledger
        row, read again now, is idle and then deleted by one write guarded on ``idle`` and that read's
        ``row_version`` (``WarmLedger.retire_idle``; k8s review §16g): a scheduler that assigned it since (on its
        own thread, between this read and the delete) makes the write change nothing and keeps the pod; one that
        assigns after finds no row and loses cleanly. A pod with no row (not registered) has nothing to assign."""
        if view.uid in self._held():
            return False
        row = self.ledger.get(view.uid)
        if row is None:
            return True
        return row.state == warmdecide.IDLE and bool(self.ledger.retire_idle(view.uid, row_version=row.row_version))

    def _delete_pod(self, name: str, uid: str) -> None:
        from kubernetes import client

        try:
            self.core.delete_namespaced_pod(name, self.namespace, body=client.V1DeleteOptions(
                preconditions=client.V1Preconditions(uid=uid)), _request_timeout=self._timeout)
        except Exception as exc:  # noqa: BLE001 - 404 gone, 409 another pod under the name: done
            if getattr(exc, "status", None) not in (404, 409):
                raise

    def _forget_rows(self, rows: Iterable[Any], views: Mapping[str, PodView], now: datetime,
                     report: TickReport) -> None:
        """Delete the ledger rows of pods the synced cache no longer shows (any job's: the pod is gone), once they
        registered more than :data:`EXPECTATION_TTL_SECONDS` ago (a pod seen by the API server before this cache),
        and never one this runtime holds an attempt on (its presence reads the pod gone first)."""
        held = self._held()
        for row in rows:
            view = views.get(row.pod_name)
            if view is not None and view.uid == row.pod_uid:
                continue
            if row.pod_uid in held or (now - row.registered_at).total_seconds() < EXPECTATION_TTL_SECONDS:
                continue
            try:
                if self.ledger.forget(row.pod_uid):
                    report.forgotten.append(row.pod_name)
            except Exception as exc:  # noqa: BLE001
                report.errors.append(f"forget {row.pod_name}: {_short(exc)}")

    def row(self, pod_uid: str) -> tuple[Any, float]:
        """The last tick's ledger row of ``pod_uid`` (None: none) and when the rows' read started; any thread."""
        with self._lock:
            return self._by_uid.get(pod_uid), self.rows_read_at

    def set_rows(self, rows: list[Any], read_at: float) -> None:
        """Keep ``rows`` (the ledger's warm rows of the namespace, read from ``read_at``, ``monotonic()``) for
        placement and the attempt side; any thread."""
        with self._lock:
            self.rows, self.rows_read_at = list(rows), read_at
            self._by_uid = {r.pod_uid: r for r in rows}

    def read_rows(self) -> tuple[list[Any], float]:
        """The last tick's ledger rows and when their read started (``monotonic()``); any thread."""
        with self._lock:
            return list(self.rows), self.rows_read_at


def _short(exc: BaseException) -> str:
    code = getattr(exc, "status", None)
    text = f"HTTP {code} {getattr(exc, 'reason', '')}".strip() if isinstance(code, int) and code else str(exc)
    return f"{type(exc).__name__}: {text}"[:300]
