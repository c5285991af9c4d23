"""Queued demand per node and fleet counts per policy, as the core's readings.

Work evidence from the dispatcher is its capacity ledger (`placed_counts`). Demand uses
the scheduler's own fit rules (`scheduling.scheduler.qualified_demand`) on the
dispatcher's plan, or on a live read of the queue for RereadDemand: for a node that is Off
or waking, the containers the plan waits on it for; for any other node, the queued
containers it could run. Pure: the caller passes the nodes, the queue and the time."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from nodewarden.api.containerdispatch import ContainerDispatchSpec, ContainerDispatchStatus
from nodewarden.policy.facts import DemandReading, FleetReading
from nodewarden.policy.state import PowerState, TransitionKind, api_admission
from nodewarden.power.runtime import NodeRuntime
from nodewarden.scheduling.instancetypes import Catalogue, InstanceTypePolicy
from nodewarden.scheduling.scheduler import qualified_demand
from nodewarden.scheduling.views import Capacity, ContainerView, NodeState, NodeView, Phase, Plan
from nodewarden.units import parse_quantity

MAX_LISTED = 64
"""Container uuids a DemandReading names (the count is always whole)."""


def node_view(rt: NodeRuntime, catalogue: Catalogue) -> NodeView | None:
    """The node as the scheduler sees an idle node of its shape (None: shape unknown)."""
    spec = rt.spec
    if spec is None:
        return None
    if spec.node_type == "SideNode":
        cap = spec.capacity
        if cap is None:
            return None
        capacity = Capacity(
            cap.vcpus, parse_quantity(cap.ram), parse_quantity(cap.scratch), cap.gpus, cap.gpu_model
        )
        return NodeView(rt.name, NodeState.IDLE, capacity, None, spec.cost_per_hour or 0.0)
    itype = catalogue.by_name(spec.instance_type or "")
    if itype is None:
        return None
    return NodeView(rt.name, NodeState.IDLE, Capacity.of(itype), itype.name, itype.price)


def placed_counts(containers: Iterable[ContainerView]) -> dict[str, int]:
    """Per node: the containers holding its capacity in the dispatcher's ledger
    (`scheduling.ledger`: chosen for it with a lock or start under way, Locked, Running,
    cancelled but not yet seen gone, or a runner the node lists) -- work on the node from
    the moment it was chosen, so a node is never taken for idle in between."""
    out: dict[str, int] = {}
    for c in containers:
        if c.node is not None and c.phase in (Phase.LOCKED, Phase.RUNNING):
            out[c.node] = out.get(c.node, 0) + 1
    return out


def _reading(source: str, at: datetime, uuids: list[str]) -> DemandReading:
    return DemandReading(
        source=source, observed_at=at, queued=len(uuids), containers=tuple(uuids[:MAX_LISTED])
    )


def planned_demand(
    nodes: Iterable[NodeRuntime],
    containers: list[ContainerView],
    plan: Plan,
    at: datetime,
    catalogue: Catalogue,
    type_policy: InstanceTypePolicy,
) -> dict[str, DemandReading]:
    """Demand of every node with a spec, from the dispatcher's plan made at `at`."""
    queued = [c for c in containers if c.phase is Phase.QUEUED]
    waiting_for: dict[str, list[str]] = {}
    for uuid, node in plan.wait_nodes.items():
        waiting_for.setdefault(node, []).append(uuid)
    for node, uuids in plan.wakes.items():
        for uuid in uuids:
            if uuid not in waiting_for.setdefault(node, []):
                waiting_for[node].append(uuid)
    by_shape: dict[tuple[Any, ...], list[str]] = {}
    readings: dict[tuple[str, ...], DemandReading] = {}  # shared: readings are frozen
    out: dict[str, DemandReading] = {}
    for rt in nodes:
        if rt.spec is None:
            continue
        if rt.state.state in (PowerState.OFF, PowerState.WAKING):
            uuids = waiting_for.get(rt.name, [])
        else:
            view = node_view(rt, catalogue)
            if view is None:
                continue
            shape = (view.capacity, view.instance_type, view.price)
            found = by_shape.get(shape)
            if found is None:
                found = by_shape[shape] = qualified_demand(view, queued, catalogue, type_policy)
            uuids = found
        key = tuple(uuids)
        reading = readings.get(key)
        if reading is None:
            reading = readings[key] = _reading("queue (dispatcher plan)", at, uuids)
        out[rt.name] = reading
    return out


def queued_from_bodies(
    bodies: Iterable[Mapping[str, Any]], read_at: datetime
) -> list[ContainerView]:
    """The queued containers of a live LIST of ContainerDispatches (unparsable ones skipped:
    validation marks them)."""
    queued: list[ContainerView] = []
    for body in bodies:
        try:
            spec = ContainerDispatchSpec.model_validate(body.get("spec") or {})
            status = ContainerDispatchStatus.model_validate(body.get("status") or {})
        except ValidationError:
            continue
        if spec.cancel or status.phase not in (None, "Queued"):
            continue
        queued.append(
            ContainerView(spec.uuid, Phase.QUEUED, spec.priority, read_at, spec.resources)
        )
    return queued


def reread_demand(
    rt: NodeRuntime,
    queued: list[ContainerView],
    read_at: datetime,
    catalogue: Catalogue,
    type_policy: InstanceTypePolicy,
) -> DemandReading:
    """RereadDemand's reading for one node, from the live queue."""
    view = node_view(rt, catalogue)
    uuids = qualified_demand(view, queued, catalogue, type_policy) if view is not None else []
    return _reading("queue (live list of ContainerDispatches)", read_at, uuids)


def fleet_readings(nodes: Iterable[NodeRuntime], now: datetime) -> dict[str | None, FleetReading]:
    """Per policy name: side-node transitions in progress (the disruption budget) and
    warm idle nodes of any type (min warm)."""
    counts: dict[str | None, list[int]] = {}
    for rt in nodes:
        c = counts.setdefault(rt.policy_name, [0, 0])
        t = rt.state.transition
        if t is not None and t.kind is not TransitionKind.VERIFY and rt.node_type == "SideNode":
            c[0] += 1  # the disruption budget protects fixed capacity: side nodes only
        if rt.state.state is PowerState.ON_IDLE and api_admission(rt.state.admission) == "Open":
            c[1] += 1
    return {
        key: FleetReading(
            source="power controller (every node under the policy)",
            observed_at=now,
            transitions_in_progress=c[0],
            warm_idle_nodes=c[1],
        )
        for key, c in counts.items()
    }
