"""Adapter facts -> the power core's readings, keeping provenance and real observation times.

Pure conversions of the adapters' fact types (Redfish, SSH, the cloud list); the rules on
plain values both the shell and the simulator call are in `rules/readings.py`. Each reading's `observed_at` is when the adapter *observed* the value
(when the probe command was sent, when the BMC answered, when the cloud list was read),
never when it was cached or converted, so freshness gates measure the evidence itself.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import get_args

from nodewarden.api.powerpolicy import ResetAction
from nodewarden.api.workernode import ControlMethod, ObservedPower
from nodewarden.cloud.model import CloudInstance, InstanceState
from nodewarden.policy.facts import (
    CapabilityReading,
    Inhibitor,
    InhibitorReading,
    PowerReading,
    ReadyReading,
    UptimeReading,
)
from nodewarden.redfish.facts import PowerStateObservation, ResetCapabilities
from nodewarden.ssh.facts import InhibitorsFact, ReadyFact, UptimeFact, WakeOnLanFact

_RESET_ACTIONS: frozenset[str] = frozenset(get_args(ResetAction))


CLOUD_POWER: dict[InstanceState, ObservedPower] = {
    InstanceState.PENDING: "PoweringOn",
    InstanceState.RUNNING: "On",
    InstanceState.STOPPING: "PoweringOff",
    InstanceState.STOPPED: "Off",
    InstanceState.TERMINATED: "Off",
    InstanceState.ERROR: "Unknown",
    InstanceState.UNKNOWN: "Unknown",
}


def redfish_power(obs: PowerStateObservation) -> PowerReading:
    return PowerReading(
        source=f"{obs.source}#PowerState",
        observed_at=obs.observed_at,
        power=obs.state.observed_power,
    )


def cloud_power(instance: CloudInstance) -> PowerReading:
    return PowerReading(
        source=f"{instance.source} instance {instance.id}",
        observed_at=instance.observed_at,
        power=CLOUD_POWER.get(instance.state, "Unknown"),
    )


def ssh_power(ready: ReadyFact) -> PowerReading:
    """A side node without a BMC: a successful SSH login proves it is On. (Failures prove
    nothing, so they never produce a reading: Off is never inferred from silence.)"""
    return PowerReading(
        source=f"{ready.source} (login succeeded)", observed_at=ready.observed_at, power="On"
    )


def ready_reading(ready: ReadyFact) -> ReadyReading:
    return ReadyReading(
        source=ready.source,
        observed_at=ready.observed_at,
        passed=ready.ready,
        detail=ready.detail[:1024],
    )


def inhibitor_reading(fact: InhibitorsFact) -> InhibitorReading:
    locks = tuple(
        Inhibitor(
            what=":".join(i.what) or "?",
            who=i.who[:256],
            why=i.why[:1024],
            mode=i.mode if i.mode in ("block", "delay", "block-weak") else "block",
            uid=i.uid,
            pid=i.pid,
        )
        for i in fact.inhibitors
    )
    return InhibitorReading(source=fact.source, observed_at=fact.observed_at, inhibitors=locks)


def uptime_reading(fact: UptimeFact) -> UptimeReading:
    return UptimeReading(source=fact.source, observed_at=fact.observed_at, on_since=fact.booted_at)


def cloud_uptime(instance: CloudInstance) -> UptimeReading | None:
    if instance.created_at is None:
        return None
    on_since = min(instance.created_at, instance.observed_at)
    return UptimeReading(
        source=f"{instance.source} launch time", observed_at=instance.observed_at, on_since=on_since
    )


def _actions(values: Iterable[str]) -> tuple[ResetAction, ...]:
    return tuple(sorted(v for v in values if v in _RESET_ACTIONS))  # type: ignore[misc]


def redfish_capability(caps: ResetCapabilities, extra: Iterable[str] = ()) -> CapabilityReading:
    """What the BMC allows (ResetType@Redfish.AllowableValues or ActionInfo). Unknown
    (the BMC does not say) stays unknown: the capability gate treats it as unavailable."""
    allowable: tuple[ResetAction, ...] | None
    if caps.found_in == "no_reset_action":
        allowable = _actions(extra)
    elif caps.allowable is None:
        allowable = None
    else:
        allowable = _actions([*caps.allowable, *extra])
    return CapabilityReading(
        source=f"{caps.source} ({caps.found_in})",
        observed_at=caps.observed_at,
        control_method="Redfish",
        allowable=allowable,
    )


def wake_on_lan_capability(
    fact: WakeOnLanFact | None, ssh_login_works: bool, observed_at: datetime, source: str
) -> CapabilityReading:
    """WakeOnLan if ethtool shows the NIC supports and is armed for magic packets ('g');
    SshPoweroff if nodewarden can log in. Unknown NIC support: only SshPoweroff."""
    allowable: list[str] = []
    if fact is not None and fact.supports_magic_packet and fact.magic_packet_enabled:
        allowable.append("WakeOnLan")
    if ssh_login_works:
        allowable.append("SshPoweroff")
    return CapabilityReading(
        source=source if fact is None else fact.source,
        observed_at=observed_at if fact is None else fact.observed_at,
        control_method="WakeOnLan",
        allowable=_actions(allowable),
    )


def refused_capability(
    method: ControlMethod, refusal: str, observed_at: datetime
) -> CapabilityReading:
    """The credential resolver refused: nothing was asked of the node."""
    return CapabilityReading(
        source="credentials",
        observed_at=observed_at,
        control_method=method,
        allowable=None,
        refusal=refusal[:1024],
    )
