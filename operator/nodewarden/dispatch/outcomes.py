"""What the dispatcher writes of a container: the acknowledgement and Valid condition of
its first write, its end (Complete, Failed, Cancelled), a requeue under the attempts
cap, cancellations (TERM repeated every `term_interval`, KILL after `term_timeout`),
and scheduling statuses (at most once per `scheduling_status_interval` unless the phase
or the spec changed).
"""

from __future__ import annotations

import contextlib
import logging
from datetime import datetime, timedelta
from typing import Any

from nodewarden.dispatch.context import DispatchContext
from nodewarden.dispatch.queue import LEGACY_FINALIZER, Container
from nodewarden.kube.client import KubeError
from nodewarden.metrics import CONTAINERS_FINISHED
from nodewarden.pool.times import iso
from nodewarden.ssh.errors import SshError

log = logging.getLogger(__name__)


class Outcomes:
    """Container status writes: first writes, ends, requeues, cancellations, waits."""

    def __init__(self, ctx: DispatchContext) -> None:
        self.ctx = ctx

    def base(self, c: Container) -> dict[str, Any]:
        """Fields every first write carries: acknowledgement and the Valid condition."""
        out: dict[str, Any] = {}
        if c.status.observed_generation != c.generation:
            out["observedGeneration"] = c.generation
            if c.problem:
                out["conditions"] = self.ctx.queue.conditions(c, False, "InvalidSpec", c.problem)
            else:
                out["conditions"] = self.ctx.queue.conditions(c, True, "Valid", "spec is valid")
        if c.status.first_seen is None:
            out["firstSeen"] = iso(self.ctx.clock())
        return out

    async def write(
        self, c: Container, status: dict[str, Any], *, precondition: bool = False, **kw: Any
    ) -> bool:
        """Merge-patch `c`'s status. With `precondition` the write is sent against `c` as
        given -- the version the caller decided from: any change since (a spec edit, another
        dispatcher's lock) fails it. Otherwise against the newest version known."""
        latest = c if precondition else (self.ctx.queue.get(c.name) or c)
        try:
            ok = await self.ctx.queue.write(
                latest, {**self.base(latest), **status}, precondition=precondition, **kw
            )
        except KubeError as exc:
            log.warning("status write for %s failed: %s", c.name, exc)
            return False
        written = self.ctx.queue.get(c.name)
        if ok and written is not None:
            written.status_written_at = self.ctx.clock()
        return ok

    async def finish(
        self, c: Container, phase: str, reason: str, message: str, exit_code: int | None = None
    ) -> None:
        status: dict[str, Any] = {
            "phase": phase,
            "reason": reason,
            "schedulingStatus": message,
            "finishedAt": iso(self.ctx.clock()),
        }
        if exit_code is not None:
            status["exitCode"] = exit_code
        if await self.write(c, status):
            CONTAINERS_FINISHED.labels(phase).inc()
            log.info("container %s %s: %s", c.uuid, phase, message)
            if c.status.node and self.ctx.pool is not None:
                worker = self.ctx.pool.workers.get(c.status.node)
                if worker is not None:
                    worker.container_finished(c.uuid)
        latest = self.ctx.queue.get(c.name)
        if latest is not None and LEGACY_FINALIZER in latest.finalizers:
            with contextlib.suppress(KubeError):
                await self.ctx.queue.drop_legacy_finalizer(latest)

    async def requeue_or_fail(
        self, c: Container, why: str, attempts: int, reason: str, flap: bool = False
    ) -> None:
        cap = self.ctx.max_attempts()
        if attempts >= cap:
            await self.finish(
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
        if await self.write(c, status):
            log.info("container %s requeued: %s", c.uuid, why)

    # --- 2. runners vs containers ---------------------------------------------------------

    async def cancellations(self, now: datetime) -> None:
        """Every tick: a scan of the queue that stops early for the common container (not
        terminal, not cancelled)."""
        inflight = self.ctx.inflight
        for c in self.ctx.queue:
            if c.spec is None:
                continue
            if c.terminal:
                # one write, objects of earlier releases
                if LEGACY_FINALIZER in c.finalizers and c.uuid not in inflight:
                    self.ctx.spawn_guarded(c.uuid, self.ctx.queue.drop_legacy_finalizer(c))
                continue
            if not c.cancel_requested or c.uuid in inflight:
                continue
            if c.status.locked_by not in (None, self.ctx.dispatcher_id):
                continue
            self.ctx.spawn_guarded(c.uuid, self._cancel(c, now))

    async def _cancel(self, c: Container, now: datetime) -> None:
        worker = (
            self.ctx.pool.workers.get(c.status.node or "")
            if self.ctx.pool is not None and c.phase in ("Locked", "Running")
            else None
        )
        if worker is None or worker.instance is None or self.ctx.prober is None:
            # nothing runs anywhere (or its node is gone)
            if c.phase == "Running":
                why = f"cancelled; its node {c.status.node} is gone"
            else:
                why = "cancelled before it ran"
            await self.finish(c, "Cancelled", "Cancelled", why)
            return
        assert self.ctx.pool is not None
        listed = worker.runners is not None and c.uuid in worker.runners
        if (
            not listed
            and c.last_term_at is not None
            and worker.runners_at is not None
            and worker.runners_at > c.last_term_at
        ):
            await self.finish(
                c, "Cancelled", "Cancelled", f"cancelled; runner on {worker.name} stopped"
            )
            return
        due = (
            c.last_term_at is None
            or (now - c.last_term_at).total_seconds() >= self.ctx.settings.term_interval
        )
        if not due:
            return
        first = c.first_term_at or now
        signal = (
            "KILL" if (now - first).total_seconds() >= self.ctx.settings.term_timeout else "TERM"
        )
        target = await self.ctx.pool.target(worker)
        if target is None:
            return
        try:
            await self.ctx.prober.kill_runner(target, c.uuid, signal)
        except SshError as exc:
            log.info("could not signal runner of %s on %s: %s", c.uuid, worker.name, exc)
        latest = self.ctx.queue.get(c.name)
        if latest is not None:
            latest.first_term_at = first
            latest.last_term_at = self.ctx.clock()
        worker.runner_signalled()
        if c.status.scheduling_status != "cancelling: stopping the runner":
            await self.write(c, {"schedulingStatus": "cancelling: stopping the runner"})

    # --- 4. plan --------------------------------------------------------------------------

    async def wait_guarded(self, uuid: str, c: Container, why: str) -> None:
        try:
            await self.wait(c, why)
        except Exception:
            log.exception("scheduling status write for %s failed", uuid)
        finally:
            self.ctx.wait_writes.discard(uuid)
            self.ctx.task_ends += 1

    def wait_changes(self, c: Container, why: str) -> bool:
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
            or (self.ctx.clock() - last).total_seconds()
            >= self.ctx.settings.scheduling_status_interval
        )

    def wait_due(self, c: Container, why: str) -> datetime | None:
        """When a changed scheduling status `wait_changes` holds back now may be written
        (None: it is not held back by `scheduling_status_interval`)."""
        last = c.status_written_at
        if c.status.scheduling_status == why or last is None or self.wait_changes(c, why):
            return None
        return last + timedelta(seconds=self.ctx.settings.scheduling_status_interval)

    async def wait(self, c: Container, why: str) -> None:
        """Scheduling-status chatter (and the acknowledgement of a new container, with its
        Valid condition) goes in the background lane."""
        c = self.ctx.queue.get(c.name) or c
        if c.terminal or c.cancel_requested or c.uuid in self.ctx.inflight:
            return
        if not self.wait_changes(c, why):
            return

        # Preconditioned: a start may lock the container meanwhile; its write must win.
        # Dropped unsent if a start takes the container while this write waits its turn.
        def started() -> bool:
            return c.uuid in self.ctx.inflight

        if c.phase not in (None, "Queued"):
            if c.status.scheduling_status != why:
                await self.write(
                    c,
                    {"schedulingStatus": why},
                    background=True,
                    precondition=True,
                    unless=started,
                )
            return
        await self.write(
            c,
            {"phase": "Queued", "schedulingStatus": why, "reason": "Waiting"},
            background=True,
            precondition=True,
            unless=started,
        )
