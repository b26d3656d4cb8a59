"""``LiteRuntime``: the :class:`~leoflow_airflow.lifecycle.runtime.Runtime` of local agent processes.

Presence (DESIGN §2 "proof of death"): an attempt whose agent (pid + kernel start time) lives is LIVE. Its own
zygote reaps a dead agent and kills what is left of its subtree before it sends ``exited``: until then the
attempt is UNKNOWN, after it GONE. An agent no zygote of ours watches (a predecessor's, or our zygote died)
reparented its orphans to init: they are found by session and ``LEOFLOW_ATTEMPT`` marker, and the attempt is
GONE only once none is left. ``observe`` finishes that orphan clean-up itself: it is the zygote's own reaping,
done on the dead zygote's behalf, never a kill of a live agent (only the lifecycle's reapers, revoke and
terminate kill those, through :meth:`LiteRuntime.kill`). An attempt without a pid is looked up by its agent's
process-title marker (``leoflow_agent.protocol.agent_title_marker``) or, untitled, by its ``LEOFLOW_ATTEMPT``
environment marker, never presumed dead.

Issue 8's seam ("observations answer from what the runtime already holds"): every lookup of one
:meth:`LiteRuntime.observe` call shares one :class:`leoflow_agent.proc.ProcessTable`, so a pass scans ``/proc``
at most once however many attempts it looks at (none when each is answered by its agent's pid or its attempt
cgroup), plus once more only after it killed leftovers, to prove them gone.

Kills (issue 8 hole 16). A graceful kill never blocks: an agent our zygote owns is killed through the zygote's
``kill`` op (SIGTERM and SIGCONT, SIGKILL of the subtree from its own loop once the grace is over, then
``exited``); any other agent (adopted from a predecessor, or orphaned by our own dead zygote) gets SIGTERM and
SIGCONT from here, and :meth:`LiteRuntime.poll` SIGKILLs its subtree and attempt cgroup once the grace is over.
Before either, the attempt's kill marker (``leoflow_agent.protocol.kill_marker_path``) is written, so the agent
refuses a failed report the kill caused (the reconciler re-drives it as an infra loss instead of spending a
user retry). The attempt stays LIVE (UNKNOWN once its agent died and the zygote's word is due) until nothing of
it is left. A kill with grace 0 SIGKILLs at once, for a launch that must not run.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from leoflow_agent import outcome, proc, protocol
from leoflow_airflow import hooks, hosts, metrics
from leoflow_airflow.dispatch.ahead import QueueAhead, retoken_due
from leoflow_airflow.dispatch.disposition import Disposition, DispatchResult
from leoflow_airflow.errors import ZygoteError
from leoflow_airflow.ledger.states import AttemptRef, AttemptState
from leoflow_airflow.lifecycle.runtime import (
    CallbackDone,
    Evidence,
    Exited,
    LaunchFailed,
    LaunchSpec,
    Presence,
    Reported,
    RuntimeEvent,
    RuntimeFacts,
    Started,
    StartProgress,
    launch_id,
)
from leoflow_airflow.runtime.lite.zygote_client import LitePaths, ZygoteClient
from leoflow_airflow.settings import LeoflowSettings

if TYPE_CHECKING:
    from leoflow_airflow.ledger.store import Attempt

log = logging.getLogger(__name__)

GC_INTERVAL = 60.0
"""Seconds between two passes of the record-file GC."""


@dataclass
class _Launch:
    """What the Lite runtime remembers of one launch it handed to its zygote (in memory only)."""

    ref: AttemptRef | None  # None for a callback
    workload: Any  # ExecuteTask / ExecuteCallback; None for an adopted attempt
    handed_at: float  # time.monotonic() when it (or its last retoken) was sent
    agent: proc.ProcessIdentity | None = None  # from ``launched``
    exited: bool = False
    orphaned: bool = False  # its zygote died: no event will come for it, liveness is polled


@dataclass(frozen=True)
class _Kill:
    """A graceful kill in its grace: the agent signalled, when to SIGKILL what is left (``time.monotonic()``
    seconds), and whether our zygote escalates it (else :meth:`LiteRuntime.poll` does)."""

    agent: proc.ProcessIdentity
    launch_id: str
    due: float
    by_zygote: bool


class LiteRuntime:
    """Local agent processes forked by one zygote (``[leoflow] runtime = lite``).

    :param settings: the parsed ``[leoflow]`` section.
    :param parallelism: ``[core] parallelism`` of the executor (the zygote's busy-agent limit, less the agents
        of a predecessor zygote still running).
    :param mint: ``mint(workload, ti_id) -> str``: the task workload as JSON with a token minted now (DESIGN §3).
    :param server: ``server() -> str``: the Execution API URL agents report to.
    :param token_lifetime: seconds a workload token is valid (``[scheduler] task_queued_timeout``); held launches
        are re-tokened every ``min(60, token_lifetime / 4)`` seconds.
    :param fault_for: TEST ONLY ``fault_for(workload, attempt_epoch) -> str | None``.
    :param environ: the scheduler's environment, filtered before it reaches the zygote.
    """

    kind = "lite"

    @property
    def paths(self) -> LitePaths:
        """Where this runtime keeps its files (the zygote's directory is fixed at :meth:`start`)."""
        return self.zygote.paths

    def __init__(self, settings: LeoflowSettings, *, parallelism: int, mint: Callable[[Any, str], str],
                 server: Callable[[], str], token_lifetime: float = 600.0,
                 environ: dict[str, str] | None = None) -> None:
        self.settings = settings
        self.parallelism = parallelism
        self.zygote = ZygoteClient(settings, environ)
        self.host = hosts.this_host(settings.test_host if settings.test_fault_injection else None)
        self._mint = mint
        self._server = server
        self._launches: dict[str, _Launch] = {}
        self._adopted: dict[AttemptRef, proc.ProcessIdentity | None] = {}
        self._kills: dict[AttemptRef, _Kill] = {}  # graceful kills in their grace
        self._limit: int | None = None
        self._limit_sent = False
        self._retoken_after = min(60.0, token_lifetime / 4)
        cap = settings.queue_ahead if settings.queue_ahead >= 0 else 4 * parallelism
        self._ahead = QueueAhead(cap, horizon=min(60.0, token_lifetime / 10))
        self._next_gc = 0.0
        self._stopped = False

    # --- the runtime itself -----------------------------------------------------------------------------
    def start(self) -> None:
        """Spawn the zygote; returns at once (:meth:`admit` answers DEFERRED until it has answered).

        :raises OSError: the zygote could not be spawned at all.
        """
        self.zygote.start()

    def _up(self) -> bool:
        """Advance a starting zygote; True once it is connected. A failed start is logged and retried."""
        if self._stopped:
            return False
        if self.zygote.alive():
            return True
        try:
            if self.zygote.starting:
                return self.zygote.connect()
        except ZygoteError as exc:
            log.error("the leoflow zygote did not come up (will retry): %s", exc)
            self.zygote.kill()
        return False

    def stop(self, timeout: float) -> list[RuntimeEvent]:
        """Hang up on the zygote and return the events it still owed (read until its EOF, at most
        ``timeout`` seconds); its agents keep running for a successor to adopt."""
        self._stopped = True
        events = self._typed(self.zygote.hang_up(timeout)) if self.zygote.alive() else []
        self.zygote.stop()
        return events

    def terminate(self) -> None:
        """Kill the zygote at once."""
        self._stopped = True
        self.zygote.kill()

    # --- launching ----------------------------------------------------------------------------------------
    def admit(self) -> DispatchResult | None:
        """None when the zygote is up and its launch queue has room (``[leoflow] launch_queue_size``)."""
        if not self._up():
            return DispatchResult(Disposition.DEFERRED, "the zygote is not running")
        if len(self.zygote.pending) >= self.settings.launch_queue_size:
            return DispatchResult(Disposition.DEFERRED, "the zygote's launch queue is full")
        return None

    def record_path(self, ti_id: str, attempt_epoch: int) -> str:
        """``<runtime_dir>/attempts/<ti_id>/<epoch>/record.json``."""
        return self.paths.record_path(ti_id, attempt_epoch)

    def launch(self, spec: LaunchSpec) -> DispatchResult:
        """Send a ``launch`` with a token minted now; DEFERRED when the zygote connection broke."""
        assert spec.record_path is not None
        os.makedirs(os.path.dirname(spec.record_path), mode=0o700, exist_ok=True)
        message: protocol.LaunchMessage = {
            "launch_id": spec.launch_id,
            "attempt_epoch": spec.ref.attempt_epoch,
            "workload": self._mint(spec.workload, spec.ref.ti_id),
            "server": self._server(),
            "record_path": spec.record_path,
            "fault": spec.fault,
            "dag_file": _dag_file(spec.workload),
        }
        return self._send(spec.launch_id, message, _Launch(spec.ref, spec.workload, time.monotonic()))

    def launch_callback(self, launch_id: str, workload: Any) -> DispatchResult:
        """Send a callback workload (no record, no token re-mint)."""
        if (refused := self.admit()) is not None:
            return refused
        message: protocol.LaunchMessage = {
            "launch_id": launch_id, "attempt_epoch": 0, "workload": workload.model_dump_json(),
            "server": self._server(), "record_path": None, "fault": None,
        }
        return self._send(launch_id, message, _Launch(None, workload, time.monotonic()))

    def _send(self, launch_id: str, message: protocol.LaunchMessage, launch: _Launch) -> DispatchResult:
        if not self.zygote.launch(message):
            return DispatchResult(Disposition.DEFERRED, "the zygote connection broke")
        self._launches[launch_id] = launch
        return DispatchResult(Disposition.DISPATCHED)

    # --- facts ----------------------------------------------------------------------------------------
    def poll(self) -> list[RuntimeEvent]:
        """The zygote's events, typed; then the upkeep: restart a dead zygote (its launches in flight come
        back as retryable ``LaunchFailed``; a callback it ran comes back as ``CallbackDone(ok=None)`` once
        its agent is gone; a zygote this runtime never started is not started here), SIGKILL what is left of
        a graceful kill no zygote of ours escalates once its grace is over, keep the busy limit, re-token held
        launches."""
        events = self._typed(self.zygote.events())  # also what a zygote that just died still had sent
        if not self._stopped and self.zygote.pid is not None and not self.zygote.alive() and not self.zygote.starting:
            events.extend(self._restart())
        self._escalate_kills(time.monotonic())
        if self._up():
            self._update_limit()
            self._retoken_held()
        events.extend(self._orphaned_callbacks())
        return events

    def _typed(self, raw: list[dict[str, Any]]) -> list[RuntimeEvent]:
        out: list[RuntimeEvent] = []
        for ev in raw:
            kind, launch_id = protocol.ev_of(ev), ev.get("launch_id")
            if kind is protocol.Ev.WARM_POOL:
                _warm_pool(ev)
                continue
            if not isinstance(launch_id, str):
                continue
            launch = self._launches.get(launch_id)
            if kind is protocol.Ev.LAUNCHED:
                facts: RuntimeFacts = {}
                if isinstance(ev.get("pid"), int) and isinstance(ev.get("start_time"), int):
                    facts = {"pid": ev["pid"], "proc_start_time": ev["start_time"]}
                    if launch is not None:
                        launch.agent = proc.ProcessIdentity(ev["pid"], ev["start_time"])
                out.append(Started(launch_id, facts))
                if isinstance(ev.get("warm"), bool):
                    metrics.incr("leoflow.warm.lite.hit" if ev["warm"] else "leoflow.warm.lite.miss")
            elif kind is protocol.Ev.LAUNCH_FAILED:
                self._launches.pop(launch_id, None)
                out.append(LaunchFailed(launch_id, str(ev.get("error")), ev.get("retryable") is True))
            elif kind is protocol.Ev.REPORTED:
                out.append(Reported(launch_id, str(ev.get("state"))))
            elif kind is protocol.Ev.EXITED:
                code = ev.get("exit_code") if isinstance(ev.get("exit_code"), int) else None
                if launch is not None and launch.ref is None:
                    del self._launches[launch_id]
                    out.append(CallbackDone(launch_id, code == 0))
                else:
                    if launch is not None:
                        launch.exited = True
                    out.append(Exited(launch_id, code))
        return out

    def _restart(self) -> list[RuntimeEvent]:
        """The zygote died or its connection broke: report its launches in flight back, restart it."""
        lost = [lid for lid in self.zygote.pending if lid in self._launches]
        log.error("the leoflow zygote died or its connection broke (exit code %s); restarting it. %d launches it "
                  "had not started are re-offered", self.zygote.exit_code, len(lost))
        events: list[RuntimeEvent] = []
        table = proc.ProcessTable()  # one scan for every lost launch
        for launch_id in lost:
            del self._launches[launch_id]
            # the zygote may have forked the agent without telling us: never let it run beside its re-offer
            for ident in _processes_of(launch_id, table):
                log.warning("killing pid %d of launch %s that the dead zygote never reported", ident.pid, launch_id)
                proc.kill_tree(ident)
            events.append(LaunchFailed(launch_id, "the zygote died before forking", retryable=True))
        for launch in self._launches.values():
            if not launch.exited:
                launch.orphaned = True  # the dead zygote's agents run on, but no event will come for them
        self._limit_sent = False  # a new zygote starts without one
        try:
            self.zygote.restart()
        except OSError as exc:
            log.error("could not restart the leoflow zygote (will retry at the next sync): %s", exc)
            return events
        log.warning("the leoflow zygote was restarted (restart #%d)", self.zygote.restarts)
        return events

    def _orphaned_callbacks(self) -> list[RuntimeEvent]:
        """Callbacks whose zygote died: once their agent is gone, their outcome is unknown."""
        out: list[RuntimeEvent] = []
        for launch_id, launch in list(self._launches.items()):
            if launch.ref is not None or not launch.orphaned:
                continue
            if launch.agent is not None and proc.is_alive(launch.agent):
                continue
            log.warning("callback launch %s ran under a zygote that died; its outcome is unknown", launch_id)
            del self._launches[launch_id]
            out.append(CallbackDone(launch_id, None))
        return out

    def _update_limit(self) -> None:
        """Keep the zygote's busy-agent limit at ``parallelism`` less the agents of a predecessor zygote (or
        of our own dead one) still running: the current zygote does not count them."""
        foreign = sum(1 for ident in self._adopted.values() if ident is None or proc.is_alive(ident))
        foreign += sum(1 for launch in self._launches.values()
                       if launch.orphaned and launch.ref is not None and not launch.exited
                       and launch.agent is not None and proc.is_alive(launch.agent))
        limit = max(0, self.parallelism - foreign) if self.parallelism else None
        if (limit != self._limit or not self._limit_sent) and self.zygote.set_limit(limit):
            self._limit, self._limit_sent = limit, True

    def _retoken_held(self) -> None:
        """Re-mint the token of every task launch the zygote still holds once it is ``min(60, token lifetime
        / 4)`` seconds old, so no workload token waits long enough to expire (DESIGN §3)."""
        now = time.monotonic()
        held = [(lid, launch.handed_at) for lid, launch in self._launches.items()
                if launch.ref is not None and launch.agent is None and not launch.exited and not launch.orphaned]
        for launch_id in retoken_due(held, now, self._retoken_after):
            launch = self._launches[launch_id]
            assert launch.ref is not None
            if self.zygote.retoken(launch_id, self._mint(launch.workload, launch.ref.ti_id)):
                launch.handed_at = now

    # --- presence, evidence, kill ----------------------------------------------------------------------
    def observe(self, attempts: Sequence[Attempt],
                heartbeats: Mapping[AttemptRef, float | None] | None = None) -> Mapping[AttemptRef, Presence]:
        """LIVE, GONE or UNKNOWN for each attempt (see the module docstring); always UNKNOWN for an attempt
        stamped with another host (``leoflow_airflow.hosts``). ``heartbeats`` is ignored: on this machine the
        process table proves a death by pid, heartbeat or not (k8s review §14 concerns pod objects only).

        One pass: every lookup shares one :class:`~leoflow_agent.proc.ProcessTable` (at most one ``/proc``
        scan). The leftovers of agents no zygote of ours saw die are killed after the lookups, and a new table
        (one more scan) then proves them gone: LIVE while anything of such an attempt is left."""
        table = proc.ProcessTable()
        out: dict[AttemptRef, Presence] = {}
        reaping: list[tuple[AttemptRef, proc.ProcessIdentity, str, list[proc.ProcessIdentity]]] = []
        for attempt in attempts:
            out[attempt.ref] = self._presence(attempt, table, reaping)
        if reaping:
            for ref, _, _, left in reaping:
                log.warning("attempt %s: its agent is dead but %d of its processes are not (%s); killing them",
                            ref, len(left), [i.pid for i in left])
                for ident in left:
                    proc.kill_tree(ident)
            after = proc.ProcessTable()  # the first table is stale now: what it listed was killed
            for ref, agent, lid, _ in reaping:
                out[ref] = Presence.LIVE if proc.leftover_processes(agent, lid, table=after) else Presence.GONE
        return out

    def _presence(self, attempt: Attempt, table: proc.ProcessTable,
                  reaping: list[tuple[AttemptRef, proc.ProcessIdentity, str, list[proc.ProcessIdentity]]]) -> Presence:
        """One attempt's presence, from ``table`` where a lookup is needed. An agent no zygote of ours saw die
        with processes left is appended to ``reaping`` (its answer is decided after they are killed)."""
        if hosts.is_foreign(attempt.host, self.host):
            return Presence.UNKNOWN  # another host's pids mean nothing here (issue 8 hole 14)
        lid = launch_id(attempt.ref)
        launch = self._launches.get(lid)
        if attempt.pid is None or attempt.proc_start_time is None:
            if attempt.state == AttemptState.CLAIMED:
                if launch is not None and not launch.orphaned:
                    return Presence.UNKNOWN  # ours, on its way to the zygote: ``launched`` or ``launch_failed`` follows
                if self._locate(lid, table) is not None:
                    return Presence.LIVE
            return self._no_agent_left(attempt, lid)
        agent = proc.ProcessIdentity(attempt.pid, int(attempt.proc_start_time))
        if proc.is_alive(agent):
            return Presence.LIVE
        if launch is not None and not launch.orphaned:
            if launch.exited:
                return Presence.GONE  # the zygote killed what was left of the subtree before ``exited``
            if self.zygote.alive():
                return Presence.UNKNOWN  # ours: wait for the zygote's word
        # no zygote of ours saw this agent die: its orphans reparented to init; finish the zygote's reaping
        left = proc.leftover_processes(agent, lid, table=table)
        kill = self._kills.get(attempt.ref)
        if left and kill is not None and time.monotonic() < kill.due:
            return Presence.LIVE  # killed gracefully and its task still finishes its on_kill: SIGKILL at ``due``
        if left:
            reaping.append((attempt.ref, agent, lid, left))
            return Presence.LIVE  # decided by observe() once they are killed
        return Presence.GONE

    def _no_agent_left(self, attempt: Attempt, lid: str) -> Presence:
        """An attempt with no recorded agent and none found by its markers: its task child may still run (the
        agent and the zygote died, e.g. with a SIGKILLed scheduler, before its ``launched`` event was read).
        Kill what its attempt cgroup still holds (:func:`leoflow_agent.proc.attempt_cgroups`) before answering
        GONE, as the zygote would have; LIVE while anything of it is left. Without an attempt cgroup (a host
        that allows none) nothing more can be found: GONE."""
        groups = proc.attempt_cgroups(lid)
        left = sorted({pid for path in groups for pid in proc.cgroup_members(path)})
        if not left:
            return Presence.GONE
        log.warning("attempt %s: no agent is left but %d of its processes are (%s); killing them", attempt.ref,
                    len(left), left)
        return Presence.GONE if all([proc.kill_cgroup(path) for path in groups]) else Presence.LIVE

    @staticmethod
    def _locate(lid: str, table: proc.ProcessTable) -> proc.ProcessIdentity | None:
        """The agent of launch ``lid`` in ``table``: the oldest process carrying its title marker, else (an agent
        not titled yet, or only its exec'd descendants left) the oldest carrying its ``LEOFLOW_ATTEMPT``
        environment marker; ``None`` when neither is found."""
        found = table.by_title(protocol.agent_title_marker(lid)) or table.by_marker(lid)
        return found[0] if found else None

    def start_progress(self, attempts: Sequence[Attempt]) -> Mapping[AttemptRef, StartProgress]:
        """Nothing: a forked agent starts in milliseconds, so the dispatch-lost reaper counts from the
        dispatch (``[leoflow] dispatch_lost_threshold``), as it always has for Lite."""
        return {}

    def locate(self, attempt: Attempt) -> RuntimeFacts | None:
        """Find the agent of an attempt with no recorded pid by its title marker, else its environment marker
        (one ``/proc`` scan); None when nothing of it runs, or for another host's attempt (it cannot be looked
        up here)."""
        if hosts.is_foreign(attempt.host, self.host):
            return None
        ident = self._locate(launch_id(attempt.ref), proc.ProcessTable())
        return None if ident is None else {"pid": ident.pid, "proc_start_time": ident.start_time}

    def evidence(self, attempt: Attempt) -> Evidence:
        """The attempt's record file, decoded against its identity (never raises)."""
        record = None
        if attempt.record_path:
            record = outcome.read_record_file(attempt.record_path, expect=attempt.ref)
        return Evidence(record, attempt.exit_status)

    def kill(self, attempt: Attempt, *, grace: float) -> Presence:
        """Kill the attempt's agent and whole subtree; never blocks on ``grace`` (see the module docstring).

        ``grace`` 0: SIGKILL the subtree and the attempt cgroup now; GONE when nothing is left, else LIVE.
        ``grace`` > 0: write the attempt's kill marker, then SIGTERM + SIGCONT the agent (through our zygote's
        ``kill`` op when it owns the agent, else from here) and answer LIVE; the subtree is SIGKILLed once the
        grace is over (by the zygote, or by :meth:`poll`). A repeated graceful kill keeps the first deadline.
        Without a pid: ask the zygote to drop (held) or kill (being forked) the launch, or kill every process found
        by its title or environment marker (one ``/proc`` scan; the first, titled ones first, gets the grace).
        Another host's attempt is never killed from here (UNKNOWN): its pid may name an unrelated local process.
        """
        if hosts.is_foreign(attempt.host, self.host):
            return Presence.UNKNOWN
        lid = launch_id(attempt.ref)
        launch = self._launches.get(lid)
        if attempt.pid is None or attempt.proc_start_time is None:
            if launch is not None and not launch.orphaned and self.zygote.alive():
                # dropped if held; if it is being forked, its ``launched`` names an attempt no longer CLAIMED
                # and the lifecycle kills it then: nothing of it can run on, and none of it ran
                self.zygote.kill_launch(lid, grace=0)
                return Presence.GONE
            found = _processes_of(lid, proc.ProcessTable())
            if not found:
                return Presence.GONE
            agent, others = found[0], found[1:]
        else:
            agent, others = proc.ProcessIdentity(attempt.pid, int(attempt.proc_start_time)), []
        if grace <= 0:
            self._kills.pop(attempt.ref, None)
            self._adopted.pop(attempt.ref, None)
            gone = [_kill_now(agent, lid)] + [proc.kill_tree(ident) for ident in others]
            return Presence.GONE if all(gone) else Presence.LIVE
        if attempt.ref in self._kills:
            return Presence.LIVE  # in its grace already: the first deadline stands
        if not proc.is_alive(agent):
            # nothing to give a grace to: what is left goes as proof of death does (observe kills leftovers)
            return self.observe([attempt]).get(attempt.ref, Presence.UNKNOWN)
        if attempt.record_path:
            _mark_killed(attempt.record_path)
        by_zygote = (launch is not None and not launch.orphaned and not launch.exited and self.zygote.alive()
                     and self.zygote.kill_launch(lid, grace=grace))
        if not by_zygote:
            for sig in (signal.SIGTERM, signal.SIGCONT):  # SIGCONT: a stopped agent acts on its SIGTERM too
                _signal(agent, sig)
        self._kills[attempt.ref] = _Kill(agent, lid, time.monotonic() + grace, by_zygote)
        log.info("attempt %s: SIGTERM to agent pid %d%s; SIGKILL of what is left in %.0f s", attempt.ref, agent.pid,
                 " through the zygote" if by_zygote else "", grace)
        return Presence.LIVE

    def _escalate_kills(self, now: float) -> None:
        """SIGKILL the subtree and attempt cgroup of every graceful kill whose grace is over and that no live
        zygote of ours escalates (an adopted agent, or one whose zygote died); forget those whose zygote
        reported the exit."""
        for ref, kill in list(self._kills.items()):
            launch = self._launches.get(kill.launch_id)
            watched = kill.by_zygote and launch is not None and not launch.orphaned and self.zygote.alive()
            if watched and launch is not None and launch.exited:
                del self._kills[ref]
            elif now >= kill.due and not watched:
                del self._kills[ref]
                if proc.is_alive(kill.agent):
                    log.warning("attempt %s: agent pid %d outlived its kill grace; SIGKILL of its subtree", ref,
                                kill.agent.pid)
                _kill_now(kill.agent, kill.launch_id)  # what left the tree is found by observe's proof of death

    def kill_launch(self, launch_id: str) -> None:
        """Kill a launch's agent through the zygote at once (no grace: it must not run at all), and any process
        carrying its title or environment marker."""
        self.zygote.kill_launch(launch_id, grace=0)
        for ident in _processes_of(launch_id, proc.ProcessTable()):
            proc.kill_tree(ident)

    def adopt(self, attempt: Attempt) -> None:
        """Watch a predecessor's agent; it lowers the zygote's busy limit while it runs."""
        ident = None
        if attempt.pid is not None and attempt.proc_start_time is not None:
            ident = proc.ProcessIdentity(attempt.pid, int(attempt.proc_start_time))
        self._adopted[attempt.ref] = ident

    def forget(self, ref: AttemptRef) -> None:
        """The lifecycle closed ``ref``: drop what is remembered of it."""
        self._adopted.pop(ref, None)
        self._kills.pop(ref, None)
        self._launches.pop(launch_id(ref), None)

    # --- housekeeping ------------------------------------------------------------------------------------
    def collect(self, is_closed: Callable[[str, int], bool],
                workload_of: Callable[[str, int], str | None] | None = None) -> int:
        """Remove closed attempts' record directories past ``[leoflow] record_retention`` (every 60 s).
        ``workload_of`` is not needed: an attempt's log file is on this host already."""
        from leoflow_airflow.runtime.lite import gc

        now = time.monotonic()
        if now < self._next_gc:
            return 0
        self._next_gc = now + GC_INTERVAL
        return gc.collect(self.paths.root, retention=self.settings.record_retention, is_closed=is_closed)

    def extra_capacity(self, parallelism: int, running_ages: Sequence[float]) -> int:
        """The adaptive queue-ahead depth (:class:`~leoflow_airflow.dispatch.ahead.QueueAhead`)."""
        return self._ahead.depth(parallelism, running_ages)

    def slot_freed(self, held_for: float) -> None:
        """Feed a finished attempt's slot time to the queue-ahead average."""
        self._ahead.finished(held_for)


WARM_POOL_KEY = "lite:file_workers"
"""The ``pool_key`` of Lite's warm pool in ``leoflow_warm_pool_resized`` (one pool: the zygote's file workers)."""


def _warm_pool(ev: dict[str, Any]) -> None:
    """A ``warm_pool`` event: the gauge, and the plugins' ``leoflow_warm_pool_resized`` (never raises)."""
    before, ready = ev.get("before"), ev.get("ready")
    if not isinstance(before, int) or not isinstance(ready, int):
        log.error("bad warm_pool event from the zygote: %r", ev)
        return
    metrics.gauge("leoflow.warm.lite.file_workers", ready)
    hooks.warm_pool_resized(WARM_POOL_KEY, before=before, after=ready)


def _processes_of(lid: str, table: proc.ProcessTable) -> list[proc.ProcessIdentity]:
    """Every process in ``table`` carrying launch ``lid``'s title marker or its ``LEOFLOW_ATTEMPT`` environment
    marker (titled ones first), each once."""
    found = table.by_title(protocol.agent_title_marker(lid))
    return found + [ident for ident in table.by_marker(lid) if ident not in found]


def _signal(agent: proc.ProcessIdentity, sig: int) -> None:
    """Send ``sig`` to ``agent`` if it is still that process (pid + start time); a vanished one is fine."""
    if proc.is_alive(agent):
        try:
            os.kill(agent.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _kill_now(agent: proc.ProcessIdentity, lid: str) -> bool:
    """SIGKILL ``agent``'s subtree and the members of launch ``lid``'s attempt cgroup; True when none is left."""
    gone = proc.kill_tree(agent)
    return all([proc.kill_cgroup(path) for path in proc.attempt_cgroups(lid)]) and gone


def _dag_file(workload: Any) -> protocol.DagFile | None:
    """The DAG file of a task workload, as the zygote keys its file workers (:mod:`leoflow_agent.warm`): the
    ``bundle_info`` name and version and the ``dag_rel_path``; None when the workload names none."""
    bundle = getattr(workload, "bundle_info", None)
    path = getattr(workload, "dag_rel_path", None)
    if bundle is None or not getattr(bundle, "name", None) or not path:
        return None
    version = getattr(bundle, "version", None)
    return {"bundle": str(bundle.name), "version": None if version is None else str(version), "path": str(path)}


def _mark_killed(record_path: str) -> None:
    """Write the attempt's kill marker (:func:`leoflow_agent.protocol.kill_marker_path`) before it is signalled;
    a marker that cannot be written only costs the refusal of a failed report (logged)."""
    path = protocol.kill_marker_path(record_path)
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        with open(path, "w") as fh:
            fh.write("killed\n")
    except OSError as exc:
        log.warning("could not write the kill marker %s (%s): a failed report the kill causes will land", path, exc)
