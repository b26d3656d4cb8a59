"""The pod of one attempt: a pure builder from the attempt's identity, the ``[leoflow]`` Kubernetes options,
the operator's pod template and the task's ``executor_config`` to a ``kubernetes.client.V1Pod`` (DESIGN §3
"Dispatch" and "The pod, as built").

Layers, as the cncf KubernetesExecutor (KE) applies them (:mod:`.merge`): the pod template, then leoflow's own
pod, then the task's ``executor_config["pod_override"]`` (every field it sets must be in ``[leoflow]
pod_override_allow``), then Airflow's ``pod_mutation_hook``, then leoflow's plugins' ``leoflow_mutate_pod``
(:mod:`leoflow_airflow.hookspecs`). Then leoflow sets again what it pins, so no layer can change it:

* name ``<dag-task slug>-<ti_id hex>-<epoch>``, one per (ti_id, epoch), a DNS-1123 label;
* the ``app.kubernetes.io/*`` labels, the installation label :data:`INSTANCE_LABEL` (``[leoflow] instance``, k8s
  review §5), leoflow's attempt labels (values made label-safe, hashed when cut) and
  the identity annotation ``leoflow.io/attempt`` (:mod:`.identity`: the one format the token exchange parses).
  Every ``leoflow.io/*`` label and annotation and every ``app.kubernetes.io/*`` label leoflow sets
  (:func:`is_leoflow_key`) is leoflow's alone: the template's and the hooks' (operator code, as for every other
  pin) are replaced by leoflow's, and a ``pod_override`` (a DAG author's) that sets one to another value
  (``leoflow.io/warm``, say) refuses the pod naming it, so a task pod can never pass for a warm pod or another
  attempt's (k8s review §1);
* the finalizer :data:`OUTCOME_FINALIZER` (other finalizers are kept): the pod, and with it the outcome record
  in its termination message, outlives any delete (PodGC's, a user's, a kill's) until the runtime has read it
  and the attempt is settled (issue 10 item 4; the Job controller's ``batch.kubernetes.io/job-tracking``);
* ``restartPolicy: Never``; ``serviceAccountName`` ``[leoflow] service_account`` and
  ``automountServiceAccountToken: false``, with exactly one projected ServiceAccount token (audience ``[leoflow]
  exchange_audience``, 600 s, rotated by the kubelet) mounted read-only into the agent container only: the
  account and audience the exchange accepts, read from the same settings;
* a security context that passes the ``restricted`` Pod Security level: ``runAsNonRoot``, seccomp
  ``RuntimeDefault`` (``Localhost`` kept), and on every container ``allowPrivilegeEscalation: false``,
  ``privileged: false``, capabilities ``drop: [ALL]``. What a layer adds beyond that (``runAsUser: 0``, added
  capabilities, a ``hostPath`` volume) is left for the API server's admission to judge;
* the agent container ``base`` (first, as KE's), its arguments ``python -m leoflow_agent pod`` (its command is
  the image's entrypoint unless a template sets one), ``terminationMessagePath: /dev/termination-log`` with
  policy ``File``, and the agent's environment: the exchange URL, the token file, the termination-message
  byte budget and the credential ceiling. No workload, token, DB URL, fernet key or JWT secret: a pod whose
  environment names one of Airflow's own secrets is refused;
* ``activeDeadlineSeconds`` no longer than ``[leoflow] credential_ceiling_seconds`` (a shorter one is kept).

Refused whatever the layer (k8s review §9): an environment variable ``[leoflow] agent_env_deny`` names, and a
container other than the agent's (an init container included) that mounts the exchange token volume. Refused
unless the pod template has the same reference, or ``[leoflow] pod_secret_allow`` names the Secret: a Secret
reference (``env[].valueFrom.secretKeyRef``, ``envFrom[].secretRef``, a ``secret`` volume, a projected volume's
``secret`` source, :func:`secret_refs`) that a ``pod_override`` or a hook brought in. The template is the
operator's (the README's remote-logging credentials are a template ``secretKeyRef``); a DAG author's override is
not, and a hook gets no more than it.

Not pinned: the scheduler's ``[logging]`` remote-logging options (``build_pod``'s ``forward_env``,
:mod:`.logenv`), added to the agent container after the hooks unless a layer sets that variable itself.

Pure: no I/O, no Airflow import. The pod template is read by :mod:`.template`, which also hands over
Airflow's ``pod_mutation_hook``; the caller passes both in.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kubernetes.client import models as k8s

from leoflow_agent.outcome import MIN_TERMINATION_MESSAGE_BUDGET
from leoflow_airflow import __version__
from leoflow_airflow.errors import PodRefused
from leoflow_airflow.ledger.states import AttemptRef
from leoflow_airflow.runtime.environment import withheld
from leoflow_airflow.runtime.kubernetes.fields import allowed, check_path, set_paths
from leoflow_airflow.runtime.kubernetes.identity import (
    IDENTITY_ANNOTATION,
    identity_annotation,
    parse_identity_annotation,
)
from leoflow_airflow.runtime.kubernetes.merge import merge_pods

if TYPE_CHECKING:
    from leoflow_airflow.settings import KubernetesSettings

__all__ = [
    "AGENT_ARGS",
    "AGENT_CONTAINER",
    "INSTANCE_LABEL",
    "OUTCOME_FINALIZER",
    "PINNED_PATHS",
    "TERMINATION_MESSAGE_PATH",
    "TOKEN_EXPIRATION_SECONDS",
    "TOKEN_FILE",
    "PodAttempt",
    "SecretRef",
    "allow_entry_problem",
    "attempt_labels",
    "build_pod",
    "forward_environment",
    "is_attempt_pod",
    "is_leoflow_key",
    "label_value",
    "pod_name",
    "secret_refs",
    "termination_budget",
]

AGENT_CONTAINER = "base"
"""Name of the agent container, always the first (KE's name: templates written for KE keep working)."""
AGENT_ARGS = ("python", "-m", "leoflow_agent", "pod")
"""The agent container's arguments (KE likewise sets only ``args``); nothing else, and nothing secret."""

TERMINATION_MESSAGE_PATH = "/dev/termination-log"
TERMINATION_MESSAGE_POLICY = "File"
"""``File``: the message is the record the agent wrote, or empty; never a log tail."""

TOKEN_VOLUME = "leoflow-token"
TOKEN_DIR = "/var/run/secrets/leoflow"
TOKEN_FILE = f"{TOKEN_DIR}/token"
TOKEN_EXPIRATION_SECONDS = 600
"""The projected token's requested life: Kubernetes' minimum. The kubelet rewrites the file at 80 % of it, and
the agent reads it once, at exchange, so a short life only narrows what a leaked copy is worth."""

KUBELET_MESSAGE_MAX = 4096
"""The kubelet keeps the last 4096 bytes of a termination-message file (``MaxContainerTerminationMessageLength``)."""
KUBELET_POD_MESSAGE_MAX = 12288
"""… and cuts every container's message to 12288 / (containers + initContainers + ephemeralContainers) bytes."""
DEBUG_CONTAINER_RESERVE = 1
"""Containers counted on top of the pod's own, for an ephemeral debug container added later
(``kubectl debug``), which shrinks every message's share after the fact."""

OUTCOME_FINALIZER = "leoflow.io/outcome-record"
"""The finalizer every task pod carries: Kubernetes keeps a deleted pod (``deletionTimestamp`` set, status
intact) until it is removed, and leoflow removes it only once the attempt's ledger row is closed and the pod is
terminal or deleting (:func:`~leoflow_airflow.runtime.kubernetes.decide.release_due`), so the termination
message is never taken away unread. ``airflow leoflow release-pods`` strips it for an uninstall."""

APP_LABELS = {
    "app.kubernetes.io/name": "leoflow",
    "app.kubernetes.io/component": "task-attempt",
    "app.kubernetes.io/part-of": "airflow",
    "app.kubernetes.io/managed-by": "leoflow",
}
LABEL_PREFIX = "leoflow.io/"
INSTANCE_LABEL = LABEL_PREFIX + "instance"
"""The installation label, ``[leoflow] instance``'s value, on every task pod, warm pod and warm anchor leoflow makes
and in every selector it lists or watches with, so two installations sharing a task namespace never list, adopt,
release or delete each other's objects (k8s review §5). A ``leoflow.io/*`` key: pinned like the others."""
APP_LABEL_KEYS = frozenset({*APP_LABELS, "app.kubernetes.io/version"})
"""The ``app.kubernetes.io/*`` label keys leoflow sets (:func:`attempt_labels`); others of that prefix (an
operator's ``app.kubernetes.io/instance``) are not leoflow's."""

ENV_EXCHANGE_URL = "LEOFLOW_EXCHANGE_URL"
ENV_TOKEN_FILE = "LEOFLOW_TOKEN_FILE"
ENV_MESSAGE_BUDGET = "LEOFLOW_TERMINATION_MESSAGE_BUDGET"
ENV_CEILING = "LEOFLOW_CREDENTIAL_CEILING_SECONDS"
ENV_LEASE = "LEOFLOW_AGENT_LEASE_SECONDS"  # [leoflow] agent_lease_seconds (leoflow_agent.lease; k8s review §14)
AGENT_ENV = (ENV_EXCHANGE_URL, ENV_TOKEN_FILE, ENV_MESSAGE_BUDGET, ENV_CEILING, ENV_LEASE)
"""What the agent container's environment carries from leoflow, all of it public."""

_SECURITY_PINS = ("allowPrivilegeEscalation", "privileged", "capabilities.drop", "runAsNonRoot", "seccompProfile")
PINNED_PATHS: tuple[str, ...] = (
    "apiVersion", "kind", "status",
    "metadata.name", "metadata.generateName", "metadata.namespace",
    "spec.restartPolicy", "spec.automountServiceAccountToken", "spec.serviceAccountName", "spec.serviceAccount",
    "spec.securityContext.runAsNonRoot", "spec.securityContext.seccompProfile",
    "spec.containers.args", "spec.containers.terminationMessagePath", "spec.containers.terminationMessagePolicy",
    *(f"spec.containers.securityContext.{p}" for p in _SECURITY_PINS),
    *(f"spec.initContainers.securityContext.{p}" for p in _SECURITY_PINS),
)
"""Field paths leoflow sets on every pod whatever the layers say; ``[leoflow] pod_override_allow`` cannot list
them (or anything below them). For ``spec.containers`` they are pinned on the agent container (args,
termination message) or on every container (security context)."""

_ALWAYS_ALLOWED = ("spec.containers.name", "apiVersion", "kind")
"""Set by every ``V1Container`` (the client requires it; containers merge by position, so it names nothing),
and the pod's own type (``V1Pod(api_version="v1", kind="Pod", ...)``), which leoflow sets anyway."""

_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
_NOT_LABEL_CHAR = re.compile(r"[^-A-Za-z0-9_.]+")
_NOT_DNS_CHAR = re.compile(r"[^a-z0-9]+")
_MAX_NAME = 63


@dataclass(frozen=True, slots=True)
class PodAttempt:
    """The identity of one attempt as its pod carries it (DESIGN §2 "Attempt").

    :param ti_id: Airflow's ``TaskInstance.id`` (a UUID, text).
    :param try_number: Airflow's try number.
    :param attempt_epoch: leoflow's epoch of this ``ti_id`` (1 for the first dispatch).
    :param dag_id, task_id, run_id: the logical task instance.
    :param map_index: ``-1`` when not mapped.
    """

    ti_id: str
    try_number: int
    attempt_epoch: int
    dag_id: str
    task_id: str
    run_id: str
    map_index: int = -1

    @property
    def ref(self) -> AttemptRef:
        """The attempt's identity (ti_id, try_number, attempt_epoch) as the ledger and the exchange name it, the
        ``ti_id`` in the canonical ``str(uuid)`` form (lower-case, hyphenated) whatever its spelling here.

        :raises ValueError: when ``ti_id`` is not a UUID (as :func:`pod_name` does)."""
        return AttemptRef(str(uuid.UUID(self.ti_id)), self.try_number, self.attempt_epoch)


def label_value(text: str) -> str:
    """``text`` as a Kubernetes label value: unchanged when it already is one (≤ 63 characters of
    ``[-A-Za-z0-9_.]``, alphanumeric at both ends); otherwise its label-safe characters cut to fit, then ``-``
    and 10 hex digits of its SHA-256, so two different texts never share a value by being cut alike."""
    if len(text) <= _MAX_NAME and _LABEL_VALUE.fullmatch(text):
        return text
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:10]
    head = _NOT_LABEL_CHAR.sub("-", text)[: _MAX_NAME - len(digest) - 1].strip("-_.")
    return f"{head}-{digest}" if head else digest


def pod_name(attempt: PodAttempt) -> str:
    """The attempt's pod name: ``<slug>-<ti_id as 32 hex digits>-<epoch>``, where the slug is ``dag_id-task_id``
    in lower-case letters, digits and dashes, cut to fit 63 characters (``leoflow`` when nothing is left).

    The same (ti_id, epoch) always gives the same name, so a create that is sent twice meets its own pod (409),
    and a new epoch never does. :raises ValueError: when ``ti_id`` is not a UUID.
    """
    suffix = f"{uuid.UUID(attempt.ti_id).hex}-{attempt.attempt_epoch}"
    room = _MAX_NAME - len(suffix) - 1
    slug = _NOT_DNS_CHAR.sub("-", f"{attempt.dag_id}-{attempt.task_id}".lower())[:room].strip("-")
    return f"{slug or 'leoflow'}-{suffix}"


def attempt_labels(attempt: PodAttempt, *, instance: str) -> dict[str, str]:
    """The labels of the attempt's pod: ``app.kubernetes.io/*`` (name, component, part-of, managed-by,
    version), :data:`INSTANCE_LABEL` ``instance`` (``[leoflow] instance``, k8s review §5) and
    ``leoflow.io/{ti-id,try-number,attempt-epoch,dag-id,task-id,run-id}`` plus ``map-index`` when
    mapped. Values go through :func:`label_value`; the identity annotation (:mod:`.identity`) keeps the
    attempt's identity unabridged, and the ledger row of that ``ti_id`` the rest."""
    labels = {**APP_LABELS, "app.kubernetes.io/version": label_value(__version__),
              INSTANCE_LABEL: label_value(instance)}
    fields = {
        "ti-id": attempt.ti_id,
        "try-number": str(attempt.try_number),
        "attempt-epoch": str(attempt.attempt_epoch),
        "dag-id": attempt.dag_id,
        "task-id": attempt.task_id,
        "run-id": attempt.run_id,
    }
    if attempt.map_index >= 0:
        fields["map-index"] = str(attempt.map_index)
    labels.update({LABEL_PREFIX + k: label_value(v) for k, v in fields.items()})
    return labels


def is_leoflow_key(key: str) -> bool:
    """Whether a label or annotation ``key`` is leoflow's own: any ``leoflow.io/*`` key, or one of the
    ``app.kubernetes.io/*`` keys leoflow sets (:data:`APP_LABEL_KEYS`). Only leoflow's own code sets these on a
    pod (k8s review §1): the warm informer's selector, the warm registration and the exchange trust them."""
    return key.startswith(LABEL_PREFIX) or key in APP_LABEL_KEYS


def is_attempt_pod(metadata: k8s.V1ObjectMeta | None, attempt: PodAttempt) -> bool:
    """Whether a pod with ``metadata`` (read back from the API server) is ``attempt``'s own: its name is the
    attempt's pod name and its identity annotation names the attempt (parsed as the token exchange parses it,
    :func:`~leoflow_airflow.runtime.kubernetes.identity.parse_identity_annotation`). What a 409 on create asks
    for (:class:`~leoflow_airflow.runtime.kubernetes.classify.VerdictKind` ``CHECK_EXISTING``); the caller then
    keeps that pod's UID."""
    if metadata is None or metadata.name != pod_name(attempt):
        return False
    return parse_identity_annotation((metadata.annotations or {}).get(IDENTITY_ANNOTATION)) == attempt.ref


def allow_entry_problem(entry: str) -> str | None:
    """What is wrong with one ``[leoflow] pod_override_allow`` entry, or ``None``: it must name a pod field
    (:func:`~leoflow_airflow.runtime.kubernetes.fields.check_path`) that is neither pinned nor below a pinned
    one (:data:`PINNED_PATHS`). An ancestor of a pinned field (``spec``) is allowed; the pinned fields below it
    are set again after the override."""
    if (problem := check_path(entry)) is not None:
        return f"{entry!r}: {problem}"
    for pin in PINNED_PATHS:
        if entry == pin or entry.startswith(pin + "."):
            return f"{entry!r} is pinned by leoflow and cannot be overridden"
    return None


def termination_budget(pod: k8s.V1Pod) -> int:
    """Bytes the agent may write to its termination message in ``pod``:
    ``min(4096, 12288 // (containers + initContainers + ephemeralContainers + 1))``, the 1 being room for a
    debug container added later (the kubelet's limits in kubernetes ``pkg/kubelet/container/runtime.go``, its
    per-container cut in ``pkg/kubelet/status/status_manager.go`` ``normalizeStatus``; DESIGN §4)."""
    spec = pod.spec
    count = sum(len(getattr(spec, f) or []) for f in ("containers", "init_containers", "ephemeral_containers"))
    return min(KUBELET_MESSAGE_MAX, KUBELET_POD_MESSAGE_MAX // (count + DEBUG_CONTAINER_RESERVE))


def build_pod(
    attempt: PodAttempt,
    settings: KubernetesSettings,
    *,
    template: k8s.V1Pod | None = None,
    executor_config: Mapping[str, Any] | None = None,
    mutation_hook: Callable[[k8s.V1Pod], Any] | None = None,
    plugin_hook: Callable[[k8s.V1Pod, PodAttempt], Any] | None = None,
    forward_env: Mapping[str, str] | None = None,
) -> k8s.V1Pod:
    """Build the pod of ``attempt`` (module docstring: layers, pins).

    :param attempt: whose pod it is.
    :param settings: the ``[leoflow]`` Kubernetes options (``exchange_url`` already derived).
    :param template: the operator's pod template (``template.load_pod_template``), not modified.
    :param executor_config: the task's ``executor_config``; its ``pod_override`` (a ``V1Pod``) is merged.
    :param mutation_hook: called with the merged pod to change it in place (Airflow's ``pod_mutation_hook``).
    :param plugin_hook: called after ``mutation_hook`` with the pod and ``attempt`` (leoflow's plugins'
        ``leoflow_mutate_pod``, :mod:`leoflow_airflow.hookspecs`); what it changes of the pins is set again.
    :param forward_env: variables for the agent container that every layer may override (the scheduler's
        remote-logging settings, :func:`.logenv.logging_env`): each is added after the hooks unless the
        container already sets that name (:func:`forward_environment`).
    :returns: a new ``V1Pod`` ready to create in ``settings.namespace``.
    :raises PodRefused: naming the field: an ``executor_config`` it cannot use, a ``pod_override`` field outside
        ``settings.pod_override_allow`` (or a container added without ``spec.containers`` allowed), a
        ``pod_override`` that sets one of leoflow's labels or annotations (``metadata.labels.<key>``), a hook
        that raised, a Secret reference that neither the template has nor ``settings.pod_secret_allow``
        names, a second ServiceAccount token volume, a container other than the agent's that mounts the token,
        an environment variable that is one of Airflow's own secrets or ``settings.agent_env_deny`` names, or so
        many containers that the termination message leaves fewer than ``MIN_TERMINATION_MESSAGE_BUDGET`` bytes
        for the record.
    """
    override = _pod_override(executor_config)
    base = merge_pods(template, _leoflow_layer(attempt, settings))
    operator_refs = frozenset(secret_refs(base))  # the template's: leoflow's layer references no Secret
    if override is not None:
        _check_override(override, base, settings.pod_override_allow)
        _check_leoflow_keys(override.metadata, attempt, settings.instance, "the pod_override")
    pod = merge_pods(base, override)
    _pin(pod, attempt, settings)
    if mutation_hook is not None:
        try:
            mutation_hook(pod)
        except Exception as exc:  # operator code: any error refuses this pod, as KE fails the task
            raise PodRefused("pod_mutation_hook", f"raised {type(exc).__name__}: {exc}") from exc
        _pin(pod, attempt, settings)
    if plugin_hook is not None:
        try:
            plugin_hook(pod, attempt)
        except Exception as exc:  # a plugin's policy that could not run never lets the pod through
            raise PodRefused("leoflow_mutate_pod", f"raised {type(exc).__name__}: {exc}") from exc
        _pin(pod, attempt, settings)
    deny = settings.agent_env_deny
    forward_environment(pod, {k: v for k, v in (forward_env or {}).items() if not withheld(k, deny)})
    _check_final(pod, settings, operator_refs)
    return pod


def forward_environment(pod: k8s.V1Pod, env: Mapping[str, str]) -> None:
    """Add ``env`` to the agent container of ``pod`` (in place), each variable only when the container does not
    set that name already: the pod template, a ``pod_override`` or a hook that sets one (a value, or a
    ``valueFrom`` such as a ``secretKeyRef``) wins, as a KubernetesExecutor worker's template is its whole
    configuration (DESIGN "Task logs"). Added in ``env``'s order, after the container's own."""
    if not env:
        return
    agent = pod.spec.containers[0]
    have = {e.name for e in agent.env or []}
    agent.env = [*(agent.env or []), *(k8s.V1EnvVar(name=k, value=v) for k, v in env.items() if k not in have)]


# --------------------------------------------------------------------------------------------------
# layers


def _pod_override(executor_config: Mapping[str, Any] | None) -> k8s.V1Pod | None:
    """The ``pod_override`` of ``executor_config``, or ``None``. Other keys are left to other executors, except
    KE's that leoflow does not take (a per-task ``pod_template_file``, the legacy ``KubernetesExecutor`` dict)."""
    if not executor_config:
        return None
    if not isinstance(executor_config, Mapping):
        raise PodRefused("executor_config", f"must be a dict, got {type(executor_config).__name__}")
    if "pod_template_file" in executor_config:
        raise PodRefused("executor_config.pod_template_file", "a per-task pod template is not supported; use "
                         "[leoflow] pod_template_file and an executor_config pod_override")
    if "KubernetesExecutor" in executor_config:
        raise PodRefused("executor_config.KubernetesExecutor", "the Airflow 1 executor_config form is not "
                         "supported; use executor_config={'pod_override': V1Pod(...)}")
    override = executor_config.get("pod_override")
    if override is None:
        return None
    if not isinstance(override, k8s.V1Pod):
        raise PodRefused("executor_config.pod_override",
                         f"must be a kubernetes.client.models.V1Pod, got {type(override).__name__}")
    return override


def _leoflow_layer(attempt: PodAttempt, settings: KubernetesSettings) -> k8s.V1Pod:
    """leoflow's own layer, between the template and the override: what an override may change (the image)
    and what a ``pod_mutation_hook`` expects to see (name, labels, the ``base`` container and its arguments)."""
    return k8s.V1Pod(
        api_version="v1", kind="Pod",
        metadata=k8s.V1ObjectMeta(name=pod_name(attempt), namespace=settings.namespace,
                                  labels=attempt_labels(attempt, instance=settings.instance),
                                  annotations={IDENTITY_ANNOTATION: identity_annotation(attempt.ref)}),
        spec=k8s.V1PodSpec(containers=[k8s.V1Container(name=AGENT_CONTAINER, image=settings.image or None,
                                                       args=list(AGENT_ARGS))]),
    )


def _check_override(override: k8s.V1Pod, base: k8s.V1Pod, allow: tuple[str, ...]) -> None:
    """Refuse the first field ``override`` sets that ``allow`` does not cover, and a container it adds
    unless ``spec.containers`` itself is allowed."""
    for path in set_paths(override):
        if not allowed(path, allow) and path not in _ALWAYS_ALLOWED:
            raise PodRefused(path, "this pod_override field is not in [leoflow] pod_override_allow; the "
                             "operator may add it there, or the task must not set it")
    added = len((override.spec and override.spec.containers) or []) - len(base.spec.containers or [])
    if added > 0 and not allowed("spec.containers", allow):
        raise PodRefused("spec.containers", f"the pod_override adds {added} container(s); adding containers "
                         "needs `spec.containers` in [leoflow] pod_override_allow")


def _check_leoflow_keys(meta: k8s.V1ObjectMeta | None, attempt: PodAttempt, instance: str, who: str) -> None:
    """Refuse ``meta`` (a ``pod_override``'s) when it sets a leoflow key (:func:`is_leoflow_key`) to anything but
    the value leoflow gives it for ``attempt`` in installation ``instance``: a task pod that carried
    ``leoflow.io/warm`` or another version's ``leoflow.io/dag-version`` would pass for a warm pod (k8s review §1),
    one with another ``leoflow.io/instance`` for another installation's (k8s review §5).
    The same value is no change and passes. ``who`` names the layer in the message."""
    if meta is None:
        return
    ours = {
        "labels": attempt_labels(attempt, instance=instance),
        "annotations": {IDENTITY_ANNOTATION: identity_annotation(attempt.ref)},
    }
    for field in ("labels", "annotations"):
        for key, value in (getattr(meta, field) or {}).items():
            if is_leoflow_key(key) and ours[field].get(key) != value:
                raise PodRefused(f"metadata.{field}.{key}", f"{who} sets {key}={str(value)[:80]!r}; leoflow.io/* "
                                 "and leoflow's app.kubernetes.io/* keys are leoflow's alone, set by leoflow")


# --------------------------------------------------------------------------------------------------
# pins


def _pin(pod: k8s.V1Pod, attempt: PodAttempt, settings: KubernetesSettings) -> None:
    """Set on ``pod``, in place, everything leoflow pins (module docstring). Idempotent."""
    pod.api_version, pod.kind, pod.status = "v1", "Pod", None
    meta = pod.metadata = pod.metadata or k8s.V1ObjectMeta()
    meta.name, meta.generate_name, meta.namespace = pod_name(attempt), None, settings.namespace
    meta.labels = {**_not_leoflow(meta.labels), **attempt_labels(attempt, instance=settings.instance)}
    meta.annotations = {**_not_leoflow(meta.annotations), IDENTITY_ANNOTATION: identity_annotation(attempt.ref)}
    meta.finalizers = [f for f in meta.finalizers or [] if f != OUTCOME_FINALIZER] + [OUTCOME_FINALIZER]

    spec = pod.spec = pod.spec or k8s.V1PodSpec(containers=[])
    spec.restart_policy = "Never"
    spec.automount_service_account_token = False
    spec.service_account_name, spec.service_account = settings.service_account, None
    spec.security_context = _pod_security(spec.security_context)
    spec.volumes = [v for v in spec.volumes or [] if v.name != TOKEN_VOLUME] + [_token_volume(settings)]
    if settings.credential_ceiling_seconds > 0:
        asked = spec.active_deadline_seconds
        spec.active_deadline_seconds = min(asked or settings.credential_ceiling_seconds,
                                           settings.credential_ceiling_seconds)

    if not spec.containers:
        spec.containers = [k8s.V1Container(name=AGENT_CONTAINER, image=settings.image or None)]
    for container in [*spec.containers, *(spec.init_containers or [])]:
        container.security_context = _container_security(container.security_context)
    agent = spec.containers[0]
    agent.name, agent.args = AGENT_CONTAINER, list(AGENT_ARGS)
    agent.termination_message_path, agent.termination_message_policy = (TERMINATION_MESSAGE_PATH,
                                                                         TERMINATION_MESSAGE_POLICY)
    agent.volume_mounts = [m for m in agent.volume_mounts or []
                           if m.name != TOKEN_VOLUME and m.mount_path != TOKEN_DIR]
    agent.volume_mounts.append(k8s.V1VolumeMount(name=TOKEN_VOLUME, mount_path=TOKEN_DIR, read_only=True))
    ours = {
        ENV_EXCHANGE_URL: settings.exchange_url,
        ENV_TOKEN_FILE: TOKEN_FILE,
        ENV_MESSAGE_BUDGET: str(termination_budget(pod)),
        ENV_CEILING: str(settings.credential_ceiling_seconds),
        ENV_LEASE: f"{settings.agent_lease_seconds:g}",
    }
    agent.env = [e for e in agent.env or [] if e.name not in ours]
    agent.env.extend(k8s.V1EnvVar(name=k, value=v) for k, v in ours.items())


def _not_leoflow(keys: Mapping[str, str] | None) -> dict[str, str]:
    """``keys`` (labels or annotations) without leoflow's own (:func:`is_leoflow_key`): a template's or a hook's
    are replaced by what leoflow sets, never kept beside it (k8s review §1)."""
    return {k: v for k, v in (keys or {}).items() if not is_leoflow_key(k)}


def _token_volume(settings: KubernetesSettings) -> k8s.V1Volume:
    return k8s.V1Volume(name=TOKEN_VOLUME, projected=k8s.V1ProjectedVolumeSource(sources=[
        k8s.V1VolumeProjection(service_account_token=k8s.V1ServiceAccountTokenProjection(
            audience=settings.exchange_audience, expiration_seconds=TOKEN_EXPIRATION_SECONDS, path="token")),
    ]))


def _seccomp(profile: k8s.V1SeccompProfile | None, *, default: bool) -> k8s.V1SeccompProfile | None:
    """``profile`` when ``RuntimeDefault`` or ``Localhost``; else ``RuntimeDefault`` for a pod (``default``)
    and nothing for a container (the pod's then applies)."""
    if profile is not None and profile.type in ("RuntimeDefault", "Localhost"):
        return profile
    return k8s.V1SeccompProfile(type="RuntimeDefault") if default else None


def _pod_security(sc: k8s.V1PodSecurityContext | None) -> k8s.V1PodSecurityContext:
    sc = sc or k8s.V1PodSecurityContext()
    sc.run_as_non_root = True
    sc.seccomp_profile = _seccomp(sc.seccomp_profile, default=True)
    return sc


def _container_security(sc: k8s.V1SecurityContext | None) -> k8s.V1SecurityContext:
    sc = sc or k8s.V1SecurityContext()
    sc.allow_privilege_escalation = False
    sc.privileged = False
    caps = sc.capabilities or k8s.V1Capabilities()
    caps.drop = ["ALL"]
    sc.capabilities = caps
    if sc.run_as_non_root is not None:
        sc.run_as_non_root = True
    sc.seccomp_profile = _seccomp(sc.seccomp_profile, default=False)
    return sc


# --------------------------------------------------------------------------------------------------
# final checks


@dataclass(frozen=True, slots=True)
class SecretRef:
    """One route by which a Secret's data reaches a pod's containers (k8s review §9).

    :param field: the pod field path, as a refusal names it (``spec.containers.env.valueFrom.secretKeyRef``,
        ``spec.initContainers.envFrom.secretRef``, ``spec.volumes.secret``, ``spec.volumes.projected.sources.secret``).
    :param where: the container and variable, or the volume, that carries it (``container 'base' env AWS_KEY``).
    :param secret: the Secret's name.
    :param detail: the rest of the reference (the key, the prefix, the projected items), so that the same Secret
        reached another way is another reference.
    """

    field: str
    where: str
    secret: str
    detail: str = ""


def secret_refs(pod: k8s.V1Pod) -> list[SecretRef]:
    """Every Secret reference of ``pod``, in pod order: each container's and init container's
    ``env[].valueFrom.secretKeyRef`` and ``envFrom[].secretRef``, each ``secret`` volume and each ``secret`` source
    of a ``projected`` volume. Pure; a reference without a Secret name is listed with ``secret`` ``""``."""
    refs: list[SecretRef] = []
    spec = pod.spec
    if spec is None:
        return refs
    for kind, path in (("containers", "spec.containers"), ("init_containers", "spec.initContainers")):
        for container in getattr(spec, kind) or []:
            for env in container.env or []:
                ref = env.value_from.secret_key_ref if env.value_from else None
                if ref is not None:
                    refs.append(SecretRef(f"{path}.env.valueFrom.secretKeyRef",
                                          f"container {container.name!r} env {env.name}", ref.name or "", ref.key))
            for source in container.env_from or []:
                if source.secret_ref is not None:
                    refs.append(SecretRef(f"{path}.envFrom.secretRef", f"container {container.name!r} envFrom",
                                          source.secret_ref.name or "", source.prefix or ""))
    for volume in spec.volumes or []:
        if volume.secret is not None:
            refs.append(SecretRef("spec.volumes.secret", f"volume {volume.name!r}", volume.secret.secret_name or "",
                                  _items(volume.secret.items)))
        for source in (volume.projected.sources or []) if volume.projected else []:
            if source.secret is not None:
                refs.append(SecretRef("spec.volumes.projected.sources.secret", f"volume {volume.name!r}",
                                      source.secret.name or "", _items(source.secret.items)))
    return refs


def _items(items: list[k8s.V1KeyToPath] | None) -> str:
    return ",".join(sorted(f"{i.key}={i.path}" for i in items or []))


def _check_final(pod: k8s.V1Pod, settings: KubernetesSettings, operator_refs: frozenset[SecretRef]) -> None:
    """Refuse what no pin can mend: a second ServiceAccount token, or the token mounted by another container
    than the agent's; a Secret reference that is not in ``operator_refs`` (the template's) and names no Secret of
    ``settings.pod_secret_allow``; Airflow's own secrets or ``settings.agent_env_deny`` names in the environment;
    and a termination message too small for a record (k8s review §9)."""
    for volume in pod.spec.volumes or []:
        sources = (volume.projected.sources or []) if volume.projected else []
        if volume.name != TOKEN_VOLUME and any(s.service_account_token for s in sources):
            raise PodRefused("spec.volumes", f"volume {volume.name!r} projects a ServiceAccount token; the pod "
                             f"carries exactly one, leoflow's {TOKEN_VOLUME!r}, and no other credential")
    for ref in secret_refs(pod):
        if ref not in operator_refs and ref.secret not in settings.pod_secret_allow:
            raise PodRefused(ref.field, f"{ref.where} references Secret {ref.secret!r}, which the pod template does "
                             "not and [leoflow] pod_secret_allow does not name; a pod_override or hook may reference "
                             "only the Secrets the operator allows there")
    deny = settings.agent_env_deny
    for field in ("containers", "init_containers"):
        path = "spec.initContainers" if field == "init_containers" else "spec.containers"
        for index, container in enumerate(getattr(pod.spec, field) or []):
            for env in container.env or []:
                if withheld(env.name, deny):
                    raise PodRefused(f"{path}.env", f"{env.name} (container {container.name!r}) is one of Airflow's "
                                     "own secrets or process markers, or [leoflow] agent_env_deny names it; a task "
                                     "pod never carries it")
            if field == "containers" and index == 0:
                continue
            if any(m.name == TOKEN_VOLUME for m in container.volume_mounts or []):
                raise PodRefused(f"{path}.volumeMounts", f"container {container.name!r} mounts {TOKEN_VOLUME!r}; "
                                 "the exchange token is the agent container's alone")
    budget = termination_budget(pod)
    if budget < MIN_TERMINATION_MESSAGE_BUDGET:
        raise PodRefused("spec.containers", f"the pod's containers leave the termination message {budget} "
                         f"bytes, fewer than the {MIN_TERMINATION_MESSAGE_BUDGET} an outcome record needs; use "
                         "fewer containers or init containers")
