"""Configuration of one stub worker: what the fake node reports, and the faults it injects.

Plain dataclasses (cheap enough for 1,000 workers in one process). Both objects are
read on every connection/command, so tests and the stub cloud can change a live
worker's behaviour by assigning fields (e.g. ``worker.faults.hang_commands = True``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import asyncssh
from pydantic import SecretStr

from nodewarden.ssh.facts import Inhibitor
from nodewarden.ssh.protocol import (
    DEFAULT_READY_COMMAND,
    DEFAULT_RUNNER,
    DEFAULT_TELEMETRY_COMMAND,
)


@dataclass(slots=True)
class StubFaults:
    """Fault knobs. Rates are probabilities drawn from the worker's seeded random.Random."""

    hang_connect: bool = False
    """Accept TCP connections but never speak SSH (a hung sshd)."""
    freeze: bool = False
    """Stop reading from every open connection (TCP stays up) and hang new ones: a frozen
    node or a network partition. Held bytes are delivered once the fault is cleared."""
    hang_commands: bool = False
    """Accept commands but never answer them; a hung command ends only when its channel closes."""
    command_delay: float = 0.0
    """Seconds every command waits before answering (a slow node)."""
    refuse_auth: bool = False
    """Reject every client key."""
    wrong_host_key: bool = False
    """Present a different host key than `StubWorker.host_public_key` (a reinstalled node or MITM)."""
    broken_ready: bool = False
    runner_broken: bool = False
    """``--list`` prints a ``broken`` line: the runner says the node is unusable."""
    """The ready command never succeeds (a node that boots but never becomes usable)."""
    runner_crash_rate: float = 0.0
    """Probability that a started runner dies before its container finishes (state 'lost')."""
    runner_start_failure_rate: float = 0.0
    """Probability that ``run --detach`` fails outright (exit 1)."""
    ethtool_permission_denied: bool = False
    """ethtool cannot read Wake-on-LAN settings (as without CAP_NET_ADMIN)."""
    watch_silent: bool = False
    """``--watch`` stays open but prints nothing more (no changes, no heartbeats): a stream
    that stopped without its channel closing."""

    def __post_init__(self) -> None:
        for name in ("runner_crash_rate", "runner_start_failure_rate"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be within 0..1, got {value}")
        if self.command_delay < 0:
            raise ValueError("command_delay must be >= 0")


@dataclass(slots=True)
class StubWorkerConfig:
    """What one fake node is and reports."""

    authorized_keys: tuple[str, ...]
    """OpenSSH public keys ('ssh-ed25519 AAAA...') allowed to log in (any user name)."""
    name: str = "stub"
    host_key: asyncssh.SSHKey | None = None
    """Private host key; a fresh Ed25519 key when None."""
    instance_secret: SecretStr | None = None
    """Per-instance secret from the user-data; answered by the instance-secret proof command."""
    boot_delay: float = 0.0
    """Seconds after `start()` during which the ready command reports 'starting'."""
    inhibitors: list[Inhibitor] = field(default_factory=list)
    busctl_available: bool = True
    """False: busctl fails (no system bus / systemd < 240) so callers must fall back."""
    interface: str = "eth0"
    wol_supported: str = "pumbg"
    """ethtool 'Supports Wake-on' letters; '' = the driver offers no Wake-on-LAN."""
    wol_enabled: str = "g"
    """ethtool 'Wake-on' letters; 'd' = disabled."""
    load: tuple[float, float, float] = (0.05, 0.03, 0.01)
    gpu_utilisation: tuple[float | None, ...] | None = None
    """Per-GPU utilisation percent (None entries print [N/A]); None = no nvidia-smi."""
    ready_command: str = DEFAULT_READY_COMMAND
    runner_command: str = DEFAULT_RUNNER
    telemetry_command: str = DEFAULT_TELEMETRY_COMMAND
    extra_commands: dict[str, tuple[int, str, str]] = field(default_factory=dict)
    """Exact command line → (exit status, stdout, stderr), checked before everything else."""
    seed: int | None = None
    """Seed of the worker's random.Random (fault rates); None = nondeterministic."""
    faults: StubFaults = field(default_factory=StubFaults)
    poweroff_delay: float = 0.05
    """Seconds between answering 'poweroff' and the node dropping off the network."""
    watch_supported: bool = True
    """False: an older runner program without ``--watch`` (usage error, exit 2), so the
    operator must fall back to the ready probe and ``--list``."""
    product_uuid: str | None = None
    """The DMI product UUID the node reports (its BMC's ComputerSystem.UUID, for a side
    node); None: the file is unreadable, as to a login that is not root."""

    def __post_init__(self) -> None:
        keys: object = self.authorized_keys
        if isinstance(keys, str):
            self.authorized_keys = (keys,)
        if not self.authorized_keys:
            raise ValueError("a stub worker needs at least one authorized public key")
        if self.boot_delay < 0:
            raise ValueError("boot_delay must be >= 0")
