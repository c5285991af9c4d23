"""The SSH prober: one kept-alive asyncssh connection per node, probes as typed facts, runner control.

Connection life cycle, per node (keyed by `SshTarget.node`):

1. Resolve the node's logical address through the `AddressResolver` (refusals raise
   `HostNotAllowed`; the default resolver allows loopback only).
2. TCP connect within ``connect_timeout`` (`Unreachable`, `ConnectTimeout`).
3. SSH handshake and public-key login within ``login_timeout`` (`LoginTimeout`,
   `AuthFailed`). The host key must be one of the trusted keys (known_hosts text, or a key
   pinned by an earlier trust-on-first-use) — otherwise `HostKeyMismatch` and nothing runs.
   Under `InstanceSecretTrust` with no pinned key, the presented key is held provisionally
   and the only command run is the instance-secret proof; on success the key is pinned and
   reported as `LearnedHostKey`, on failure `InstanceSecretNotProven` and the connection
   is closed.
4. Commands run on channels of that connection (at most ``max_sessions_per_connection`` at
   once) within ``command_timeout``. A timeout or a drop discards the connection; the next
   call reconnects. A kept-alive connection found dead when opening a channel is replaced
   once, transparently (the command had not started).

Probing calls (`probe`, `check_ready`, `list_runners`, `inhibitors`, `wake_on_lan`,
`telemetry`) each take one slot of the shared `ProbeThrottle`; runner control and
power-off are actions and are not throttled.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import shlex
import socket
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncssh

from nodewarden.fence import NotLeader
from nodewarden.ssh import errors
from nodewarden.ssh.addressing import (
    AddressResolver,
    Endpoint,
    LoopbackOnlyResolver,
    ResolutionRefused,
)
from nodewarden.ssh.credentials import (
    InstanceSecretTrust,
    KnownHostKeys,
    SshTarget,
    TrustedKeys,
)
from nodewarden.ssh.facts import (
    HostUuidFact,
    InhibitorsFact,
    LearnedHostKey,
    PoweroffRequested,
    ProbeReport,
    ReadyFact,
    RunnerOutcome,
    RunnersFact,
    RunnerStarted,
    TelemetryFact,
    UptimeFact,
    WakeOnLanFact,
)
from nodewarden.ssh.parsing import (
    OutputError,
    WakeOnLanUnreadable,
    parse_busctl_inhibitors,
    parse_ethtool_wol,
    parse_product_uuid,
    parse_runner_list,
    parse_runner_owner,
    parse_runner_pid,
    parse_runner_status,
    parse_systemd_inhibit_list,
    parse_telemetry,
    parse_uptime,
    runner_list_says_broken,
)
from nodewarden.ssh.protocol import (
    CONTAINER_UUID,
    INTERFACE_NAME,
    RUNNER_FENCED,
    UPTIME_COMMAND,
    owner_options,
    signal_name,
)
from nodewarden.ssh.settings import ProbeSettings
from nodewarden.ssh.throttle import ProbeThrottle

logger = logging.getLogger(__name__)

HostKeyRecorder = Callable[[LearnedHostKey], Awaitable[None]]
"""Called once per learned host key, so the caller can record it (e.g. in a Secret)."""


Guard = Callable[[], object]
"""Called right before a command is sent; raises `nodewarden.fence.NotLeader` to stop it."""


@dataclass(frozen=True, slots=True)
class RunnerOwner:
    """Who starts or signals a runner: the options ``run``/``--kill`` carry
    (`nodewarden.ssh.protocol.owner_options`)."""

    dispatcher_id: str
    uid: str | None = None
    fence: int | None = None


def _utcnow() -> datetime:
    return datetime.now(tz=UTC)


class _HostKeyGate(asyncssh.SSHClient):
    """Sees every host key asyncssh could not match against the trusted keys.

    Returns True (provisional trust) only in trust-on-first-use mode, where the caller then
    runs the instance-secret proof before anything else; otherwise the key is refused.
    """

    def __init__(self, provisional: bool) -> None:
        self._provisional = provisional
        self.presented: asyncssh.SSHKey | None = None
        self.accepted_provisionally = False

    def validate_host_public_key(
        self, host: str, addr: str, port: int, key: asyncssh.SSHKey
    ) -> bool:
        self.presented = key
        self.accepted_provisionally = self._provisional
        return self._provisional


@dataclass(slots=True)
class _Output:
    exit_status: int | None
    exit_signal: str | None
    stdout: str
    stderr: str
    started_at: datetime


@dataclass(slots=True)
class _NodeLink:
    """The kept-alive connection of one node and what it was opened with."""

    node: str
    sessions: asyncio.Semaphore
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    conn: asyncssh.SSHClientConnection | None = None
    endpoint: Endpoint | None = None
    identity: tuple[str, ...] = ()
    pinned_key: asyncssh.SSHKey | None = None
    unreported_learned: LearnedHostKey | None = None
    connect_attempts_done: int = 0
    last_connect_error: errors.SshError | None = None


@dataclass(slots=True)
class ProberStats:
    """Counters for benchmarks and metrics."""

    connects: int = 0
    connect_failures: int = 0
    commands: int = 0
    command_timeouts: int = 0
    stale_reconnects: int = 0
    host_key_refusals: int = 0
    host_keys_learned: int = 0


class SshProber:
    """Probes nodes and controls their runners over kept-alive SSH connections."""

    def __init__(
        self,
        settings: ProbeSettings | None = None,
        *,
        resolver: AddressResolver | None = None,
        throttle: ProbeThrottle | None = None,
        clock: Callable[[], datetime] = _utcnow,
        on_host_key_learned: HostKeyRecorder | None = None,
    ) -> None:
        self.settings = settings or ProbeSettings()
        self.resolver: AddressResolver = resolver or LoopbackOnlyResolver()
        self.throttle = throttle or ProbeThrottle()
        self._clock = clock
        self._on_learned = on_host_key_learned
        self._links: dict[str, _NodeLink] = {}
        self.stats = ProberStats()

    # ------------------------------------------------------------------ probes

    async def probe(
        self,
        target: SshTarget,
        *,
        inhibitors: bool = False,
        telemetry: bool = False,
        uptime: bool = False,
        host_uuid: bool = False,
    ) -> ProbeReport:
        """Ready probe; if ready, the runner list (and inhibitors/telemetry/uptime/the host's
        product UUID when asked).

        Takes one throttle slot for the whole bundle.
        """
        await self.throttle.acquire()
        started = self._clock()
        ready = await self._ready(target)
        runners: RunnersFact | None = None
        inhibitor_fact: InhibitorsFact | None = None
        telemetry_fact: TelemetryFact | None = None
        uptime_fact: UptimeFact | None = None
        uuid_fact: HostUuidFact | None = None
        if ready.ready:
            runners_job = asyncio.ensure_future(self._runners(target))
            inhibitors_job = asyncio.ensure_future(self._inhibitors(target)) if inhibitors else None
            telemetry_job = asyncio.ensure_future(self._telemetry(target)) if telemetry else None
            uptime_job = asyncio.ensure_future(self._uptime(target)) if uptime else None
            uuid_job = asyncio.ensure_future(self._host_uuid(target)) if host_uuid else None
            jobs: list[asyncio.Future[Any]] = [
                j
                for j in (runners_job, inhibitors_job, telemetry_job, uptime_job, uuid_job)
                if j is not None
            ]
            try:
                await asyncio.wait(jobs)
            finally:
                for job in jobs:
                    job.cancel()  # no-op once done; stops stragglers if we were cancelled
            failures = [e for e in (job.exception() for job in jobs) if e is not None]
            if failures:  # every part has finished; report the first failure
                raise failures[0]
            runners = runners_job.result()
            inhibitor_fact = inhibitors_job.result() if inhibitors_job else None
            telemetry_fact = telemetry_job.result() if telemetry_job else None
            uptime_fact = uptime_job.result() if uptime_job else None
            uuid_fact = uuid_job.result() if uuid_job else None
        link = self._links.get(target.node)
        learned = None
        if link is not None:
            learned, link.unreported_learned = link.unreported_learned, None
        return ProbeReport(
            node=target.node,
            endpoint=target.address,
            started_at=started,
            finished_at=self._clock(),
            ready=ready,
            runners=runners,
            inhibitors=inhibitor_fact,
            telemetry=telemetry_fact,
            uptime=uptime_fact,
            host_uuid=uuid_fact,
            learned_host_key=learned,
        )

    async def check_ready(self, target: SshTarget) -> ReadyFact:
        await self.throttle.acquire()
        return await self._ready(target)

    async def list_runners(self, target: SshTarget) -> RunnersFact:
        await self.throttle.acquire()
        return await self._runners(target)

    async def inhibitors(self, target: SshTarget) -> InhibitorsFact:
        await self.throttle.acquire()
        return await self._inhibitors(target)

    async def telemetry(self, target: SshTarget) -> TelemetryFact:
        await self.throttle.acquire()
        return await self._telemetry(target)

    async def wake_on_lan(self, target: SshTarget, interface: str) -> WakeOnLanFact:
        """Wake-on-LAN support and mode of ``interface`` (from ethtool)."""
        if not INTERFACE_NAME.match(interface):
            raise errors.InvalidArgument(
                target.node, target.address, f"{interface!r} is not a network interface name"
            )
        await self.throttle.acquire()
        command = self.settings.ethtool_command.format(iface=interface)
        out = await self._exec(target, "wake-on-lan", command)
        try:
            supported, enabled = parse_ethtool_wol(out.stdout + "\n" + out.stderr)
        except WakeOnLanUnreadable:
            raise errors.WakeOnLanUnknown(
                target.node,
                target.address,
                f"ethtool cannot read the Wake-on-LAN settings of {interface} "
                "(it needs CAP_NET_ADMIN: run it as root or through sudo)",
            ) from None
        except OutputError as exc:
            if out.exit_status != 0:
                raise errors.CommandFailed(
                    target.node, target.address, "ethtool", out.exit_status, _hint(out.stderr)
                ) from None
            raise errors.BadOutput(target.node, target.address, str(exc)) from None
        if out.exit_status != 0:
            raise errors.CommandFailed(
                target.node, target.address, "ethtool", out.exit_status, _hint(out.stderr)
            )
        return WakeOnLanFact(
            node=target.node,
            interface=interface,
            supported=supported,
            enabled=enabled,
            observed_at=out.started_at,
            source=self._source(target, command),
        )

    # ------------------------------------------------------------- runner control

    async def start_runner(
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
        command = " ".join([self.settings.runner_command, "run", "--detach", *options])
        out = await self._exec(
            target,
            "runner-start",
            command,
            input=json.dumps(dict(config), sort_keys=True),
            guard=guard,
        )
        self._refused(target, "runner start", out)
        pid = self._parsed(target, parse_runner_pid, out.stdout)
        logger.info(
            "runner started",
            extra={"ssh_node": target.node, "container_uuid": uuid, "runner_pid": pid},
        )
        return RunnerStarted(
            node=target.node,
            uuid=uuid,
            pid=pid,
            observed_at=out.started_at,
            source=self._source(target, command),
        )

    async def kill_runner(
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
        command = " ".join([self.settings.runner_command, "--kill", name, uuid, *options])
        out = await self._exec(target, "runner-kill", command, guard=guard)
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

    def _refused(self, target: SshTarget, purpose: str, out: _Output) -> None:
        if out.exit_status == 0:
            return
        if out.exit_status == RUNNER_FENCED:
            raise errors.FenceRejected(
                target.node, target.address, purpose, out.exit_status, _hint(out.stderr)
            )
        raise errors.CommandFailed(
            target.node, target.address, purpose, out.exit_status, _hint(out.stderr)
        )

    async def runner_status(self, target: SshTarget, uuid: str) -> RunnerOutcome:
        """``RUNNER --status UUID``: running, or how the container ended."""
        uuid = self._valid_uuid(target, uuid)
        command = f"{self.settings.runner_command} --status {uuid}"
        out = await self._exec(target, "runner-status", command)
        if out.exit_status != 0:
            raise errors.CommandFailed(
                target.node, target.address, "runner status", out.exit_status, _hint(out.stderr)
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
            source=self._source(target, command),
            dispatcher_id=dispatcher_id,
            uid=uid,
        )

    async def poweroff(self, target: SshTarget, guard: Guard | None = None) -> PoweroffRequested:
        """Send the power-off command. Proves only that it was requested, never that it
        worked. `guard` as for `start_runner` (NotSent: nothing sent)."""
        command = self.settings.poweroff_command
        out = await self._exec(target, "poweroff", command, allow_drop=True, guard=guard)
        dropped = out.exit_status is None
        link = self._links.get(target.node)
        if link is not None and link.conn is not None:
            self._drop(link, link.conn)
        if out.exit_status not in (0, None):
            raise errors.CommandFailed(
                target.node, target.address, "poweroff", out.exit_status, _hint(out.stderr)
            )
        logger.info(
            "power-off requested over SSH",
            extra={"ssh_node": target.node, "connection_dropped": dropped},
        )
        return PoweroffRequested(
            node=target.node,
            exit_status=out.exit_status,
            connection_dropped=dropped,
            requested_at=out.started_at,
            source=self._source(target, command),
        )

    # ----------------------------------------------------------- connections

    def connected(self, node: str) -> bool:
        link = self._links.get(node)
        return link is not None and link.conn is not None and not link.conn.is_closed()

    def pinned_host_key(self, node: str) -> str | None:
        """The OpenSSH public key trusted on first use for ``node``, if any."""
        link = self._links.get(node)
        if link is None or link.pinned_key is None:
            return None
        return link.pinned_key.export_public_key("openssh").decode().strip()

    async def disconnect(self, node: str) -> None:
        """Close the node's connection (it reconnects on the next call). Keeps pinned keys."""
        link = self._links.get(node)
        if link is not None and link.conn is not None:
            conn = link.conn
            self._drop(link, conn)
            await _wait_closed(conn)

    async def forget(self, node: str) -> None:
        """Close the connection and forget everything, including a host key learned on first use."""
        await self.disconnect(node)
        self._links.pop(node, None)

    async def aclose(self) -> None:
        conns = [link.conn for link in self._links.values() if link.conn is not None]
        for link in self._links.values():
            if link.conn is not None:
                self._drop(link, link.conn)
        await asyncio.gather(*(_wait_closed(c) for c in conns))

    # ------------------------------------------------------------ internals

    async def _ready(self, target: SshTarget) -> ReadyFact:
        command = self.settings.ready_command
        out = await self._exec(target, "ready", command)
        first = out.stdout.strip().splitlines()[0] if out.stdout.strip() else ""
        return ReadyFact(
            node=target.node,
            state="Ready" if out.exit_status == 0 else "Booting",
            exit_status=out.exit_status,
            detail=first[:200],
            observed_at=out.started_at,
            source=self._source(target, command),
        )

    async def _runners(self, target: SshTarget) -> RunnersFact:
        command = f"{self.settings.runner_command} --list"
        out = await self._exec(target, "runner-list", command)
        if out.exit_status != 0:
            raise errors.CommandFailed(
                target.node, target.address, "runner list", out.exit_status, _hint(out.stderr)
            )
        runners = self._parsed(target, parse_runner_list, out.stdout)
        return RunnersFact(
            node=target.node,
            runners=runners,
            observed_at=out.started_at,
            source=self._source(target, command),
            broken=runner_list_says_broken(out.stdout),
        )

    async def _inhibitors(self, target: SshTarget) -> InhibitorsFact:
        primary_cmd = self.settings.inhibitors_command
        primary = await self._exec(target, "inhibitors", primary_cmd)
        if primary.exit_status == 0:
            try:
                found = parse_busctl_inhibitors(primary.stdout)
            except OutputError as exc:
                logger.debug(
                    "busctl inhibitor listing unusable, falling back to systemd-inhibit: %s",
                    exc,
                    extra={"ssh_node": target.node},
                )
            else:
                return InhibitorsFact(
                    node=target.node,
                    inhibitors=found,
                    via="busctl",
                    observed_at=primary.started_at,
                    source=self._source(target, primary_cmd),
                )
        fallback_cmd = self.settings.inhibitors_fallback_command
        fallback = await self._exec(target, "inhibitors-fallback", fallback_cmd)
        if fallback.exit_status != 0:
            raise errors.InhibitorsUnknown(
                target.node,
                target.address,
                f"inhibitors unknown: busctl exited {primary.exit_status}, "
                f"systemd-inhibit exited {fallback.exit_status}",
            )
        found = self._parsed(target, parse_systemd_inhibit_list, fallback.stdout)
        return InhibitorsFact(
            node=target.node,
            inhibitors=found,
            via="systemd-inhibit",
            observed_at=fallback.started_at,
            source=self._source(target, fallback_cmd),
        )

    async def _telemetry(self, target: SshTarget) -> TelemetryFact:
        command = self.settings.telemetry_command
        out = await self._exec(target, "telemetry", command)
        if out.exit_status != 0:
            raise errors.CommandFailed(
                target.node, target.address, "telemetry", out.exit_status, _hint(out.stderr)
            )
        load1, load5, load15, gpus = self._parsed(target, parse_telemetry, out.stdout)
        return TelemetryFact(
            node=target.node,
            load1=load1,
            load5=load5,
            load15=load15,
            gpus=gpus,
            sampled_at=out.started_at,
            source=self._source(target, command),
        )

    async def _uptime(self, target: SshTarget) -> UptimeFact:
        out = await self._exec(target, "uptime", UPTIME_COMMAND)
        if out.exit_status != 0:
            raise errors.CommandFailed(
                target.node, target.address, "uptime", out.exit_status, _hint(out.stderr)
            )
        seconds = self._parsed(target, parse_uptime, out.stdout)
        return UptimeFact(
            node=target.node,
            booted_at=out.started_at - timedelta(seconds=seconds),
            uptime_seconds=seconds,
            observed_at=out.started_at,
            source=self._source(target, UPTIME_COMMAND),
        )

    async def _host_uuid(self, target: SshTarget) -> HostUuidFact:
        """The DMI product UUID; a failing command is a fact ("unreadable"), not an error."""
        command = self.settings.product_uuid_command
        out = await self._exec(target, "product-uuid", command)
        source = self._source(target, command)
        if out.exit_status != 0:
            problem = f"exit {out.exit_status}: {_hint(out.stderr)}"
            return HostUuidFact(target.node, None, problem, out.started_at, source)
        try:
            uuid = parse_product_uuid(out.stdout)
        except OutputError as exc:
            return HostUuidFact(target.node, None, str(exc), out.started_at, source)
        return HostUuidFact(target.node, uuid, None, out.started_at, source)

    def _parsed(self, target: SshTarget, parser: Callable[[str], Any], text: str) -> Any:
        try:
            return parser(text)
        except OutputError as exc:
            raise errors.BadOutput(target.node, target.address, str(exc)) from None

    def _valid_uuid(self, target: SshTarget, uuid: object) -> str:
        if not isinstance(uuid, str) or not CONTAINER_UUID.match(uuid):
            raise errors.InvalidArgument(
                target.node, target.address, f"{uuid!r} is not a container uuid"
            )
        return uuid

    def _source(self, target: SshTarget, command: str) -> str:
        return f"ssh {target.address}: {command}"

    def _link(self, node: str) -> _NodeLink:
        link = self._links.get(node)
        if link is None:
            link = _NodeLink(
                node=node,
                sessions=asyncio.Semaphore(self.settings.max_sessions_per_connection),
            )
            self._links[node] = link
        return link

    def _drop(self, link: _NodeLink, conn: asyncssh.SSHClientConnection) -> None:
        if link.conn is conn:
            link.conn = None
        conn.abort()

    async def _exec(
        self,
        target: SshTarget,
        purpose: str,
        command: str,
        *,
        input: str | None = None,
        allow_drop: bool = False,
        guard: Guard | None = None,
    ) -> _Output:
        """Run one command on the node's connection (connecting first if needed).
        `guard()` runs once the channel may open, right before the command is sent: the
        last moment to refuse it (NotLeader → NotSent, nothing sent)."""
        link = self._link(target.node)
        for attempt in (1, 2):
            conn, fresh = await self._connection(target, link)
            async with link.sessions:
                started_at = self._clock()
                t0 = time.perf_counter()
                process: asyncssh.SSHClientProcess[str] | None = None
                completed: asyncssh.SSHCompletedProcess | None = None
                stale = False
                try:
                    # One deadline for opening the channel and running the command: a frozen
                    # peer may never even confirm the channel.
                    async with asyncio.timeout(self.settings.command_timeout):
                        if guard is not None:
                            try:
                                guard()
                            except NotLeader as exc:
                                raise errors.NotSent(
                                    target.node, target.address, str(exc)
                                ) from None
                        try:
                            process = await conn.create_process(
                                command, input=input, encoding="utf-8", errors="replace"
                            )
                        except asyncssh.ChannelOpenError as exc:
                            if not conn.is_closed():
                                # A live connection refused one more session (e.g. sshd
                                # MaxSessions): keep it for the commands in flight.
                                raise errors.SessionRefused(
                                    target.node,
                                    target.address,
                                    f"the node refused a new session for {purpose}: {exc.reason}",
                                ) from None
                            stale = True
                        except (asyncssh.DisconnectError, OSError):
                            stale = True
                        if process is not None:
                            self.stats.commands += 1
                            completed = await process.wait()
                except TimeoutError:
                    if process is not None:
                        process.close()
                    self._drop(link, conn)
                    self.stats.command_timeouts += 1
                    logger.warning(
                        "SSH command timed out; connection dropped",
                        extra={
                            "ssh_node": target.node,
                            "ssh_purpose": purpose,
                            "timeout_s": self.settings.command_timeout,
                        },
                    )
                    raise errors.CommandTimeout(
                        target.node,
                        target.address,
                        f"{purpose} command did not finish within "
                        f"{self.settings.command_timeout:g}s; the connection was dropped",
                    ) from None
                except (asyncssh.DisconnectError, OSError):
                    self._drop(link, conn)
                    if allow_drop:
                        return _Output(None, None, "", "", started_at)
                    raise errors.ConnectionLost(
                        target.node, target.address, f"connection lost during {purpose}"
                    ) from None
            if stale or completed is None:
                # The kept-alive connection was dead; the command never started.
                self._drop(link, conn)
                if fresh or attempt == 2:
                    raise errors.ConnectionLost(
                        target.node, target.address, f"could not open a channel for {purpose}"
                    )
                self.stats.stale_reconnects += 1
                logger.info(
                    "kept-alive SSH connection was dead; reconnecting",
                    extra={"ssh_node": target.node, "ssh_purpose": purpose},
                )
                continue
            exit_status = completed.exit_status
            if exit_status is None and completed.exit_signal is None:
                # The channel closed without an exit status: the connection went away.
                self._drop(link, conn)
                if not allow_drop:
                    raise errors.ConnectionLost(
                        target.node, target.address, f"connection lost during {purpose}"
                    )
            logger.debug(
                "ssh command finished",
                extra={
                    "ssh_node": target.node,
                    "ssh_purpose": purpose,
                    "exit_status": exit_status,
                    "duration_ms": round((time.perf_counter() - t0) * 1000, 1),
                },
            )
            signal = completed.exit_signal[0] if completed.exit_signal else None
            return _Output(
                exit_status=exit_status,
                exit_signal=signal,
                stdout=_text(completed.stdout),
                stderr=_text(completed.stderr),
                started_at=started_at,
            )
        raise AssertionError("unreachable")  # pragma: no cover

    async def _connection(
        self, target: SshTarget, link: _NodeLink
    ) -> tuple[asyncssh.SSHClientConnection, bool]:
        """The node's live connection, opening one if needed; True when freshly opened."""
        try:
            endpoint = self.resolver.resolve(target.host, target.port)
        except ResolutionRefused as exc:
            raise errors.HostNotAllowed(target.node, target.address, str(exc)) from None
        identity = (
            target.user,
            target.client_key.fingerprint,
            _trust_identity(target),
        )
        attempts_seen = link.connect_attempts_done
        async with link.lock:
            conn = link.conn
            if conn is not None and (
                conn.is_closed() or link.endpoint != endpoint or link.identity != identity
            ):
                self._drop(link, conn)
                conn = None
            if conn is not None:
                return conn, False
            if link.connect_attempts_done != attempts_seen and link.last_connect_error is not None:
                # Someone else tried while we waited and failed: share that outcome instead
                # of queueing another full connect timeout behind it.
                raise link.last_connect_error
            link.last_connect_error = None
            try:
                conn = await self._open(target, endpoint, link)
            except errors.SshError as exc:
                link.last_connect_error = exc
                self.stats.connect_failures += 1
                raise
            finally:
                link.connect_attempts_done += 1
            link.conn, link.endpoint, link.identity = conn, endpoint, identity
            self.stats.connects += 1
            return conn, True

    def _trusted(self, target: SshTarget, link: _NodeLink) -> tuple[TrustedKeys, bool]:
        """The keys to trust for this connection, and whether first-use trust is allowed."""
        trust = target.trust
        if isinstance(trust, KnownHostKeys):
            keys = trust.trusted_for(target.host, target.port)
            if keys.empty:
                raise errors.HostKeyUnknown(
                    target.node,
                    target.address,
                    f"the known_hosts text has no key for {target.address}; no connection "
                    "was made. Add the node's host key to its known_hosts Secret.",
                )
            return keys, False
        if link.pinned_key is not None:
            return TrustedKeys((link.pinned_key,)), False
        return TrustedKeys(()), True

    async def _open(
        self, target: SshTarget, endpoint: Endpoint, link: _NodeLink
    ) -> asyncssh.SSHClientConnection:
        trusted, first_use = self._trusted(target, link)
        sock = await self._tcp_connect(target, endpoint)
        gate = _HostKeyGate(provisional=first_use)
        try:
            conn = await asyncio.wait_for(
                asyncssh.connect(
                    sock=sock,
                    config=None,
                    client_factory=lambda: gate,
                    username=target.user,
                    client_keys=[target.client_key.asyncssh_key],
                    known_hosts=(
                        list(trusted.host_keys),
                        list(trusted.ca_keys),
                        list(trusted.revoked),
                    ),
                    host_key_alias=target.host,
                    x509_trusted_certs=None,
                    agent_path=None,
                    preferred_auth="publickey",
                    password_auth=False,
                    kbdint_auth=False,
                    gss_auth=False,
                    gss_kex=False,
                    connect_timeout=None,
                    encryption_algs=list(self.settings.encryption_algs),
                    keepalive_interval=self.settings.keepalive_interval,
                    keepalive_count_max=self.settings.keepalive_count_max,
                ),
                timeout=self.settings.login_timeout,
            )
        except TimeoutError:
            _close_socket(sock)
            raise errors.LoginTimeout(
                target.node,
                target.address,
                f"TCP connected to {endpoint} but the SSH handshake and login did not finish "
                f"within {self.settings.login_timeout:g}s (sshd hung or overloaded)",
            ) from None
        except asyncssh.HostKeyNotVerifiable:
            _close_socket(sock)
            self.stats.host_key_refusals += 1
            presented = _describe(gate.presented)
            logger.warning(
                "SSH host key mismatch; connection refused, no command run",
                extra={
                    "ssh_node": target.node,
                    "ssh_endpoint": str(endpoint),
                    "presented": presented,
                },
            )
            raise errors.HostKeyMismatch(
                target.node, target.address, presented, trusted.fingerprints
            ) from None
        except asyncssh.PermissionDenied:
            _close_socket(sock)
            raise errors.AuthFailed(
                target.node,
                target.address,
                f"the node refused our client key {target.client_key.fingerprint} "
                f"for user {target.user}",
            ) from None
        except asyncssh.KeyExchangeFailed as exc:
            _close_socket(sock)
            if "host key" in str(exc).lower() and not trusted.empty:
                self.stats.host_key_refusals += 1
                raise errors.HostKeyMismatch(
                    target.node,
                    target.address,
                    None,
                    trusted.fingerprints,
                    reason="host key mismatch: the server offers no host key of the trusted "
                    f"algorithm(s) [{', '.join(trusted.fingerprints)}]; connection refused, "
                    "no command was run",
                ) from None
            raise errors.ConnectionFailed(
                target.node, target.address, f"SSH key exchange failed: {exc.reason}"
            ) from None
        except (asyncssh.Error, OSError) as exc:
            _close_socket(sock)
            raise errors.ConnectionFailed(
                target.node, target.address, f"SSH handshake failed: {type(exc).__name__}"
            ) from None
        if gate.accepted_provisionally:
            await self._prove_instance_secret(target, endpoint, link, conn, gate)
        logger.info(
            "SSH connected",
            extra={"ssh_node": target.node, "ssh_endpoint": str(endpoint)},
        )
        return conn

    async def _tcp_connect(self, target: SshTarget, endpoint: Endpoint) -> socket.socket:
        loop = asyncio.get_running_loop()
        try:
            infos = await asyncio.wait_for(
                loop.getaddrinfo(endpoint.host, endpoint.port, type=socket.SOCK_STREAM),
                timeout=self.settings.connect_timeout,
            )
        except (OSError, TimeoutError) as exc:
            raise errors.Unreachable(
                target.node, target.address, f"cannot resolve {endpoint.host}: {exc}"
            ) from None
        family, type_, proto, _, address = infos[0]
        sock = socket.socket(family, type_, proto)
        sock.setblocking(False)
        try:
            await asyncio.wait_for(
                loop.sock_connect(sock, address), timeout=self.settings.connect_timeout
            )
        except TimeoutError:
            sock.close()
            raise errors.ConnectTimeout(
                target.node,
                target.address,
                f"no TCP connection to {endpoint} within {self.settings.connect_timeout:g}s",
            ) from None
        except OSError as exc:
            sock.close()
            raise errors.Unreachable(
                target.node,
                target.address,
                f"cannot connect to {endpoint}: {exc.strerror or type(exc).__name__}",
            ) from None
        return sock

    async def _prove_instance_secret(
        self,
        target: SshTarget,
        endpoint: Endpoint,
        link: _NodeLink,
        conn: asyncssh.SSHClientConnection,
        gate: _HostKeyGate,
    ) -> None:
        trust = target.trust
        assert isinstance(trust, InstanceSecretTrust)
        key = gate.presented
        assert key is not None
        fingerprint = key.get_fingerprint()
        proven = False
        reason = "it did not answer"
        try:
            process = await conn.create_process(
                trust.proof_command, encoding="utf-8", errors="replace"
            )
            completed = await process.wait(timeout=self.settings.command_timeout)
            answer = _text(completed.stdout).strip()
            expected = trust.instance_secret.get_secret_value()
            proven = completed.exit_status == 0 and hmac.compare_digest(
                answer.encode(), expected.encode()
            )
            del answer
            if completed.exit_status != 0:
                reason = f"the proof command exited {completed.exit_status}"
            elif not proven:
                reason = "its answer did not match the instance secret"
        except asyncssh.TimeoutError:
            reason = f"the proof command did not answer within {self.settings.command_timeout:g}s"
        except (asyncssh.Error, OSError):
            reason = "the connection failed during the proof"
        if not proven:
            conn.abort()
            self.stats.host_key_refusals += 1
            logger.warning(
                "host key not trusted: instance secret not proven",
                extra={"ssh_node": target.node, "presented": fingerprint},
            )
            raise errors.InstanceSecretNotProven(
                target.node,
                target.address,
                f"the node did not prove its per-instance secret ({reason}); its host key "
                f"{key.get_algorithm()} {fingerprint} was not trusted and no other command "
                "was run",
            )
        link.pinned_key = key
        learned = LearnedHostKey(
            node=target.node,
            host=target.host,
            port=target.port,
            algorithm=key.get_algorithm(),
            fingerprint=fingerprint,
            public_key=key.export_public_key("openssh").decode().strip(),
            learned_at=self._clock(),
        )
        link.unreported_learned = learned
        self.stats.host_keys_learned += 1
        logger.info(
            "host key learned after instance-secret proof",
            extra={"ssh_node": target.node, "ssh_endpoint": str(endpoint), "key": fingerprint},
        )
        if self._on_learned is not None:
            try:
                await self._on_learned(learned)
            except Exception:
                # Trusted in memory anyway; the caller sees it again in the next report.
                logger.exception(
                    "recording the learned host key failed", extra={"ssh_node": target.node}
                )


def _trust_identity(target: SshTarget) -> str:
    trust = target.trust
    if isinstance(trust, KnownHostKeys):
        return "known:" + str(hash(trust.known_hosts))
    return "first-use:" + trust.proof_command


def _describe(key: asyncssh.SSHKey | None) -> str | None:
    if key is None:
        return None
    return f"{key.get_algorithm()} {key.get_fingerprint()}"


def _text(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value)


def _hint(stderr: str) -> str:
    line = stderr.strip().splitlines()[0] if stderr.strip() else ""
    return line[:160]


def _close_socket(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.close()


async def _wait_closed(conn: asyncssh.SSHClientConnection) -> None:
    with contextlib.suppress(TimeoutError, asyncssh.Error, OSError):
        await asyncio.wait_for(conn.wait_closed(), timeout=5)
