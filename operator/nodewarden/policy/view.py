"""PolicyView: the PowerPolicy knobs the power core reads, parsed once, plus the policy version.

`PolicyView.from_spec(spec, name=..., generation=...)` turns a
`nodewarden.api.powerpolicy.PowerPolicySpec` into plain `timedelta`s and sets, so the
hot path never parses a duration, and records the version every decision cites
(`PolicyVersion`: name, generation, content hash from `spec_hash`). Inconsistencies
the CRD's CEL rules would reject (and a few the schema cannot express) are collected in
`problems`; a view with problems makes every gate evaluation fail with POLICY_INVALID
instead of raising, so a bad policy BLOCKs transitions rather than crashing the operator.

Values derived from the knobs that every evaluation needs (`seconds`, the timing knobs
as float seconds for the Safety Record; `allowed_sorted`) are computed once when the view
is built, and
`memo` holds the gate module's per-policy constants (e.g. the policy gate result). Both
are rebuilt, never copied, when a view is derived with `dataclasses.replace`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel

from nodewarden.api.powerpolicy import PowerPolicySpec, spec_hash
from nodewarden.units import parse_duration


class PolicyVersion(BaseModel):
    """Which policy a decision used: name, metadata.generation and content hash."""

    model_config = ConfigDict(
        frozen=True, extra="forbid", alias_generator=to_camel, populate_by_name=True
    )

    name: str
    generation: int | None = None
    content_hash: str

    def label(self) -> str:
        """Compact form for summaries: 'name@generation/hash'."""
        gen = "?" if self.generation is None else str(self.generation)
        return f"{self.name}@{gen}/{self.content_hash}"


@dataclass(frozen=True, slots=True)
class PolicySeconds:
    """The timing knobs as float seconds (what the Safety Record's timing measures carry)."""

    idle_threshold: float
    min_on: float
    min_off: float
    cooldown: float
    telemetry_max_age: float
    billing_period: float


@dataclass(frozen=True, slots=True)
class PolicyView:
    """Parsed policy knobs (see PowerPolicySpec for the meaning of each)."""

    version: PolicyVersion
    idle_threshold: timedelta
    boot_grace: timedelta
    min_on: timedelta
    max_on: timedelta
    min_off: timedelta
    cooldown: timedelta
    telemetry_max_age: timedelta
    heartbeat_stale_after: timedelta
    billing_period: timedelta
    billing_window_start: timedelta
    billing_window_end: timedelta
    deadline_shutdown: timedelta
    deadline_wake: timedelta
    deadline_ready: timedelta
    deadline_drain: timedelta
    retry_budget: int
    initial_backoff: timedelta
    max_backoff: timedelta
    backoff_multiplier: float
    backoff_jitter: float
    allowed_actions: frozenset[str]
    override_permitted: bool
    override_requesters: frozenset[str]
    permit_force_off: bool
    max_concurrent_transitions: int
    min_warm_nodes: int
    paused: bool
    lame_after: timedelta = timedelta(minutes=10)
    lame_min_probes: int = 3
    shadow: bool = False
    gpu_only: bool = True
    """spec.placement.gpuIdle GpuOnly: a GPU node with idle GPUs takes only GPU work."""
    problems: tuple[str, ...] = field(default=())
    seconds: PolicySeconds = field(init=False, compare=False, hash=False, repr=False)
    """The timing knobs in seconds, computed from the fields above when the view is built."""
    allowed_sorted: tuple[str, ...] = field(init=False, compare=False, hash=False, repr=False)
    """`allowed_actions` sorted (what every Safety Record lists), computed with `seconds`."""
    memo: dict[str, Any] = field(
        default_factory=dict, init=False, compare=False, hash=False, repr=False
    )
    """Per-policy cache of values derived from the view (e.g. the policy gate result);
    starts empty in every view, including one made by `dataclasses.replace`."""

    def __post_init__(self) -> None:
        seconds = PolicySeconds(
            idle_threshold=self.idle_threshold.total_seconds(),
            min_on=self.min_on.total_seconds(),
            min_off=self.min_off.total_seconds(),
            cooldown=self.cooldown.total_seconds(),
            telemetry_max_age=self.telemetry_max_age.total_seconds(),
            billing_period=self.billing_period.total_seconds(),
        )
        object.__setattr__(self, "seconds", seconds)  # frozen: set once, here
        object.__setattr__(self, "allowed_sorted", tuple(sorted(self.allowed_actions)))

    @property
    def valid(self) -> bool:
        return not self.problems

    @classmethod
    def from_spec(
        cls, spec: PowerPolicySpec, *, name: str = "default", generation: int | None = None
    ) -> PolicyView:
        """Build the view of `spec`; never raises for semantic problems (see `problems`)."""
        d = parse_duration
        view = cls(
            version=PolicyVersion(name=name, generation=generation, content_hash=spec_hash(spec)),
            idle_threshold=d(spec.idle_threshold),
            boot_grace=d(spec.boot_grace),
            min_on=d(spec.min_on),
            max_on=d(spec.max_on),
            min_off=d(spec.min_off),
            cooldown=d(spec.cooldown),
            telemetry_max_age=d(spec.telemetry_max_age),
            heartbeat_stale_after=d(spec.heartbeat_stale_after),
            billing_period=d(spec.billing.period),
            billing_window_start=d(spec.billing.window_start),
            billing_window_end=d(spec.billing.window_end),
            deadline_shutdown=d(spec.deadlines.shutdown),
            deadline_wake=d(spec.deadlines.wake),
            deadline_ready=d(spec.deadlines.ready),
            deadline_drain=d(spec.deadlines.drain),
            retry_budget=spec.retry.budget,
            initial_backoff=d(spec.retry.initial_backoff),
            max_backoff=d(spec.retry.max_backoff),
            backoff_multiplier=spec.retry.multiplier,
            backoff_jitter=spec.retry.jitter,
            allowed_actions=frozenset(spec.allowed_actions),
            override_permitted=spec.inhibitor_override.permitted,
            override_requesters=frozenset(spec.inhibitor_override.allowed_requesters),
            permit_force_off=spec.inhibitor_override.permit_force_off,
            max_concurrent_transitions=spec.disruption_budget.max_concurrent_transitions,
            min_warm_nodes=spec.min_warm_nodes,
            paused=spec.paused,
            lame_after=d(spec.dispatch.lame_after),
            lame_min_probes=spec.dispatch.lame_min_probes,
            shadow=spec.mode == "Shadow",
            gpu_only=spec.placement.gpu_idle == "GpuOnly",
        )
        problems = _problems(view, spec)
        if problems:
            view = _with_problems(view, problems)
        return view


def _with_problems(view: PolicyView, problems: tuple[str, ...]) -> PolicyView:
    return replace(view, problems=problems)


def _problems(view: PolicyView, spec: PowerPolicySpec) -> tuple[str, ...]:
    """Every inconsistency, each naming the field (wire name) it concerns."""
    out: list[str] = []
    zero = timedelta(0)
    if view.billing_window_start >= view.billing_window_end:
        out.append("billing.windowStart must be before billing.windowEnd")
    if view.billing_period != zero and view.billing_window_end > view.billing_period:
        out.append("billing.windowEnd must not be after billing.period")
    if view.min_on > view.max_on:
        out.append("minOn must not exceed maxOn")
    if view.initial_backoff > view.max_backoff:
        out.append("retry.initialBackoff must not exceed retry.maxBackoff")
    if spec.max_nodes is not None and spec.min_warm_nodes > spec.max_nodes:
        out.append("minWarmNodes must not exceed maxNodes")
    if view.telemetry_max_age <= zero:
        out.append("telemetryMaxAge must be greater than 0s (no evidence could ever be fresh)")
    for name, value in (
        ("deadlines.shutdown", view.deadline_shutdown),
        ("deadlines.wake", view.deadline_wake),
        ("deadlines.ready", view.deadline_ready),
        ("deadlines.drain", view.deadline_drain),
    ):
        if value <= zero:
            out.append(f"{name} must be greater than 0s (every transition needs a deadline)")
    return tuple(out)
