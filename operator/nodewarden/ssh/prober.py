"""The SSH prober: the adapter callers hold — probes as typed facts, runner control, power-off.

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

Collaborators, called one way: `SshProber` → `RunnerControl` (`nodewarden.ssh.runners`) →
`Connections` (`nodewarden.ssh.connection`: links, commands) → `Dialer`
(`nodewarden.ssh.handshake`: steps 2-3, host-key trust).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import nodewarden.ssh.errors as errors
from nodewarden.ssh.addressing import AddressResolver, LoopbackOnlyResolver
from nodewarden.ssh.connection import Connections, DialerPort
from nodewarden.ssh.credentials import SshTarget
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
from nodewarden.ssh.link import LOGGER_NAME, Guard, HostKeyRecorder, hint, parsed, source
from nodewarden.ssh.parsing import (
    OutputError,
    WakeOnLanUnreadable,
    parse_busctl_inhibitors,
    parse_ethtool_wol,
    parse_product_uuid,
    parse_runner_list,
    parse_systemd_inhibit_list,
    parse_telemetry,
    parse_uptime,
    runner_list_says_broken,
)
from nodewarden.ssh.protocol import INTERFACE_NAME, UPTIME_COMMAND
from nodewarden.ssh.runners import RunnerControl, RunnerOwner
from nodewarden.ssh.settings import ProbeSettings
from nodewarden.ssh.stream import StreamedFacts, WatchStream
from nodewarden.ssh.throttle import ProbeThrottle

logger = logging.getLogger(LOGGER_NAME)


def _utcnow() -> datetime:
    return datetime.now(tz=UTC)


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
        dialer: DialerPort | None = None,
    ) -> None:
        """`dialer`: how a node's connection is opened (default: SSH over TCP,
        `handshake.Dialer`; a hollow fleet's in-process nodes in benchmarks and tests)."""
        self._connections = Connections(
            settings or ProbeSettings(),
            resolver or LoopbackOnlyResolver(),
            clock,
            on_host_key_learned,
            dialer,
        )
        self._runner_control = RunnerControl(self._connections)
        self._watch = WatchStream(self._connections, clock)
        self.throttle = throttle or ProbeThrottle()
        self._clock = clock
        self.stats = self._connections.stats

    @property
    def settings(self) -> ProbeSettings:
        return self._connections.settings

    @settings.setter
    def settings(self, value: ProbeSettings) -> None:
        """Takes effect on the next command (and the next connect)."""
        self._connections.settings = value

    @property
    def resolver(self) -> AddressResolver:
        return self._connections.resolver

    # ------------------------------------------------------------------ probes

    async def probe(
        self,
        target: SshTarget,
        *,
        inhibitors: bool = False,
        telemetry: bool = False,
        uptime: bool = False,
        host_uuid: bool = False,
        streamed: StreamedFacts | None = None,
    ) -> ProbeReport:
        """Ready probe; if ready, the runner list (and inhibitors/telemetry/uptime/the host's
        product UUID when asked).

        With `streamed` (the node's watch stream is up) neither the ready probe nor the
        runner list is run: the report carries the streamed facts and only the rest asked
        for is polled. Takes one throttle slot for the whole bundle.
        """
        await self.throttle.acquire()
        started = self._clock()
        ready = streamed.ready if streamed is not None else await self._ready(target)
        runners: RunnersFact | None = None
        inhibitor_fact: InhibitorsFact | None = None
        telemetry_fact: TelemetryFact | None = None
        uptime_fact: UptimeFact | None = None
        uuid_fact: HostUuidFact | None = None
        if ready.ready:
            if streamed is not None and streamed.runners is not None:
                runners_job: asyncio.Future[RunnersFact] = (
                    asyncio.get_running_loop().create_future()
                )
                runners_job.set_result(streamed.runners)
            else:
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
        learned = self._connections.take_learned(target.node)
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

    def watch(
        self, target: SshTarget, heartbeat: float | None = None
    ) -> AsyncIterator[StreamedFacts]:
        """The node's ready state and runners as its ``RUNNER --watch`` pushes them
        (`nodewarden.ssh.stream`); heartbeat = ``settings.stream_heartbeat`` by default.
        Not throttled: one command per stream, not per fact."""
        beat = self.settings.stream_heartbeat if heartbeat is None else heartbeat
        return self._watch.facts(target, beat)

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
        out = await self._connections.exec(target, "wake-on-lan", command)
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
                    target.node, target.address, "ethtool", out.exit_status, hint(out.stderr)
                ) from None
            raise errors.BadOutput(target.node, target.address, str(exc)) from None
        if out.exit_status != 0:
            raise errors.CommandFailed(
                target.node, target.address, "ethtool", out.exit_status, hint(out.stderr)
            )
        return WakeOnLanFact(
            node=target.node,
            interface=interface,
            supported=supported,
            enabled=enabled,
            observed_at=out.started_at,
            source=source(target, command),
        )

    # ------------------------------------------------------------- runner control

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
        return await self._runner_control.start(target, config, owner=owner, guard=guard)

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
        await self._runner_control.kill(target, uuid, signal, owner=owner, guard=guard)

    async def runner_status(self, target: SshTarget, uuid: str) -> RunnerOutcome:
        """``RUNNER --status UUID``: running, or how the container ended."""
        return await self._runner_control.status(target, uuid)

    async def poweroff(self, target: SshTarget, guard: Guard | None = None) -> PoweroffRequested:
        """Send the power-off command. Proves only that it was requested, never that it
        worked. `guard` as for `start_runner` (NotSent: nothing sent)."""
        command = self.settings.poweroff_command
        out = await self._connections.exec(
            target, "poweroff", command, allow_drop=True, guard=guard
        )
        dropped = out.exit_status is None
        self._connections.drop_connection(target.node)
        if out.exit_status not in (0, None):
            raise errors.CommandFailed(
                target.node, target.address, "poweroff", out.exit_status, hint(out.stderr)
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
            source=source(target, command),
        )

    # ----------------------------------------------------------- connections

    # ----------------------------------------------------------- connections

    def connected(self, node: str) -> bool:
        return self._connections.connected(node)

    def take_learned(self, node: str) -> LearnedHostKey | None:
        """The host key learned on first use since the last call (e.g. by a stream), once."""
        return self._connections.take_learned(node)

    def pinned_host_key(self, node: str) -> str | None:
        """The OpenSSH public key trusted on first use for ``node``, if any."""
        return self._connections.pinned_host_key(node)

    async def disconnect(self, node: str) -> None:
        """Close the node's connection (it reconnects on the next call). Keeps pinned keys."""
        await self._connections.disconnect(node)

    async def forget(self, node: str) -> None:
        """Close the connection and forget everything, including a host key learned on first use."""
        await self._connections.forget(node)

    async def aclose(self) -> None:
        await self._connections.aclose()

    # ------------------------------------------------------------ internals

    async def _ready(self, target: SshTarget) -> ReadyFact:
        command = self.settings.ready_command
        out = await self._connections.exec(target, "ready", command)
        first = out.stdout.strip().splitlines()[0] if out.stdout.strip() else ""
        return ReadyFact(
            node=target.node,
            state="Ready" if out.exit_status == 0 else "Booting",
            exit_status=out.exit_status,
            detail=first[:200],
            observed_at=out.started_at,
            source=source(target, command),
        )

    async def _runners(self, target: SshTarget) -> RunnersFact:
        command = f"{self.settings.runner_command} --list"
        out = await self._connections.exec(target, "runner-list", command)
        if out.exit_status != 0:
            raise errors.CommandFailed(
                target.node, target.address, "runner list", out.exit_status, hint(out.stderr)
            )
        runners = parsed(target, parse_runner_list, out.stdout)
        return RunnersFact(
            node=target.node,
            runners=runners,
            observed_at=out.started_at,
            source=source(target, command),
            broken=runner_list_says_broken(out.stdout),
        )

    async def _inhibitors(self, target: SshTarget) -> InhibitorsFact:
        primary_cmd = self.settings.inhibitors_command
        primary = await self._connections.exec(target, "inhibitors", primary_cmd)
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
                    source=source(target, primary_cmd),
                )
        fallback_cmd = self.settings.inhibitors_fallback_command
        fallback = await self._connections.exec(target, "inhibitors-fallback", fallback_cmd)
        if fallback.exit_status != 0:
            raise errors.InhibitorsUnknown(
                target.node,
                target.address,
                f"inhibitors unknown: busctl exited {primary.exit_status}, "
                f"systemd-inhibit exited {fallback.exit_status}",
            )
        found = parsed(target, parse_systemd_inhibit_list, fallback.stdout)
        return InhibitorsFact(
            node=target.node,
            inhibitors=found,
            via="systemd-inhibit",
            observed_at=fallback.started_at,
            source=source(target, fallback_cmd),
        )

    async def _telemetry(self, target: SshTarget) -> TelemetryFact:
        command = self.settings.telemetry_command
        out = await self._connections.exec(target, "telemetry", command)
        if out.exit_status != 0:
            raise errors.CommandFailed(
                target.node, target.address, "telemetry", out.exit_status, hint(out.stderr)
            )
        load1, load5, load15, gpus = parsed(target, parse_telemetry, out.stdout)
        return TelemetryFact(
            node=target.node,
            load1=load1,
            load5=load5,
            load15=load15,
            gpus=gpus,
            sampled_at=out.started_at,
            source=source(target, command),
        )

    async def _uptime(self, target: SshTarget) -> UptimeFact:
        out = await self._connections.exec(target, "uptime", UPTIME_COMMAND)
        if out.exit_status != 0:
            raise errors.CommandFailed(
                target.node, target.address, "uptime", out.exit_status, hint(out.stderr)
            )
        seconds = parsed(target, parse_uptime, out.stdout)
        return UptimeFact(
            node=target.node,
            booted_at=out.started_at - timedelta(seconds=seconds),
            uptime_seconds=seconds,
            observed_at=out.started_at,
            source=source(target, UPTIME_COMMAND),
        )

    async def _host_uuid(self, target: SshTarget) -> HostUuidFact:
        """The DMI product UUID; a failing command is a fact ("unreadable"), not an error."""
        command = self.settings.product_uuid_command
        out = await self._connections.exec(target, "product-uuid", command)
        where = source(target, command)
        if out.exit_status != 0:
            problem = f"exit {out.exit_status}: {hint(out.stderr)}"
            return HostUuidFact(target.node, None, problem, out.started_at, where)
        try:
            uuid = parse_product_uuid(out.stdout)
        except OutputError as exc:
            return HostUuidFact(target.node, None, str(exc), out.started_at, where)
        return HostUuidFact(target.node, uuid, None, out.started_at, where)
