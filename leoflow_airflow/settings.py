"""The ``[leoflow]`` config section: one table of options (the provider's defaults come from it too) and
its parse into a frozen :class:`LeoflowSettings`.

Every option is read through Airflow's config (so ``AIRFLOW__LEOFLOW__*`` env vars and ``airflow.cfg`` both
work) and validated here; a malformed value raises :class:`~leoflow_airflow.errors.ConfigError` naming the
key and the value, before anything is started.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, replace
from typing import Any, Callable

from leoflow_airflow.errors import ConfigError

SECTION = "leoflow"


@dataclass(frozen=True)
class Option:
    """One ``[leoflow]`` option: name, type (``string``/``integer``/``float``/``boolean``), default, help."""

    name: str
    type: str
    default: str
    description: str
    check: Callable[[Any], str | None] | None = None


def _positive(v: float) -> str | None:
    return None if v > 0 else "must be greater than 0"


def _exchange_timeout(v: float) -> str | None:
    """``exchange_timeout_seconds``: > 0, and two such calls plus the server's slack must end before the task pod's
    agent stops waiting for the answer (k8s review §4: a lost answer spends a retry)."""
    from leoflow_agent.podmain import EXCHANGE_SERVER_SLACK_SECONDS, REQUEST_TIMEOUT_SECONDS

    most = (REQUEST_TIMEOUT_SECONDS - EXCHANGE_SERVER_SLACK_SECONDS) / 2
    if not 0 < v <= most:
        return (f"must be greater than 0 and at most {most:g}: the exchange makes two Kubernetes calls of this "
                f"long each, and the task pod's agent waits {REQUEST_TIMEOUT_SECONDS:g} s for the whole answer")
    return None


def _non_negative(v: float) -> str | None:
    return None if v >= 0 else "must be 0 or more"


def _api_workers(v: int) -> str | None:
    return None if 1 <= v <= 64 else "must be from 1 to 64"


_MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


def _module_list(v: str) -> str | None:
    bad = [n for n in _split_names(v) if not _MODULE_NAME.fullmatch(n)]
    return f"{bad[0]!r} is not a dotted module name" if bad else None


def _deny_list(v: str) -> str | None:
    from leoflow_airflow.runtime.environment import deny_entry_problem

    problems = [p for n in _split_names(v) if (p := deny_entry_problem(n)) is not None]
    return problems[0] if problems else None


def _split_names(v: str) -> tuple[str, ...]:
    return tuple(n.strip() for n in v.split(",") if n.strip())


_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_FIELD_PATH = re.compile(r"[a-z][A-Za-z0-9]*(\.[a-z][A-Za-z0-9]*)*")
_URL = re.compile(r"https?://[^\s/?#]+(/[^\s?#]*)?")

MIN_CREDENTIAL_CEILING_SECONDS = 600
"""The shortest non-zero ``[leoflow] credential_ceiling_seconds``: a pod's deadline runs from the moment the
kubelet took it, so it must leave room for pulling the image and exchanging the token before the task even
starts; also the shortest life Kubernetes gives a projected ServiceAccount token."""


def _dns_label(v: str) -> str | None:
    ok = len(v) <= 63 and _DNS_LABEL.fullmatch(v)
    return None if ok else "must be a DNS-1123 label (lower-case letters, digits and '-', at most 63)"


def _dns_subdomain(v: str) -> str | None:
    ok = len(v) <= 253 and _DNS_SUBDOMAIN.fullmatch(v)
    return None if ok else "must be a DNS-1123 subdomain (lower-case letters, digits, '-' and '.')"


MAX_INSTANCE_LEN = 40
"""The longest ``[leoflow] instance``: a DNS-1123 label with room to spare (k8s review §5)."""


def _instance(v: str) -> str | None:
    if not v or (len(v) <= MAX_INSTANCE_LEN and _DNS_LABEL.fullmatch(v)):
        return None
    return (f"must be a DNS-1123 label of at most {MAX_INSTANCE_LEN} characters (lower-case letters, digits and "
            "'-', a letter or digit at both ends), or empty to derive it from [database] sql_alchemy_conn")


def instance_id(url: str) -> str:
    """The default ``[leoflow] instance``: the first 12 hex digits of the SHA-256 of the metadata database's
    identity in ``url`` (a SQLAlchemy URL, Airflow's ``[database] sql_alchemy_conn``): its backend without the
    driver (``postgresql`` for ``postgresql+psycopg2``), host (lower-case), port and database, joined by
    newlines. Never the user, password or query. Two Airflows on different metadata databases get different
    values with no configuration, and one Airflow's scheduler and api-servers (one URL) the same (k8s review §5).
    Renaming the database host (or spelling the default port out) changes it.

    :raises ValueError: when ``url`` is not a SQLAlchemy URL (empty included).
    """
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError) as exc:
        raise ValueError(f"not a SQLAlchemy URL: {type(exc).__name__}") from None
    parts = (parsed.get_backend_name(), (parsed.host or "").lower(),
             "" if parsed.port is None else str(parsed.port), parsed.database or "")
    return hashlib.sha256("\n".join(parts).encode("utf-8", "surrogatepass")).hexdigest()[:12]


def _no_space(v: str) -> str | None:
    return "must not contain whitespace" if any(c.isspace() for c in v) else None


def _url_or_empty(v: str) -> str | None:
    return None if not v or _URL.fullmatch(v) else "must be an http:// or https:// URL (or empty)"


def _audience(v: str) -> str | None:
    if not v or "," in v or any(c.isspace() for c in v):
        return "must be one non-empty audience string without whitespace or commas"
    return None


def _issuers(v: str) -> str | None:
    bad = [n for n in _split_names(v) if any(c.isspace() for c in n) or len(n) > 512]
    return f"{bad[0][:60]!r} is not an issuer (no whitespace, at most 512 characters)" if bad else None


def _secret_names(v: str) -> str | None:
    bad = [n for n in _split_names(v) if not (len(n) <= 253 and _DNS_SUBDOMAIN.fullmatch(n))]
    return f"{bad[0]!r} is not a Secret name (a DNS-1123 subdomain)" if bad else None


def _field_paths(v: str) -> str | None:
    bad = [p for p in _split_names(v) if not _FIELD_PATH.fullmatch(p)]
    return (f"{bad[0]!r} is not a pod field path (dotted camelCase names as in a pod's YAML, no indexes, e.g. "
            "`spec.containers.resources`)") if bad else None


WARM_ISOLATIONS = ("read-only-root", "shared")
"""The values of ``[leoflow] warm_isolation`` (the agent's ``LEOFLOW_WARM_ISOLATION``)."""


def _warm_pools(v: str) -> str | None:
    from leoflow_airflow.warm.targets import parse_overrides

    try:
        parse_overrides(v)
    except ConfigError as exc:
        return exc.reason
    return None


def _ceiling(v: int) -> str | None:
    if v == 0 or v >= MIN_CREDENTIAL_CEILING_SECONDS:
        return None
    return f"must be 0 (no deadline) or at least {MIN_CREDENTIAL_CEILING_SECONDS} s (it must cover the image pull)"


OPTIONS: tuple[Option, ...] = (
    Option("runtime", "string", "lite", "Where attempts run: `lite` (local agent processes forked by a "
           "pre-imported zygote) or `kubernetes` (a pod per attempt in [leoflow] namespace; the options below "
           "from `namespace` on).",
           lambda v: None if v in ("lite", "kubernetes") else "must be `lite` or `kubernetes`"),
    Option("runtime_dir", "string", "", "Directory for the Lite per-attempt record files (`attempts/`) and, "
           "one directory per scheduler process (`zygotes/<scheduler pid>/`), the zygote socket, pidfile and "
           "log, so several schedulers on one host each run their own zygote. Empty: `$AIRFLOW_HOME/leoflow`."),
    Option("agent_lost_threshold", "float", "120", "Seconds after which an attempt whose heartbeat went "
           "silent is treated as lost by leoflow. Must sit inside the recovery window (docs/DESIGN.md §2; `airflow leoflow check` shows it).", _positive),
    Option("agent_lease_seconds", "float", "45", "runtime = kubernetes: seconds a task pod's agent (cold or warm) "
           "may go without any answer of the Execution API (a status below 500) before it kills its task (SIGTERM, "
           "then SIGKILL after [core] killed_task_cleanup_time), records heartbeat_lost and exits, so that a "
           "partitioned pod never runs beside the re-run the scheduler starts once the heartbeat is silent. "
           "agent_lease_seconds + [core] killed_task_cleanup_time must stay below agent_lost_threshold (the "
           "scheduler refuses to start otherwise). Lite takes no lease.", _positive),
    Option("maintenance_interval", "float", "5", "Upper bound, in seconds, between two reconcile passes "
           "of the executor's sync().", _positive),
    Option("sweep_interval", "float", "1", "Seconds between two presence passes of the executor's sync(), at "
           "least: the page of running attempts it observes, the lost-agent reapers on that page and the "
           "orphan-run reaper's page of Airflow's running task instances. The attempts that need action now "
           "(claimed, exited, settling) are read on every sync(). 0: a presence pass on every sync() (each "
           "scheduler loop, several a second while tasks start and end). At most maintenance_interval.",
           _non_negative),
    Option("settle_timeout", "float", "10", "HTTP timeout, in seconds, of one settle call to the "
           "Execution API.", _positive),
    Option("settle_budget", "integer", "20", "Settle calls at most per sync(), so the scheduler loop "
           "never stalls.", _positive),
    Option("launch_queue_size", "integer", "64", "Attempts handed to the runtime but not yet started, at most "
           "(Lite: handed to the zygote and not yet forked, held ones included; Kubernetes: pod creates in "
           "flight); beyond it a dispatch is `deferred` and re-offered.", _positive),
    Option("queue_ahead", "integer", "-1", "The most task workloads the executor accepts from the scheduler "
           "beyond its free slots. They are handed to the zygote, which holds them and forks each the moment a "
           "busy agent reports, without waiting for the scheduler's next loop (LocalExecutor's workers also pull "
           "from a queue ahead of them). The depth used adapts below this cap to what recent attempt durations "
           "let start within min(60 s, [scheduler] task_queued_timeout / 10), so long tasks are never held "
           "QUEUED into Airflow's stuck-in-queued handling. -1: 4 x [core] parallelism; 0: none.",
           lambda v: None if v >= -1 else "must be -1, 0 or more"),
    Option("end_drain_timeout", "float", "0", "Seconds end() waits for running agents to finish. 0: "
           "leave them running for the next scheduler to adopt.", _non_negative),
    Option("zygote_start_timeout", "float", "60", "Seconds to wait for the zygote to import the Task SDK "
           "and answer.", _positive),
    Option("record_retention", "float", "86400", "Seconds a closed attempt's record files are kept.",
           _non_negative),
    Option("agent_env_passthrough", "string", "", "Comma-separated environment variable names handed to the "
           "zygote, agents and tasks even though Airflow's own secrets list or agent_env_deny withholds them "
           "(the operator's explicit exception)."),
    Option("agent_env_deny", "string", "", "Comma-separated environment variable names (a trailing `*` "
           "matches a prefix) never handed to the zygote, agents and tasks, on top of Airflow's own secrets, "
           "which are always withheld (DB URL, JWT secret and key path, fernet key, [api] secret_key, in every "
           "form Airflow reads them; leoflow_airflow/runtime/environment.py). An `AIRFLOW__SECTION__KEY` entry "
           "withholds its _CMD, _SECRET and team-scoped forms too. Everything else in the scheduler's "
           "environment reaches tasks, as under LocalExecutor.", _deny_list),
    Option("replay_holdoff_max_seconds", "float", "3600", "While a dead attempt's recorded report cannot be "
           "replayed (the api-server is down), leoflow keeps refreshing the RUNNING task instance's heartbeat "
           "so Airflow's heartbeat purge does not fail it, for at most this many seconds after the attempt "
           "exited; then Airflow's own purge takes over. 0: never hold the purge off.", _non_negative),
    Option("zygote_preload", "string", "", "Comma-separated extra modules the Lite zygote imports before it "
           "forks any agent (for example `pandas`), so no attempt pays for importing them; on top of the Task "
           "SDK, DAG parsing and the standard provider's operators, which it always imports. Module names "
           "only, never DAG files (those are parsed by the file workers, see lite_warm_files). A module that "
           "fails to import is logged in the zygote's log and skipped.", _module_list),
    Option("lite_warm_files", "integer", "8", "Lite warm workers: DAG files that keep a file worker, at most. A "
           "file worker is a child of the zygote that has parsed one DAG file once (everything the file and its "
           "operators import is imported) and forks the agent of every attempt of that file, so no attempt "
           "re-parses its DAG or re-imports its modules. The first attempt of a file starts one; a file that "
           "changes (or a module of its bundle that its parse imported) gets a fresh one; the least recently "
           "used one retires when more files are busy. 0: every agent is forked by the zygote and parses its "
           "file itself.", _non_negative),
    Option("lite_warm_idle_ttl", "float", "600", "Seconds a Lite file worker with no attempt to fork stays before "
           "it exits.", _positive),
    Option("lite_warm_max_age", "float", "3600", "Seconds after which a Lite file worker retires (once its "
           "agents are gone) and the next attempt of its file starts a fresh one: what a DAG file computes at "
           "its top level (a datetime.now(), a value read from the environment) is computed once per file "
           "worker, not once per attempt, and this bounds how old it gets.", _positive),
    Option("dispatch_lost_threshold", "float", "120", "Seconds a dispatched attempt may stay QUEUED (its agent "
           "never reached /run) before the dispatch-lost reaper kills it and re-dispatches the ti_id; counted from "
           "the dispatch (Lite) or from when the agent container started running (Kubernetes: image pulls and "
           "scheduling do not count).", _positive),
    Option("reap_grace", "float", "30", "Seconds after start or adoption before any reaper acts (the settling "
           "gate; one full reconcile sweep is needed too).", _non_negative),
    Option("reap_page_size", "integer", "500", "Running attempts looked at per presence pass: each sync() reads the "
           "attempts that need action now (claimed, exited, settling) and each presence pass one page of this many running ones, "
           "after a cursor that wraps to the start after the last page, so a loop costs the same however many "
           "attempts run. Every running attempt is checked once per ceil(running / reap_page_size) presence passes "
           "(one sweep; the reapers wait for one full sweep after start or adoption; see sweep_interval). The orphan-run reaper pages "
           "Airflow's running task instances by the same size.", _positive),
    Option("orphan_run_threshold", "float", "240", "Seconds without activity (the latest of the task instance's "
           "queued, start, heartbeat and update times and its dag run's start) after which a RUNNING task "
           "instance of a running dag run, queued by this executor, that has no open leoflow attempt is re-run "
           "as a new try on the infra budget (the orphan-run reaper; no user retry spent). Must stay below "
           "[scheduler] task_instance_heartbeat_timeout, or Airflow's purge fails the task first.", _positive),
    Option("infra_retry_budget", "integer", "2", "Infra re-runs (a dead agent that left no outcome) per "
           "logical task instance that do not spend the user's retries; then Airflow's own failure path.",
           _non_negative),
    Option("redispatch_limit", "integer", "2", "Re-dispatches of the same ti_id as a new epoch when its "
           "agent died before /run; then Airflow's own failure path.", _non_negative),
    # --- Kubernetes: the task pods (the scheduler's pod builder) and the token exchange (the api-server's
    # plugin app) read this one group (KubernetesSettings); each value is checked on its own whatever the runtime
    Option("namespace", "string", "default", "Namespace of the task pods; the token exchange accepts only "
           "tokens of pods in it.", _dns_label),
    Option("instance", "string", "", "This installation's name on the Kubernetes objects it makes: every task "
           "pod, warm pod and warm anchor carries the label leoflow.io/instance=<instance>, and the scheduler "
           "lists, watches, adopts, releases and deletes only objects with its own value, so two Airflows sharing a "
           "task namespace never touch each other's. A DNS-1123 label of at most 40 characters. Empty: the first "
           "12 hex digits of the SHA-256 of [database] sql_alchemy_conn's backend, host, port and database (never "
           "its user or password), the same for one Airflow's scheduler and api-servers; renaming the database host "
           "changes it. Set it explicitly when two installations share a namespace, or to keep it across a "
           "database move.", _instance),
    Option("service_account", "string", "default", "ServiceAccount the task pods run as; the token exchange "
           "accepts only this account's projected tokens (`system:serviceaccount:<namespace>:<service_account>`). "
           "Its API token is never mounted (automountServiceAccountToken: false).", _dns_subdomain),
    Option("image", "string", "", "Image of the task pods' agent container (leoflow and the DAGs' dependencies "
           "installed; its entrypoint runs the arguments `python -m leoflow_agent pod`). Required with "
           "runtime = kubernetes; a pod_override may set another per task where pod_override_allow lets it.",
           _no_space),
    Option("pod_template_file", "string", "", "Path of a pod template (YAML) the task pods start from, as for "
           "the KubernetesExecutor: the template, then leoflow's pod, then the task's executor_config pod_override "
           "are merged, then Airflow's pod_mutation_hook runs, then leoflow sets again what it pins (name, labels, "
           "identity annotation, security context, termination message, ServiceAccount token, restartPolicy). "
           "Empty: none."),
    Option("pod_override_allow", "string",
           "metadata.labels, metadata.annotations, spec.containers.image, spec.containers.imagePullPolicy, "
           "spec.containers.resources, spec.containers.env, spec.nodeSelector, spec.affinity, spec.tolerations, "
           "spec.priorityClassName",
           "Comma-separated pod field paths a task's executor_config pod_override may set (Kubernetes API names, "
           "as in a pod's YAML; an entry allows everything below it; a list of objects such as spec.containers "
           "is walked without index). An override setting anything else is refused and the task fails at once "
           "naming the field. Adding a container needs `spec.containers` itself. Fields leoflow pins cannot be "
           "listed. Whatever this list says, an override may not set leoflow's own labels and annotations "
           "(`leoflow.io/*`, the `app.kubernetes.io/*` ones leoflow sets) nor reference a Secret outside "
           "pod_secret_allow.", _field_paths),
    Option("pod_secret_allow", "string", "", "Comma-separated names of Secrets in the task namespace that a "
           "task's executor_config pod_override, Airflow's pod_mutation_hook or a leoflow_mutate_pod plugin may "
           "reference in a task pod (env valueFrom.secretKeyRef, envFrom secretRef, a `secret` volume, a "
           "projected volume's `secret` source). Empty: none; such a pod is refused and the task fails at once "
           "naming the field. The Secret references of the operator's pod_template_file are the operator's and "
           "always allowed.", _secret_names),
    Option("credential_ceiling_seconds", "integer", "604800", "The attempt credential ceiling, in seconds: the "
           "longest a task pod may live, counted from when the kubelet took it (so it covers the image pull). It "
           "becomes the pod's activeDeadlineSeconds (a shorter one from the template or an override is kept) and "
           "bounds the agent's exchange retries. 0: no deadline.", _ceiling),
    Option("pod_unschedulable_timeout", "float", "300", "Seconds a task pod the Kubernetes scheduler cannot place "
           "(condition PodScheduled False, reason Unschedulable: no node has room, or none matches) waits as "
           "backpressure; then leoflow deletes it (UID precondition) and re-offers the workload, never spending a "
           "user retry or failing it. Keep it below [scheduler] task_queued_timeout (`airflow leoflow check` "
           "warns). 0: no bound (Airflow's task_queued_timeout alone). A pod that is scheduled and still starting "
           "(pulling a large image) is never reaped as dispatch-lost: that clock starts when its agent container "
           "runs.", _non_negative),
    Option("pod_termination_valve", "float", "60", "Seconds leoflow waits for a deleted task pod's terminated "
           "status, which carries the outcome record, once its deletion grace period has passed (a kill by a "
           "reaper or a revoke, an eviction, a user's delete). The pod of a node that is unreachable never "
           "reports one; past this valve its attempt counts as ended with no record, and its task instance is "
           "re-run as an infra loss (a new try on the infra budget, never a user retry); a success it recorded "
           "after that is not read. Keep [leoflow] agent_lost_threshold + the reaper's kill grace + this below "
           "Airflow's [scheduler] task_instance_heartbeat_timeout (`airflow leoflow check` warns). 0: wait for "
           "the terminated status for ever (Airflow's heartbeat purge then fails such a task).", _non_negative),
    Option("pod_retention_success", "float", "60", "Seconds a Succeeded task pod is kept after its agent "
           "container ended and its attempt settled (for `kubectl logs` / `describe`), then deleted with a UID "
           "precondition. 0: delete as soon as the attempt settled.", _non_negative),
    Option("pod_retention_failure", "float", "3600", "Seconds a task pod that did not succeed (Failed, evicted, "
           "past its deadline) is kept after it ended and its attempt settled, then deleted with a UID "
           "precondition. 0: delete as soon as the attempt settled.", _non_negative),
    Option("pod_log_salvage", "boolean", "True", "With [logging] remote_logging on: before leoflow releases an "
           "ended task pod, upload its container log through Airflow's REMOTE_TASK_LOG to the ended try's log path "
           "when the remote store holds none there (a pod killed past its grace, OOM-killed or on a lost node never "
           "uploads its own). The kept text's first line names the pod. Needs get pods/log for the scheduler."),
    Option("kube_api_workers", "integer", "4", "Threads of the scheduler's pool that makes every Kubernetes API "
           "request of the runtime (pod creates, confirming reads, deletes; never on the scheduler loop). Creates in "
           "flight are bounded by launch_queue_size, so more threads raise pod creates per second toward the API "
           "server's own limits (client-side: none; server-side: APF). 1 to 64.", _api_workers),
    Option("in_cluster", "boolean", "True", "Reach the Kubernetes API with the process's own pod ServiceAccount "
           "(True: the scheduler's to create pods, the api-server's for the token exchange's TokenReview and pod "
           "GET) or with kube_config (False)."),
    Option("kube_config", "string", "", "Path of the kubeconfig used when in_cluster is False, by the scheduler "
           "and the api-server's token exchange alike. Empty: the client's default ($KUBECONFIG, then "
           "~/.kube/config). Setting it while in_cluster is True is an error."),
    Option("exchange_url", "string", "", "URL under which task pods reach leoflow's api-server app "
           "(`.../leoflow`; the agent posts to `<exchange_url>/v1/exchange`). Empty: `[api] base_url` + "
           "`/leoflow`. Not derived from [core] execution_api_server_url: an execution-only api-server "
           "(`--apps execution`) serves no plugin app.", _url_or_empty),
    Option("exchange_audience", "string", "urn:leoflow:exchange", "Audience of the projected ServiceAccount "
           "token on each task pod, which the pod presents to the token exchange; the api-server's TokenReview "
           "asks for exactly this audience, so a token made for anything else (the Kubernetes API itself "
           "included) is refused.", _audience),
    Option("exchange_issuers", "string", "", "Comma-separated issuers (the JWT `iss`) the token exchange and the "
           "warm pods' registration accept on a projected ServiceAccount token, checked locally before any "
           "TokenReview: the kube-apiserver's `--service-account-issuer` values (its first one issues; list the old "
           "and the new one while rotating, as the api-server does). A token of any other issuer is refused "
           "(`implausible_token`) without a Kubernetes call. Empty: `iss` is not checked locally (TokenReview "
           "still authenticates every token). `airflow leoflow doctor` compares the list with the issuer the "
           "cluster publishes.", _issuers),
    Option("exchange_timeout_seconds", "float", "5", "Seconds each Kubernetes call of one token exchange "
           "(TokenReview, then the pod GET) may take on the api-server; a call that does not answer in time makes "
           "the exchange answer 503 (try again), never hold the request open. At most 12.5: two such calls and "
           "the rest of the exchange must end before the task pod's agent stops waiting (30 s).",
           _exchange_timeout),
    Option("warm_min_idle", "integer", "0", "Kubernetes warm pods (README \"Warm pods on Kubernetes\"): warm pods "
           "kept ready per active DAG version (a version with a queued or running dag run; with warm_prewarm also an "
           "unpaused DAG's current version). A ready warm pod has parsed the DAG file and takes an attempt in-band, "
           "without a pod start. 0 = warm pods off for every DAG warm_pools does not name.", _non_negative),
    Option("warm_max_pool_size", "integer", "4", "Warm pods of one DAG version at most, busy ones included (a "
           "value below the version's min_idle counts as min_idle).", _non_negative),
    Option("warm_tenant_cap", "integer", "0", "Warm pods of one tenant (its team under Airflow's multi-team mode, "
           "else its DAG bundle) across all its versions, at most. 0 = no cap.", _non_negative),
    Option("warm_prewarm", "boolean", "False", "Keep warm pods for an unpaused DAG's current version before any "
           "run of it exists (they yield to active runs under warm_tenant_cap)."),
    Option("warm_pools", "string", "", "Per-DAG warm pool sizes, a JSON object of dag_id globs (fnmatch, first "
           "match wins) to any of `min_idle`, `max_pool_size`, `prewarm`, e.g. "
           "`{\"etl_*\": {\"min_idle\": 2, \"max_pool_size\": 4}, \"huge_*\": {\"min_idle\": 0}}`; what an "
           "entry leaves out comes from the warm_* defaults. Empty: none.", _warm_pools),
    Option("warm_max_attempts", "integer", "50", "Attempts one warm pod runs before it exits (a fresh one "
           "replaces it).", _positive),
    Option("warm_max_lifetime_seconds", "float", "3600", "Seconds after which a warm pod takes no new attempt "
           "and exits; its activeDeadlineSeconds is this plus credential_ceiling_seconds (none when the ceiling is "
           "0), and is lowered to pod age + credential_ceiling_seconds when it takes an attempt.", _positive),
    Option("warm_idle_ttl_seconds", "float", "600", "Seconds a warm pod waits with no attempt before it exits by "
           "itself (the pool replaces it while its version still needs one).", _positive),
    Option("warm_start_timeout_seconds", "float", "300", "Seconds a warm pod may take from its create to its "
           "registration (image pull, DAG file parse) before the pool deletes it as broken.", _positive),
    Option("warm_isolation", "string", "read-only-root", "Between two attempts of one warm pod: `read-only-root` "
           "(each attempt gets its own HOME and TMPDIR on the pod's scratch emptyDir, removed after it; /tmp and "
           "/dev/shm are emptied) or `shared` (nothing is swept).",
           lambda v: None if v in WARM_ISOLATIONS else "must be `read-only-root` or `shared`"),
    Option("test_fault_injection", "boolean", "False", "TEST ONLY: honour the per-attempt fault-injection "
           "point (docs/DESIGN.md §3). Never enable in production."),
    Option("test_fault_plan", "string", "", "TEST ONLY (with test_fault_injection): a JSON file mapping "
           "`dag_id/run_id/task_id/try_number/attempt_epoch` to a fault point, read at each dispatch."),
    Option("test_host", "string", "", "TEST ONLY (with test_fault_injection): the host string stamped on "
           "this scheduler's attempts instead of `<hostname>/<boot id>`, to simulate a second host on one "
           "machine."),
)


@dataclass(frozen=True)
class KubernetesSettings:
    """The ``[leoflow]`` options of the Kubernetes runtime (each option's text is in :data:`OPTIONS`), one group
    for both of its halves: the scheduler's pod builder (:func:`leoflow_airflow.runtime.kubernetes.pod.build_pod`)
    and the api-server's token exchange (:mod:`leoflow_airflow.api.exchange`) read the same namespace,
    ServiceAccount, projected-token audience and API access, so a pod is built exactly as the exchange checks it.

    A value parsed here passed its own check. :func:`check_kubernetes` adds what the scheduler needs of them
    together (an image is set, an exchange URL is known, every allowlist entry names an overridable pod field),
    :func:`load_exchange` what the exchange does (:func:`check_api_access` for both).
    """

    namespace: str
    """Namespace of the task pods (DNS-1123 label)."""
    service_account: str
    """ServiceAccount of the task pods; the exchange accepts only its tokens (:attr:`service_account_username`)."""
    image: str
    """Image of the agent container (empty only while the runtime is not kubernetes)."""
    pod_template_file: str
    """Path of the operator's pod template (YAML), or empty."""
    pod_override_allow: tuple[str, ...]
    """Pod field paths a ``pod_override`` may set."""
    credential_ceiling_seconds: int
    """Longest life of a task pod from its start, in seconds (its ``activeDeadlineSeconds``; 0: none)."""
    pod_unschedulable_timeout: float
    """Seconds an unschedulable task pod waits as backpressure before it is deleted and its workload re-offered
    (0: no bound; Airflow's ``[scheduler] task_queued_timeout`` still applies)."""
    pod_termination_valve: float
    """Seconds a deleted task pod may go without a terminated status past its deletion grace period before its
    attempt counts as ended with no record (issue 10 item 3, the confirmation valve; 0: wait for ever)."""
    pod_retention_success: float
    """Seconds a Succeeded pod of a settled attempt is kept before it is deleted (≥ 0)."""
    pod_retention_failure: float
    """Seconds any other terminal pod of a settled attempt is kept before it is deleted (≥ 0)."""
    pod_log_salvage: bool
    """Keep an ended task pod's log where Airflow's log view reads it before its finalizer is released
    (:mod:`leoflow_airflow.runtime.kubernetes.logsalvage`)."""
    kube_api_workers: int
    """Threads of the runtime's API request pool (1-64); creates in flight stay bounded by ``launch_queue_size``."""
    in_cluster: bool
    """Reach the API with the process's own pod ServiceAccount (else ``kube_config``)."""
    kube_config: str
    """Path of a kubeconfig when not ``in_cluster`` (empty: the client's default)."""
    exchange_url: str
    """Base URL of leoflow's plugin app as task pods reach it (``…/leoflow``); empty until derived."""
    exchange_audience: str
    """Audience of the pods' projected ServiceAccount token, and the only one the exchange's TokenReview asks for."""
    exchange_timeout_seconds: float
    """Seconds each Kubernetes call of one exchange may take (> 0)."""
    exchange_issuers: tuple[str, ...] = ()
    """``[leoflow] exchange_issuers``: the ``iss`` values a projected token may carry (empty: not checked locally;
    k8s review §10, issue 33 item 4)."""
    pod_secret_allow: tuple[str, ...] = ()
    """Names of the Secrets a ``pod_override`` or a hook may reference in a task pod (k8s review §9)."""
    agent_env_deny: tuple[str, ...] = ()
    """``[leoflow] agent_env_deny`` (shared with Lite, :attr:`LeoflowSettings.agent_env_deny`): environment
    variable names (or ``PREFIX*``) a task pod never sets (k8s review §9)."""
    instance: str = ""
    """``[leoflow] instance``, or the value :func:`instance_id` derived from ``[database] sql_alchemy_conn``: the
    ``leoflow.io/instance`` label on every object this installation makes and in every selector it lists with
    (k8s review §5). Empty only when neither is set (Airflow always sets the database URL)."""
    agent_lease_seconds: float = 45.0
    """``[leoflow] agent_lease_seconds`` (a copy of :attr:`LeoflowSettings.agent_lease_seconds`): the task pod
    agent's lease on its task, handed to the pod (k8s review §14)."""

    @property
    def service_account_username(self) -> str:
        """The Kubernetes user of the task pods' tokens, ``system:serviceaccount:<namespace>:<service_account>``:
        the only username the exchange accepts from a TokenReview."""
        return f"system:serviceaccount:{self.namespace}:{self.service_account}"


KUBERNETES_SHARED_KEYS: tuple[str, ...] = ("agent_env_deny", "agent_lease_seconds")
"""``[leoflow]`` options :class:`KubernetesSettings` carries a copy of, which belong to :class:`LeoflowSettings`."""
KUBERNETES_KEYS: tuple[str, ...] = tuple(k for k in KubernetesSettings.__dataclass_fields__
                                         if k not in KUBERNETES_SHARED_KEYS)
"""The ``[leoflow]`` options that belong to :class:`KubernetesSettings` (``LeoflowSettings.kubernetes``)."""


@dataclass(frozen=True)
class WarmSettings:
    """The ``[leoflow] warm_*`` options: Kubernetes warm pods (issue 11; each option's text is in
    :data:`OPTIONS`). The defaults are the options' defaults: warm pods off (``warm_min_idle`` 0)."""

    warm_min_idle: int = 0
    """Warm pods kept ready per active DAG version (count; 0: off unless ``warm_pools`` names the DAG)."""
    warm_max_pool_size: int = 4
    """Warm pods of one version at most (count)."""
    warm_tenant_cap: int = 0
    """Warm pods of one tenant at most (count; 0: no cap)."""
    warm_prewarm: bool = False
    """Keep a pool for an unpaused DAG's current version before any run of it."""
    warm_pools: str = ""
    """The per-DAG overrides, JSON text (:func:`leoflow_airflow.warm.targets.parse_overrides` accepted it)."""
    warm_max_attempts: int = 50
    """Attempts one warm pod runs before it exits (≥ 1)."""
    warm_max_lifetime_seconds: float = 3600.0
    """Seconds a warm pod serves (> 0)."""
    warm_idle_ttl_seconds: float = 600.0
    """Seconds a warm pod waits idle before it exits (> 0)."""
    warm_start_timeout_seconds: float = 300.0
    """Seconds from a warm pod's create to its registration before the pool deletes it (> 0)."""
    warm_isolation: str = "read-only-root"
    """``read-only-root`` or ``shared`` (:data:`WARM_ISOLATIONS`)."""

    @property
    def enabled(self) -> bool:
        """Whether any DAG can get a warm pool: ``warm_min_idle`` > 0 or a ``warm_pools`` override with
        ``min_idle`` > 0."""
        if self.warm_min_idle > 0:
            return True
        from leoflow_airflow.warm.targets import parse_overrides

        return any((o.min_idle or 0) > 0 for o in parse_overrides(self.warm_pools))

    @property
    def prewarm_any(self) -> bool:
        """Whether any DAG may be prewarmed: ``warm_prewarm``, or a ``warm_pools`` override with ``prewarm``
        true (the pool then reads the current versions of unpaused DAGs too)."""
        if self.warm_prewarm:
            return True
        from leoflow_airflow.warm.targets import parse_overrides

        return any(o.prewarm for o in parse_overrides(self.warm_pools))


WARM_KEYS: tuple[str, ...] = tuple(WarmSettings.__dataclass_fields__)
"""The ``[leoflow]`` options that belong to :class:`WarmSettings` (``LeoflowSettings.warm``)."""


@dataclass(frozen=True)
class LeoflowSettings:
    """The parsed ``[leoflow]`` section (each option's text is in :data:`OPTIONS`). Durations are seconds
    (float), sizes are counts. Grouped by who reads them; new keys carry their unit in the name
    (``…_seconds``)."""

    # --- runtime (Lite)
    runtime: str
    """``lite`` or ``kubernetes``."""
    runtime_dir: str
    """Directory of the zygote socket, pidfile, log and per-attempt record files."""
    launch_queue_size: int
    """Launches handed to the zygote and not yet forked, at most (count)."""
    queue_ahead: int
    """Task workloads accepted beyond free slots, at most (count; -1: 4 x parallelism)."""
    zygote_start_timeout: float
    """Seconds the zygote may take to import the Task SDK and answer."""
    agent_env_passthrough: tuple[str, ...]
    """Extra environment variable names handed to the zygote and agents."""
    agent_env_deny: tuple[str, ...]
    """Extra environment variable names (or ``*`` patterns) never handed to the zygote and agents."""
    zygote_preload: tuple[str, ...]
    """Extra modules the zygote imports before its first fork."""
    lite_warm_files: int
    """Lite file workers (pre-parsed parents per DAG file) at most (count; 0: none)."""
    lite_warm_idle_ttl: float
    """Seconds an idle Lite file worker stays."""
    lite_warm_max_age: float
    """Seconds after which a Lite file worker retires."""
    end_drain_timeout: float
    """Seconds ``end()`` waits for running attempts (0: leave them for the successor)."""
    record_retention: float
    """Seconds a closed attempt's record files are kept."""
    # --- settle
    maintenance_interval: float
    """Seconds between two reconcile passes, at most."""
    sweep_interval: float
    """Seconds between two presence passes of ``sync()`` (the LIVE page, the reapers), at least; 0: every one."""
    settle_timeout: float
    """Seconds of one replay call; also the wall-clock settle budget of one ``sync()``."""
    settle_budget: int
    """Settles per ``sync()``, at most (count)."""
    infra_retry_budget: int
    """Infra re-runs per logical TI that spend no user retry (count)."""
    redispatch_limit: int
    """Re-dispatches in a row of one dispatch cycle of a ti_id (count)."""
    # --- reap
    agent_lost_threshold: float
    """Seconds of heartbeat silence after which a live agent is killed as lost."""
    dispatch_lost_threshold: float
    """Seconds a dispatched attempt may stay QUEUED before it is killed as dispatch-lost."""
    reap_grace: float
    """Seconds after start or adoption before any reaper acts."""
    reap_page_size: int
    """LIVE attempts (and Airflow RUNNING task instances, for the orphan-run reaper) read per ``sync()``, at most."""
    orphan_run_threshold: float
    """Seconds of no activity after which a RUNNING task instance with no open attempt is re-driven."""
    replay_holdoff_max_seconds: float
    """Seconds after an attempt's exit during which a replayable record keeps Airflow's purge off, at most."""
    # --- runtime (Kubernetes)
    kubernetes: KubernetesSettings
    """The Kubernetes runtime's options (``namespace``, ``service_account``, … ``exchange_timeout_seconds``)."""
    # --- testing (TEST ONLY)
    test_fault_injection: bool
    """Honour per-attempt fault points."""
    test_fault_plan: str
    """JSON file of fault points keyed ``dag_id/run_id/task_id/try_number/attempt_epoch``."""
    test_host: str
    """The host stamp to use instead of the real one (only with ``test_fault_injection``)."""
    # --- warm pods (Kubernetes)
    warm: WarmSettings = WarmSettings()
    """The ``warm_*`` options (:class:`WarmSettings`; default: warm pods off)."""
    agent_lease_seconds: float = 45.0
    """Seconds a task pod's agent goes without an Execution API answer before it kills its task and exits
    (``leoflow_agent.lease``; k8s review §14); the ladder keeps it + ``[core] killed_task_cleanup_time`` below
    :attr:`agent_lost_threshold`."""


_BOOL = {"true": True, "1": True, "yes": True, "on": True, "false": False, "0": False, "no": False, "off": False}


def _parse(opt: Option, raw: str) -> Any:
    text = raw.strip()
    try:
        if opt.type == "integer":
            value: Any = int(text)
        elif opt.type == "float":
            value = float(text)
            if value != value or value in (float("inf"), float("-inf")):
                raise ValueError
        elif opt.type == "boolean":
            value = _BOOL[text.lower()]
        else:
            value = text
    except (ValueError, KeyError):
        raise ConfigError(f"{SECTION}.{opt.name}", raw, f"is not a valid {opt.type}") from None
    if opt.check is not None and (problem := opt.check(value)):
        raise ConfigError(f"{SECTION}.{opt.name}", raw, problem)
    return value


def _airflow_get() -> Callable[[str, str, str], str]:
    from airflow.configuration import conf

    def get(section: str, key: str, fallback: str) -> str:
        value = conf.get(section, key, fallback=fallback)
        return fallback if value is None else value

    return get


def _load(get: Callable[[str, str, str], str]) -> LeoflowSettings:
    """Parse every option, each checked on its own; no check across options, no refusal of a runtime."""
    values: dict[str, Any] = {}
    for opt in OPTIONS:
        values[opt.name] = _parse(opt, str(get(SECTION, opt.name, opt.default)))
    if not values["runtime_dir"]:
        home = os.environ.get("AIRFLOW_HOME") or os.path.expanduser("~/airflow")
        values["runtime_dir"] = os.path.join(home, "leoflow")
    if not values["instance"]:
        values["instance"] = _derived_instance(str(get("database", "sql_alchemy_conn", "") or "").strip())
    for name in ("agent_env_passthrough", "zygote_preload", "agent_env_deny", "pod_override_allow",
                 "pod_secret_allow", "exchange_issuers"):
        values[name] = _split_names(values[name])
    kube = KubernetesSettings(**{k: values.pop(k) for k in KUBERNETES_KEYS},
                              **{k: values[k] for k in KUBERNETES_SHARED_KEYS})
    warm = WarmSettings(**{k: values.pop(k) for k in WARM_KEYS})
    return LeoflowSettings(**values, kubernetes=kube, warm=warm)


def _derived_instance(url: str) -> str:
    """:func:`instance_id` of ``url`` (empty when ``url`` is); :raises ConfigError: naming ``[leoflow] instance``
    when ``url`` is not a SQLAlchemy URL, so the operator can set it instead."""
    if not url:
        return ""
    try:
        return instance_id(url)
    except ValueError as exc:
        raise ConfigError(f"{SECTION}.instance", "", f"cannot be derived from [database] sql_alchemy_conn ({exc}); "
                          "set [leoflow] instance") from None


def check_api_access(kube: KubernetesSettings) -> None:
    """Check how the process reaches the Kubernetes API (the scheduler and the api-server's exchange alike):
    ``kube_config`` is read only when ``in_cluster`` is False, so setting it with ``in_cluster`` True would be
    silently ignored (the cncf KubernetesExecutor's ``config_file`` is); that is refused instead.

    :raises ConfigError: naming ``[leoflow] kube_config`` when it is set while ``in_cluster`` is True.
    """
    if kube.in_cluster and kube.kube_config:
        raise ConfigError(f"{SECTION}.kube_config", kube.kube_config, "is set while [leoflow] in_cluster is True, "
                          "which uses the pod's own ServiceAccount and would ignore it: set in_cluster = False "
                          "to use this kubeconfig, or leave kube_config empty")


def check_kubernetes(kube: KubernetesSettings, get: Callable[[str, str, str], str]) -> KubernetesSettings:
    """Check what ``runtime = kubernetes`` needs of its options together; return them with ``exchange_url``
    filled in from ``[api] base_url`` when it was left empty.

    :param get: ``get(section, key, fallback) -> str``, as for :func:`load` (``[api] base_url`` is read).
    :raises ConfigError: naming the key: what :func:`check_api_access` finds; no ``image``; neither
        ``exchange_url`` nor ``[api] base_url`` (or one that is not an http(s) URL); a ``pod_override_allow``
        entry that names no pod field or a field leoflow pins; the ``kubernetes`` package missing.
    """
    try:
        from leoflow_airflow.runtime.kubernetes import pod as pods
    except ImportError as exc:  # the optional dependency
        raise ConfigError(f"{SECTION}.runtime", "kubernetes",
                          f"needs the `kubernetes` package (pip install 'leoflow[kubernetes]'): {exc}") from None
    check_api_access(kube)
    if not kube.image:
        raise ConfigError(f"{SECTION}.image", kube.image, "is required with runtime = kubernetes")
    for entry in kube.pod_override_allow:
        if (problem := pods.allow_entry_problem(entry)) is not None:
            raise ConfigError(f"{SECTION}.pod_override_allow", ", ".join(kube.pod_override_allow), problem)
    url = kube.exchange_url
    if not url:
        base = str(get("api", "base_url", "") or "").strip()
        if not base:
            raise ConfigError(f"{SECTION}.exchange_url", "", "is required with runtime = kubernetes when "
                              "[api] base_url is not set: the URL task pods reach leoflow's app under (…/leoflow)")
        if _url_or_empty(base) is not None:
            raise ConfigError("api.base_url", base, "is not an http(s) URL, so [leoflow] exchange_url cannot be "
                              "derived from it; set [leoflow] exchange_url")
        url = base.rstrip("/") + "/leoflow"
    return replace(kube, exchange_url=url.rstrip("/"))


def load(get: Callable[[str, str, str], str] | None = None) -> LeoflowSettings:
    """Read and validate ``[leoflow]``.

    :param get: ``get(section, key, fallback) -> str``; defaults to Airflow's ``conf.get``.
    :returns: the settings; with ``runtime = kubernetes`` its group checked together and ``exchange_url``
        derived (:func:`check_kubernetes`).
    :raises ConfigError: for the first malformed value, naming key and value; ``sweep_interval`` above
        ``maintenance_interval``; with ``runtime = kubernetes``, for whatever :func:`check_kubernetes` finds.
    """
    get = _airflow_get() if get is None else get
    settings = _load(get)
    if settings.sweep_interval > settings.maintenance_interval:
        raise ConfigError(f"{SECTION}.sweep_interval", f"{settings.sweep_interval:g}",
                          f"is above [leoflow] maintenance_interval ({settings.maintenance_interval:g}), the "
                          "longest the reconcile passes may be apart: lower it, or raise maintenance_interval")
    if settings.runtime == "kubernetes":
        settings = replace(settings, kubernetes=check_kubernetes(settings.kubernetes, get))
    return settings


def load_kubernetes(get: Callable[[str, str, str], str] | None = None) -> KubernetesSettings:
    """Read ``[leoflow]`` and return the Kubernetes runtime's options, checked together
    (:func:`check_kubernetes`) whatever ``runtime`` says: what that runtime's ``start()`` will call.

    :raises ConfigError: as :func:`load` and :func:`check_kubernetes` do.
    """
    get = _airflow_get() if get is None else get
    return check_kubernetes(_load(get).kubernetes, get)


def load_exchange(get: Callable[[str, str, str], str] | None = None) -> KubernetesSettings | None:
    """Read ``[leoflow]`` as the api-server's token exchange needs it: None when ``runtime`` is not
    ``kubernetes`` (the exchange is off), else the Kubernetes group, every value checked on its own and
    :func:`check_api_access` passed. Not what only the scheduler needs (an image, the exchange URL, the
    allowlist against pod fields), so an api-server without the pod builder's settings still serves it.

    :param get: ``get(section, key, fallback) -> str``; defaults to Airflow's ``conf.get``.
    :raises ConfigError: for the first malformed value (any ``[leoflow]`` option: one section, one
        validation), naming key and value.
    """
    settings = _load(_airflow_get() if get is None else get)
    if settings.runtime != "kubernetes":
        return None
    check_api_access(settings.kubernetes)
    return settings.kubernetes


def provider_config() -> dict[str, Any]:
    """Return the provider-info ``config`` entry for ``[leoflow]`` (Airflow's provider_info schema)."""
    return {
        SECTION: {
            "description": "leoflow executor (leoflow_airflow.executor.LeoflowExecutor).",
            "options": {
                o.name: {
                    "description": o.description,
                    "version_added": "0.1.0",
                    "type": o.type,
                    "example": None,
                    "default": o.default,
                }
                for o in OPTIONS
            },
        }
    }
