"""SSH adapter: probes worker nodes and controls their runners over kept-alive asyncssh connections.

- `SshProber` — the adapter (see `nodewarden.ssh.prober` for the connection life cycle).
- `SshTarget`, `SshClientKey`, `KnownHostKeys`, `InstanceSecretTrust` — whom to reach and
  whom to trust; there is no accept-any-host-key mode.
- `AddressResolver` and its implementations — where to dial (loopback mapping in tests).
- `ProbeThrottle` — max probes per second (default 10; 0 = unthrottled).
- facts (`ReadyFact`, `RunnersFact`, `InhibitorsFact`, `WakeOnLanFact`, `TelemetryFact`, ...)
  and errors (`HostKeyMismatch`, `AuthFailed`, `ConnectTimeout`, `CommandTimeout`, ...).
- `nodewarden.ssh.stream` — the node's watch stream (`SshProber.watch`): runner list and
  ready state pushed, `StreamedFacts`; `WatchUnsupported`, `StreamStopped`.
- `nodewarden.ssh.protocol` — the node contract (commands and output formats).
"""

from __future__ import annotations

from nodewarden.ssh.addressing import (
    AddressResolver,
    DirectResolver,
    Endpoint,
    LoopbackOnlyResolver,
    MappedResolver,
    ResolutionRefused,
)
from nodewarden.ssh.credentials import (
    HostKeyPolicy,
    InstanceSecretTrust,
    KnownHostKeys,
    SshClientKey,
    SshTarget,
)
from nodewarden.ssh.errors import (
    AuthFailed,
    BadOutput,
    CommandFailed,
    CommandTimeout,
    ConnectionFailed,
    ConnectionLost,
    ConnectTimeout,
    HostKeyError,
    HostKeyMismatch,
    HostKeyUnknown,
    HostNotAllowed,
    InhibitorsUnknown,
    InstanceSecretNotProven,
    InvalidArgument,
    InvalidClientKey,
    LoginTimeout,
    SessionRefused,
    SshError,
    Unreachable,
    WakeOnLanUnknown,
)
from nodewarden.ssh.facts import (
    GpuSample,
    Inhibitor,
    InhibitorsFact,
    LearnedHostKey,
    PoweroffRequested,
    ProbeReport,
    ReadyFact,
    RunnerOutcome,
    RunnerProcess,
    RunnersFact,
    RunnerStarted,
    TelemetryFact,
    UptimeFact,
    WakeOnLanFact,
)
from nodewarden.ssh.link import HostKeyRecorder, ProberStats
from nodewarden.ssh.prober import SshProber
from nodewarden.ssh.settings import ProbeSettings
from nodewarden.ssh.stream import StreamedFacts, StreamStopped, WatchUnsupported
from nodewarden.ssh.throttle import DEFAULT_MAX_PROBES_PER_SECOND, ProbeThrottle

__all__ = [
    "DEFAULT_MAX_PROBES_PER_SECOND",
    "AddressResolver",
    "AuthFailed",
    "BadOutput",
    "CommandFailed",
    "CommandTimeout",
    "ConnectTimeout",
    "ConnectionFailed",
    "ConnectionLost",
    "DirectResolver",
    "Endpoint",
    "GpuSample",
    "HostKeyError",
    "HostKeyMismatch",
    "HostKeyPolicy",
    "HostKeyRecorder",
    "HostKeyUnknown",
    "HostNotAllowed",
    "Inhibitor",
    "InhibitorsFact",
    "InhibitorsUnknown",
    "InstanceSecretNotProven",
    "InstanceSecretTrust",
    "InvalidArgument",
    "InvalidClientKey",
    "KnownHostKeys",
    "LearnedHostKey",
    "LoginTimeout",
    "LoopbackOnlyResolver",
    "MappedResolver",
    "PoweroffRequested",
    "ProbeReport",
    "ProbeSettings",
    "ProbeThrottle",
    "ProberStats",
    "ReadyFact",
    "ResolutionRefused",
    "RunnerOutcome",
    "RunnerProcess",
    "RunnerStarted",
    "RunnersFact",
    "SessionRefused",
    "SshClientKey",
    "SshError",
    "SshProber",
    "SshTarget",
    "StreamStopped",
    "StreamedFacts",
    "TelemetryFact",
    "Unreachable",
    "UptimeFact",
    "WakeOnLanFact",
    "WakeOnLanUnknown",
    "WatchUnsupported",
]
