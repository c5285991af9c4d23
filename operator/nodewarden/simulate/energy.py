"""What a simulated run drew, and saved against never-off: the KWH, KWH-SAVED and SAVED
columns of every `nodewarden simulate` row (docs/simulation.md, docs/energy.md).

A side node draws its class's idle draw while on, its busy draw while it runs work, its
off (standby) draw while off, and its boot / shutdown energy above idle per cycle -- the
fleet file's `sideNodes[].energy`, in the operator's `power.energy.classes` format
(`rules.savings.EnergyClass`); a group without one draws nothing (zeros). The energy
saved against never-off is the live rule (`rules.savings.saved_joules`) on the simulated
time off and cycles; the class's draws are exact here, so it is the "Measured" figure
the live operator reaches once it has measured them. Money saved: side nodes' kWh saved
x the class's price per kWh, plus the cloud VM hours avoided x their price.

Cloud VMs draw nothing we know of. What never-off saves on them is VM hours: a never-off
fleet keeps every VM it launched, so each VM slot (`engine._slot`: VMs of a type reuse
the lowest free number, the live rule's running peak) would have run from its first
launch to the end of the run; the hours avoided are that minus the slot's time on.

The engine reports each node's time on (`on_interval`, from its billing) and each busy
stretch (`busy_interval`); nothing else here reads the simulation.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from nodewarden.api.workernode import NodeType
from nodewarden.rules.energy import JOULES_PER_KWH
from nodewarden.rules.savings import Draws, EnergyClass, saved_joules
from nodewarden.simulate.fleet import SideNodeGroup

_US = 1_000_000
_NO_DRAW = EnergyClass()


class Node(Protocol):
    """What the ledger reads of a simulated node (`simulate.nodes.MachineNode`)."""

    name: str
    node_type: NodeType
    instance_type: str | None
    slot: int
    price: float


@dataclass
class _Side:
    klass: EnergyClass
    initially_on: bool
    on: list[tuple[int, int]] = field(default_factory=list)
    busy_us: int = 0


@dataclass
class _Slot:
    price: float
    first: int
    on_us: int = 0


class EnergyLedger:
    """Accumulates one run's energy figures (see the module docstring)."""

    def __init__(self, groups: Iterable[SideNodeGroup]) -> None:
        self._side: dict[str, _Side] = {}
        for group in groups:
            klass = group.energy or _NO_DRAW
            for name in group.names():
                self._side[name] = _Side(klass, group.initial_power == "On")
        self._slots: dict[str, _Slot] = {}

    def on_interval(self, node: Node, start: int, end: int) -> None:
        """Node `node` was on from `start` to `end` (µs)."""
        side = self._side.get(node.name)
        if node.node_type == "SideNode" and side is not None:
            side.on.append((start, end))
            return
        key = f"{node.instance_type}#{node.slot}"
        slot = self._slots.get(key)
        if slot is None:
            slot = self._slots[key] = _Slot(node.price, start)
        slot.first = min(slot.first, start)
        slot.on_us += end - start

    def busy_interval(self, node: Node, start: int, end: int) -> None:
        side = self._side.get(node.name)
        if side is not None:
            side.busy_us += end - start

    def figures(self, end: int) -> dict[str, Any]:
        """The row's figures for a run that ended at `end` (µs since its start)."""
        used = saved = money = 0.0
        for side in self._side.values():
            k = side.klass
            on_us = sum(b - a for a, b in side.on)
            off_s = max(0, end - on_us) / _US
            boots = sum(1 for a, _ in side.on if a > 0 or not side.initially_on)
            shutdowns = sum(1 for _, b in side.on if b < end)
            busy = k.busy_watts if k.busy_watts is not None else k.idle_watts
            used += (
                on_us / _US * k.idle_watts
                + side.busy_us / _US * (busy - k.idle_watts)
                + off_s * k.off_watts
                + boots * k.boot_energy_wh * 3600
                + shutdowns * k.shutdown_energy_wh * 3600
            )
            joules = _saved_since(side, 0, end)
            saved += joules
            money += joules / JOULES_PER_KWH * k.price_per_kwh
        vm_hours = 0.0
        for slot in self._slots.values():
            avoided = max(0, end - slot.first - slot.on_us) / _US / 3600
            vm_hours += avoided
            money += avoided * slot.price
        return {
            "kWh": round(used / JOULES_PER_KWH, 1),
            "kWhSaved": round(saved / JOULES_PER_KWH, 1),
            "moneySaved": round(money, 2),
            "vmHoursAvoided": round(vm_hours, 1),
        }

    def saved_by_class(
        self,
        since: int,
        end: int,
        class_of: Callable[[str], str | None],
        classes: Iterable[str],
        unclassed: str,
    ) -> list[dict[str, Any]]:
        """Per node class (each of `classes`, then `unclassed` for side nodes in none):
        its side nodes' kWh and money saved from `since` to `end` (µs) -- PowerPolicy
        status.energy.classes' "today" when `since` is the local midnight."""
        sums: dict[str, list[float]] = {name: [0.0, 0.0] for name in classes}
        for name, side in self._side.items():
            c = sums.setdefault(class_of(name) or unclassed, [0.0, 0.0])
            joules = _saved_since(side, since, end)
            c[0] += joules / JOULES_PER_KWH
            c[1] += joules / JOULES_PER_KWH * side.klass.price_per_kwh
        return [
            {"name": n, "kWhSavedToday": round(kwh, 3), "moneySavedToday": round(m, 2)}
            for n, (kwh, m) in sums.items()
        ]


def _saved_since(side: _Side, since: int, end: int) -> float:
    """Joules side node `side` saved against never-off from `since` to `end` (µs): its
    time off then, less the boots and shutdowns then (the live rule; exact draws)."""
    on_us = sum(max(0, min(b, end) - max(a, since)) for a, b in side.on)
    off_s = max(0, end - since - on_us) / _US
    boots = sum(1 for a, _ in side.on if a >= since and (a > 0 or not side.initially_on))
    shutdowns = sum(1 for _, b in side.on if since <= b < end)
    k = side.klass
    draws = Draws(
        idle_watts=k.idle_watts, idle_basis="Measured", off_watts=k.off_watts, off_basis="Measured"
    )
    return saved_joules(off_s, draws, boots, shutdowns, k)
