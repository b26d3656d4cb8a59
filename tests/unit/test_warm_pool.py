"""The warm-pool decision, its create expectations and its targets (issue 11 item 1): pure logic."""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone

import pytest

from leoflow_airflow.errors import ConfigError
from leoflow_airflow.warm.expectations import Expectations
from leoflow_airflow.warm.pool import (Create, Delete, Pending, PoolSettings, PoolSnapshot, Reap, Target,
                                       Worker, WorkerState, decide)
from leoflow_airflow.warm.targets import Override, PoolDefaults, VersionInfo, parse_overrides, resolve

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=timezone.utc)
S = WorkerState


def w(name: str, state: WorkerState, version: str = "v1", tenant: str = "bundle:b", idle_for: float = 10.0) -> Worker:
    return Worker(name, version, tenant, state, NOW - timedelta(seconds=idle_for))


def t(version: str = "v1", min_idle: int = 2, max_pool_size: int = 4, tenant: str = "bundle:b",
      prewarm: bool = False, dag_id: str | None = None) -> Target:
    return Target(version, dag_id or f"dag_{version}", tenant, min_idle, max_pool_size, prewarm)


def kinds(actions: list) -> list[tuple[str, str]]:
    return [(type(a).__name__, getattr(a, "name", None) or a.version) for a in actions]


def run(targets=(), workers=(), pending=(), pooled=(), synced=True, cap=None) -> list:
    snap = PoolSnapshot(tuple(targets), tuple(workers), tuple(pending), frozenset(pooled), synced)
    return decide(snap, NOW, PoolSettings(tenant_cap=cap, start_timeout=300))


def creates(actions: list, version: str | None = None) -> int:
    return sum(isinstance(a, Create) and (version is None or a.version == version) for a in actions)


def test_an_empty_pool_gets_min_idle_workers():
    assert creates(run([t(min_idle=2)])) == 2


def test_creates_in_flight_count_as_ready_so_a_lagging_cache_creates_nothing_more():
    assert run([t(min_idle=2)], pending=[Pending("v1", "bundle:b")] * 2) == []
    assert creates(run([t(min_idle=2)], pending=[Pending("v1", "bundle:b")])) == 1


def test_busy_workers_do_not_count_as_ready_and_the_pool_grows_up_to_its_ceiling():
    busy = [w(f"b{i}", S.BUSY) for i in range(2)]
    assert creates(run([t(min_idle=2, max_pool_size=4)], busy)) == 2
    busy3 = [w(f"b{i}", S.BUSY) for i in range(3)]
    assert creates(run([t(min_idle=2, max_pool_size=4)], busy3)) == 1
    busy4 = [w(f"b{i}", S.BUSY) for i in range(4)]
    assert creates(run([t(min_idle=2, max_pool_size=4)], busy4)) == 0


def test_a_ceiling_below_min_idle_is_taken_as_min_idle():
    assert creates(run([t(min_idle=3, max_pool_size=1)])) == 3


def test_excess_idle_workers_go_longest_idle_first_and_busy_ones_never():
    workers = [w("i1", S.IDLE, idle_for=5), w("i2", S.IDLE, idle_for=50), w("i3", S.IDLE, idle_for=20),
               w("b1", S.BUSY, idle_for=999)]
    actions = run([t(min_idle=1, max_pool_size=4)], workers)
    assert kinds(actions) == [("Delete", "i2"), ("Delete", "i3")]


def test_a_lowered_ceiling_trims_idle_workers_but_leaves_busy_and_draining_ones():
    workers = [w("i1", S.IDLE), *[w(f"b{i}", S.BUSY) for i in range(3)], w("d1", S.DRAINING)]
    actions = run([t(min_idle=1, max_pool_size=2)], workers)
    assert kinds(actions) == [("Delete", "i1")]


def test_a_terminal_worker_is_reaped_and_replaced_in_the_same_tick():
    actions = run([t(min_idle=1)], [w("dead", S.TERMINAL)])
    assert kinds(actions) == [("Reap", "dead"), ("Create", "v1")]


def test_a_worker_starting_past_the_timeout_is_deleted_and_replaced():
    actions = run([t(min_idle=1)], [w("stuck", S.STARTING, idle_for=301)])
    assert kinds(actions) == [("Delete", "stuck"), ("Create", "v1")]
    assert run([t(min_idle=1)], [w("slow", S.STARTING, idle_for=299)]) == []


def test_a_version_without_a_target_drains_keeps_busy_workers_and_retires_only_when_empty():
    workers = [w("i1", S.IDLE, "old"), w("s1", S.STARTING, "old"), w("b1", S.BUSY, "old")]
    actions = run([], workers, pooled={"old"})
    assert kinds(actions) == [("Delete", "s1"), ("Delete", "i1")]
    assert run([], [w("b1", S.BUSY, "old")], pooled={"old"}) == []
    assert run([], pending=[Pending("old", "bundle:b")], pooled={"old"}) == []
    assert kinds(run([], [w("gone", S.TERMINAL, "old")], pooled={"old"})) == [("Reap", "gone")]
    assert kinds(run([], [], pooled={"old"})) == [("Retire", "old")]


def test_a_target_keeps_its_pool_even_when_it_wants_no_worker_now():
    assert run([t(min_idle=1)], [w("i1", S.IDLE)], pooled={"v1"}) == []


def test_nothing_is_done_from_a_cache_that_has_not_synced():
    assert run([t(min_idle=2)], [w("dead", S.TERMINAL), w("i9", S.IDLE, "old")], synced=False) == []


def test_deletes_come_before_creates():
    actions = run([t("v1", min_idle=0), t("v2", min_idle=1)], [w("i1", S.IDLE, "v1")])
    assert kinds(actions) == [("Delete", "i1"), ("Create", "v2")]


def test_the_tenant_cap_rations_creates_active_runs_before_prewarm_in_a_stable_order():
    targets = [t("p", min_idle=2, prewarm=True, dag_id="a_prewarm"), t("x", min_idle=2, dag_id="x"),
               t("y", min_idle=2, dag_id="y")]
    actions = run(targets, cap=3)
    assert [a.version for a in actions if isinstance(a, Create)] == ["x", "x", "y"]
    assert actions == run(list(reversed(targets)), cap=3)


def test_the_tenant_cap_counts_busy_workers_of_a_draining_version_and_other_tenants_do_not_count():
    workers = [w("b1", S.BUSY, "old"), w("b2", S.BUSY, "old"), w("o1", S.IDLE, "z", tenant="bundle:other")]
    targets = [t("v1", min_idle=2), t("z", min_idle=1, tenant="bundle:other")]
    assert creates(run(targets, workers, cap=3), "v1") == 1


def test_a_tenant_over_its_cap_loses_idle_workers_prewarm_first_and_never_an_unlabelled_one():
    targets = [t("v1", min_idle=2), t("p", min_idle=2, prewarm=True)]
    workers = [w("a1", S.IDLE, "v1"), w("a2", S.IDLE, "v1"), w("p1", S.IDLE, "p"), w("p2", S.IDLE, "p"),
               w("legacy", S.IDLE, "v1", tenant="")]
    actions = run(targets, workers, cap=3)
    deleted = [a.name for a in actions if isinstance(a, Delete)]
    # v1 has 3 ready for min_idle 2: one goes (equal idle times: by name); the tenant then holds 4 staying
    # workers for a cap of 3, and the prewarm pool gives one up; the unlabelled one is never picked for the cap
    assert deleted == ["a1", "p1"]
    assert creates(actions) == 0


@pytest.mark.parametrize("seed", range(20))
def test_scale_three_versions_never_exceed_a_cap_with_the_cache_lagging(seed: int):
    """Issue 11, acceptance "Scale": 3 DAG versions x min_idle 2, max_pool_size 4, tenant cap 5, the cache
    deliberately lagging (it shows the world as it was up to 3 ticks ago, never going back in time, as an
    informer's cache) and workers taking, finishing and dying at random. The world (what really exists) never
    holds more than 4 live workers of a version or 5 of the tenant, no busy worker is ever deleted, and the
    pools do fill."""
    rng = random.Random(seed)
    targets = [t(v, min_idle=2, max_pool_size=4) for v in ("v1", "v2", "v3")]
    settings = PoolSettings(tenant_cap=5, start_timeout=300)
    exp = Expectations(ttl=1000)
    world: dict[str, Worker] = {}
    history: list[dict[str, Worker]] = []
    names = iter(f"w{i}" for i in range(10_000))
    peak_total, shown = 0, 0
    for tick in range(300):
        now = NOW + timedelta(seconds=tick)
        # the world moves: starting workers register, idle ones take attempts, busy ones finish or die
        for name, wk in list(world.items()):
            roll = rng.random()
            if wk.state is S.STARTING and roll < 0.5:
                world[name] = Worker(name, wk.version, wk.tenant, S.IDLE, now)
            elif wk.state is S.IDLE and roll < 0.3:
                world[name] = Worker(name, wk.version, wk.tenant, S.BUSY, now)
            elif wk.state is S.BUSY and roll < 0.2:
                world[name] = Worker(name, wk.version, wk.tenant, S.IDLE, now)
            elif wk.state is not S.TERMINAL and roll > 0.97:
                world[name] = Worker(name, wk.version, wk.tenant, S.TERMINAL, now)
        history.append(dict(world))
        shown = max(shown, len(history) - 1 - rng.randint(0, 3))
        cache = history[shown]
        exp.observe(cache)
        snap = PoolSnapshot(tuple(targets), tuple(cache.values()), exp.pending(tick))
        for action in decide(snap, now, settings):
            if isinstance(action, Create):
                ticket = exp.begin(action.version, action.tenant, tick)
                name = next(names)
                world[name] = Worker(name, action.version, action.tenant, S.STARTING, now)
                exp.created(ticket, name)
            elif isinstance(action, Delete):
                # the act re-reads the worker first (a guarded delete): one that took an attempt since stays
                if action.name in world and world[action.name].state is not S.BUSY:
                    del world[action.name]
            elif isinstance(action, Reap):
                reaped = world.pop(action.name, None)
                assert reaped is None or reaped.state is S.TERMINAL  # None: reaped already, the cache lags
        live = [wk for wk in world.values() if wk.state is not S.TERMINAL]
        for v in ("v1", "v2", "v3"):
            assert sum(wk.version == v for wk in live) <= 4, (tick, v)
        assert len(live) <= 5, tick
        peak_total = max(peak_total, len(live))
    assert peak_total == 5


def test_expectations_are_met_by_the_cache_dropped_on_failure_and_expire_once():
    exp = Expectations(ttl=10)
    a = exp.begin("v1", "t", now=0)
    b = exp.begin("v1", "t", now=0)
    c = exp.begin("v2", "t", now=5)
    assert exp.pending(1) == (Pending("v1", "t"), Pending("v1", "t"), Pending("v2", "t"))
    exp.created(a, "pod-a")
    exp.failed(b)
    assert exp.observe(["pod-a", "unrelated"]) == 1
    assert exp.pending(2) == (Pending("v2", "t"),)
    exp.created(c, "pod-c")
    assert exp.pending(16) == () and exp.expired == 1
    assert exp.pending(17) == () and exp.expired == 1
    with pytest.raises(ValueError):
        Expectations(ttl=0)


def test_a_created_worker_not_yet_named_is_not_met_by_an_unrelated_name():
    exp = Expectations(ttl=10)
    exp.begin("v1", "t", now=0)
    assert exp.observe(["anything"]) == 0 and len(exp) == 1


def test_overrides_first_match_wins_and_fill_from_defaults():
    overrides = parse_overrides('{"etl_big": {"min_idle": 0}, "etl_*": {"min_idle": 2, "max_pool_size": 4},'
                                ' "rep": {"prewarm": true}}')
    assert overrides[0] == Override("etl_big", min_idle=0)
    defaults = PoolDefaults(min_idle=1, max_pool_size=3)
    versions = [VersionInfo("1", "etl_big", "b", active_run=True), VersionInfo("2", "etl_small", "b", active_run=True),
                VersionInfo("3", "rep", "b", current=True), VersionInfo("4", "other", "b", current=True),
                VersionInfo("5", "other", "b", team="red", active_run=True)]
    got = resolve(versions, defaults, overrides)
    assert got == (Target("2", "etl_small", "bundle:b", 2, 4), Target("5", "other", "team:red", 1, 3),
                   Target("3", "rep", "bundle:b", 1, 3, prewarm=True))


def test_an_active_run_wins_over_prewarm_for_the_same_version():
    got = resolve([VersionInfo("1", "d", "b", current=True), VersionInfo("1", "d", "b", active_run=True)],
                  PoolDefaults(min_idle=1, max_pool_size=2, prewarm=True))
    assert got == (Target("1", "d", "bundle:b", 1, 2, prewarm=False),)


@pytest.mark.parametrize("text, needle", [
    ("[1]", "expected a JSON object"),
    ("{", "not valid JSON"),
    ('{"": {}}', "empty dag_id pattern"),
    ('{"a": 3}', "'a': expected an object"),
    ('{"a": {"min_idel": 1}}', "unknown field 'min_idel'"),
    ('{"a": {"min_idle": -1}}', "min_idle must be a whole number"),
    ('{"a": {"max_pool_size": 1.5}}', "max_pool_size must be a whole number"),
    ('{"a": {"min_idle": true}}', "min_idle must be a whole number"),
    ('{"a": {"prewarm": "yes"}}', "prewarm must be true or false"),
])
def test_a_broken_override_is_a_clear_config_error(text: str, needle: str):
    with pytest.raises(ConfigError, match="warm_pools") as err:
        parse_overrides(text)
    assert needle in str(err.value)


def test_blank_overrides_are_none():
    assert parse_overrides("  ") == ()
