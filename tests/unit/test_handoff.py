"""The zygote's in-band hand-off (:mod:`leoflow_agent.handoff`): at most ``limit`` busy agents, held launches
forked first in first out the moment a busy agent reports or exits, revoked ones dropped, tokens replaced."""

from __future__ import annotations

from leoflow_agent.handoff import Handoff


def launch(n: int, workload: str = "w") -> dict:
    return {"op": "launch", "launch_id": f"l{n}", "workload": workload}


def ids(messages: list[dict]) -> list[str]:
    return [m["launch_id"] for m in messages]


def test_without_a_limit_every_launch_forks_on_arrival():
    """Until the executor sends a limit, the zygote behaves as before: nothing is held."""
    h = Handoff()
    assert ids(h.offer(launch(1))) == ["l1"]
    assert ids(h.offer(launch(2))) == ["l2"]
    assert not h.held


def test_beyond_the_limit_launches_wait_and_start_in_order_as_slots_free():
    """Two slots, four launches: two fork, two wait; a report frees one slot (the next forks at once), an
    exit after that report frees nothing more, and the last one starts when the other busy agent exits."""
    h = Handoff(limit=2)
    assert ids(h.offer(launch(1))) == ["l1"]
    assert ids(h.offer(launch(2))) == ["l2"]
    assert h.offer(launch(3)) == [] and h.offer(launch(4)) == []
    assert ids(h.freed("l1")) == ["l3"]  # l1 reported
    assert h.freed("l1") == []  # ... and then exited: its slot was already given away
    assert ids(h.freed("l2")) == ["l4"]  # l2 died without a report
    assert h.busy == {"l3", "l4"} and not h.held


def test_a_launch_that_could_not_be_forked_gives_its_place_to_the_next():
    """A failed fork must not leak a slot (or the zygote would stall at the limit)."""
    h = Handoff(limit=1)
    h.offer(launch(1))
    h.offer(launch(2))
    assert ids(h.freed("l1")) == ["l2"]  # l1's fork failed


def test_revoked_held_launch_is_dropped_and_never_forked():
    """``drop`` forgets a held launch (True); a busy or unknown one is not held (False)."""
    h = Handoff(limit=1)
    h.offer(launch(1))
    h.offer(launch(2))
    h.offer(launch(3))
    assert h.drop("l2") is True
    assert h.drop("l1") is False and h.drop("nope") is False
    assert ids(h.freed("l1")) == ["l3"]


def test_raising_the_limit_releases_held_launches_and_lowering_it_stops_none():
    """A raised limit forks waiting launches at once; a lowered one holds later launches only."""
    h = Handoff(limit=0)
    assert h.offer(launch(1)) == [] and h.offer(launch(2)) == []
    assert ids(h.set_limit(2)) == ["l1", "l2"]
    assert h.set_limit(1) == [] and h.busy == {"l1", "l2"}
    assert h.offer(launch(3)) == []
    assert h.freed("l1") == []  # still one busy: at the new limit
    assert ids(h.freed("l2")) == ["l3"]
    assert ids(h.set_limit(None)) == [] and h.limit is None
    assert h.set_limit(-5) == [] and h.limit == 0


def test_retoken_replaces_only_a_held_workload():
    """A held launch gets the fresh workload; one already forked (or unknown) is left alone."""
    h = Handoff(limit=1)
    h.offer(launch(1, "old1"))
    h.offer(launch(2, "old2"))
    assert h.retoken("l2", "new2") is True
    assert h.retoken("l1", "new1") is False and h.retoken("nope", "x") is False
    (released,) = h.freed("l1")
    assert released["workload"] == "new2"

