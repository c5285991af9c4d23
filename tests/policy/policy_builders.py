"""Builders of facts, states and policies for the pure-core tests (no I/O, fixed clock)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from nodewarden.api.powerpolicy import PowerPolicySpec
from nodewarden.policy.events import (
    AdmissionClosed,
    DemandReread,
    Evaluate,
    PowerObserved,
    ReadyProbeResult,
    RequestAccepted,
)
from nodewarden.policy.facts import (
    CapabilityReading,
    DemandReading,
    DesiredReading,
    FleetReading,
    IdentityReading,
    Inhibitor,
    InhibitorReading,
    ManualIntent,
    NodeFacts,
    OverrideRequest,
    PowerReading,
    ReadyReading,
    UptimeReading,
    WorkReading,
)
from nodewarden.policy.machine import Step, step
from nodewarden.policy.state import AdmissionState, NodePowerState, PowerState
from nodewarden.policy.view import PolicyView

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
NODE = "gpu-01"


def at(seconds: float) -> datetime:
    """NOW + seconds (negative = in the past)."""
    return NOW + timedelta(seconds=seconds)


def policy(**spec: Any) -> PolicyView:
    return PolicyView.from_spec(
        PowerPolicySpec.model_validate(spec), name="test-policy", generation=1
    )


def demand(queued: int = 0, when: datetime | None = None) -> DemandReading:
    return DemandReading(source="queue", observed_at=when or at(-10), queued=queued)


def work(active: int = 0, idle_for: float = 3600, when: datetime | None = None) -> WorkReading:
    seen = when or at(-10)
    return WorkReading(
        source="ssh-runners",
        observed_at=seen,
        active_jobs=active,
        idle_since=None if active else seen - timedelta(seconds=idle_for),
    )


def power(value: str = "On", when: datetime | None = None) -> PowerReading:
    return PowerReading(source="redfish", observed_at=when or at(-5), power=value)


def ready(passed: bool = True, when: datetime | None = None) -> ReadyReading:
    return ReadyReading(source="ssh-ready", observed_at=when or at(-10), passed=passed)


def inhibitors(*locks: Inhibitor, when: datetime | None = None) -> InhibitorReading:
    return InhibitorReading(source="logind", observed_at=when or at(-10), inhibitors=locks)


def block_lock(what: str = "shutdown", mode: str = "block") -> Inhibitor:
    return Inhibitor(what=what, who="backup", why="nightly backup", mode=mode)


def capability(
    method: str = "Redfish",
    allowable: tuple[str, ...] | None = ("On", "GracefulShutdown", "ForceOff"),
) -> CapabilityReading:
    return CapabilityReading(
        source="redfish-discovery",
        observed_at=at(-3600),
        control_method=method,
        allowable=allowable,
    )


def uptime(up_for: float = 3 * 3600, when: datetime | None = None) -> UptimeReading:
    seen = when or at(-10)
    return UptimeReading(
        source="ssh-uptime", observed_at=seen, on_since=seen - timedelta(seconds=up_for)
    )


UUID = "4c4c4544-0042-4810-8052-b4c04f4d3332"


def identity(
    host: str | None = UUID,
    bmc: str | None = UUID,
    when: datetime | None = None,
    problem: str | None = None,
    matched_at: datetime | None = None,
) -> IdentityReading:
    """The BMC's system UUID and the host's DMI product UUID (equal by default)."""
    seen = when or at(-10)
    return IdentityReading(
        source="ssh-product-uuid",
        observed_at=seen,
        bmc_uuid=bmc,
        bmc_source="redfish-system",
        bmc_observed_at=seen,
        host_uuid=host,
        host_problem=problem,
        host_source="ssh-product-uuid",
        host_observed_at=seen,
        matched_at=matched_at,
        matched_uuid=bmc if matched_at is not None else None,
    )


def fleet(in_progress: int = 0, warm: int = 5) -> FleetReading:
    return FleetReading(
        source="index",
        observed_at=at(-1),
        transitions_in_progress=in_progress,
        warm_idle_nodes=warm,
    )


def desired(power_setting: str = "Auto", behavior: str = "run") -> DesiredReading:
    return DesiredReading(
        source="WorkerNode spec",
        observed_at=at(-10),
        power=power_setting,
        idle_behavior=behavior,
    )


def intent(
    action: str = "Shutdown",
    *,
    override_inhibitors: bool = False,
    force_off: bool = False,
    requested_by: str = "alice",
    verified: bool = True,
) -> ManualIntent:
    override = None
    if override_inhibitors or force_off:
        override = OverrideRequest(
            inhibitors=override_inhibitors,
            force_off=force_off,
            justification="maintenance window INC-1234",
        )
    return ManualIntent(
        source="PowerIntent/manual-1",
        observed_at=at(-60),
        name="manual-1",
        action=action,
        requested_by=requested_by,
        requester_verified=verified,
        override=override,
    )


def idle_facts(**overrides: Any) -> NodeFacts:
    """A healthy, idle, switched-on Redfish node: every shutdown gate but drain passes."""
    values: dict[str, Any] = {
        "node": NODE,
        "demand": demand(),
        "work": work(),
        "power": power(),
        "ready": ready(),
        "inhibitors": inhibitors(),
        "capability": capability(),
        "uptime": uptime(),
        "identity": identity(),
        "desired": desired(),
    }
    values.update(overrides)
    return NodeFacts(**values)


def refreshed(facts: NodeFacts, when: datetime) -> NodeFacts:
    """`facts` with the four decisive readings (demand, work, power, inhibitors) re-read at `when`."""
    return facts.model_copy(
        update={
            "demand": demand(when=when),
            "work": work(when=when),
            "power": power(when=when),
            "inhibitors": inhibitors(when=when),
            "identity": identity(when=when),
        }
    )


def off_facts(**overrides: Any) -> NodeFacts:
    """A switched-off Redfish node with queued demand for it."""
    values: dict[str, Any] = {
        "node": NODE,
        "demand": demand(2),
        "power": power("Off"),
        "capability": capability(),
        "desired": desired(),
    }
    values.update(overrides)
    return NodeFacts(**values)


def on_state(**overrides: Any) -> NodePowerState:
    values: dict[str, Any] = {
        "node": NODE,
        "state": PowerState.ON_IDLE,
        "admission": AdmissionState.OPEN,
        "admission_since": at(-3 * 3600),
        "on_since": at(-3 * 3600),
        "last_transition_at": at(-3 * 3600),
        "seq": 5,
    }
    values.update(overrides)
    return NodePowerState(**values)


def off_state(**overrides: Any) -> NodePowerState:
    values: dict[str, Any] = {
        "node": NODE,
        "state": PowerState.OFF,
        "admission": AdmissionState.CLOSED,
        "off_since": at(-3600),
        "last_transition_at": at(-3600),
        "seq": 5,
    }
    values.update(overrides)
    return NodePowerState(**values)


def run(
    state: NodePowerState, facts: NodeFacts, pol: PolicyView, *events: tuple[float, Any]
) -> list[Step]:
    """Feed (seconds-from-NOW, event) pairs in order; returns every step."""
    steps: list[Step] = []
    for seconds, event in events:
        result = step(state, facts, event, at(seconds), pol)
        steps.append(result)
        state, facts = result.next, result.facts
    return steps


def drive_to_shutting_down(pol: PolicyView, **fact_overrides: Any) -> list[Step]:
    """ON_IDLE -> DRAINING -> (admission closed, demand re-read) -> SHUTTING_DOWN."""
    facts = idle_facts(**fact_overrides)
    first = step(on_state(), facts, Evaluate(), NOW, pol)
    second = step(first.next, first.facts, AdmissionClosed(at=at(2)), at(2), pol)
    locks = second.facts.inhibitors.inhibitors if second.facts.inhibitors is not None else ()
    refreshed = second.facts.model_copy(
        update={
            "work": work(when=at(3)),
            "inhibitors": inhibitors(*locks, when=at(3)),
            "power": power(when=at(3)),
        }
    )
    third = step(second.next, refreshed, DemandReread(reading=demand(when=at(4))), at(4), pol)
    return [first, second, third]


def accepted(result: Step, seconds: float) -> RequestAccepted:
    """A RequestAccepted answering the request `result` issued."""
    t = result.next.transition
    assert t is not None and t.request is not None
    return RequestAccepted(
        transition_id=t.id,
        attempt=t.request.attempt,
        action=t.request.action,
        at=at(seconds),
        source="redfish",
        detail="HTTP 204",
    )


def observed(value: str, seconds: float) -> PowerObserved:
    return PowerObserved(reading=power(value, when=at(seconds)))


def probed(passed: bool, seconds: float) -> ReadyProbeResult:
    return ReadyProbeResult(reading=ready(passed, when=at(seconds)))


def baseline_wake(pol: PolicyView, ready_passes: bool = True) -> list[Step]:
    """OFF with queued demand: wake requested (0 s), accepted (1 s), observed On (60 s),
    ready probe passed (or failed) (90 s). Every step, the request first."""
    sent = step(off_state(), off_facts(), Evaluate(), NOW, pol)
    rest = run(
        sent.next,
        sent.facts,
        pol,
        (1, accepted(sent, 1)),
        (60, observed("On", 60)),
        (90, probed(ready_passes, 90)),
    )
    return [sent, *rest]
