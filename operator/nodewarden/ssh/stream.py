"""The kept stream of one node: ``RUNNER --watch`` on its kept-alive connection, read as facts.

`WatchStream.facts` starts the watch command (`nodewarden.ssh.watchlines.watch_command`)
on the node's connection (`Connections.open_stream`) and yields `StreamedFacts`, the same
typed facts a probe reports (`ReadyFact`, and `RunnersFact` once the node is ready), each
stamped with the time its line arrived:

- a ``state`` line yields the new facts (``changed=True``);
- a heartbeat yields the last facts again with a new ``observed_at`` (``changed=False``):
  the evidence is as fresh as the line, though nothing changed.

It ends by raising: `WatchUnsupported` when the runner program has no ``--watch`` (it
exits, whatever its status, or prints something other than a v1 line, before its first
line: an older runner may ignore the option and exit 0);
`StreamStopped` when the channel closes or no line arrives for ``3 x heartbeat``
(`STALL_HEARTBEATS`); any other `SshError` of the connection. After it stops, nothing
refreshes the facts: they age by the usual freshness rules. Reconnecting is the caller's
choice (`nodewarden.pool.probes`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import datetime

import asyncssh

import nodewarden.ssh.errors as errors
from nodewarden.ssh.connection import Connections
from nodewarden.ssh.credentials import SshTarget
from nodewarden.ssh.facts import ReadyFact, RunnersFact
from nodewarden.ssh.link import LOGGER_NAME, source
from nodewarden.ssh.parsing import OutputError
from nodewarden.ssh.watchlines import WatchHeartbeat, WatchState, parse_watch_line, watch_command

logger = logging.getLogger(LOGGER_NAME)

STALL_HEARTBEATS = 3
"""Heartbeat intervals without a line after which a stream counts as stopped."""


class WatchUnsupported(errors.SshError):
    """The node's runner program has no ``--watch`` (an older one): use the command probes."""


class StreamStopped(errors.SshError):
    """The watch stream ended: its channel closed, or its heartbeats stopped."""


@dataclass(frozen=True, slots=True)
class StreamedFacts:
    """What one line of the watch stream says about the node, as of its arrival."""

    ready: ReadyFact
    runners: RunnersFact | None
    """None while the node is not ready (as in a probe: its runners are not listed)."""
    changed: bool
    """False for a heartbeat: the previous facts, observed again."""

    @property
    def observed_at(self) -> datetime:
        return self.ready.observed_at


def facts_of(
    state: WatchState, node: str, where: str, at: datetime, *, changed: bool = True
) -> StreamedFacts:
    """The facts a ``state`` line states, observed `at` (pure)."""
    ready = ReadyFact(
        node=node,
        state="Ready" if state.ready else "Booting",
        exit_status=0 if state.ready else 1,
        detail=state.detail,
        observed_at=at,
        source=where,
    )
    runners = (
        RunnersFact(
            node=node, runners=state.runners, observed_at=at, source=where, broken=state.broken
        )
        if state.ready
        else None
    )
    return StreamedFacts(ready=ready, runners=runners, changed=changed)


def refreshed(facts: StreamedFacts, at: datetime) -> StreamedFacts:
    """The same facts observed again `at` (a heartbeat; pure)."""
    ready = dataclasses.replace(facts.ready, observed_at=at)
    runners = (
        dataclasses.replace(facts.runners, observed_at=at) if facts.runners is not None else None
    )
    return StreamedFacts(ready=ready, runners=runners, changed=False)


class WatchStream:
    """Runs the watch command of a node and reads its lines as facts."""

    def __init__(
        self,
        connections: Connections,
        clock: Callable[[], datetime],
    ) -> None:
        self._connections = connections
        self._clock = clock

    async def facts(self, target: SshTarget, heartbeat: float) -> AsyncIterator[StreamedFacts]:
        """The node's facts as its watch command pushes them (see the module)."""
        settings = self._connections.settings
        command = watch_command(settings.runner_command, heartbeat)
        where = source(target, command)
        stats = self._connections.stats
        process = await self._connections.open_stream(target, "watch", command)
        last: StreamedFacts | None = None
        try:
            while True:
                try:
                    async with asyncio.timeout(heartbeat * STALL_HEARTBEATS):
                        line = await process.stdout.readline()
                except TimeoutError:
                    raise StreamStopped(
                        target.node,
                        target.address,
                        f"no watch line for {heartbeat * STALL_HEARTBEATS:g}s",
                    ) from None
                except (asyncssh.Error, OSError):
                    raise StreamStopped(
                        target.node, target.address, "the watch channel was lost"
                    ) from None
                at = self._clock()
                if not line:
                    await self._ended(target, process, first=last is None)
                stats.stream_lines += 1
                try:
                    parsed = parse_watch_line(line)
                except OutputError as exc:
                    if last is None:
                        raise WatchUnsupported(
                            target.node, target.address, f"the runner's --watch: {exc}"
                        ) from None
                    raise errors.BadOutput(target.node, target.address, str(exc)) from None
                if isinstance(parsed, WatchState):
                    last = facts_of(parsed, target.node, where, at)
                    yield last
                elif isinstance(parsed, WatchHeartbeat) and last is not None:
                    last = refreshed(last, at)
                    yield last
        finally:
            process.close()

    async def _ended(
        self, target: SshTarget, process: asyncssh.SSHClientProcess[str], *, first: bool
    ) -> None:
        """The watch's output ended: unsupported (it failed before its first line) or
        stopped. Always raises."""
        status: int | None = None
        try:
            async with asyncio.timeout(self._connections.settings.command_timeout):
                completed = await process.wait()
            status = completed.exit_status
        except (TimeoutError, asyncssh.Error, OSError):
            pass
        if first and status is not None:
            raise WatchUnsupported(
                target.node, target.address, f"the runner's --watch exited {status}"
            )
        raise StreamStopped(target.node, target.address, f"the watch command ended (exit {status})")
