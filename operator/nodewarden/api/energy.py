"""The energy figures in status: a WorkerNode's (`status.energy`) and a PowerPolicy's sums
(`status.energy`). What each figure means, where it comes from and its error bounds:
docs/energy.md. Written by the power controller with a power transition, or at most every
`power.energy.status_interval` otherwise -- never per reading (live values: the metrics).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import Field

from nodewarden.api.base import MAX_STATUS_DOCUMENT_KEYS, StatusModel
from nodewarden.api.warmcapacity import MAX_NODE_CLASSES

Basis = Literal["Measured", "Configured"]
Method = Literal["Cumulative", "Integrated", "None"]
CURRENCY_PATTERN = r"^[A-Z]{3}$"


class NodeEnergyStatus(StatusModel):
    """One node's energy and what switching it off saved against never-off."""

    since: datetime | None = Field(
        default=None, description="When the figures began (kWh used since then)."
    )
    node_class: str | None = Field(
        default=None, max_length=128, description="The class whose configured draws apply."
    )
    method: Method | None = Field(
        default=None,
        description="Cumulative (the BMC's energy counter), Integrated (watts, trapezoid "
        "between fresh readings) or None (no reading).",
    )
    source: str | None = Field(
        default=None, max_length=512, description="Where the last reading came from."
    )
    message: str | None = Field(
        default=None,
        max_length=1024,
        description="Why there is no reading (a cloud VM; a BMC without a power resource).",
    )
    used_kwh: float | None = Field(default=None, ge=0, le=1e12, description="Energy used (kWh).")
    idle_watts: float | None = Field(
        default=None, ge=0, le=1e12, description="Idle draw (W): measured, or the class's."
    )
    idle_watts_basis: Basis | None = Field(
        default=None, description="Measured (enough idle readings) or Configured."
    )
    off_watts: float | None = Field(
        default=None, ge=0, le=1e12, description="Off (standby) draw (W): measured, or the class's."
    )
    off_watts_basis: Basis | None = Field(
        default=None, description="Measured (an Off reading) or Configured."
    )
    off_seconds: float | None = Field(
        default=None, ge=0, le=1e12, description="Time spent off (s)."
    )
    boots: int | None = Field(default=None, ge=0, le=2**31, description="Power-ons counted.")
    shutdowns: int | None = Field(default=None, ge=0, le=2**31, description="Power-offs counted.")
    saved_kwh: float | None = Field(
        default=None,
        ge=-1e12,
        le=1e12,
        description="Energy saved against never-off: time off x (idle - off draw) - the "
        "cycles' energy above idle draw (negative when cycling cost more).",
    )
    saved_basis: Basis | None = Field(
        default=None, description="Measured when both draws are measured, else Configured."
    )
    money_saved: float | None = Field(
        default=None, ge=-1e12, le=1e12, description="savedKwh x the class's energy price."
    )
    currency: str | None = Field(
        default=None,
        max_length=3,
        pattern=CURRENCY_PATTERN,
        description="ISO 4217 code of moneySaved.",
    )
    gap_seconds: float | None = Field(
        default=None,
        ge=0,
        le=1e12,
        description="Time between readings too far apart to integrate (not counted in usedKwh).",
    )
    gaps: int | None = Field(default=None, ge=0, le=2**31, description="Number of such gaps.")
    updated_at: datetime | None = Field(default=None, description="When these figures were taken.")
    meter: dict[str, Any] | None = Field(
        default=None,
        description="The running meter a restarted or new leader resumes from (written only "
        "by nodewarden's power controller).",
        max_length=MAX_STATUS_DOCUMENT_KEYS,
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )


class ClassEnergyStatus(StatusModel):
    """A node class's side nodes under the policy: saved today, in its time zone."""

    name: str = Field(max_length=63, description="The node class ('(all)': in no class).")
    saved_kwh_today: float = Field(
        ge=-1e12, le=1e12, description="Energy its side nodes saved since local midnight."
    )
    money_saved_today: float = Field(
        ge=-1e12, le=1e12, description="The same x the energy price, since local midnight."
    )
    currency: str = Field(
        max_length=3, pattern=CURRENCY_PATTERN, description="ISO 4217 code of moneySavedToday."
    )


class PolicyEnergyStatus(StatusModel):
    """The sums over a policy's nodes, with "today" in the policy's time zone."""

    time_zone: str | None = Field(default=None, max_length=64, description="spec.timeZone used.")
    day: str | None = Field(
        default=None,
        max_length=10,
        pattern=r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$",
        description="The local day (YYYY-MM-DD) of the *Today figures.",
    )
    used_kwh: float | None = Field(
        default=None,
        ge=0,
        le=1e12,
        description="Energy its side nodes used (kWh), since each began.",
    )
    saved_kwh: float | None = Field(
        default=None,
        ge=-1e12,
        le=1e12,
        description="Energy its side nodes saved against never-off.",
    )
    saved_kwh_today: float | None = Field(
        default=None, ge=-1e12, le=1e12, description="The same, since local midnight."
    )
    money_saved: float | None = Field(
        default=None,
        ge=-1e12,
        le=1e12,
        description="Side nodes' kWh saved x energy price + cloud VM hours avoided x price.",
    )
    money_saved_today: float | None = Field(
        default=None, ge=-1e12, le=1e12, description="The same, since local midnight."
    )
    currency: str | None = Field(
        default=None,
        max_length=3,
        pattern=CURRENCY_PATTERN,
        description="ISO 4217 code of moneySaved.",
    )
    vm_hours_avoided: float | None = Field(
        default=None,
        ge=0,
        le=1e12,
        description="Cloud VM hours a never-off fleet (one that keeps every VM it created) "
        "would have run beyond these.",
    )
    vm_hours_avoided_today: float | None = Field(
        default=None, ge=0, le=1e12, description="The same, since local midnight."
    )
    nodes_measured: int | None = Field(
        default=None, ge=0, le=2**31, description="Side nodes whose saving is measured."
    )
    nodes_configured: int | None = Field(
        default=None, ge=0, le=2**31, description="Side nodes whose saving uses configured draws."
    )
    updated_at: datetime | None = Field(default=None, description="When these figures were taken.")
    classes: list[ClassEnergyStatus] | None = Field(
        default=None,
        max_length=MAX_NODE_CLASSES + 1,
        description="Per node class (spec.nodeClasses; '(all)': nodes in none): its side "
        "nodes' savedKwhToday and moneySavedToday. Cloud VM hours stay per policy.",
    )
    vms: dict[str, Any] | None = Field(
        default=None,
        description="Per instance type: the running peak and hours avoided, kept so a "
        "restarted or new leader resumes them (written only by nodewarden).",
        max_length=MAX_STATUS_DOCUMENT_KEYS,
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )
