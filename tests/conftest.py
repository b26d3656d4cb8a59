"""Shared fixtures: the repo root on ``sys.path`` (for ``devtools``), a factory of real Airflow stacks, and the
module order for runs on two pytest-xdist workers.

Every stack the factory hands out is stopped at the end of the session, even when a test failed or was
interrupted, and the session fails loudly if any of its processes could not be stopped.

Parallel runs (``LEOFLOW_TEST_WORKERS=2 scripts/run-tests all``: ``-n 2 --dist loadfile --no-loadscope-reorder``;
not the default, see README): a module always runs whole on one worker, so its module-scoped Airflow stack or
control plane is started once; the Kubernetes tier's session-scoped control plane (``tests/k8s/conftest.py``) is
started once per worker that runs a module of it. The longest modules are handed out first (:func:`_weight`).
Nothing else is shared between workers: stacks, control planes, node harnesses and PostgreSQL databases each pick
their own ports, directories and names. (``--dist loadgroup`` with ``xdist_group`` marks would keep the tier on one
worker, but pytest-xdist 3.8 cannot read the marks under pytest 9: it writes the group into ``item._nodeid``,
which pytest 9 no longer reads.)
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable, Iterator
from typing import Any
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from devtools.stack import AirflowStack  # noqa: E402  (needs the sys.path line above)

StackFactory = Callable[..., AirflowStack]

K8S_TIER = REPO_ROOT / "tests" / "k8s"


def pytest_addoption(parser: pytest.Parser) -> None:
    """The opt-in chaos suites, as kopf's ``--with-e2e`` opts in (tests marked ``chaos`` are skipped, with the
    reason, unless one of these is given):

    * ``--chaos``: every test marked ``chaos``, at full size (the Kubernetes chaos wave 60 runs, its api-server and
      partition waves, the Kubernetes two-scheduler test 200 task instances);
    * ``--chaos-ci``: only the tests also marked ``chaos_ci``, at CI size (issue 34: the Kubernetes chaos wave 12
      seeded runs, the Kubernetes two-scheduler test 40 task instances, the same assertions)."""
    parser.addoption("--chaos", action="store_true", default=False,
                     help="run every chaos suite at full size (40-60 minutes more on 2 cores)")
    parser.addoption("--chaos-ci", action="store_true", default=False,
                     help="run the chaos suites marked chaos_ci at CI size (12 Kubernetes chaos runs, 40 "
                          "two-scheduler task instances)")
    parser.addoption("--real-node", action="store_true", default=False,
                     help="run the tests marked real_node: a kubelet and containerd on this machine running "
                          "leoflow's agent image (needs root; builds the kubelet and the image on first use)")
    parser.addoption("--module-pool", metavar="DIR", default=None,
                     help="share the modules not marked k8s with another pytest session given the same DIR: "
                          "each such module runs whole in the session that reaches it first (ModulePool)")
    parser.addoption("--module-pool-tail", action="store_true", default=False,
                     help="with --module-pool: run the k8s-marked modules first, then take the shared modules "
                          "from the end of the list (the other session takes them from the start)")


def pytest_configure(config: pytest.Config) -> None:
    """Register the ``chaos`` and ``chaos_ci`` markers and start the per-module wall-time account
    (:class:`ModuleClock`)."""
    config.addinivalue_line("markers", "chaos: an opt-in chaos suite, run with --chaos")
    config.addinivalue_line("markers", "chaos_ci: a chaos suite that --chaos-ci runs at CI size")
    config.addinivalue_line("markers", "real_node: runs pods on the real node (scripts/k8senv start --real-node); "
                                       "run with --real-node")
    config.addinivalue_line("markers", "either_node: runs its pods on the real node with --real-node, else on the "
                                       "node harness")
    config.addinivalue_line("markers", "tables: the test's printed output (its seed, chaos tables and problems) is "
                                       "shown in the session's summary even when it passes")
    config.pluginmanager.register(ModuleClock(), "leoflow-module-clock")
    config.pluginmanager.register(TablesReport(), "leoflow-tables-report")
    pool = config.getoption("--module-pool")
    if pool:
        config.pluginmanager.register(ModulePool(Path(pool), tail=config.getoption("--module-pool-tail")),
                                      "leoflow-module-pool")


def _weight(item: pytest.Item) -> int:
    """Where ``item``'s module goes in the run order: the longest first (the Kubernetes tier, then the Kubernetes
    end-to-end modules), the unit tests last, so the two workers finish close together."""
    path = Path(str(item.path)).resolve()
    if K8S_TIER in path.parents:
        return 0
    if path.name.startswith("test_kube_"):
        return 1
    return 3 if "unit" in path.parent.name else 2


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Order the modules by :func:`_weight` (stable within one weight, so file order is kept); pytest-xdist's
    ``--dist loadfile --no-loadscope-reorder`` hands them to the workers in this order (module docstring; without
    ``--no-loadscope-reorder`` xdist puts the modules with the most tests first: the unit tests)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):  # one after another (the default), pytest's own order is kept
        items.sort(key=_weight)
    if not config.getoption("--real-node"):
        for item in items:
            if item.get_closest_marker("real_node") is not None:
                item.add_marker(pytest.mark.skip(reason="runs on the real node: run with --real-node"))
    if not config.getoption("--chaos"):
        ci = config.getoption("--chaos-ci")
        for item in items:
            if item.get_closest_marker("chaos") is None:
                continue
            sized = item.get_closest_marker("chaos_ci") is not None
            if not (ci and sized):
                item.add_marker(pytest.mark.skip(reason="an opt-in chaos suite: run with --chaos" +
                                                 (" (full size) or --chaos-ci (CI size)" if sized else "")))


class ModuleClock:
    """Adds up each test module's wall time (every test's setup, call and teardown: its module-scoped stacks'
    start and stop included) and prints them at the end of the session, longest first, with the total, so a
    module that grew slow shows in the run that made it slow (issue: CI's visible breakdown)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.outcomes: dict[str, set[str]] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Count one phase of one test toward its module."""
        module = report.nodeid.split("::", 1)[0]
        self.seconds[module] = self.seconds.get(module, 0.0) + float(report.duration or 0.0)
        if report.failed:
            self.outcomes.setdefault(module, set()).add("failed")

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        """Print the per-module table (seconds, longest first) and the total."""
        if not self.seconds:
            return
        rows = sorted(self.seconds.items(), key=lambda kv: -kv[1])
        terminalreporter.section("wall time per module (s, longest first)")
        for module, seconds in rows:
            mark = "  FAILED" if "failed" in self.outcomes.get(module, ()) else ""
            terminalreporter.write_line(f"{seconds:9.1f}  {module}{mark}")
        terminalreporter.write_line(f"{sum(self.seconds.values()):9.1f}  total over {len(rows)} modules")


class TablesReport:
    """Keeps the captured output of every test marked ``tables`` and prints it in the session's summary, so the
    chaos tables (lost successes, double runs, user retries spent, older touched newer) appear in CI's output for
    a passing run too: pytest shows a test's prints only when it fails or under ``-s`` (issue 34)."""

    def __init__(self) -> None:
        self.outputs: list[tuple[str, str]] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Keep the call phase's captured stdout of a test marked ``tables``."""
        if report.when == "call" and "tables" in report.keywords and report.capstdout:
            self.outputs.append((report.nodeid, report.capstdout))

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        """Print each kept output under its test's id."""
        if not self.outputs:
            return
        terminalreporter.section("chaos tables (the output of the tests marked tables)")
        for nodeid, text in self.outputs:
            terminalreporter.write_line(f"--- {nodeid}")
            terminalreporter.write_line(text.rstrip("\n"))


@pytest.fixture(scope="session")
def kube_node(request: pytest.FixtureRequest) -> str:
    """What runs the task pods of a Kubernetes module marked ``either_node``: ``"real"`` (the real node: a kubelet
    and containerd running leoflow's agent image, ``scripts/k8senv start --real-node``) with ``--real-node``, else
    ``"harness"`` (the node harness, ``tests/k8s/harness.py``). Give it to :class:`devtools.kube.KubeStack` as
    ``node``."""
    return "real" if request.config.getoption("--real-node") else "harness"


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


class ModulePool:
    """Two pytest sessions side by side share the modules not marked ``k8s`` (issue 34: ``scripts/run-tests all``
    runs the second session, the Kubernetes one, once the Kubernetes build is done, beside the first): each such
    module runs whole in the session that reaches it first, claimed by creating ``<pool>/<module>`` exclusively
    (``O_CREAT | O_EXCL``, atomic on one file system); the other session passes over that module's tests without
    running or reporting them. The first session takes the shared modules in collection order; the ``tail``
    session runs its k8s-marked modules first, then takes the shared modules from the end of the list, so the two
    meet where their loads balance (a cold build delays the second session 12 minutes; a warm one not at all),
    which no split fixed in advance can do for both."""

    def __init__(self, pool: Path, *, tail: bool) -> None:
        """Claims go to ``pool`` (created); ``tail``: this is the session that takes shared modules from the end."""
        self.pool, self.tail = pool, tail
        pool.mkdir(parents=True, exist_ok=True)
        self.mine: set[str] = set()
        self.theirs: set[str] = set()

    @staticmethod
    def _module(item: pytest.Item) -> str:
        return item.nodeid.split("::", 1)[0]

    @staticmethod
    def _shared(item: pytest.Item) -> bool:
        return item.get_closest_marker("k8s") is None

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        """In the ``tail`` session: the k8s-marked tests first (in their order, those marked ``real_node`` or
        ``either_node`` last), then the shared modules in reverse module order (each module's tests in their own
        order)."""
        if not self.tail:
            return
        own = [i for i in items if not self._shared(i)]
        # the real node's own modules last among them: their images are built beside the session's first modules
        own.sort(key=lambda i: any(i.get_closest_marker(m) is not None for m in ("real_node", "either_node")))
        modules: dict[str, list[pytest.Item]] = {}
        for item in items:
            if self._shared(item):
                modules.setdefault(self._module(item), []).append(item)
        items[:] = own + [i for m in reversed(list(modules)) for i in modules[m]]

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None) -> bool | None:
        """Claim a shared module at its first test; True (handled: not run, not reported) for a test of a module
        the other session claimed."""
        if not self._shared(item):
            return None
        module = self._module(item)
        if module in self.mine:
            return None
        if module not in self.theirs:
            try:
                os.close(os.open(self.pool / module.replace("/", "__"), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
                self.mine.add(module)
                return None
            except FileExistsError:
                self.theirs.add(module)
        return True

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        """Say how the shared modules were split."""
        terminalreporter.write_line(f"module pool {self.pool}: {len(self.mine)} shared modules ran in this session, "
                                    f"{len(self.theirs)} in the other")
