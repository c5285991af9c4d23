"""The simulated fleet: cloud instance types with prices and billing, side nodes, delays.

A fleet file (YAML or JSON, camelCase keys; format in docs/simulation.md, example in
examples/simulate/fleet.yaml) describes what the simulator runs the workload on:

* `cloud`: the instance-type catalogue in the operator's own format
  (`nodewarden.scheduling.instancetypes.InstanceType`), the instance-type policy (RAM
  overhead, price factor), how the cloud bills (`billing.period` 0s = per second, else
  per started period, plus a minimum charge), the delays of creating, booting and
  destroying an instance, and how often the operator lists the instances (`listInterval`,
  the operator's `dispatch.syncInterval`: the list is a VM's trusted power source).
  `bootFailureRate` is the share of instances that never become ready (the node-manager's
  unpaired / lame rules then remove them).
* `sideNodes`: fixed hardware, each entry one node or `count` alike ones, with its
  capacity, an optional cost per hour while powered, its control method (Redfish or
  Wake-on-LAN), the power state at the start, boot (power on -> ready probe passes) and
  shutdown (request applied -> power off) delays, how its BMC behaves (answer latency,
  share of accepted requests it silently drops so the controller must re-send, share of
  requests answered with an error, power-poll interval), and its `energy` class (idle,
  busy and off draw, boot / shutdown energy, price per kWh: `simulate.energy`).
* `probe`: the SSH probe interval of a ready node, the interval while a node boots (the
  operator's `dispatch.probeInterval` and `bootProbeInterval`), and the share of probes
  of a ready node that fail (stale telemetry).
* `controller`: the dispatcher tick, API latency, the resync interval of deferred
  decisions and the runner start latency.

`load_fleet(data)` validates a parsed document and raises `InputError` naming the field.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.alias_generators import to_camel

from nodewarden.rules.savings import EnergyClass
from nodewarden.scheduling.instancetypes import Catalogue, InstanceType, InstanceTypePolicy
from nodewarden.simulate.distributions import Delay, to_us
from nodewarden.simulate.errors import InputError, field_errors
from nodewarden.units import Duration, Quantity, parse_quantity


class _Model(BaseModel):
    model_config = ConfigDict(
        extra="forbid", frozen=True, alias_generator=to_camel, populate_by_name=True
    )


class Billing(_Model):
    """How the cloud charges an instance from launch to termination."""

    period: Duration = Field(default="0s", description="0s = per second; else per started period.")
    minimum: Duration = Field(default="60s", description="Minimum charge per instance.")


class CloudFleet(_Model):
    instance_types: tuple[InstanceType, ...] = ()
    instance_type_policy: InstanceTypePolicy = Field(default_factory=InstanceTypePolicy)
    billing: Billing = Field(default_factory=Billing)
    create_latency: Delay = Field(default_factory=lambda: Delay(fixed="2s"))
    boot: Delay = Field(default_factory=lambda: Delay(fixed="90s"))
    shutdown: Delay = Field(default_factory=lambda: Delay(fixed="30s"))
    boot_failure_rate: float = Field(default=0.0, ge=0, le=1)
    max_new_nodes_per_round: int = Field(default=50, ge=1, le=10000)
    list_interval: Duration = "10s"

    @model_validator(mode="before")
    @classmethod
    def _instance_type_keys(cls, data: Any) -> Any:
        # Instance types use the operator's cloud-config format (snake_case); accept the
        # camelCase spelling of a fleet file too, and default providerType to the name.
        if isinstance(data, dict):
            key = "instanceTypes" if "instanceTypes" in data else "instance_types"
            types = data.get(key)
            if isinstance(types, list):
                fixed = []
                for entry in types:
                    if isinstance(entry, dict):
                        entry = {_snake(k): v for k, v in entry.items()}
                        if "name" in entry:
                            entry.setdefault("provider_type", entry["name"])
                    fixed.append(entry)
                data = {**data, key: fixed}
            policy_key = next(
                (k for k in ("instanceTypePolicy", "instance_type_policy") if k in data), None
            )
            if policy_key and isinstance(data[policy_key], dict):
                data = {**data, policy_key: {_snake(k): v for k, v in data[policy_key].items()}}
        return data

    @model_validator(mode="after")
    def _unique(self) -> CloudFleet:
        Catalogue(types=self.instance_types)  # raises on duplicate names
        return self

    @property
    def catalogue(self) -> Catalogue:
        return Catalogue(types=self.instance_types)


class SideCapacity(_Model):
    vcpus: int = Field(ge=1, le=4096)
    ram: Quantity
    scratch: Quantity = "0"
    gpus: int = Field(default=0, ge=0, le=64)
    gpu_model: str | None = None


class Bmc(_Model):
    """How the node's power controller (Redfish BMC, or SSH poweroff + Wake-on-LAN) behaves."""

    latency: Delay = Field(default_factory=lambda: Delay(fixed="1s"))
    drop_rate: float = Field(default=0.0, ge=0, le=1)
    error_rate: float = Field(default=0.0, ge=0, le=1)
    poll_interval: Duration = "10s"


class SideNodeGroup(_Model):
    name: str = Field(min_length=1, max_length=200, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    count: int = Field(default=1, ge=1, le=10000)
    capacity: SideCapacity
    cost_per_hour: float = Field(default=0.0, ge=0)
    control_method: Literal["Redfish", "WakeOnLan"] = "Redfish"
    initial_power: Literal["On", "Off"] = "Off"
    boot: Delay = Field(default_factory=lambda: Delay(fixed="3m"))
    shutdown: Delay = Field(default_factory=lambda: Delay(fixed="1m"))
    bmc: Bmc = Field(default_factory=Bmc)
    energy: EnergyClass | None = None
    """Draws, cycle energy and energy price (`simulate.energy`); unset: no draw."""

    def names(self) -> list[str]:
        if self.count == 1:
            return [self.name]
        width = max(2, len(str(self.count)))
        return [f"{self.name}-{i:0{width}d}" for i in range(1, self.count + 1)]


class Probe(_Model):
    interval: Duration = "10s"
    boot_interval: Duration = "2s"
    failure_rate: float = Field(default=0.0, ge=0, le=1)


class Controller(_Model):
    tick_interval: Duration = "1s"
    api_latency: Duration = "1s"
    resync_interval: Duration = "30s"
    start_latency: Duration = "2s"


class Fleet(_Model):
    """A whole fleet file."""

    description: str = ""
    cloud: CloudFleet = Field(default_factory=CloudFleet)
    side_nodes: tuple[SideNodeGroup, ...] = ()
    probe: Probe = Field(default_factory=Probe)
    controller: Controller = Field(default_factory=Controller)

    @model_validator(mode="after")
    def _checks(self) -> Fleet:
        seen: set[str] = set()
        for group in self.side_nodes:
            for name in group.names():
                if name in seen:
                    raise ValueError(f"side node name {name!r} is used twice")
                seen.add(name)
        for name, value in (
            ("probe.interval", self.probe.interval),
            ("probe.bootInterval", self.probe.boot_interval),
            ("cloud.listInterval", self.cloud.list_interval),
            ("controller.tickInterval", self.controller.tick_interval),
            ("controller.resyncInterval", self.controller.resync_interval),
        ):
            if to_us(value) <= 0:
                raise ValueError(f"{name} must be greater than 0s")
        for group in self.side_nodes:
            if to_us(group.bmc.poll_interval) <= 0:
                raise ValueError(f"sideNodes {group.name}: bmc.pollInterval must be > 0s")
        if not self.cloud.instance_types and not self.side_nodes:
            raise ValueError("the fleet has no instance types and no side nodes")
        return self

    def side_node_count(self) -> int:
        return sum(g.count for g in self.side_nodes)


def side_capacity_bytes(capacity: SideCapacity) -> tuple[int, int]:
    """RAM and scratch of a side node in bytes."""
    return parse_quantity(capacity.ram), parse_quantity(capacity.scratch)


def _snake(key: str) -> str:
    return re.sub(r"(?<!^)([A-Z])", r"_\1", key).lower()


def load_fleet(data: Any) -> Fleet:
    """Validate a parsed fleet document; InputError names the field."""
    if not isinstance(data, dict):
        raise InputError("fleet: the document must be a mapping with cloud, sideNodes, ...")
    try:
        return Fleet.model_validate(data)
    except ValidationError as exc:
        raise InputError(field_errors(exc)) from None
