"""The ``airflow leoflow`` CLI group (registered through the provider's ``cli`` entry).

* ``airflow leoflow check``: parse ``[leoflow]`` and evaluate the resilience ladder; with ``runtime = kubernetes``
  also report the namespace, image, exchange URL and audience, and ask the API server what the scheduler may do
  there (``SelfSubjectAccessReview``); exit 1 on a violation, a missing permission or an unreachable API server.
* ``airflow leoflow doctor [--json] [--api-server-url URL ...] [--api-server-user USER]``: every check a
  working install needs, against the live config, api-servers and cluster, each miss with its fix
  (:mod:`leoflow_airflow.doctor`); exit 1 when a check failed.
* ``airflow leoflow attempts [--limit N]``: list the ledger's open attempts.
* ``airflow leoflow release-pods [--namespace NS] [--dry-run]``: strip leoflow's finalizer
  (``leoflow.io/outcome-record``) from every leoflow pod of the task namespace, for an uninstall.
"""

from __future__ import annotations

import sys
from typing import Any

from airflow.cli.cli_config import ActionCommand, Arg, GroupCommand


def check(args: Any) -> None:
    """Print the parsed settings, the Airflow values the ladder compares, the recovery window and every broken
    rung; exit 1 when a hard rung is broken or config is bad."""
    from leoflow_airflow import ladder, settings
    from leoflow_airflow.errors import ConfigError

    try:
        parsed = settings.load()
    except ConfigError as exc:
        print(f"leoflow: {exc}", file=sys.stderr)
        sys.exit(1)
    values = ladder.read_values(parsed)
    report = ladder.evaluate(values)
    shown_values = {k: v for k, v in vars(parsed).items() if k != "kubernetes"} | vars(parsed.kubernetes)
    for name, value in sorted(shown_values.items()):
        shown = ",".join(value) if isinstance(value, tuple) else value
        print(f"[leoflow] {name} = {shown}")
    for name, (section, key, _) in ladder.AIRFLOW_KEYS.items():
        print(f"[{section}] {key} = {getattr(values, name):g}")
    lower, upper = ladder.window(values)
    state = "ok" if not report.violations else "BROKEN"
    print(f"recovery window: {lower:g} s < [leoflow] agent_lost_threshold ({values.agent_lost_threshold:g} s) "
          f"< {upper:g} s: {state}")
    for rung in report.warnings:
        print(f"WARNING {rung.rung}: {rung.message} {rung.values}")
    for rung in report.violations:
        print(f"VIOLATION {rung.rung}: {rung.message}", file=sys.stderr)
    kube_ok = _check_kubernetes(parsed) if parsed.runtime == "kubernetes" else True
    sys.exit(1 if report.violations or not kube_ok else 0)


def _check_kubernetes(parsed: Any) -> bool:
    """Print what the Kubernetes runtime will use and what the scheduler's identity may do in the task namespace
    (:mod:`leoflow_airflow.runtime.kubernetes.access`); return False when something is missing."""
    from leoflow_airflow.api.exchange import check_can_mint
    from leoflow_airflow.errors import ConfigError
    from leoflow_airflow.runtime.kubernetes import access
    from leoflow_airflow.runtime.kubernetes.review import api_client_from_config

    kube = parsed.kubernetes
    ok = True
    print(f"kubernetes: namespace {kube.namespace}, image {kube.image}, service account {kube.service_account}")
    print(f"kubernetes: exchange URL {kube.exchange_url}/v1/exchange, audience {kube.exchange_audience}")
    try:
        check_can_mint()
    except ConfigError as exc:
        print(f"FAIL token exchange: {exc}", file=sys.stderr)
        ok = False
    where = "in-cluster ServiceAccount" if kube.in_cluster else f"kubeconfig {kube.kube_config or '(default)'}"
    try:
        api_client = api_client_from_config(in_cluster=kube.in_cluster, kube_config=kube.kube_config)
    except Exception as exc:  # noqa: BLE001 - reported: a config the client cannot load
        print(f"FAIL kubernetes API access ({where}): {type(exc).__name__}: {exc}", file=sys.stderr)
        return False
    try:
        results = access.review_access(api_client, kube.namespace)
    finally:
        api_client.close()
    print(f"kubernetes: API server {api_client.configuration.host} as the {where}; in namespace {kube.namespace}:")
    for result in results:
        mark = {True: "ok  ", False: "DENY", None: "??  "}[result.allowed]
        said = f" ({result.reason})" if result.reason and result.allowed is False else ""
        print(f"  {mark} {str(result.rule):<22} {result.rule.why}{said}")
    undecided = [r for r in results if r.allowed is None]
    lacking = [r for r in results if r.allowed is False]
    if undecided:
        print(f"FAIL could not ask the API server {api_client.configuration.host} about {len(undecided)} of "
              f"{len(results)} permissions: {undecided[0].reason}", file=sys.stderr)
        ok = False
    if lacking:
        print(f"FAIL the scheduler's identity lacks {', '.join(str(r.rule) for r in lacking)} in namespace "
              f"{kube.namespace} (grant them with a Role and RoleBinding)", file=sys.stderr)
        ok = False
    rules = ", ".join(str(rule) for rule in access.EXCHANGE_RULES)
    print(f"kubernetes: the api-server's identity needs {rules} (`airflow leoflow doctor --api-server-user "
          "USER` checks them)")
    return ok


def doctor(args: Any) -> None:
    """Run every check of :mod:`leoflow_airflow.doctor` and print the table (or ``--json``); exit 1 when a
    finding failed, else 0."""
    from leoflow_airflow.doctor import findings
    from leoflow_airflow.doctor.probes import DoctorOptions, run

    if args.timeout <= 0:
        print("leoflow: --timeout must be greater than 0", file=sys.stderr)
        sys.exit(2)
    result = run(DoctorOptions(api_server_urls=tuple(args.api_server_url or ()),
                               api_server_user=args.api_server_user or "", timeout=args.timeout))
    print(findings.render_json(result) if args.json else findings.render_table(result))
    sys.exit(findings.exit_code(result))


def attempts(args: Any) -> None:
    """Print one line per attempt: ti_id, try, epoch, state, resolution, dag/task/run."""
    from sqlalchemy.exc import OperationalError, ProgrammingError

    from leoflow_airflow.ledger.store import LedgerStore

    store = LedgerStore.from_airflow()
    try:
        rows = store.open_attempts()
    except (OperationalError, ProgrammingError):
        print("leoflow: the attempt ledger's tables do not exist; run `airflow db migrate`", file=sys.stderr)
        sys.exit(1)
    if not rows:
        print("no open attempts")
    for a in rows[: args.limit]:
        print(f"{a.ref.ti_id} try={a.ref.try_number} epoch={a.ref.attempt_epoch} {a.state:<10} "
              f"{a.resolution or '-':<16} {a.dag_id}.{a.task_id}[{a.map_index}] {a.run_id}")


def release_pods(args: Any) -> None:
    """Strip leoflow's finalizer from every task pod of this installation (label ``leoflow.io/instance`` =
    ``[leoflow] instance``, :func:`release_selector`) in ``--namespace`` (default ``[leoflow] namespace``),
    running or not, printing one line per pod (``released``, ``gone``, ``not-held``; ``would-release`` with
    ``--dry-run``; ``failed``/``conflict`` with the reason); exit 0 when every pod is released, else 1 (also when
    the configuration cannot be loaded or the pods cannot be listed). Uses the scheduler's Kubernetes identity
    (``[leoflow] in_cluster`` / ``kube_config``): it needs ``list``, ``get`` and ``patch pods`` there.
    Run it when uninstalling leoflow: with no scheduler left, nothing else removes the finalizer, and deleted
    pods (and a deleted namespace) would stay ``Terminating``. Safe while a scheduler runs: it only makes
    the pods deletable again, as they were before leoflow."""
    from leoflow_airflow import settings
    from leoflow_airflow.errors import ConfigError
    from leoflow_airflow.runtime.kubernetes.finalizer import ReleaseOutcome, release_pods as strip
    from leoflow_airflow.runtime.kubernetes.pod import OUTCOME_FINALIZER
    from leoflow_airflow.runtime.kubernetes.review import api_client_from_config

    try:
        kube = settings.load().kubernetes
    except ConfigError as exc:
        print(f"leoflow: {exc}", file=sys.stderr)
        sys.exit(1)
    namespace = args.namespace or kube.namespace
    try:
        api_client = api_client_from_config(in_cluster=kube.in_cluster, kube_config=kube.kube_config)
    except Exception as exc:  # noqa: BLE001 - reported: a config the client cannot load
        print(f"leoflow: cannot load the Kubernetes client configuration: {type(exc).__name__}: {exc}",
              file=sys.stderr)
        sys.exit(1)
    from kubernetes import client

    try:
        results = strip(client.CoreV1Api(api_client), namespace, release_selector(kube.instance, args.unlabelled),
                        dry_run=args.dry_run)
    except Exception as exc:  # noqa: BLE001 - the LIST failed: nothing was released
        print(f"leoflow: cannot list the pods of namespace {namespace}: {type(exc).__name__}: "
              f"{getattr(exc, 'status', '')} {getattr(exc, 'reason', exc)}", file=sys.stderr)
        sys.exit(1)
    finally:
        api_client.close()
    for r in results:
        print(f"{r.outcome:<14} pod {namespace}/{r.name} uid {r.uid}" + (f": {r.detail}" if r.detail else ""))
    bad = [r for r in results if not r.done and r.outcome is not ReleaseOutcome.WOULD_RELEASE]
    verb = "would release" if args.dry_run else "released"
    done = sum(r.outcome in (ReleaseOutcome.RELEASED, ReleaseOutcome.WOULD_RELEASE) for r in results)
    print(f"{verb} {OUTCOME_FINALIZER} on {done} pod(s) in namespace {namespace}"
          + (f"; {len(bad)} failed (run it again)" if bad else ""))
    sys.exit(1 if bad else 0)


def release_selector(instance: str, unlabelled: bool) -> str:
    """The label selector ``release-pods`` lists with: this installation's task pods
    (:func:`~leoflow_airflow.runtime.kubernetes.runtime.label_selector` of ``instance``), so another installation
    sharing the namespace keeps its finalizers (k8s review §5); with ``unlabelled`` (``--unlabelled``) instead the
    task pods that carry no ``leoflow.io/instance`` label at all, made by a leoflow older than that label, which no
    scheduler of this version watches (any installation's: run it once after the upgrade)."""
    from leoflow_airflow.runtime.kubernetes.pod import INSTANCE_LABEL
    from leoflow_airflow.runtime.kubernetes.runtime import label_selector

    return f"{label_selector(None)},!{INSTANCE_LABEL}" if unlabelled else label_selector(instance)


def get_cli_commands() -> list[GroupCommand]:
    """Return the ``leoflow`` command group for Airflow's CLI parser."""
    return [
        GroupCommand(
            name="leoflow",
            help="leoflow executor tools",
            subcommands=[
                ActionCommand(name="check", help="Validate [leoflow] and the resilience ladder", func=check, args=()),
                ActionCommand(
                    name="doctor",
                    help="Check everything a working leoflow install needs and name the fix for each miss",
                    func=doctor,
                    args=(
                        Arg(("--json",), help="print the findings as JSON", action="store_true"),
                        Arg(("--api-server-url",), action="append", default=None,
                            help="an api-server's /leoflow base URL to probe (repeatable; default: [leoflow] "
                                 "exchange_url, else [api] base_url + /leoflow)"),
                        Arg(("--api-server-user",), default=None,
                            help="the api-server's Kubernetes user, e.g. system:serviceaccount:airflow:"
                                 "airflow-api-server, to check its RBAC with SubjectAccessReview"),
                        Arg(("--timeout",), type=float, default=10.0, help="seconds per HTTP or API call"),
                    ),
                ),
                ActionCommand(
                    name="attempts",
                    help="List the open attempts of the ledger",
                    func=attempts,
                    args=(
                        Arg(("--limit",), help="rows at most", type=int, default=50),
                    ),
                ),
                ActionCommand(
                    name="release-pods",
                    help="Strip leoflow's finalizer from every task pod of this installation (for an uninstall)",
                    func=release_pods,
                    args=(
                        Arg(("--namespace",), help="the task namespace (default: [leoflow] namespace)", default=None),
                        Arg(("--dry-run",), help="only list the pods that hold it", action="store_true"),
                        Arg(("--unlabelled",), action="store_true",
                            help="instead, the task pods without a leoflow.io/instance label (made by a leoflow "
                                 "older than [leoflow] instance, any installation's): once after that upgrade"),
                    ),
                ),
            ],
        )
    ]
