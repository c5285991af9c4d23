"""Typed facts the SSH prober reports about a node, each stamped with when and where it came from.

A fact's ``observed_at`` is the moment the command was *sent* (timezone-aware UTC): the
state it describes is at least that fresh, which is the conservative reading for
telemetry-freshness gates. ``source`` names the command that produced it, for the Safety
Record's provenance.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal

ReadyState = Literal["Ready", "Booting"]
InhibitorMode = str
"""'block', 'delay' or 'block-weak' (systemd 257+); kept as text so new modes survive."""
InhibitorSource = Literal["busctl", "systemd-inhibit"]
RunnerState = Literal["running", "exited", "killed", "lost", "unknown"]

SHUTDOWN_BLOCKING_MODES = frozenset({"block", "block-weak"})


@dataclass(frozen=True, slots=True)
class ReadyFact:
    """Result of the ready probe: Ready (exit status 0) or Booting (anything else)."""

    node: str
    state: ReadyState
    exit_status: int | None
    detail: str
    observed_at: datetime
    source: str

    @property
    def ready(self) -> bool:
        return self.state == "Ready"


@dataclass(frozen=True, slots=True)
class RunnerProcess:
    """One runner process on a node, as listed by ``RUNNER --list``."""

    pid: int
    uuid: str
    dispatcher_id: str | None = None
    """The dispatcher that started it (None: the runner recorded no owner -- started by
    an older operator or listed by an older runner program)."""
    uid: str | None = None
    """`metadata.uid` of the ContainerDispatch it was started for (None: not recorded)."""
    fence: int | None = None
    """The fencing token its start carried (None: none)."""


@dataclass(frozen=True, slots=True)
class RunnersFact:
    """The runners running on a node."""

    node: str
    runners: tuple[RunnerProcess, ...]
    observed_at: datetime
    source: str
    broken: bool = False
    """The runner reported the node unusable (a ``broken`` line in ``--list``)."""

    @property
    def uuids(self) -> frozenset[str]:
        return frozenset(r.uuid for r in self.runners)

    def of(self, dispatcher_id: str) -> tuple[RunnerProcess, ...]:
        """The runners that name `dispatcher_id` as their owner."""
        return tuple(r for r in self.runners if r.dispatcher_id == dispatcher_id)

    @property
    def unowned(self) -> tuple[RunnerProcess, ...]:
        """The runners that name no owner (never killed; reported)."""
        return tuple(r for r in self.runners if r.dispatcher_id is None)


@dataclass(frozen=True, slots=True)
class RunnerStarted:
    """A runner was started (or was already running) for ``uuid``; ``pid`` is its process."""

    node: str
    uuid: str
    pid: int
    observed_at: datetime
    source: str


@dataclass(frozen=True, slots=True)
class RunnerOutcome:
    """What ``RUNNER --status UUID`` reported."""

    node: str
    uuid: str
    state: RunnerState
    pid: int | None
    exit_code: int | None
    signal: str | None
    observed_at: datetime
    source: str
    dispatcher_id: str | None = None
    """Who started it (None: not recorded, or no record of the uuid)."""
    uid: str | None = None
    """`metadata.uid` of the ContainerDispatch it was started for (None: not recorded)."""

    @property
    def finished(self) -> bool:
        """True once the container's runner is gone (whatever the reason)."""
        return self.state != "running"


@dataclass(frozen=True, slots=True)
class Inhibitor:
    """One systemd-logind inhibitor lock."""

    what: tuple[str, ...]
    who: str
    why: str
    mode: InhibitorMode
    uid: int | None = None
    pid: int | None = None
    truncated: bool = False
    """The text listing shortened a column ('…'); 'what' may be incomplete."""

    @property
    def blocks_shutdown(self) -> bool:
        """A block (or block-weak) lock on shutdown; a truncated block lock counts too."""
        if self.mode not in SHUTDOWN_BLOCKING_MODES:
            return False
        return "shutdown" in self.what or self.truncated


@dataclass(frozen=True, slots=True)
class InhibitorsFact:
    """The inhibitor locks active on a node and which tool listed them."""

    node: str
    inhibitors: tuple[Inhibitor, ...]
    via: InhibitorSource
    observed_at: datetime
    source: str

    @property
    def shutdown_blockers(self) -> tuple[Inhibitor, ...]:
        return tuple(i for i in self.inhibitors if i.blocks_shutdown)


@dataclass(frozen=True, slots=True)
class WakeOnLanFact:
    """Wake-on-LAN support and mode of one interface, from ``ethtool IFACE``.

    Letters as ethtool prints them: p u m b a g s f, d = disabled. ``g`` = magic packet.
    """

    node: str
    interface: str
    supported: frozenset[str]
    enabled: frozenset[str]
    observed_at: datetime
    source: str

    @property
    def supports_magic_packet(self) -> bool:
        return "g" in self.supported

    @property
    def magic_packet_enabled(self) -> bool:
        return "g" in self.enabled


@dataclass(frozen=True, slots=True)
class GpuSample:
    index: int
    utilisation: float | None
    """Percent busy; None when the driver reports [N/A]."""


@dataclass(frozen=True, slots=True)
class TelemetryFact:
    """Load averages and, when the node has an nvidia-smi, GPU utilisation."""

    node: str
    load1: float
    load5: float
    load15: float
    gpus: tuple[GpuSample, ...] | None
    """None = no GPU tool answered (not "zero GPUs busy")."""
    sampled_at: datetime
    source: str

    @property
    def observed_at(self) -> datetime:
        return self.sampled_at


@dataclass(frozen=True, slots=True)
class UptimeFact:
    """When the node last booted: the uptime command's time minus the seconds it reported."""

    node: str
    booted_at: datetime
    uptime_seconds: float
    observed_at: datetime
    source: str


@dataclass(frozen=True, slots=True)
class HostUuidFact:
    """The host's DMI product UUID (lower case), or why it could not be read (`problem`:
    the command failed, e.g. a login that may not read the root-only file)."""

    node: str
    uuid: str | None
    problem: str | None
    observed_at: datetime
    source: str


@dataclass(frozen=True, slots=True)
class LearnedHostKey:
    """A host key trusted on first use after the node proved its per-instance secret.

    ``known_hosts_line`` is ready to be stored (e.g. in the WorkerNode's known-hosts
    Secret) and passed back later as ``KnownHostKeys``.
    """

    node: str
    host: str
    port: int
    algorithm: str
    fingerprint: str
    public_key: str
    learned_at: datetime

    @property
    def known_hosts_line(self) -> str:
        pattern = self.host if self.port == 22 else f"[{self.host}]:{self.port}"
        return f"{pattern} {self.public_key}"


@dataclass(frozen=True, slots=True)
class PoweroffRequested:
    """A power-off command was sent. Proves only the request, never that the node is off."""

    node: str
    exit_status: int | None
    connection_dropped: bool
    requested_at: datetime
    source: str


@dataclass(frozen=True, slots=True)
class ProbeReport:
    """One probe of one node: readiness, and the runners once it is ready.

    ``runners`` is None while the node is booting (not listed). ``inhibitors``,
    ``telemetry``, ``uptime`` and ``host_uuid`` are present only when the probe asked.
    """

    node: str
    endpoint: str
    started_at: datetime
    finished_at: datetime
    ready: ReadyFact
    runners: RunnersFact | None = None
    inhibitors: InhibitorsFact | None = None
    telemetry: TelemetryFact | None = None
    uptime: UptimeFact | None = None
    host_uuid: HostUuidFact | None = None
    learned_host_key: LearnedHostKey | None = None
