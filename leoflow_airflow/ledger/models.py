"""The ledger's tables, in their own ``MetaData`` inside Airflow's metadata database.

DESIGN §2 / issue 2 item 2: leoflow keeps its attempts in tables it owns (never Airflow's ``Base``), created
and upgraded by ``airflow db migrate`` through ``LeoflowDBManager``. The migration in
``migrations/versions/`` build exactly this schema (0001 creates it, later revisions alter it); change both
together.
"""

from __future__ import annotations

from datetime import datetime, timezone

from sqlalchemy import (
    BigInteger,
    Column,
    DateTime,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    UniqueConstraint,
)
from sqlalchemy.types import TypeDecorator

__all__ = ["CREDENTIAL_ID_LEN", "HOST_LEN", "ID_LEN", "UtcDateTime", "attempt_table", "infra_budget_table", "metadata",
           "warm_worker_table"]

ID_LEN = 250
"""Length of dag_id / task_id / run_id columns: Airflow's own limit for these ids."""

HOST_LEN = 300
"""Length of ``leoflow_attempt.host``: a hostname (at most 253) + ``/`` + a boot id (36)."""

CREDENTIAL_ID_LEN = 256
"""Length of ``leoflow_attempt.exchange_credential_id``: a TokenReview's ``credential-id`` (``JTI=<uuid>`` for a
ServiceAccount token, 40 characters), cut to this length if longer."""

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}
"""Deterministic constraint names, so migrations can name what they alter."""

metadata = MetaData(naming_convention=NAMING_CONVENTION)
"""leoflow's own MetaData; ``LeoflowDBManager.metadata``. Holds only leoflow tables."""


class UtcDateTime(TypeDecorator[datetime]):
    """A timestamp stored in UTC and always read back timezone-aware (UTC).

    Writing a naive ``datetime`` raises ``ValueError``: the ledger never guesses a timezone. PostgreSQL
    stores ``timestamptz``; SQLite and MySQL keep no zone, so UTC is written without an offset and marked
    UTC again on read. MySQL gets microsecond precision (``DATETIME(6)``), like Airflow's own columns.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def load_dialect_impl(self, dialect):
        """Use ``DATETIME(6)`` on MySQL/MariaDB, the generic zone-aware type elsewhere."""
        if dialect.name in ("mysql", "mariadb"):
            from sqlalchemy.dialects.mysql import DATETIME

            return dialect.type_descriptor(DATETIME(fsp=6))
        return dialect.type_descriptor(DateTime(timezone=True))

    def process_bind_param(self, value: datetime | None, dialect) -> datetime | None:
        """Convert an aware datetime to UTC before it is written; reject a naive one."""
        if value is None:
            return None
        if not isinstance(value, datetime):
            raise TypeError(f"expected datetime, got {type(value).__name__}")
        if value.tzinfo is None or value.utcoffset() is None:
            raise ValueError("naive datetime given to the ledger; pass a timezone-aware UTC value")
        value = value.astimezone(timezone.utc)
        if dialect.name != "postgresql":
            # No zone column: store plain UTC (on SQLite, text that orders correctly as strings).
            return value.replace(tzinfo=None)
        return value

    def process_result_value(self, value: datetime | None, dialect) -> datetime | None:
        """Return the stored value as an aware UTC datetime."""
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=timezone.utc)
        return value.astimezone(timezone.utc)


_PK_INT = BigInteger().with_variant(Integer(), "sqlite")  # SQLite autoincrements only INTEGER keys

attempt_table = Table(
    "leoflow_attempt",
    metadata,
    Column("id", _PK_INT, primary_key=True, autoincrement=True),
    Column("ti_id", String(36), nullable=False),
    Column("try_number", Integer, nullable=False),
    Column("attempt_epoch", Integer, nullable=False),
    Column("dag_id", String(ID_LEN), nullable=False),
    Column("task_id", String(ID_LEN), nullable=False),
    Column("run_id", String(ID_LEN), nullable=False),
    Column("map_index", Integer, nullable=False, server_default="-1"),
    Column("state", String(20), nullable=False),
    Column("runtime", String(20), nullable=False),
    Column("workload_json", Text, nullable=False),
    Column("scheduler_job_id", Integer, nullable=True),
    Column("host", String(HOST_LEN), nullable=True),
    Column("pid", Integer, nullable=True),
    Column("proc_start_time", BigInteger, nullable=True),
    Column("record_path", Text, nullable=True),
    Column("pod_name", String(253), nullable=True),
    Column("pod_uid", String(64), nullable=True),
    Column("reported_state", String(32), nullable=True),
    Column("exit_status", Integer, nullable=True),
    Column("resolution", String(32), nullable=True),
    Column("detail", Text, nullable=True),
    Column("created_at", UtcDateTime, nullable=False),
    Column("dispatched_at", UtcDateTime, nullable=True),
    Column("reported_at", UtcDateTime, nullable=True),
    Column("exited_at", UtcDateTime, nullable=True),
    Column("closed_at", UtcDateTime, nullable=True),
    Column("updated_at", UtcDateTime, nullable=False),
    Column("exchanged_at", UtcDateTime, nullable=True),
    Column("exchange_credential_id", String(CREDENTIAL_ID_LEN), nullable=True),
    Column("row_version", Integer, nullable=False, server_default="0"),
    Column("outcome_json", Text, nullable=True),
    UniqueConstraint("ti_id", "attempt_epoch"),
    Index(None, "state", "id"),
    Index(None, "dag_id", "run_id", "task_id", "map_index"),
    Index(None, "closed_at"),
)
"""One row per attempt (ti_id, attempt_epoch); ``try_number`` is carried for the guard.

The unique key (ti_id, attempt_epoch) is what makes epoch claims atomic (``LedgerStore.claim_epoch``).
``host`` (revision 0003) is ``<hostname>/<boot id>`` of the claiming scheduler (``leoflow_airflow.hosts``);
NULL in rows written before it, which count as this host's.
``exchanged_at`` and ``exchange_credential_id`` (revision 0004) record the Kubernetes token exchange of the
attempt (``LedgerStore.record_exchange``): when its pod's token was exchanged for the workload, and the
TokenReview's credential id (``JTI=…``) of that token. NULL until then, and always for Lite attempts; a set
``exchanged_at`` refuses every later exchange of the attempt.
``row_version`` (revision 0006) counts the guarded writes that changed the row (``LedgerStore._guarded_update``
sets it to ``row_version + 1``); ``LedgerStore.open_page`` re-reads whole rows only when it moved.
``outcome_json`` (revision 0007) is the outcome record a warm pod's agent POSTed in-band for the attempt
(``WarmLedger.store_outcome``: the first one stored wins); NULL otherwise.
The index on ``(state, id)`` (revision 0005; ``state`` alone before) serves the lifecycle's reads by state and its
keyset pages of LIVE rows (``LedgerStore.in_states``, ``LedgerStore.open_page``) as bounded range scans.
"""

infra_budget_table = Table(
    "leoflow_infra_budget",
    metadata,
    Column("dag_id", String(ID_LEN), nullable=False),
    Column("run_id", String(ID_LEN), nullable=False),
    Column("task_id", String(ID_LEN), nullable=False),
    Column("map_index", Integer, nullable=False),
    Column("spent", Integer, nullable=False, server_default="0"),
    Column("seen_max_tries", Integer, nullable=False),
    Column("updated_at", UtcDateTime, nullable=False),
    Column("clear_number", Integer, nullable=True),
    PrimaryKeyConstraint("dag_id", "run_id", "task_id", "map_index"),
)
"""Infra re-drive budget per logical TI (DESIGN §2 "no record / RUNNING" row): ``spent`` re-runs since the
last clear; ``seen_max_tries`` and the dag run's ``clear_number`` at the last charge tell a clear apart
(``redrive.budget_decision``). ``clear_number`` is NULL in rows written before revision 0002."""

warm_worker_table = Table(
    "leoflow_warm_worker",
    metadata,
    Column("pod_uid", String(64), nullable=False),
    Column("pod_name", String(253), nullable=False),
    Column("namespace", String(253), nullable=False),
    Column("dag_version_id", String(36), nullable=False),
    Column("credential_sha256", String(64), nullable=True),
    Column("state", String(16), nullable=False),
    Column("ti_id", String(36), nullable=True),
    Column("try_number", Integer, nullable=True),
    Column("attempt_epoch", Integer, nullable=True),
    Column("assigned_at", UtcDateTime, nullable=True),
    Column("taken_at", UtcDateTime, nullable=True),
    Column("registered_at", UtcDateTime, nullable=False),
    Column("last_seen_at", UtcDateTime, nullable=True),
    Column("updated_at", UtcDateTime, nullable=True),
    Column("attempts_taken", Integer, nullable=False, server_default="0"),
    Column("row_version", Integer, nullable=False, server_default="0"),
    PrimaryKeyConstraint("pod_uid"),
    Index(None, "credential_sha256", unique=True),
    Index(None, "dag_version_id", "state"),
)
"""One row per registered warm pod (revision 0007; issue 11, DESIGN "Warm pools"): the channel between the
scheduler (which assigns an attempt to an idle worker) and the api-server (which hands it to the pod's agent on
its long poll). ``state`` is ``idle`` | ``assigned`` | ``busy`` | ``killing`` (a kill of the attempt it holds is
under way: never released or assigned); ``ti_id``/``try_number``/``attempt_epoch`` name the attempt held while
``assigned``, ``busy`` or ``killing`` (NULL while ``idle``). ``credential_sha256`` is the SHA-256 hex of
the opaque bearer credential the pod got at registration (the credential itself is never stored; unique, so a
credential names one row). ``row_version`` counts the state changes (``WarmLedger.assign`` is guarded on it).
Written only by ``leoflow_airflow.ledger.warm.WarmLedger``."""
