"""The operator configuration's `credentials` section: where credentials may be sent.

A pydantic model of `nodewarden.config.OperatorConfig`; its validator parses the
allow-list entries with `nodewarden.credentials.admission` (the resolver parses them again
into `AdmissionList`s).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from nodewarden.credentials.admission import InvalidRule, parse_entries
from nodewarden.units import Duration


class CredentialsConfig(BaseModel):
    """Where credentials named by WorkerNodes may be sent (docs/security.md).

    Each entry: a host name, '*.' + a domain, an IP address or a CIDR network, optionally
    followed by ':PORT' (IPv6 in brackets). Names are never resolved to match networks.
    Empty lists admit nothing: no BMC, side-node SSH or Wake-on-LAN target is contacted.
    """

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    bmc_endpoints: list[str] = Field(
        default_factory=list, description="Endpoints BMC (Redfish) credentials may be sent to."
    )
    ssh_endpoints: list[str] = Field(
        default_factory=list,
        description=(
            "Side-node SSH addresses nodewarden may log in to (cloud VMs are admitted by the "
            "address the cloud reports for nodewarden's own instance)."
        ),
    )
    wake_on_lan_targets: list[str] = Field(
        default_factory=list,
        description="Broadcast addresses (and ports) Wake-on-LAN packets may be sent to.",
    )
    secret_ttl: Duration = Field(
        default="30s",
        description="How long a designated Secret read is reused before it is read again.",
    )

    @model_validator(mode="after")
    def _entries_parse(self) -> CredentialsConfig:
        for kind, field, entries in (
            ("bmc", "bmc_endpoints", self.bmc_endpoints),
            ("ssh", "ssh_endpoints", self.ssh_endpoints),
            ("wol", "wake_on_lan_targets", self.wake_on_lan_targets),
        ):
            try:
                parse_entries(kind, entries)  # type: ignore[arg-type]
            except InvalidRule as exc:
                raise ValueError(f"{field}: {exc}") from None
        return self
