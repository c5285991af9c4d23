"""The runner client's fence layer: runner starts and signals only while leadership is valid.

`FencedRunners` wraps the prober for the dispatcher (its `ProberPort`), composed once by
`build_dispatcher`. Every start and signal

- asks the fence (`nodewarden.fence.Fence.check`) once to get the token, and again
  right before the command leaves the process (the prober's `guard`, after the SSH
  connection and its channel wait: the last moment it can still be refused), so a
  command is never sent after leadership ended -- `NotSent`, nothing sent;
- carries the owner options of the runner contract: this install's dispatcher id,
  the ContainerDispatch's `metadata.uid` (starts) and the fencing token; the runner
  refuses a token lower than the highest it has seen (`FenceRejected`), and then this
  replica steps down: a newer leader has acted on that node.

`runner_status` only reads, so it is not fenced.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

import nodewarden.ssh.errors as errors
from nodewarden.fence import Fence, NotLeader
from nodewarden.metrics import FENCED
from nodewarden.ssh.credentials import SshTarget
from nodewarden.ssh.facts import RunnerOutcome, RunnerStarted
from nodewarden.ssh.link import Guard
from nodewarden.ssh.prober import SshProber
from nodewarden.ssh.runners import RunnerOwner


class FencedRunners:
    """`ProberPort` of the dispatcher over an `SshProber` (see the module docstring)."""

    def __init__(self, prober: SshProber, fence: Fence, dispatcher_id: str) -> None:
        self.prober = prober
        self.fence = fence
        self.dispatcher_id = dispatcher_id

    def _owner(self, target: SshTarget, action: str, uid: str | None) -> RunnerOwner:
        try:
            token = self.fence.check(f"{action} on {target.node}")
        except NotLeader as exc:
            raise errors.NotSent(target.node, target.address, str(exc)) from None
        return RunnerOwner(
            self.dispatcher_id, uid=uid, fence=token.value if token is not None else None
        )

    def _guard(self, target: SshTarget, action: str) -> Guard:
        def guard() -> object:
            return self.fence.check(f"{action} on {target.node}")

        return guard

    async def start_runner(
        self, target: SshTarget, config: Mapping[str, Any], uid: str | None = None
    ) -> RunnerStarted:
        action = "runner start"
        with self._counted(target):
            owner = self._owner(target, action, uid)
            return await self.prober.start_runner(
                target, config, owner=owner, guard=self._guard(target, action)
            )

    async def kill_runner(self, target: SshTarget, uuid: str, signal: str | int = "TERM") -> None:
        action = f"runner {signal}"
        with self._counted(target):
            owner = self._owner(target, action, None)
            await self.prober.kill_runner(
                target, uuid, signal, owner=owner, guard=self._guard(target, action)
            )

    @contextlib.contextmanager
    def _counted(self, target: SshTarget) -> Iterator[None]:
        """Count what the fence stopped; a refused token ends this replica's leadership."""
        try:
            yield
        except errors.NotSent:
            FENCED.labels("runner").inc()
            raise
        except errors.FenceRejected:
            FENCED.labels("runner").inc()
            self.fence.rejected(f"the runner on {target.node}")
            raise

    async def runner_status(self, target: SshTarget, uuid: str) -> RunnerOutcome:
        return await self.prober.runner_status(target, uuid)

    async def aclose(self) -> None:
        await self.prober.aclose()
