"""How one node's power is observed and changed: its trusted source and its request path.

    control.read_power(node)      -> PowerReading | None   (None: nothing observed now)
    control.read_energy(node)     -> EnergyObservation | NoEnergyReading | None
    control.discover(node)        -> CapabilityReading
    control.request(node, action) -> RequestAccepted | RequestRejected | RequestErrored

The adapters per control method, all reached through the credential resolver with the
node's spec as it is at the moment of use:

- Redfish: PowerState from the BMC (the trusted source), ResetType allowable values /
  ActionInfo (capability), `ComputerSystem.Reset` (the request), the power reading
  (`redfish.energy`: its source discovered once per client, then one GET a read; a
  failed reading is counted, never a PowerSource error: the power state still answers). A 2xx proves acceptance
  only; the state machine waits for the observed state. One client per node, replaced
  when the node's endpoint or credentials change, closed (session deleted) on forget.
- Wake-on-LAN: the magic packet (request "WakeOnLan": "packet sent" is all it proves),
  `systemctl poweroff` over SSH ("SshPoweroff"), capability from ethtool. A BMC in the
  spec is the power source; without one, only a successful SSH login is evidence (of
  On); Off is then never observed, so a shutdown of such a node cannot be confirmed.
- Cloud: destroy through the worker pool; the instance leaving the cloud list is the
  observed Off (delivered by the pool's `listed`/`gone` hooks, not read here).

Errors never escape: every outcome is an event or None, and BMC errors are counted by
class (`nodewarden_bmc_errors_total`).

Fenced (`nodewarden.fence`): every request asks this replica's leadership first and
again as late as this adapter can -- before the Redfish POST once the client is ready,
before the magic packet, right before `systemctl poweroff` leaves over SSH; the cloud
destroy is refused by the cloud layers' own fence. BMCs and Wake-on-LAN cannot check a
fencing token: this check and the power state persisted before the request (the
controller's `persist`) are the fence there. A refused request is `RequestErrored`
("not sent") -- the replica is stepping down; its successor decides again. Every BMC
request carries `user_agent` (dispatcher and replica), for the BMC's audit log.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from nodewarden.api.workernode import WorkerNodeSpec
from nodewarden.cloud.errors import CloudError
from nodewarden.credentials import BmcCredentials, CredentialResolver, Refusal
from nodewarden.fence import Fence, NotLeader, Unfenced
from nodewarden.metrics import BMC_ERRORS, ENERGY_READS, FENCED
from nodewarden.policy.events import RequestAccepted, RequestErrored, RequestRejected
from nodewarden.policy.facts import CapabilityReading, PowerReading
from nodewarden.power.enrolment import BmcUuid
from nodewarden.power.readings import (
    redfish_capability,
    redfish_power,
    refused_capability,
    wake_on_lan_capability,
)
from nodewarden.redfish import (
    ActionNotSupported,
    AuthFailed,
    Conflict409,
    RedfishClient,
    RedfishConnectionError,
    RedfishError,
    RedfishHttpError,
    RedfishProtocolError,
    RedfishTimeout,
    SystemDiscoveryError,
    TlsError,
)
from nodewarden.redfish.energy import (
    EnergyObservation,
    EnergySource,
    NoEnergyReading,
    discover_energy,
    read_energy,
)
from nodewarden.redfish.errors import NotFound
from nodewarden.redfish.transport import BmcTransportFactory
from nodewarden.rules.readings import cloud_capability
from nodewarden.ssh.credentials import SshTarget
from nodewarden.ssh.errors import NotSent, SshError
from nodewarden.ssh.prober import SshProber
from nodewarden.wol import WakeOnLanError, WakeOnLanSender

log = logging.getLogger(__name__)

Outcome = RequestAccepted | RequestRejected | RequestErrored


class CloudNodes(Protocol):
    """What control needs from the worker pool for cloud VMs (and side-node SSH)."""

    async def destroy_node(self, node: str, reason: str) -> None:
        """Destroy the node's instance (raises CloudError); idempotent."""

    def request_sync(self) -> None:
        """List the cloud soon (the observation of a VM's power)."""

    def request_probe(self, node: str) -> None:
        """Probe the node now (readiness, work, SSH login evidence)."""

    async def ssh_target(self, node: str) -> SshTarget | None:
        """The node's SSH target, or None when refused or unknown."""


@dataclass(frozen=True, slots=True)
class NodeRef:
    """What control needs to know of a node to act on it."""

    name: str
    spec: WorkerNodeSpec


def bmc_error_class(exc: RedfishError) -> str:
    """The `class` label of `nodewarden_bmc_errors_total` (one of `BMC_ERROR_CLASSES`)."""
    if isinstance(exc, AuthFailed):
        return "auth"
    if isinstance(exc, TlsError):
        return "tls"
    if isinstance(exc, RedfishTimeout):
        return "timeout"
    if isinstance(exc, RedfishConnectionError):
        return "connection"
    if isinstance(exc, RedfishProtocolError):
        return "protocol"
    if isinstance(exc, (Conflict409, ActionNotSupported)):
        return "rejected"
    if isinstance(exc, RedfishHttpError):
        return "http"
    if isinstance(exc, SystemDiscoveryError):
        return "discovery"
    return "other"


def _fingerprint(creds: BmcCredentials) -> str:
    raw = "|".join(
        (
            creds.endpoint,
            creds.username,
            creds.password.get_secret_value(),
            creds.ca_bundle_pem or "",
            creds.system_id or "",
            str(creds.use_sessions),
        )
    )
    return hashlib.sha256(raw.encode()).hexdigest()


class PowerControl:
    """See the module docstring. One per controller; per-node clients inside."""

    def __init__(
        self,
        credentials: CredentialResolver,
        prober: SshProber | None,
        nodes: CloudNodes | None,
        clock: Callable[[], datetime],
        *,
        request_timeout: float = 15.0,
        observation_concurrency: int = 64,
        fence: Fence | None = None,
        user_agent: str | None = None,
        bmc_transport: BmcTransportFactory | None = None,
    ) -> None:
        self.fence: Fence = fence or Unfenced()
        """Asked before every power request, again right before it leaves the process."""
        self.user_agent = user_agent
        """The replica's identity on every BMC request (the BMC's audit log)."""
        self.bmc_transport = bmc_transport
        """Makes each BMC client's wire (None: HTTPS; a hollow fleet's model in benchmarks)."""
        self.credentials = credentials
        self.prober = prober
        self.nodes = nodes
        self.clock = clock
        self.request_timeout = request_timeout
        self.sender = WakeOnLanSender(clock=clock)
        self._clients: dict[str, tuple[str, RedfishClient]] = {}
        self._observing = asyncio.Semaphore(observation_concurrency)
        """Bounds the BMC observations in flight (a fleet's first reads and logins all fall
        due at start-up); power requests do not take it."""
        self.last_error: dict[str, str] = {}
        """Per node: why its trusted power source did not answer last time (for status)."""
        self._replacing: dict[str, asyncio.Lock] = {}
        self.system_uuids: dict[str, BmcUuid] = {}
        """Per node: the BMC system's UUID, as of its last PowerState read."""
        self._energy: dict[str, tuple[RedfishClient, EnergySource | NoEnergyReading]] = {}
        """Per node: where its power reading is, found with this client."""

    # -- clients ----------------------------------------------------------------------

    async def _redfish(self, node: NodeRef) -> RedfishClient | Refusal:
        creds = await self.credentials.bmc(node.name, node.spec)
        if isinstance(creds, Refusal):
            await self.forget(node.name)
            return creds
        key = _fingerprint(creds)
        held = self._clients.get(node.name)
        if held is not None and held[0] == key:
            return held[1]
        # one replacement at a time per node: a poll and a discovery that both found the
        # old client would otherwise each make a new one, and the one overwritten would
        # keep its session on the BMC (never closed)
        async with self._replacing.setdefault(node.name, asyncio.Lock()):
            return await self._replace(node, creds, key)

    async def _replace(
        self, node: NodeRef, creds: BmcCredentials, key: str
    ) -> RedfishClient | Refusal:
        held = self._clients.get(node.name)
        if held is not None and held[0] == key:
            return held[1]  # made by the caller that held the lock before
        if held is not None:
            self._clients.pop(node.name, None)
            await self._close(held[1])
        try:
            config = creds.redfish_config(request_timeout=self.request_timeout)
            client = RedfishClient(
                config,
                clock=self.clock,
                user_agent=self.user_agent,
                transport=(
                    self.bmc_transport(config, self.user_agent)
                    if self.bmc_transport is not None
                    else None
                ),
            )
        except (RedfishError, ValueError) as exc:
            # credentials the resolver handed out that no client can use (a value out of
            # the config's bounds): refused like any other, never an exception in a poll
            self._clients.pop(node.name, None)
            log.info("WorkerNode %s: BMC client not made (%s)", node.name, type(exc).__name__)
            return Refusal(
                "CredentialsInvalid",
                "spec.bmc",
                "spec.bmc: the designated BMC credentials cannot be used (the operator log "
                "names the cause; docs/security.md)",
            )
        self._clients[node.name] = (key, client)
        return client

    async def _close(self, client: RedfishClient) -> None:
        try:
            await client.close()
        except RedfishError as exc:
            log.info("closing a Redfish session failed: %s", exc)

    async def forget(self, node: str) -> None:
        self.system_uuids.pop(node, None)
        self._energy.pop(node, None)
        self._replacing.pop(node, None)
        held = self._clients.pop(node, None)
        if held is not None:
            await self._close(held[1])

    async def close(self) -> None:
        for node in list(self._clients):
            await self.forget(node)

    def _bmc(self, node: NodeRef) -> bool:
        return node.spec.bmc is not None and node.spec.node_type == "SideNode"

    # -- observation ------------------------------------------------------------------

    async def read_power(self, node: NodeRef) -> PowerReading | Refusal | None:
        """The trusted power reading now (None: none to be had now; for cloud VMs and
        BMC-less nodes the evidence arrives with the next cloud list / probe)."""
        if node.spec.node_type == "CloudVM":
            if self.nodes is not None:
                self.nodes.request_sync()
            return None
        if not self._bmc(node):
            if self.nodes is not None:
                self.nodes.request_probe(node.name)
            return None
        client = await self._redfish(node)
        if isinstance(client, Refusal):
            return client
        try:
            async with self._observing:
                obs = await client.read_power_state()
        except RedfishError as exc:
            self._failed(node.name, "PowerState read", exc)
            return None
        self.last_error.pop(node.name, None)
        if obs.system_uuid is not None:
            self.system_uuids[node.name] = BmcUuid(
                obs.system_uuid, f"{obs.source}#UUID", obs.observed_at
            )
        return redfish_power(obs)

    async def read_energy(self, node: NodeRef) -> EnergyObservation | NoEnergyReading | None:
        """The node's power reading now (None: it failed, or credentials are refused)."""
        if not self._bmc(node):
            return NoEnergyReading("the node has no BMC to read its power from")
        client = await self._redfish(node)
        if isinstance(client, Refusal):
            return None
        try:
            async with self._observing:
                held = self._energy.get(node.name)
                if held is None or held[0] is not client:
                    held = (client, await discover_energy(client))
                    self._energy[node.name] = held
                found = held[1]
                if isinstance(found, NoEnergyReading):
                    ENERGY_READS.labels("none").inc()
                    return found
                got = await read_energy(client, found)
        except RedfishError as exc:
            if isinstance(exc, NotFound):
                self._energy.pop(node.name, None)  # moved: look for it again next time
            ENERGY_READS.labels("failed").inc()
            log.debug("WorkerNode %s: power reading failed: %s", node.name, exc)
            return None
        empty = got.watts is None and got.counter_kwh is None
        ENERGY_READS.labels("null" if empty else "ok").inc()
        return got

    async def discover(self, node: NodeRef, ssh_works: bool) -> CapabilityReading:
        """What the node's control method allows now (or why unknown)."""
        now = self.clock()
        spec = node.spec
        if spec.node_type == "CloudVM":
            return cloud_capability("cloud", now)
        if spec.control_method == "Redfish":
            client = await self._redfish(node)
            if isinstance(client, Refusal):
                return refused_capability("Redfish", client.message, now)
            try:
                async with self._observing:
                    caps = await client.read_reset_capabilities()
            except RedfishError as exc:
                self._failed(node.name, "reset capability discovery", exc)
                return CapabilityReading(
                    source=f"{client.source} (discovery failed: {exc.__class__.__name__})",
                    observed_at=now,
                    control_method="Redfish",
                    allowable=None,
                )
            return redfish_capability(caps, ("SshPoweroff",) if ssh_works else ())
        if spec.control_method == "WakeOnLan":
            wol = await self.credentials.wol(node.name, spec)
            if isinstance(wol, Refusal):
                return refused_capability("WakeOnLan", wol.message, now)
            fact = None
            interface = spec.wake_on_lan.interface if spec.wake_on_lan else None
            target = await self.nodes.ssh_target(node.name) if self.nodes is not None else None
            if interface and target is not None and self.prober is not None:
                try:
                    fact = await self.prober.wake_on_lan(target, interface)
                except SshError as exc:
                    log.info("ethtool on %s failed: %s", node.name, exc)
            elif not interface:
                # no interface named: the administrator vouches for Wake-on-LAN by the spec
                return CapabilityReading(
                    source=f"WorkerNode/{node.name} spec.wakeOnLan (interface not named)",
                    observed_at=now,
                    control_method="WakeOnLan",
                    allowable=("SshPoweroff", "WakeOnLan") if ssh_works else ("WakeOnLan",),
                )
            return wake_on_lan_capability(fact, ssh_works, now, f"ethtool {interface}")
        return CapabilityReading(
            source=f"WorkerNode/{node.name} spec.controlMethod",
            observed_at=now,
            control_method=spec.control_method,
            allowable=None,
        )

    def _failed(self, node: str, what: str, exc: RedfishError) -> None:
        kind = bmc_error_class(exc)
        BMC_ERRORS.labels(kind).inc()
        detail = f"{what} failed ({kind}): {exc}"[:500]
        if self.last_error.get(node) != detail:
            log.warning("WorkerNode %s: BMC %s", node, detail)
        self.last_error[node] = detail

    # -- requests ---------------------------------------------------------------------

    async def request(
        self, node: NodeRef, transition_id: str, attempt: int, action: str
    ) -> Outcome:
        """Send one power request; the outcome names the transition and attempt."""
        spec = node.spec

        def outcome(cls: type[Outcome], source: str, detail: str) -> Outcome:
            return cls(
                transition_id=transition_id,
                attempt=attempt,
                action=action,
                at=self.clock(),
                source=source,
                detail=detail[:1024],
            )

        def fenced() -> Outcome | None:
            """None while this replica may act; else the request's outcome: not sent."""
            try:
                self.fence.check(f"power request {action} for {node.name}")
            except NotLeader as exc:
                FENCED.labels("power").inc()
                return outcome(RequestErrored, "fence", f"not sent: {exc}")
            return None

        if (refused := fenced()) is not None:
            return refused
        if spec.node_type == "CloudVM":
            if self.nodes is None:
                return outcome(RequestRejected, "cloud", "no cloud configured")
            try:
                await self.nodes.destroy_node(node.name, f"power transition {transition_id}")
            except CloudError as exc:  # the cloud layers' fence refuses as NotSent
                return outcome(RequestErrored, "cloud", f"destroy failed: {exc}")
            return outcome(RequestAccepted, "cloud", "destroy accepted (not proof of Off)")
        if action == "WakeOnLan":
            wol = await self.credentials.wol(node.name, spec)
            if isinstance(wol, Refusal):
                return outcome(RequestRejected, "credentials", wol.message)
            if (refused := fenced()) is not None:
                return refused
            try:
                sent = await self.sender.send(
                    wol.mac, destination=wol.destination, port=wol.port, secure_on=wol.secure_on
                )
            except WakeOnLanError as exc:
                return outcome(RequestErrored, "wol", f"packet not sent: {exc}")
            return outcome(
                RequestAccepted, sent.source, "magic packet sent (proves nothing about waking)"
            )
        if action == "SshPoweroff":
            target = await self.nodes.ssh_target(node.name) if self.nodes is not None else None
            if target is None or self.prober is None:
                return outcome(RequestRejected, "ssh", "no SSH login to this node")
            try:
                asked = await self.prober.poweroff(
                    target, guard=lambda: self.fence.check(f"poweroff of {node.name}")
                )
            except NotSent as exc:
                FENCED.labels("power").inc()
                return outcome(RequestErrored, "fence", f"not sent: {exc}")
            except SshError as exc:
                return outcome(RequestErrored, "ssh", f"poweroff: {exc}")
            return outcome(RequestAccepted, asked.source, "poweroff requested (not proof of Off)")
        client = await self._redfish(node)
        if isinstance(client, Refusal):
            return outcome(RequestRejected, "credentials", client.message)
        if (refused := fenced()) is not None:
            return refused
        try:
            result = await client.request_reset(action, check_allowable=False)
        except (Conflict409, ActionNotSupported, AuthFailed, TlsError) as exc:
            self._failed(node.name, f"reset {action}", exc)
            return outcome(RequestRejected, client.source, str(exc))
        except RedfishHttpError as exc:
            self._failed(node.name, f"reset {action}", exc)
            cls = RequestErrored if exc.transient else RequestRejected
            return outcome(cls, client.source, str(exc))
        except RedfishError as exc:
            self._failed(node.name, f"reset {action}", exc)
            return outcome(RequestErrored, client.source, str(exc))
        return outcome(
            RequestAccepted,
            result.source,
            f"HTTP {result.http_status} (accepted; not proof of the power state)",
        )
