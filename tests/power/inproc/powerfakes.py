"""The fakes around the in-process power controller (`harness.PowerHarness` wires them):
the clock, the machines (`Host`), the power-control port, the worker pool's port, and the
in-memory API with designated Secrets and an informer's view of what changed."""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import SecretStr

from memkube import MemoryKube
from nodewarden.api.kinds import WORKER_NODE
from nodewarden.credentials import LABEL, CredentialResolver, Refusal
from nodewarden.fleet.ports import WorkerSnapshot
from nodewarden.kube.client import SecretRecord
from nodewarden.policy.events import RequestAccepted, RequestErrored, RequestRejected
from nodewarden.policy.facts import CapabilityReading, PowerReading
from nodewarden.power.enrolment import BmcUuid
from nodewarden.power.readings import refused_capability
from nodewarden.redfish.energy import EnergyObservation, NoEnergyReading
from nodewarden.rules.readings import cloud_capability
from nodewarden.scheduling.caps import Admission
from nodewarden.ssh.credentials import SshTarget

NS = "ns"
DISPATCHER = "d"
T0 = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
BMC = "https://127.0.0.1:8443"
KNOWN_HOSTS = (
    "[127.0.0.1]:2222 ssh-ed25519 "
    "AAAAC3NzaC1lZDI1NTE5AAAAILLmdKMAN6GUsX0G27qlCUZBeutObUxCMHUstUcgWo1n"
)  # a public host key (no private half kept anywhere): the node's known_hosts line

BMC_SPEC: dict[str, Any] = {
    "endpoint": BMC,
    "usernameSecretRef": {"name": "bmc", "key": "username"},
    "passwordSecretRef": {"name": "bmc", "key": "password"},
}


Outcome = RequestAccepted | RequestRejected | RequestErrored


def container_uuid(name: str) -> str:
    """The container uuid (Arvados form) a test's short container name stands for."""
    return "zzzzz-dz642-" + hashlib.sha256(name.encode()).hexdigest()[:15]


class FakeClock:
    """The one clock of the run; only the test moves it."""

    def __init__(self, at: datetime = T0) -> None:
        self.now = at

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> datetime:
        self.now += timedelta(seconds=seconds)
        return self.now


# ---------------------------------------------------------------------- the world


@dataclass
class Host:
    """One side node's machine as the fakes see it."""

    name: str
    power: str = "On"
    ready: bool = True
    runners: int = 0
    inhibitors: tuple[str, ...] = ()
    """Block-mode shutdown inhibitors held (their `who`)."""
    host_uuid: str | None = None
    bmc_uuid: str | None = None
    allowable: tuple[str, ...] | None = ("On", "ForceOff", "GracefulShutdown", "PowerCycle")
    """What the BMC (or NIC) allows; None: it does not say."""
    applies: bool = True
    """Whether the BMC applies an accepted reset (False: it accepts and does nothing)."""
    apply_delay: float = 5.0
    """Fake seconds between an accepted request and the power changing."""
    ready_delay: float = 5.0
    """Fake seconds between power On and the ready probe passing."""
    bmc_answers: bool = True
    """False: every BMC read fails (the fake's last_error says why)."""
    probe_fails: bool = False
    """True: SSH probes fail (while the host is On)."""
    booted_at: datetime = T0 - timedelta(hours=1)
    pending: list[tuple[datetime, str]] = field(default_factory=list)
    reading: str = "watts"
    """The BMC's power reading: "watts", "cumulative" (an EnergykWh counter too), "none"
    (no power resource, as sushy-tools), "null" (watts always null)."""
    watts: float = 200.0
    """The draw while On (a test may change it)."""
    off_watts: float = 6.0
    """The standby draw the BMC reports while Off."""
    energy_joules: float = 0.0
    energy_at: datetime | None = None

    def meter(self, now: datetime) -> None:
        """The exact energy drawn up to `now` (constant draw between changes)."""
        if self.energy_at is not None and now > self.energy_at:
            draw = self.watts if self.power == "On" else self.off_watts
            self.energy_joules += draw * (now - self.energy_at).total_seconds()
        self.energy_at = now if self.energy_at is None or now > self.energy_at else self.energy_at

    def settle(self, now: datetime) -> None:
        """Apply the power changes whose time has come."""
        due = [p for p in self.pending if p[0] <= now]
        self.pending = [p for p in self.pending if p[0] > now]
        for at, power in due:
            self.meter(at)
            if power == "On" and self.power != "On":
                self.booted_at = at
            self.power = power
        self.meter(now)

    def is_ready(self, now: datetime) -> bool:
        return (
            self.power == "On"
            and self.ready
            and now >= self.booted_at + timedelta(seconds=self.ready_delay)
        )


@dataclass(frozen=True)
class Sent:
    """One power request the controller sent."""

    node: str
    action: str
    transition_id: str
    attempt: int
    at: datetime
    persisted: str | None = None
    """The power state the WorkerNode's status held when the request left (the state
    machine persists it before sending)."""


class FakeControl:
    """A structural fake of `PowerControl`: the BMC / WoL / SSH poweroff / cloud destroy
    adapters answered from the `Host`s, every request recorded."""

    def __init__(
        self,
        clock: FakeClock,
        hosts: dict[str, Host],
        kube: MemoryKube | None = None,
        credentials: CredentialResolver | None = None,
    ) -> None:
        self.clock = clock
        self.hosts = hosts
        self.kube = kube
        self.credentials = credentials
        """As the real adapter: a BMC is reached only with credentials the resolver gives
        (it refuses, e.g., a BMC another node holds)."""

        self.last_error: dict[str, str] = {}
        self.system_uuids: dict[str, Any] = {}
        self.requests: list[Sent] = []
        self.reads: list[tuple[str, datetime]] = []
        self.energy_reads: list[tuple[str, datetime, str]] = []
        """Every power reading taken: (node, when, the power then): one Redfish GET each."""
        self.answers: dict[str, list[str]] = {}
        """Per action: the answers to give next ("accepted", "rejected", "errored"), in
        order; when empty, an action is accepted."""
        self.forgotten: list[str] = []
        self.closed = False

    async def _refused(self, node: Any) -> Refusal | None:
        if self.credentials is None or node.spec.bmc is None:
            return None
        got = await self.credentials.bmc(node.name, node.spec)
        return got if isinstance(got, Refusal) else None

    def sent(self, node: str | None = None, action: str | None = None) -> list[Sent]:
        return [
            r
            for r in self.requests
            if (node is None or r.node == node) and (action is None or r.action == action)
        ]

    async def read_power(self, node: Any) -> PowerReading | Refusal | None:
        spec = node.spec
        if spec.node_type == "CloudVM" or spec.bmc is None:
            return None  # the evidence comes with the cloud list / the next probe
        refused = await self._refused(node)
        if refused is not None:
            return refused
        host = self.hosts[node.name]
        now = self.clock()
        host.settle(now)
        self.reads.append((node.name, now))
        if not host.bmc_answers:
            self.last_error[node.name] = "PowerState read failed (connection): refused"
            return None
        self.last_error.pop(node.name, None)
        if host.bmc_uuid is not None:
            self.system_uuids[node.name] = BmcUuid(host.bmc_uuid, f"{BMC}#UUID", now)
        return PowerReading(
            source=f"{BMC}/redfish/v1/Systems/1#PowerState", observed_at=now, power=host.power
        )  # type: ignore[arg-type]

    async def read_energy(self, node: Any) -> EnergyObservation | NoEnergyReading | None:
        """The BMC's power reading, as `redfish.energy` returns it (one GET)."""
        spec = node.spec
        if spec.node_type == "CloudVM" or spec.bmc is None:
            return NoEnergyReading("the node has no BMC to read its power from")
        host = self.hosts[node.name]
        now = self.clock()
        host.settle(now)
        if host.reading == "none":
            return NoEnergyReading("the BMC serves no Power, PowerSubsystem or EnvironmentMetrics")
        self.energy_reads.append((node.name, now, host.power))
        if not host.bmc_answers:
            return None
        watts = host.watts if host.power == "On" else host.off_watts
        return EnergyObservation(
            source=f"{BMC}/redfish/v1/Chassis/1/Power#PowerConsumedWatts",
            observed_at=now,
            watts=None if host.reading == "null" else watts,
            counter_kwh=host.energy_joules / 3_600_000 if host.reading == "cumulative" else None,
        )

    async def discover(self, node: Any, ssh_works: bool) -> CapabilityReading:
        now = self.clock()
        spec = node.spec
        if spec.node_type == "CloudVM":
            return cloud_capability("cloud", now)  # as the live control's discovery
        refused = await self._refused(node)
        if refused is not None:
            return refused_capability(spec.control_method, refused.message, now)
        host = self.hosts[node.name]
        allowable: list[str] | None = None
        if host.allowable is not None:
            allowable = list(host.allowable)
            if ssh_works:
                allowable.append("SshPoweroff")
        return CapabilityReading(
            source=f"fake {spec.control_method}",
            observed_at=now,
            control_method=spec.control_method,
            allowable=tuple(allowable) if allowable is not None else None,  # type: ignore[arg-type]
        )

    async def request(self, node: Any, transition_id: str, attempt: int, action: str) -> Outcome:
        now = self.clock()
        persisted = None
        if self.kube is not None:
            stored = self.kube.status(WORKER_NODE, NS, node.name).get("powerState") or {}
            persisted = stored.get("state")
        self.requests.append(Sent(node.name, action, transition_id, attempt, now, persisted))
        queued = self.answers.get(action) or []
        answer = queued.pop(0) if queued else "accepted"
        refused = await self._refused(node)
        if refused is not None:
            answer = "rejected"
        cls: type[Outcome] = {
            "accepted": RequestAccepted,
            "rejected": RequestRejected,
            "errored": RequestErrored,
        }[answer]
        host = self.hosts.get(node.name)
        if answer == "accepted" and host is not None and host.applies:
            target = "On" if action in ("On", "WakeOnLan") else "Off"
            if action in ("PowerCycle", "ForceRestart", "GracefulRestart"):
                target = "On"
            host.pending.append((now + timedelta(seconds=host.apply_delay), target))
        return cls(
            transition_id=transition_id,
            attempt=attempt,
            action=action,
            at=now,
            source=f"fake:{action}",
            detail=f"{answer} (fake)",
        )

    async def forget(self, node: str) -> None:
        self.forgotten.append(node)

    async def close(self) -> None:
        self.closed = True


class FakePool:
    """The worker pool's port (`PoolPort`): records what the controller asks of it."""

    def __init__(self) -> None:
        self.snapshots: dict[str, WorkerSnapshot] = {}
        self._holds: dict[str, Admission] = {}
        self.probe_requests: list[str] = []
        self.sync_requests = 0
        self.destroyed: list[tuple[str, str]] = []
        self.cloud = True
        """False: no cloud is configured (the pool serves side nodes only)."""

    @property
    def cloud_source(self) -> str:
        return "fake"

    @property
    def lists_cloud(self) -> bool:
        return self.cloud

    @property
    def holds(self) -> Mapping[str, Admission]:
        return self._holds

    def snapshot(self, name: str) -> WorkerSnapshot | None:
        return self.snapshots.get(name)

    async def destroy_node(self, node: str, reason: str) -> None:
        self.destroyed.append((node, reason))

    def request_sync(self) -> None:
        self.sync_requests += 1

    def request_probe(self, node: str) -> None:
        self.probe_requests.append(node)

    async def ssh_target(self, node: str) -> SshTarget | None:
        return None


class EchoKube(MemoryKube):
    """MemoryKube that knows which objects changed since the informer last looked, and
    keeps designated Secrets (`secret`: labelled for a use, as an administrator makes)."""

    def __init__(self) -> None:
        super().__init__()
        self.secret_labels: dict[str, str] = {}

    def secret(self, name: str, use: str, **values: str) -> None:
        self.secrets[(NS, name)] = dict(values)
        self.secret_labels[name] = use

    async def read_secret_record(self, namespace: str, name: str) -> SecretRecord | None:
        data = self.secrets.get((namespace, name))
        if data is None:
            return None
        labels = {LABEL: self.secret_labels.get(name, "")}
        return SecretRecord(name, labels, {k: SecretStr(v) for k, v in data.items()})

    def changed(self, kind: str, seen: dict[tuple[str, str], str]) -> list[dict[str, Any]]:
        out = []
        for (k, _ns, name), obj in sorted(self.objects.items()):
            if k != kind:
                continue
            rv = obj["metadata"]["resourceVersion"]
            if seen.get((k, name)) != rv:
                seen[(k, name)] = rv
                out.append(copy.deepcopy(obj))
        return out
