"""`StubWorker`: one fake worker node, a real asyncssh server on its own 127.0.0.1 port.

Each worker owns one listening socket. Every accepted connection is handed either to a
fresh asyncssh server connection (built from options prepared once at `start()`, so a
connection costs no option parsing) or, under the hang fault, to a protocol that
accepts TCP and never says a word. Commands are answered in-process by `_dispatch`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import shlex
import socket
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

import asyncssh

from nodewarden.ssh.protocol import (
    BUSCTL_LIST_INHIBITORS,
    DEFAULT_INSTANCE_SECRET_COMMAND,
    DISPATCHER_ID,
    INSTANCE_SECRET_PATH,
    OBJECT_UID,
    signal_name,
)
from nodewarden.ssh.watchlines import heartbeat_line, state_line
from nodewarden_doubles.stubworker import render
from nodewarden_doubles.stubworker.config import StubFaults, StubWorkerConfig
from nodewarden_doubles.stubworker.runner import FakeRunner, RunnerRefused

logger = logging.getLogger(__name__)

_POWEROFF_COMMANDS = frozenset({"poweroff", "systemctl poweroff", "sudo systemctl poweroff"})
UPTIME_COMMAND = "cat /proc/uptime"
PRODUCT_UUID_PATH = "/sys/class/dmi/id/product_uuid"
_PRODUCT_UUID_COMMANDS = (f"cat {PRODUCT_UUID_PATH}", f"sudo -n cat {PRODUCT_UUID_PATH}")
_COMMAND_LOG_SIZE = 1000


def _without_sudo(argv: list[str]) -> list[str]:
    if argv[:1] == ["sudo"]:
        return argv[2:] if argv[1:2] == ["-n"] else argv[1:]
    return argv


_OPTION_NAMES = {"--dispatcher-id": "dispatcher_id", "--uid": "uid", "--fence": "fence"}


def _owner_options(args: list[str]) -> dict[str, Any] | None:
    """``--dispatcher-id ID --uid UID --fence N`` (any subset, any order) as keyword
    arguments of the runner; None for anything else (a usage error)."""
    if len(args) % 2:
        return None
    out: dict[str, Any] = {}
    for flag, value in zip(args[::2], args[1::2], strict=True):
        key = _OPTION_NAMES.get(flag)
        if key is None or key in out:
            return None
        if key == "fence":
            if not value.isdigit():
                return None
            out[key] = int(value)
        elif (key == "dispatcher_id" and not DISPATCHER_ID.match(value)) or (
            key == "uid" and not OBJECT_UID.match(value)
        ):
            return None
        else:
            out[key] = value
    return out


def _heartbeat_option(args: list[str]) -> float | None:
    """``[--heartbeat N]`` of ``--watch`` (default 10 s); None for a usage error."""
    if not args:
        return 10.0
    if len(args) != 2 or args[0] != "--heartbeat":
        return None
    try:
        seconds = float(args[1])
    except ValueError:
        return None
    return seconds if seconds > 0 else None


class _SilentProtocol(asyncio.Protocol):
    """Accepts a TCP connection and never answers (the hang-on-connect fault)."""

    def __init__(self, registry: set[asyncio.Transport]) -> None:
        self._registry = registry
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        self._registry.add(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._transport is not None:
            self._registry.discard(self._transport)


class _FreezeGate(asyncio.Protocol):
    """Sits between the socket and an SSH connection; while the node is frozen, incoming
    bytes are held (not read), as on a node that stopped responding with TCP still up."""

    def __init__(self, inner: asyncio.Protocol, worker: StubWorker) -> None:
        self._inner = inner
        self._worker = worker
        self._held: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self._worker.faults.freeze:
            self._held.append(data)
            return
        held, self._held = self._held, []
        for chunk in (*held, data):
            self._inner.data_received(chunk)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()


class _StubSshServer(asyncssh.SSHServer):
    """Per-connection auth policy: the configured public keys, unless auth is refused."""

    def __init__(self, worker: StubWorker) -> None:
        self._worker = worker
        self._conn: asyncssh.SSHServerConnection | None = None

    def connection_made(self, conn: asyncssh.SSHServerConnection) -> None:
        self._conn = conn
        self._worker._connections.add(conn)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._conn is not None:
            self._worker._connections.discard(self._conn)

    def begin_auth(self, username: str) -> bool:
        return True

    def public_key_auth_supported(self) -> bool:
        return True

    def validate_public_key(self, username: str, key: asyncssh.SSHKey) -> bool:
        self._worker.auth_attempts += 1
        if self._worker.faults.refuse_auth:
            return False
        return key in self._worker._authorized


class StubWorker:
    """A fake worker node reachable over real SSH on 127.0.0.1 (see the package docstring)."""

    def __init__(
        self,
        config: StubWorkerConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
        on_poweroff: Callable[[StubWorker], None] | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.config = config
        self._clock = clock
        self._on_poweroff = on_poweroff
        self._rng = random.Random(config.seed)  # fault injection, not crypto
        self._host_key = config.host_key or asyncssh.generate_private_key("ssh-ed25519")
        self._wrong_key: asyncssh.SSHKey | None = None
        self._authorized = {asyncssh.import_public_key(k) for k in config.authorized_keys}
        self.runner = FakeRunner(
            self._rng,
            clock,
            crash_rate=lambda: self.faults.runner_crash_rate,
            start_failure_rate=lambda: self.faults.runner_start_failure_rate,
        )
        self._server: asyncio.AbstractServer | None = None
        self._options: asyncssh.SSHServerConnectionOptions | None = None
        self._wrong_options: asyncssh.SSHServerConnectionOptions | None = None
        self._connections: set[asyncssh.SSHServerConnection] = set()
        self._silent: set[asyncio.Transport] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._booted_at: float | None = None
        self.port: int | None = None
        self.powered_off = False
        self.lost_containers: list[str] = []
        """uuids of the containers that were running when the node last lost power."""
        self.auth_attempts = 0
        self.connections_accepted = 0
        self.commands: deque[str] = deque(maxlen=_COMMAND_LOG_SIZE)
        self._sleep = sleep
        """How ``--watch`` waits (the heartbeat and a container's end): a test's fake time."""
        self._changed = asyncio.Event()
        self._watches: set[asyncssh.SSHServerProcess[str]] = set()
        self.watch_lines = 0
        """Lines printed by ``--watch`` commands (state and heartbeat)."""
        self.watch_heartbeats = 0

    # ---------------------------------------------------------------- identity

    @property
    def faults(self) -> StubFaults:
        return self.config.faults

    @property
    def host_public_key(self) -> str:
        """The node's genuine host public key ('ssh-ed25519 AAAA...')."""
        return self._host_key.export_public_key("openssh").decode().strip()

    @property
    def host_key_fingerprint(self) -> str:
        return self._host_key.get_fingerprint()

    def known_hosts_line(self, host: str = "127.0.0.1", port: int | None = None) -> str:
        """A known_hosts line trusting this worker's genuine key for host:port."""
        port = self.port if port is None else port
        pattern = host if port == 22 else f"[{host}]:{port}"
        return f"{pattern} {self.host_public_key}"

    @property
    def running(self) -> bool:
        return self._server is not None

    # --------------------------------------------------------------- lifecycle

    async def start(self, port: int = 0, *, booted_at: float | None = None) -> int:
        """Boot the node: listen on 127.0.0.1 and return the port.

        A restarted worker reuses its previous port unless ``port`` says otherwise.
        ``booted_at`` (a time of the worker's clock, default now) is when the node's OS
        started: the boot delay of the ready command and ``/proc/uptime`` count from it,
        so a listener restarted without a reboot (side-node faults) keeps both.
        """
        if self._server is not None:
            assert self.port is not None
            return self.port
        if port == 0 and self.port is not None:
            port = self.port
        if self._options is None:
            self._options = self._server_options(self._host_key)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("127.0.0.1", port))
            sock.listen(128)
            sock.setblocking(False)
            loop = asyncio.get_running_loop()
            self._server = await loop.create_server(self._new_protocol, sock=sock)
        except BaseException:
            sock.close()
            raise
        self.port = sock.getsockname()[1]
        self._booted_at = self._clock() if booted_at is None else booted_at
        self.powered_off = False
        logger.debug("stub worker started", extra={"stub": self.config.name, "port": self.port})
        return self.port

    async def stop(self) -> None:
        """Drop off the network: close the listener and every connection (open or hung)."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for conn in list(self._connections):
            conn.abort()
        for transport in list(self._silent):
            transport.abort()
        self._connections.clear()
        self._silent.clear()
        if server is not None:
            await server.wait_closed()

    async def power_off(self) -> None:
        """What 'poweroff' does: stop, forget running containers, tell the owner."""
        await self.lose_power()
        if self._on_poweroff is not None:
            self._on_poweroff(self)

    async def lose_power(self) -> None:
        """The power is cut from outside (BMC, PSU): stop and forget running containers,
        without telling the owner (who cut it)."""
        self.lost_containers = [c.uuid for c in self.runner.running()]
        self.runner.reboot()
        self.powered_off = True
        await self.stop()

    @property
    def uptime(self) -> float | None:
        """Seconds since the node booted (None while it is not running)."""
        if self._booted_at is None or self._server is None:
            return None
        return max(0.0, self._clock() - self._booted_at)

    @property
    def booted(self) -> bool:
        """True once the boot delay has passed (and the node is not broken)."""
        if self._booted_at is None or self.faults.broken_ready:
            return False
        return self._clock() - self._booted_at >= self.config.boot_delay

    # ------------------------------------------------------------------- watch

    def notify_change(self) -> None:
        """Wake every ``--watch``: the runner list or ready state may have changed (called
        by ``run``/``--kill``; a test that moves the clock past a boot calls it too)."""
        self._changed.set()

    def end_watches(self) -> None:
        """Close the channel of every running ``--watch`` (the watch process was killed)."""
        for process in list(self._watches):
            process.close()

    @property
    def watching(self) -> int:
        """How many ``--watch`` commands are running."""
        return len(self._watches)

    def _watch_state(self) -> str:
        if self.booted:
            ready, detail = True, "running"
        else:
            ready, detail = False, "degraded" if self.faults.broken_ready else "starting"
        runners = [c.list_line() for c in self.runner.running()]
        return state_line(ready, detail, self.faults.runner_broken, runners)

    def _next_due(self) -> float | None:
        """Seconds (the worker's clock) until the state changes by itself, if it will."""
        now = self._clock()
        dues = []
        end = self.runner.next_end()
        if end is not None:
            dues.append(end - now)
        if self._booted_at is not None and not self.booted and not self.faults.broken_ready:
            dues.append(self._booted_at + self.config.boot_delay - now)
        return max(0.0, min(dues)) if dues else None

    async def _watch(self, heartbeat: float, process: asyncssh.SSHServerProcess[str]) -> None:
        """``RUNNER --watch``: the state at once and on every change, heartbeats between."""
        self._watches.add(process)
        closed = asyncio.ensure_future(process.wait_closed())
        try:
            last = self._watch_state()
            self._write_watch(process, last)
            while not closed.done():
                due = self._next_due()
                timeout = heartbeat if due is None else min(heartbeat, due)
                woken = await self._watch_wait(timeout, closed)
                if closed.done():
                    return
                if self.faults.watch_silent:
                    continue
                state = self._watch_state()
                if state != last:
                    last = state
                    self._write_watch(process, state)
                elif not woken and timeout == heartbeat:
                    self.watch_heartbeats += 1
                    self._write_watch(process, heartbeat_line())
        finally:
            self._watches.discard(process)
            closed.cancel()

    def _write_watch(self, process: asyncssh.SSHServerProcess[str], line: str) -> None:
        self.watch_lines += 1
        process.stdout.write(line)

    async def _watch_wait(self, seconds: float, closed: asyncio.Future[None]) -> bool:
        """Wait `seconds`, a change, or the channel's close; True if a change woke it."""
        changed = asyncio.ensure_future(self._changed.wait())
        slept = asyncio.ensure_future(self._sleep(seconds))
        try:
            await asyncio.wait((changed, slept, closed), return_when=asyncio.FIRST_COMPLETED)
        finally:
            changed.cancel()
            slept.cancel()
        if self._changed.is_set():
            self._changed = asyncio.Event()  # every watch holds the old one until it wakes
            return True
        return changed.done() and not changed.cancelled()

    # ------------------------------------------------------------------ server

    def _server_options(self, host_key: asyncssh.SSHKey) -> asyncssh.SSHServerConnectionOptions:
        return asyncssh.SSHServerConnectionOptions(
            server_host_keys=[host_key],
            server_factory=lambda: _StubSshServer(self),
            process_factory=self._handle,
            encoding="utf-8",
            allow_scp=False,
            sftp_factory=None,
            agent_forwarding=False,
            x11_forwarding=False,
            login_timeout=30,
        )

    def _new_protocol(self) -> asyncio.BaseProtocol:
        self.connections_accepted += 1
        if self.faults.hang_connect or self.faults.freeze:
            return _SilentProtocol(self._silent)
        if self.faults.wrong_host_key:
            if self._wrong_options is None:
                self._wrong_key = asyncssh.generate_private_key("ssh-ed25519")
                self._wrong_options = self._server_options(self._wrong_key)
            options = self._wrong_options
        else:
            assert self._options is not None
            options = self._options
        return _FreezeGate(asyncssh.SSHServerConnection(asyncio.get_running_loop(), options), self)

    async def _handle(self, process: asyncssh.SSHServerProcess[str]) -> None:
        command = process.command or ""
        self.commands.append(command)
        try:
            if self.faults.hang_commands:
                await process.wait_closed()
                return
            if self.faults.command_delay:
                await asyncio.sleep(self.faults.command_delay)
            status, out, err = await self._dispatch(command, process)
            if out:
                process.stdout.write(out)
            if err:
                process.stderr.write(err)
            process.exit(status)
        except (asyncssh.Error, OSError):
            process.close()

    async def _dispatch(
        self, command: str, process: asyncssh.SSHServerProcess[str]
    ) -> tuple[int, str, str]:
        config = self.config
        if command in config.extra_commands:
            return config.extra_commands[command]
        if command == config.ready_command:
            if self.booted:
                return 0, "running\n", ""
            return 1, ("degraded\n" if self.faults.broken_ready else "starting\n"), ""
        if command == DEFAULT_INSTANCE_SECRET_COMMAND:
            if config.instance_secret is None:
                return 1, "", f"cat: {INSTANCE_SECRET_PATH}: No such file or directory\n"
            return 0, config.instance_secret.get_secret_value() + "\n", ""
        if command == BUSCTL_LIST_INHIBITORS:
            if not config.busctl_available:
                return 1, "", "Failed to connect to bus: No such file or directory\n"
            return 0, render.busctl_inhibitors(config.inhibitors), ""
        if command == config.telemetry_command or command == "cat /proc/loadavg":
            out = render.loadavg(config.load, len(self.runner.running()), 2000)
            if command == config.telemetry_command and config.gpu_utilisation is not None:
                out += render.gpu_lines(config.gpu_utilisation)
            return 0, out, ""
        if command == UPTIME_COMMAND:
            return 0, render.proc_uptime(self.uptime or 0.0), ""
        if command in _PRODUCT_UUID_COMMANDS:
            if config.product_uuid is None:
                return 1, "", f"cat: {PRODUCT_UUID_PATH}: Permission denied\n"
            return 0, config.product_uuid + "\n", ""
        if command in _POWEROFF_COMMANDS:
            self._spawn(self._delayed_power_off())
            return 0, "", ""
        try:
            argv = shlex.split(command)
        except ValueError:
            return 2, "", "sh: syntax error\n"
        if not argv:
            return 0, "", ""
        argv = _without_sudo(argv)
        runner_argv = _without_sudo(shlex.split(config.runner_command))
        if argv[: len(runner_argv)] == runner_argv:
            return await self._runner(argv[len(runner_argv) :], process)
        return self._builtin(argv)

    def _builtin(self, argv: list[str]) -> tuple[int, str, str]:
        config = self.config
        name, args = argv[0], argv[1:]
        if name == "systemd-inhibit" and "--list" in args:
            return 0, render.systemd_inhibit_list(config.inhibitors), ""
        if name == "ethtool" and len(args) == 1:
            if args[0] != config.interface:
                return 1, "", "netlink error: no device matches name (offset 24)\n"
            text = render.ethtool(
                config.interface,
                config.wol_supported,
                config.wol_enabled,
                self.faults.ethtool_permission_denied,
            )
            return 0, text, ""
        if name == "true":
            return 0, "", ""
        if name == "false":
            return 1, "", ""
        if name == "echo":
            return 0, " ".join(args) + "\n", ""
        return 127, "", f"sh: 1: {name}: not found\n"

    async def _runner(
        self, args: list[str], process: asyncssh.SSHServerProcess[str]
    ) -> tuple[int, str, str]:
        runner = self.runner
        usage = (
            2,
            "",
            "usage: runner run --detach [OPTIONS] | --list | --kill SIGNAL UUID [OPTIONS] "
            "| --status UUID | --watch [--heartbeat N] "
            "(OPTIONS: --dispatcher-id ID --uid UID --fence N)\n",
        )
        if args[:1] == ["--watch"] and self.config.watch_supported:
            heartbeat = _heartbeat_option(args[1:])
            if heartbeat is None:
                return usage
            await self._watch(heartbeat, process)
            return 0, "", ""
        if args[:2] == ["run", "--detach"]:
            config_text = await process.stdin.read()  # first: the client is sending it
            options = _owner_options(args[2:])
            if options is None:
                return usage
            try:
                pid = runner.start(config_text, **options)
            except RunnerRefused as exc:
                return exc.exit_status, "", f"{exc}\n"
            self.notify_change()
            return 0, f"{pid}\n", ""
        if args == ["--list"]:
            lines = "".join(f"{c.list_line()}\n" for c in runner.running())
            if self.faults.runner_broken:
                lines += "broken\n"
            return 0, lines, ""
        if len(args) >= 3 and args[0] == "--kill":
            options = _owner_options(args[3:])
            if options is None or "uid" in options:
                return usage
            try:
                runner.kill(args[2], signal_name(args[1]), **options)
            except RunnerRefused as exc:
                return exc.exit_status, "", f"{exc}\n"
            except ValueError as exc:
                return 2, "", f"{exc}\n"
            self.notify_change()
            return 0, "", ""
        if len(args) == 2 and args[0] == "--status":
            return 0, json.dumps(runner.status(args[1])) + "\n", ""
        return usage

    async def _delayed_power_off(self) -> None:
        await asyncio.sleep(self.config.poweroff_delay)
        await self.power_off()

    def _spawn(self, coro: Any) -> None:
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def __repr__(self) -> str:
        return (
            f"StubWorker({self.config.name!r}, port={self.port}, key={self.host_key_fingerprint})"
        )
