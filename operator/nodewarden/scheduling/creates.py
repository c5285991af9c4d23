"""Whether the plan may create a new VM now, and the reason a container waits when it may
not (pure, used by `scheduling.launch`).

`Counted` is the plan's count of cloud nodes against the limits (existing ones, then each
create it plans); `limit_reason` says why no new node of a type may be created now (the
cloud's back-off, max nodes, max hourly spend, the per-type limit, the round's create
queue) and `no_node_reason` what a container that gets no node waits for. A new node
while planning is a `NodeView` of state Pending (`new_view`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from nodewarden.scheduling.instancetypes import InstanceType
from nodewarden.scheduling.placement import Ask
from nodewarden.scheduling.views import Capacity, CloudState, Limits, NodeState, NodeView


@dataclass(slots=True)
class Counted:
    """The cloud nodes counted against the limits (kept as the plan creates)."""

    nodes: int = 0
    spend: float = 0.0
    per_type: dict[str, int] = field(default_factory=dict)
    new_left: int | None = None
    blocked: dict[str, str] = field(default_factory=dict)

    def created(self, itype: InstanceType) -> None:
        """The plan creates a node of `itype`."""
        self.nodes += 1
        self.spend += itype.price
        self.per_type[itype.name] = self.per_type.get(itype.name, 0) + 1
        if self.new_left is not None:
            self.new_left -= 1


def limit_reason(itype: InstanceType, limits: Limits, counted: Counted) -> str | None:
    """Why no new node of `itype` may be created now (None: it may)."""
    if itype.name in counted.blocked:
        return counted.blocked[itype.name]
    if limits.max_nodes is not None and counted.nodes >= limits.max_nodes:
        return f"waiting: max nodes ({limits.max_nodes}) reached"
    if limits.max_hourly_spend is not None and (
        counted.spend + itype.price > limits.max_hourly_spend + 1e-9
    ):
        return (
            f"waiting: a new {itype.name} ({itype.price:g}/h) would exceed the max "
            f"hourly spend ({limits.max_hourly_spend:g}/h; now {counted.spend:g}/h)"
        )
    cap = limits.per_type_max.get(itype.name)
    if cap is not None and counted.per_type.get(itype.name, 0) >= cap:
        return f"waiting: per-type limit of {cap} {itype.name} nodes reached"
    if counted.new_left is not None and counted.new_left <= 0:
        return f"waiting for a new {itype.name} (create queue full)"
    return None


def no_node_reason(
    ask: Ask, limits: Limits, cloud: CloudState, counted: Counted
) -> tuple[str, str | None]:
    """What a container that gets no node waits for, and the type it was chosen (a
    create queue that is full names its type)."""
    if cloud.creates_blocked is not None:
        return f"waiting: {cloud.creates_blocked}", None
    chosen = ask.choice.instance_type
    if chosen is None:
        reasons = "; ".join(sorted({counted.blocked.get(n, "") for n in ask.candidates} - {""}))
        return f"waiting: every fitting instance type is unavailable ({reasons})", None
    why = limit_reason(chosen, limits, counted) or f"waiting for a new {chosen.name}"
    return why, chosen.name if why.endswith("(create queue full)") else None


def new_view(itype: InstanceType, number: int) -> NodeView:
    """The node the plan's `number`-th create would make."""
    return NodeView(
        name=f"(new {itype.name} #{number})",
        state=NodeState.PENDING,
        capacity=Capacity.of(itype),
        instance_type=itype.name,
        price=itype.price,
    )


def blocked_types(cloud: CloudState, limits: Limits, per_type: Mapping[str, int]) -> dict[str, str]:
    """Instance types no new node may be of now: the cloud's back-off, per-type limits."""
    blocked = dict(cloud.blocked_types)
    for name, cap in limits.per_type_max.items():
        if per_type.get(name, 0) >= cap:
            blocked.setdefault(name, f"per-type limit of {cap} {name} nodes reached")
    return blocked
