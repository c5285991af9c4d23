"""The dispatcher: the main loop that turns queued containers into running ones on cloud nodes.

Start-up (`start`): containers, WorkerNodes and policies are already here (the feed
hands every object over before `start` is called: `observe_container`, `observe_node`);
list the cloud and adopt every instance tagged with our dispatcher id (creating missing
WorkerNodes); probe every node once. Until that first probe round is done nothing is
started, requeued or shut down, so a restarted dispatcher adopts running containers
instead of running them twice.

Each round (`step`, every `tick_interval` or sooner when an event arrives):

1. sync with the cloud list when due (`sync_interval`);
2. reconcile runners with containers, node by node, from the latest probe: adopt a runner
   whose container is Locked/Queued, kill a runner nobody wants (its container deleted,
   finished or placed elsewhere: TERM every `term_interval`, KILL after `term_timeout`;
   no finalizer holds a deleted container back), finish a Running container
   whose runner is gone (Complete with its exit code, or requeue / Failed after the
   attempts cap when the runner died without finishing);
3. cancel what was cancelled (TERM repeated every `term_interval`, KILL after
   `term_timeout`), and drop the finalizer of earlier releases from terminal containers;
4. plan with the pure scheduler (`nodewarden.scheduling.scheduler.plan`) from the
   capacity ledger (`nodewarden.scheduling.ledger`): a container holds its node from the
   moment it is chosen for it (`claims`, before the Locked write) until its runner is seen
   gone there, in every phase; a lock from before a restart is placed again only after
   the node's runner list was read and the node said its runner never ran;
5. execute: fail unsatisfiable containers, unlock stale locks and overflow, lock (with
   the resources snapshot, preconditioned on the version the plan read) + start runners
   (a start that fails or times out asks the node before it requeues), create
   instances, and write scheduling statuses that changed (at most once per
   `scheduling_status_interval` per container unless the phase or the spec changed);
6. decide each node's fate with the node-manager matrix (drain, shut down), honouring
   idle behaviour run/hold/drain, min warm nodes, lame and broken nodes;
7. write WorkerNode statuses that changed and update the metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from nodewarden.api.containerdispatch import TERMINAL_PHASES, ContainerResources
from nodewarden.api.workernode import WorkerNodeSpec
from nodewarden.clock import utc_now
from nodewarden.cloud.errors import CloudErrorKind
from nodewarden.config import DispatchSettings
from nodewarden.dispatch.ports import CloudPort, ContainerQueuePort, ProberPort, WorkerPoolPort
from nodewarden.dispatch.queue import LEGACY_FINALIZER, Container
from nodewarden.drain import drain
from nodewarden.fleet.board import NodePowerView, PowerBoard
from nodewarden.fleet.policies import PolicyBook
from nodewarden.kube.client import KubeError
from nodewarden.metrics import (
    CONTAINERS,
    CONTAINERS_FINISHED,
    CONTAINERS_STARTED,
    CREATES_STOPPED,
    HOURLY_SPEND,
    OVERCOMMITTED_NODES,
)
from nodewarden.policy.state import PowerState, api_state
from nodewarden.pool.workers import Worker, _iso
from nodewarden.scheduling.caps import PolicyLimits, effective_limits
from nodewarden.scheduling.instancetypes import Catalogue
from nodewarden.scheduling.ledger import Claim, Placement, account, with_starts
from nodewarden.scheduling.scheduler import lock_retry_at, plan
from nodewarden.scheduling.views import (
    Capacity,
    CloudState,
    ContainerView,
    NodeState,
    NodeView,
    Phase,
    Plan,
)
from nodewarden.ssh.credentials import SshTarget
from nodewarden.ssh.errors import SshError
from nodewarden.ssh.facts import RunnerOutcome, RunnerStarted
from nodewarden.units import parse_quantity

log = logging.getLogger(__name__)


MAX_PAUSE = 2.0
"""Longest pause a slow round adds before the next one (see `Dispatcher.run`)."""


_SIDE_STATE: dict[PowerState, NodeState] = {
    PowerState.OFF: NodeState.OFF,
    PowerState.WAKING: NodeState.WAKING,
    PowerState.ON_IDLE: NodeState.IDLE,
    PowerState.ACTIVE: NodeState.ACTIVE,
    PowerState.DRAINING: NodeState.DRAINING,
    PowerState.SHUTTING_DOWN: NodeState.SHUTTING_DOWN,
    PowerState.UNKNOWN: NodeState.UNKNOWN,
    PowerState.BLOCKED: NodeState.UNKNOWN,
}


def _ignore_plan(containers: list[ContainerView], plan: Plan, now: datetime) -> None:
    return None


def _runs_for(c: Container, uid: str | None) -> bool:
    """Whether a runner started for the object `uid` is `c`'s: runners are keyed by the
    object's metadata.uid as well as its uuid (None, an older runner: by the uuid alone)."""
    return uid is None or c.uid is None or uid == c.uid


@dataclass
class Dispatcher:
    namespace: str
    dispatcher_id: str
    settings: DispatchSettings
    queue: ContainerQueuePort
    policies: PolicyBook
    pool: WorkerPoolPort | None
    cloud: CloudPort | None
    prober: ProberPort | None
    board: PowerBoard = field(default_factory=PowerBoard)
    """What the power controller says about each node (admission, state, readiness)."""
    planned: Callable[[list[ContainerView], Plan, datetime], None] = _ignore_plan
    """Called after every round with the capacity ledger once the plan's starts are chosen
    (`ledger.with_starts`) and the plan (the power controller takes each node's work and
    the demand for side nodes from them)."""
    clock: Callable[[], datetime] = utc_now
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    plan_inputs: list[ContainerView] = field(default_factory=list)
    recovered: bool = False
    inflight: set[str] = field(default_factory=set)
    wait_writes: set[str] = field(default_factory=set)
    held_back: dict[str, str] = field(default_factory=dict)
    locks_checked: set[str] = field(default_factory=set)
    """Locked containers whose node was asked how their runner is (`_check_lock`): only
    these may be started again under the same lock."""
    running_seen: dict[tuple[str, str, int], datetime] = field(default_factory=dict)
    """(uuid, node, attempts) of each Running container -> when this replica first saw it
    Running (its own clock): a runner list sent later was sent after the runner started
    (the Running write follows the start), so a runner it lacks is gone. Never the
    container's `startedAt`, which another replica's clock may have stamped."""
    claims: dict[str, Claim] = field(default_factory=dict)
    """Containers chosen for a node whose Locked write or runner start is under way: each
    holds its node in the ledger from the moment it is chosen (see `_start`)."""
    held_resources: dict[str, ContainerResources] = field(default_factory=dict)
    """What every container holding capacity held in the last round (a runner whose
    container was deleted meanwhile is counted with it)."""
    overcommitted: dict[str, str] = field(default_factory=dict)
    """Nodes found running more than they hold (announced once, never fixed by killing)."""
    unwanted_terms: dict[tuple[str, str], tuple[datetime, datetime]] = field(default_factory=dict)
    """(node, container uuid) of a runner nobody wants -> (first, last) signal sent."""
    last_plan: Plan | None = None
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _tasks: set[asyncio.Task[Any]] = field(default_factory=set)
    _closed: bool = False
    _starts: asyncio.Semaphore | None = None
    _next_sync: datetime | None = None

    # --- events from the feed -------------------------------------------------------------

    def observe_container(self, body: Mapping[str, Any], deleted: bool = False) -> None:
        self.queue.observe(body, deleted)
        self.wake.set()

    def observe_node(
        self, body: Mapping[str, Any], deleted: bool = False, spec: WorkerNodeSpec | None = None
    ) -> None:
        if self.pool is not None:
            self.pool.observe_node(body, deleted, spec)
        self.wake.set()

    def observe_policy(self, body: Mapping[str, Any], deleted: bool = False) -> None:
        self.policies.observe(body, deleted)
        self.wake.set()

    def poke(self) -> None:
        self.wake.set()

    # --- life cycle -----------------------------------------------------------------------

    async def start(self) -> None:
        """Rebuild state from the feed (containers, WorkerNodes and policies are already
        here) and the cloud, then probe every node once."""
        self._starts = asyncio.Semaphore(self.settings.max_concurrent_starts)
        if self.pool is not None:
            await self.pool.sync_cloud()
            await self._first_probe_round()
        self.recovered = True
        log.info(
            "dispatcher recovered",
            extra={
                "containers": len(self.queue.by_name),
                "nodes": len(self.pool.workers) if self.pool else 0,
            },
        )

    async def _first_probe_round(self, limit: float = 60.0) -> None:
        assert self.pool is not None
        workers = [w for w in self.pool.workers.values() if w.instance is not None]
        if not workers:
            return
        jobs = [asyncio.ensure_future(self.pool.probe_once(w)) for w in workers]
        _, pending = await asyncio.wait(jobs, timeout=limit)
        for job in pending:
            job.cancel()
        self.pool.ensure_probes()

    async def run(self) -> None:
        """Run rounds until `stop()`. A round costs time in proportion to the fleet and
        the queue; after a round that took T seconds the next waits at least T (at most
        `MAX_PAUSE`), so the rounds do not hold the event loop the feed, the power
        controller and the lease share."""
        loop = asyncio.get_running_loop()
        while not self._stop.is_set():
            self.wake.clear()
            started = loop.time()
            try:
                await self.step()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("dispatcher round failed; retrying next tick")
            took = min(loop.time() - started, MAX_PAUSE)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self.wake.wait(), timeout=max(self.settings.tick_interval, took)
                )
            # coalesce bursts of watch events into one round
            await asyncio.sleep(max(min(0.2, self.settings.tick_interval), took))

    def halt(self) -> None:
        """Start no more rounds (the one under way ends normally; see `stop`)."""
        self._stop.set()
        self.wake.set()

    async def stop(self, grace: float = 0.0) -> None:
        """Halt, let the writes and runner starts under way finish for up to `grace`
        seconds (`nodewarden.drain`), cancel the rest, close the adapters."""
        self.halt()
        if self._closed:
            return
        self._closed = True
        drained = await drain(self._tasks, grace)
        if drained.finished or drained.cancelled:
            log.info(
                "dispatcher stopped: %d tasks under way finished, %d cancelled",
                drained.finished,
                drained.cancelled,
            )
        if self.pool is not None:
            await self.pool.close()
        if self.prober is not None:
            await self.prober.aclose()
        if self.cloud is not None:
            await self.cloud.close()

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # --- one round ------------------------------------------------------------------------

    async def step(self) -> None:
        now = self.clock()
        self._acknowledge_closed(now)
        if self.pool is not None and (
            self._next_sync is None or now >= self._next_sync or self.pool.sync_wanted
        ):
            self.pool.sync_wanted = False
            self._next_sync = now + timedelta(seconds=self.settings.sync_interval)
            await self.pool.sync_cloud()
        if self.pool is not None:
            if self.recovered and self.pool.declared:
                await self.pool.adopt_declared()
            self.pool.ensure_probes()
            self._reconcile_runners()
        await self._cancellations(now)
        if self.queue.marks_due:  # objects whose uuid another holds (queue docstring)
            self._spawn(self.queue.mark_duplicates())
        result = self._plan(now)
        self.last_plan = result
        await self._execute(result, now)
        if self.pool is not None:
            self.pool.contribute_statuses(self._containers_by_node())
        self._overcommit(result)
        self._metrics()
        chosen = {uuid: claim.node for uuid, claim in self.claims.items()}
        self.planned(with_starts(self.plan_inputs, chosen), result, now)

    def _acknowledge_closed(self, now: datetime) -> None:
        """Admission the power controller closed is confirmed once no container is chosen
        for the node with its lock or start under way: from this round on the plan places
        nothing there."""
        closing = self.board.closing
        if not closing:
            return
        claimed = {claim.node for claim in self.claims.values()}
        for node in list(closing):
            if node not in claimed:
                self.board.acknowledge(node, now)

    # --- helpers --------------------------------------------------------------------------

    def _max_attempts(self) -> int:
        return self.policies.default.spec.dispatch.max_attempts

    def _containers_by_node(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for c in self.queue:
            if c.phase in ("Locked", "Running") and c.status.node:
                out.setdefault(c.status.node, []).append(c.uuid)
        return out

    def _base(self, c: Container) -> dict[str, Any]:
        """Fields every first write carries: acknowledgement and the Valid condition."""
        out: dict[str, Any] = {}
        if c.status.observed_generation != c.generation:
            out["observedGeneration"] = c.generation
            if c.problem:
                out["conditions"] = self.queue.conditions(c, False, "InvalidSpec", c.problem)
            else:
                out["conditions"] = self.queue.conditions(c, True, "Valid", "spec is valid")
        if c.status.first_seen is None:
            out["firstSeen"] = _iso(self.clock())
        return out

    async def _write(
        self, c: Container, status: dict[str, Any], *, precondition: bool = False, **kw: Any
    ) -> bool:
        """Merge-patch `c`'s status. With `precondition` the write is sent against `c` as
        given -- the version the caller decided from: any change since (a spec edit, another
        dispatcher's lock) fails it. Otherwise against the newest version known."""
        latest = c if precondition else (self.queue.get(c.name) or c)
        try:
            ok = await self.queue.write(
                latest, {**self._base(latest), **status}, precondition=precondition, **kw
            )
        except KubeError as exc:
            log.warning("status write for %s failed: %s", c.name, exc)
            return False
        written = self.queue.get(c.name)
        if ok and written is not None:
            written.status_written_at = self.clock()
        return ok

    async def _finish(
        self, c: Container, phase: str, reason: str, message: str, exit_code: int | None = None
    ) -> None:
        status: dict[str, Any] = {
            "phase": phase,
            "reason": reason,
            "schedulingStatus": message,
            "finishedAt": _iso(self.clock()),
        }
        if exit_code is not None:
            status["exitCode"] = exit_code
        if await self._write(c, status):
            CONTAINERS_FINISHED.labels(phase).inc()
            log.info("container %s %s: %s", c.uuid, phase, message)
            if c.status.node and self.pool is not None:
                worker = self.pool.workers.get(c.status.node)
                if worker is not None:
                    worker.last_container = c.uuid
        latest = self.queue.get(c.name)
        if latest is not None and LEGACY_FINALIZER in latest.finalizers:
            with contextlib.suppress(KubeError):
                await self.queue.drop_legacy_finalizer(latest)

    async def _requeue_or_fail(
        self, c: Container, why: str, attempts: int, reason: str, flap: bool = False
    ) -> None:
        cap = self._max_attempts()
        if attempts >= cap:
            await self._finish(
                c, "Failed", "MaxAttemptsExceeded", f"{why}; gave up after {attempts} attempts"
            )
            return
        status: dict[str, Any] = {
            "phase": "Queued",
            "reason": reason,
            "schedulingStatus": f"requeued: {why} (attempt {attempts} of {cap})",
            "attempts": attempts,
            "node": None,
            "lockedBy": None,
            "runnerPid": None,
            "resources": None,  # it holds nothing until it is locked again
        }
        if flap:
            status["lockFlaps"] = c.status.lock_flaps + 1
        if await self._write(c, status):
            log.info("container %s requeued: %s", c.uuid, why)

    # --- 2. runners vs containers ---------------------------------------------------------

    def _reconcile_runners(self) -> None:
        assert self.pool is not None
        if not self.recovered:
            return
        by_uuid = self.queue.by_uuid()
        running_on: dict[str, list[Container]] = {}
        locked_on: dict[str, list[Container]] = {}
        self.locks_checked.intersection_update(
            c.uuid for c in by_uuid.values() if c.phase == "Locked"
        )
        seen, self.running_seen = self.running_seen, {}
        seen_at = self.clock()  # by_uuid is what the queue holds now
        for c in by_uuid.values():
            if c.phase == "Running" and c.status.node:
                running_on.setdefault(c.status.node, []).append(c)
                key = (c.uuid, c.status.node, c.status.attempts)
                self.running_seen[key] = seen.get(key, seen_at)
            elif (
                c.phase == "Locked"
                and c.status.node
                and c.status.locked_by in (None, self.dispatcher_id)
                and c.uuid not in self.locks_checked
            ):
                locked_on.setdefault(c.status.node, []).append(c)
        for worker in list(self.pool.workers.values()):
            if worker.runners is None or worker.runners_at is None:
                continue
            for uuid, pid in list(worker.runners.items()):
                listed = by_uuid.get(uuid)
                if uuid in self.inflight:
                    continue
                owner = self._runner_owner(worker, uuid)
                if owner != self.dispatcher_id:
                    # another install's runner, or one naming no owner (reported by the
                    # pool): never killed; an owner-less runner of a container we locked
                    # on this node (started by an older release of ours) is adopted
                    if (
                        owner is None
                        and listed is not None
                        and listed.phase == "Locked"
                        and listed.status.locked_by == self.dispatcher_id
                        and listed.status.node == worker.name
                        and not listed.cancel_requested
                    ):
                        self._spawn_guarded(uuid, self._adopt_runner(listed, worker, pid))
                    continue
                if listed is not None and not _runs_for(listed, self._runner_uid(worker, uuid)):
                    # started for another object of the same uuid (since deleted): none of
                    # this container's business, and unwanted (one object, one runner)
                    self._spawn_guarded(uuid, self._kill_unwanted(worker, uuid))
                    continue
                if (
                    listed is None
                    or listed.terminal
                    or (listed.status.node and listed.status.node != worker.name)
                ):
                    if not listed or not listed.cancel_requested:
                        self._spawn_guarded(uuid, self._kill_unwanted(worker, uuid))
                    continue
                if listed.cancel_requested:
                    continue  # handled by _cancellations
                if listed.phase in (None, "Queued", "Locked"):
                    self._spawn_guarded(uuid, self._adopt_runner(listed, worker, pid))
            for c in running_on.get(worker.name, ()):
                if c.uuid in worker.runners or c.uuid in self.inflight or c.cancel_requested:
                    continue
                since = self.running_seen[(c.uuid, worker.name, c.status.attempts)]
                if worker.runners_at <= since:
                    continue  # the listing may predate the start
                self._spawn_guarded(c.uuid, self._runner_gone(c, worker))
            for c in locked_on.get(worker.name, ()):
                if c.uuid in worker.runners or c.uuid in self.inflight or c.cancel_requested:
                    continue  # a listed runner is adopted above
                self._spawn_guarded(c.uuid, self._check_lock(c, worker))
        # Running containers whose node no longer exists
        for c in by_uuid.values():
            if c.phase not in ("Running", "Locked") or c.uuid in self.inflight:
                continue
            if c.status.locked_by not in (None, self.dispatcher_id):
                continue
            if c.status.node and c.status.node not in self.pool.workers:
                if c.cancel_requested:
                    continue
                self._spawn_guarded(
                    c.uuid,
                    self._requeue_or_fail(
                        c,
                        f"node {c.status.node} disappeared",
                        c.status.attempts,
                        "NodeLost",
                    ),
                )

    @staticmethod
    def _runner_uid(worker: Worker, uuid: str) -> str | None:
        """The `metadata.uid` a listed runner was started for (None: not recorded)."""
        listed = worker.listed_runners.get(uuid)
        return listed.uid if listed is not None else None

    def _runner_owner(self, worker: Worker, uuid: str) -> str | None:
        """The dispatcher id a listed runner names (None: no owner recorded); a runner
        this dispatcher started since the last listing is its own."""
        listed = worker.listed_runners.get(uuid)
        return listed.dispatcher_id if listed is not None else self.dispatcher_id

    def _spawn_guarded(self, uuid: str, coro: Any) -> None:
        self.inflight.add(uuid)

        async def run() -> None:
            try:
                await coro
            except Exception:
                log.exception("task for container %s failed", uuid)
            finally:
                self.inflight.discard(uuid)
                self.wake.set()

        self._spawn(run())

    async def _unlock(self, c: Container, why: str, reason: str = "Unlocked") -> None:
        """Release a Locked container -- unless its node says its runner already started.

        A leader that started the runner but could not write Running (API connection
        lost, process killed) leaves the container Locked; the next leader must not run
        it a second time: the node's answer finishes (exited) or adopts (running) it.
        Only a node that cannot be asked, or that never saw the container, unlocks it.
        """
        assert self.pool is not None
        worker = self.pool.workers.get(c.status.node) if c.status.node else None
        outcome = await self._runner_outcome(c, worker) if worker is not None else None
        if worker is not None and outcome is not None:
            if outcome.state == "exited":
                code = outcome.exit_code if outcome.exit_code is not None else -1
                await self._finish(
                    c, "Complete", "Exited", f"exited with code {code} on {worker.name}", code
                )
                return
            if (
                outcome.state == "running"
                and outcome.pid is not None
                and outcome.dispatcher_id in (None, self.dispatcher_id)
            ):
                await self._adopt_runner(c, worker, outcome.pid)
                return
        await self._requeue_or_fail(c, why, c.status.attempts, reason, flap=True)

    async def _kill_unwanted(self, worker: Worker, uuid: str) -> None:
        """TERM a runner nobody wants (its ContainerDispatch deleted, finished, or placed
        on another node), again every `term_interval`, KILL after `term_timeout`."""
        assert self.pool is not None and self.prober is not None
        now = self.clock()
        key = (worker.name, uuid)
        first, last = self.unwanted_terms.get(key, (now, None))
        if last is not None and (now - last).total_seconds() < self.settings.term_interval:
            return
        target = await self.pool.target(worker)
        if target is None:
            return
        signal = "KILL" if (now - first).total_seconds() >= self.settings.term_timeout else "TERM"
        log.info("killing runner of unwanted container %s on %s (%s)", uuid, worker.name, signal)
        with contextlib.suppress(SshError):
            await self.prober.kill_runner(target, uuid, signal)
        # a runner still listed is signalled every term_interval: an older entry is gone
        forget = now - timedelta(
            seconds=max(10 * self.settings.term_interval, 2 * self.settings.term_timeout)
        )
        for k, (_, at) in list(self.unwanted_terms.items()):
            if at < forget:
                del self.unwanted_terms[k]
        self.unwanted_terms[key] = (first, self.clock())
        worker.probe_now.set()

    async def _adopt_runner(self, c: Container, worker: Worker, pid: int) -> None:
        held = c.status.resources or (c.spec.resources if c.spec is not None else None)
        ok = await self._write(
            c,
            {
                "phase": "Running",
                "resources": held.to_wire() if held is not None else None,
                "node": worker.name,
                "lockedBy": self.dispatcher_id,
                "runnerPid": pid,
                "instanceType": worker.instance_type.name if worker.instance_type else None,
                "startedAt": c.status.started_at.isoformat()
                if c.status.started_at
                else _iso(self.clock()),
                # Locked: started just before a crash, never written as Running, so this
                # run is not counted yet (a Queued one was counted by its requeue)
                "attempts": c.status.attempts + 1
                if c.phase == "Locked"
                else max(c.status.attempts, 1),
                "schedulingStatus": f"running on {worker.name} (adopted runner pid {pid})",
                "reason": "Adopted",
            },
        )
        if ok:
            log.info("adopted runner %s of container %s on %s", pid, c.uuid, worker.name)

    async def _check_lock(self, c: Container, worker: Worker) -> None:
        """A Locked container whose runner the node does not list (a lock taken before a
        restart, or a start cut short): ask the node how its runner is before the lock is
        used again -- a runner that already ended must not run a second time. Until this
        has an answer the container is in flight, so the plan does not start it."""
        outcome = await self._runner_outcome(c, worker)
        if outcome is None:
            return
        self.locks_checked.add(c.uuid)
        if outcome.state in ("running", "unknown"):
            return  # running: the next listing adopts it; unknown: never ran, start it
        # it ran, and was never written as Running
        await self._ran_and_ended(c, worker, outcome, c.status.attempts + 1)

    async def _ran_and_ended(
        self, c: Container, worker: Worker, outcome: RunnerOutcome, attempts: int
    ) -> None:
        """`c`'s runner ran on `worker` without being written as Running and ended as
        `outcome` says (exited, killed, lost): Complete, or requeue / Failed."""
        if outcome.state == "exited":
            code = outcome.exit_code if outcome.exit_code is not None else -1
            if await self._write(c, {"attempts": attempts}):
                await self._finish(
                    self.queue.get(c.name) or c,
                    "Complete",
                    "Exited",
                    f"exited with code {code} on {worker.name}",
                    code,
                )
            return
        await self._requeue_or_fail(
            c,
            f"runner on {worker.name} ended without finishing the container ({outcome.state})",
            attempts,
            "RunnerLost",
        )

    async def _runner_outcome(self, c: Container, worker: Worker) -> RunnerOutcome | None:
        """How `c`'s runner on `worker` is or ended, or None when the node cannot say."""
        assert self.pool is not None and self.prober is not None
        target = await self.pool.target(worker)
        if target is None:
            return None
        try:
            outcome = await self.prober.runner_status(target, c.uuid)
        except SshError as exc:
            log.info("runner status of %s on %s unknown: %s", c.uuid, worker.name, exc)
            return None
        if _runs_for(c, outcome.uid):
            return outcome
        # the node's record of this uuid is another object's (one deleted since): it says
        # nothing of this container's runner, which never ran there
        if outcome.state != "running":
            return dataclasses.replace(outcome, state="unknown", exit_code=None)
        if outcome.dispatcher_id == self.dispatcher_id:
            self._spawn_guarded(c.uuid, self._kill_unwanted(worker, c.uuid))
        return None  # asked again once that runner is gone

    async def _runner_gone(self, c: Container, worker: Worker) -> None:
        """A Running container's runner is no longer listed: find out how it ended."""
        outcome = await self._runner_outcome(c, worker)
        if outcome is None or outcome.state == "running":
            return
        if outcome.state == "exited":
            code = outcome.exit_code if outcome.exit_code is not None else -1
            await self._finish(
                c, "Complete", "Exited", f"exited with code {code} on {worker.name}", code
            )
            return
        if outcome.state == "killed" and c.cancel_requested:
            await self._finish(c, "Cancelled", "Cancelled", "cancelled; runner stopped")
            return
        await self._requeue_or_fail(
            c,
            f"runner on {worker.name} ended without finishing the container ({outcome.state})",
            c.status.attempts,
            "RunnerLost",
        )

    # --- 3. cancellations and deletions ---------------------------------------------------

    async def _cancellations(self, now: datetime) -> None:
        for c in self.queue:
            if c.spec is None or c.uuid in self.inflight:
                continue
            if c.terminal:
                if LEGACY_FINALIZER in c.finalizers:  # one write, objects of earlier releases
                    self._spawn_guarded(c.uuid, self.queue.drop_legacy_finalizer(c))
                continue
            if not c.cancel_requested:
                continue
            if c.status.locked_by not in (None, self.dispatcher_id):
                continue
            self._spawn_guarded(c.uuid, self._cancel(c, now))

    async def _cancel(self, c: Container, now: datetime) -> None:
        worker = (
            self.pool.workers.get(c.status.node or "")
            if self.pool is not None and c.phase in ("Locked", "Running")
            else None
        )
        if worker is None or worker.instance is None or self.prober is None:
            # nothing runs anywhere (or its node is gone)
            if c.phase == "Running":
                why = f"cancelled; its node {c.status.node} is gone"
            else:
                why = "cancelled before it ran"
            await self._finish(c, "Cancelled", "Cancelled", why)
            return
        assert self.pool is not None
        listed = worker.runners is not None and c.uuid in worker.runners
        if (
            not listed
            and c.last_term_at is not None
            and worker.runners_at is not None
            and worker.runners_at > c.last_term_at
        ):
            await self._finish(
                c, "Cancelled", "Cancelled", f"cancelled; runner on {worker.name} stopped"
            )
            return
        due = (
            c.last_term_at is None
            or (now - c.last_term_at).total_seconds() >= self.settings.term_interval
        )
        if not due:
            return
        first = c.first_term_at or now
        signal = "KILL" if (now - first).total_seconds() >= self.settings.term_timeout else "TERM"
        target = await self.pool.target(worker)
        if target is None:
            return
        try:
            await self.prober.kill_runner(target, c.uuid, signal)
        except SshError as exc:
            log.info("could not signal runner of %s on %s: %s", c.uuid, worker.name, exc)
        latest = self.queue.get(c.name)
        if latest is not None:
            latest.first_term_at = first
            latest.last_term_at = self.clock()
        worker.probe_now.set()
        if c.status.scheduling_status != "cancelling: stopping the runner":
            await self._write(c, {"schedulingStatus": "cancelling: stopping the runner"})

    # --- 4. plan --------------------------------------------------------------------------

    def _catalogue(self) -> Catalogue:
        if self.cloud is None:
            return Catalogue()
        return Catalogue(types=tuple(self.cloud.catalogue))

    def _plan(self, now: datetime) -> Plan:
        """Plan from the capacity ledger (`scheduling.ledger.account`): what holds each
        node (claims, Locked and Running containers, cancelled ones whose runner still
        runs, every runner a node lists) and the Queued containers that may be placed."""
        max_flaps = self.policies.default.spec.dispatch.max_lock_flaps
        self.held_back = {}
        placed: list[Placement] = []
        queued: list[ContainerView] = []
        known: dict[str, Container] = {}
        for c in self.queue:
            spec = c.spec
            if spec is None:
                continue
            known[c.uuid] = c
            if c.terminal:
                continue
            claim = self.claims.get(c.uuid)
            node = c.status.node if c.phase in ("Locked", "Running") else None
            if claim is None and node is None:
                if c.cancel_requested or c.uuid in self.inflight:
                    continue
                retry = lock_retry_at(c.status.lock_flaps, max_flaps, c.status.locked_at, now)
                if retry is not None:
                    self.held_back[c.uuid] = (
                        f"waiting: unlocked {c.status.lock_flaps} times (policy maxLockFlaps "
                        f"{max_flaps}); next try after {_iso(retry)}"
                    )
                    continue
                queued.append(self._view(c, Phase.QUEUED, spec.resources, None, now))
                continue
            phase = Phase.RUNNING if c.phase == "Running" else Phase.LOCKED
            if node is None:
                phase = Phase.QUEUED
            view = self._view(c, phase, c.status.resources or spec.resources, node, now)
            placed.append(
                Placement(
                    view,
                    cancelling=c.cancel_requested,
                    claim=claim,
                    checked=c.uuid in self.locks_checked,
                )
            )
        listings = (
            {w.name: w.runners for w in self.pool.workers.values() if w.runners is not None}
            if self.pool is not None
            else {}
        )
        remembered = self.held_resources

        def resources_of(uuid: str) -> ContainerResources | None:
            c = known.get(uuid)
            if c is not None and c.spec is not None:
                return c.status.resources or c.spec.resources
            return remembered.get(uuid)

        ledger = account(placed, queued, listings, resources_of)
        self.held_resources = ledger.held
        containers = self.plan_inputs = ledger.views
        nodes = [self._node_view(w) for w in self.pool.workers.values()] if self.pool else []
        # the hard caps (scheduling.caps): the operator's ceilings and the default policy's
        # limits; no creates at all while the default policy is missing or invalid
        policy, stopped = self.policies.create_limits()
        CREATES_STOPPED.set(1 if stopped else 0)
        catalogue = self._catalogue()
        limits = effective_limits(
            policy or PolicyLimits(self.policies.default_name),
            self.settings.limits.ceilings(),
            (t.name for t in catalogue.types),
        )
        cloud = self._cloud_state(now)
        if stopped is not None:
            cloud = replace(cloud, creates_blocked=f"no instance is created: {stopped}")
        return plan(
            containers,
            nodes,
            catalogue,
            self.cloud.config.instance_type_policy if self.cloud else _default_type_policy(),
            limits,
            cloud,
            now,
        )

    @staticmethod
    def _view(
        c: Container,
        phase: Phase,
        resources: ContainerResources,
        node: str | None,
        now: datetime,
    ) -> ContainerView:
        assert c.spec is not None
        created = c.body.get("metadata", {}).get("creationTimestamp")
        first_seen = c.status.first_seen or (
            datetime.fromisoformat(created.replace("Z", "+00:00")) if created else now
        )
        return ContainerView(
            uuid=c.uuid,
            phase=phase,
            priority=c.spec.priority,
            first_seen=first_seen,
            resources=resources,
            node=node,
        )

    def _node_view(self, w: Worker) -> NodeView:
        """The scheduler's view of a node: capacity from the catalogue (VMs) or the spec
        (side nodes); state, readiness and admission from the power controller."""
        power = self.board.view(w.name)
        if w.side:
            # the same node view until its spec or its power view changes (10,000 side
            # nodes are viewed at every round)
            cached = w.side_view
            if cached is not None and cached[0] is w.spec and cached[1] == power:
                return cached[2]
            view = Dispatcher._side_view(w, power)
            w.side_view = (w.spec, power, view)
            return view
        return Dispatcher._cloud_view(w, power)

    @staticmethod
    def _side_view(w: Worker, power: NodePowerView | None) -> NodeView:
        spec = w.spec
        cap = spec.capacity if spec is not None else None
        capacity = (
            Capacity(
                cap.vcpus,
                parse_quantity(cap.ram),
                parse_quantity(cap.scratch),
                cap.gpus,
                cap.gpu_model,
            )
            if cap is not None
            else Capacity(0, 0, 0, 0)
        )
        state = _SIDE_STATE.get(power.state, NodeState.UNKNOWN) if power else NodeState.UNKNOWN
        return NodeView(
            name=w.name,
            state=state,
            capacity=capacity,
            instance_type=None,
            price=w.price,
            admission_open=power is not None and power.admission_open,
            ready=power is not None and power.ready,
            wakeable=power is not None and power.wakeable,
        )

    @staticmethod
    def _cloud_view(w: Worker, power: NodePowerView | None) -> NodeView:
        leaving = power is not None and power.state in (
            PowerState.DRAINING,
            PowerState.SHUTTING_DOWN,
            PowerState.BLOCKED,
        )
        admission_open = power is not None and power.admission_open
        if w.destroy_requested_at is not None:
            state = NodeState.SHUTTING_DOWN
        elif leaving:
            state = NodeState.DRAINING
        elif w.instance is None or power is None or not power.ready:
            state = NodeState.PENDING if w.instance is None else NodeState.BOOTING
            # a VM coming up takes the work planned for it once verified ready: count it
            admission_open = w.idle_behavior == "run" and not w.broken
        else:
            state = NodeState.ACTIVE if power.state is PowerState.ACTIVE else NodeState.IDLE
        itype = w.instance_type
        capacity = Capacity.of(itype) if itype else Capacity(0, 0, 0, 0)
        return NodeView(
            name=w.name,
            state=state,
            capacity=capacity,
            instance_type=itype.name if itype else "unknown",
            price=w.price,
            admission_open=admission_open,
            ready=power is not None and power.ready,
        )

    def _cloud_state(self, now: datetime) -> CloudState:
        if self.cloud is None or self.pool is None:
            return CloudState(creates_blocked="no cloud is configured")
        blocked: dict[str, str] = {}
        kinds: set[CloudErrorKind | None] = set()
        for t in self.cloud.catalogue:
            permission = self.cloud.may_create(t, now)
            if not permission.allowed:
                blocked[t.name] = permission.reason
                kinds.add(permission.blocked_by)
        all_blocked = None
        if self.cloud.catalogue and len(blocked) == len(self.cloud.catalogue):
            if CloudErrorKind.QUOTA in kinds:
                all_blocked = "cloud instance quota reached; creates paused"
            elif CloudErrorKind.RATE_LIMIT in kinds:
                all_blocked = "cloud API rate limit; creates paused"
            elif CloudErrorKind.AUTH in kinds:
                all_blocked = "cloud credentials refused; creates paused"
            else:
                all_blocked = "every instance type is blocked by cloud errors"
        room = self.settings.max_new_nodes_per_round - self.pool.pending_creates()
        return CloudState(
            creates_blocked=all_blocked, blocked_types=blocked, max_new_nodes=max(0, room)
        )

    # --- 5. execute -----------------------------------------------------------------------

    async def _execute(self, result: Plan, now: datetime) -> None:
        """Carry out a plan. Nothing here blocks the round: writes and starts run as
        background tasks (one at a time per container), creates register their worker at
        once so the next plan counts them."""
        if self._stop.is_set():
            return  # stopping: what is under way finishes, nothing new begins
        by_uuid = self.queue.by_uuid()
        for uuid, why in result.unsatisfiable.items():
            c = by_uuid.get(uuid)
            if c is None or uuid in self.inflight:
                continue
            if self.cloud is not None:
                self._spawn_guarded(uuid, self._finish(c, "Failed", "NoInstanceTypeFits", why))
            else:
                self._spawn_guarded(uuid, self._wait(c, f"waiting: {why}"))
        if not self.recovered:
            return
        if result.creates or result.waits:
            log.debug(
                "plan: %d starts, %d creates, %d waiting (%s)",
                len(result.starts),
                len(result.creates),
                len(result.waits),
                "; ".join(sorted(set(result.waits.values())))[:300],
            )
        if self.pool is not None and self.cloud is not None:
            for create in result.creates:
                itype = self.cloud.instance_type(create.instance_type)
                if itype is not None:
                    self.pool.create(itype)
        for uuid, why in result.unlocks.items():
            c = by_uuid.get(uuid)
            if (
                c is None
                or uuid in self.inflight
                or uuid in self.claims
                or c.status.locked_by not in (None, self.dispatcher_id)
            ):
                continue
            reason = "Overflow" if uuid in result.overflow else "Unlocked"
            self._spawn_guarded(uuid, self._unlock(c, why, reason))
        for start in result.starts:
            c = by_uuid.get(start.uuid)
            if c is None or c.spec is None or start.uuid in self.inflight:
                continue
            # it holds the node from now on, before its Locked write is sent
            held = c.status.resources if start.relock else None
            self.claims[start.uuid] = Claim(start.node, held or c.spec.resources)
            self._spawn_guarded(start.uuid, self._start(c, start.node, start.relock))
        for uuid, why in [*result.waits.items(), *self.held_back.items()]:
            c = by_uuid.get(uuid)
            if (
                c is None
                or uuid in self.inflight
                or uuid in self.wait_writes
                or not self._wait_changes(c, why)
            ):
                continue
            self.wait_writes.add(uuid)
            self._spawn(self._wait_guarded(uuid, c, why))

    async def _wait_guarded(self, uuid: str, c: Container, why: str) -> None:
        try:
            await self._wait(c, why)
        except Exception:
            log.exception("scheduling status write for %s failed", uuid)
        finally:
            self.wait_writes.discard(uuid)

    def _wait_changes(self, c: Container, why: str) -> bool:
        """A waiting container's status is written at once when it has no phase yet or
        its spec changed; a changed scheduling status alone at most once per
        `scheduling_status_interval` (the wait for a VM to boot costs one write)."""
        if c.phase is None or c.status.observed_generation != c.generation:
            return True
        if c.status.scheduling_status == why:
            return False
        last = c.status_written_at
        return (
            last is None
            or (self.clock() - last).total_seconds() >= self.settings.scheduling_status_interval
        )

    async def _wait(self, c: Container, why: str) -> None:
        """Scheduling-status chatter (and the acknowledgement of a new container, with its
        Valid condition) goes in the background lane."""
        c = self.queue.get(c.name) or c
        if c.terminal or c.cancel_requested or c.uuid in self.inflight:
            return
        if not self._wait_changes(c, why):
            return

        # Preconditioned: a start may lock the container meanwhile; its write must win.
        # Dropped unsent if a start takes the container while this write waits its turn.
        def started() -> bool:
            return c.uuid in self.inflight

        if c.phase not in (None, "Queued"):
            if c.status.scheduling_status != why:
                await self._write(
                    c,
                    {"schedulingStatus": why},
                    background=True,
                    precondition=True,
                    unless=started,
                )
            return
        await self._write(
            c,
            {"phase": "Queued", "schedulingStatus": why, "reason": "Waiting"},
            background=True,
            precondition=True,
            unless=started,
        )

    async def _start(self, c: Container, node: str, relock: bool) -> None:
        """Lock `c` on `node` (unless it is a relock) and start its runner there.

        `c` is the version the plan read: the Locked write is preconditioned on it and
        snapshots the resources the plan placed (`status.resources`), so a spec edited
        meanwhile fails the lock and is planned again. The claim `_execute` made holds the
        node until this returns; by then the container's status (Locked, Running) or the
        node's answer holds it -- or nothing runs."""
        assert self.pool is not None and self.prober is not None and self._starts is not None
        try:
            worker = self.pool.workers.get(node)
            if worker is None or c.spec is None or not self.board.admission_open(node):
                return
            target = await self.pool.target(worker)
            if target is None:
                return
            async with self._starts:
                await self._lock_and_start(c, worker, target, relock)
        finally:
            self.claims.pop(c.uuid, None)

    async def _lock_and_start(
        self, c: Container, worker: Worker, target: SshTarget, relock: bool
    ) -> None:
        assert self.prober is not None and c.spec is not None
        node = worker.name
        spec = c.spec
        held = (c.status.resources if relock else None) or spec.resources
        if not relock:
            ok = await self._write(
                c,
                {
                    "phase": "Locked",
                    "node": node,
                    "lockedBy": self.dispatcher_id,
                    "lockedAt": _iso(self.clock()),
                    "instanceType": worker.instance_type.name if worker.instance_type else None,
                    "resources": held.to_wire(),
                    "schedulingStatus": f"starting on {node}",
                    "reason": "Locked",
                },
                precondition=True,
            )
            if not ok:
                return
        latest = self.queue.get(c.name)
        if latest is None or latest.cancel_requested:
            return
        attempts = latest.status.attempts + 1
        config = {"uuid": spec.uuid, **spec.to_wire(), "resources": held.to_wire()}
        try:
            started = await self.prober.start_runner(target, config, uid=latest.uid)
        except SshError as exc:
            await self._start_failed(latest, worker, exc, attempts)
            return
        await self._started(latest, worker, started, attempts, held)

    async def _started(
        self,
        c: Container,
        worker: Worker,
        started: RunnerStarted,
        attempts: int,
        held: ContainerResources,
    ) -> None:
        if worker.runners is not None:
            worker.runners[c.uuid] = started.pid
        worker.last_container = c.uuid
        CONTAINERS_STARTED.labels(
            worker.instance_type.name if worker.instance_type else "unknown"
        ).inc()
        await self._write(
            c,
            {
                "phase": "Running",
                "node": worker.name,
                "lockedBy": self.dispatcher_id,
                "runnerPid": started.pid,
                "resources": held.to_wire(),
                "startedAt": _iso(started.observed_at),
                "attempts": attempts,
                "schedulingStatus": f"running on {worker.name}",
                "reason": "Started",
            },
        )

    async def _start_failed(
        self, c: Container, worker: Worker, exc: SshError, attempts: int
    ) -> None:
        """A start that failed or timed out may have started the runner all the same (a
        command timeout after the node started it): ask the node before anything else.
        Until it answers, the lock -- and with it the node's capacity -- is kept, and the
        lock is checked again like a lock from before a restart."""
        why = f"runner could not start on {worker.name}: {exc}"
        outcome = await self._runner_outcome(c, worker)
        if outcome is None:
            self.locks_checked.discard(c.uuid)
            log.info("start of %s on %s unresolved: %s", c.uuid, worker.name, exc)
            await self._write(c, {"schedulingStatus": f"{why}; asking the node whether it ran"})
            return
        if outcome.state == "running" and outcome.pid is not None:
            log.info("start of %s on %s failed but its runner runs: adopting", c.uuid, worker.name)
            await self._adopt_runner(c, worker, outcome.pid)
        elif outcome.state == "unknown":
            await self._requeue_or_fail(c, why, attempts, "RunnerStartFailed")
        else:
            await self._ran_and_ended(c, worker, outcome, attempts)

    def _overcommit(self, result: Plan) -> None:
        """A node found running more than it holds (an old leader's overcommit) is
        announced -- the plan gives it no new work until it fits -- and never "fixed" by
        killing: its runners finish on their own."""
        over = result.over_capacity
        for node, what in over.items():
            if self.overcommitted.get(node) is None:
                log.warning("WorkerNode %s runs more than it holds: %s", node, what)
        for node in set(self.overcommitted) - set(over):
            log.info("WorkerNode %s fits its capacity again", node)
        self.overcommitted = dict(over)

    # --- 7. metrics and status ------------------------------------------------------------

    def _metrics(self) -> None:
        phases: dict[str, int] = {p: 0 for p in ("Queued", "Locked", "Running", *TERMINAL_PHASES)}
        for c in self.queue:
            phases[c.phase or "Queued"] = phases.get(c.phase or "Queued", 0) + 1
        for phase, count in phases.items():
            CONTAINERS.labels(phase).set(count)
        OVERCOMMITTED_NODES.set(len(self.overcommitted))
        if self.pool is not None:
            spend = sum(w.price for w in self.pool.workers.values() if not w.side)
            HOURLY_SPEND.set(spend)

    def _state_name(self, w: Worker) -> str:
        power = self.board.view(w.name)
        return api_state(power.state) if power is not None else "Unknown"

    def snapshot(self) -> dict[str, Any]:
        """Live view for the management status endpoint (not stored anywhere)."""
        now = self.clock()
        by_node = self._containers_by_node()
        instances = []
        if self.pool is not None:
            for w in sorted(self.pool.workers.values(), key=lambda w: w.name):
                running = by_node.get(w.name, [])
                instances.append(
                    {
                        "instanceId": w.instance.id if w.instance else None,
                        "workerNode": w.name,
                        "instanceType": w.instance_type.name if w.instance_type else None,
                        "state": self._state_name(w),
                        "currentContainers": running,
                        "lastContainer": w.last_container,
                        "hourlyPrice": w.price,
                        "idleSeconds": (now - w.idle_since).total_seconds()
                        if w.idle_since and not running
                        else 0,
                        "lastProbe": _iso(w.last_attempt),
                        "lastProbeResult": w.probe_result,
                        "overCapacity": self.overcommitted.get(w.name),
                    }
                )
        containers = [
            {
                "name": c.name,
                "uuid": c.uuid,
                "phase": c.phase or "Queued",
                "node": c.status.node,
                "attempts": c.status.attempts,
                "schedulingStatus": c.status.scheduling_status,
            }
            for c in sorted(self.queue, key=lambda c: c.name)
        ]
        cloud = self.cloud.backoff.snapshot(now) if self.cloud is not None else None
        return {
            "dispatcherId": self.dispatcher_id,
            "time": _iso(now),
            "recovered": self.recovered,
            "instances": instances,
            "containers": containers,
            "cloud": cloud,
        }


def _default_type_policy() -> Any:
    from nodewarden.scheduling.instancetypes import InstanceTypePolicy

    return InstanceTypePolicy()
