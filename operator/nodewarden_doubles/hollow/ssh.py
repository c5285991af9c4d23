"""The hollow fleet's SSH: a `DialerPort` whose connections answer the node contract from
the model (`HollowFleet`), under the prober's real `Connections`.

Only what `Connections` and `WatchStream` use of an asyncssh connection and process is
offered: ``create_process`` (the command runs at once against the model), ``is_closed``,
``abort`` / ``close`` / ``wait_closed``; a process's ``wait()`` and ``stdout.readline()``.
A connection dies when its node powers off or boots again (a new boot is a new SSH
server); dialling a node that is not On is `Unreachable`, as a refused TCP connect is.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shlex
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import asyncssh

from nodewarden.ssh import errors
from nodewarden.ssh.protocol import UPTIME_COMMAND
from nodewarden.ssh.settings import ProbeSettings
from nodewarden.ssh.watchlines import heartbeat_line, state_line
from nodewarden_doubles.hollow.model import HollowFleet
from nodewarden_doubles.stubworker import render
from nodewarden_doubles.stubworker.runner import RunnerRefused
from nodewarden_doubles.stubworker.server import _owner_options as owner_options

if TYPE_CHECKING:
    from nodewarden.ssh.addressing import Endpoint
    from nodewarden.ssh.credentials import SshTarget
    from nodewarden.ssh.link import NodeLink

NOT_FOUND = 127


@dataclass(frozen=True, slots=True)
class Completed:
    """What `asyncssh.SSHCompletedProcess` carries that `Connections.exec` reads."""

    exit_status: int | None
    stdout: str
    stderr: str
    exit_signal: tuple[str, bool, str, str] | None = None


class _Ended:
    """A stdout with nothing more to read (the runner printed nothing, or has exited)."""

    async def readline(self) -> str:
        return ""


class HollowProcess:
    def __init__(self, completed: Completed) -> None:
        self._completed = completed
        self.stdout = _Ended()

    async def wait(self) -> Completed:
        return self._completed

    def close(self) -> None:
        pass


class _Stream:
    """The stdout of ``RUNNER --watch``: a state line first and on every change, a
    heartbeat when nothing changed for `heartbeat` seconds, end of file once the
    connection is gone (the node powered off, rebooted or was destroyed). Woken by the
    model (`HollowFleet.wake_on_change`) and at the node's own due times (a container's
    end, readiness); nothing runs while it waits."""

    def __init__(self, connection: HollowConnection, heartbeat: float) -> None:
        self.connection = connection
        self.heartbeat = heartbeat
        self.loop = asyncio.get_running_loop()
        self.changed = asyncio.Event()
        self.last: str | None = None
        self.beat_at = self.loop.time() + heartbeat
        self.stop = connection.fleet.wake_on_change(connection.node, self._wake)

    def _wake(self) -> None:
        self.loop.call_soon_threadsafe(self.changed.set)  # the stub cloud's thread too

    def _state(self) -> str:
        fleet, name = self.connection.fleet, self.connection.node
        ready = fleet.ready(name)
        runner = fleet.node(name).runner
        lines = [c.list_line() for c in runner.running()] if runner is not None else []
        return state_line(ready, "running" if ready else "starting", False, lines)

    async def readline(self) -> str:
        while True:
            if self.connection.is_closed():
                return ""
            line = self._state()
            if line != self.last:
                self.last = line
                self.beat_at = self.loop.time() + self.heartbeat
                return line
            now = self.loop.time()
            if now >= self.beat_at:
                self.beat_at = now + self.heartbeat
                return heartbeat_line()
            wait = self.beat_at - now
            due = self.connection.fleet.due(self.connection.node)
            if due is not None:
                wait = min(wait, max(0.0, due - self.connection.fleet.clock()))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), wait)
            self.changed.clear()


class HollowStreamProcess:
    """``RUNNER --watch`` as the prober's `WatchStream` reads it."""

    def __init__(self, connection: HollowConnection, heartbeat: float) -> None:
        self.stdout = _Stream(connection, heartbeat)
        self.connection = connection

    async def wait(self) -> Completed:
        return Completed(None, "", "")  # the channel closed with the connection

    def close(self) -> None:
        self.stdout.stop()


class HollowConnection:
    """One "SSH connection" to one hollow node, for as long as that node's boot lasts."""

    def __init__(
        self, fleet: HollowFleet, node: str, actor: str | None, settings: ProbeSettings
    ) -> None:
        self.fleet = fleet
        self.node = node
        self.actor = actor
        self.settings = settings
        """The commands of the node contract as the prober sends them."""
        self.boot = fleet.node(node).boots
        self.closed = False
        self.commands = 0

    def is_closed(self) -> bool:
        if not self.closed and (
            not self.fleet.reachable(self.node) or self.fleet.node(self.node).boots != self.boot
        ):
            self.closed = True
        return self.closed

    def abort(self) -> None:
        self.closed = True

    def close(self) -> None:
        self.closed = True

    async def wait_closed(self) -> None:
        return None

    async def create_process(
        self,
        command: str,
        *,
        input: str | None = None,  # the node contract's stdin (run --detach)
        encoding: str | None = None,
        errors: str | None = None,
    ) -> HollowProcess | HollowStreamProcess:
        if self.is_closed():
            raise OSError(f"hollow node {self.node}: the connection is gone")
        self.commands += 1
        heartbeat = self._watch_heartbeat(command)
        if heartbeat is not None and self.fleet.streams:
            return HollowStreamProcess(self, heartbeat)
        return HollowProcess(self.run(command, input))

    def _watch_heartbeat(self, command: str) -> float | None:
        """The heartbeat of a ``RUNNER --watch --heartbeat N`` command (None: another)."""
        runner, argv = shlex.split(self.settings.runner_command), shlex.split(command)
        args = argv[len(runner) :] if argv[: len(runner)] == runner else []
        if args[:1] != ["--watch"]:
            return None
        try:
            return float(args[2]) if args[1:2] == ["--heartbeat"] and len(args) == 3 else 10.0
        except ValueError:
            return None

    # -- the node contract ---------------------------------------------------------

    def run(self, command: str, stdin: str | None) -> Completed:
        fleet, node = self.fleet, self.fleet.node(self.node)
        settings = self.settings
        if command == settings.ready_command:
            ready = fleet.ready(self.node)
            return Completed(0 if ready else 1, "running\n" if ready else "starting\n", "")
        if command == settings.poweroff_command:
            fleet.poweroff(self.node, self.actor)
            return Completed(0, "", "")
        if command == settings.inhibitors_command:
            return Completed(0, render.busctl_inhibitors(()), "")
        if command == UPTIME_COMMAND:
            return Completed(0, render.proc_uptime(fleet.clock() - node.on_since), "")
        if command == settings.product_uuid_command:
            return Completed(0, node.system_uuid + "\n", "")
        if command == settings.telemetry_command:
            running = len(node.runner.running()) if node.runner is not None else 0
            return Completed(0, render.loadavg((0.0, 0.0, 0.0), running, 1000), "")
        runner = shlex.split(settings.runner_command)
        argv = shlex.split(command)
        if argv[: len(runner)] == runner:
            return self._runner(argv[len(runner) :], stdin)
        return Completed(NOT_FOUND, "", f"{argv[0] if argv else command}: command not found\n")

    def _runner(self, args: list[str], stdin: str | None) -> Completed:
        runner = self.fleet.node(self.node).runner
        assert runner is not None
        if args == ["--list"]:
            return Completed(0, "".join(c.list_line() + "\n" for c in runner.running()), "")
        if args[:1] == ["--status"] and len(args) == 2:
            return Completed(0, json.dumps(runner.status(args[1])) + "\n", "")
        if args[:1] == ["--watch"]:
            return Completed(2, "", "unknown option --watch\n")  # an older runner
        try:
            if args[:2] == ["run", "--detach"]:
                options = owner_options(args[2:])
                if options is None:
                    return Completed(2, "", "usage: run --detach [owner options]\n")
                try:
                    pid = runner.start(stdin or "", **options)
                except RunnerRefused:
                    self.fleet.record_runner(self.node, "runner:run", self.actor, False)
                    raise
                self.fleet.record_runner(self.node, "runner:run", self.actor, True)
                return Completed(0, f"{pid}\n", "")
            if args[:1] == ["--kill"] and len(args) >= 3:
                options = owner_options(args[3:])
                if options is None or "uid" in options:
                    return Completed(2, "", "usage: --kill SIGNAL UUID [owner options]\n")
                try:
                    runner.kill(args[2], args[1], **options)
                except RunnerRefused:
                    self.fleet.record_runner(self.node, "runner:kill", self.actor, False)
                    raise
                self.fleet.record_runner(self.node, "runner:kill", self.actor, True)
                return Completed(0, "", "")
        except RunnerRefused as exc:
            return Completed(exc.exit_status, "", f"{exc}\n")
        return Completed(2, "", f"usage: unknown runner arguments {args!r}\n")


class HollowDialer:
    """`nodewarden.ssh.connection.DialerPort` for hollow nodes: `actor` names the replica
    whose prober this is (recorded with every power action and runner command)."""

    def __init__(self, fleet: HollowFleet, actor: str | None = None) -> None:
        self.fleet = fleet
        self.actor = actor
        self.opened = 0

    async def open(
        self, target: SshTarget, endpoint: Endpoint, link: NodeLink, settings: ProbeSettings
    ) -> asyncssh.SSHClientConnection:
        node = target.node
        if node not in self.fleet.nodes or not self.fleet.reachable(node):
            raise errors.Unreachable(node, target.address, "hollow node is not on")
        connection = HollowConnection(self.fleet, node, self.actor, settings)
        self.opened += 1
        # the parts of an asyncssh connection that `Connections` uses (see the module)
        return cast(asyncssh.SSHClientConnection, connection)
