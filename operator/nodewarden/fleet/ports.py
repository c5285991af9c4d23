"""The ports between the worker pool and the power controller: what the pool reports
(frozen snapshots of a worker, never the pool's own `Worker`) and what the power
controller may ask of the pool.

`pool/` implements `PoolPort` and calls a `WorkerObserver`; `power/` implements the
observer and calls the port. Neither imports the other.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from nodewarden.cloud.model import CloudInstance
from nodewarden.scheduling.caps import Admission
from nodewarden.ssh.credentials import SshTarget
from nodewarden.ssh.errors import SshError
from nodewarden.ssh.facts import ProbeReport


@dataclass(frozen=True, slots=True)
class WorkerSnapshot:
    """One worker as the pool knew it at one moment: what the power rules read of a VM."""

    name: str
    side: bool
    booted_at: datetime
    last_attempt: datetime | None
    """When the last probe was begun (None: never)."""
    last_success: datetime | None
    """When the last probe succeeded (None: never paired)."""
    attempts_since_success: int
    attempts_total: int
    broken: bool
    deletion_requested: bool
    instance_id: str | None
    instance_stopped: bool
    """The cloud lists the instance as stopped."""
    listed_at: datetime | None
    """When the pool last read the cloud list (None: not yet)."""
    found_at: datetime | None = None
    """When this process first learned of a VM it did not create (None: it created it,
    or a side node): its boot grace counts from here (`rules.vm`)."""


class WorkerObserver(Protocol):
    """Who hears what the pool observes (the power controller; a no-op without one)."""

    def probed(
        self, worker: WorkerSnapshot, report: ProbeReport | None, error: SshError | None
    ) -> None:
        """A probe of `worker` ended (with a report, or with the error it raised)."""

    def listed(self, instances: Mapping[str, CloudInstance], at: datetime) -> None:
        """The cloud list was read at `at`: our instances by WorkerNode name."""

    def list_failed(self, at: datetime) -> None:
        """The cloud list could not be read at `at` (retried at the pool's fast pace)."""

    async def gone(self, worker: WorkerSnapshot, at: datetime) -> None:
        """`worker`'s instance left the cloud list; its WorkerNode is removed next."""

    def should_probe(self, name: str) -> bool:
        """Whether to probe side node `name` now (its power may be On)."""

    def held(self, name: str, refusal: Admission | None) -> None:
        """Declared WorkerNode `name` waits for an instance because of `refusal` (a cap,
        creates stopped, the cloud's back-off), or no longer waits (None)."""


class NoObserver:
    """The observer of a pool without a power controller: hears nothing, probes all."""

    def held(self, name: str, refusal: Admission | None) -> None:
        return None

    def probed(
        self, worker: WorkerSnapshot, report: ProbeReport | None, error: SshError | None
    ) -> None:
        return None

    def listed(self, instances: Mapping[str, CloudInstance], at: datetime) -> None:
        return None

    def list_failed(self, at: datetime) -> None:
        return None

    async def gone(self, worker: WorkerSnapshot, at: datetime) -> None:
        return None

    def should_probe(self, name: str) -> bool:
        return True


class PoolPort(Protocol):
    """What the power controller asks of the worker pool (cloud VMs and side-node SSH)."""

    @property
    def cloud_source(self) -> str:
        """The cloud driver's name ("cloud" without one): the source of a gone VM's Off."""

    @property
    def lists_cloud(self) -> bool:
        """Whether a cloud is configured, so a cloud list will come (a cloud VM's power is
        observed from it); False: the pool serves side nodes only."""

    @property
    def holds(self) -> Mapping[str, Admission]:
        """Declared WorkerNodes waiting for an instance, with the refusal that holds them."""

    def snapshot(self, name: str) -> WorkerSnapshot | None:
        """The worker of WorkerNode `name` now, or None when the pool has none."""

    async def destroy_node(self, node: str, reason: str) -> None:
        """Destroy the node's instance (raises CloudError); idempotent."""

    def request_sync(self) -> None:
        """List the cloud soon (the observation of a VM's power)."""

    def request_probe(self, node: str) -> None:
        """Probe the node now (readiness, work, SSH login evidence)."""

    async def ssh_target(self, node: str) -> SshTarget | None:
        """The node's SSH target, or None when refused or unknown."""
