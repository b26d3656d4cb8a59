"""The attempt state vocabulary and its transition table (DESIGN §2, issue 2 item 2)."""

from __future__ import annotations

import itertools

import pytest

from leoflow_airflow.ledger.states import (
    TRANSITIONS,
    AttemptRef,
    AttemptState,
    IllegalTransition,
    Resolution,
    check_transition,
)

S = AttemptState

# The edges the executor is coded against (the contract), written out independently of states.py.
CONTRACT_EDGES = {
    (S.CLAIMED, S.DISPATCHED),
    (S.CLAIMED, S.CLOSED),
    (S.CLAIMED, S.EXITED),
    (S.DISPATCHED, S.REPORTED),
    (S.DISPATCHED, S.EXITED),
    (S.DISPATCHED, S.CLOSED),
    (S.REPORTED, S.EXITED),
    (S.REPORTED, S.CLOSED),
    (S.EXITED, S.SETTLING),
    (S.EXITED, S.CLOSED),
    (S.SETTLING, S.CLOSED),
    (S.SETTLING, S.EXITED),
}


def test_stored_strings_are_the_documented_ones():
    assert [s.value for s in AttemptState] == [
        "claimed",
        "dispatched",
        "reported",
        "exited",
        "settling",
        "closed",
    ]
    assert {r.value for r in Resolution} == {
        "reported",
        "replayed",
        "infra_redrive",
        "oom_redrive",
        "redispatched",
        "executor_failed",
        "restarting",
        "moved_on",
        "revoked",
        "launch_failed",
        "abandoned",
    }


def test_table_has_exactly_the_contract_edges():
    assert set(TRANSITIONS) == set(AttemptState)
    table_edges = {(frm, to) for frm, tos in TRANSITIONS.items() for to in tos}
    assert table_edges == CONTRACT_EDGES


def test_table_is_read_only():
    with pytest.raises(TypeError):
        TRANSITIONS[S.CLOSED] = frozenset({S.CLAIMED})  # type: ignore[index]


@pytest.mark.parametrize(("frm", "to"), sorted(CONTRACT_EDGES))
def test_allowed_edges_pass(frm, to):
    check_transition(frm, to)
    check_transition(frm.value, to.value)  # the strings stored in the DB work too


@pytest.mark.parametrize(
    ("frm", "to"),
    sorted(set(itertools.product(AttemptState, AttemptState)) - CONTRACT_EDGES),
)
def test_every_other_move_raises_naming_both_states(frm, to):
    with pytest.raises(IllegalTransition) as info:
        check_transition(frm, to)
    assert f"'{frm.value}'" in str(info.value) and f"'{to.value}'" in str(info.value)
    assert isinstance(info.value, ValueError)


def test_unknown_state_string_is_rejected():
    with pytest.raises(ValueError):
        check_transition("claimed", "running")


def test_every_state_can_still_reach_closed():
    """No attempt can get stuck: from every state some path ends in CLOSED."""
    for start in AttemptState:
        seen, todo = {start}, [start]
        while todo:
            for nxt in TRANSITIONS[todo.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        assert S.CLOSED in seen, start


def test_attempt_ref_is_a_value():
    a = AttemptRef("0199-abc", 2, 3)
    assert a == AttemptRef("0199-abc", 2, 3)
    assert len({a, AttemptRef("0199-abc", 2, 3), AttemptRef("0199-abc", 2, 4)}) == 2
    assert str(a) == "0199-abc/2/3"
    with pytest.raises(AttributeError):
        a.attempt_epoch = 4  # type: ignore[misc]
