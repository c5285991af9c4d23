"""A system's power reading from its BMC: where it is (discovered once), then one GET a read.

    discover_energy(client) -> EnergySource | NoEnergyReading
    read_energy(client, source) -> EnergyObservation

Discovery follows the ComputerSystem's `Links.Chassis[0]` (else the only member of the
Chassis collection) and looks, in this order, for:

1. `EnvironmentMetrics.EnergykWh.Reading` -- a cumulative energy counter (preferred: no
   integration, no gaps);
2. `EnvironmentMetrics.PowerWatts.Reading` -- the newer power resource (with
   `PowerSubsystem`; its per-supply metrics are not read: one GET per supply, and the
   chassis figure is their sum);
3. `Power.PowerControl[].PowerConsumedWatts` -- the legacy resource (Dell: populated,
   while `PowerSupplies[].LastPowerOutputWatts` stays null and no kWh is offered).

A property present but null at discovery is kept as the source only when nothing else
has a value (a BMC that fills it in later; until then every read is a null reading,
counted, never integrated). A chassis with none of these resources -- sushy-tools 2.2
serves only `Thermal` -- is `NoEnergyReading`, which status shows as "no reading".

Every observation names its source: "redfish:<endpoint><path>#<property>".
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from nodewarden.redfish.client import RedfishClient
from nodewarden.redfish.errors import NotFound

CHASSIS_COLLECTION = "/redfish/v1/Chassis"
EnergyKind = Literal["EnvironmentMetrics.EnergykWh", "EnvironmentMetrics.PowerWatts", "Power"]


@dataclass(frozen=True, slots=True)
class EnergySource:
    """Where a system's reading is: the resource to GET and what to read in it."""

    path: str
    kind: EnergyKind
    label: str
    """The property, for the source string ("EnvironmentMetrics.PowerWatts.Reading")."""


@dataclass(frozen=True, slots=True)
class NoEnergyReading:
    """The BMC serves no power reading for this system (and why)."""

    reason: str


@dataclass(frozen=True, slots=True)
class EnergyObservation:
    """One reading: watts and/or a cumulative counter (None: the BMC gave no value)."""

    source: str
    observed_at: datetime
    watts: float | None
    counter_kwh: float | None


async def discover_energy(client: RedfishClient) -> EnergySource | NoEnergyReading:
    """Find the system's power reading (module docstring). Raises the client's errors."""
    system = await client.discover_system()
    body = await client.read_resource(system.path, "reading the ComputerSystem")
    links = body.get("Links")
    chassis_path = _first_link(links.get("Chassis") if isinstance(links, dict) else None)
    if chassis_path is None:
        collection = await _optional(client, CHASSIS_COLLECTION, "listing chassis")
        members = (collection or {}).get("Members")
        found = [m for m in members if _link(m)] if isinstance(members, list) else []
        if len(found) != 1:
            return NoEnergyReading(
                f"the ComputerSystem links no Chassis and the BMC lists {len(found)}"
            )
        chassis_path = _link(found[0])
        assert chassis_path is not None
    chassis = await client.read_resource(chassis_path, "reading the Chassis")
    null_found: EnergySource | None = None
    environment = _link(chassis.get("EnvironmentMetrics"))
    if environment is not None:
        env = await _optional(client, environment, "reading EnvironmentMetrics")
        if env is not None:
            if _number(_reading(env.get("EnergykWh"))) is not None:
                return EnergySource(
                    environment, "EnvironmentMetrics.EnergykWh", "EnvironmentMetrics.EnergykWh"
                )
            watts = EnergySource(
                environment, "EnvironmentMetrics.PowerWatts", "EnvironmentMetrics.PowerWatts"
            )
            if _number(_reading(env.get("PowerWatts"))) is not None:
                return watts
            if isinstance(env.get("PowerWatts"), dict):
                null_found = watts
    power = _link(chassis.get("Power"))
    if power is not None:
        legacy = await _optional(client, power, "reading Power")
        if legacy is not None:
            controls = legacy.get("PowerControl")
            source = EnergySource(power, "Power", "Power.PowerControl.PowerConsumedWatts")
            if _consumed(controls) is not None:
                return source
            if isinstance(controls, list) and controls and null_found is None:
                null_found = source
    if null_found is not None:
        return null_found
    return NoEnergyReading(
        "the BMC serves no Power, PowerSubsystem or EnvironmentMetrics reading for this "
        "system's chassis"
    )


async def read_energy(client: RedfishClient, source: EnergySource) -> EnergyObservation:
    """One GET of `source`: the reading now. Raises the client's errors."""
    body = await client.read_resource(source.path, "reading power")
    watts: float | None
    counter: float | None = None
    if source.kind == "Power":
        watts = _consumed(body.get("PowerControl"))
    else:
        watts = _number(_reading(body.get("PowerWatts")))
        if source.kind == "EnvironmentMetrics.EnergykWh":
            counter = _number(_reading(body.get("EnergykWh")))
    return EnergyObservation(
        source=f"{client.source}{source.path}#{source.label}",
        observed_at=client.now(),
        watts=watts,
        counter_kwh=counter,
    )


async def _optional(client: RedfishClient, path: str, what: str) -> dict[str, Any] | None:
    try:
        return await client.read_resource(path, what)
    except NotFound:
        return None  # linked but not served: as if not linked


def _link(value: object) -> str | None:
    if isinstance(value, dict) and isinstance(value.get("@odata.id"), str):
        return str(value["@odata.id"]) or None
    return None


def _first_link(value: object) -> str | None:
    if isinstance(value, list):
        for item in value:
            found = _link(item)
            if found is not None:
                return found
    return None


def _reading(excerpt: object) -> object:
    return excerpt.get("Reading") if isinstance(excerpt, dict) else None


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if value >= 0 else None


def _consumed(controls: object) -> float | None:
    """The first PowerControl entry's PowerConsumedWatts that has a value (the chassis
    total is the first entry on the BMCs seen)."""
    if not isinstance(controls, list):
        return None
    for control in controls:
        if isinstance(control, dict):
            value = _number(control.get("PowerConsumedWatts"))
            if value is not None:
                return value
    return None
