"""What a gate evaluation is made of: gate names, verdicts, evidence, gate results, timing
measures, the `Evaluation`, and `GateInputs` (one evaluation in progress, which every
gate of `gates.SHUTDOWN_GATES` / `gates.WAKE_GATES` reads and adds to).

The vocabulary below every gate module (`gateblocks`, `overrides`, `timing`,
`precedence`), the cloud-VM rules (`cloudvm`) and the gate tables (`gates`); it
imports no gate.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Literal

from nodewarden.api.powerpolicy import ResetAction
from nodewarden.policy.facts import FactName, ManualIntent, NodeFacts, Reading
from nodewarden.policy.reasons import Decision, ReasonCode
from nodewarden.policy.state import AdmissionState, NodePowerState
from nodewarden.policy.view import PolicyView

EvidenceValue = str | int | float | bool | None


class GateName(StrEnum):
    POLICY = "policy"
    DESIRED = "desired"
    DEMAND = "demand"
    WORK = "work"
    TELEMETRY = "telemetry"
    POWER = "power"
    TIMING = "timing"
    INHIBITORS = "inhibitors"
    CAPABILITY = "capability"
    IDENTITY = "identity"
    """Redfish power-off: the BMC manages the host whose facts were read (UUIDs match)."""
    FLEET = "fleet"
    NODE_MANAGER = "nodeManager"
    """Cloud VMs: which node-manager rule fired (nodewarden.policy.cloudvm)."""


class Verdict(StrEnum):
    PASS = "PASS"
    FAIL = "FAIL"
    WAIVED = "WAIVED"
    """Failed on the facts but passed by an audited, policy-permitted override."""
    SKIPPED = "SKIPPED"
    """Not evaluated (not applicable, or the optional input was not supplied)."""


@dataclass(slots=True)
class Evidence:
    """One piece of evidence in a gate: what, its value, who supplied it and when.

    Gate results are plain (non-frozen) slotted dataclasses because frozen dataclass
    construction costs 4x more and a fleet evaluation builds ~25 per node; they are
    created fresh for every evaluation (except the few that depend on no input or only
    on the policy, which are built once and shared) and must be treated as read-only.
    """

    name: str
    value: EvidenceValue
    source: str
    at: datetime | None = None


@dataclass(slots=True)
class GateResult:
    gate: GateName
    verdict: Verdict
    reasons: tuple[ReasonCode, ...]
    evidence: tuple[Evidence, ...]
    recheck: datetime | None = None

    @property
    def passed(self) -> bool:
        return self.verdict is not Verdict.FAIL


@dataclass(slots=True)
class TimingMeasure:
    """A timing rule: the policy value, what was measured, since when, and the verdict."""

    name: Literal["idleThreshold", "minOn", "minOff", "cooldown", "billingWindow"]
    required: float
    measured: float | None = None
    since: datetime | None = None
    met: bool | None = None
    waived: bool = False


@dataclass(slots=True)
class Evaluation:
    """Outcome of one gate evaluation (no state transition). Read-only by convention
    (not frozen: construction cost matters when a fleet is evaluated)."""

    kind: Literal["shutdown", "wake"]
    decision: Decision
    reasons: tuple[ReasonCode, ...]
    gates: tuple[GateResult, ...]
    action: ResetAction | None
    recheck_at: datetime | None
    overrides_applied: tuple[str, ...]
    timing: tuple[TimingMeasure, ...]
    stale: tuple[FactName, ...]
    missing: tuple[FactName, ...]
    oldest_observed_at: datetime | None
    refresh: tuple[FactName, ...]
    forced: bool

    @property
    def passed(self) -> bool:
        """Every gate passed (possibly through a recorded override)."""
        return all(g.passed for g in self.gates)

    def gate(self, name: GateName) -> GateResult | None:
        for g in self.gates:
            if g.gate is name:
                return g
        return None


def new_evaluation(
    *,
    kind: Literal["shutdown", "wake"],
    decision: Decision,
    reasons: tuple[ReasonCode, ...],
    gates: tuple[GateResult, ...],
    action: ResetAction | None,
    recheck_at: datetime | None,
    overrides_applied: tuple[str, ...],
    timing: tuple[TimingMeasure, ...],
    stale: tuple[FactName, ...],
    missing: tuple[FactName, ...],
    oldest_observed_at: datetime | None,
    refresh: tuple[FactName, ...],
    forced: bool,
) -> Evaluation:
    """`Evaluation(...)`, named at the call sites and positional here: keyword arguments
    to a class are packed into a dict for `__init__`, which doubles the cost."""
    return Evaluation(
        kind,
        decision,
        reasons,
        gates,
        action,
        recheck_at,
        overrides_applied,
        timing,
        stale,
        missing,
        oldest_observed_at,
        refresh,
        forced,
    )


_FAIL, _PASS, _WAIVED = Verdict.FAIL, Verdict.PASS, Verdict.WAIVED


def evidence_of(name: str, value: EvidenceValue, reading: Reading | None) -> Evidence:
    """Evidence `name` = `value`, with the reading's source and time (none: "-")."""
    if reading is None:
        return Evidence(name, value, "-", None)
    return Evidence(name, value, reading.source, reading.observed_at)


def gate_result(
    gate: GateName,
    reasons: list[ReasonCode],
    evidence: tuple[Evidence, ...],
    recheck_at: datetime | None = None,
    waived: bool = False,
) -> GateResult:
    """FAIL with `reasons` (and when to look again), or PASS without any (WAIVED when an
    audited override passed the failing reasons)."""
    if reasons and not waived:
        return GateResult(gate, _FAIL, tuple(reasons), evidence, recheck_at)
    return GateResult(gate, _WAIVED if waived else _PASS, tuple(reasons), evidence, None)


@dataclass(slots=True)
class GateInputs:
    """One evaluation in progress: its inputs (facts, clock, policy, state and what is
    derived from the state once: admission and since when, whether a transition of this
    kind is already in progress, the drain floor) and what the gates found so far.

    The gates of a table run in order on one `GateInputs`; a gate may read what an
    earlier gate set (`forced` is set by the desired gate) and adds to `refresh`,
    `applied`, `action`, `timing` and the telemetry fields. Local to one evaluation;
    built positionally (keyword arguments to a class cost twice as much).
    """

    shutdown: bool
    """The direction evaluated: a shutdown (True) or a wake (False)."""
    facts: NodeFacts
    now: datetime
    policy: PolicyView
    state: NodePowerState | None
    intent: ManualIntent | None
    admission: AdmissionState
    admission_since: datetime | None
    own_transition: bool
    """A transition of the evaluated kind is in progress (draining / waking)."""
    floor: datetime | None
    """Demand and work must have been read after this (admission closed, drain began)."""
    forced: bool = False
    refresh: list[FactName] = field(default_factory=list)
    applied: tuple[str, ...] = ()
    action: ResetAction | None = None
    timing: tuple[TimingMeasure, ...] = ()
    stale: tuple[FactName, ...] = ()
    missing: tuple[FactName, ...] = ()
    oldest: datetime | None = None
    warm: ReasonCode | None = None
    """A wake justified by warm capacity, not queued demand (WARM_WINDOW, FORECAST_DEMAND)."""
