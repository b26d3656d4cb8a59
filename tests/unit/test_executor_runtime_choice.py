"""``LeoflowExecutor.life`` builds the runtime ``[leoflow] runtime`` names (issue 9 item 6 wiring), without
starting it: ``kubernetes`` → ``KubernetesRuntime``, ``lite`` → ``LiteRuntime``."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from leoflow_airflow import settings as leoflow_settings
from leoflow_airflow.ledger.models import metadata
from leoflow_airflow.ledger.store import LedgerStore


@pytest.mark.parametrize(("runtime", "kind", "cls"), [
    ("kubernetes", "kubernetes", "KubernetesRuntime"),
    ("lite", "lite", "LiteRuntime"),
])
def test_life_builds_the_configured_runtime(tmp_path, runtime, kind, cls):
    from leoflow_airflow.executor import LeoflowExecutor

    conf = {"runtime": runtime, "image": "img:1", "exchange_url": "http://x/leoflow",
            "runtime_dir": str(tmp_path / "rt")}
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'ledger.db'}")
    metadata.create_all(engine)
    executor = LeoflowExecutor()
    executor._settings = leoflow_settings.load(lambda section, key, fallback: conf.get(key, fallback))
    executor._ledger = LedgerStore(engine)
    built = executor.life.runtime
    assert built.kind == kind and type(built).__name__ == cls
    if runtime == "kubernetes":
        assert built.record_path("t", 1) is None and built.extra_capacity(32, [1.0]) == 0
    engine.dispose()
