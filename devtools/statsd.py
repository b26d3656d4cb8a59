"""A StatsD listener for tests (`StatsdListener`): a UDP socket on 127.0.0.1 read by a thread (standard library only).

Airflow's StatsD logger (``[metrics] statsd_on``) sends ``<prefix>.<name>:<value>|<type>`` datagrams (several
lines per datagram when batched); :class:`StatsdListener` keeps every one it receives, parsed.
"""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass


def airflow_env(port: int, prefix: str = "airflow") -> dict[str, str]:
    """The ``AIRFLOW__METRICS__*`` environment that points Airflow's StatsD logger (and so leoflow's metrics) at
    ``127.0.0.1:port`` under ``prefix`` (an :class:`AirflowStack`'s ``extra_env``, or a test's ``monkeypatch``)."""
    return {"AIRFLOW__METRICS__STATSD_ON": "True", "AIRFLOW__METRICS__STATSD_HOST": "127.0.0.1",
            "AIRFLOW__METRICS__STATSD_PORT": str(port), "AIRFLOW__METRICS__STATSD_PREFIX": prefix}


@dataclass(frozen=True)
class Sample:
    """One received metric line: ``name`` (as sent, prefix included), ``value`` (text) and ``kind`` (``c``,
    ``g``, ``ms``, ...)."""

    name: str
    value: str
    kind: str


class StatsdListener:
    """Listens on ``127.0.0.1:<port>`` (a free port) until :meth:`close`; use as a context manager."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.port: int = self.sock.getsockname()[1]
        self._samples: list[Sample] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="statsd-listener", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            for line in data.decode("utf-8", "replace").splitlines():
                name, _, rest = line.partition(":")
                value, _, kind = rest.partition("|")
                if name and kind:
                    with self._lock:
                        self._samples.append(Sample(name, value, kind.split("|")[0]))

    def samples(self) -> list[Sample]:
        """Everything received so far."""
        with self._lock:
            return list(self._samples)

    def names(self, prefix: str = "") -> set[str]:
        """The distinct names received that start with ``prefix``, with ``prefix`` cut off."""
        return {s.name[len(prefix):] for s in self.samples() if s.name.startswith(prefix)}

    def wait_names(self, want: set[str], prefix: str = "airflow.", timeout: float = 5.0) -> set[str]:
        """Wait up to ``timeout`` seconds until every name of ``want`` (without ``prefix``) has arrived; the
        names received by then (:meth:`names`), so a caller asserts ``want <= result`` and sees what came."""
        deadline = time.monotonic() + timeout
        while not want <= (names := self.names(prefix)) and time.monotonic() < deadline:
            time.sleep(0.05)
        return names

    def gauges(self, name: str) -> list[float]:
        """Every value received for gauge ``name`` (prefix included), oldest first."""
        return [float(s.value) for s in self.samples() if s.name == name and s.kind == "g"]

    def close(self) -> None:
        """Stop the thread and close the socket."""
        self._stop.set()
        self._thread.join(timeout=5)
        self.sock.close()

    def __enter__(self) -> StatsdListener:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
