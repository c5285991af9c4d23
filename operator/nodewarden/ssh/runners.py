"""Runner control over SSH: start, signal and ask about a container's runner on a node.

The commands of the node contract (`nodewarden.ssh.protocol`): ``RUNNER run --detach``
with the ContainerDispatch spec on stdin, ``RUNNER --kill SIGNAL UUID``, ``RUNNER --status
UUID``, each with the owner options (`RunnerOwner`). These are actions: not throttled.
"""

from __future__ import annotations

import json
import logging
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import nodewarden.ssh.errors as errors
from nodewarden.ssh.connection import Connections
from nodewarden.ssh.credentials import SshTarget
from nodewarden.ssh.facts import RunnerOutcome, RunnerStarted
from nodewarden.ssh.link import LOGGER_NAME, Guard, Output, hint, parsed, source
from nodewarden.ssh.parsing import (
    OutputError,
    parse_runner_owner,
    parse_runner_pid,
    parse_runner_status,
)
from nodewarden.ssh.protocol import CONTAINER_UUID, RUNNER_FENCED, owner_options, signal_name

logger = logging.getLogger(LOGGER_NAME)


@dataclass(frozen=True, slots=True)
class RunnerOwner:
    """Who starts or signals a runner: the options ``run``/``--kill`` carry
    (`nodewarden.ssh.protocol.owner_options`)."""

    dispatcher_id: str
    uid: str | None = None
    fence: int | None = None


class RunnerControl:
    """Starts, signals and asks about runners through the node's kept-alive connection."""

    def __init__(self, connections: Connections) -> None:
        self._connections = connections

    async def start(
        self,
        target: SshTarget,
        config: Mapping[str, Any],
        *,
        owner: RunnerOwner | None = None,
        guard: Guard | None = None,
    ) -> RunnerStarted:
        """``RUNNER run --detach`` with ``config`` (ContainerDispatch spec, wire form) on
        stdin and the `owner` options; `guard` is called right before the command is sent
        (NotSent when it raises NotLeader); FenceRejected when the runner refuses the token."""
        uuid = self._valid_uuid(target, config.get("uuid"))
        options = self._owner_options(target, owner)
        command = " ".join([self._connections.settings.runner_command, "run", "--detach", *options])
        out = await self._connections.exec(
            target,
            "runner-start",
            command,
            input=json.dumps(dict(config), sort_keys=True),
            guard=guard,
        )
        self._refused(target, "runner start", out)
        pid = parsed(target, parse_runner_pid, out.stdout)
        logger.info(
            "runner started",
            extra={"ssh_node": target.node, "container_uuid": uuid, "runner_pid": pid},
        )
        return RunnerStarted(
            node=target.node,
            uuid=uuid,
            pid=pid,
            observed_at=out.started_at,
            source=source(target, command),
        )

    async def kill(
        self,
        target: SshTarget,
        uuid: str,
        signal: str | int = "TERM",
        *,
        owner: RunnerOwner | None = None,
        guard: Guard | None = None,
    ) -> None:
        """``RUNNER --kill SIGNAL UUID`` (+ the `owner` options); succeeds also when the
        runner is already gone. `guard` and the errors as for `start_runner`."""
        uuid = self._valid_uuid(target, uuid)
        try:
            name = signal_name(signal)
        except ValueError as exc:
            raise errors.InvalidArgument(target.node, target.address, str(exc)) from None
        options = self._owner_options(target, owner, with_uid=False)
        command = " ".join(
            [self._connections.settings.runner_command, "--kill", name, uuid, *options]
        )
        out = await self._connections.exec(target, "runner-kill", command, guard=guard)
        self._refused(target, "runner kill", out)

    def _owner_options(
        self, target: SshTarget, owner: RunnerOwner | None, with_uid: bool = True
    ) -> list[str]:
        if owner is None:
            return []
        try:
            options = owner_options(
                owner.dispatcher_id, owner.uid if with_uid else None, owner.fence
            )
        except ValueError as exc:
            raise errors.InvalidArgument(target.node, target.address, str(exc)) from None
        return [shlex.quote(o) for o in options]

    def _refused(self, target: SshTarget, purpose: str, out: Output) -> None:
        if out.exit_status == 0:
            return
        if out.exit_status == RUNNER_FENCED:
            raise errors.FenceRejected(
                target.node, target.address, purpose, out.exit_status, hint(out.stderr)
            )
        raise errors.CommandFailed(
            target.node, target.address, purpose, out.exit_status, hint(out.stderr)
        )

    async def status(self, target: SshTarget, uuid: str) -> RunnerOutcome:
        """``RUNNER --status UUID``: running, or how the container ended."""
        uuid = self._valid_uuid(target, uuid)
        command = f"{self._connections.settings.runner_command} --status {uuid}"
        out = await self._connections.exec(target, "runner-status", command)
        if out.exit_status != 0:
            raise errors.CommandFailed(
                target.node, target.address, "runner status", out.exit_status, hint(out.stderr)
            )
        try:
            state, pid, exit_code, sig = parse_runner_status(out.stdout, uuid)
            dispatcher_id, uid = parse_runner_owner(out.stdout)
        except OutputError as exc:
            raise errors.BadOutput(target.node, target.address, str(exc)) from None
        return RunnerOutcome(
            node=target.node,
            uuid=uuid,
            state=state,
            pid=pid,
            exit_code=exit_code,
            signal=sig,
            observed_at=out.started_at,
            source=source(target, command),
            dispatcher_id=dispatcher_id,
            uid=uid,
        )

    def _valid_uuid(self, target: SshTarget, uuid: object) -> str:
        if not isinstance(uuid, str) or not CONTAINER_UUID.match(uuid):
            raise errors.InvalidArgument(
                target.node, target.address, f"{uuid!r} is not a container uuid"
            )
        return uuid
