"""The zygote's in-band hand-off (:mod:`leoflow_agent.handoff`): at most ``limit`` busy agents, held launches
forked first in first out the moment a busy agent reports or exits, revoked ones dropped, tokens replaced."""

from __future__ import annotations

import pytest

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



def test_fork_backoff_doubles_from_its_base_and_is_capped():
    """Bounded exponential back-off after failed forks in a row; nonsense input is refused."""
    from leoflow_agent.handoff import FORK_BACKOFF_CAP, fork_backoff

    assert [fork_backoff(n, base=0.5, cap=4.0) for n in (1, 2, 3, 4, 5, 100)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    assert fork_backoff(10_000) == FORK_BACKOFF_CAP
    for bad in ({"failures": 0}, {"failures": 1, "base": 0}, {"failures": 1, "cap": -1}):
        with pytest.raises(ValueError):
            fork_backoff(**bad)


def test_a_failed_fork_holds_every_other_launch_until_the_back_off_is_over():
    """Issue 8 hole 8: a failed fork must not drain the held queue into more failed forks. The failed launch
    leaves (the executor re-offers it), the ones released with it go back to the front of the queue in order,
    nothing is released while paused (not by a freed slot, a new launch or a raised limit), and the held
    launches come out once ``due`` is called at the retry time."""
    h = Handoff(limit=0)
    for n in (1, 2, 3, 4):
        h.offer(launch(n))
    released = h.set_limit(3)
    assert ids(released) == ["l1", "l2", "l3"]
    delay = h.fork_failed("l1", now=100.0, not_tried=released[1:])  # l1 failed; l2, l3 never tried
    assert delay == 0.5 and h.retry_at == 100.5
    assert list(h.held) == ["l2", "l3", "l4"] and h.busy == set()
    assert h.offer(launch(5)) == [] and h.set_limit(4) == [] and h.freed("lx") == []
    assert h.wait_for(100.2) == pytest.approx(0.3)
    assert h.due(100.4) == []
    assert ids(h.due(100.5)) == ["l2", "l3", "l4", "l5"] and h.retry_at is None and h.wait_for(101) is None


def test_back_off_grows_while_forks_keep_failing_and_resets_after_one_works():
    h = Handoff(limit=1)
    h.offer(launch(1))
    h.offer(launch(2))
    assert h.fork_failed("l1", now=0.0) == 0.5
    (l2,) = h.due(0.5)
    assert h.fork_failed("l2", now=1.0, not_tried=[]) == 1.0  # second failure in a row: doubled
    h.offer(launch(3))
    (l3,) = h.due(2.0)
    h.forked()  # l3's fork worked
    h.offer(launch(4))
    assert h.freed("l3") and h.fork_failed("l4", now=3.0) == 0.5
