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
