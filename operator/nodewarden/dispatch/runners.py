"""Runners against containers, node by node, from the latest probe; and runner starts.

Each round (`reconcile`): adopt a runner whose container is Locked/Queued, kill a
runner nobody wants (its container deleted, finished or placed elsewhere: TERM every
`term_interval`, KILL after `term_timeout`), find out how a Running container whose
runner is gone ended (Complete with its exit code, or requeue / Failed after the
attempts cap), and ask the node about a lock from before a restart before it is used
again. A start (`start`) locks the container (preconditioned on the version the plan
read) and starts its runner; a start that fails or times out asks the node before it
requeues.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from datetime import timedelta

from nodewarden.api.containerdispatch import ContainerResources
from nodewarden.dispatch.context import DispatchContext
from nodewarden.dispatch.outcomes import Outcomes
from nodewarden.dispatch.queue import Container
from nodewarden.fleet.admission import admitted_after_lock
from nodewarden.kube.client import KubeError
from nodewarden.metrics import CONTAINERS_STARTED
from nodewarden.pool.times import iso
from nodewarden.pool.worker import Worker
from nodewarden.ssh.credentials import SshTarget
from nodewarden.ssh.errors import SshError
from nodewarden.ssh.facts import RunnerOutcome, RunnerStarted

log = logging.getLogger(__name__)


def _runs_for(c: Container, uid: str | None) -> bool:
    """Whether a runner started for the object `uid` is `c`'s: runners are keyed by the
    object's metadata.uid as well as its uuid (None, an older runner: by the uuid alone)."""
    return uid is None or c.uid is None or uid == c.uid


class Runners:
    """Reconciles runners with containers and starts runners (module docstring)."""

    def __init__(self, ctx: DispatchContext, outcomes: Outcomes) -> None:
        self.ctx = ctx
        self.outcomes = outcomes

    def reconcile(self) -> None:
        assert self.ctx.pool is not None
        if not self.ctx.recovered:
            return
        by_uuid = self.ctx.queue.by_uuid()
        running_on: dict[str, list[Container]] = {}
        locked_on: dict[str, list[Container]] = {}
        self.ctx.locks_checked.intersection_update(
            c.uuid for c in by_uuid.values() if c.phase == "Locked"
        )
        seen, self.ctx.running_seen = self.ctx.running_seen, {}
        seen_at = self.ctx.clock()  # by_uuid is what the queue holds now
        for c in by_uuid.values():
            if c.phase == "Running" and c.status.node:
                running_on.setdefault(c.status.node, []).append(c)
                key = (c.uuid, c.status.node, c.status.attempts)
                self.ctx.running_seen[key] = seen.get(key, seen_at)
            elif (
                c.phase == "Locked"
                and c.status.node
                and c.status.locked_by in (None, self.ctx.dispatcher_id)
                and c.uuid not in self.ctx.locks_checked
            ):
                locked_on.setdefault(c.status.node, []).append(c)
        for worker in list(self.ctx.pool.workers.values()):
            if worker.runners is None or worker.runners_at is None:
                continue
            for uuid, pid in list(worker.runners.items()):
                listed = by_uuid.get(uuid)
                if uuid in self.ctx.inflight:
                    continue
                owner = self._runner_owner(worker, uuid)
                if owner != self.ctx.dispatcher_id:
                    # another install's runner, or one naming no owner (reported by the
                    # pool): never killed; an owner-less runner of a container we locked
                    # on this node (started by an older release of ours) is adopted
                    if (
                        owner is None
                        and listed is not None
                        and listed.phase == "Locked"
                        and listed.status.locked_by == self.ctx.dispatcher_id
                        and listed.status.node == worker.name
                        and not listed.cancel_requested
                    ):
                        self.ctx.spawn_guarded(uuid, self._adopt_runner(listed, worker, pid))
                    continue
                if listed is not None and not _runs_for(listed, self._runner_uid(worker, uuid)):
                    # started for another object of the same uuid (since deleted): none of
                    # this container's business, and unwanted (one object, one runner)
                    self.ctx.spawn_guarded(uuid, self.kill_unwanted(worker, uuid))
                    continue
                if (
                    listed is None
                    or listed.terminal
                    or (listed.status.node and listed.status.node != worker.name)
                ):
                    if not listed or not listed.cancel_requested:
                        self.ctx.spawn_guarded(uuid, self.kill_unwanted(worker, uuid))
                    continue
                if listed.cancel_requested:
                    continue  # handled by _cancellations
                if listed.phase in (None, "Queued", "Locked"):
                    self.ctx.spawn_guarded(uuid, self._adopt_runner(listed, worker, pid))
            for c in running_on.get(worker.name, ()):
                if c.uuid in worker.runners or c.uuid in self.ctx.inflight or c.cancel_requested:
                    continue
                since = self.ctx.running_seen[(c.uuid, worker.name, c.status.attempts)]
                if worker.runners_at <= since:
                    continue  # the listing may predate the start
                self.ctx.spawn_guarded(c.uuid, self._runner_gone(c, worker))
            for c in locked_on.get(worker.name, ()):
                if c.uuid in worker.runners or c.uuid in self.ctx.inflight or c.cancel_requested:
                    continue  # a listed runner is adopted above
                self.ctx.spawn_guarded(c.uuid, self._check_lock(c, worker))
        # Running containers whose node no longer exists
        for c in by_uuid.values():
            if c.phase not in ("Running", "Locked") or c.uuid in self.ctx.inflight:
                continue
            if c.status.locked_by not in (None, self.ctx.dispatcher_id):
                continue
            if c.status.node and c.status.node not in self.ctx.pool.workers:
                if c.cancel_requested:
                    continue
                self.ctx.spawn_guarded(
                    c.uuid,
                    self.outcomes.requeue_or_fail(
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
        return listed.dispatcher_id if listed is not None else self.ctx.dispatcher_id

    async def unlock(self, c: Container, why: str, reason: str = "Unlocked") -> None:
        """Release a Locked container -- unless its node says its runner already started.

        A leader that started the runner but could not write Running (API connection
        lost, process killed) leaves the container Locked; the next leader must not run
        it a second time: the node's answer finishes (exited) or adopts (running) it.
        Only a node that cannot be asked, or that never saw the container, unlocks it.
        """
        assert self.ctx.pool is not None
        worker = self.ctx.pool.workers.get(c.status.node) if c.status.node else None
        outcome = await self._runner_outcome(c, worker) if worker is not None else None
        if worker is not None and outcome is not None:
            if outcome.state == "exited":
                code = outcome.exit_code if outcome.exit_code is not None else -1
                await self.outcomes.finish(
                    c, "Complete", "Exited", f"exited with code {code} on {worker.name}", code
                )
                return
            if (
                outcome.state == "running"
                and outcome.pid is not None
                and outcome.dispatcher_id in (None, self.ctx.dispatcher_id)
            ):
                await self._adopt_runner(c, worker, outcome.pid)
                return
        await self.outcomes.requeue_or_fail(c, why, c.status.attempts, reason, flap=True)

    async def kill_unwanted(self, worker: Worker, uuid: str) -> None:
        """TERM a runner nobody wants (its ContainerDispatch deleted, finished, or placed
        on another node), again every `term_interval`, KILL after `term_timeout`."""
        assert self.ctx.pool is not None and self.ctx.prober is not None
        now = self.ctx.clock()
        key = (worker.name, uuid)
        first, last = self.ctx.unwanted_terms.get(key, (now, None))
        if last is not None and (now - last).total_seconds() < self.ctx.settings.term_interval:
            return
        target = await self.ctx.pool.target(worker)
        if target is None:
            return
        signal = (
            "KILL" if (now - first).total_seconds() >= self.ctx.settings.term_timeout else "TERM"
        )
        log.info("killing runner of unwanted container %s on %s (%s)", uuid, worker.name, signal)
        with contextlib.suppress(SshError):
            await self.ctx.prober.kill_runner(target, uuid, signal)
        # a runner still listed is signalled every term_interval: an older entry is gone
        forget = now - timedelta(
            seconds=max(10 * self.ctx.settings.term_interval, 2 * self.ctx.settings.term_timeout)
        )
        for k, (_, at) in list(self.ctx.unwanted_terms.items()):
            if at < forget:
                del self.ctx.unwanted_terms[k]
        self.ctx.unwanted_terms[key] = (first, self.ctx.clock())
        worker.runner_signalled()

    async def _adopt_runner(self, c: Container, worker: Worker, pid: int) -> None:
        held = c.status.resources or (c.spec.resources if c.spec is not None else None)
        ok = await self.outcomes.write(
            c,
            {
                "phase": "Running",
                "resources": held.to_wire() if held is not None else None,
                "node": worker.name,
                "lockedBy": self.ctx.dispatcher_id,
                "runnerPid": pid,
                "instanceType": worker.instance_type.name if worker.instance_type else None,
                "startedAt": c.status.started_at.isoformat()
                if c.status.started_at
                else iso(self.ctx.clock()),
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
        if outcome.state == "running":
            return  # the next listing adopts it (ended before that: asked again)
        if outcome.state == "unknown":
            # never ran: the plan may start it under its lock (`locks_checked` holds this
            # answer only until that start: `_lock_and_start`)
            self.ctx.locks_checked.add(c.uuid)
            return
        # it ran, and was never written as Running
        await self._ran_and_ended(c, worker, outcome, c.status.attempts + 1)

    async def _ran_and_ended(
        self, c: Container, worker: Worker, outcome: RunnerOutcome, attempts: int
    ) -> None:
        """`c`'s runner ran on `worker` without being written as Running and ended as
        `outcome` says (exited, killed, lost): Complete, or requeue / Failed."""
        if outcome.state == "exited":
            code = outcome.exit_code if outcome.exit_code is not None else -1
            if await self.outcomes.write(c, {"attempts": attempts}):
                await self.outcomes.finish(
                    self.ctx.queue.get(c.name) or c,
                    "Complete",
                    "Exited",
                    f"exited with code {code} on {worker.name}",
                    code,
                )
            return
        await self.outcomes.requeue_or_fail(
            c,
            f"runner on {worker.name} ended without finishing the container ({outcome.state})",
            attempts,
            "RunnerLost",
        )

    async def _runner_outcome(self, c: Container, worker: Worker) -> RunnerOutcome | None:
        """How `c`'s runner on `worker` is or ended, or None when the node cannot say."""
        assert self.ctx.pool is not None and self.ctx.prober is not None
        target = await self.ctx.pool.target(worker)
        if target is None:
            return None
        try:
            outcome = await self.ctx.prober.runner_status(target, c.uuid)
        except SshError as exc:
            log.info("runner status of %s on %s unknown: %s", c.uuid, worker.name, exc)
            return None
        if _runs_for(c, outcome.uid):
            return outcome
        # the node's record of this uuid is another object's (one deleted since): it says
        # nothing of this container's runner, which never ran there
        if outcome.state != "running":
            return dataclasses.replace(outcome, state="unknown", exit_code=None)
        if outcome.dispatcher_id == self.ctx.dispatcher_id:
            self.ctx.spawn_guarded(c.uuid, self.kill_unwanted(worker, c.uuid))
        return None  # asked again once that runner is gone

    async def _runner_gone(self, c: Container, worker: Worker) -> None:
        """A Running container's runner is no longer listed: find out how it ended."""
        outcome = await self._runner_outcome(c, worker)
        if outcome is None or outcome.state == "running":
            return
        if outcome.state == "exited":
            code = outcome.exit_code if outcome.exit_code is not None else -1
            await self.outcomes.finish(
                c, "Complete", "Exited", f"exited with code {code} on {worker.name}", code
            )
            return
        if outcome.state == "killed" and c.cancel_requested:
            await self.outcomes.finish(c, "Cancelled", "Cancelled", "cancelled; runner stopped")
            return
        await self.outcomes.requeue_or_fail(
            c,
            f"runner on {worker.name} ended without finishing the container ({outcome.state})",
            c.status.attempts,
            "RunnerLost",
        )

    # --- 3. cancellations and deletions ---------------------------------------------------

    async def start(self, c: Container, node: str, relock: bool, gpu_work: bool) -> None:
        """Lock `c` on `node` (unless it is a relock) and start its runner there.

        Admission is checked again first, for this container's kind (`gpu_work`,
        `Start.gpu_work`): a node whose admission closed since the plan -- or narrowed to
        GPU work only (GPUOnly), for CPU-only work that fits elsewhere -- gets no start;
        the container is planned again. The check and the claim are ordered as before:
        the claim is held from the plan until this returns, so a close is acknowledged
        only once no start is in flight for the node. With cross-process admission on
        (`ctx.admission`), the node's admission is also read from the API server once the
        lock is acknowledged (`_admitted_after_lock`).

        `c` is the version the plan read: the Locked write is preconditioned on it and
        snapshots the resources the plan placed (`status.resources`), so a spec edited
        meanwhile fails the lock and is planned again. The claim `_execute` made holds the
        node until this returns; by then the container's status (Locked, Running) or the
        node's answer holds it -- or nothing runs."""
        assert (
            self.ctx.pool is not None
            and self.ctx.prober is not None
            and self.ctx.starts is not None
        )
        try:
            worker = self.ctx.pool.workers.get(node)
            if worker is None or c.spec is None or not self.ctx.board.admits(node, gpu_work):
                return
            target = await self.ctx.pool.target(worker)
            if target is None:
                return
            async with self.ctx.starts:
                await self._lock_and_start(c, worker, target, relock, gpu_work)
        finally:
            self.ctx.claims.pop(c.uuid, None)

    async def _lock_and_start(
        self, c: Container, worker: Worker, target: SshTarget, relock: bool, gpu_work: bool
    ) -> None:
        assert self.ctx.prober is not None and c.spec is not None
        node = worker.name
        spec = c.spec
        held = (c.status.resources if relock else None) or spec.resources
        if not relock:
            ok = await self.outcomes.write(
                c,
                {
                    "phase": "Locked",
                    "node": node,
                    "lockedBy": self.ctx.dispatcher_id,
                    "lockedAt": iso(self.ctx.clock()),
                    "instanceType": worker.instance_type.name if worker.instance_type else None,
                    "resources": held.to_wire(),
                    "schedulingStatus": f"starting on {node}",
                    "reason": "Locked",
                },
                precondition=True,
            )
            if not ok:
                return
        latest = self.ctx.queue.get(c.name)
        if latest is None or latest.cancel_requested:
            return
        if self.ctx.admission is not None and not await self._admitted_after_lock(
            latest, node, gpu_work
        ):
            return
        attempts = latest.status.attempts + 1
        config = {"uuid": spec.uuid, **spec.to_wire(), "resources": held.to_wire()}
        # The node's "never ran" (`_check_lock`) is spent from here: once a runner may
        # exist, a later absence from the listing is asked about again, never taken for a
        # lock still unused (a lost Running write must not start the container twice)
        self.ctx.locks_checked.discard(c.uuid)
        try:
            started = await self.ctx.prober.start_runner(target, config, uid=latest.uid)
        except SshError as exc:
            await self._start_failed(latest, worker, exc, attempts)
            return
        await self._started(latest, worker, started, attempts, held)

    async def _admitted_after_lock(self, c: Container, node: str, gpu_work: bool) -> bool:
        """Cross-process admission (docs/sharding.md section 2, `fleet.admission`): the
        lock on `c` naming `node` is acknowledged; a quorum read of the node's admission
        now either admits `c` (start) or not -- the node's owner closed it, and its demand
        re-read, ordered after this lock or before it by the API server, either saw `c`
        or is seen here. Not admitted (or not readable): `c` is unlocked, counting no
        attempt but a lock flap (a lock released unused: after policy maxLockFlaps the
        container waits before it is locked again, so a board and an API server that
        disagree for a while cost no lock, read and unlock per tick), and planned again."""
        assert self.ctx.admission is not None
        try:
            if await admitted_after_lock(self.ctx.admission, node, gpu_work):
                return True
            why = f"admission of {node} closed after the lock (read from the API server)"
        except KubeError as exc:
            why = f"admission of {node} unknown after the lock ({exc})"
        log.info("start of %s on %s withdrawn: %s", c.uuid, node, why)
        await self.outcomes.requeue_or_fail(c, why, c.status.attempts, "AdmissionClosed", flap=True)
        return False

    async def _started(
        self,
        c: Container,
        worker: Worker,
        started: RunnerStarted,
        attempts: int,
        held: ContainerResources,
    ) -> None:
        worker.runner_started(c.uuid, started.pid)
        CONTAINERS_STARTED.labels(
            worker.instance_type.name if worker.instance_type else "unknown"
        ).inc()
        await self.outcomes.write(
            c,
            {
                "phase": "Running",
                "node": worker.name,
                "lockedBy": self.ctx.dispatcher_id,
                "runnerPid": started.pid,
                "resources": held.to_wire(),
                "startedAt": iso(started.observed_at),
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
            self.ctx.locks_checked.discard(c.uuid)
            log.info("start of %s on %s unresolved: %s", c.uuid, worker.name, exc)
            await self.outcomes.write(
                c, {"schedulingStatus": f"{why}; asking the node whether it ran"}
            )
            return
        if outcome.state == "running" and outcome.pid is not None:
            log.info("start of %s on %s failed but its runner runs: adopting", c.uuid, worker.name)
            await self._adopt_runner(c, worker, outcome.pid)
        elif outcome.state == "unknown":
            await self.outcomes.requeue_or_fail(c, why, attempts, "RunnerStartFailed")
        else:
            await self._ran_and_ended(c, worker, outcome, attempts)
