"""The simulated nodes: what each one physically does, and what the controller knows of it.

Every node, side node or cloud VM, is a `MachineNode`: its power decisions go through
`machine.step` (`nodewarden.simulate.decide`). It carries the machine's persisted
`NodePowerState`, the shell's `NodeFacts`, and the physical truth the simulation
produces: whether the node draws power (a VM: from launch to termination), when its SSH
answers, when the controller first saw it answer, and the work running on it (with a
short history, so a probe reading can report the value at the probe's own time).
`PowerModel` says how its power controller behaves (answer latency, dropped and errored
requests, poll interval, boot and shutdown delays); a VM's is the cloud API (destroy).

`node_view(now)` is the `NodeView` the scheduler's `plan()` reads, built by the live
dispatcher's rule (`rules.nodeview`, which `dispatch/views.py` calls) from this node's
facts: side nodes by their power state, wakeable while off or waking if their power
controller allows a wake action; a VM whose create call has not returned is pending, one
not yet verified ready is booting and counts as open (the work planned for it waits for
it), one draining / shutting down / blocked takes nothing. A test compares the two for
every state.
"""

from __future__ import annotations

import bisect
import random
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from nodewarden.api.powerpolicy import ResetAction
from nodewarden.api.workernode import ControlMethod, NodeType
from nodewarden.policy.facts import (
    CapabilityReading,
    DemandReading,
    DesiredReading,
    InhibitorReading,
    NodeFacts,
    PowerReading,
)
from nodewarden.policy.state import NodePowerState
from nodewarden.rules.demand import PLANNED
from nodewarden.rules.gpuwork import gpu_only
from nodewarden.rules.nodeview import (
    admits,
    can_wake,
    cloud_view,
    is_ready,
    side_view,
    wake_not_before,
    waking_since,
)
from nodewarden.scheduling.views import Capacity, NodeView
from nodewarden.simulate.distributions import Delay, to_us
from nodewarden.simulate.fleet import SideNodeGroup


@dataclass(frozen=True, slots=True)
class PowerModel:
    """How a node's power controller and the node itself behave."""

    control_method: ControlMethod
    allowable: tuple[ResetAction, ...]
    source: str
    latency: Delay
    drop_rate: float
    error_rate: float
    poll_interval: int
    boot: Delay
    shutdown: Delay


@dataclass(slots=True)
class Work:
    """Containers running on a node, with the recent history of their count (and of the
    count of those holding GPUs)."""

    running: set[str] = field(default_factory=set)
    log: list[tuple[int, int]] = field(default_factory=list)
    busy_since: int | None = None
    gpu_running: set[str] = field(default_factory=set)
    gpu_log: list[tuple[int, int]] = field(default_factory=list)

    def change(self, now: int) -> None:
        self.log.append((now, len(self.running)))
        if len(self.log) > 32:
            del self.log[:16]

    def at(self, t: int, idle_floor: int) -> tuple[int, int | None]:
        """(active jobs, idle since) as a probe at time t would have seen them; idle
        since is never before `idle_floor` (when the node became reachable)."""
        index = bisect.bisect_right(self.log, (t, 1 << 62)) - 1
        if index < 0:
            return 0, idle_floor
        when, count = self.log[index]
        if count:
            return count, None
        return 0, max(when, idle_floor)

    def gpu_change(self, now: int) -> None:
        self.gpu_log.append((now, len(self.gpu_running)))
        if len(self.gpu_log) > 32:
            del self.gpu_log[:16]

    def gpu_at(self, t: int) -> int:
        """Containers holding GPUs as a probe at time t would have seen them."""
        index = bisect.bisect_right(self.gpu_log, (t, 1 << 62)) - 1
        return self.gpu_log[index][1] if index >= 0 else 0


@dataclass(frozen=True, slots=True)
class GpuRule:
    """The GPU-idle rule of the policy simulated (`policy.gpuidle`), for a GPU node's
    view: admission open to GPU work only."""

    start: datetime
    idle_threshold: timedelta
    max_age: timedelta
    enabled: bool

    def gpu_only(self, facts: NodeFacts, now: int) -> bool:
        work = facts.work
        if work is None or work.gpu is None:
            return False
        at = self.start + timedelta(microseconds=now)
        return gpu_only(work, self.idle_threshold, self.max_age, at, self.enabled)


@dataclass(slots=True)
class MachineNode:
    """One node of the fleet (see the module docstring)."""

    name: str
    node_type: NodeType
    capacity: Capacity
    price: float
    instance_type: str | None
    model: PowerModel
    rng: random.Random
    state: NodePowerState
    facts: NodeFacts
    powered: bool
    power_since: int | None
    ready_at: int | None
    """When SSH answers and the ready probe passes (None: not booting, or never)."""
    slot: int = 0
    probe_phase: int = 0
    """The probe grid of a ready node: probes at probe_phase + k x probe interval."""
    seen_ready_at: int | None = None
    """The first successful probe since the node came on (a VM: paired)."""
    listed_at: int | None = None
    """A VM: when its create call returned and the cloud lists it (None: side node)."""
    destroying: bool = False
    """A VM: a destroy was requested (the dispatcher counts it as shutting down)."""
    stopping: bool = False
    """A shutdown was applied and the node is not off yet (a VM is listed PoweringOff)."""
    poll_phase: int = 0
    """A side node's BMC is read at poll_phase + k x pollInterval."""
    power_changed_at: int = -(1 << 62)
    """When what the power source reports last changed."""
    vm_key: tuple[int, int | None, int] | None = None
    """A VM: what its VmReading was built from (rebuilt only when that changes)."""
    work: Work = field(default_factory=Work)
    power_change: int = 0
    """Token of the pending physical power change (a newer request supersedes it)."""
    timer: int = 0
    probe_check_at: int = -(1 << 62)
    """A look at the next probe is scheduled for then (the last reading is behind)."""
    timer_at: int = -(1 << 62)
    """When the machine's latest recheck is due."""
    poll_at: int | None = None
    probe_at: int | None = None
    refresh_at: int | None = None
    reread_at: int | None = None
    last_poll: int = -(1 << 62)
    last_probe: int = -(1 << 62)
    last_refresh: int = -(1 << 62)
    demand_queued: int = 0
    """Queued demand in the dispatcher's latest round (the operator's planned demand)."""
    demand: DemandReading | None = None
    """The latest round's demand reading (what `rules.demand.demand_event` compares)."""
    same_instant: tuple[int, int] = (-1, 0)
    last_key: tuple[str, tuple[str, ...]] | None = None
    idle_cause: str | None = None
    """Why the node is on without work right now (None: off, or running work)."""
    idle_cause_since: int = 0
    gpu_rule: GpuRule | None = None
    """A GPU node: the policy's GPU-idle rule (None: no GPUs)."""

    def reachable(self, t: int) -> bool:
        """SSH answers (booted, not shutting down) at t."""
        return self.powered and self.ready_at is not None and self.ready_at <= t

    def node_view(
        self,
        now: int,
        created_at: datetime | None = None,
        boot: tuple[float | None, float | None] = (None, None),
        wake_timing: tuple[timedelta, timedelta] | None = None,
    ) -> NodeView:
        """The scheduler's view: the live rule (`rules.nodeview`) on this node's facts,
        the board's part as the power controller shows it (`board_view`); every policy
        the simulator runs counts as valid (it parsed). `created_at`: a VM's create (its
        launch); `boot`: a side node's boot time and slowest boot as seen (`rules.boots`);
        `wake_timing`: the policy's min-off and cooldown (`rules.nodeview.wake_not_before`)."""
        power = self.state.state
        admission_open = admits(self.state.admission)
        ready = is_ready(power, self.facts.ready)
        rule = self.gpu_rule
        only = admission_open and rule is not None and rule.gpu_only(self.facts, now)
        if self.node_type == "SideNode":
            return side_view(
                self.name,
                self.capacity,
                self.price,
                power,
                admission_open=admission_open,
                ready=ready,
                wakeable=can_wake(self.node_type, power, self.facts.capability, True),
                coming_since=waking_since(self.state),
                boot_seconds=boot[0],
                boot_slowest=boot[1],
                wake_after=(
                    wake_not_before(self.state, *wake_timing) if wake_timing is not None else None
                ),
                gpu_only=only,
            )
        return cloud_view(
            self.name,
            self.capacity,
            self.instance_type or "unknown",
            self.price,
            power,
            admission_open=admission_open,
            ready=ready,
            listed=self.listed_at is not None and now >= self.listed_at,
            destroying=self.destroying,
            runs_work=True,  # idleBehavior run (`initial_facts`); a simulated VM never breaks
            created_at=created_at,
            gpu_only=only,
        )


def side_power_model(group: SideNodeGroup) -> PowerModel:
    """A side node group's power controller: its BMC (Redfish) or Wake-on-LAN + SSH."""
    redfish = group.control_method == "Redfish"
    return PowerModel(
        control_method=group.control_method,
        allowable=("On", "GracefulShutdown", "ForceOff")
        if redfish
        else ("WakeOnLan", "SshPoweroff"),
        source="redfish" if redfish else "wol+ssh",
        latency=group.bmc.latency,
        drop_rate=group.bmc.drop_rate,
        error_rate=group.bmc.error_rate,
        poll_interval=to_us(group.bmc.poll_interval),
        boot=group.boot,
        shutdown=group.shutdown,
    )


def initial_facts(
    name: str, node_type: NodeType, model: PowerModel, powered: bool, t0: datetime, never_off: bool
) -> NodeFacts:
    """What the shell knows of a node it just saw: its spec, no demand; a side node also
    its power, what its controller allows, and no inhibitors."""
    source = f"{model.source}:{name}"
    desired = "On" if never_off else "Auto"
    facts = NodeFacts(
        node=name,
        node_type=node_type,
        desired=DesiredReading(
            source=f"WorkerNode/{name}#spec", observed_at=t0, power=desired, idle_behavior="run"
        ),
        demand=DemandReading(source=PLANNED, observed_at=t0, queued=0),
    )
    if node_type == "SideNode":
        facts = facts.model_copy(
            update={
                "power": PowerReading(
                    source=source, observed_at=t0, power="On" if powered else "Off"
                ),
                "capability": CapabilityReading(
                    source=source,
                    observed_at=t0,
                    control_method=model.control_method,
                    allowable=model.allowable,
                ),
                "inhibitors": InhibitorReading(source=f"ssh:{name}/logind", observed_at=t0),
            }
        )
    return facts
