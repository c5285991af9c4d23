"""Warm capacity in the simulator: the node classes, warm windows and forecast wake of the
policy under simulation, through the live rules (`rules.warm`, `rules.forecast`).

* `SimWarmth` keeps each simulated node's class and the class counts (`rules.fleet.
  FleetTally`, as the live power controller does), computes the levers' targets at their
  due times (window boundaries, forecast hours: scheduled events, never a scan per step),
  puts the class's counts and target into each node's fleet reading before a step (the
  gates hold and wake from it, as live), looks again at the nodes of a class whose
  target or counts moved, and gives the dispatcher round the cloud VMs to create ahead of
  demand (`rules.warm.vm_creates`).
* `split_trace` and `train` are the train / judge split: the forecast is trained on the
  arrivals of a trace's first days (the same `container_class` and `Histogram.arrive` the
  live dispatcher calls for every arrival) and the simulation runs on the days after
  them only, so the forecast is never judged on the days it learned from.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any, Protocol

from nodewarden.api.powerpolicy import PowerPolicySpec
from nodewarden.api.warmcapacity import NodeClass
from nodewarden.policy.facts import FleetReading
from nodewarden.policy.state import PowerState
from nodewarden.rules.demand import idle_view
from nodewarden.rules.fleet import FleetTally
from nodewarden.rules.forecast import (
    Histogram,
    container_class,
    covered,
    forecast_want,
    fresh,
    next_due,
)
from nodewarden.rules.warm import (
    NO_TARGET,
    LeverWant,
    WarmTarget,
    class_of,
    next_window_boundary,
    targets,
    vm_creates,
    windows_of,
    with_class,
)
from nodewarden.scheduling.instancetypes import Catalogue, InstanceTypePolicy
from nodewarden.scheduling.views import Capacity, NodeView, Plan
from nodewarden.simulate.fleet import Fleet, side_capacity_bytes
from nodewarden.simulate.nodes import MachineNode
from nodewarden.simulate.trace import Trace

_US = 1_000_000


class World(Protocol):
    """What the warm levers ask of the simulation (`Simulation` implements it)."""

    now: int
    nodes: dict[str, MachineNode]

    def at(self, us: int) -> datetime: ...
    def us(self, when: datetime) -> int: ...
    def _schedule(self, t: int, fn: Callable[[Any], None], arg: Any = None) -> None: ...
    def _request_round(self) -> None: ...
    def _evaluate(self, node: MachineNode) -> None: ...


class SimWarmth:
    """The warm-capacity levers of one simulated policy (module docstring)."""

    def __init__(self, world: World, spec: PowerPolicySpec, histogram: Histogram | None) -> None:
        self.w = world
        self.classes = tuple(spec.node_classes)
        self.windows = windows_of(spec.warm_capacity)
        self.window_mode = spec.warm_capacity.mode
        self.settings = spec.forecast_wake
        self.forecast_mode = spec.forecast_wake.mode
        self.histogram = histogram
        self.forecast_classes = covered(self.settings, self.classes)
        self.tally = FleetTally()
        self.tally.class_changed = self._class_changed
        self.targets: dict[str, WarmTarget] = {}
        self._class_of: dict[str, str | None] = {}
        self._applied: dict[str, tuple[FleetReading, tuple[object, ...]]] = {}
        """Per node: the fleet reading it was given and the class figures in it."""
        self._vm_classes = {c.name for c in self.classes if c.node_type == "CloudVM"}
        self._due_token = 0

    @property
    def active(self) -> bool:
        """Whether any lever can want anything (else the simulation skips every call)."""
        windows = bool(self.windows) and self.window_mode != "Off"
        forecast = self.histogram is not None and self.forecast_mode != "Off"
        return bool(self.classes) and (windows or forecast)

    # -- classes and counts ---------------------------------------------------------------

    def node_class(self, node: MachineNode) -> str | None:
        name = node.name
        if name not in self._class_of:
            gpu = node.capacity.gpu_model
            self._class_of[name] = class_of(
                name, node.node_type, node.instance_type, gpu, self.classes
            )
        return self._class_of[name]

    def touch(self, node: MachineNode) -> None:
        self.tally.set(node.name, None, node.node_type, node.state, self.node_class(node))

    def forget(self, node: MachineNode) -> None:
        self.tally.forget(node.name)
        self._class_of.pop(node.name, None)
        self._applied.pop(node.name, None)

    def reading(self, node: MachineNode) -> FleetReading | None:
        """The node's fleet reading with its class's counts and target (as live); None
        when the reading it holds already says so."""
        name = self.node_class(node)
        base = node.facts.fleet
        if name is None or base is None:
            return None
        key = (self.tally.class_counts(None, name), self.targets.get(name, NO_TARGET))
        applied = self._applied.get(node.name)
        if applied is not None and applied[0] is base and applied[1] == key:
            return None
        reading = with_class(base, name, key[0], key[1])
        assert reading is not None  # a base reading and a class: never None
        self._applied[node.name] = (reading, key)
        return reading

    def wants_vms(self) -> bool:
        """Whether a cloud-VM class has a target (else no create is worth looking for)."""
        return any(t.count > 0 for name, t in self.targets.items() if name in self._vm_classes)

    # -- due times ------------------------------------------------------------------------

    def start(self) -> None:
        """The first targets, at the start of the run; then each due time schedules the next."""
        self.due(self._due_token)

    def due(self, token: int) -> None:
        if token != self._due_token:
            return
        now = self.w.at(self.w.now)
        before = self.targets
        self.targets = targets(
            self.classes, self.windows, self.window_mode, self._forecast, self.forecast_mode, now
        )
        for name in before.keys() | self.targets.keys():
            if before.get(name) != self.targets.get(name):
                self._look_again(name)
        later = [next_window_boundary(self.windows, now)]
        if self.histogram is not None:
            later.append(next_due(self.histogram, self.forecast_classes, now))
        upcoming = [t for t in later if t is not None]
        if upcoming:
            self._due_token += 1
            self.w._schedule(self.w.us(min(upcoming)), self.due, self._due_token)

    def _forecast(self, c: NodeClass, at: datetime) -> LeverWant | None:
        if self.histogram is None or c not in self.forecast_classes:
            return None
        return forecast_want(self.histogram, c, at, self.settings)

    def _class_changed(self, key: tuple[str | None, str]) -> None:
        """A class lost a warm or coming node: if it is now short of its target, its nodes
        look again (an Off side node may be woken) and the dispatcher may create VMs."""
        name = key[1]
        target = self.targets.get(name)
        if target is None or target.count <= 0:
            return
        warm, coming = self.tally.class_counts(None, name)
        if warm + coming < target.count:
            self._look_again(name, only_off=True)

    def _look_again(self, name: str, only_off: bool = False) -> None:
        """The class's nodes step again (`only_off`: its Off nodes, which may be woken);
        the dispatcher looks again (its cloud VMs may be created)."""
        for member in sorted(self.tally.members(None, name)):
            node = self.w.nodes.get(member)
            if node is not None and (not only_off or node.state.state is PowerState.OFF):
                self.w._schedule(self.w.now, self.w._evaluate, node)
        self.w._request_round()

    # -- the dispatcher's creates ---------------------------------------------------------

    def creates(self, nodes: list[NodeView], plan: Plan) -> list[str]:
        """Instance types to create so every cloud-VM class reaches its target."""
        out: list[str] = []
        for _, itype, count in vm_creates(self.targets, self.classes, nodes, plan):
            out.extend([itype] * count)
        return out


# -- train / judge --------------------------------------------------------------------------


def split_trace(trace: Trace, days: float) -> tuple[Trace, Trace]:
    """The trace's first `days` (training) and the rest, starting then (judged)."""
    cut = round(days * 86_400 * _US)
    train = tuple(c for c in trace.containers if c.arrival < cut)
    judged = tuple(
        replace(c, arrival=c.arrival - cut) for c in trace.containers if c.arrival >= cut
    )
    first = Trace(trace.name, trace.start, train, min(cut, trace.end), trace.absolute)
    rest = Trace(
        trace.name,
        trace.start + timedelta(microseconds=cut),
        judged,
        max(0, trace.end - cut),
        trace.absolute,
    )
    return first, rest


def class_views(
    classes: tuple[NodeClass, ...], fleet: Fleet, catalogue: Catalogue
) -> list[tuple[str, NodeView]]:
    """Each class's node as the scheduler sees an idle one (a cloud type from the
    catalogue; a side class from the first side node group it matches)."""
    out: list[tuple[str, NodeView]] = []
    for c in classes:
        if c.node_type == "CloudVM":
            itype = catalogue.by_name(c.instance_type or "")
            if itype is not None:
                out.append((c.name, idle_view(c.name, Capacity.of(itype), itype.name, itype.price)))
            continue
        for group in fleet.side_nodes:
            name = group.names()[0]
            if class_of(name, "SideNode", None, group.capacity.gpu_model, (c,)) is None:
                continue
            ram, scratch = side_capacity_bytes(group.capacity)
            cap = group.capacity
            capacity = Capacity(cap.vcpus, ram, scratch, cap.gpus, cap.gpu_model)
            out.append((c.name, idle_view(name, capacity, None, group.cost_per_hour)))
            break
    return out


def train(
    trace: Trace,
    spec: PowerPolicySpec,
    fleet: Fleet,
    catalogue: Catalogue,
    type_policy: InstanceTypePolicy,
) -> Histogram:
    """The forecast histogram of `spec` after watching the whole of `trace` (its arrivals
    classified and counted as the live dispatcher counts them)."""
    settings = spec.forecast_wake
    h = fresh(settings.time_zone, trace.start)
    views = class_views(tuple(covered(settings, spec.node_classes)), fleet, catalogue)
    memo: dict[tuple[object, ...], tuple[str, float] | None] = {}
    for c in trace.containers:
        r = c.resources
        key = (r.vcpus, r.ram, r.scratch, r.gpus, r.gpu_model, r.preemptible)
        if key not in memo:
            memo[key] = container_class(c.resources, views, catalogue, type_policy)
        found = memo[key]
        if found is not None:
            h.arrive(found[0], found[1], trace.at(c.arrival))
    h.advance(trace.at(trace.end))
    return h
