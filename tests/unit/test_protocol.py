"""The executor <-> zygote <-> agent line protocol: framing, decode errors, and a buffer that never loses
good messages around a bad one."""

from __future__ import annotations

import json
import socket

import pytest

from leoflow_agent import protocol
from leoflow_agent.protocol import LineBuffer, ProtocolError


def test_launch_id():
    """Launch ids name the attempt exactly."""
    assert protocol.launch_id_for("abc", 2, 3) == "abc:2:3"
    assert protocol.launch_id_for("abc", "2", 3.0) == "abc:2:3"


def test_encode_decode_round_trip_is_one_line():
    """A message is one newline-terminated JSON line, even when values contain newlines or non-ASCII."""
    msg = {"op": "launch", "launch_id": "a:1:1", "workload": '{"x":"line1\\nline2"}\n', "fault": None, "s": "é"}
    line = protocol.encode(msg)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert protocol.decode(line[:-1]) == msg


@pytest.mark.parametrize("line", [b"\xff\xfe", b"{", b"not json", b"[1]", b'"op"', b"{}", b'{"x":1}', b"null"])
def test_decode_rejects(line):
    """Invalid UTF-8, invalid JSON, non-objects and objects with neither 'op' nor 'ev' are ProtocolErrors."""
    with pytest.raises(ProtocolError):
        protocol.decode(line)


def test_size_limit(monkeypatch):
    """Over-long messages are refused on both sides."""
    monkeypatch.setattr(protocol, "MAX_LINE_BYTES", 64)
    with pytest.raises(ProtocolError):
        protocol.encode({"op": "launch", "workload": "x" * 100})
    with pytest.raises(ProtocolError):
        protocol.decode(b'{"op":"' + b"x" * 100 + b'"}')
    buf = LineBuffer()
    assert buf.feed(b"y" * 65) == []
    assert len(buf.errors) == 1 and not buf.data
    assert buf.feed(b'{"ev":"hello"}\n') == [{"ev": "hello"}]


def test_line_buffer_reassembles_split_and_batched_messages():
    """Messages split across reads, several per read, byte by byte: all come out, in order."""
    msgs = [{"ev": "launched", "launch_id": f"l{i}", "pid": i} for i in range(5)]
    data = b"".join(protocol.encode(m) for m in msgs)
    for step in (1, 3, 17, len(data)):
        buf = LineBuffer()
        out = []
        for i in range(0, len(data), step):
            out.extend(buf.feed(data[i:i + step]))
        assert out == msgs and not buf.errors and not buf.data


def test_line_buffer_keeps_good_messages_around_a_bad_one():
    """A bad line becomes an error entry; the good lines before and after it are delivered; blank lines skip."""
    buf = LineBuffer()
    out = buf.feed(b'{"ev":"a"}\n\n  \ngarbage\n{"ev":"b"}\n{"ev":')
    assert out == [{"ev": "a"}, {"ev": "b"}]
    assert len(buf.errors) == 1
    assert buf.feed(b'"c"}\n') == [{"ev": "c"}]


def test_send_over_a_real_socket_pair():
    """``send`` writes a frame the other end decodes; a closed peer raises OSError."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        protocol.send(a, {"op": "kill", "launch_id": "x"})
        assert LineBuffer().feed(b.recv(4096)) == [{"op": "kill", "launch_id": "x"}]
        b.close()
        with pytest.raises(OSError):
            for _ in range(100):
                protocol.send(a, {"op": "kill", "launch_id": "x" * 10000})
    finally:
        a.close()
        b.close()


def test_fault_points_are_the_design_set():
    """DESIGN §3 "Fault injection" names exactly these points."""
    assert protocol.FAULT_POINTS == {"before_run", "after_run", "mid_task", "after_record", "after_patch",
                                     "hang_before_run"}
    json.dumps(sorted(protocol.FAULT_POINTS))


# --- typed messages: the wire carries enum members only ------------------------------------------------------
WIRE_OPS = {"launch", "kill", "limit", "retoken"}
WIRE_EVENTS = {"hello", "launched", "launch_failed", "reported", "exited", "started", "warm_pool"}


def test_the_enums_are_the_documented_wire_names():
    """The module docstring's table is the wire contract; the enums carry exactly its names, so typing the
    messages changed no byte on the wire."""
    assert {op.value for op in protocol.Op} == WIRE_OPS
    assert {ev.value for ev in protocol.Ev} == WIRE_EVENTS
    for name in WIRE_OPS | WIRE_EVENTS:
        assert f"``{name}``" in protocol.__doc__
    for member in [*protocol.WarmOp, *protocol.WarmEv]:
        assert f"``{member.value}``" in protocol.__doc__
    with pytest.raises(ValueError):
        protocol.warm_message("launch")
    assert protocol.warm_ev_of({"ev": "stale"}) is protocol.WarmEv.STALE
    assert protocol.warm_op_of({"op": "launch"}) is None


def test_builders_make_the_same_bytes_and_refuse_non_members():
    """``op_message``/``ev_message`` put the enum's value on the wire (the bytes a literal dict made before) and
    refuse a kind that is no member; ``op_of``/``ev_of`` read a kind back, ``None`` for a missing or unknown one."""
    assert protocol.encode(protocol.op_message(protocol.Op.KILL, launch_id="x", grace=0)) == \
        protocol.encode({"op": "kill", "launch_id": "x", "grace": 0})
    assert protocol.encode(protocol.ev_message(protocol.Ev.LAUNCHED, launch_id="x", pid=5, start_time=7)) == \
        b'{"ev":"launched","launch_id":"x","pid":5,"start_time":7}\n'
    with pytest.raises(ValueError):
        protocol.op_message("shutdown")
    with pytest.raises(ValueError):
        protocol.ev_message("shutdown")
    assert protocol.op_of({"op": "retoken"}) is protocol.Op.RETOKEN
    assert protocol.ev_of(protocol.decode(b'{"ev":"exited"}')) is protocol.Ev.EXITED
    for bad in ({}, {"op": "nope"}, {"op": None}, {"op": ["kill"]}, {"ev": "kill"}, {"op": "hello"}):
        assert protocol.op_of(bad) is None and protocol.ev_of(bad) is None


def _wire_kind_uses(tree):
    """Every place a module builds or compares an ``op``/``ev`` by hand: a dict display with such a key, a
    ``dict(..., op=...)`` keyword, or a comparison whose operand is ``x["op"]`` / ``x.get("op")`` (or "ev")."""
    import ast

    def is_kind(node):
        return isinstance(node, ast.Constant) and node.value in ("op", "ev")

    def reads_kind(node):
        if isinstance(node, ast.Subscript) and is_kind(node.slice):
            return True
        return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
                and bool(node.args) and is_kind(node.args[0]))

    for node in ast.walk(tree):
        if isinstance(node, ast.Dict) and any(k is not None and is_kind(k) for k in node.keys):
            yield node.lineno, "dict display with an op/ev key"
        elif isinstance(node, ast.Call) and any(kw.arg in ("op", "ev") for kw in node.keywords):
            yield node.lineno, "op=/ev= keyword"
        elif isinstance(node, ast.Compare) and any(reads_kind(x) for x in [node.left, *node.comparators]):
            yield node.lineno, "comparison of a raw op/ev"


def test_every_op_and_event_on_the_wire_is_an_enum_member():
    """Outside ``protocol.py`` no module of ``leoflow_agent`` or ``leoflow_airflow`` writes or compares an
    ``op``/``ev`` by hand: every message is built by ``op_message``/``ev_message`` (which refuse a non-member)
    and read by ``op_of``/``ev_of``. So every kind that reaches the wire is an ``Op``/``Ev`` member."""
    import ast
    import pathlib

    root = pathlib.Path(protocol.__file__).resolve().parent.parent
    offenders = []
    for package in ("leoflow_agent", "leoflow_airflow"):
        for path in sorted((root / package).rglob("*.py")):
            if path.resolve() == pathlib.Path(protocol.__file__).resolve():
                continue
            for line, what in _wire_kind_uses(ast.parse(path.read_text(), str(path))):
                offenders.append(f"{path.relative_to(root)}:{line}: {what}")
    assert offenders == []
    # the check sees what it claims to: the pre-typing forms are caught
    samples = ['{"ev": "hello"}', 'dict(m, op="launch")', 'm.get("op") == "kill"', 'm["ev"] in ("a", "b")']
    assert all(list(_wire_kind_uses(ast.parse(code))) for code in samples)


def test_a_real_zygote_speaks_only_enum_members(tmp_path):
    """A real zygote (no Task SDK preload), driven with every op built by ``op_message``: it answers each (no
    "unknown op"), and every event it sends is an ``Ev`` member: hello, launch_failed of a malformed launch and
    of a held launch killed before its fork, launched and exited of an agent killed once forked."""
    import subprocess
    import sys

    from zygote_client import ZygoteClient

    sock = str(tmp_path / "z.sock")
    log = tmp_path / "zygote.log"
    with open(log, "wb") as out:
        zygote = subprocess.Popen([sys.executable, "-c", "import sys; from leoflow_agent.zygote import Zygote; "
                                   "sys.exit(Zygote(sys.argv[1], preload=False).serve())", sock],
                                  stdout=out, stderr=subprocess.STDOUT)
    conn = ZygoteClient(sock, timeout=30)
    try:
        events = [conn.next()]
        op = protocol.op_message
        conn.send(op(protocol.Op.LAUNCH, launch_id="bad"))  # malformed
        events.append(conn.next())
        conn.send(op(protocol.Op.LIMIT, max_agents=0))
        conn.send(op(protocol.Op.LAUNCH, launch_id="held", workload="{}", server="http://127.0.0.1:9"))
        conn.send(op(protocol.Op.RETOKEN, launch_id="held", workload="{}"))
        conn.send(op(protocol.Op.KILL, launch_id="held", grace=0))
        events.append(conn.next())
        conn.send(op(protocol.Op.LIMIT, max_agents=None))
        conn.send(op(protocol.Op.LAUNCH, launch_id="runs", workload="{}", server="http://127.0.0.1:9"))
        _, seen = conn.until("runs", ("launched",))
        conn.send(op(protocol.Op.KILL, launch_id="runs", grace=0))
        _, more = conn.until("runs", ("exited",))
        events.extend(seen + more)
    finally:
        conn.close()
        zygote.wait(timeout=30)
    kinds = [(protocol.ev_of(e), e.get("launch_id")) for e in events]
    assert kinds == [(protocol.Ev.HELLO, None), (protocol.Ev.LAUNCH_FAILED, "bad"),
                     (protocol.Ev.LAUNCH_FAILED, "held"), (protocol.Ev.LAUNCHED, "runs"),
                     (protocol.Ev.EXITED, "runs")], events
    assert {e["ev"] for e in events} <= WIRE_EVENTS
    assert "unknown op" not in log.read_text() and "bad message" not in log.read_text()
