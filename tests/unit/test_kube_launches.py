"""The Kubernetes runtime's launch table (issue 10, "Benchmark"): ``poll()`` asks it every scheduler loop which
launches to look at, and its answer must be what a walk over every launch would pick, at a cost that follows
what changed. Pure logic: no server."""

from __future__ import annotations

import random
import uuid

import pytest

from leoflow_airflow.ledger.states import AttemptRef
from leoflow_airflow.runtime.kubernetes.launches import PodLaunch, PodLaunches


def _launch(i: int, *, uid: str | None = None, creating: bool = False) -> PodLaunch:
    return PodLaunch(AttemptRef(str(uuid.uuid4()), 1, 1), f"pod-{i}", uid=uid, creating=creating)


def test_changed_names_uids_and_new_uids_are_picked_and_the_rest_only_in_turn():
    table = PodLaunches()
    for i in range(10):
        table[f"l{i}"] = _launch(i, uid=f"u{i}")
    first = table.to_poll(set(), (), (), page=2)
    assert [lid for lid, _ in first] == [f"l{i}" for i in range(10)]  # none looked at yet: all of them
    for _, launch in first:
        launch.polled = True
    picked = [lid for lid, _ in table.to_poll({"pod-5"}, ["pod-7", "nobody"], ["u9", "u-unknown"], page=2)]
    assert picked == ["l2", "l3", "l5", "l7", "l9"]  # the turn's next two, the changed one, the read, the valve's
    assert [lid for lid, _ in table.to_poll(set(), (), (), page=2)] == ["l4", "l5"]
    assert [lid for lid, _ in table.to_poll(None, (), (), page=2)] == [f"l{i}" for i in range(10)]  # a LIST


def test_creates_in_flight_are_counted_left_out_and_due_once_created():
    table = PodLaunches()
    table["a"] = _launch(0, creating=True)
    table["b"] = _launch(1, creating=True)
    assert table.creating == 2
    assert table.to_poll(None, (), (), page=10) == []
    launch = table.created("a", "ua")
    assert (table.creating, launch.uid, launch.creating) == (1, "ua", False)
    assert [lid for lid, _ in table.to_poll(set(), (), ["ua"], page=1)] == ["a"]
    table.create_failed("b")
    assert (table.creating, "b" in table) == (0, False)
    with pytest.raises(KeyError):
        table.created("b", "ub")
    with pytest.raises(ValueError, match="page"):
        table.to_poll(set(), (), (), page=0)


def test_exited_and_removed_launches_are_never_returned_and_a_restored_id_is_indexed_anew():
    table = PodLaunches()
    table["a"] = _launch(0, uid="ua")
    table["b"] = _launch(1, uid="ub")
    table["a"].exited = True
    assert [lid for lid, _ in table.to_poll(None, (), (), page=5)] == ["b"]
    del table["b"]
    assert table.to_poll({"pod-1"}, (), ["ub"], page=5) == []
    table["a"] = _launch(7, uid="ua2")  # stored again under its id: the old name and UID no longer find it
    assert [lid for lid, _ in table.to_poll({"pod-0"}, (), ["ua"], page=1)] == ["a"]  # new: not looked at yet
    table["a"].polled = True
    table["c"] = _launch(8, uid="uc")
    table["c"].polled = True
    turns = [[lid for lid, _ in table.to_poll({"pod-0"}, (), ["ua"], page=1)] for _ in range(2)]
    assert sorted(turns) == [["a"], ["c"]]  # the old name and UID pick nothing: one in turn per call


def test_randomized_the_answer_is_what_a_walk_over_every_launch_picks_and_each_comes_round_in_turn():
    """Against the rule ``poll()`` had when it walked every launch (each launch with a UID, not exited, no create
    in flight, picked when its pod changed, a read or valve names it, or it was never looked at), under random
    adds, creates, exits and removals; and every eligible launch is returned within ceil(n / page) calls."""
    rng = random.Random(20261202)
    for _ in range(40):
        table, n, page = PodLaunches(), rng.randint(1, 40), rng.randint(1, 7)
        for i in range(n):
            table[f"l{i}"] = _launch(i, uid=None if rng.random() < 0.2 else f"u{i}",
                                     creating=rng.random() < 0.1)
        for _ in range(30):
            for lid in rng.sample(list(table), k=min(len(table), 2)):
                launch = table[lid]
                roll = rng.random()
                if roll < 0.2 and launch.creating:
                    table.created(lid, f"u-{lid}-{rng.random()}")
                elif roll < 0.3:
                    launch.exited = True
                elif roll < 0.35:
                    del table[lid]
            changed = {f"pod-{rng.randrange(n)}" for _ in range(rng.randint(0, 3))}
            names = [f"pod-{rng.randrange(n)}"] if rng.random() < 0.3 else []
            uids = [launch.uid for launch in table.values() if launch.uid and rng.random() < 0.05]
            must = {lid for lid, launch in table.items()
                    if not (launch.exited or launch.creating or launch.uid is None)
                    and (not launch.polled or launch.name in changed or launch.name in names or launch.uid in uids)}
            got = table.to_poll(changed, names, uids, page)
            ids = [lid for lid, _ in got]
            assert must <= set(ids) and len(ids) <= len(must) + page
            assert ids == sorted(ids, key=list(table).index)
            for _, launch in got:
                assert not (launch.exited or launch.creating or launch.uid is None)
                launch.polled = True
        eligible = {lid for lid, launch in table.items() if not (launch.exited or launch.creating or launch.uid is None)}
        seen: set[str] = set()
        for _ in range(-(-max(len(table), 1) // page)):
            seen.update(lid for lid, _ in table.to_poll(set(), (), (), page))
        assert eligible <= seen
