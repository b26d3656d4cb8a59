"""The executor's end of a zygote's Unix socket, for tests that talk to a real zygote (``tests/unit`` and
``tests/integration``): connect (polling until it accepts), send ops, read events in order."""

from __future__ import annotations

import socket
import time

from leoflow_agent import protocol


class ZygoteClient:
    """One connection to a zygote (the newest connection wins: a test may take over a scheduler's).

    :param path: the zygote's socket.
    :param timeout: seconds to wait for it to accept (the file exists from ``bind()`` on, but accepts only
        from ``listen()`` on) and, afterwards, for each event.
    :raises AssertionError: when it does not accept within ``timeout``.
    """

    def __init__(self, path: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                self.sock.connect(path)
                break
            except (FileNotFoundError, ConnectionRefusedError):
                self.sock.close()
                assert time.monotonic() < deadline, f"the zygote at {path} did not accept in {timeout:g} s"
                time.sleep(0.02)
        self.sock.settimeout(timeout)
        self.buf = protocol.LineBuffer()
        self.pending: list[dict] = []

    def send(self, message: dict) -> None:
        """Send one op."""
        protocol.send(self.sock, message)

    def next(self) -> dict:
        """The next event (blocks up to the timeout; ``AssertionError`` when the zygote hung up)."""
        while not self.pending:
            chunk = self.sock.recv(65536)
            assert chunk, "the zygote hung up"
            self.pending.extend(self.buf.feed(chunk))
        return self.pending.pop(0)

    def until(self, launch_id: str, kinds: tuple[str, ...]) -> tuple[dict, list[dict]]:
        """Read events until one of ``kinds`` for ``launch_id``; return it and every event read on the way."""
        seen = []
        while True:
            event = self.next()
            seen.append(event)
            if event.get("launch_id") == launch_id and event["ev"] in kinds:
                return event, seen

    def close(self) -> None:
        self.sock.close()
