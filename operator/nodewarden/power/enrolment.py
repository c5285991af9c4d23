"""A side node's machine identity: its BMC's UUID, its host's UUID, its enrolment (pure).

The BMC's `ComputerSystem.UUID` arrives with each PowerState read, the host's DMI product
UUID with each SSH probe. `IdentityState` keeps the latest of each and when they last
matched; from it come the power gates' `IdentityReading` (a power-off through the BMC
needs a fresh match), the node's `status.enrolment` (written once the BMC's UUID is first
read -- which freezes the node's BMC and SSH identity fields at admission -- and again
only when a UUID changes or first matches), and the node's claim on its BMC for the
one-machine-one-BMC registry (`credentials.bmcidentity`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from nodewarden.api.workernode import WorkerNodeSpec
from nodewarden.credentials.bmcidentity import BmcClaim, normalised_endpoint
from nodewarden.policy.facts import IdentityReading
from nodewarden.ssh.facts import HostUuidFact
from nodewarden.units import parse_rfc3339, rfc3339


@dataclass(frozen=True, slots=True)
class BmcUuid:
    uuid: str
    source: str
    observed_at: datetime


@dataclass(slots=True)
class IdentityState:
    """What the controller holds of one node's identity between steps."""

    bmc: BmcUuid | None = None
    host: HostUuidFact | None = None
    matched_at: datetime | None = None
    matched_uuid: str | None = None
    enrolled: dict[str, Any] | None = None
    """status.enrolment as last written (or found at start-up)."""

    @classmethod
    def from_status(cls, enrolment: object) -> IdentityState:
        """Resume from `status.enrolment` (the recorded match survives a restart)."""
        if not isinstance(enrolment, Mapping):
            return cls()
        state = cls(enrolled=dict(enrolment))
        verified = parse_rfc3339(enrolment.get("verifiedAt"))
        uuid = enrolment.get("bmcUuid")
        if verified is not None and isinstance(uuid, str):
            state.matched_at, state.matched_uuid = verified, uuid
        return state

    def observe_bmc(self, uuid: str, source: str, at: datetime) -> bool:
        """A BMC read; whether the UUID is news."""
        changed = self.bmc is None or self.bmc.uuid != uuid
        self.bmc = BmcUuid(uuid, source, at)
        self._match()
        return changed

    def observe_host(self, fact: HostUuidFact) -> bool:
        """A probe's reading of the host's UUID; whether what it says is news."""
        old = self.host
        self.host = fact
        self._match()
        return old is None or (old.uuid, old.problem) != (fact.uuid, fact.problem)

    def _match(self) -> None:
        bmc, host = self.bmc, self.host
        if bmc is not None and host is not None and host.uuid == bmc.uuid:
            self.matched_at = max(bmc.observed_at, host.observed_at)
            self.matched_uuid = bmc.uuid

    def reading(self) -> IdentityReading | None:
        """The gates' evidence (None: nothing read yet and nothing recorded)."""
        bmc, host = self.bmc, self.host
        parts = [(p.observed_at, p.source) for p in (bmc, host) if p is not None]
        if not parts and self.matched_at is None:
            return None
        newest, source = max(parts) if parts else (self.matched_at, "status.enrolment")
        assert newest is not None
        return IdentityReading(
            source=source,
            observed_at=newest,
            bmc_uuid=bmc.uuid if bmc else None,
            bmc_source=bmc.source if bmc else "-",
            bmc_observed_at=bmc.observed_at if bmc else None,
            host_uuid=host.uuid if host else None,
            host_problem=host.problem if host else None,
            host_source=host.source if host else "-",
            host_observed_at=host.observed_at if host else None,
            matched_at=self.matched_at,
            matched_uuid=self.matched_uuid,
        )

    def enrolment(self, spec: WorkerNodeSpec) -> dict[str, Any] | None:
        """The `status.enrolment` to hold now (None: the BMC's UUID was never read). The
        first record keeps its times; a record changes only when a UUID does."""
        bmc = self.bmc
        if bmc is None or spec.bmc is None:
            return self.enrolled
        old = self.enrolled or {}
        host_uuid = self.host.uuid if self.host is not None else old.get("hostUuid")
        verified = old.get("verifiedAt")
        if verified is None and self.matched_uuid == bmc.uuid and self.matched_at is not None:
            verified = rfc3339(self.matched_at)
        record = {
            "bmcEndpoint": old.get("bmcEndpoint") or normalised_endpoint(spec.bmc.endpoint),
            "systemId": old.get("systemId", spec.bmc.system_id),
            "bmcUuid": bmc.uuid,
            "sshAddress": old.get("sshAddress", spec.ssh.address),
            "sshPort": old.get("sshPort", spec.ssh.port),
            "hostUuid": host_uuid,
            "enrolledAt": old.get("enrolledAt") or rfc3339(bmc.observed_at),
            "verifiedAt": verified,
        }
        return {k: v for k, v in record.items() if v is not None}  # as the server keeps it

    def claim(self, node: str, spec: WorkerNodeSpec | None, created: str) -> BmcClaim | None:
        """This node's claim on its BMC (None: it names none)."""
        if spec is None or spec.bmc is None or spec.node_type != "SideNode":
            return None
        uuid = self.bmc.uuid if self.bmc is not None else None
        if uuid is None and self.enrolled is not None:
            recorded = self.enrolled.get("bmcUuid")
            uuid = recorded if isinstance(recorded, str) else None
        verified = self.matched_uuid is not None and self.matched_uuid == uuid
        return BmcClaim(
            node=node,
            endpoint=normalised_endpoint(spec.bmc.endpoint),
            system_id=spec.bmc.system_id,
            created=created,
            uuid=uuid,
            verified=verified,
        )
