"""The ``[leoflow]`` config section: one table of options (the provider's defaults come from it too) and
its parse into a frozen :class:`LeoflowSettings`.

Every option is read through Airflow's config (so ``AIRFLOW__LEOFLOW__*`` env vars and ``airflow.cfg`` both
work) and validated here; a malformed value raises :class:`~leoflow_airflow.errors.ConfigError` naming the
key and the value, before anything is started.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
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


def _non_negative(v: float) -> str | None:
    return None if v >= 0 else "must be 0 or more"


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


OPTIONS: tuple[Option, ...] = (
    Option("runtime", "string", "lite", "Where attempts run: `lite` (local agent processes forked by a "
           "pre-imported zygote) or `kubernetes` (a pod per attempt; not in this release).",
           lambda v: None if v in ("lite", "kubernetes") else "must be `lite` or `kubernetes`"),
    Option("runtime_dir", "string", "", "Directory for the Lite per-attempt record files (`attempts/`) and, "
           "one directory per scheduler process (`zygotes/<scheduler pid>/`), the zygote socket, pidfile and "
           "log, so several schedulers on one host each run their own zygote. Empty: `$AIRFLOW_HOME/leoflow`."),
    Option("agent_lost_threshold", "float", "120", "Seconds after which an attempt whose heartbeat went "
           "silent is treated as lost by leoflow. Must sit inside the recovery window (docs/DESIGN.md §2; `airflow leoflow check` shows it).", _positive),
    Option("maintenance_interval", "float", "5", "Upper bound, in seconds, between two reconcile passes "
           "of the executor's sync().", _positive),
    Option("settle_timeout", "float", "10", "HTTP timeout, in seconds, of one settle call to the "
           "Execution API.", _positive),
    Option("settle_budget", "integer", "20", "Settle calls at most per sync(), so the scheduler loop "
           "never stalls.", _positive),
    Option("launch_queue_size", "integer", "64", "Attempts handed to the zygote but not yet forked (held "
           "ones included), at most; beyond it a dispatch is `deferred` and re-offered.", _positive),
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
           "only: DAG files are parsed fresh by every attempt. A module that fails to import is logged in the "
           "zygote's log and skipped.", _module_list),
    Option("dispatch_lost_threshold", "float", "120", "Seconds a dispatched attempt may stay QUEUED (its agent "
           "never reached /run) before the dispatch-lost reaper kills it and re-dispatches the ti_id.", _positive),
    Option("reap_grace", "float", "30", "Seconds after start or adoption before any reaper acts (the settling "
           "gate; one full reconcile sweep is needed too).", _non_negative),
    Option("infra_retry_budget", "integer", "2", "Infra re-runs (a dead agent that left no outcome) per "
           "logical task instance that do not spend the user's retries; then Airflow's own failure path.",
           _non_negative),
    Option("redispatch_limit", "integer", "2", "Re-dispatches of the same ti_id as a new epoch when its "
           "agent died before /run; then Airflow's own failure path.", _non_negative),
    Option("test_fault_injection", "boolean", "False", "TEST ONLY: honour the per-attempt fault-injection "
           "point (docs/DESIGN.md §3). Never enable in production."),
    Option("test_fault_plan", "string", "", "TEST ONLY (with test_fault_injection): a JSON file mapping "
           "`dag_id/run_id/task_id/try_number/attempt_epoch` to a fault point, read at each dispatch."),
    Option("test_host", "string", "", "TEST ONLY (with test_fault_injection): the host string stamped on "
           "this scheduler's attempts instead of `<hostname>/<boot id>`, to simulate a second host on one "
           "machine."),
)


# --- Kubernetes: the token exchange (issue 9 item 3) ------------------------------------------------------
# Read by the api-server's plugin app (``leoflow_airflow.api.exchange``), not by the executor: a group of its
# own, parsed by :func:`load_exchange` into :class:`ExchangeSettings`. ``namespace``, ``service_account`` and
# ``kube_config`` are the Kubernetes runtime's too (the pod builder names the same namespace, ServiceAccount
# and projected-token audience).

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def _dns_label(v: str) -> str | None:
    return None if len(v) <= 63 and _DNS_LABEL.fullmatch(v) else "must be a Kubernetes namespace name (RFC 1123 label)"


def _dns_subdomain(v: str) -> str | None:
    ok = len(v) <= 253 and _DNS_SUBDOMAIN.fullmatch(v)
    return None if ok else "must be a Kubernetes ServiceAccount name (RFC 1123 subdomain)"


def _audience(v: str) -> str | None:
    if not v or any(c.isspace() for c in v) or "," in v:
        return "must be one non-empty audience string without spaces or commas"
    return None


EXCHANGE_OPTIONS: tuple[Option, ...] = (
    Option("namespace", "string", "default", "Kubernetes namespace of the task pods. The token exchange accepts "
           "only tokens of pods in it.", _dns_label),
    Option("service_account", "string", "default", "ServiceAccount the task pods run as. The token exchange "
           "accepts only that ServiceAccount's tokens (`system:serviceaccount:<namespace>:<service_account>`).",
           _dns_subdomain),
    Option("exchange_audience", "string", "leoflow", "Audience of the projected ServiceAccount token a task pod "
           "presents to `POST /leoflow/v1/exchange`; the api-server's TokenReview asks for exactly this audience, "
           "so a token made for anything else (the Kubernetes API itself included) is refused.", _audience),
    Option("kube_config", "string", "", "Kubeconfig file the api-server's token exchange (TokenReview, pod "
           "GET) uses. Empty: the in-cluster ServiceAccount configuration."),
    Option("exchange_timeout", "float", "5", "Seconds each Kubernetes call of one token exchange (TokenReview, "
           "then the pod GET) may take; a call that does not answer in time makes the exchange answer 503 "
           "(try again), never hold the request open.", _positive),
)
"""The ``[leoflow]`` options of the token exchange (also listed in the provider's config)."""


@dataclass(frozen=True)
class ExchangeSettings:
    """The token exchange's options (:data:`EXCHANGE_OPTIONS`), parsed by :func:`load_exchange`."""

    runtime: str
    """``[leoflow] runtime``: the exchange serves only ``kubernetes``."""
    namespace: str
    """Namespace of the task pods."""
    service_account: str
    """ServiceAccount the task pods run as."""
    exchange_audience: str
    """Audience of the projected token (TokenReview ``spec.audiences``)."""
    kube_config: str
    """Kubeconfig path; empty: in-cluster."""
    exchange_timeout: float
    """Seconds per Kubernetes call of one exchange."""

    @property
    def username(self) -> str:
        """The only username a TokenReview may name: ``system:serviceaccount:<namespace>:<service_account>``."""
        return f"system:serviceaccount:{self.namespace}:{self.service_account}"


def load_exchange(get: Callable[[str, str, str], str] | None = None) -> ExchangeSettings:
    """Read and validate the token exchange's options and ``[leoflow] runtime``.

    Unlike :func:`load`, accepts ``runtime = kubernetes`` (the api-server's plugin serves the exchange only
    then).

    :param get: ``get(section, key, fallback) -> str``; defaults to Airflow's ``conf.get``.
    :raises ConfigError: for the first malformed value, naming key and value.
    """
    if get is None:
        from airflow.configuration import conf

        def get(section: str, key: str, fallback: str) -> str:
            return conf.get(section, key, fallback=fallback)

    runtime = next(o for o in OPTIONS if o.name == "runtime")
    values: dict[str, Any] = {"runtime": _parse(runtime, str(get(SECTION, "runtime", runtime.default)))}
    for opt in EXCHANGE_OPTIONS:
        values[opt.name] = _parse(opt, str(get(SECTION, opt.name, opt.default)))
    return ExchangeSettings(**values)


@dataclass(frozen=True)
class LeoflowSettings:
    """The parsed ``[leoflow]`` section (each option's text is in :data:`OPTIONS`). Durations are seconds
    (float), sizes are counts. Grouped by who reads them; new keys carry their unit in the name
    (``…_seconds``)."""

    # --- runtime (Lite)
    runtime: str
    """``lite`` (``kubernetes`` is refused in this release)."""
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
    end_drain_timeout: float
    """Seconds ``end()`` waits for running attempts (0: leave them for the successor)."""
    record_retention: float
    """Seconds a closed attempt's record files are kept."""
    # --- settle
    maintenance_interval: float
    """Seconds between two reconcile passes, at most."""
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
    replay_holdoff_max_seconds: float
    """Seconds after an attempt's exit during which a replayable record keeps Airflow's purge off, at most."""
    # --- testing (TEST ONLY)
    test_fault_injection: bool
    """Honour per-attempt fault points."""
    test_fault_plan: str
    """JSON file of fault points keyed ``dag_id/run_id/task_id/try_number/attempt_epoch``."""
    test_host: str
    """The host stamp to use instead of the real one (only with ``test_fault_injection``)."""


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


def load(get: Callable[[str, str, str], str] | None = None) -> LeoflowSettings:
    """Read and validate ``[leoflow]``.

    :param get: ``get(section, key, fallback) -> str``; defaults to Airflow's ``conf.get``.
    :raises ConfigError: for the first malformed value, naming key and value.
    """
    if get is None:
        from airflow.configuration import conf

        def get(section: str, key: str, fallback: str) -> str:
            return conf.get(section, key, fallback=fallback)

    values: dict[str, Any] = {}
    for opt in OPTIONS:
        values[opt.name] = _parse(opt, str(get(SECTION, opt.name, opt.default)))
    if not values["runtime_dir"]:
        home = os.environ.get("AIRFLOW_HOME") or os.path.expanduser("~/airflow")
        values["runtime_dir"] = os.path.join(home, "leoflow")
    values["agent_env_passthrough"] = _split_names(values["agent_env_passthrough"])
    values["zygote_preload"] = _split_names(values["zygote_preload"])
    values["agent_env_deny"] = _split_names(values["agent_env_deny"])
    if values["runtime"] == "kubernetes":
        raise ConfigError(f"{SECTION}.runtime", "kubernetes", "the Kubernetes runtime is not in this release; use `lite`")
    return LeoflowSettings(**values)


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
                for o in OPTIONS + EXCHANGE_OPTIONS
            },
        }
    }
