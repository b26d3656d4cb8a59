"""The UI's warm pools route shows only the DAGs the caller may read (k8s review §16b; ``api/ui.py``).

The route's general check (``requires_access_dag`` with no ``dag_id``) passes for anyone with the DAG-read grant;
the rows must then be filtered per DAG by the auth manager, as Airflow's own list routes are. Here the route runs
in-process with Airflow's ``get_user`` and auth manager stubbed; the real login is tests/integration's."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from leoflow_airflow.api import ui

V_A = "0192f0c4-1111-7222-8333-444455556666"
V_B = "0192f0c4-2222-7222-8333-444455556666"


class StubAuthManager:
    """Grants ``alice`` the DAG ``team_a_etl`` only; records what it was asked."""

    def __init__(self) -> None:
        self.asked: list[tuple[object, str]] = []

    def get_authorized_dag_ids(self, *, user, method="GET", session=None):
        self.asked.append((user, method))
        return {"team_a_etl"} if user.name == "alice" else set()


@pytest.fixture
def client(monkeypatch):
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from airflow.api_fastapi.core_api.security import get_user

    manager = StubAuthManager()
    monkeypatch.setattr("airflow.api_fastapi.app.get_auth_manager", lambda: manager)
    monkeypatch.setenv("AIRFLOW__LEOFLOW__RUNTIME", "kubernetes")
    monkeypatch.setenv("AIRFLOW__LEOFLOW__NAMESPACE", "tasks")
    rows = [{"dag_id": "team_a_etl", "dag_version_id": V_A, "ready": 1, "starting": 0, "busy": 0,
             "attempts_taken": 3},
            {"dag_id": "team_b_secret", "dag_version_id": V_B, "ready": 2, "starting": 0, "busy": 1,
             "attempts_taken": 9},
            {"dag_id": "0192f0c4-3333-7222-8333-444455556666", "dag_version_id": "0192f0c4-3333-7222-8333-444455556666",
             "ready": 1, "starting": 0, "busy": 0, "attempts_taken": 0}]  # a version whose DAG row is gone
    monkeypatch.setattr(ui, "ledger_warm_rows", lambda namespace, engine=None: [dict(r) for r in rows])
    app = FastAPI()
    holder = ui.LedgerHolder(lambda: SimpleNamespace(engine=None, dispose=lambda: None))
    app.include_router(ui.create_router(holder, read_access=lambda: None))
    user = SimpleNamespace(name="alice")
    app.dependency_overrides[get_user] = lambda: user
    with TestClient(app) as http:
        yield http, manager, user


def test_the_pools_route_lists_only_the_pools_of_dags_the_caller_may_read(client):
    http, manager, user = client
    body = http.get("/v1/ui/pools").json()
    assert [(p["dag_id"], p["dag_version_id"]) for p in body["pools"]] == [("team_a_etl", V_A)]
    assert V_B not in str(body) and "team_b_secret" not in str(body)
    assert manager.asked == [(user, "GET")]
    user.name = "mallory"  # the general grant, no DAG of her own: an empty list, not every team's versions
    assert http.get("/v1/ui/pools").json()["pools"] == []


def test_readable_pools_keeps_the_rest_of_the_answer():
    body = {"runtime": "kubernetes", "source": "s", "note": "n", "pools": [{"dag_id": "a"}, {"dag_id": "b"}]}
    assert ui.readable_pools(body, {"b", "c"}) == {**body, "pools": [{"dag_id": "b"}]}
    assert body["pools"] == [{"dag_id": "a"}, {"dag_id": "b"}]  # not modified in place
