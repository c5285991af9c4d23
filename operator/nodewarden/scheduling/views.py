"""What the scheduler sees and decides: its input views and its `Plan` (values only, pure).

- `ContainerView` (with its `Phase`), `NodeView` (with its `NodeState` and `Capacity`),
  `Limits`, `CloudState` -- the snapshot `scheduling.scheduler.plan` takes;
- `Plan` of `Start`s, `Create`s, waits, unlocks, wakes, surplus -- what it returns.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from nodewarden.api.containerdispatch import ContainerResources
from nodewarden.scheduling.instancetypes import InstanceType


class Phase(StrEnum):
    QUEUED = "Queued"
    LOCKED = "Locked"
    RUNNING = "Running"


class NodeState(StrEnum):
    """What the scheduler needs to know about a node's lifecycle."""

    PENDING = "Pending"  # creation requested, instance not yet listed
    BOOTING = "Booting"
    IDLE = "Idle"
    ACTIVE = "Active"
    DRAINING = "Draining"
    SHUTTING_DOWN = "ShuttingDown"
    OFF = "Off"
    WAKING = "Waking"
    UNKNOWN = "Unknown"


USABLE_NOW = frozenset({NodeState.IDLE, NodeState.ACTIVE})
COMING_UP = frozenset({NodeState.PENDING, NodeState.BOOTING})


@dataclass(frozen=True, slots=True)
class ContainerView:
    """One container as the scheduler sees it."""

    uuid: str
    phase: Phase
    priority: int
    first_seen: datetime
    resources: ContainerResources
    node: str | None = None  # assigned node for Locked / Running
    runner_absent: bool = False
    """Locked: its node said its runner never ran; it may be started again there (if it
    fits). Otherwise a Locked container holds its node unconditionally."""
    whole_node: bool = False
    """Running: a runner the node lists of no container known here; holds the whole node."""
    frees_at: datetime | None = None
    """Running or Locked and being cancelled: when its node is expected to have seen its
    runner gone (the KILL after the TERM timeout, then a probe): capacity about to free."""
    do_not_consolidate: bool = False
    """Its ContainerDispatch carries the do-not-consolidate annotation: the node it runs
    on is never drained by consolidation (`rules.consolidation`)."""


@dataclass(frozen=True, slots=True)
class Capacity:
    vcpus: int
    ram: int
    scratch: int
    gpus: int
    gpu_model: str | None = None
    preemptible: bool = False

    @classmethod
    def of(cls, t: InstanceType) -> Capacity:
        return cls(t.vcpus, t.ram, t.scratch, t.gpus, t.gpu_model, t.preemptible)


@dataclass(frozen=True, slots=True)
class NodeView:
    """One node as the scheduler sees it."""

    name: str
    state: NodeState
    capacity: Capacity
    instance_type: str | None = None  # catalogue name; None for side nodes
    price: float = 0.0
    admission_open: bool = True  # False while draining, held (idle behaviour hold/drain), ...
    ready: bool = False  # passed the ready probe
    wakeable: bool = False  # side node, Off or Waking: the power controller may wake it
    coming_since: datetime | None = None
    """When it began coming up: a side node's wake was asked (Waking), a VM's create."""
    boot_seconds: float | None = None
    """How long this node takes to come up, as seen (`rules.boots`; the median of the
    last few); None: never seen."""
    boot_slowest: float | None = None
    """The slowest of those boots."""
    wake_after: datetime | None = None
    """An off side node: the power controller's wake timing (min-off, cooldown) lets it
    be woken from then on (None: now)."""
    gpu_only: bool = False
    """Admission open to GPU work only (`policy.gpuidle`, status GPUOnly): a container that
    asks for no GPU starts there only when nothing without GPUs could ever fit it."""


@dataclass(frozen=True, slots=True)
class Limits:
    max_nodes: int | None = None
    per_type_max: Mapping[str, int] = field(default_factory=dict)
    max_hourly_spend: float | None = None
    min_warm_nodes: int = 0


@dataclass(frozen=True, slots=True)
class CloudState:
    """What the cloud adapter's back-off says about creating instances now."""

    creates_blocked: str | None = None  # reason all creates are blocked (quota, rate limit)
    blocked_types: Mapping[str, str] = field(default_factory=dict)  # type -> reason
    max_new_nodes: int | None = None  # creates the executor may still start this round
    boot_seconds: Mapping[str, float] = field(default_factory=dict)
    """Instance type -> how long a new node of it takes to come up, as seen (`rules.boots`)."""


@dataclass(frozen=True, slots=True)
class Start:
    uuid: str
    node: str
    relock: bool = False  # already Locked on that node (restart after a crash/lock)
    gpu_work: bool = False
    """It may start on a node open to GPU work only (`Ask.gpu_anywhere`: it asks for GPUs,
    or nothing without GPUs could ever fit it): the start re-checks admission for it."""


@dataclass(frozen=True, slots=True)
class Create:
    instance_type: str
    for_containers: tuple[str, ...]


@dataclass
class Plan:
    starts: list[Start] = field(default_factory=list)
    creates: list[Create] = field(default_factory=list)
    waits: dict[str, str] = field(default_factory=dict)  # uuid -> scheduling status
    wait_nodes: dict[str, str] = field(default_factory=dict)  # uuid -> node it waits for
    unlocks: dict[str, str] = field(default_factory=dict)  # uuid -> reason
    overflow: set[str] = field(default_factory=set)
    """Unlocks of Locked containers without a runner that no longer fit their node."""
    unsatisfiable: dict[str, str] = field(default_factory=dict)  # uuid -> reason
    over_capacity: dict[str, str] = field(default_factory=dict)
    """node -> what it runs beyond its capacity (from Running containers and listed runners)."""
    surplus_idle: list[str] = field(default_factory=list)
    kept_warm: list[str] = field(default_factory=list)
    chosen_types: dict[str, str] = field(default_factory=dict)  # uuid -> instance type
    wakes: dict[str, list[str]] = field(default_factory=dict)  # side node -> uuids waiting for it
    due: datetime | None = None
    """The first time at which this plan may change though nothing it read did (a wait
    budget running out, a waking node falling behind its expected boot): a due time of
    the dispatcher (`dispatch.replan`), never a poll."""
