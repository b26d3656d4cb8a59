"""An in-memory stand-in for the contract's ``WarmLedger`` (branch warm-server owns the real table): the methods
the Kubernetes runtime and its warm pool call, each one guarded as the real statements are. For narrow tests of the
scheduler side only; the real ledger's races are tested against PostgreSQL on its own branch."""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone

from leoflow_airflow.ledger.states import AttemptRef

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=timezone.utc)
V1 = "0192f0c4-1111-7222-8333-444455556666"


@dataclass(frozen=True)
class Row:
    """A ``WarmWorker`` row as the contract shapes it."""

    pod_uid: str
    pod_name: str
    dag_version_id: str = V1
    state: str = "idle"
    ref: AttemptRef | None = None
    assigned_at: datetime | None = None
    taken_at: datetime | None = None
    registered_at: datetime = NOW - timedelta(minutes=5)
    last_seen_at: datetime | None = None
    attempts_taken: int = 0
    row_version: int = 0
    namespace: str = "default"


class MemoryLedger:
    """The contract's ``WarmLedger`` methods the runtime calls, in memory (the real one is branch warm-server's)."""

    def __init__(self) -> None:
        self.rows: dict[str, Row] = {}
        self.outcome_texts: dict[AttemptRef, str] = {}
        self.lock = threading.Lock()

    def workers(self, namespace):
        with self.lock:
            return list(self.rows.values())

    def get(self, pod_uid):
        return self.rows.get(pod_uid)

    def assign(self, pod_uid, ref, *, row_version):
        with self.lock:
            row = self.rows.get(pod_uid)
            if row is None or row.state != "idle" or row.row_version != row_version:
                return False
            self.rows[pod_uid] = replace(row, state="assigned", ref=ref, assigned_at=datetime.now(timezone.utc),
                                         row_version=row.row_version + 1)
            return True

    def unassign(self, pod_uid, ref):
        with self.lock:
            row = self.rows.get(pod_uid)
            if row is None or row.state != "assigned" or row.ref != ref:
                return False
            self.rows[pod_uid] = replace(row, state="idle", ref=None, row_version=row.row_version + 1)
            return True

    def mark_killing(self, pod_uid, ref):
        with self.lock:
            row = self.rows.get(pod_uid)
            if row is None or row.state not in ("busy", "killing") or row.ref != ref:
                return False
            self.rows[pod_uid] = replace(row, state="killing", row_version=row.row_version + 1)
            return True

    def retire_idle(self, pod_uid, *, row_version):
        with self.lock:
            row = self.rows.get(pod_uid)
            if row is None or row.state != "idle" or row.row_version != row_version:
                return False
            del self.rows[pod_uid]
            return True

    def forget(self, pod_uid):
        return self.rows.pop(pod_uid, None) is not None

    def outcomes(self, refs):
        return {r: self.outcome_texts[r] for r in refs if r in self.outcome_texts}


