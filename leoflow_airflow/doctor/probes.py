"""The doctor's I/O (issue 12 item 3): read the live Airflow config, probe the api-server's ``/leoflow`` app,
ask the Kubernetes API and read the ledger; :func:`run` turns what it found into findings through the pure
:mod:`leoflow_airflow.doctor.findings`.

Identities: the doctor runs with the scheduler's config, so it reaches Kubernetes as the scheduler does
(``[leoflow] in_cluster`` / ``kube_config``) and mints the probe token with the scheduler's signing config.
Beyond the scheduler's least-privilege Role, three checks need more, and each says "cannot check" (a warning,
never a silent pass) when the identity lacks it: ``api_server_rbac`` (``create subjectaccessreviews``),
``pod_security`` (``get namespaces/<namespace>``) and ``pull_secrets`` (``get secrets``). Every call is
read-only: reviews, GETs and LISTs, a ``dryRun=All`` pod create, and a probe token that opens nothing
(:mod:`~leoflow_airflow.doctor.probe_token`).
"""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import dataclass
from typing import Any

from leoflow_airflow import __version__
from leoflow_airflow.doctor import findings as F
from leoflow_airflow.doctor.findings import Finding

__all__ = ["DoctorOptions", "run"]


@dataclass(frozen=True)
class DoctorOptions:
    """The command line: ``api_server_urls`` (the ``/leoflow`` base URLs to probe; empty: ``[leoflow]
    exchange_url``, derived from ``[api] base_url`` when unset), ``api_server_user`` (the api-server's
    Kubernetes user for ``api_server_rbac``; empty: skipped), ``timeout`` (seconds per HTTP or API call)."""

    api_server_urls: tuple[str, ...] = ()
    api_server_user: str = ""
    timeout: float = 10.0


def run(options: DoctorOptions) -> list[Finding]:
    """Every check of :data:`~leoflow_airflow.doctor.findings.CHECKS`, in that order (``mint_key``,
    ``audience`` and ``exchange_url`` once per api-server URL). Never raises for what it checks: a miss is a
    finding."""
    from leoflow_airflow import ladder, settings
    from leoflow_airflow.errors import ConfigError

    try:
        parsed = settings.load()
    except ConfigError as exc:
        return [F.config_finding(str(exc))] + [F.skip(n, "needs [leoflow] to parse") for n in F.CHECKS[1:]]
    out = [F.config_finding(None), F.ladder_finding(ladder.evaluate(ladder.read_values(parsed)))]
    kube = parsed.kubernetes if parsed.runtime == "kubernetes" else None
    local = _local_mint(kube)
    urls, source = _api_server_urls(options, parsed.kubernetes.exchange_url)
    if not urls:
        mint, aud = F.mint_findings(local, None)
        out += [mint, aud, F.skip("exchange_url", "no api-server URL known: set [api] base_url")]
    for url in urls:
        health = _health(url, options.timeout)
        reply = (_verify(url, local, options.timeout) if health.status is not None
                 else F.VerifyReply(url, error="unreachable"))
        out += [*F.mint_findings(local, reply), F.exchange_url_finding(health, __version__, source=source)]
    if kube is None:
        out += [F.skip(n, "runtime = lite: no Kubernetes") for n in F.KUBERNETES_CHECKS]
    else:
        out += _kubernetes(kube, options)
    out.append(_warm_pools(kube, parsed.warm, options.timeout) if kube is not None and parsed.warm.enabled
               else F.warm_pools_finding(None))
    return out


def _warm_pools(kube: Any, warm: Any, timeout: float) -> Finding:
    """``warm_pools`` on Kubernetes: the namespace's live warm pods (the pool's own label selector) counted per DAG
    version against its ``max_pool_size`` (the DAG's ``warm_pools`` override or the ``[leoflow]`` default) and per
    tenant against ``warm_tenant_cap`` (:func:`~.findings.warm_pool_counts`); each version's DAG from Airflow's
    ``dag_version`` table."""
    import uuid

    from kubernetes import client

    from leoflow_airflow.runtime.kubernetes import warmpods
    from leoflow_airflow.runtime.kubernetes.review import api_client_from_config
    from leoflow_airflow.warm.targets import PoolDefaults, parse_overrides, sizes

    try:
        api = api_client_from_config(in_cluster=kube.in_cluster, kube_config=kube.kube_config)
        try:
            pods = client.CoreV1Api(api).list_namespaced_pod(kube.namespace,
                                                             label_selector=warmpods.warm_selector(kube.instance),
                                                             _request_timeout=timeout).items
        finally:
            api.close()
        live = [p.metadata.labels or {} for p in pods if p.metadata.deletion_timestamp is None
                and (p.status is None or p.status.phase not in ("Succeeded", "Failed"))]
        dag_ids: dict[str, str] = {}
        versions = {labels.get("leoflow.io/dag-version") or "" for labels in live}
        ids = []
        for v in versions:
            try:
                ids.append(uuid.UUID(v))
            except ValueError:
                continue
        if ids:
            from airflow.models.dag_version import DagVersion
            from airflow.utils.session import create_session
            from sqlalchemy import select

            with create_session() as session:
                for vid, dag_id in session.execute(select(DagVersion.id, DagVersion.dag_id)
                                                   .where(DagVersion.id.in_(ids))):
                    dag_ids[str(vid)] = dag_id
    except Exception as exc:  # noqa: BLE001 - reported: the pools could not be read
        return F.warm_pools_finding(None, error=_api_error(exc)[1])
    defaults = PoolDefaults(warm.warm_min_idle, warm.warm_max_pool_size, warm.warm_prewarm)
    overrides = parse_overrides(warm.warm_pools)

    def caps(version: str) -> tuple[str, int]:
        dag_id = dag_ids.get(version, version)
        min_idle, max_pool_size, _ = sizes(dag_id, defaults, overrides)
        return dag_id, max(min_idle, max_pool_size)

    return F.warm_pools_finding(F.warm_pool_counts(live, caps, warm.warm_tenant_cap))


def _local_mint(kube: Any) -> F.LocalMint:
    """Whether the scheduler's config shares a signing key, can mint, and what for (:class:`~.findings.
    LocalMint`); the probe token itself is minted per api-server (:func:`_verify`)."""
    from airflow.configuration import AIRFLOW_CONFIG, conf

    from leoflow_airflow.api.exchange import build_generator, signing_configured

    shared = signing_configured(os.environ, AIRFLOW_CONFIG)
    audience = conf.get_mandatory_list_value("execution_api", "jwt_audience")[0]
    error = ""
    try:
        build_generator()
    except Exception as exc:  # noqa: BLE001 - reported: no key, an unreadable key file
        error = f"{type(exc).__name__}: {exc}"
    view = {"runtime": "lite"} if kube is None else {
        "runtime": "kubernetes", "namespace": kube.namespace, "service_account": kube.service_account,
        "exchange_audience": kube.exchange_audience}
    return F.LocalMint(shared=shared, error=error, audience=audience, leoflow=view)


def _api_server_urls(options: DoctorOptions, exchange_url: str) -> tuple[list[str], str]:
    """The ``/leoflow`` base URLs to probe and the key they came from (for the fix text): ``--api-server-url``,
    else ``exchange_url`` (``[leoflow] exchange_url``, already derived from ``[api] base_url`` on Kubernetes),
    else ``[api] base_url`` + ``/leoflow``, else none."""
    if options.api_server_urls:
        return [u.rstrip("/") for u in options.api_server_urls], "--api-server-url"
    if exchange_url:
        return [exchange_url.rstrip("/")], "[leoflow] exchange_url"
    from airflow.configuration import conf

    base = (conf.get("api", "base_url", fallback="") or "").strip()
    return ([base.rstrip("/") + "/leoflow"] if base else []), "[api] base_url"


def _health(url: str, timeout: float) -> F.HealthReply:
    """``GET <url>/v1/health``."""
    import httpx

    try:
        r = httpx.get(f"{url}/v1/health", timeout=timeout)
    except httpx.HTTPError as exc:
        return F.HealthReply(url, error=f"{type(exc).__name__}: {str(exc)[:200]}")
    version = ""
    try:
        body = r.json()
        if isinstance(body, dict) and body.get("status") == "ok" and isinstance(body.get("version"), str):
            version = body["version"]
    except ValueError:
        pass
    return F.HealthReply(url, status=r.status_code, version=version)


def _verify(url: str, local: F.LocalMint, timeout: float) -> F.VerifyReply:
    """Mint a probe token with the scheduler's config and ask the api-server at ``url`` to verify it."""
    import httpx

    from leoflow_airflow.api.exchange import build_generator
    from leoflow_airflow.doctor import probe_token

    if not local.shared or local.error:
        return F.VerifyReply(url, error="no probe minted")
    token = probe_token.mint_probe(build_generator())
    try:
        r = httpx.post(f"{url}{probe_token.VERIFY_PATH}", json={"token": token}, timeout=timeout)
    except httpx.HTTPError as exc:
        return F.VerifyReply(url, error=f"{type(exc).__name__}: {str(exc)[:200]}")
    if r.status_code != 200:
        return F.VerifyReply(url, error=f"HTTP {r.status_code}", http_status=r.status_code)
    try:
        body = r.json()
    except ValueError:
        return F.VerifyReply(url, error="the answer is not JSON", http_status=200)
    if not isinstance(body, dict) or body.get("reason") not in probe_token.VERIFY_REASONS:
        return F.VerifyReply(url, error=f"unexpected answer {str(body)[:100]}", http_status=200)
    leoflow = body.get("leoflow") if isinstance(body.get("leoflow"), dict) else {}
    audiences = body.get("accepted_audiences") if isinstance(body.get("accepted_audiences"), list) else []
    return F.VerifyReply(url, reason=body["reason"], http_status=200,
                         accepted_audiences=tuple(str(a) for a in audiences),
                         leoflow={str(k): str(v) for k, v in leoflow.items()})


def _api_error(exc: Exception) -> tuple[int | None, str]:
    """``(HTTP status, message)`` of a Kubernetes client error (the Status object's message when there is one)."""
    status = getattr(exc, "status", None)
    body = getattr(exc, "body", None)
    message = ""
    if body:
        try:
            message = json.loads(body).get("message", "")
        except (ValueError, AttributeError):
            message = ""
    if not message:
        message = f"{type(exc).__name__}: {getattr(exc, 'reason', None) or str(exc)[:200]}"
    return status, (f"HTTP {status}: {message}" if status else message)[:500]


def _kubernetes(kube: Any, options: DoctorOptions) -> list[Finding]:
    """The Kubernetes checks of :data:`~.findings.KUBERNETES_CHECKS`, in order, as the scheduler's identity."""
    from kubernetes import client

    from leoflow_airflow.runtime.kubernetes import access
    from leoflow_airflow.runtime.kubernetes.review import api_client_from_config

    ns, timeout = kube.namespace, options.timeout
    try:
        api = api_client_from_config(in_cluster=kube.in_cluster, kube_config=kube.kube_config)
    except Exception as exc:  # noqa: BLE001 - reported: a config the client cannot load
        where = "in-cluster ServiceAccount" if kube.in_cluster else f"kubeconfig {kube.kube_config or '(default)'}"
        first = Finding("scheduler_rbac", F.Status.FAIL, f"cannot load the Kubernetes client configuration "
                        f"({where}): {type(exc).__name__}: {exc}", "fix [leoflow] in_cluster / kube_config")
        return [first] + [F.skip(n, "no Kubernetes client") for n in F.KUBERNETES_CHECKS[1:]]
    try:
        core = client.CoreV1Api(api)
        out = [F.rbac_finding("scheduler_rbac", "the scheduler's identity", ns,
                              access.review_access(api, ns, timeout=timeout),
                              grant="a Role and RoleBinding in the task namespace")]
        if options.api_server_user:
            user = options.api_server_user
            out.append(F.rbac_finding("api_server_rbac", f"the api-server's identity {user}", ns,
                                      access.review_subject_access(api, user, ns, timeout=timeout),
                                      grant="a ClusterRole for tokenreviews and a Role in the task namespace"))
        else:
            out.append(F.skip("api_server_rbac", "no api-server identity given (--api-server-user "
                                                 "system:serviceaccount:<namespace>:<name>)"))
        sa, sa_finding = _service_account(core, ns, kube.service_account, timeout)
        out.append(sa_finding)
        sample, sample_error = _sample_pod(kube)
        out.append(_pull_secrets(core, ns, sa, sample, timeout))
        out.append(_pod_security(core, ns, timeout))
        if sample is None:
            out.append(F.dry_run_finding(ns, f"leoflow's pod builder refused the sample pod: {sample_error}"))
        else:
            try:
                core.create_namespaced_pod(ns, sample, dry_run="All", _request_timeout=timeout)
                out.append(F.dry_run_finding(ns, None))
            except Exception as exc:  # noqa: BLE001 - the refusal is the finding
                status, message = _api_error(exc)
                out.append(F.dry_run_finding(ns, message, status=status))
        out.append(_finalizers(core, ns, kube.instance, timeout))
        out.append(_exchange_issuer(api, kube.exchange_issuers, timeout))
        return out
    finally:
        api.close()


def _exchange_issuer(api: Any, configured: tuple[str, ...], timeout: float) -> Finding:
    """``exchange_issuer``: read the cluster's OIDC discovery document (``WellKnownApi``) only when
    ``[leoflow] exchange_issuers`` is set, and compare (:func:`~.findings.exchange_issuer_finding`)."""
    from kubernetes import client

    if not configured:
        return F.exchange_issuer_finding(configured, None)
    try:
        resp = client.WellKnownApi(api).get_service_account_issuer_open_id_configuration(
            _request_timeout=timeout, _preload_content=False)  # the raw JSON: the client's "str" is a dict's repr
        doc = json.loads(resp.data)
        issuer = doc.get("issuer") if isinstance(doc, dict) else None
        if not isinstance(issuer, str) or not issuer:
            return F.exchange_issuer_finding(configured, None, "the document names no issuer")
    except Exception as exc:  # noqa: BLE001 - reported: 403 (no discovery grant), 404, unreachable
        return F.exchange_issuer_finding(configured, None, _api_error(exc)[1])
    return F.exchange_issuer_finding(configured, issuer)


def _service_account(core: Any, ns: str, name: str, timeout: float) -> tuple[Any, Finding]:
    """The task ServiceAccount (or None) and its finding."""
    try:
        sa = core.read_namespaced_service_account(name, ns, _request_timeout=timeout)
    except Exception as exc:  # noqa: BLE001 - 404 is the finding; anything else "cannot check"
        status, message = _api_error(exc)
        if status == 404:
            return None, F.service_account_finding(ns, name, False)
        return None, F.service_account_finding(ns, name, None, message)
    return sa, F.service_account_finding(ns, name, True)


def _sample_pod(kube: Any) -> tuple[Any, str]:
    """A sample task pod built by leoflow's own pod builder with the operator's template and
    ``pod_mutation_hook`` (as the runtime builds one), or ``(None, why)``."""
    from leoflow_airflow.runtime.kubernetes import template
    from leoflow_airflow.runtime.kubernetes.pod import PodAttempt, build_pod

    attempt = PodAttempt(ti_id=str(uuid.uuid4()), try_number=1, attempt_epoch=1, dag_id="leoflow-doctor",
                         task_id="sample", run_id="doctor-dry-run")
    try:
        return build_pod(attempt, kube, template=template.load_pod_template(kube.pod_template_file),
                         mutation_hook=template.airflow_pod_mutation_hook()), ""
    except Exception as exc:  # noqa: BLE001 - PodRefused, ConfigError of the template: the finding
        return None, f"{type(exc).__name__}: {exc}"


def _pull_secrets(core: Any, ns: str, sa: Any, sample: Any, timeout: float) -> Finding:
    """Every imagePullSecret of the task ServiceAccount and of the sample pod exists."""
    names = {r.name for r in (getattr(sa, "image_pull_secrets", None) or []) if r.name}
    if sample is not None:
        names |= {r.name for r in (sample.spec.image_pull_secrets or []) if r.name}
    found: dict[str, bool | None] = {}
    for name in sorted(names):
        try:
            core.read_namespaced_secret(name, ns, _request_timeout=timeout)
            found[name] = True
        except Exception as exc:  # noqa: BLE001 - 404 missing, 403 cannot check
            status, _ = _api_error(exc)
            found[name] = False if status == 404 else None
    return F.pull_secrets_finding(ns, found)


def _pod_security(core: Any, ns: str, timeout: float) -> Finding:
    """The task namespace's labels (its Pod Security level)."""
    try:
        obj = core.read_namespace(ns, _request_timeout=timeout)
    except Exception as exc:  # noqa: BLE001 - 403: cannot check; 404: the namespace is missing
        status, message = _api_error(exc)
        if status == 404:
            return Finding("pod_security", F.Status.FAIL, f"namespace {ns} does not exist",
                           f"create it (the Helm chart does) or set [leoflow] namespace")
        return F.pod_security_finding(ns, None, message)
    return F.pod_security_finding(ns, obj.metadata.labels or {})


def _finalizers(core: Any, ns: str, instance: str, timeout: float) -> Finding:
    """Pods holding leoflow's finalizer, terminal or deleting, whose attempt's ledger row is closed or gone:
    what the runtime's ``collect()`` should have released (:func:`.decide.release_due`)."""
    from leoflow_airflow.ledger.states import AttemptState
    from leoflow_airflow.runtime.kubernetes.decide import finalizer_index
    from leoflow_airflow.runtime.kubernetes.runtime import label_selector
    from leoflow_airflow.runtime.kubernetes.status import pod_view

    held = []
    try:
        token = None
        while True:
            page = core.list_namespaced_pod(ns, label_selector=label_selector(instance), limit=500, _continue=token,
                                            _request_timeout=timeout, _preload_content=False)
            data = json.loads(page.data)
            for obj in data.get("items", []):
                view = pod_view(obj)
                if view is not None and finalizer_index(view.finalizers) is not None and (
                        view.terminal or view.deleting):
                    held.append(view)
            token = (data.get("metadata") or {}).get("continue")
            if not token:
                break
    except Exception as exc:  # noqa: BLE001 - "cannot check"
        return F.finalizers_finding(ns, [], _api_error(exc)[1])
    if not held:
        return F.finalizers_finding(ns, [])
    try:
        from leoflow_airflow.ledger.store import LedgerStore

        store = LedgerStore.from_airflow()
    except Exception as exc:  # noqa: BLE001
        return F.finalizers_finding(ns, [], f"the ledger cannot be read: {type(exc).__name__}: {exc}")
    leftover = []
    try:
        for view in held:
            if view.ref is None:
                leftover.append(f"{view.name} (names no attempt)")
                continue
            row = store.get_epoch(view.ref.ti_id, view.ref.attempt_epoch)
            if row is None or row.state is AttemptState.CLOSED:
                why = "no ledger row" if row is None else "settled"
                leftover.append(f"{view.name} ({why})")
    except Exception as exc:  # noqa: BLE001
        return F.finalizers_finding(ns, [], f"the ledger cannot be read: {type(exc).__name__}: {exc}")
    finally:
        store.dispose()
    return F.finalizers_finding(ns, leftover)
