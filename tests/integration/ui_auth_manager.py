"""A test-only Airflow auth manager: Airflow's ``SimpleAuthManager`` that denies named DAGs to named users.

Airflow's SimpleAuthManager grants every role read access to every DAG (``is_authorized_dag``: any role from
``viewer`` up may ``GET``; only multi-team mode narrows it, by team), so it cannot express "this logged-in user may
not read that DAG". An operator's real auth manager (FAB, Keycloak, their own) can; ``[core] auth_manager`` is
Airflow's extension point for it, and this subclass is the smallest such manager: everything as SimpleAuthManager
decides, except that ``is_authorized_dag`` answers False for the ``(user, dag_id)`` pairs listed in
``$LEOFLOW_TEST_DENY_DAGS`` (``user:dag_id`` pairs, comma-separated). Airflow's batch and listing checks
(``batch_is_authorized_dag``, ``get_authorized_dag_ids``) go through ``is_authorized_dag`` in the base class, so
Airflow's own API agrees with leoflow's routes.

Configured in a stack with ``AIRFLOW__CORE__AUTH_MANAGER=tests.integration.ui_auth_manager.DagDenyingAuthManager``
(the stack puts the repo root on ``PYTHONPATH``).
"""

from __future__ import annotations

import os
from typing import Any

from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager

DENY_ENV = "LEOFLOW_TEST_DENY_DAGS"


def denied_pairs(text: str) -> frozenset[tuple[str, str]]:
    """``"alice:dag_a,bob:dag_b"`` → ``{("alice", "dag_a"), ("bob", "dag_b")}``.

    :raises ValueError: an entry is not ``user:dag_id``.
    """
    pairs = set()
    for entry in (e.strip() for e in text.split(",")):
        if not entry:
            continue
        user, sep, dag_id = entry.partition(":")
        if not sep or not user or not dag_id:
            raise ValueError(f"{DENY_ENV}: {entry!r} is not user:dag_id")
        pairs.add((user, dag_id))
    return frozenset(pairs)


class DagDenyingAuthManager(SimpleAuthManager):
    """SimpleAuthManager that denies every method on the DAGs ``$LEOFLOW_TEST_DENY_DAGS`` names to their users."""

    def is_authorized_dag(self, *, method: Any, user: Any, access_entity: Any = None, details: Any = None) -> bool:
        """False for a denied ``(user, details.id)`` pair; else SimpleAuthManager's answer."""
        dag_id = getattr(details, "id", None)
        if dag_id is not None and (user.get_name(), dag_id) in denied_pairs(os.environ.get(DENY_ENV, "")):
            return False
        return super().is_authorized_dag(method=method, user=user, access_entity=access_entity, details=details)
