"""Scenarios: a policy, one node's facts and state, and the events so far, replayed purely.

A scenario is what `nodewarden explain --scenario FILE` reads (format: docs/scenarios.md,
examples: examples/scenarios/). `load_scenario(data)` validates the parsed YAML/JSON
tree and raises `ScenarioError` whose message names the offending field (unknown
fields, wrong types, impossible values such as events out of order or a policy the
CRD's CEL rules would reject). `run_scenario(scenario)` evaluates or replays it with
the pure core and returns the decision, the gate evaluation, the Safety Record, the
per-event history and whether the file's `expect` block holds.

Times may be written absolutely (RFC 3339 with a zone) or relative to the scenario's
`now` as "now", "now-90s", "now+1h30m".
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from pydantic import AwareDatetime, Field, ValidationError, model_validator

from nodewarden.api.powerpolicy import PowerPolicySpec
from nodewarden.policy.actions import Action
from nodewarden.policy.base import CoreModel
from nodewarden.policy.evaluation import Evaluation
from nodewarden.policy.events import Event, RequestAccepted, RequestErrored, RequestRejected
from nodewarden.policy.facts import (
    CapabilityReading,
    DemandReading,
    DesiredReading,
    FleetReading,
    IdentityReading,
    InhibitorReading,
    ManualIntent,
    NodeFacts,
    PowerReading,
    ReadyReading,
    UptimeReading,
    VmReading,
    WorkReading,
)
from nodewarden.policy.gates import evaluate_shutdown, evaluate_wake
from nodewarden.policy.machine import Step, step
from nodewarden.policy.reasons import Decision, ReasonCode
from nodewarden.policy.record import SafetyRecord
from nodewarden.policy.record_build import record_for_evaluation
from nodewarden.policy.state import AdmissionState, NodePowerState, PowerState
from nodewarden.policy.view import PolicyView
from nodewarden.units import parse_duration

_RELATIVE = re.compile(r"^now(?:([+-])(.+))?$")


class ScenarioError(ValueError):
    """A scenario file is invalid; the message names the field."""


class ScenarioPolicy(CoreModel):
    """The PowerPolicy the scenario runs under (spec in its Kubernetes wire format)."""

    name: str = Field(default="default", min_length=1, max_length=253)
    generation: int | None = Field(default=None, ge=0)
    spec: dict[str, Any] = Field(default_factory=dict)


class FactsPatch(CoreModel):
    """Readings replaced before an event is applied (only the keys written are replaced)."""

    node_type: Literal["CloudVM", "SideNode"] | None = None
    demand: DemandReading | None = None
    work: WorkReading | None = None
    power: PowerReading | None = None
    ready: ReadyReading | None = None
    inhibitors: InhibitorReading | None = None
    capability: CapabilityReading | None = None
    uptime: UptimeReading | None = None
    identity: IdentityReading | None = None
    desired: DesiredReading | None = None
    intent: ManualIntent | None = None
    fleet: FleetReading | None = None
    vm: VmReading | None = None

    def apply(self, facts: NodeFacts) -> NodeFacts:
        update = {name: getattr(self, name) for name in self.model_fields_set}
        return facts.model_copy(update=update) if update else facts


class ScenarioEvent(CoreModel):
    """One event at one time, optionally with readings that changed just before it."""

    time: AwareDatetime
    event: Event
    facts: FactsPatch | None = None


class Expectation(CoreModel):
    """What the final step must show (checked by explain; exit code 1 if not)."""

    decision: Decision | None = None
    reasons: tuple[ReasonCode, ...] | None = Field(
        default=None, description="Codes that must all be among the final reasons."
    )
    state: PowerState | None = None
    admission: AdmissionState | None = None
    actions: tuple[str, ...] | None = Field(
        default=None, description="Action types that must be among the final step's actions."
    )
    race: bool | None = None


class Scenario(CoreModel):
    """A complete scenario file."""

    description: str = Field(default="", max_length=4096)
    now: AwareDatetime
    evaluate: Literal["auto", "shutdown", "wake"] = "auto"
    policy: ScenarioPolicy = Field(default_factory=ScenarioPolicy)
    facts: NodeFacts
    state: NodePowerState | None = None
    events: tuple[ScenarioEvent, ...] = ()
    expect: Expectation | None = None

    @model_validator(mode="after")
    def _consistent(self) -> Scenario:
        if self.state is not None and self.state.node != self.facts.node:
            raise ValueError(
                f"state.node {self.state.node!r} must equal facts.node {self.facts.node!r}"
            )
        previous: datetime | None = None
        for index, entry in enumerate(self.events):
            if previous is not None and entry.time < previous:
                raise ValueError(f"events[{index}].time is earlier than events[{index - 1}].time")
            if entry.time > self.now:
                raise ValueError(f"events[{index}].time is after now")
            previous = entry.time
        return self


@dataclass(frozen=True, slots=True)
class HistoryEntry:
    time: datetime
    event: str
    state_before: PowerState
    state_after: PowerState
    admission: AdmissionState
    decision: Decision
    reasons: tuple[ReasonCode, ...]
    actions: tuple[Action, ...]


@dataclass(frozen=True, slots=True)
class ScenarioResult:
    scenario: Scenario
    policy: PolicyView
    decision: Decision
    reasons: tuple[ReasonCode, ...]
    evaluation: Evaluation | None
    record: SafetyRecord
    state: NodePowerState
    facts: NodeFacts
    history: tuple[HistoryEntry, ...]
    expectation_failures: tuple[str, ...]


def _resolve_relative(node: Any, now: datetime, path: str) -> Any:
    """Replace 'now', 'now-90s', 'now+1h' strings with absolute RFC 3339 times."""
    if isinstance(node, dict):
        return {
            k: _resolve_relative(v, now, f"{path}.{k}" if path else str(k)) for k, v in node.items()
        }
    if isinstance(node, list):
        return [_resolve_relative(v, now, f"{path}[{i}]") for i, v in enumerate(node)]
    if isinstance(node, str):
        match = _RELATIVE.match(node.strip())
        if match:
            sign, amount = match.groups()
            if sign is None:
                return now.isoformat()
            try:
                delta = parse_duration(amount)
            except ValueError as exc:
                raise ScenarioError(f"{path}: {exc}") from None
            return (now + delta if sign == "+" else now - delta).isoformat()
    return node


def _format_errors(error: ValidationError, prefix: str = "") -> str:
    lines = []
    for item in error.errors():
        loc = ".".join(str(part) for part in item["loc"])
        loc = re.sub(r"\.(\d+)(?=\.|$)", r"[\1]", loc)
        where = f"{prefix}{loc}" if loc else (prefix.rstrip(".") or "scenario")
        lines.append(f"{where}: {item['msg']}")
    return "; ".join(lines)


def load_scenario(data: Any) -> tuple[Scenario, PolicyView]:
    """Validate a parsed scenario document; ScenarioError names the offending field."""
    if not isinstance(data, dict):
        raise ScenarioError("scenario: the document must be a mapping with now, facts, ...")
    raw_now = data.get("now")
    if raw_now is None:
        raise ScenarioError("now: required (RFC 3339 time with a zone, e.g. 2026-11-30T12:00:00Z)")
    try:
        now = _parse_now(raw_now)
    except ValueError as exc:
        raise ScenarioError(f"now: {exc}") from None
    resolved = _resolve_relative({k: v for k, v in data.items() if k != "now"}, now, "")
    resolved["now"] = now.isoformat()
    try:
        scenario = Scenario.model_validate(resolved)
    except ValidationError as exc:
        raise ScenarioError(_format_errors(exc)) from None
    try:
        spec = PowerPolicySpec.model_validate(scenario.policy.spec)
    except ValidationError as exc:
        raise ScenarioError(_format_errors(exc, "policy.spec.")) from None
    view = PolicyView.from_spec(
        spec, name=scenario.policy.name, generation=scenario.policy.generation
    )
    if view.problems:
        raise ScenarioError("; ".join(f"policy.spec.{p}" for p in view.problems))
    return scenario, view


def _parse_now(value: Any) -> datetime:
    if isinstance(value, datetime):
        parsed = value
    elif isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            raise ValueError(f"not an RFC 3339 time: {value!r}") from None
    else:
        raise ValueError(f"expected an RFC 3339 time string, got {type(value).__name__}")
    if parsed.tzinfo is None:
        raise ValueError("must carry a timezone (e.g. a trailing Z)")
    return parsed


def run_scenario(scenario: Scenario, policy: PolicyView) -> ScenarioResult:
    """Evaluate (no events) or replay (events) the scenario with the pure core."""
    state = scenario.state or NodePowerState.initial(scenario.facts.node)
    facts = scenario.facts
    history: list[HistoryEntry] = []
    if not scenario.events:
        kind = scenario.evaluate
        if kind == "auto":
            off = state.state is PowerState.OFF or (
                state.state is PowerState.UNKNOWN
                and facts.power is not None
                and facts.power.power == "Off"
            )
            kind = "wake" if off else "shutdown"
        fn = evaluate_wake if kind == "wake" else evaluate_shutdown
        evaluation: Evaluation | None = fn(facts, scenario.now, policy, state)
        assert evaluation is not None
        record = record_for_evaluation(evaluation, facts, scenario.now, policy, state)
        decision, reasons = evaluation.decision, evaluation.reasons
        final_actions: tuple[Action, ...] = ()
    else:
        last: Step | None = None
        for entry in scenario.events:
            if entry.facts is not None:
                facts = entry.facts.apply(facts)
            before = state.state
            event = _bind_current(entry.event, state)
            last = step(state, facts, event, entry.time, policy)
            history.append(
                HistoryEntry(
                    time=entry.time,
                    event=entry.event.type,
                    state_before=before,
                    state_after=last.next.state,
                    admission=last.next.admission,
                    decision=last.decision,
                    reasons=last.reasons,
                    actions=last.actions,
                )
            )
            state, facts = last.next, last.facts
        assert last is not None and last.record is not None
        evaluation, record = last.evaluation, last.record
        decision, reasons = last.decision, last.reasons
        final_actions = last.actions
    failures = _check(scenario.expect, decision, reasons, state, final_actions)
    return ScenarioResult(
        scenario=scenario,
        policy=policy,
        decision=decision,
        reasons=reasons,
        evaluation=evaluation,
        record=record,
        state=state,
        facts=facts,
        history=tuple(history),
        expectation_failures=failures,
    )


def _bind_current(event: Event, state: NodePowerState) -> Event:
    """Request outcomes may name transitionId "current": the transition in progress."""
    if (
        isinstance(event, (RequestAccepted, RequestRejected, RequestErrored))
        and event.transition_id == "current"
        and state.transition is not None
    ):
        return event.model_copy(update={"transition_id": state.transition.id})
    return event


def _check(
    expect: Expectation | None,
    decision: Decision,
    reasons: tuple[ReasonCode, ...],
    state: NodePowerState,
    actions: tuple[Action, ...],
) -> tuple[str, ...]:
    if expect is None:
        return ()
    out: list[str] = []
    if expect.decision is not None and expect.decision is not decision:
        out.append(f"expect.decision: wanted {expect.decision.value}, got {decision.value}")
    for code in expect.reasons or ():
        if code not in reasons:
            out.append(f"expect.reasons: {code.value} not among {[r.value for r in reasons]}")
    if expect.state is not None and expect.state is not state.state:
        out.append(f"expect.state: wanted {expect.state.value}, got {state.state.value}")
    if expect.admission is not None and expect.admission is not state.admission:
        out.append(
            f"expect.admission: wanted {expect.admission.value}, got {state.admission.value}"
        )
    types = [a.type for a in actions]
    for wanted in expect.actions or ():
        if wanted not in types:
            out.append(f"expect.actions: {wanted} not among {types}")
    if expect.race is not None and expect.race != state.race:
        out.append(f"expect.race: wanted {expect.race}, got {state.race}")
    return tuple(out)
