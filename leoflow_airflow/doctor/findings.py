"""The doctor's findings (issue 12 item 3): pure. The probes (:mod:`leoflow_airflow.doctor.probes`) gather facts
into the small records below; each ``*_finding`` function turns one check's facts into a :class:`Finding` that
names the miss and its fix; :func:`render_table`, :func:`render_json` and :func:`exit_code` present them.

A finding's ``status``: ``ok`` (the check passed), ``warn`` (works, but below what leoflow recommends, or the
check could not be made: "cannot check ..."), ``fail`` (a working install needs this fixed), ``skip`` (the check
does not apply: the Lite runtime, no warm pools, or an earlier miss it depends on). The exit code is 1 when
any finding failed, else 0.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from leoflow_airflow.ladder import LadderReport
    from leoflow_airflow.runtime.kubernetes.access import AccessResult

__all__ = [
    "CHECKS",
    "Finding",
    "HealthReply",
    "KUBERNETES_CHECKS",
    "LocalMint",
    "Status",
    "VerifyReply",
    "config_finding",
    "dry_run_finding",
    "exchange_issuer_finding",
    "exchange_url_finding",
    "exit_code",
    "finalizers_finding",
    "ladder_finding",
    "mint_findings",
    "pod_security_finding",
    "pull_secrets_finding",
    "rbac_finding",
    "render_json",
    "render_table",
    "service_account_finding",
    "skip",
    "warm_pool_counts",
    "warm_pools_finding",
]


class Status(str, enum.Enum):
    """A finding's verdict (module docstring)."""

    OK = "ok"
    WARN = "warn"
    FAIL = "fail"
    SKIP = "skip"


@dataclass(frozen=True)
class Finding:
    """One check's result: ``name`` (one of :data:`CHECKS`), ``status``, ``detail`` (what was found, naming
    the object: a URL, a namespace, a rule) and ``fix`` (what to change; empty when ``ok`` or ``skip``)."""

    name: str
    status: Status
    detail: str
    fix: str = ""


CHECKS: tuple[str, ...] = (
    "config", "ladder", "mint_key", "audience", "exchange_url", "scheduler_rbac", "api_server_rbac",
    "task_service_account", "pull_secrets", "pod_security", "dry_run_pod", "finalizers", "exchange_issuer",
    "warm_pools",
)
"""Every check, in the order the doctor runs and prints them."""
KUBERNETES_CHECKS: tuple[str, ...] = (
    "scheduler_rbac", "api_server_rbac", "task_service_account", "pull_secrets", "pod_security", "dry_run_pod",
    "finalizers", "exchange_issuer",
)
"""The checks that only the Kubernetes runtime needs (skipped by name on Lite)."""


def skip(name: str, why: str) -> Finding:
    """A ``skip`` finding for check ``name`` saying ``why``."""
    return Finding(name, Status.SKIP, why)


def config_finding(error: str | None) -> Finding:
    """``config``: ``[leoflow]`` parsed (``error`` None) or the first :class:`~leoflow_airflow.errors.ConfigError`
    (its text names key and value)."""
    if error is None:
        return Finding("config", Status.OK, "[leoflow] parses and its options fit together")
    return Finding("config", Status.FAIL, error, "fix the named key in airflow.cfg or its AIRFLOW__… variable")


def ladder_finding(report: LadderReport) -> Finding:
    """``ladder``: fail naming every broken hard rung, warn naming the soft ones (DESIGN §2 "The recovery
    window"; :func:`leoflow_airflow.ladder.evaluate`)."""
    if report.violations:
        names = ", ".join(r.rung for r in report.violations)
        first = report.violations[0]
        return Finding("ladder", Status.FAIL, f"broken rungs: {names} ({first.message})",
                       "change the named keys so the ladder holds; `airflow leoflow check` prints every value")
    if report.warnings:
        names = ", ".join(r.rung for r in report.warnings)
        return Finding("ladder", Status.WARN, f"soft rungs broken: {names} ({report.warnings[0].message})",
                       "change the named keys; `airflow leoflow check` prints every value")
    return Finding("ladder", Status.OK, "every rung holds")


@dataclass(frozen=True)
class LocalMint:
    """What the doctor (with the scheduler's config) found about minting: ``shared`` (``[api_auth]
    jwt_secret`` or ``jwt_private_key_path`` configured, not made up per process), ``error`` (why no probe
    could be minted; empty when one was), ``audience`` (the ``aud`` it mints for: the first ``[execution_api]
    jwt_audience``), and the scheduler's ``[leoflow]`` view the api-server's exchange must share (``runtime``,
    and on Kubernetes ``namespace``, ``service_account``, ``exchange_audience``)."""

    shared: bool
    error: str
    audience: str
    leoflow: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class VerifyReply:
    """An api-server's answer to the probe at ``url`` (``…/leoflow/v1/doctor/verify``): ``reason`` from
    :data:`~leoflow_airflow.doctor.probe_token.VERIFY_REASONS`, or ``error`` when there was no such answer
    (unreachable, an HTTP status other than 200, not JSON). ``accepted_audiences`` and ``leoflow`` as the route
    gives them."""

    url: str
    reason: str = ""
    error: str = ""
    http_status: int | None = None
    accepted_audiences: tuple[str, ...] = ()
    leoflow: Mapping[str, str] = field(default_factory=dict)


_SECRET_FIX = ("give the scheduler and every api-server worker and replica the same [api_auth] jwt_secret "
               "(AIRFLOW__API_AUTH__JWT_SECRET) or the same [api_auth] jwt_private_key_path, then restart them")


def mint_findings(local: LocalMint, reply: VerifyReply | None) -> tuple[Finding, Finding]:
    """``mint_key`` and ``audience`` for one api-server: does it accept a token minted with the scheduler's
    signing config (:mod:`~leoflow_airflow.doctor.probe_token`), for the audience the scheduler mints, and does
    its token exchange check the namespace, ServiceAccount and projected-token audience the scheduler's pods
    carry? ``reply`` None: no api-server URL is known."""
    if not local.shared:
        return (Finding("mint_key", Status.FAIL,
                        "no [api_auth] jwt_secret or jwt_private_key_path is configured: each process makes up its "
                        "own secret, so a token one mints fails validation in another", _SECRET_FIX),
                skip("audience", "needs a shared mint key first"))
    if local.error:
        return (Finding("mint_key", Status.FAIL, f"the scheduler's config cannot mint tokens: {local.error}",
                        "fix [api_auth] jwt_secret / jwt_private_key_path (a readable PEM key)"),
                skip("audience", "needs a mint key that works first"))
    if reply is None:
        return (skip("mint_key", "no api-server URL to probe (set [leoflow] exchange_url or [api] base_url)"),
                skip("audience", "no api-server URL to probe"))
    where = f"api-server at {reply.url}"
    if reply.error:
        if reply.http_status == 404:
            return (Finding("mint_key", Status.FAIL, f"{where} has no doctor verify route (HTTP 404): it serves "
                            "no /leoflow app, or an older leoflow", "install this leoflow version on the "
                            "api-servers (the plugin mounts /leoflow); see exchange_url"),
                    skip("audience", "the api-server cannot be probed"))
        return (skip("mint_key", f"{where} cannot be probed: {reply.error} (see exchange_url)"),
                skip("audience", f"{where} cannot be probed"))
    reason = reply.reason
    if reason == "signature":
        return (Finding("mint_key", Status.FAIL, f"{where} verifies with a different key: it refused the "
                        "signature of a token minted with the scheduler's config", _SECRET_FIX),
                skip("audience", "needs the same mint key first"))
    if reason == "no_key":
        return (Finding("mint_key", Status.FAIL, f"{where} has no signing key configured: it cannot validate any "
                        "task token", _SECRET_FIX), skip("audience", "needs the same mint key first"))
    if reason == "issuer":
        return (Finding("mint_key", Status.FAIL, f"{where} verifies the signature but expects another issuer",
                        "set the same [api_auth] jwt_issuer on the scheduler and every api-server"),
                skip("audience", "needs the same issuer first"))
    if reason == "clock":
        return (Finding("mint_key", Status.FAIL, f"{where} finds a fresh token expired or not yet valid: the "
                        "clocks of this host and the api-server disagree", "synchronise the clocks (NTP); "
                        "[api_auth] jwt_leeway bounds the skew tolerated"), skip("audience", "clock skew"))
    if reason == "audience":
        accepted = ", ".join(reply.accepted_audiences) or "(none)"
        return (Finding("mint_key", Status.OK, f"{where} verifies the scheduler's signature"),
                Finding("audience", Status.FAIL, f"wrong audience: {where} accepts [execution_api] jwt_audience "
                        f"{accepted}, the scheduler mints for {local.audience}",
                        "set the same [execution_api] jwt_audience on the scheduler and every api-server"))
    if reason != "verified":
        return (Finding("mint_key", Status.FAIL, f"{where} answered {reason!r} to the probe",
                        "run the same leoflow version on the doctor's host and the api-servers"),
                skip("audience", "the probe was not understood"))
    key_ok = Finding("mint_key", Status.OK, f"{where} verifies tokens minted with the scheduler's config")
    theirs = dict(reply.leoflow)
    if "error" in theirs:
        return key_ok, Finding("audience", Status.FAIL, f"{where}'s [leoflow] does not parse: {theirs['error']}",
                               "fix [leoflow] on the api-servers")
    ours = dict(local.leoflow)
    if ours.get("runtime") != "kubernetes":
        return key_ok, Finding("audience", Status.OK, f"{where} accepts the audience the scheduler mints for "
                                                       f"({local.audience})")
    if theirs.get("runtime") != "kubernetes":
        return key_ok, Finding("audience", Status.FAIL, f"{where} has [leoflow] runtime = "
                               f"{theirs.get('runtime', '?')}: its token exchange is off",
                               "set [leoflow] runtime = kubernetes (and the same namespace, service_account and "
                               "exchange_audience) on the api-servers too")
    differ = [k for k in ("exchange_audience", "namespace", "service_account") if theirs.get(k) != ours.get(k)]
    if differ:
        said = "; ".join(f"[leoflow] {k}: api-server {theirs.get(k)!r}, scheduler {ours.get(k)!r}" for k in differ)
        lead = "wrong audience: " if "exchange_audience" in differ else ""
        return key_ok, Finding("audience", Status.FAIL, f"{lead}{where}'s token exchange would refuse the "
                               f"scheduler's pods: {said}",
                               "set the same [leoflow] " + ", ".join(differ) + " on the scheduler and every "
                               "api-server")
    return key_ok, Finding("audience", Status.OK, f"{where} accepts the audience the scheduler mints for "
                           f"({local.audience}) and its exchange checks audience {ours['exchange_audience']}, "
                           f"ServiceAccount {ours['namespace']}/{ours['service_account']}")


@dataclass(frozen=True)
class HealthReply:
    """The answer of ``GET <url>/v1/health``: ``status`` HTTP status (None: no answer), ``version`` the
    plugin's version when the body is leoflow's, ``error`` why there was no answer."""

    url: str
    status: int | None = None
    version: str = ""
    error: str = ""


def exchange_url_finding(reply: HealthReply, local_version: str, *, source: str) -> Finding:
    """``exchange_url``: the plugin app answers its health route at ``reply.url`` (``source`` names the key
    the URL came from); a version other than ``local_version`` is a warning."""
    url = reply.url
    fix = (f"set {source} to the URL under which the api-server serves leoflow's /leoflow app (its core app: an "
           "execution-only api-server serves no plugin), and make it reachable from the task pods")
    if reply.status is None:
        return Finding("exchange_url", Status.FAIL, f"{url} is unreachable: {reply.error}", fix)
    if reply.status != 200 or not reply.version:
        return Finding("exchange_url", Status.FAIL, f"{url}/v1/health answered HTTP {reply.status}, not leoflow's "
                       "health answer: nothing serves /leoflow there", fix)
    if reply.version != local_version:
        return Finding("exchange_url", Status.WARN, f"{url} serves leoflow {reply.version}, this host has "
                       f"{local_version}", "install the same leoflow version on the scheduler and api-servers")
    return Finding("exchange_url", Status.OK, f"{url} serves leoflow {reply.version}")


def rbac_finding(name: str, who: str, namespace: str, results: Sequence[AccessResult], *,
                 grant: str) -> Finding:
    """``scheduler_rbac`` / ``api_server_rbac``: each rule's answer (:mod:`~leoflow_airflow.runtime.kubernetes.
    access`); ``fail`` naming the denied ones, ``warn`` "cannot check" when a review could not be made."""
    undecided = [r for r in results if r.allowed is None]
    lacking = [r for r in results if r.allowed is False]
    if lacking:
        rules = ", ".join(str(r.rule) for r in lacking)
        return Finding(name, Status.FAIL, f"{who} may not {rules} in namespace {namespace}",
                       f"grant {rules} to {who} ({grant})")
    if undecided:
        return Finding(name, Status.WARN, f"cannot check {who}'s permissions: {undecided[0].reason}",
                       "let the doctor's identity create subjectaccessreviews.authorization.k8s.io (cluster-wide), "
                       "or run the doctor with a kubeconfig that may")
    rules = ", ".join(str(r.rule) for r in results)
    return Finding(name, Status.OK, f"{who} may {rules} in namespace {namespace}")


def service_account_finding(namespace: str, name: str, exists: bool | None, error: str = "") -> Finding:
    """``task_service_account``: the task pods' ServiceAccount exists (``exists`` None: could not read)."""
    if exists is None:
        return Finding("task_service_account", Status.WARN, f"cannot check ServiceAccount {namespace}/{name}: "
                       f"{error}", "let the doctor's identity get serviceaccounts in the namespace")
    if not exists:
        return Finding("task_service_account", Status.FAIL, f"ServiceAccount {namespace}/{name} does not exist: "
                       "no task pod can be created", f"create it (kubectl -n {namespace} create serviceaccount "
                       f"{name}) or set [leoflow] service_account to an existing one")
    return Finding("task_service_account", Status.OK, f"ServiceAccount {namespace}/{name} exists")


def pull_secrets_finding(namespace: str, found: Mapping[str, bool | None], error: str = "") -> Finding:
    """``pull_secrets``: every imagePullSecret the task pods use (their ServiceAccount's and the pod
    template's) exists; ``found`` maps each name to True/False, or None when it could not be read."""
    if error:
        return Finding("pull_secrets", Status.WARN, f"cannot check the image pull secrets: {error}",
                       "fix the task ServiceAccount first (see task_service_account)")
    if not found:
        return Finding("pull_secrets", Status.OK, "the task pods use no imagePullSecrets")
    missing = sorted(n for n, ok in found.items() if ok is False)
    unknown = sorted(n for n, ok in found.items() if ok is None)
    if missing:
        return Finding("pull_secrets", Status.FAIL, f"imagePullSecrets missing in namespace {namespace}: "
                       f"{', '.join(missing)}", f"create the Secret(s) in {namespace} (kubectl create secret "
                       "docker-registry ...) or drop them from the ServiceAccount / pod template")
    if unknown:
        return Finding("pull_secrets", Status.WARN, f"cannot check imagePullSecrets {', '.join(unknown)}: the "
                       "doctor's identity may not get secrets (the scheduler's least-privilege Role has none)",
                       "run the doctor with a kubeconfig that may get secrets in the namespace to check them")
    return Finding("pull_secrets", Status.OK, f"imagePullSecrets {', '.join(sorted(found))} exist")


_PSA_LEVELS = ("privileged", "baseline", "restricted")
_PSA_LABEL = "pod-security.kubernetes.io/enforce"


def pod_security_finding(namespace: str, labels: Mapping[str, str] | None, error: str = "") -> Finding:
    """``pod_security``: the task namespace's Pod Security Admission ``enforce`` level (``labels`` None:
    the namespace could not be read, ``error`` says why); below ``restricted`` is a warning (leoflow's pods
    meet ``restricted``; a lower level lets other pods of the namespace weaken it)."""
    fix = f"kubectl label namespace {namespace} {_PSA_LABEL}=restricted (leoflow's pods meet it)"
    if labels is None:
        return Finding("pod_security", Status.WARN, f"cannot check namespace {namespace}: {error}",
                       f"let the doctor's identity get namespaces/{namespace}")
    level = labels.get(_PSA_LABEL)
    if level == "restricted":
        return Finding("pod_security", Status.OK, f"namespace {namespace} enforces Pod Security restricted")
    if level is None:
        return Finding("pod_security", Status.WARN, f"namespace {namespace} has no {_PSA_LABEL} label: the "
                       "cluster's default level applies (privileged unless its admission config says otherwise)",
                       fix)
    if level not in _PSA_LEVELS:
        return Finding("pod_security", Status.FAIL, f"namespace {namespace} has {_PSA_LABEL}={level!r}, not a "
                       "level: Pod Security admission refuses every pod there", fix)
    return Finding("pod_security", Status.WARN, f"namespace {namespace} enforces Pod Security {level}, below "
                   "restricted", fix)


def dry_run_finding(namespace: str, error: str | None, *, status: int | None = None) -> Finding:
    """``dry_run_pod``: a sample task pod built by leoflow's pod builder passed admission (a ``dryRun=All``
    create: validation, Pod Security, quota, webhooks) or ``error`` (with the API's HTTP ``status``)."""
    if error is None:
        return Finding("dry_run_pod", Status.OK, f"a sample task pod passes admission in namespace {namespace} "
                       "(dry run)")
    if status == 403 and "forbidden: User" in error:
        return Finding("dry_run_pod", Status.FAIL, f"the scheduler's identity may not create pods: {error}",
                       "grant create pods (see scheduler_rbac)")
    return Finding("dry_run_pod", Status.FAIL, f"a sample task pod is refused in namespace {namespace}: {error}",
                   "fix what the API server names: the pod template ([leoflow] pod_template_file), the "
                   "namespace's ResourceQuota/LimitRange, or an admission webhook")


def finalizers_finding(namespace: str, leftover: Sequence[str], error: str = "") -> Finding:
    """``finalizers``: task pods still holding ``leoflow.io/outcome-record`` whose attempt is settled (its
    ledger row closed or gone); ``leftover`` names them (``pod (ti_id epoch N)``)."""
    if error:
        return Finding("finalizers", Status.WARN, f"cannot check leftover finalizers: {error}",
                       "let the doctor list pods in the namespace and read the metadata DB")
    if leftover:
        shown = ", ".join(leftover[:5]) + (f" and {len(leftover) - 5} more" if len(leftover) > 5 else "")
        return Finding("finalizers", Status.WARN, f"{len(leftover)} pod(s) in {namespace} hold leoflow's finalizer "
                       f"though their attempt is settled: {shown}", "a running leoflow scheduler releases them "
                       "(check it is up and may patch pods); when uninstalling, `airflow leoflow release-pods`")
    return Finding("finalizers", Status.OK, f"no settled attempt's pod in {namespace} holds leoflow's finalizer")


def exchange_issuer_finding(configured: Sequence[str], published: str | None, error: str = "") -> Finding:
    """``exchange_issuer``: ``[leoflow] exchange_issuers`` (``configured``; empty: ``iss`` is left to TokenReview)
    against the issuer the cluster publishes in its OIDC discovery document (``published``, the kube-apiserver's
    first ``--service-account-issuer``, the one new tokens carry; None with ``error`` when it could not be read).
    A list without it would refuse every task pod's exchange as ``implausible_token`` (issue 33 item 4)."""
    if not configured:
        return Finding("exchange_issuer", Status.OK, "[leoflow] exchange_issuers is empty: a token's iss is left to "
                       "TokenReview")
    if published is None:
        return Finding("exchange_issuer", Status.WARN, "cannot read the cluster's service-account issuer "
                       f"(/.well-known/openid-configuration): {error}", "let the doctor's identity read it "
                       "(ClusterRole system:service-account-issuer-discovery), or compare [leoflow] exchange_issuers "
                       "with the kube-apiserver's --service-account-issuer by hand")
    if published in configured:
        return Finding("exchange_issuer", Status.OK, f"the cluster's issuer {published} is in [leoflow] "
                       "exchange_issuers")
    return Finding("exchange_issuer", Status.FAIL, f"the cluster issues projected tokens as {published}, which "
                   f"[leoflow] exchange_issuers {list(configured)} does not list: every task pod's exchange and "
                   "warm registration would be refused (implausible_token)", "add it to [leoflow] exchange_issuers "
                   "(keep the old issuer listed while the cluster rotates)")


def warm_pool_counts(pods: Iterable[Mapping[str, str]], caps: Callable[[str], tuple[str, int]],
                     tenant_cap: int) -> dict[str, tuple[int, int]]:
    """What :func:`warm_pools_finding` checks, from the labels of the namespace's live warm pods (not terminal,
    not being deleted): ``{"<dag_id> (version <dag_version_id>)": (pods, cap)}`` with ``caps(version) -> (dag_id,
    max pods of that version)`` (the ``[leoflow] warm_*`` sizes with the DAG's ``warm_pools`` override), and, with
    ``tenant_cap`` > 0, ``{"tenant <tenant>": (pods, tenant_cap)}`` per ``leoflow.io/tenant`` label."""
    by_version: dict[str, int] = {}
    by_tenant: dict[str, int] = {}
    for labels in pods:
        version = labels.get("leoflow.io/dag-version") or ""
        by_version[version] = by_version.get(version, 0) + 1
        tenant = labels.get("leoflow.io/tenant")
        if tenant:
            by_tenant[tenant] = by_tenant.get(tenant, 0) + 1
    out: dict[str, tuple[int, int]] = {}
    for version, n in by_version.items():
        dag_id, cap = caps(version)
        out[f"{dag_id} (version {version})"] = (n, cap)
    if tenant_cap > 0:
        out.update({f"tenant {t}": (n, tenant_cap) for t, n in by_tenant.items()})
    return out


def warm_pools_finding(pools: Mapping[str, tuple[int, int]] | None, *, error: str | None = None) -> Finding:
    """``warm_pools``: each configured pool's ``(workers, cap)`` within its cap (:func:`warm_pool_counts`); None:
    no warm pools configured (skipped); ``error``: the pools could not be read (a warning naming it)."""
    if error is not None:
        return Finding("warm_pools", Status.WARN, f"cannot check the warm pools: {error}",
                       "check the scheduler's access to list pods in the task namespace and Airflow's DB")
    if pools is None:
        return skip("warm_pools", "no warm pools configured")
    if not pools:
        return Finding("warm_pools", Status.OK, "warm pools configured; no warm pod runs now")
    over = {k: v for k, v in pools.items() if v[0] > v[1]}
    if over:
        said = ", ".join(f"{k} {n}/{cap}" for k, (n, cap) in sorted(over.items()))
        return Finding("warm_pools", Status.FAIL, f"warm pools over their cap: {said}",
                       "check that the scheduler runs (it trims pools each loop) and the caps in [leoflow]")
    return Finding("warm_pools", Status.OK, f"{len(pools)} warm pool(s) within their caps")


_MARK = {Status.OK: "ok", Status.WARN: "WARN", Status.FAIL: "FAIL", Status.SKIP: "skip"}


def render_table(findings: Sequence[Finding]) -> str:
    """The human table: one line per finding (``STATUS  CHECK  DETAIL``), the fix indented under every warn
    and fail, and a summary line with the counts and the exit code."""
    width = max([len("CHECK")] + [len(f.name) for f in findings])
    lines = [f"{'STATUS':<6}  {'CHECK':<{width}}  DETAIL"]
    for f in findings:
        lines.append(f"{_MARK[f.status]:<6}  {f.name:<{width}}  {f.detail}")
        if f.fix and f.status in (Status.WARN, Status.FAIL):
            lines.append(f"{'':<6}  {'':<{width}}  fix: {f.fix}")
    counts = {s: sum(f.status is s for f in findings) for s in Status}
    lines.append(f"{counts[Status.OK]} ok, {counts[Status.WARN]} warn, {counts[Status.FAIL]} fail, "
                 f"{counts[Status.SKIP]} skipped; exit {exit_code(findings)}")
    return "\n".join(lines)


def render_json(findings: Sequence[Finding]) -> str:
    """``{"ok": bool, "exit_code": int, "findings": [{"name", "status", "detail", "fix"}, ...]}`` as JSON."""
    rows = [{**asdict(f), "status": f.status.value} for f in findings]
    return json.dumps({"ok": exit_code(findings) == 0, "exit_code": exit_code(findings), "findings": rows},
                      indent=2)


def exit_code(findings: Sequence[Finding]) -> int:
    """1 when any finding failed, else 0."""
    return 1 if any(f.status is Status.FAIL for f in findings) else 0
