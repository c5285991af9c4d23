"""`PoweredSideNode`: a stub worker whose SSH server is up only while its power source says On.

The node follows its `PowerSource` on every tick (default every 0.05 s; a
`SideNodeGroup` ticks many nodes from one task):

| observed                      | node (``os``)      | what happens |
|-------------------------------|--------------------|--------------|
| power On, node off            | off → booting      | after ``boot_delay`` the SSH server listens on the node's fixed port |
| ``boot_delay`` over           | booting → up       | the ready command passes ``ready_delay`` later; uptime counts from power-on |
| ``systemctl poweroff`` (SSH)  | up → halted        | SSH stops at once; ``shutdown_delay`` later the source is switched Off |
| power Off (or a power cycle)  | any → off          | SSH stops, every connection drops, running containers are lost |

The host key is made once per node, so it is the same on every boot and a known_hosts
Secret keeps working; the port is reserved (bound, not listening) while the node is
off, so nobody else takes it and a connect is refused, as to a host that is down.
A node whose source is On when it starts is already up (uptime ``initial_uptime``).

Fault knobs (`SideNodeFaults`, changeable at run time with `set_faults`): the ready
probe never passes after a wake, a block-mode shutdown inhibitor held, SSH unreachable
while powered (refused, or partitioned: TCP up, nothing answers), wake packets ignored.
The stub worker's own faults (`StubFaults`) and, for fake-BMC nodes, the fake BMC's
options are changed through `set_worker_faults` / `set_bmc_options`.

Every power event is kept in `events` (time, kind, details such as the inhibitors held
and the containers lost at a power-off) as evidence for tests and the chaos suite.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import socket
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, TypeVar

from pydantic import SecretBytes, TypeAdapter, ValidationError

from nodewarden.ssh.facts import Inhibitor
from nodewarden.wol import format_mac, parse_mac
from nodewarden_doubles.fakebmc import FakeBmcOptions
from nodewarden_doubles.sidenode.power import FakeBmcPower, Power, PowerSource, WolPower
from nodewarden_doubles.sidenode.ticker import cancel, every
from nodewarden_doubles.stubworker import StubFaults, StubWorker, StubWorkerConfig

logger = logging.getLogger(__name__)

OsState = Literal["off", "booting", "up", "halted"]
SshUnreachable = Literal["no", "refused", "partitioned"]
WakeOutcome = Literal["woke", "already_on", "ignored_fault", "not_wol_node"]

FAULT_INHIBITOR = Inhibitor(
    what=("shutdown",),
    who="sidenode-fault",
    why="fault knob: shutdown inhibitor held",
    mode="block",
    uid=0,
    pid=4242,
)
"""The block-mode shutdown inhibitor the ``shutdown_inhibitor`` fault adds."""

_D = TypeVar("_D")
_EVENT_LOG_SIZE = 10_000
_BMC_OPTIONS_FIXED = frozenset({"username", "password", "system_ids", "initial_power"})


def _utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass(slots=True)
class SideNodeFaults:
    """Fault knobs of one side node (see the module docstring); change with `set_faults`."""

    ready_fails_after_wake: bool = False
    """From the next wake on, the ready command never passes (``degraded``, exit 1).
    Clearing it also mends a boot it broke."""
    shutdown_inhibitor: bool = False
    """A block-mode ``shutdown`` inhibitor is held (`FAULT_INHIBITOR`, listed by busctl
    and systemd-inhibit). ``systemctl poweroff`` over SSH still works (non-interactive
    systemctl does not check inhibitors): refusing is the operator's gate; the event
    log records every power-off with the inhibitors held at that moment."""
    ssh_unreachable: SshUnreachable = "no"
    """While powered: "refused" = no SSH listener (connects refused, connections
    dropped); "partitioned" = TCP accepted but nothing answers and open connections
    stall (the stub worker's freeze fault). Probes fail; telemetry goes stale."""
    ignore_wake: bool = False
    """Magic packets for this node are received and recorded, but it stays Off."""

    def __post_init__(self) -> None:
        if self.ssh_unreachable not in ("no", "refused", "partitioned"):
            raise ValueError(
                f"ssh_unreachable must be 'no', 'refused' or 'partitioned', "
                f"got {self.ssh_unreachable!r}"
            )


@dataclass(slots=True)
class SideNodeSettings:
    """What one side node is: its stub worker and its boot / shutdown timings."""

    worker: StubWorkerConfig
    """The node's SSH side (name, authorised keys, host key, inhibitors, GPUs, ...). Its
    ``boot_delay`` is managed by the node (``boot_delay + ready_delay`` from power-on)."""
    boot_delay: float = 1.0
    """Seconds from power On to the SSH server listening."""
    ready_delay: float = 1.0
    """Seconds from the SSH server listening to the ready command passing."""
    shutdown_delay: float = 0.2
    """Seconds from ``systemctl poweroff`` to the power source being switched Off."""
    ssh_port: int = 0
    """Fixed SSH port on 127.0.0.1 (0 = a free one, chosen once at `start()`)."""
    mac: str | None = None
    """The NIC's MAC (Wake-on-LAN target); required for a WoL-powered node."""
    secure_on: SecretBytes | None = field(default=None, repr=False)
    """6-byte SecureOn password a magic packet must carry (WoL nodes); None = none."""
    initial_uptime: float = 3600.0
    """Uptime reported by a node that is already On when the double starts."""
    faults: SideNodeFaults = field(default_factory=SideNodeFaults)

    def __post_init__(self) -> None:
        for name in ("boot_delay", "ready_delay", "shutdown_delay", "initial_uptime"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if not 0 <= self.ssh_port <= 65535:
            raise ValueError(f"ssh_port must be within 0..65535, got {self.ssh_port}")
        if self.mac is not None:
            self.mac = format_mac(parse_mac(self.mac))
        if self.secure_on is not None and len(self.secure_on.get_secret_value()) != 6:
            raise ValueError("secure_on must be exactly 6 bytes")


@dataclass(frozen=True, slots=True)
class NodeEvent:
    """One thing that happened to a node's power or SSH server."""

    at: datetime
    monotonic: float
    kind: str
    detail: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {
            "at": self.at.isoformat(),
            "monotonic": self.monotonic,
            "kind": self.kind,
            "detail": self.detail,
        }


class PoweredSideNode:
    """One side node: a `StubWorker` coupled to a `PowerSource` (see the module docstring)."""

    def __init__(
        self,
        settings: SideNodeSettings,
        source: PowerSource,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], datetime] = _utcnow,
        tick_interval: float = 0.05,
    ) -> None:
        if isinstance(source, WolPower) and settings.mac is None:
            raise ValueError(f"side node {settings.worker.name!r}: a WoL node needs a mac")
        if tick_interval <= 0:
            raise ValueError("tick_interval must be > 0")
        self.settings = settings
        self.source = source
        self._clock = clock
        self._wall = wall_clock
        self.tick_interval = tick_interval
        self.worker = StubWorker(settings.worker, clock=clock, on_poweroff=self._host_powered_off)
        self.os: OsState = "off"
        self.port: int | None = None
        self.boots = 0
        self.events: deque[NodeEvent] = deque(maxlen=_EVENT_LOG_SIZE)
        self._reserve: socket.socket | None = None
        self._initialised = False
        self._cycles = 0
        self._powered_at: float | None = None
        self._sshd_due: float | None = None
        self._off_due: float | None = None
        self._partition_applied = False
        self._inhibitor_applied = False
        self._broke_ready = False
        self._lock = asyncio.Lock()
        self._pending = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._ticker: asyncio.Task[None] | None = None

    # ---------------------------------------------------------------- identity

    @property
    def name(self) -> str:
        return self.settings.worker.name

    @property
    def faults(self) -> SideNodeFaults:
        return self.settings.faults

    @property
    def mac(self) -> str | None:
        return self.settings.mac

    @property
    def host_public_key(self) -> str:
        return self.worker.host_public_key

    def known_hosts_line(self, host: str = "127.0.0.1") -> str:
        """The known_hosts line for this node's fixed port (valid across reboots)."""
        assert self.port is not None, "start() first"
        return self.worker.known_hosts_line(host, self.port)

    @property
    def power(self) -> Power | None:
        return self.source.reading().power

    @property
    def listening(self) -> bool:
        return self.worker.running

    @property
    def ready(self) -> bool:
        """The ready command would pass now (listening, booted, not broken)."""
        return self.worker.running and self.worker.booted

    # --------------------------------------------------------------- lifecycle

    async def start(self, *, tick: bool = True) -> int:
        """Reserve the SSH port, start the power source and (``tick``) the node's own
        tick task; returns the port. A `SideNodeGroup` starts with ``tick=False``."""
        if self._reserve is None:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind(("127.0.0.1", self.settings.ssh_port))
            except BaseException:
                sock.close()
                raise
            self._reserve = sock
            self.port = int(sock.getsockname()[1])
        await self.source.start()
        self.step()
        if tick and self._ticker is None:
            self._ticker = every(self.tick_interval, self.step, f"side node {self.name} tick")
        assert self.port is not None
        return self.port

    async def stop(self) -> None:
        """Stop ticking, the SSH server and the power source; release the port."""
        ticker, self._ticker = self._ticker, None
        await cancel(ticker)
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.worker.stop()
        await self.source.stop()
        if self._reserve is not None:
            self._reserve.close()
            self._reserve = None

    # -------------------------------------------------------------------- tick

    def step(self) -> None:
        """Follow the power source once (called every tick; cheap, never blocks)."""
        reading = self.source.reading()
        now = self._clock()
        if reading.power is None:
            return
        if not self._initialised:
            self._initialised = True
            self._cycles = reading.cycles
            if reading.power == "On":
                self._already_up(now)
        if reading.cycles != self._cycles:
            self._cycles = reading.cycles
            if self.os != "off":
                self._power_lost(now, "power cycle")
        if reading.power == "Off":
            if self.os != "off":
                self._power_lost(now, "power off")
        elif self.os == "off":
            self._power_on(now)
        if self.os == "booting" and self._sshd_due is not None and now >= self._sshd_due:
            self.os = "up"
            self._sshd_due = None
        if self.os == "halted" and self._off_due is not None and now >= self._off_due:
            self._off_due = None
            self._event("switch_off_requested", source=self.source.kind)
            self._run(self._switch_off)
        self._apply_faults()
        self._sync_listener()

    def _already_up(self, now: float) -> None:
        self.os = "up"
        self._powered_at = now - self.settings.initial_uptime
        self.worker.config.boot_delay = self.settings.boot_delay + self.settings.ready_delay
        self._event("already_on")

    def _power_on(self, now: float) -> None:
        self.os = "booting"
        self.boots += 1
        self._powered_at = now
        self._sshd_due = now + self.settings.boot_delay
        self.worker.config.boot_delay = self.settings.boot_delay + self.settings.ready_delay
        if self.faults.ready_fails_after_wake:
            self.worker.faults.broken_ready = True
            self._broke_ready = True
        self._event("power_on", boot=self.boots)

    def _power_lost(self, now: float, cause: str) -> None:
        was = self.os
        self.os = "off"
        self._sshd_due = self._off_due = None
        if was == "halted":
            self._event("power_off", cause=cause, after="poweroff")
            return
        running = [c.uuid for c in self.worker.runner.running()]
        self._event("power_off", cause=cause, after=was, containers_lost=running)
        self._run(self.worker.lose_power)

    def _host_powered_off(self, worker: StubWorker) -> None:
        """StubWorker callback: ``systemctl poweroff`` ran and the SSH server is gone."""
        self.os = "halted"
        self._sshd_due = None
        self._off_due = self._clock() + self.settings.shutdown_delay
        self._event(
            "poweroff_over_ssh",
            inhibitors=[
                dataclasses.asdict(i) for i in worker.config.inhibitors if i.blocks_shutdown
            ],
            containers_lost=list(worker.lost_containers),
        )

    async def _switch_off(self) -> None:
        try:
            await self.source.switch_off()
        except Exception as exc:
            logger.warning(
                "side node could not switch its power source off",
                extra={"side_node": self.name, "error": str(exc)},
            )
            self._event("switch_off_failed", error=str(exc))
            return
        # Observe the Off now: an On arriving before the next tick (a wake packet, a BMC
        # reset) must find the node off and boot it, not still halted.
        self.step()

    def _apply_faults(self) -> None:
        faults = self.faults
        partition = faults.ssh_unreachable == "partitioned"
        if partition != self._partition_applied:
            self.worker.faults.freeze = partition
            self._partition_applied = partition
        if faults.shutdown_inhibitor != self._inhibitor_applied:
            inhibitors = self.worker.config.inhibitors
            if faults.shutdown_inhibitor:
                inhibitors.append(FAULT_INHIBITOR)
            elif FAULT_INHIBITOR in inhibitors:
                inhibitors.remove(FAULT_INHIBITOR)
            self._inhibitor_applied = faults.shutdown_inhibitor
            self._event("inhibitor", held=faults.shutdown_inhibitor)
        if self._broke_ready and not faults.ready_fails_after_wake:
            self.worker.faults.broken_ready = False
            self._broke_ready = False

    def _want_listening(self) -> bool:
        return self.os == "up" and self.faults.ssh_unreachable != "refused"

    def _sync_listener(self) -> None:
        if self._pending or self._want_listening() == self.worker.running:
            return
        if self._want_listening():
            self._run(self._listen)
        else:
            self._run(self._unlisten)

    async def _listen(self) -> None:
        if self._want_listening() and not self.worker.running:
            await self.worker.start(self.port or 0, booted_at=self._powered_at)
            self._event("ssh_listening", port=self.port)

    async def _unlisten(self) -> None:
        if not self._want_listening() and self.worker.running:
            await self.worker.stop()
            self._event("ssh_stopped", os=self.os)

    def _run(self, op: Callable[[], Awaitable[None]]) -> None:
        """Run one async action after the ones before it (start/stop never overlap)."""
        self._pending += 1

        async def serialized() -> None:
            try:
                async with self._lock:
                    await op()
            finally:
                self._pending -= 1

        task = asyncio.get_running_loop().create_task(serialized())
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.error(
                "side node action failed", exc_info=task.exception(), extra={"side_node": self.name}
            )

    def _event(self, kind: str, **detail: Any) -> None:
        self.events.append(NodeEvent(self._wall(), self._clock(), kind, detail))
        logger.info("side node %s: %s", self.name, kind, extra={"side_node": self.name})

    # ------------------------------------------------------------------ control

    def wake(self) -> WakeOutcome:
        """A magic packet for this node arrived (SecureOn already checked by the listener)."""
        source = self.source
        wol_with_bmc = isinstance(source, FakeBmcPower) and self.settings.mac is not None
        if not isinstance(source, WolPower) and not wol_with_bmc:
            return "not_wol_node"
        if self.faults.ignore_wake:
            self._event("wake_ignored", reason="fault: ignore_wake")
            return "ignored_fault"
        if source.reading().power == "On":
            return "already_on"
        if isinstance(source, WolPower):
            source.power = "On"
        else:
            assert isinstance(source, FakeBmcPower)
            source.bmc.set_power(source.system_id, "On")  # its BMC reports what the NIC did
        self._event("wake_packet")
        self.step()
        return "woke"

    async def set_power(self, state: Power) -> None:
        """Switch the power source directly (as an admin at the BMC / the power button)."""
        self._event("admin_set_power", state=state)
        await self.source.set_power(state)
        self.step()

    def set_faults(self, **changes: Any) -> SideNodeFaults:
        """Change `SideNodeFaults` fields (validated; unknown names are refused)."""
        merged = validated_replace(SideNodeFaults, self.faults, changes, "side-node fault")
        self.settings.faults = merged
        self._apply_faults()
        self._sync_listener()
        return merged

    def set_worker_faults(self, **changes: Any) -> StubFaults:
        """Change the stub worker's `StubFaults` fields (freeze, hang_commands, ...)."""
        merged = validated_replace(StubFaults, self.worker.faults, changes, "worker fault")
        self.worker.config.faults = merged
        return merged

    def set_bmc_options(self, **changes: Any) -> dict[str, Any]:
        """Change the fake BMC's `FakeBmcOptions` (never_apply, unavailable_reads, ...);
        credentials and systems cannot be changed. Fake-BMC nodes only."""
        source = self.source
        if not isinstance(source, FakeBmcPower):
            raise ValueError(
                f"side node {self.name!r} has no fake BMC (its power is {source.kind})"
            )
        fixed = sorted(set(changes) & _BMC_OPTIONS_FIXED)
        if fixed:
            raise ValueError(f"these fake BMC options cannot be changed: {', '.join(fixed)}")
        merged = validated_replace(FakeBmcOptions, source.bmc.options, changes, "fake BMC option")
        for name in changes:
            setattr(source.bmc.options, name, getattr(merged, name))
        return bmc_options_view(source.bmc.options)

    # -------------------------------------------------------------------- views

    def state(self) -> dict[str, Any]:
        """Everything a test or the admin API wants to know about the node now (no secrets)."""
        worker = self.worker
        reading = self.source.reading()
        view: dict[str, Any] = {
            "name": self.name,
            "power_source": self.source.describe(),
            "power": reading.power,
            "os": self.os,
            "boots": self.boots,
            "ssh": {"host": "127.0.0.1", "port": self.port, "listening": worker.running},
            "ready": self.ready,
            "uptime": worker.uptime,
            "mac": self.mac,
            "secure_on": self.settings.secure_on is not None,
            "host_public_key": self.host_public_key,
            "faults": dataclasses.asdict(self.faults),
            "worker_faults": dataclasses.asdict(worker.faults),
            "inhibitors": [dataclasses.asdict(i) for i in worker.config.inhibitors],
            "running_containers": [c.uuid for c in worker.runner.running()],
            "runner_starts": worker.runner.started,
            "connections_accepted": worker.connections_accepted,
        }
        if isinstance(self.source, FakeBmcPower):
            view["bmc_options"] = bmc_options_view(self.source.bmc.options)
        return view

    def __repr__(self) -> str:
        return f"PoweredSideNode({self.name!r}, {self.source.kind}, port={self.port}, os={self.os})"


def bmc_options_view(options: FakeBmcOptions) -> dict[str, Any]:
    """The fake BMC's options without the password."""
    view = dataclasses.asdict(options)
    view.pop("password", None)
    return view


def validated_replace(kind: type[_D], current: _D, changes: dict[str, Any], what: str) -> _D:
    """``current`` with ``changes`` applied, type-checked by pydantic; ValueError names the field."""
    known = {f.name for f in dataclasses.fields(kind)}  # type: ignore[arg-type]
    unknown = sorted(set(changes) - known)
    if unknown:
        raise ValueError(f"unknown {what} field(s): {', '.join(unknown)}")
    merged = {**dataclasses.asdict(current), **changes}  # type: ignore[call-overload]
    try:
        result: _D = TypeAdapter(kind).validate_python(merged)
    except ValidationError as exc:
        problems = validation_problems(exc)
        raise ValueError(f"invalid {what}: {problems}") from None
    return result


def validation_problems(exc: ValidationError) -> str:
    """'field: message; ...' without echoing any input value (it may be a secret)."""
    return "; ".join(
        (f"{'.'.join(str(p) for p in e['loc'])}: " if e["loc"] else "") + e["msg"]
        for e in exc.errors(include_input=False, include_url=False)
    )
