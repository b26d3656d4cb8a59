"""The pieces of Lite warm workers (:mod:`leoflow_agent.warm`) that need no Airflow: the file key of a launch,
file signatures, the packet wire with a passed descriptor, and the cached-bag stand-in's freshness rule. The
whole path (a real zygote, scheduler and api-server) is ``tests/integration/test_lite_warm.py``."""

from __future__ import annotations

import os
import socket
import types

import pytest

from leoflow_agent import protocol, warm


def test_a_launch_names_its_file_or_is_forked_cold():
    ok = {"dag_file": {"bundle": "dags-folder", "version": None, "path": "etl/daily.py"}}
    assert warm.FileKey.from_launch(ok) == warm.FileKey("dags-folder", None, "etl/daily.py")
    assert warm.FileKey.from_launch(ok).title() == "leoflow warm dags-folder:etl/daily.py"
    assert warm.FileKey("b", "v7", "x.py").title() == "leoflow warm b@v7:x.py"
    for bad in ({}, {"dag_file": None}, {"dag_file": "x.py"}, {"dag_file": {"bundle": "", "path": "x.py"}},
                {"dag_file": {"bundle": "b", "path": ""}}, {"dag_file": {"bundle": "b", "path": "x", "version": 3}},
                {"dag_file": {"bundle": ["b"], "path": "x"}}):
        assert warm.FileKey.from_launch(bad) is None, bad


def test_a_signature_sees_a_rewrite_a_removal_and_a_file_that_appears(tmp_path):
    dag, helper, later = tmp_path / "dag.py", tmp_path / "helper.py", tmp_path / "later.py"
    dag.write_text("A = 1\n")
    helper.write_text("B = 1\n")
    sig = warm.signature_of([str(dag), str(helper), str(later)])
    assert sig[str(later)] == (-1, -1) and warm.changed(sig) is None
    helper.write_text("B = 22\n")
    assert warm.changed(sig) == str(helper)
    sig = warm.signature_of([str(dag), str(later)])
    later.write_text("")
    assert warm.changed(sig) == str(later)
    sig = warm.signature_of([str(dag)])
    dag.unlink()
    assert warm.changed(sig) == str(dag)


def test_packets_carry_one_message_and_the_report_pipe():
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    rfd, wfd = os.pipe()
    try:
        warm.send_packet(mine, protocol.warm_message(protocol.WarmOp.FORK, launch={"launch_id": "a:1:1"}), (wfd,))
        warm.send_packet(mine, protocol.warm_message(protocol.WarmEv.EXITED, pid=5, exit_code=0))
        message, fds = warm.recv_packet(theirs)
        assert protocol.warm_op_of(message) is protocol.WarmOp.FORK and message["launch"] == {"launch_id": "a:1:1"}
        assert len(fds) == 1
        os.write(fds[0], b"x")  # the passed descriptor is the pipe's write end
        os.close(fds[0])
        assert os.read(rfd, 1) == b"x"
        message, fds = warm.recv_packet(theirs)
        assert protocol.warm_ev_of(message) is protocol.WarmEv.EXITED and fds == []
        theirs.send(b"not json")
        assert warm.recv_packet(mine) == ({}, [])
        mine.close()
        assert warm.recv_packet(theirs) == (None, [])
        with pytest.raises(OSError):
            warm.send_packet(theirs, {"ev": "x", "blob": "y" * (warm.MAX_PACKET_BYTES + 1)})
    finally:
        for fd in (rfd, wfd):
            try:
                os.close(fd)
            except OSError:
                pass
        theirs.close()


def test_the_cached_bag_answers_only_the_parse_call_of_its_file_and_only_while_it_is_unchanged(tmp_path):
    """``task_runner.parse`` builds ``BundleDagBag(dag_folder=…, safe_mode=False, load_op_links=False,
    bundle_path=…, bundle_name=…)``; that call, and only that one, gets the file worker's bag back, until the
    file changes."""
    dag = tmp_path / "dag.py"
    dag.write_text("A = 1\n")
    built = []

    class RealBag:
        def __init__(self, *args, **kwargs):
            built.append(kwargs.get("dag_folder"))

    module = types.SimpleNamespace(BundleDagBag=RealBag)
    cached = object()
    warm.install_cached_bag(module, cached, path=str(dag), bundle_path=tmp_path, bundle_name="b",
                            signature=warm.signature_of([str(dag)]))
    call = dict(dag_folder=str(dag), safe_mode=False, load_op_links=False, bundle_path=tmp_path, bundle_name="b")
    assert module.BundleDagBag(**call) is cached and built == []
    assert isinstance(module.BundleDagBag(**dict(call, bundle_name="other")), RealBag)
    assert isinstance(module.BundleDagBag(**dict(call, safe_mode=True)), RealBag)
    assert isinstance(module.BundleDagBag(**dict(call, dag_folder=str(tmp_path / "x.py"))), RealBag)
    dag.write_text("A = 22\n")
    assert isinstance(module.BundleDagBag(**call), RealBag)
    assert built == [str(dag), str(dag), str(tmp_path / "x.py"), str(dag)]
