"""The adaptive queue-ahead depth (:mod:`leoflow_airflow.dispatch.ahead`): deep for short tasks, none for
long ones (so they never sit QUEUED into Airflow's stuck-in-queued handling), never above the cap."""

from __future__ import annotations

import pytest

from leoflow_airflow.dispatch.ahead import QueueAhead


def test_cold_start_holds_one_slots_worth_and_less_as_the_first_attempts_age():
    """Before any attempt finished: ``min(cap, parallelism)`` ahead (a burst at scheduler start starts
    in-band), falling to 0 once the first attempts have run longer than the horizon allows."""
    ahead = QueueAhead(cap=16, horizon=60)
    assert ahead.depth(parallelism=4) == 4
    assert QueueAhead(cap=2, horizon=60).depth(parallelism=4) == 2
    assert ahead.depth(parallelism=4, running_ages=[1.0, 2.0]) == 4
    assert ahead.depth(parallelism=4, running_ages=[120.0, 120.0]) == 2
    assert ahead.depth(parallelism=4, running_ages=[600.0, 600.0]) == 0


def test_short_tasks_fill_up_to_the_cap():
    """0.3 s attempts on 4 slots: a 60 s horizon would allow 800 ahead, the cap says 16."""
    ahead = QueueAhead(cap=16, horizon=60)
    for _ in range(10):
        ahead.finished(0.3)
    assert ahead.depth(parallelism=4, running_ages=[0.1, 0.2, 0.0, 0.3]) == 16


def test_long_tasks_hold_nothing():
    """15-minute attempts on 4 slots: a slot frees every 225 s, longer than the 60 s horizon: none ahead."""
    ahead = QueueAhead(cap=16, horizon=60)
    ahead.finished(900)
    assert ahead.depth(parallelism=4) == 0


def test_long_tasks_after_short_ones_empty_the_queue_ahead_at_once():
    """The average still says 0.5 s, but the attempts running now are 5 minutes old: none ahead."""
    ahead = QueueAhead(cap=16, horizon=60)
    for _ in range(20):
        ahead.finished(0.5)
    assert ahead.depth(parallelism=4, running_ages=[300, 310, 290, 305]) == 0


def test_depth_follows_the_moving_average():
    """2 s attempts on 4 slots with a 10 s horizon: 20 ahead; after a run of 20 s attempts the average
    moves up and the depth comes down to 2."""
    ahead = QueueAhead(cap=100, horizon=10, smoothing=0.5)
    ahead.finished(2.0)
    assert ahead.depth(parallelism=4) == 20
    for _ in range(20):
        ahead.finished(20.0)
    assert ahead.duration == pytest.approx(20.0, rel=1e-3)
    assert ahead.depth(parallelism=4) == 2


def test_zero_cap_disables_and_bad_arguments_raise():
    """``queue_ahead = 0`` holds nothing whatever the durations; nonsense parameters are refused."""
    ahead = QueueAhead(cap=0, horizon=60)
    ahead.finished(0.1)
    assert ahead.depth(parallelism=32) == 0
    for kwargs in ({"cap": -1, "horizon": 1}, {"cap": 1, "horizon": 0}, {"cap": 1, "horizon": 1, "smoothing": 0}):
        with pytest.raises(ValueError):
            QueueAhead(**kwargs)


def test_retoken_due_names_held_launches_older_than_the_bound():
    """A launch held 60 s or more gets a fresh token; younger ones keep theirs."""
    from leoflow_airflow.dispatch.ahead import retoken_due

    held = [("a", 100.0), ("b", 139.0), ("c", 140.0), ("d", 199.9)]
    assert retoken_due(held, now=200.0, after=60.0) == ["a", "b", "c"]
    assert retoken_due([], now=200.0, after=60.0) == []
