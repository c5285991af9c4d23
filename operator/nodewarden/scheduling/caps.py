"""Hard caps on cloud capacity: the operator's ceilings above every PowerPolicy, and the one
check every instance create passes. Pure: facts in, a verdict out.

Two layers of limits apply to every create, planned (the scheduler asked for a node) or
declared (a person wrote a CloudVM WorkerNode):

- the **operator's ceilings** (`Ceilings`, operator config `dispatch.limits`, Helm values
  `limits.*`): total nodes, summed hourly price, instances per type. Only whoever edits
  the operator configuration can change them; no PowerPolicy can raise them;
- the **default PowerPolicy's limits** (`maxNodes`, `maxHourlySpend`,
  `instanceTypeLimits`), which may only lower them.

`effective_limits` folds both into the scheduler's `Limits` (the smaller of each), so the
plan never asks for what the check would refuse. `admit_create` is the check itself, run
by the worker pool right before each cloud create against what exists or is being
created at that moment (`Fleet`); its refusal names the cap, its value, where it is set
and how to raise it. Creates also stop entirely -- they never fall back to "unlimited" --
while the default policy is missing or invalid (`stopped`), and while the cloud's
back-off blocks the type.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from nodewarden.scheduling.views import Limits

_EPSILON = 1e-9


class Cap(StrEnum):
    """Which limit refused a create (the `cap` label of the refusal metric)."""

    STOPPED = "creates_stopped"
    """No default policy (missing or invalid): nothing is created."""
    BACKOFF = "cloud_backoff"
    MAX_NODES = "max_nodes"
    MAX_HOURLY_SPEND = "max_hourly_spend"
    PER_TYPE = "per_type"


@dataclass(frozen=True, slots=True)
class Ceilings:
    """The operator's hard caps (None = no ceiling of that kind)."""

    max_nodes: int | None = None
    max_hourly_spend: float | None = None
    max_per_type: int | None = None
    """Instances of any one type."""
    per_type: Mapping[str, int] = field(default_factory=dict)
    """Instances of the named types (below `max_per_type` where both are set)."""

    def type_ceiling(self, name: str) -> int | None:
        values = [v for v in (self.max_per_type, self.per_type.get(name)) if v is not None]
        return min(values) if values else None

    def type_setting(self, name: str) -> str:
        """The Helm value that sets `type_ceiling(name)`."""
        if self.per_type.get(name) == self.type_ceiling(name):
            return f"instanceTypes.{name}"
        return "maxPerInstanceType"


@dataclass(frozen=True, slots=True)
class PolicyLimits:
    """The default PowerPolicy's limits (None = the policy sets none)."""

    name: str
    max_nodes: int | None = None
    max_hourly_spend: float | None = None
    per_type: Mapping[str, int] = field(default_factory=dict)
    min_warm_nodes: int = 0


@dataclass(frozen=True, slots=True)
class Fleet:
    """This dispatcher's cloud instances that exist or are being created (every one costs
    money until it is gone, shutting-down ones included)."""

    nodes: int = 0
    hourly_spend: float = 0.0
    per_type: Mapping[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, instances: Iterable[tuple[str, float]]) -> Fleet:
        """From (instance type, hourly price) of each instance."""
        nodes, spend, per_type = 0, 0.0, dict[str, int]()
        for type_name, price in instances:
            nodes += 1
            spend += price
            per_type[type_name] = per_type.get(type_name, 0) + 1
        return cls(nodes, spend, per_type)


@dataclass(frozen=True, slots=True)
class Admission:
    """The verdict on one create: allowed, or the cap that refused it and why."""

    allowed: bool
    cap: Cap | None = None
    message: str = ""


ALLOWED = Admission(True)


def _smaller(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)


def effective_limits(policy: PolicyLimits, ceilings: Ceilings, type_names: Iterable[str]) -> Limits:
    """The scheduler's limits: the smaller of the policy's and the operator's, per kind."""
    per_type: dict[str, int] = {}
    for name in {*type_names, *policy.per_type, *ceilings.per_type}:
        value = _smaller(policy.per_type.get(name), ceilings.type_ceiling(name))
        if value is not None:
            per_type[name] = int(value)
    nodes = _smaller(policy.max_nodes, ceilings.max_nodes)
    return Limits(
        max_nodes=int(nodes) if nodes is not None else None,
        per_type_max=per_type,
        max_hourly_spend=_smaller(policy.max_hourly_spend, ceilings.max_hourly_spend),
        min_warm_nodes=policy.min_warm_nodes,
    )


def _operator(setting: str, value: float, now: str) -> str:
    return (
        f"the operator's ceiling limits.{setting} ({value:g}) is reached ({now}); only an "
        f"administrator can raise it (Helm value limits.{setting}), no PowerPolicy can"
    )


def _policy(policy: str, setting: str, value: float, now: str) -> str:
    return (
        f"PowerPolicy {policy!r} {setting} ({value:g}) is reached ({now}); raise "
        f"spec.{setting} of that policy (up to the operator's ceiling)"
    )


def admit_create(
    instance_type: str,
    price: float,
    fleet: Fleet,
    policy: PolicyLimits | None,
    ceilings: Ceilings,
    *,
    stopped: str | None = None,
    backoff: str | None = None,
) -> Admission:
    """May one more instance of `instance_type` (costing `price` per hour) be created now?

    `policy` None or `stopped` set: the default policy is missing or invalid, so no.
    `backoff`: why the cloud's back-off blocks this type now (None: it does not)."""
    if stopped is not None or policy is None:
        return Admission(False, Cap.STOPPED, "creates stopped: " + (stopped or "no policy"))
    if backoff is not None:
        return Admission(False, Cap.BACKOFF, f"the cloud's back-off blocks creates: {backoff}")
    nodes = f"{fleet.nodes} nodes"
    if ceilings.max_nodes is not None and fleet.nodes + 1 > ceilings.max_nodes:
        return Admission(False, Cap.MAX_NODES, _operator("maxNodes", ceilings.max_nodes, nodes))
    if policy.max_nodes is not None and fleet.nodes + 1 > policy.max_nodes:
        return Admission(
            False, Cap.MAX_NODES, _policy(policy.name, "maxNodes", policy.max_nodes, nodes)
        )
    spend = f"{fleet.hourly_spend:g}/h now, a new {instance_type} costs {price:g}/h"
    after = fleet.hourly_spend + price
    if ceilings.max_hourly_spend is not None and after > ceilings.max_hourly_spend + _EPSILON:
        return Admission(
            False,
            Cap.MAX_HOURLY_SPEND,
            _operator("maxHourlySpend", ceilings.max_hourly_spend, spend),
        )
    if policy.max_hourly_spend is not None and after > policy.max_hourly_spend + _EPSILON:
        return Admission(
            False,
            Cap.MAX_HOURLY_SPEND,
            _policy(policy.name, "maxHourlySpend", policy.max_hourly_spend, spend),
        )
    of_type = fleet.per_type.get(instance_type, 0)
    have = f"{of_type} {instance_type} nodes"
    ceiling = ceilings.type_ceiling(instance_type)
    if ceiling is not None and of_type + 1 > ceiling:
        setting = ceilings.type_setting(instance_type)
        return Admission(False, Cap.PER_TYPE, _operator(setting, ceiling, have))
    type_limit = policy.per_type.get(instance_type)
    if type_limit is not None and of_type + 1 > type_limit:
        return Admission(
            False,
            Cap.PER_TYPE,
            _policy(policy.name, f"instanceTypeLimits[{instance_type}]", type_limit, have),
        )
    return ALLOWED


@dataclass(frozen=True, slots=True)
class Excess:
    """One way the current fleet is above a (new) ceiling: what `nodewarden check` says."""

    setting: str
    ceiling: float
    current: float


def above_ceilings(fleet: Fleet, ceilings: Ceilings) -> list[Excess]:
    """Where the fleet already exceeds the operator's ceilings (an upgrade to lower
    ceilings stops new creates until the fleet shrinks below them; nothing is destroyed)."""
    out: list[Excess] = []
    if ceilings.max_nodes is not None and fleet.nodes > ceilings.max_nodes:
        out.append(Excess("maxNodes", ceilings.max_nodes, fleet.nodes))
    spend = ceilings.max_hourly_spend
    if spend is not None and fleet.hourly_spend > spend + _EPSILON:
        out.append(Excess("maxHourlySpend", spend, round(fleet.hourly_spend, 6)))
    for name, count in sorted(fleet.per_type.items()):
        ceiling = ceilings.type_ceiling(name)
        if ceiling is not None and count > ceiling:
            out.append(Excess(f"{ceilings.type_setting(name)} ({name})", ceiling, count))
    return out
