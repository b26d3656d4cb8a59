"""Shared fixtures: the repo root on ``sys.path`` (for ``devtools``) and a factory of real Airflow stacks.

Every stack the factory hands out is stopped at the end of the session, even when a test failed or was
interrupted, and the session fails loudly if any of its processes could not be stopped.
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
