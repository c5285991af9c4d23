"""What the operator's shell knows of a simulated node before each step.

`Sensing` turns the simulated world (a node's power, its probe grid, the cloud list)
into the readings the live shell holds at a given instant: the last successful probe's
work (through `rules.readings.work_reading`, the one idle-since rule, fed as the live
pool feeds it: idle since the first probe that saw the node idle), side nodes'
inhibitors, uptime and identity; the last read of the power source; the last round's
demand; a VM's node-manager facts (`rules.vm.vm_reading` on the pool's snapshot, as the
live `PowerController` builds them); the fleet counts (`rules.fleet.fleet_reading`).
Pure: every method takes the simulated time (integer microseconds since the trace start).
"""

from __future__ import annotations

import math
import zlib
from datetime import datetime, timedelta
from typing import Any
from uuid import NAMESPACE_URL, uuid5

from nodewarden.api.workernode import ObservedPower
from nodewarden.fleet.ports import WorkerSnapshot
from nodewarden.policy.facts import (
    DemandReading,
    IdentityReading,
    InhibitorReading,
    PowerReading,
    UptimeReading,
    VmReading,
)
from nodewarden.rules.demand import PLANNED
from nodewarden.rules.fleet import fleet_reading
from nodewarden.rules.gpuwork import with_gpu
from nodewarden.rules.readings import work_reading
from nodewarden.rules.vm import vm_reading
from nodewarden.simulate.nodes import MachineNode


class Sensing:
    """The readings of the simulated world, as the shell would hold them at `now`."""

    def __init__(
        self,
        start: datetime,
        seed: int,
        *,
        probe: int,
        boot_probe: int,
        probe_failure: float,
        list_interval: int,
        tick: int,
        resync: int,
    ) -> None:
        self.start = start
        self.seed = seed
        self._probe = probe
        self._boot_probe = boot_probe
        self._probe_failure = probe_failure
        self._list = list_interval
        self._tick = tick
        self._resync = resync

    def at(self, us: int) -> datetime:
        return self.start + timedelta(microseconds=us)

    def us(self, when: datetime) -> int:
        return (when - self.start) // timedelta(microseconds=1)

    def telemetry(self, node: MachineNode, now: int, transitions: int, warm: int) -> None:
        """Bring the node's readings up to what the operator's shell holds now: the last
        successful probe's (work; side nodes also inhibitors and uptime), the last read of
        the power source when it still says the same, the last round's demand, the node-
        manager facts of a VM, and the fleet counts."""
        facts = node.facts
        update: dict[str, Any] = {}
        seen = node.seen_ready_at
        if seen is not None and node.reachable(now):
            tick = self.last_probe(node.name, node.probe_phase, seen, now)
            work = facts.work
            if tick is not None and (work is None or self.us(work.observed_at) < tick):
                update.update(self.probe_readings(node, tick))
        power = facts.power
        read = self.last_read(node, now)
        if (
            power is not None
            and read is not None
            and node.power_changed_at <= read
            and self.us(power.observed_at) < read
            and power.power == self.power_value(node, now)
        ):
            update["power"] = power.model_copy(update={"observed_at": self.at(read)})
            uptime = facts.uptime
            if node.node_type == "CloudVM" and uptime is not None:
                update["uptime"] = uptime.model_copy(update={"observed_at": self.at(read)})
        demand = facts.demand
        planned = (now // self._tick) * self._tick
        if (
            demand is None
            or demand.queued != node.demand_queued
            or (self.us(demand.observed_at) < planned)
        ):
            update["demand"] = DemandReading(
                source=PLANNED, observed_at=self.at(planned), queued=node.demand_queued
            )
        if node.node_type == "CloudVM":
            vm = self.vm_reading(node, now)
            if vm is not facts.vm:
                update["vm"] = vm
        fleet = facts.fleet
        if (
            fleet is None
            or fleet.transitions_in_progress != transitions
            or fleet.warm_idle_nodes != warm
            or now - self.us(fleet.observed_at) > self._resync
        ):
            update["fleet"] = fleet_reading(transitions, warm, self.at(now))
        if update:
            node.facts = facts.model_copy(update=update)

    def probe_readings(self, node: MachineNode, tick: int) -> dict[str, Any]:
        assert node.seen_ready_at is not None and node.power_since is not None
        active, idle_from = node.work.at(tick, node.seen_ready_at)
        when = self.at(tick)
        since = None if idle_from is None else self.at(self.first_idle_probe(node, idle_from, tick))
        work = work_reading(active, f"ssh:{node.name}/runners", when, since)
        if node.capacity.gpus > 0:  # the dispatcher's ledger: containers holding GPUs
            work = with_gpu(work, node.capacity.gpus, node.work.gpu_at(tick), node.facts.work)
        if node.node_type == "CloudVM":
            return {"work": work}  # VM probes read the runners only
        return {
            "work": work,
            "inhibitors": InhibitorReading(source=f"ssh:{node.name}/logind", observed_at=when),
            "uptime": UptimeReading(
                source=f"ssh:{node.name}/proc/uptime",
                observed_at=when,
                on_since=self.at(node.power_since),
            ),
            # a simulated machine is the one its BMC manages: the UUIDs match
            "identity": _matching_identity(node.name, when),
        }

    def power_value(self, node: MachineNode, now: int) -> ObservedPower | None:
        """What the node's power source says now (None: a VM not listed yet)."""
        if node.node_type == "SideNode":
            return "On" if node.powered else "Off"
        if not node.powered:
            return "Off"  # no longer listed
        if node.listed_at is None or now < node.listed_at:
            return None
        return "PoweringOff" if node.stopping else "On"

    def last_read(self, node: MachineNode, now: int) -> int | None:
        """The last periodic read of the node's power source at or before now."""
        if node.node_type == "CloudVM":
            return (now // self._list) * self._list
        interval = node.model.poll_interval
        k = (now - node.poll_phase) // interval
        return node.poll_phase + k * interval

    def power_reading(self, node: MachineNode, value: ObservedPower, now: int) -> PowerReading:
        if node.node_type == "CloudVM":
            source = (
                f"cloud:{node.name} no longer listed"
                if value == "Off"
                else f"cloud:{node.name}#list"
            )
        else:
            source = f"{node.model.source}:{node.name}#PowerState"
        return PowerReading(source=source, observed_at=self.at(now), power=value)

    def vm_reading(self, node: MachineNode, now: int) -> VmReading | None:
        """The pool snapshot `PowerController._update_vm` reads (the list and the probe
        history), through the same rule (`rules.vm.vm_reading`)."""
        listed = node.listed_at
        launched = node.power_since
        if listed is None or launched is None or now < listed:
            return None
        seen = node.seen_ready_at
        if seen is None:
            attempts = (now - listed) // self._boot_probe + 1
            last_attempt = listed + (attempts - 1) * self._boot_probe
            heartbeat = None
        else:
            k = (now - node.probe_phase) // self._probe
            last_attempt = max(seen, node.probe_phase + k * self._probe)
            beat = self.last_probe(node.name, node.probe_phase, seen, now)
            heartbeat = seen if beat is None else beat
            attempts = (last_attempt - heartbeat) // self._probe
        list_read = (now // self._list) * self._list
        key = (max(last_attempt, list_read), heartbeat, attempts)
        vm = node.facts.vm
        if vm is not None and node.vm_key == key:
            return vm
        node.vm_key = key
        snapshot = WorkerSnapshot(
            name=node.name,
            side=False,
            booted_at=self.at(launched),
            last_attempt=self.at(last_attempt),
            last_success=None if heartbeat is None else self.at(heartbeat),
            attempts_since_success=attempts,
            attempts_total=attempts,
            broken=False,
            deletion_requested=False,
            instance_id=node.name,
            instance_stopped=False,
            listed_at=self.at(list_read),
        )
        return vm_reading(snapshot, self.at(now))

    def last_probe(self, name: str, phase: int, floor: int, now: int) -> int | None:
        """The last successful probe tick at or before now, not before `floor`."""
        k = (now - phase) // self._probe
        t = phase + k * self._probe
        for _ in range(10_000):
            if t < floor:
                return None
            if not self.probe_failed(name, k):
                return t
            k -= 1
            t -= self._probe
        return None

    def first_idle_probe(self, node: MachineNode, idle_from: int, tick: int) -> int:
        """The first probe that saw the node idle, as the live shell keeps it (each probe
        feeds the previous reading's idle since to `rules.readings.idle_since`): the
        node's jobs all ended at `idle_from`, and `tick` is a probe that sees it idle.
        The earlier of the first successful grid probe at or after `idle_from` and the
        last applied reading's idle since when that reading saw this idle spell already
        (a probe off the grid: a ready or refresh probe). At most `tick`."""
        phase = node.probe_phase
        seen = node.seen_ready_at
        if seen is not None and idle_from <= seen and (seen - phase) % self._probe == 0:
            return seen  # the ready probe saw it idle (a node on from the start had none)
        first = tick
        k = -((phase - idle_from) // self._probe)  # ceil((idle_from - phase) / probe)
        t = phase + k * self._probe
        while t < tick:
            if not self.probe_failed(node.name, k):
                first = t
                break
            k += 1
            t += self._probe
        work = node.facts.work
        if (
            work is not None
            and work.idle_since is not None
            and self.us(work.observed_at) >= idle_from
        ):
            first = min(first, self.us(work.idle_since))
        return first

    def probe_failed(self, name: str, k: int) -> bool:
        if self._probe_failure <= 0:
            return False
        digest = zlib.crc32(f"{self.seed}/{name}/{k}".encode())
        return digest / 2**32 < self._probe_failure

    def next_probe(self, node: MachineNode, now: int) -> int:
        """The next probe of a ready node at or after now."""
        phase = node.probe_phase
        return phase + math.ceil((now - phase) / self._probe) * self._probe


def _matching_identity(name: str, when: datetime) -> IdentityReading:
    """A side node's BMC system UUID and its host's DMI product UUID (the same machine),
    as the live operator reads them with each BMC read and probe."""
    machine = str(uuid5(NAMESPACE_URL, f"nodewarden-simulated-machine:{name}"))
    return IdentityReading(
        source=f"ssh:{name}/sys/class/dmi/id/product_uuid",
        observed_at=when,
        bmc_uuid=machine,
        bmc_source=f"simulator:{name} BMC",
        bmc_observed_at=when,
        host_uuid=machine,
        host_source=f"ssh:{name}/sys/class/dmi/id/product_uuid",
        host_observed_at=when,
        matched_at=when,
        matched_uuid=machine,
    )
