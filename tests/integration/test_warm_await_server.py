"""The warm ``await`` long poll served by a real ASGI server (uvicorn, as the api-server runs the plugin app):
a client that goes away ends the poll at its next read, instead of holding a worker thread's DB reads for the
rest of ``await_seconds``; and held polls do not block the event loop (the DB reads run in threads).

The app is leoflow's own (``create_app``) with the warm endpoints on a real ``WarmLedger`` (SQLite); there is no
Kubernetes here: the worker row is registered directly, as registration would have left it.
"""

from __future__ import annotations

import hashlib
import threading
import time
import uuid

import httpx
import pytest
import sqlalchemy as sa
import uvicorn

from devtools.stack import free_port
from leoflow_airflow.api.app import create_app
from leoflow_airflow.api.exchange import ExchangeService
from leoflow_airflow.api.warm import WarmPods, WarmService
from leoflow_airflow.ledger.models import metadata
from leoflow_airflow.ledger.store import LedgerStore
from leoflow_airflow.ledger.warm import WarmLedger

CREDENTIAL = "D" * 43


class CountingPods(WarmPods):
    """``WarmPods`` counting the polls of a held await."""

    polls = 0

    def poll(self, pod_uid: str):
        type(self).polls += 1
        return super().poll(pod_uid)


@pytest.fixture
def server(tmp_path):
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'ledger.db'}", connect_args={"check_same_thread": False})
    metadata.create_all(engine)
    workers = WarmLedger(engine)
    assert workers.register(pod_uid="uid-1", pod_name="w", namespace="ns", dag_version_id=str(uuid.uuid4()),
                            credential_sha256=hashlib.sha256(CREDENTIAL.encode()).hexdigest())
    pods = CountingPods(config=None, kube=None, workers=workers, attempts=LedgerStore(engine),  # type: ignore[arg-type]
                        mint=lambda a: "{}")
    CountingPods.polls = 0
    app = create_app(exchange_factory=lambda: ExchangeService(None), ui=False,
                     warm_factory=lambda _: WarmService(pods, await_seconds=30, poll_interval=0.25))
    port = free_port()
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not srv.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        srv.should_exit = True
        thread.join(30)
        engine.dispose()


def test_a_client_that_goes_away_ends_the_held_await(server):
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server}/v1/warm/await", content=b"{}", headers={"authorization": f"Bearer {CREDENTIAL}"},
                   timeout=1.0)
    # the poll notices at its next read (every 0.25 s); then it reads no more
    time.sleep(1.0)
    settled = CountingPods.polls
    assert 2 <= settled <= 12, settled
    time.sleep(1.5)
    assert CountingPods.polls == settled, "the await kept polling for a client that went away"


def test_held_awaits_leave_the_event_loop_free(server):
    """Three awaits held at once; the health route still answers at once."""
    def hold() -> None:
        try:
            httpx.post(f"{server}/v1/warm/await", content=b"{}", headers={"authorization": f"Bearer {CREDENTIAL}"},
                       timeout=2.0)
        except httpx.ReadTimeout:
            pass

    threads = [threading.Thread(target=hold) for _ in range(3)]
    for t in threads:
        t.start()
    time.sleep(0.5)
    t0 = time.monotonic()
    assert httpx.get(f"{server}/v1/health", timeout=5).status_code == 200
    assert time.monotonic() - t0 < 1.0
    for t in threads:
        t.join()
