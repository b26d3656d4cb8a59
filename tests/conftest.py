"""Shared fixtures: the repo root on ``sys.path`` (for ``devtools``), a factory of real Airflow stacks, and the
grouping that lets ``make test`` run modules on two pytest-xdist workers.

Every stack the factory hands out is stopped at the end of the session, even when a test failed or was
interrupted, and the session fails loudly if any of its processes could not be stopped.

Parallel runs (``scripts/run-tests all``: ``-n 2 --dist loadgroup``): every test gets an ``xdist_group`` mark, so a
module always runs whole on one worker (its module-scoped Airflow stack or control plane is started once), and
the Kubernetes tier (``tests/k8s``) is one group (its session-scoped control plane is started once). Nothing else
is shared between workers: stacks, control planes, node harnesses and PostgreSQL databases each pick their own
ports, directories and names.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from devtools.stack import AirflowStack  # noqa: E402  (needs the sys.path line above)

StackFactory = Callable[..., AirflowStack]

K8S_TIER = REPO_ROOT / "tests" / "k8s"


def _weight(item: pytest.Item) -> int:
    """Where ``item``'s group goes in the run order: the longest groups first (the Kubernetes tier, then the
    Kubernetes end-to-end modules), the unit tests last, so the two workers finish close together."""
    path = Path(str(item.path)).resolve()
    if K8S_TIER in path.parents:
        return 0
    if path.name.startswith("test_kube_"):
        return 1
    return 3 if "unit" in path.parent.name else 2


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Order the groups (:func:`_weight`; stable within one) and mark every test with its ``xdist_group``:
    ``k8s-tier`` for ``tests/k8s``, else its module's path (module docstring). Without xdist the mark is inert."""
    items.sort(key=_weight)
    for item in items:
        path = Path(str(item.path)).resolve()
        group = "k8s-tier" if K8S_TIER in path.parents else str(path.relative_to(REPO_ROOT))
        item.add_marker(pytest.mark.xdist_group(group))


@pytest.fixture(scope="session")
def airflow_stack_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StackFactory]:
    """``factory(name, **kwargs) -> AirflowStack`` (not yet migrated or started) in a fresh home.

    ``kwargs`` go to ``AirflowStack`` (``executor``, ``parallelism``, ``example_dags``, ``extra_env`` ...).
    Tests may ``stop()`` a stack early; at session end every stack is stopped again (idempotent) and any
    process left over fails the session.
    """
    stacks: list[AirflowStack] = []
    # A SIGTERM (e.g. a CI timeout) must still run the cleanup below: turn it into KeyboardInterrupt.
    previous = signal.getsignal(signal.SIGTERM)
    if previous in (signal.SIG_DFL, None):
        signal.signal(signal.SIGTERM, signal.default_int_handler)

    def factory(name: str, **kwargs: object) -> AirflowStack:
        stack = AirflowStack(tmp_path_factory.mktemp(f"airflow-{name}"), **kwargs)  # type: ignore[arg-type]
        stacks.append(stack)
        return stack

    try:
        yield factory
    finally:
        if previous in (signal.SIG_DFL, None):
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        leftovers = []
        for stack in stacks:
            leftovers.extend(stack.stop())
        if leftovers:
            pytest.fail(f"processes left after stopping the Airflow stacks: {leftovers}")
