"""What switching nodes off saved, against a node that is never switched off. Pure.

    EnergyClass                      a class of machine: configured draws, cycle energy, price
    draws(meter, klass, idle_min)    idle and off draw, measured or configured (labelled)
    saved_joules(off_s, draws, boots, shutdowns, klass)   the counterfactual rule
    node_energy(meter, klass, ...)   a node's figures (WorkerNode status.energy)
    expected_saving / measured_saving  the Safety Record's evidence (not a gate)
    VmHours, vm_count(...)           cloud VM hours avoided against never-off
    policy_energy(...)               a PowerPolicy's sums, with "today" in its time zone
    saved_today_by_class(...)        its side nodes' saving today, per node class

**Never-off counterfactual** (docs/energy.md). A side node that is never switched off
draws its idle draw while ours is off, and never boots or shuts down. So the energy
saved is `off time x (idle draw - off draw) - boots x boot energy - shutdowns x shutdown
energy`, where boot and shutdown energy are the energy above idle draw a cycle costs
(the class's configured figures: a BMC read at most once a minute cannot resolve a boot
of a few minutes). Idle draw is measured once the node has spent `idle_min` of integrated
stretches idle (`rules.energy`), off draw once an Off reading came; until then the class's
configured draw is used and the figure is labelled "Configured".

**Cloud VMs** report no draw; what never-off saves on them is money: a never-off fleet
keeps every VM it ever created, so at any time it runs the most VMs of a type this one
ran so far (its running peak); the hours avoided are `peak - running` integrated over
time, priced at the type's catalogue price.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import date, datetime, timedelta, tzinfo
from typing import Literal

from pydantic import AwareDatetime, Field

from nodewarden.policy.base import CoreModel
from nodewarden.policy.record import EnergyEvidence
from nodewarden.rules.energy import (
    JOULES_PER_KWH,
    EnergyMeter,
    EnergyMethod,
    Phase,
    local_midnight,
    roll_day,
)

Basis = Literal["Measured", "Configured"]
_WH = 3600.0


class EnergyClass(CoreModel):
    """A class of machine's configured draws and energy price (docs/energy.md)."""

    idle_watts: float = Field(
        default=0.0, ge=0, le=100_000, description="Draw while on and idle (W)."
    )
    busy_watts: float | None = Field(
        default=None,
        ge=0,
        le=100_000,
        description="Draw while running work (W); the simulator's, unset: idleWatts.",
    )
    off_watts: float = Field(
        default=0.0, ge=0, le=100_000, description="Standby draw while switched off (W)."
    )
    boot_energy_wh: float = Field(
        default=0.0, ge=0, le=1_000_000, description="Energy above idle draw one boot costs (Wh)."
    )
    shutdown_energy_wh: float = Field(
        default=0.0,
        ge=0,
        le=1_000_000,
        description="Energy above idle draw one shutdown costs (Wh).",
    )
    price_per_kwh: float = Field(
        default=0.0, ge=0, le=10_000, description="Energy price per kWh, in the currency."
    )

    @property
    def cycle_joules(self) -> float:
        return (self.boot_energy_wh + self.shutdown_energy_wh) * _WH


class Draws(CoreModel):
    idle_watts: float
    idle_basis: Basis
    off_watts: float
    off_basis: Basis

    @property
    def basis(self) -> Basis:
        measured = self.idle_basis == "Measured" and self.off_basis == "Measured"
        return "Measured" if measured else "Configured"


def draws(meter: EnergyMeter | None, klass: EnergyClass, idle_min: timedelta) -> Draws:
    """The node's idle and off draw: measured where the meter has them, else configured."""
    idle = meter.idle_watts if meter is not None else None
    measured_idle = (
        idle is not None and meter is not None and (meter.idle_seconds >= idle_min.total_seconds())
    )
    off = meter.off_watts if meter is not None else None
    return Draws(
        idle_watts=idle if measured_idle and idle is not None else klass.idle_watts,
        idle_basis="Measured" if measured_idle else "Configured",
        off_watts=off if off is not None else klass.off_watts,
        off_basis="Measured" if off is not None else "Configured",
    )


def saved_joules(
    off_seconds: float, d: Draws, boots: int, shutdowns: int, klass: EnergyClass
) -> float:
    """The never-off counterfactual (module docstring); negative when cycles cost more.
    An off draw above the idle draw (neither measured, or a class configured so) saves
    nothing while off, never less."""
    return (
        off_seconds * max(0.0, d.idle_watts - d.off_watts)
        - boots * klass.boot_energy_wh * _WH
        - shutdowns * klass.shutdown_energy_wh * _WH
    )


class NodeEnergy(CoreModel):
    """One side node's figures (WorkerNode status.energy, docs/energy.md)."""

    since: AwareDatetime
    method: EnergyMethod
    source: str | None = None
    used_kwh: float
    idle_watts: float
    idle_basis: Basis
    off_watts: float
    off_basis: Basis
    off_seconds: float
    boots: int
    shutdowns: int
    saved_kwh: float
    saved_basis: Basis
    money_saved: float
    gap_seconds: float
    gaps: int
    day: date
    saved_kwh_today: float
    money_saved_today: float


def node_energy(
    meter: EnergyMeter, klass: EnergyClass, idle_min: timedelta, now: datetime, zone: tzinfo
) -> NodeEnergy:
    """The figures of `meter` at `now` ("today" in `zone`)."""
    d = draws(meter, klass, idle_min)
    off_s = meter.off_seconds_at(now)
    saved = saved_joules(off_s, d, meter.boots, meter.shutdowns, klass)
    day = roll_day(meter, now, zone)
    today = saved_joules(
        off_s - day.day_off_seconds,
        d,
        meter.boots - day.day_boots,
        meter.shutdowns - day.day_shutdowns,
        klass,
    )
    return NodeEnergy(
        since=meter.since,
        method=meter.method,
        source=meter.source,
        used_kwh=meter.used_joules_at(now) / JOULES_PER_KWH,
        idle_watts=d.idle_watts,
        idle_basis=d.idle_basis,
        off_watts=d.off_watts,
        off_basis=d.off_basis,
        off_seconds=off_s,
        boots=meter.boots,
        shutdowns=meter.shutdowns,
        saved_kwh=saved / JOULES_PER_KWH,
        saved_basis=d.basis,
        money_saved=saved / JOULES_PER_KWH * klass.price_per_kwh,
        gap_seconds=meter.gap_seconds,
        gaps=meter.gaps,
        day=day.day or now.astimezone(zone).date(),
        saved_kwh_today=today / JOULES_PER_KWH,
        money_saved_today=today / JOULES_PER_KWH * klass.price_per_kwh,
    )


def expected_saving(
    meter: EnergyMeter | None, klass: EnergyClass, idle_min: timedelta, min_off: timedelta
) -> EnergyEvidence:
    """A shutdown's expected saving: the node's mean past off period (the policy's minOff
    before it has one) x (idle - off draw) - one cycle's energy. Evidence, not a gate."""
    d = draws(meter, klass, idle_min)
    if meter is not None and meter.off_periods > 0 and meter.off_seconds > 0:
        closed = meter.off_periods - (1 if meter.phase is Phase.OFF else 0)
        off_s = meter.off_seconds / max(1, closed)
        basis = f"mean of {max(1, closed)} past off period(s)"
    else:
        off_s = min_off.total_seconds()
        basis = "the policy's minOff (no off period seen yet)"
    saved = saved_joules(off_s, d, 1, 1, klass)
    return _evidence("Expected", off_s, basis, d, klass, saved)


def measured_saving(
    off_seconds: float, meter: EnergyMeter | None, klass: EnergyClass, idle_min: timedelta
) -> EnergyEvidence:
    """The off period that just ended: its measured length x (idle - off draw) - its cycle."""
    d = draws(meter, klass, idle_min)
    saved = saved_joules(off_seconds, d, 1, 1, klass)
    return _evidence(
        "Measured", off_seconds, "the power state machine's Off stretch", d, klass, saved
    )


def _evidence(
    kind: Literal["Expected", "Measured"],
    off_s: float,
    basis: str,
    d: Draws,
    klass: EnergyClass,
    saved: float,
) -> EnergyEvidence:
    return EnergyEvidence(
        kind=kind,
        off_seconds=round(off_s, 1),
        off_seconds_basis=basis,
        idle_watts=round(d.idle_watts, 2),
        idle_basis=d.idle_basis,
        off_watts=round(d.off_watts, 2),
        off_basis=d.off_basis,
        cycle_joules=klass.cycle_joules,
        saved_kwh=round(saved / JOULES_PER_KWH, 4),
        money_saved=round(saved / JOULES_PER_KWH * klass.price_per_kwh, 4),
    )


# -- cloud VMs ---------------------------------------------------------------------------


class VmHours(CoreModel):
    """One instance type's VM hours avoided against never-off, under one policy."""

    since: AwareDatetime
    at: AwareDatetime
    running: int = Field(ge=0)
    peak: int = Field(ge=0)
    avoided_seconds: float = Field(default=0.0, ge=0)
    day: date | None = None
    day_avoided_seconds: float = 0.0

    def avoided_at(self, now: datetime) -> float:
        """Seconds avoided until `now` (the stretch under way included)."""
        stretch = max(0.0, (now - self.at).total_seconds())
        return self.avoided_seconds + (self.peak - self.running) * stretch


def vm_count(held: VmHours | None, running: int, now: datetime, zone: tzinfo) -> VmHours:
    """`held` with `running` VMs of its type from `now` (the peak never comes down)."""
    if held is None:
        return VmHours(since=now, at=now, running=running, peak=running)
    held = _vm_day(held, now, zone)
    at = max(now, held.at)
    return held.model_copy(
        update={
            "at": at,
            "avoided_seconds": held.avoided_at(at),
            "running": running,
            "peak": max(held.peak, running),
        }
    )


def _vm_day(held: VmHours, now: datetime, zone: tzinfo) -> VmHours:
    today = now.astimezone(zone).date()
    if held.day == today:
        return held
    midnight = max(local_midnight(now, zone), held.since)
    return held.model_copy(update={"day": today, "day_avoided_seconds": held.avoided_at(midnight)})


# -- a policy's sums ---------------------------------------------------------------------


class PolicyEnergy(CoreModel):
    """A PowerPolicy's figures: the sums over its side nodes and its cloud VMs."""

    day: date
    used_kwh: float
    saved_kwh: float
    saved_kwh_today: float
    money_saved: float
    money_saved_today: float
    vm_hours_avoided: float
    vm_hours_avoided_today: float
    nodes_measured: int
    nodes_configured: int


def policy_energy(
    nodes: Iterable[NodeEnergy],
    vms: Mapping[str, VmHours],
    prices: Mapping[str, float],
    now: datetime,
    zone: tzinfo,
) -> PolicyEnergy:
    """The sums of a policy's nodes at `now`, and its VM hours avoided at `prices`."""
    today = now.astimezone(zone).date()
    used = saved = saved_today = money = money_today = 0.0
    measured = configured = 0
    for n in nodes:
        used += n.used_kwh
        saved += n.saved_kwh
        money += n.money_saved
        if n.day == today:
            saved_today += n.saved_kwh_today
            money_today += n.money_saved_today
        if n.saved_basis == "Measured":
            measured += 1
        else:
            configured += 1
    hours = hours_today = 0.0
    for itype, held in vms.items():
        rolled = _vm_day(held, now, zone)
        total = rolled.avoided_at(now)
        day = total - rolled.day_avoided_seconds
        price = prices.get(itype, 0.0)
        hours += total / 3600
        hours_today += day / 3600
        money += total / 3600 * price
        money_today += day / 3600 * price
    return PolicyEnergy(
        day=today,
        used_kwh=used,
        saved_kwh=saved,
        saved_kwh_today=saved_today,
        money_saved=money,
        money_saved_today=money_today,
        vm_hours_avoided=hours,
        vm_hours_avoided_today=hours_today,
        nodes_measured=measured,
        nodes_configured=configured,
    )


class ClassSavedToday(CoreModel):
    """A node class's side nodes under a policy: energy and money saved today."""

    name: str
    saved_kwh_today: float
    money_saved_today: float


def saved_today_by_class(
    nodes: Iterable[tuple[str | None, NodeEnergy]],
    classes: Iterable[str],
    now: datetime,
    zone: tzinfo,
    unclassed: str,
) -> list[ClassSavedToday]:
    """Per node class (each of `classes`, then `unclassed` for the nodes in none, when
    there are any): the saving today in `zone` of its side nodes -- `(class, figures)`
    pairs. Cloud VMs' hours avoided are per instance type, not per class: not in it."""
    today = now.astimezone(zone).date()
    sums: dict[str, list[float]] = {name: [0.0, 0.0] for name in classes}
    for node_class, n in nodes:
        c = sums.setdefault(node_class or unclassed, [0.0, 0.0])
        if n.day == today:
            c[0] += n.saved_kwh_today
            c[1] += n.money_saved_today
    return [
        ClassSavedToday(name=name, saved_kwh_today=kwh, money_saved_today=money)
        for name, (kwh, money) in sums.items()
    ]
