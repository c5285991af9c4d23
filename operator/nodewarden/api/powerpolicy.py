"""PowerPolicy (`pp`): every knob that decides when nodes are created, drained, switched off or woken.

Operators edit PowerPolicy objects through GitOps; each decision records the policy's
name, generation and content hash (`spec_hash` here; `nodewarden.policy.view.PolicyVersion`).
"""

from __future__ import annotations

import hashlib
import json
from datetime import timedelta, tzinfo
from typing import Annotated, ClassVar, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import Field, field_validator

from nodewarden.api.base import (
    FENCE_RULE,
    MAX_CONDITIONS,
    MAX_GENERATION,
    ApiModel,
    Condition,
    FenceTokens,
    StatusModel,
    fence_field,
)
from nodewarden.api.consolidation import Consolidation
from nodewarden.api.energy import PolicyEnergyStatus
from nodewarden.api.inforce import PolicyInForce
from nodewarden.api.warmcapacity import (
    MAX_NODE_CLASSES,
    ForecastStatus,
    ForecastWake,
    NodeClass,
    WarmCapacity,
    WarmStatus,
)
from nodewarden.units import Duration, cel_durations, parse_duration

ResetAction = Literal[
    "On",
    "GracefulShutdown",
    "ForceOff",
    "GracefulRestart",
    "ForceRestart",
    "PowerCycle",
    "PushPowerButton",
    "Nmi",
    "WakeOnLan",
    "SshPoweroff",
]
"""Power actions nodewarden may request: Redfish ResetType values plus WakeOnLan and
SshPoweroff (a `systemctl poweroff` over SSH, for nodes without a BMC)."""

Requester = Annotated[str, Field(min_length=1, max_length=256)]
"""A user name as the API server authenticated it (PowerIntent spec.requestedBy)."""

DEFAULT_ALLOWED_ACTIONS: list[ResetAction] = [
    "On",
    "GracefulShutdown",
    "GracefulRestart",
    "WakeOnLan",
    "SshPoweroff",
]


class BillingWindow(ApiModel):
    """When, within each billing period of a cloud VM, a shutdown saves money."""

    cel_rules: ClassVar[list[dict[str, str]]] = [
        {
            "rule": cel_durations(
                "duration(self.windowStart) < duration(self.windowEnd)",
                "self.windowStart",
                "self.windowEnd",
            ),
            "message": "billing.windowStart must be before billing.windowEnd",
            "fieldPath": ".windowStart",
        },
        {
            "rule": cel_durations(
                "duration(self.period) == duration('0s') || "
                "duration(self.windowEnd) <= duration(self.period)",
                "self.period",
                "self.windowEnd",
            ),
            "message": "billing.windowEnd must not be after billing.period",
            "fieldPath": ".windowEnd",
        },
    ]

    period: Duration = Field(
        default="0s",
        description=(
            "Length of one billing period, counted from the instance's boot. '0s' (the "
            "default) means per-second billing, as AWS, GCP and Azure bill Linux VMs: the "
            "window is always open. Set '1h' for a cloud that bills per started hour."
        ),
    )
    window_start: Duration = Field(
        default="50m",
        description=(
            "Offset into each billing period where the shutdown window opens (ignored "
            "with period '0s')."
        ),
    )
    window_end: Duration = Field(
        default="1h",
        description=(
            "Offset into each billing period where the shutdown window closes (ignored "
            "with period '0s')."
        ),
    )


class Deadlines(ApiModel):
    """How long each kind of transition may take before it is rechecked or blocked."""

    shutdown: Duration = Field(
        default="10m",
        description="From the shutdown request until observed power Off must be seen.",
    )
    wake: Duration = Field(
        default="10m",
        description="From the wake request until observed power On must be seen.",
    )
    ready: Duration = Field(
        default="10m",
        description="From observed power On until the ready probe must pass.",
    )
    drain: Duration = Field(
        default="2h",
        description="From closing admission until the node must have no running work.",
    )


class RetryPolicy(ApiModel):
    """Retry budget and exponential back-off with jitter for power requests."""

    cel_rules: ClassVar[list[dict[str, str]]] = [
        {
            "rule": cel_durations(
                "duration(self.initialBackoff) <= duration(self.maxBackoff)",
                "self.initialBackoff",
                "self.maxBackoff",
            ),
            "message": "retry.initialBackoff must not exceed retry.maxBackoff",
            "fieldPath": ".initialBackoff",
        }
    ]

    budget: int = Field(
        default=3,
        ge=0,
        le=100,
        description="How many times a failed or unconfirmed request is retried before BLOCK.",
    )
    initial_backoff: Duration = Field(default="10s", description="Delay before the first retry.")
    max_backoff: Duration = Field(default="5m", description="Upper bound of the retry delay.")
    multiplier: float = Field(
        default=2.0, ge=1.0, le=10.0, description="Factor applied to the delay after each retry."
    )
    jitter: float = Field(
        default=0.2,
        ge=0.0,
        le=1.0,
        description="Random fraction (0..1) added to or removed from each delay.",
    )


class InhibitorOverride(ApiModel):
    """Whether an audited manual override may pass an active systemd shutdown inhibitor."""

    permitted: bool = Field(
        default=False,
        description=(
            "If true, a PowerIntent carrying spec.override.inhibitors with a justification "
            "may shut a node down despite an active block-mode inhibitor. Recorded in the "
            "Safety Record."
        ),
    )
    allowed_requesters: list[Requester] = Field(
        default_factory=list,
        max_length=64,
        description=(
            "If non-empty, only PowerIntents whose spec.requestedBy is in this list may "
            "use the override."
        ),
    )
    permit_force_off: bool = Field(
        default=False,
        description=(
            "If true, an overriding PowerIntent may request ForceOff after GracefulShutdown "
            "failed. ForceOff is never used to save energy without this."
        ),
    )


class DisruptionBudget(ApiModel):
    """Limits on how many nodes may be in a power transition at once."""

    max_concurrent_transitions: int = Field(
        default=6,
        ge=0,
        le=10000,
        description=(
            "Maximum nodes draining, shutting down or waking at the same time (0 = none). "
            "Checked for side nodes; transitions of cloud VMs under the same policy count "
            "towards it."
        ),
    )


class InstanceTypeLimit(ApiModel):
    """A cap on the number of nodes of one instance type."""

    instance_type: str = Field(
        description="Instance type name as listed in the operator's catalogue.",
        min_length=1,
        max_length=128,
    )
    max: int = Field(ge=0, le=100000, description="Maximum number of nodes of this type.")


class DispatchLimits(ApiModel):
    """How hard nodewarden tries to run a container, and when nodes count as lost."""

    max_attempts: int = Field(
        default=5,
        ge=1,
        le=100,
        description="Runs of one container before it is marked Failed.",
    )
    max_lock_flaps: int = Field(
        default=3,
        ge=0,
        le=1000,
        description="How often a container may go Locked back to Queued before it waits unlocked.",
    )
    lame_after: Duration = Field(
        default="10m",
        description="A node up this long without a successful probe is shut down ...",
    )
    lame_min_probes: int = Field(
        default=3,
        ge=1,
        le=10000,
        description="... provided at least this many probes were attempted.",
    )
    takeover_after: Duration = Field(
        default="10m",
        description=(
            "Instances tagged by another dispatcher that has not probed them for this long "
            "are claimed or destroyed."
        ),
    )


class PlacementPolicy(ApiModel):
    """How the dispatcher places containers (issue 25). Each lever can be switched back to
    the behaviour of earlier releases (the value named in its description). The plan is
    one for the whole queue: the dispatcher reads these knobs from its default policy."""

    packing: Literal["BestFit", "IdleFirst"] = Field(
        default="BestFit",
        description=(
            "BestFit: a container goes to the fullest ready node that fits it (a busy node "
            "before an idle one), so emptier nodes fall idle and are switched off. "
            "IdleFirst (earlier releases): an idle node of the cheapest fitting type first, "
            "then a busy node of a fitting type."
        ),
    )
    launch: Literal["Queue", "PerContainer"] = Field(
        default="Queue",
        description=(
            "Queue: new capacity (a new VM, a side node woken) is chosen for the pending "
            "queue as a whole: several pending containers go onto one new node when that is "
            "cheaper per container-hour than each on its own cheapest type (as Karpenter's "
            "launch packs pending pods). PerContainer (earlier releases): the cheapest "
            "fitting type per container; later containers only fill what is left."
        ),
    )
    gpu_capacity: Literal["LastResort", "GpuWorkOnly"] = Field(
        default="LastResort",
        description=(
            "LastResort: a container that asks for no GPU goes to a GPU node or GPU "
            "instance type only when no node or type without GPUs could ever fit it. "
            "GpuWorkOnly (earlier releases): GPU side nodes never take CPU-only work; GPU "
            "instance types are judged by price like any other."
        ),
    )
    gpu_idle: Literal["GpuOnly", "Off"] = Field(
        default="GpuOnly",
        description=(
            "GpuOnly: a GPU node running only CPU work, its GPUs held by no container for "
            "idleThreshold (and not read busy by its probe), takes only GPU work -- "
            "status.admission GPUOnly -- so its CPU work drains away and the node then takes "
            "the usual idle path; it is never switched off while any container runs. Off "
            "(earlier releases): a GPU node running CPU work is busy like any other."
        ),
    )
    side_node_price: Literal["PerResource", "PerNode"] = Field(
        default="PerResource",
        description=(
            "PerResource: a side node's price is set against the resources it offers -- "
            "the share a container takes of it, and, for a node that is off, the pending "
            "containers that would fill it -- so a large cheap-per-core server is woken "
            "for a burst. PerNode (earlier releases): an off side node is woken only when "
            "its hourly price is no more than the cheapest instance type that fits."
        ),
    )
    wait_for_cheaper: Literal["WithinBudget", "Unbounded"] = Field(
        default="WithinBudget",
        description=(
            "WithinBudget: a container waits for cheaper capacity (a side node waking up, "
            "a node whose room comes back soon because a container there is cancelled) "
            "instead of a new VM only while that is expected to delay its start by at most "
            "waitBudget. Unbounded (earlier releases): it waits for a waking side node "
            "however long the wake takes, and never for a node freeing up."
        ),
    )
    wait_budget: Duration = Field(
        default="2m",
        description=(
            "How much longer than on a new VM a container may wait for cheaper capacity, "
            "counted from when it was first seen ('0s': only when it is no slower)."
        ),
    )
    no_wait_above_priority: int = Field(
        default=900,
        ge=0,
        le=1000,
        description=(
            "Containers with a priority above this never wait for cheaper capacity (their "
            "wait budget is 0s); 1000 switches the exception off."
        ),
    )


class PowerPolicySpec(ApiModel):
    """The knobs of power and capacity decisions."""

    cel_rules: ClassVar[list[dict[str, str]]] = [
        {
            "rule": "!has(self.maxNodes) || self.minWarmNodes <= self.maxNodes",
            "message": "minWarmNodes must not exceed maxNodes",
            "fieldPath": ".minWarmNodes",
        },
        {
            "rule": cel_durations(
                "duration(self.minOn) <= duration(self.maxOn)", "self.minOn", "self.maxOn"
            ),
            "message": "minOn must not exceed maxOn",
            "fieldPath": ".minOn",
        },
        {
            "rule": "!has(self.nodeClasses) || self.nodeClasses.all(c, "
            "self.nodeClasses.exists_one(d, d.name == c.name))",
            "message": "nodeClasses: every class name must be unique",
            "fieldPath": ".nodeClasses",
        },
        {
            "rule": "!has(self.warmCapacity) || !has(self.warmCapacity.windows) || "
            "self.warmCapacity.windows.all(w, has(self.nodeClasses) && "
            "self.nodeClasses.exists(c, c.name == w.nodeClass))",
            "message": "warmCapacity.windows: every nodeClass must name a spec.nodeClasses entry",
            "fieldPath": ".warmCapacity",
        },
    ]

    idle_threshold: Duration = Field(
        default="5m",
        description="A node must be idle this long before a drain or shutdown is considered.",
    )
    boot_grace: Duration = Field(
        default="10m",
        description=(
            "Boot expiry: a cloud node younger than this that has not paired yet is left "
            "alone; older is shut down."
        ),
    )
    min_on: Duration = Field(
        default="30m",
        description="A node must have been on at least this long before it is switched off.",
    )
    max_on: Duration = Field(
        default="8760h",
        description="Upper bound for minOn (sanity limit; minOn ≤ maxOn is enforced).",
    )
    min_off: Duration = Field(
        default="10m",
        description="A node must have been off at least this long before it is woken.",
    )
    cooldown: Duration = Field(
        default="5m",
        description="Minimum time between two power transitions of the same node.",
    )
    telemetry_max_age: Duration = Field(
        default="2m",
        description="Telemetry older than this is stale and never counts as evidence of safety.",
    )
    heartbeat_stale_after: Duration = Field(
        default="5m",
        description="A worker without a successful probe for this long is considered down.",
    )
    billing: BillingWindow = Field(
        default_factory=BillingWindow,
        description="Billing period and the shutdown window inside it (cloud VMs).",
    )
    deadlines: Deadlines = Field(
        default_factory=Deadlines, description="Deadline of each kind of transition."
    )
    retry: RetryPolicy = Field(
        default_factory=RetryPolicy, description="Retry budget and back-off for power requests."
    )
    allowed_actions: list[ResetAction] = Field(
        default_factory=lambda: list(DEFAULT_ALLOWED_ACTIONS),
        json_schema_extra={"default": list(DEFAULT_ALLOWED_ACTIONS)},
        max_length=16,
        description=(
            "Power actions nodewarden may use; intersected with what each node supports. "
            "ForceOff is never used as an energy-saving shortcut."
        ),
    )
    inhibitor_override: InhibitorOverride = Field(
        default_factory=InhibitorOverride,
        description="Whether audited manual overrides of shutdown inhibitors are permitted.",
    )
    disruption_budget: DisruptionBudget = Field(
        default_factory=DisruptionBudget,
        description="How many nodes may be in a power transition at once.",
    )
    instance_type_limits: list[InstanceTypeLimit] = Field(
        default_factory=list,
        max_length=256,
        description="Per-instance-type caps on the number of nodes.",
    )
    max_nodes: int | None = Field(
        default=None,
        ge=0,
        le=100000,
        description="Maximum number of cloud nodes (unset = unlimited; the operator's own "
        "ceiling `limits.maxNodes` applies in any case).",
    )
    max_hourly_spend: float | None = Field(
        default=None,
        ge=0,
        le=1_000_000,
        description="Maximum summed hourly price of all cloud nodes (unset = unlimited; the "
        "operator's own ceiling `limits.maxHourlySpend` applies in any case).",
    )
    min_warm_nodes: int = Field(
        default=0,
        ge=0,
        le=100000,
        description="Idle nodes kept on (not shut down) to absorb new demand quickly.",
    )
    dispatch: DispatchLimits = Field(
        default_factory=DispatchLimits,
        description="Dispatch attempts, lock flapping, lame-node and takeover limits.",
    )
    placement: PlacementPolicy = Field(
        default_factory=PlacementPolicy,
        description=(
            "How containers are placed: packing, new capacity for the queue as a whole, GPU "
            "capacity kept for GPU work, waiting for cheaper capacity (read from the "
            "dispatcher's default policy)."
        ),
    )
    paused: bool = Field(
        default=False,
        description="If true, nodewarden makes no power transitions under this policy.",
    )
    mode: Literal["Normal", "Shadow"] = Field(
        default="Normal",
        description=(
            "Normal: decide and act. Shadow: decide and record every decision (PowerIntents "
            "in phase Shadow, Events) but never act -- how a cautious site turns nodewarden on."
        ),
    )
    time_zone: str = Field(
        default="UTC",
        min_length=1,
        max_length=64,
        pattern=r"^[A-Za-z0-9_+/-]+$",
        description=(
            "IANA time zone of this policy's local day (e.g. Europe/Berlin): the energy and "
            "money saved 'today' in its status count from local midnight."
        ),
    )

    @field_validator("time_zone")
    @classmethod
    def _known_zone(cls, value: str) -> str:
        zone_of(value)
        return value

    # -- warm capacity (api/warmcapacity.py; issue 25 items 5 and 6) --------------------
    node_classes: list[NodeClass] = Field(
        default_factory=list,
        max_length=MAX_NODE_CLASSES,
        description=(
            "Named sets of nodes the warm-capacity levers count and keep warm (a node "
            "belongs to the first class that matches it)."
        ),
    )
    warm_capacity: WarmCapacity = Field(
        default_factory=WarmCapacity,
        description="Warm windows: at least N nodes of a class on by the clock.",
    )
    forecast_wake: ForecastWake = Field(
        default_factory=ForecastWake,
        description="Warm capacity ahead of the demand the arrivals seen so far predict.",
    )
    consolidation: Consolidation = Field(
        default_factory=Consolidation,
        description=(
            "Consolidation by drain (never eviction): a lightly used, dear node whose work "
            "fits elsewhere stops admitting new work. Starts in Shadow."
        ),
    )

    def seconds(self, field: str) -> float:
        """The named top-level duration knob in seconds, e.g. `spec.seconds('min_on')`."""
        value = getattr(self, field)
        return parse_duration(value).total_seconds()

    def duration(self, field: str) -> timedelta:
        return parse_duration(getattr(self, field))


def zone_of(name: str) -> tzinfo:
    """The IANA time zone `name` (ValueError naming the field when unknown)."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(
            f"spec.timeZone: {name!r} is not an IANA time zone (e.g. UTC, Europe/Berlin)"
        ) from None


class PowerPolicyStatus(StatusModel):
    """What the operator has observed about this policy."""

    cel_rules: ClassVar[list[dict[str, str]]] = [FENCE_RULE]

    fence: FenceTokens | None = fence_field()

    observed_generation: int | None = Field(
        default=None,
        ge=0,
        le=MAX_GENERATION,
        description="metadata.generation last processed by the operator.",
    )
    content_hash: str | None = Field(
        default=None,
        max_length=64,
        description="sha256 (first 16 hex digits) of the canonical spec.",
    )
    nodes: int | None = Field(
        default=None, ge=0, le=2**31, description="Number of WorkerNodes referring to this policy."
    )
    energy: PolicyEnergyStatus | None = Field(
        default=None,
        description="Energy and money its nodes saved against never-off (docs/energy.md).",
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        max_length=MAX_CONDITIONS,
        description="Valid and other standard conditions.",
    )
    # -- warm capacity (written by the power controller at its due times) ---------------
    forecast: ForecastStatus | None = Field(
        default=None,
        description="The forecast's learned histogram of arrivals (forecastWake not Off).",
    )
    warm_capacity: WarmStatus | None = Field(
        default=None, description="What the warm-capacity levers want of each node class now."
    )
    in_force: PolicyInForce | None = Field(
        default=None,
        description=(
            "The policy in force now: thresholds, budgets in use and left, windows, the "
            "forecast's state, nodes on/off/in transition (written on change and at window "
            "boundaries)."
        ),
    )


def spec_hash(spec: PowerPolicySpec) -> str:
    """Content hash of a policy spec: stable across key order and defaults written or not."""
    canonical = json.dumps(spec.to_wire(), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]
