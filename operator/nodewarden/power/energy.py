"""Each node's energy in the power controller: when its BMC power reading is taken, its
meter, its figures in status and metrics, a policy's sums, and the saving a Safety Record
carries as evidence.

- Readings ride on the PowerState polls (`Sensing.poll` calls `polled`): at most one a
  `read_interval` while the node is On, one per Off period
  (`rules.energy.energy_read_due`); each is one more Redfish GET (`PowerControl.read_energy`).
  They move the node's meter (`rules.energy.sample`) in memory only.
- A power state change moves the meter's phase (`moved`, from the round) and writes the
  node's figures with the step's own patch; otherwise they are written when
  `Timer.ENERGY` comes (`status_interval` after the last write) -- never per reading. The
  meter rides in `status.energy.meter`, so a restarted or new leader resumes it
  (`restore`).
- A policy's sums (`rules.savings.policy_energy`), and its side nodes' saving today per
  node class (`rules.savings.saved_today_by_class`), go to its PowerPolicy status at most
  every `status_interval`, and a minute after a transition under it.
- The live values are metrics read from the meters at each scrape (`scraped.Sourced`).
- Cloud VMs have no reading (their status says so); what never-off saves on them is the
  VM hours avoided per policy and instance type (`rules.savings.vm_count`), counted as
  their WorkerNodes come and go, kept in the policy's status.

Calls nothing above it (the round, sensing and observations call it).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime, timedelta, tzinfo
from typing import Any

from pydantic import ValidationError

from nodewarden.api.kinds import POWER_POLICY
from nodewarden.api.powerpolicy import zone_of
from nodewarden.kube.client import KubeError
from nodewarden.metrics import (
    ENERGY_SAVED,
    MONEY_SAVED,
    NODE_ENERGY,
    NODE_POWER,
    VM_AVOIDED,
)
from nodewarden.policy.base import trusted
from nodewarden.policy.facts import PowerReading
from nodewarden.policy.reasons import Decision
from nodewarden.policy.record import SafetyRecord
from nodewarden.policy.state import PowerState
from nodewarden.power.agenda import Timer
from nodewarden.power.context import PowerContext
from nodewarden.power.control import NodeRef
from nodewarden.power.runtime import NodeRuntime, iso, poll_phase
from nodewarden.redfish.energy import NoEnergyReading
from nodewarden.rules import energy as meters
from nodewarden.rules.inforce import UNCLASSED
from nodewarden.rules.savings import (
    VmHours,
    draws,
    expected_saving,
    measured_saving,
    node_energy,
    policy_energy,
    saved_joules,
    saved_today_by_class,
    vm_count,
)
from nodewarden.scraped import Samples

log = logging.getLogger(__name__)

NO_READING_VM = (
    "a cloud VM: the cloud reports no power draw; what never-off would cost is counted as "
    "VM hours avoided in its PowerPolicy's status"
)
POLICY_AFTER_TRANSITION = 60.0
"""Seconds after a transition under a policy before its sums are written (coalesced)."""


class Energy:
    """See the module docstring. One per power controller."""

    def __init__(self, ctx: PowerContext) -> None:
        self.ctx = ctx
        self.book = ctx.settings.energy
        self._vms: dict[str, dict[str, VmHours]] = {}
        """Per policy and instance type: the VM hours avoided so far."""
        self._vm_of: dict[str, tuple[str, str]] = {}
        """Per VM node: the (policy, instance type) it is counted under."""
        self._running: dict[tuple[str, str], int] = {}
        self._restored: set[str] = set()
        """Policies whose status (VM hours) was read back."""
        self._policy_due: dict[str, datetime] = {}
        self._policy_written: dict[str, datetime] = {}
        self._sources = (
            (NODE_POWER, self._power_samples),
            (NODE_ENERGY, self._energy_samples),
            (ENERGY_SAVED, self._saved_samples),
            (MONEY_SAVED, self._money_samples),
            (VM_AVOIDED, self._vm_samples),
        )
        for metric, source in self._sources:
            metric.add_source(source)

    def close(self) -> None:
        """The controller stopped: its nodes leave the metrics."""
        for metric, source in self._sources:
            metric.remove_source(source)

    # -- nodes in and out -------------------------------------------------------------

    def restore(self, rt: NodeRuntime, status: Mapping[str, Any], now: datetime) -> None:
        """A node arrives: its meter as stored (a side node), or a new one; its first
        figures' write is spread over the interval (by name, as the BMC polls are)."""
        if rt.node_type == "CloudVM":
            self.arrived(rt)
            self.ctx.status.contribute(rt.name, {"energy": self.status(rt, now)})  # once
            return
        stored = status.get("energy")
        meter: meters.EnergyMeter | None = None
        if isinstance(stored, Mapping) and isinstance(stored.get("meter"), Mapping):
            try:
                meter = meters.EnergyMeter.model_validate(stored["meter"])
            except ValidationError as exc:
                log.warning("WorkerNode %s: stored energy meter unreadable (%s)", rt.name, exc)
        if meter is None:
            meter = meters.start_meter(meters.Phase.of(rt.state.state), now)
        elif meter.phase is not meters.Phase.of(rt.state.state):
            meter = meters.enter(meter, meters.Phase.of(rt.state.state), now)
        rt.energy = meter
        rt.energy_due = next_write(rt.name, now, self.book.status_interval)

    def arrived(self, rt: NodeRuntime) -> None:
        """A cloud VM's WorkerNode is here (or its spec changed): counted under its
        policy and instance type."""
        if rt.node_type != "CloudVM" or rt.spec is None or not rt.spec.instance_type:
            return
        key = (self._policy_of(rt), rt.spec.instance_type)
        if self._vm_of.get(rt.name) == key:
            return
        self.left(rt.name)
        self._vm_of[rt.name] = key
        self._count(key, +1)

    def left(self, name: str) -> None:
        """A node left the fleet (a VM's instance is gone and its WorkerNode deleted)."""
        key = self._vm_of.pop(name, None)
        if key is not None:
            self._count(key, -1)

    def _count(self, key: tuple[str, str], change: int) -> None:
        policy, itype = key
        running = self._running[key] = max(0, self._running.get(key, 0) + change)
        held = self._vms.setdefault(policy, {})
        held[itype] = vm_count(held.get(itype), running, self.ctx.clock(), self._zone(policy))
        self._mark_policy(policy)

    def policy_seen(self, body: Mapping[str, Any]) -> None:
        """A PowerPolicy: the VM hours its status holds are resumed (once per process),
        merged with what this process counted before it came."""
        name = (body.get("metadata") or {}).get("name")
        if not isinstance(name, str) or name in self._restored:
            return
        self._restored.add(name)
        stored = ((body.get("status") or {}).get("energy") or {}).get("vms")
        if not isinstance(stored, Mapping):
            return
        held = self._vms.setdefault(name, {})
        for itype, raw in stored.items():
            try:
                before = VmHours.model_validate(raw)
            except ValidationError:
                continue
            now = held.get(itype)
            if now is None:
                running = self._running.get((name, itype), 0)
                held[itype] = vm_count(before, running, self.ctx.clock(), self._zone(name))
            else:
                held[itype] = now.model_copy(
                    update={
                        "since": min(before.since, now.since),
                        "peak": max(before.peak, now.peak),
                        "avoided_seconds": before.avoided_seconds + now.avoided_seconds,
                    }
                )

    # -- readings -----------------------------------------------------------------------

    def polled(self, rt: NodeRuntime, ref: NodeRef, reading: PowerReading) -> None:
        """A PowerState read came in: read the power now if it is due."""
        meter = rt.energy
        if meter is None or "energy" in rt.busy or rt.energy_none is not None:
            return
        power: meters.ReadPower = (
            "On" if reading.power == "On" else "Off" if reading.power == "Off" else "Other"
        )
        interval = timedelta(seconds=self.book.read_interval)
        if not meters.energy_read_due(meter, power, reading.observed_at, interval):
            return
        rt.busy.add("energy")
        self.ctx.spawn(self._read(rt, ref, power))

    async def _read(self, rt: NodeRuntime, ref: NodeRef, power: meters.ReadPower) -> None:
        try:
            got = await self.ctx.control.read_energy(ref)
        finally:
            rt.busy.discard("energy")
        if got is None or rt.energy is None:
            return
        if isinstance(got, NoEnergyReading):
            rt.energy_none = got.reason
            return
        s = meters.EnergySample(
            source=got.source[:512],
            observed_at=got.observed_at,
            power=power,
            watts=got.watts,
            counter_kwh=got.counter_kwh,
        )
        meter = meters.roll_day(rt.energy, s.observed_at, self._zone_of(rt))
        rt.energy = meters.sample(meter, s, self.max_gap(rt))
        if not s.empty:
            rt.energy_reading = s

    def max_gap(self, rt: NodeRuntime) -> timedelta:
        """The longest stretch between two readings that is integrated: the policy's
        telemetryMaxAge, never less than two read intervals (a max age below the read
        interval would integrate nothing at all)."""
        max_age = self.ctx.policy(rt).view.telemetry_max_age
        return max(max_age, timedelta(seconds=2 * self.book.read_interval))

    # -- transitions and records -------------------------------------------------------

    def moved(self, rt: NodeRuntime, now: datetime) -> None:
        """The node's power state changed: the meter's phase moves, its figures are
        written with the step's own patch, its policy's sums a minute later."""
        meter = rt.energy
        if meter is not None:
            phase = meters.Phase.of(rt.state.state)
            if phase is not meter.phase:
                meter = meters.roll_day(meter, now, self._zone_of(rt))
                rt.energy = meters.enter(meter, phase, now)
                self.write(rt, now)
        self._mark_policy(self._policy_of(rt), after=POLICY_AFTER_TRANSITION)

    def annotate(
        self, rt: NodeRuntime, before: PowerState, record: SafetyRecord, now: datetime
    ) -> SafetyRecord:
        """A side node's record with the saving as evidence (never read by a gate): the
        expected one on a decision to shut it down; the measured one on the record that
        ends an Off stretch."""
        if rt.node_type != "SideNode" or rt.spec is None:
            return record
        meter = rt.energy
        klass = self.book.klass(self.book.class_of(rt.spec))
        idle_min = timedelta(seconds=self.book.idle_measure)
        if record.decision is Decision.SHUTDOWN and before is not PowerState.OFF:
            min_off = self.ctx.policy(rt).view.min_off
            evidence = expected_saving(meter, klass, idle_min, min_off)
        elif (
            before is PowerState.OFF
            and record.state_after is not PowerState.OFF
            and meter is not None
            and meter.phase is meters.Phase.OFF
        ):
            off = (now - meter.phase_since).total_seconds()
            evidence = measured_saving(off, meter, klass, idle_min)
        else:
            return record
        evidence = evidence.model_copy(update={"currency": self.book.currency})
        # the record's other fields are the core's, already valid (as `record_build` does)
        return trusted(SafetyRecord, {**record.__dict__, "energy": evidence})

    # -- writes -------------------------------------------------------------------------

    def due(self, now: datetime) -> None:
        """Write the figures of the nodes whose `Timer.ENERGY` came (round step 6)."""
        ctx = self.ctx
        for name in ctx.agenda.due(Timer.ENERGY, now, self._current):
            rt = ctx.nodes.get(name)
            if rt is not None:
                self.write(rt, now)

    def write(self, rt: NodeRuntime, now: datetime) -> None:
        """Contribute the node's figures to its next status patch; the next one is due on
        the node's own grid (`next_write`)."""
        rt.energy_due = next_write(rt.name, now, self.book.status_interval)
        self.ctx.status.contribute(rt.name, {"energy": self.status(rt, now)})

    def status(self, rt: NodeRuntime, now: datetime) -> dict[str, Any]:
        """`status.energy` of node `rt` now."""
        name = self.book.class_of(rt.spec)
        meter = rt.energy
        if meter is None:
            return {"nodeClass": name, "method": "None", "message": NO_READING_VM}
        klass = self.book.klass(name)
        figures = node_energy(
            meter, klass, timedelta(seconds=self.book.idle_measure), now, self._zone_of(rt)
        )
        out: dict[str, Any] = {
            "since": iso(figures.since),
            "nodeClass": name,
            "method": figures.method,
            "source": figures.source,
            "message": self._no_reading(rt),
            "usedKwh": round(figures.used_kwh, 4),
            "idleWatts": round(figures.idle_watts, 1),
            "idleWattsBasis": figures.idle_basis,
            "offWatts": round(figures.off_watts, 1),
            "offWattsBasis": figures.off_basis,
            "offSeconds": round(figures.off_seconds),
            "boots": figures.boots,
            "shutdowns": figures.shutdowns,
            "savedKwh": round(figures.saved_kwh, 4),
            "savedBasis": figures.saved_basis,
            "moneySaved": round(figures.money_saved, 4),
            "currency": self.book.currency,
            "gapSeconds": round(figures.gap_seconds),
            "gaps": figures.gaps,
            "updatedAt": iso(now),
            "meter": meter.model_dump(mode="json", by_alias=True),
        }
        return out

    def _no_reading(self, rt: NodeRuntime) -> str | None:
        if rt.energy_none is not None:
            return f"no reading: {rt.energy_none}; time off is counted, draws are configured"
        if not rt.has_bmc_side:
            return "no reading: no BMC; time off is counted, draws are configured"
        return None

    def policies_due(self, now: datetime) -> list[str]:
        """The policies whose sums are due now, taken off the due list (a handful of
        policies: looked at every round); `write_policies` writes them."""
        due = [
            name
            for name, at in self._policy_due.items()
            if at <= now and name in self._restored  # its stored figures read back first
        ]
        for name in due:
            del self._policy_due[name]
        return due

    async def write_policies(self, due: list[str], now: datetime) -> None:
        """Write the sums of policies `due` (from `policies_due`)."""
        for name in due:
            if name not in self.ctx.policies.policies:
                continue  # the built-in default: no object to write to
            try:
                await self.ctx.kube.patch_status(
                    POWER_POLICY,
                    self.ctx.namespace,
                    name,
                    {"energy": self.policy_status(name, now)},
                )
            except KubeError as exc:
                log.info("PowerPolicy %s: energy figures not written: %s", name, exc)
                self._policy_due[name] = now + timedelta(seconds=POLICY_AFTER_TRANSITION)
                continue
            self._policy_written[name] = now
            self._policy_due.setdefault(name, now + timedelta(seconds=self.book.status_interval))

    def policy_status(self, name: str, now: datetime) -> dict[str, Any]:
        """`status.energy` of policy `name` now."""
        zone = self._zone(name)
        idle_min = timedelta(seconds=self.book.idle_measure)
        classed = [
            (
                rt.node_class,
                node_energy(
                    rt.energy, self.book.klass(self.book.class_of(rt.spec)), idle_min, now, zone
                ),
            )
            for rt in self.ctx.nodes.values()
            if rt.energy is not None and self._policy_of(rt) == name
        ]
        figures = [f for _, f in classed]
        vms = self._vms.get(name, {})
        prices = {t.name: t.price for t in self.ctx.catalogue.types}
        sums = policy_energy(figures, vms, prices, now, zone)
        held = self.ctx.policies.policies.get(name)
        names = [c.name for c in held.spec.node_classes] if held is not None else []
        per_class = saved_today_by_class(classed, names, now, zone, UNCLASSED)
        return {
            "timeZone": self._zone_name(name),
            "day": sums.day.isoformat(),
            "usedKwh": round(sums.used_kwh, 3),
            "savedKwh": round(sums.saved_kwh, 3),
            "savedKwhToday": round(sums.saved_kwh_today, 3),
            "moneySaved": round(sums.money_saved, 2),
            "moneySavedToday": round(sums.money_saved_today, 2),
            "currency": self.book.currency,
            "vmHoursAvoided": round(sums.vm_hours_avoided, 2),
            "vmHoursAvoidedToday": round(sums.vm_hours_avoided_today, 2),
            "nodesMeasured": sums.nodes_measured,
            "nodesConfigured": sums.nodes_configured,
            "updatedAt": iso(now),
            "classes": [
                {
                    "name": c.name,
                    "savedKwhToday": round(c.saved_kwh_today, 3),
                    "moneySavedToday": round(c.money_saved_today, 2),
                    "currency": self.book.currency,
                }
                for c in per_class
            ],
            "vms": {t: h.model_dump(mode="json", by_alias=True) for t, h in sorted(vms.items())},
        }

    def _mark_policy(self, name: str, after: float = 0.0) -> None:
        """Policy `name`'s sums changed: written `after` seconds from now (at once when
        this process has not written them yet), never sooner than a coalescing gap
        (a minute, or the status interval when shorter) after the last write."""
        now = self.ctx.clock()
        gap = timedelta(seconds=min(POLICY_AFTER_TRANSITION, self.book.status_interval))
        last = self._policy_written.get(name)
        at = now if last is None else max(now + min(timedelta(seconds=after), gap), last + gap)
        held = self._policy_due.get(name)
        self._policy_due[name] = at if held is None else min(held, at)

    # -- policies and zones --------------------------------------------------------------

    def _policy_of(self, rt: NodeRuntime) -> str:
        return rt.policy_name or self.ctx.default_policy

    def _zone_of(self, rt: NodeRuntime) -> tzinfo:
        return self._zone(self._policy_of(rt))

    def _zone_name(self, policy: str) -> str:
        held = self.ctx.policies.policies.get(policy)
        return held.spec.time_zone if held is not None else "UTC"

    def _zone(self, policy: str) -> tzinfo:
        return zone_of(self._zone_name(policy))

    def _current(self, name: str) -> datetime | None:
        rt = self.ctx.nodes.get(name)
        return None if rt is None else rt.energy_due

    # -- metrics (read at each scrape) ---------------------------------------------------

    def _side(self) -> Iterator[tuple[NodeRuntime, meters.EnergyMeter]]:
        for rt in list(self.ctx.nodes.values()):
            if rt.energy is not None:
                yield rt, rt.energy

    def _power_samples(self) -> Samples:
        for rt, _ in self._side():
            s = rt.energy_reading
            if s is not None and s.watts is not None:
                yield (rt.name, self._policy_of(rt), s.power), s.watts

    def _energy_samples(self) -> Samples:
        now = self.ctx.clock()
        for rt, meter in self._side():
            if meter.method != "None":
                yield (rt.name, self._policy_of(rt)), meter.used_joules_at(now)

    def _savings(self) -> Iterator[tuple[str, str, float, float]]:
        """(policy, basis, joules saved, money saved) per side node, now."""
        now = self.ctx.clock()
        idle_min = timedelta(seconds=self.book.idle_measure)
        for rt, meter in self._side():
            klass = self.book.klass(self.book.class_of(rt.spec))
            d = draws(meter, klass, idle_min)
            saved = saved_joules(meter.off_seconds_at(now), d, meter.boots, meter.shutdowns, klass)
            money = saved / meters.JOULES_PER_KWH * klass.price_per_kwh
            yield self._policy_of(rt), d.basis, saved, money

    def _saved_samples(self) -> Samples:
        for policy, basis, saved, _ in self._savings():
            yield (policy, basis), saved

    def _money_samples(self) -> Samples:
        currency = self.book.currency
        for policy, _, _, money in self._savings():
            yield (policy, "energy", currency), money
        now = self.ctx.clock()
        prices = {t.name: t.price for t in self.ctx.catalogue.types}
        for policy, held in self._vms.items():
            for itype, hours in held.items():
                money = hours.avoided_at(now) / 3600 * prices.get(itype, 0.0)
                yield (policy, "vm_hours", currency), money

    def _vm_samples(self) -> Samples:
        now = self.ctx.clock()
        for policy, held in self._vms.items():
            yield (policy,), sum(h.avoided_at(now) for h in held.values())


def next_write(name: str, now: datetime, interval: float) -> datetime:
    """When node `name`'s figures are written next without a transition: the next point
    of its own grid (every `interval`, offset by its name: a fleet that started together
    is spread over the interval) at least half an interval after `now`."""
    step = timedelta(seconds=interval)
    offset = step * poll_phase(name)
    since = now - _EPOCH - offset
    ticks = since // step + 1
    due = _EPOCH + offset + ticks * step
    return due if due - now >= step / 2 else due + step


_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
