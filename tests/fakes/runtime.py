"""``FakeRuntime`` and ``FakeAirflow``: the lifecycle's two seams, scripted by a test.

``FakeRuntime`` implements :class:`leoflow_airflow.lifecycle.runtime.Runtime`: it records launches and kills,
returns the events a test queued from :meth:`FakeRuntime.poll`, and answers ``observe``/``locate``/``evidence``
from dicts the test sets (httpx's ``MockTransport`` at the runtime seam). ``FakeAirflow`` holds Airflow's
task-instance rows in a dict and records replays and re-drives. Both pair with the real SQLite ``LedgerStore``
and an injected clock.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from leoflow_agent.outcome import OutcomeRecord
from leoflow_airflow.dispatch.disposition import Disposition, DispatchResult
from leoflow_airflow.dispatch.guard import TIRow
from leoflow_airflow.ledger.states import AttemptRef
from leoflow_airflow.lifecycle.runtime import (
    EndCause,
    Evidence,
    LaunchSpec,
    Presence,
    RuntimeEvent,
    RuntimeFacts,
    StartProgress,
)
from leoflow_airflow.redrive import RedriveResult
from leoflow_airflow.settle import SettleResult


class FakeRuntime:
    """A scripted runtime. Presence defaults to LIVE for an attempt with a handle, GONE without one."""

    kind = "lite"
    host = None  # unstamped attempts: judged as this host's

    def __init__(self) -> None:
        self.admit_result: DispatchResult | None = None
        self.launch_result = DispatchResult(Disposition.DISPATCHED)
        self.launched: list[LaunchSpec] = []
        self.callbacks: list[tuple[str, Any]] = []
        self.events: list[RuntimeEvent] = []
        self.owed_at_stop: list[RuntimeEvent] = []
        self.presence: dict[AttemptRef, Presence] = {}
        self.located: dict[AttemptRef, RuntimeFacts] = {}
        self.records: dict[AttemptRef, OutcomeRecord] = {}
        self.causes: dict[AttemptRef, EndCause] = {}  # what a runtime's status says ended an attempt (Kubernetes)
        self.progress: dict[AttemptRef, StartProgress] = {}  # how far an attempt got to start (Kubernetes)
        self.killed: list[AttemptRef] = []
        self.kill_graces: list[float] = []  # the grace of each kill, in the order of ``killed``
        self.killed_launches: list[str] = []
        self.adopted: list[AttemptRef] = []
        self.forgotten: list[AttemptRef] = []
        self.freed: list[float] = []
        self.observed: list[list[AttemptRef]] = []  # the attempts of each ``observe`` call, in order
        self.heartbeats_seen: list[dict[AttemptRef, float | None]] = []  # each ``observe``'s heartbeat ages
        self.stopped = False

    def start(self) -> None:
        """Nothing to start."""

    def stop(self, timeout: float) -> Sequence[RuntimeEvent]:
        """Return the events a test queued in ``owed_at_stop``."""
        self.stopped = True
        return list(self.owed_at_stop)

    def terminate(self) -> None:
        """Record the stop."""
        self.stopped = True

    def admit(self) -> DispatchResult | None:
        """``admit_result`` (None: admit)."""
        return self.admit_result

    def record_path(self, ti_id: str, attempt_epoch: int) -> str:
        """A path that is never read (evidence comes from ``records``)."""
        return f"/fake/{ti_id}/{attempt_epoch}/record.json"

    def launch(self, spec: LaunchSpec) -> DispatchResult:
        """Record the spec; ``launch_result``."""
        self.launched.append(spec)
        return self.launch_result

    def launch_callback(self, launch_id: str, workload: Any) -> DispatchResult:
        """Record the callback."""
        self.callbacks.append((launch_id, workload))
        return self.launch_result

    def poll(self) -> Sequence[RuntimeEvent]:
        """The queued events, then none."""
        out, self.events = self.events, []
        return out

    def observe(self, attempts: Sequence[Any],
                heartbeats: Mapping[AttemptRef, float | None] | None = None) -> dict[AttemptRef, Presence]:
        """From ``presence``; unset: LIVE with a handle (a pid, or ``located``), GONE without (Lite's answer).
        ``heartbeats`` is recorded in ``heartbeats_seen`` and otherwise ignored."""
        self.observed.append([a.ref for a in attempts])
        self.heartbeats_seen.append(dict(heartbeats or {}))
        return {a.ref: self.presence.get(a.ref, Presence.LIVE if a.pid is not None or a.ref in self.located
                                         else Presence.GONE) for a in attempts}

    def start_progress(self, attempts: Sequence[Any]) -> dict[AttemptRef, StartProgress]:
        """From ``progress`` (unset: nothing said, as Lite)."""
        return {a.ref: self.progress[a.ref] for a in attempts if a.ref in self.progress}

    def locate(self, attempt: Any) -> RuntimeFacts | None:
        """From ``located``."""
        return self.located.get(attempt.ref)

    def evidence(self, attempt: Any) -> Evidence:
        """From ``records`` and ``causes``."""
        return Evidence(self.records.get(attempt.ref), attempt.exit_status, self.causes.get(attempt.ref))

    def kill(self, attempt: Any, *, grace: float) -> Presence:
        """Record the kill and its grace. Grace 0: the attempt is GONE at once. A graceful kill leaves its
        presence as it was and answers LIVE (the task has its grace; a test ends it with an ``Exited`` and
        GONE, as the runtime's escalation would)."""
        self.killed.append(attempt.ref)
        self.kill_graces.append(grace)
        if grace > 0:
            return Presence.LIVE
        self.presence[attempt.ref] = Presence.GONE
        self.located.pop(attempt.ref, None)
        return Presence.GONE

    def kill_launch(self, launch_id: str) -> None:
        """Record the kill."""
        self.killed_launches.append(launch_id)

    def forget(self, ref: AttemptRef) -> None:
        """Record it."""
        self.forgotten.append(ref)

    def adopt(self, attempt: Any) -> None:
        """Record it."""
        self.adopted.append(attempt.ref)

    def collect(self, is_closed: Callable[[str, int], bool],
                workload_of: Callable[[str, int], str | None] | None = None) -> int:
        """Nothing to collect."""
        return 0

    def extra_capacity(self, parallelism: int, running_ages: Sequence[float]) -> int:
        """No queue-ahead."""
        return 0

    def slot_freed(self, held_for: float) -> None:
        """Record it."""
        self.freed.append(held_for)


@dataclass
class FakeAirflow:
    """Airflow's task-instance rows (by id) and the calls the lifecycle made.

    ``replay_result(record) -> SettleResult`` and ``redrive_result`` script the answers; ``on_replay`` runs
    inside each replay (a test advances its clock there)."""

    rows: dict[str, TIRow] = field(default_factory=dict)
    logical: dict[tuple[str, str, str, int], str] = field(default_factory=dict)
    replays: list[OutcomeRecord] = field(default_factory=list)
    replay_result: Callable[[OutcomeRecord], SettleResult] = lambda r: SettleResult(True, True, "204: applied")
    on_replay: Callable[[], None] = lambda: None
    api_up: bool = True  # what ``api_reachable`` answers
    redrives: list[str] = field(default_factory=list)
    redrive_reasons: list[str] = field(default_factory=list)  # the Log row's reason of each re-drive
    redrive_result: RedriveResult = RedriveResult.REDRIVEN
    lost_success: list[str] = field(default_factory=list)
    held_off: list[str] = field(default_factory=list)
    retry_requests: list[str] = field(default_factory=list)
    alive_jobs: set[int] = field(default_factory=set)
    heartbeats: dict[str, Any] = field(default_factory=dict)  # ti_id -> ``last_heartbeat_at`` (unset: None)
    running: list[Any] = field(default_factory=list)  # ``reap.orphan.RunningTI`` rows ``running_tis`` pages
    running_reads: list[tuple[str | None, int]] = field(default_factory=list)  # (after, limit) of each page read
    logical_reads: list[list[tuple[str, str, str, int]]] = field(default_factory=list)  # keys of each logical read

    def put(self, ti_id: str, state: str | None, *, try_number: int = 1, logical: tuple = ("dag", "run", "task", -1),
            queued_by_job_id: int | None = None) -> None:
        """Set the row of ``ti_id`` and make it the current row of its logical TI."""
        self.rows[ti_id] = TIRow(id=ti_id, state=state, try_number=try_number, max_tries=1,
                                 queued_by_job_id=queued_by_job_id)
        self.logical[logical] = ti_id

    def set_state(self, ti_id: str, state: str | None) -> None:
        """Change one row's state."""
        self.rows[ti_id] = replace(self.rows[ti_id], state=state)

    def ti_row_by_id(self, ti_id: str) -> TIRow | None:
        return self.rows.get(ti_id)

    def ti_rows_by_id(self, ti_ids: list[str]) -> dict[str, TIRow]:
        return {ti_id: self.rows[ti_id] for ti_id in ti_ids if ti_id in self.rows}

    def ti_row(self, dag_id: str, run_id: str, task_id: str, map_index: int) -> TIRow | None:
        self.logical_reads.append([(dag_id, run_id, task_id, map_index)])
        ti_id = self.logical.get((dag_id, run_id, task_id, map_index))
        return None if ti_id is None else self.rows.get(ti_id)

    def ti_rows(self, keys: list[tuple[str, str, str, int]]) -> dict[tuple[str, str, str, int], TIRow]:
        self.logical_reads.append(list(keys))
        found = {k: self.rows.get(self.logical[k]) for k in keys if k in self.logical}
        return {k: row for k, row in found.items() if row is not None}

    def jobs_alive(self, job_ids: set[int]) -> set[int]:
        return set(job_ids) & self.alive_jobs

    def running_tis(self, after: str | None, limit: int) -> list[Any]:
        """A keyset page of ``running`` (RUNNING rows only), ascending ``ti_id``, as Airflow's query pages it."""
        self.running_reads.append((after, limit))
        rows = sorted((r for r in self.running if r.state == "running"), key=lambda r: r.ti_id)
        return [r for r in rows if after is None or r.ti_id > after][:limit]

    def ti_liveness(self, ti_ids: list[str]) -> dict[str, tuple[str | None, Any]]:
        return {i: (self.rows[i].state, self.heartbeats.get(i)) for i in ti_ids if i in self.rows}

    def replay(self, record: OutcomeRecord) -> SettleResult:
        self.replays.append(record)
        self.on_replay()
        return self.replay_result(record)

    def infra_redrive(self, ti_id: str, reason: str) -> RedriveResult:
        self.redrives.append(ti_id)
        self.redrive_reasons.append(reason)
        return self.redrive_result

    def lost_success_callback(self, *, ti_id: str, **_: Any) -> None:
        self.lost_success.append(ti_id)

    def retry_callback(self, *, msg: str, **_: Any) -> Any:
        self.retry_requests.append(msg)
        return {"retry_callback": msg}

    def api_reachable(self) -> bool:
        return self.api_up

    def hold_off_purge(self, ti_id: str) -> bool:
        self.held_off.append(ti_id)
        return True

    def workload_from_json(self, workload_json: str) -> Any:
        from airflow.executors.workloads import ExecuteTask

        return ExecuteTask.model_validate({**json.loads(workload_json), "token": ""})

    def task_key(self, dag_id: str, task_id: str, run_id: str, try_number: int, map_index: int) -> Any:
        from airflow.models.taskinstancekey import TaskInstanceKey

        return TaskInstanceKey(dag_id, task_id, run_id, try_number, map_index)
