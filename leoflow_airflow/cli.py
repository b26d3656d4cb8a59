"""The ``airflow leoflow`` CLI group (registered through the provider's ``cli`` entry).

* ``airflow leoflow check``: parse ``[leoflow]`` and evaluate the resilience ladder; exit 1 on a violation.
* ``airflow leoflow attempts [--limit N]``: list the ledger's open attempts.
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
    sys.exit(1 if report.violations else 0)


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


def get_cli_commands() -> list[GroupCommand]:
    """Return the ``leoflow`` command group for Airflow's CLI parser."""
    return [
        GroupCommand(
            name="leoflow",
            help="leoflow executor tools",
            subcommands=[
                ActionCommand(name="check", help="Validate [leoflow] and the resilience ladder", func=check, args=()),
                ActionCommand(
                    name="attempts",
                    help="List the open attempts of the ledger",
                    func=attempts,
                    args=(
                        Arg(("--limit",), help="rows at most", type=int, default=50),
                    ),
                ),
            ],
        )
    ]
