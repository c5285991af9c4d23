"""The power path's state metrics (`nodewarden.power.gauges`) are set from node runtimes.

`publish` is fed hand-made `NodeRuntime`s and every gauge is read back from the registry;
`step_timings` / `observe_step` are fed the real state machine's steps (a wake, a
shutdown), so a latency that the machine's states do not carry fails here. BMC errors
are classified into the documented classes.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from nodewarden.api.workernode import WorkerNodeSpec
from nodewarden.metrics import BMC_ERROR_CLASSES, REGISTRY
from nodewarden.policy.events import Evaluate
from nodewarden.policy.facts import NodeFacts
from nodewarden.policy.machine import Step, step
from nodewarden.policy.reasons import Decision, ReasonCode
from nodewarden.policy.state import (
    AdmissionState,
    NodePowerState,
    PowerRequest,
    PowerState,
    Transition,
    TransitionKind,
)
from nodewarden.power import gauges
from nodewarden.power.control import bmc_error_class
from nodewarden.power.runtime import NodeRuntime
from nodewarden.redfish import (
    ActionNotSupported,
    AuthFailed,
    Conflict409,
    NotFound,
    RedfishConnectionError,
    RedfishError,
    RedfishHttpError,
    RedfishProtocolError,
    RedfishTimeout,
    SystemDiscoveryError,
    TlsError,
)
from policy.policy_builders import (
    NOW,
    accepted,
    at,
    baseline_wake,
    drive_to_shutting_down,
    observed,
    off_facts,
    off_state,
    on_state,
    policy,
    ready,
    run,
)

R = ReasonCode
DEFAULT = policy()
CLOUD_VM = WorkerNodeSpec.model_validate({"nodeType": "CloudVM", "instanceType": "m5.large"})


def value(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


def series(name: str) -> list[dict[str, str]]:
    """The label sets of every sample of a metric exported now, sorted."""
    found = [s.labels for family in REGISTRY.collect() for s in family.samples if s.name == name]
    return sorted(found, key=lambda labels: sorted(labels.items()))


def runtime(state: NodePowerState, spec: WorkerNodeSpec | None = None, **extra: Any) -> NodeRuntime:
    rt = NodeRuntime(
        name=state.node,
        spec=spec,
        meta={},
        state=state,
        facts=NodeFacts(node=state.node, node_type=spec.node_type if spec else "SideNode"),
        spec_seen_at=NOW,
    )
    for key, val in extra.items():
        setattr(rt, key, val)
    return rt


def transition(kind: TransitionKind, started: float, deadline: float, **extra: Any) -> Transition:
    return Transition(
        id=f"t-{kind.value}-{started}",
        kind=kind,
        started_at=at(started),
        deadline=at(deadline),
        **extra,
    )


def waking(name: str, since: float, deadline: float) -> NodePowerState:
    request = PowerRequest(action="On", attempt=1, requested_at=at(since))
    t = transition(
        TransitionKind.WAKE, since, deadline, request=request, first_requested_at=at(since)
    )
    return off_state(node=name, state=PowerState.WAKING, state_since=at(since), transition=t, seq=6)


def blocked(name: str, *reasons: ReasonCode) -> NodePowerState:
    return off_state(
        node=name,
        state=PowerState.BLOCKED,
        blocked_reasons=reasons,
        last_decision=Decision.BLOCK,
        last_reasons=reasons,
    )


@pytest.fixture(autouse=True)
def empty_fleet() -> Iterator[None]:
    gauges.publish([], NOW)
    yield
    gauges.publish([], NOW)


# -- publish -------------------------------------------------------------------------------


def test_transitions_in_flight_export_the_longest_wait_and_the_earliest_deadline() -> None:
    shutting = on_state(
        node="vm-1",
        state=PowerState.SHUTTING_DOWN,
        admission=AdmissionState.CLOSED,
        state_since=at(-300),
        transition=transition(TransitionKind.SHUTDOWN, -400, 300, first_requested_at=at(-300)),
    )
    nodes = [
        runtime(waking("gpu-a", since=-120, deadline=480)),
        runtime(waking("gpu-b", since=-900, deadline=-30)),  # waited longest, deadline past
        runtime(waking("gpu-c", since=-600, deadline=0)),
        runtime(shutting, spec=CLOUD_VM),
        runtime(on_state(node="gpu-d")),
    ]
    for rt in nodes:
        rt.record = object()  # type: ignore[assignment]  # every transition has its record
    gauges.publish(nodes, NOW)

    assert value("nodewarden_power_transitions", kind="Wake", state="WAKING") == 3
    assert value("nodewarden_power_transitions", kind="Shutdown", state="SHUTTING_DOWN") == 1
    assert value("nodewarden_power_transitions", kind="Shutdown", state="DRAINING") == 0
    assert series("nodewarden_power_transition_state_since_seconds") == [
        {"kind": "Shutdown", "state": "SHUTTING_DOWN", "node": "vm-1"},
        {"kind": "Wake", "state": "WAKING", "node": "gpu-b"},
    ]
    since = "nodewarden_power_transition_state_since_seconds"
    assert value(since, kind="Wake", state="WAKING", node="gpu-b") == at(-900).timestamp()
    assert value(since, kind="Shutdown", state="SHUTTING_DOWN", node="vm-1") == (
        at(-300).timestamp()
    )
    deadline = "nodewarden_power_transition_deadline_seconds"
    assert value(deadline, kind="Wake", state="WAKING", node="gpu-b") == at(-30).timestamp()
    assert value(deadline, kind="Shutdown", state="SHUTTING_DOWN", node="vm-1") == (
        at(300).timestamp()
    )
    assert value("nodewarden_nodes", state="Waking", node_type="SideNode") == 3
    assert value("nodewarden_nodes", state="ShuttingDown", node_type="CloudVM") == 1
    assert value("nodewarden_nodes", state="Idle", node_type="SideNode") == 1
    assert value("nodewarden_power_unrecorded_transitions") == 0

    # gpu-b became ready: the next longest wait is gpu-c's, gpu-b's series is gone
    nodes[1].state = on_state(node="gpu-b")
    gauges.publish(nodes, NOW)
    assert series(since) == [
        {"kind": "Shutdown", "state": "SHUTTING_DOWN", "node": "vm-1"},
        {"kind": "Wake", "state": "WAKING", "node": "gpu-c"},
    ]
    assert value(deadline, kind="Wake", state="WAKING", node="gpu-c") == NOW.timestamp()

    gauges.publish([], NOW)
    assert series(since) == [] and series(deadline) == []
    assert value("nodewarden_power_transitions", kind="Wake", state="WAKING") == 0


def test_a_transition_without_its_safety_record_is_counted() -> None:
    verifying = on_state(
        node="gpu-v",
        state=PowerState.UNKNOWN,
        admission=AdmissionState.CLOSED,
        transition=transition(TransitionKind.VERIFY, -10, 300),
    )
    nodes = [runtime(waking("gpu-a", -60, 600)), runtime(verifying)]
    gauges.publish(nodes, NOW)
    assert value("nodewarden_power_unrecorded_transitions") == 1  # Verify needs no record
    nodes[0].record = object()  # type: ignore[assignment]
    gauges.publish(nodes, NOW)
    assert value("nodewarden_power_unrecorded_transitions") == 0


def test_blocked_nodes_by_state_and_first_reason() -> None:
    inhibited = on_state(
        node="gpu-i", last_decision=Decision.BLOCK, last_reasons=(R.INHIBITOR_ACTIVE,)
    )
    nodes = [
        runtime(blocked("gpu-a", R.DEADLINE_EXCEEDED, R.RETRY_BUDGET_EXHAUSTED)),
        runtime(blocked("gpu-b", R.DEADLINE_EXCEEDED, R.RETRY_BUDGET_EXHAUSTED)),
        runtime(blocked("gpu-c", R.CREDENTIALS_REFUSED)),
        runtime(inhibited),
        runtime(on_state(node="gpu-d", last_decision=Decision.DEFER)),
    ]
    gauges.publish(nodes, NOW)
    name = "nodewarden_power_blocked_nodes"
    assert value(name, state="BLOCKED", reason="DEADLINE_EXCEEDED") == 2
    assert value(name, state="BLOCKED", reason="CREDENTIALS_REFUSED") == 1
    assert value(name, state="ON_IDLE", reason="INHIBITOR_ACTIVE") == 1
    assert len(series(name)) == 3
    assert value("nodewarden_nodes", state="Blocked", node_type="SideNode") == 3

    nodes[2].state = on_state(node="gpu-c")  # an administrator fixed the credentials
    gauges.publish(nodes, NOW)
    assert value(name, state="BLOCKED", reason="CREDENTIALS_REFUSED") is None
    assert len(series(name)) == 2


def test_stale_telemetry_is_dated_from_the_first_round_that_saw_it() -> None:
    def stale(name: str) -> NodePowerState:
        return on_state(node=name, last_decision=Decision.DEFER, last_reasons=(R.TELEMETRY_STALE,))

    a = runtime(stale("gpu-a"))
    b = runtime(on_state(node="gpu-b", last_reasons=(R.TELEMETRY_MISSING,)))
    fresh = runtime(on_state(node="gpu-c", last_reasons=(R.IDLE_WINDOW_NOT_MET,)))
    gauges.publish([a, fresh], NOW)
    name = "nodewarden_power_stale_telemetry_since_seconds"
    assert value("nodewarden_power_stale_telemetry_nodes") == 1
    assert series(name) == [{"node": "gpu-a"}]
    assert value(name, node="gpu-a") == NOW.timestamp()

    later = NOW + timedelta(minutes=20)
    gauges.publish([a, b, fresh], later)  # gpu-a is still stale: its start is kept
    assert value("nodewarden_power_stale_telemetry_nodes") == 2
    assert series(name) == [{"node": "gpu-a"}]
    assert value(name, node="gpu-a") == NOW.timestamp()
    assert a.stale_since == NOW and b.stale_since == later and fresh.stale_since is None

    a.state = on_state(node="gpu-a", last_reasons=(R.IDLE_WINDOW_NOT_MET,))
    gauges.publish([a, b, fresh], later + timedelta(seconds=5))
    assert a.stale_since is None
    assert series(name) == [{"node": "gpu-b"}]
    assert value(name, node="gpu-b") == later.timestamp()


# -- latencies from the state machine's own steps -----------------------------------------


def timings(steps: list[Step], first: NodePowerState) -> list[gauges.Timing]:
    out: list[gauges.Timing] = []
    before = first
    for s in steps:
        out += gauges.step_timings(before, s.next)
        before = s.next
    return out


def test_a_wake_gives_request_to_on_and_request_to_ready() -> None:
    steps = baseline_wake(DEFAULT)  # requested at 0 s, On seen at 60 s, ready at 90 s
    assert steps[-1].next.state is PowerState.ON_IDLE
    assert timings(steps, off_state()) == [
        gauges.Timing("confirm", "Wake", 60.0),
        gauges.Timing("ready", "On", 90.0),
    ]


def test_a_wake_seen_on_and_ready_in_one_step_gives_both() -> None:
    sent = step(off_state(), off_facts(), Evaluate(), NOW, DEFAULT)
    both = sent.facts.model_copy(update={"ready": ready(True, when=at(40))})
    steps = run(sent.next, both, DEFAULT, (1, accepted(sent, 1)), (45, observed("On", 40)))
    assert steps[-1].next.state is PowerState.ON_IDLE
    assert timings(steps, sent.next) == [
        gauges.Timing("confirm", "Wake", 40.0),
        gauges.Timing("ready", "On", 45.0),
    ]


def test_a_shutdown_gives_request_to_observed_off() -> None:
    steps = drive_to_shutting_down(DEFAULT)
    sent = steps[-1]
    assert sent.next.state is PowerState.SHUTTING_DOWN  # requested at 4 s
    rest = run(sent.next, sent.facts, DEFAULT, (5, accepted(sent, 5)), (62, observed("Off", 62)))
    assert rest[-1].next.state is PowerState.OFF
    assert timings([*steps, *rest], on_state()) == [gauges.Timing("confirm", "Shutdown", 58.0)]


def test_a_wake_that_ends_blocked_gives_no_latency() -> None:
    before = waking("gpu-01", since=-600, deadline=0)
    after = blocked("gpu-01", R.DEADLINE_EXCEEDED, R.RETRY_BUDGET_EXHAUSTED)
    assert gauges.step_timings(before, after) == []
    assert gauges.step_timings(on_state(), on_state()) == []


def test_observe_step_fills_the_histograms() -> None:
    def count(name: str, **labels: str) -> float:
        return value(f"{name}_count", **labels) or 0.0

    before = waking("gpu-01", since=-120, deadline=480)
    ready_at = before.model_copy(
        update={
            "state": PowerState.ON_IDLE,
            "state_since": NOW,
            "transition": None,
            "on_since": at(-30),
        }
    )
    c0, r0 = (
        count("nodewarden_power_confirm_seconds", kind="Wake"),
        count("nodewarden_power_ready_seconds", action="On"),
    )
    s0 = value("nodewarden_power_ready_seconds_sum", action="On") or 0.0
    gauges.observe_step(before, ready_at)
    assert count("nodewarden_power_confirm_seconds", kind="Wake") == c0 + 1
    assert count("nodewarden_power_ready_seconds", action="On") == r0 + 1
    assert value("nodewarden_power_ready_seconds_sum", action="On") == s0 + 120


# -- label sets known in advance ------------------------------------------------------------


def test_counters_and_histograms_start_at_zero_for_every_known_label() -> None:
    """So that rate()/increase() count the first event and the dashboard shows 0."""
    for cls in BMC_ERROR_CLASSES:
        assert value("nodewarden_bmc_errors_total", **{"class": cls}) is not None
    for kind in ("Shutdown", "Wake"):
        assert value("nodewarden_power_confirm_seconds_count", kind=kind) is not None
    for action in ("On", "WakeOnLan"):
        assert value("nodewarden_power_ready_seconds_count", action=action) is not None
    for resend in ("false", "true"):
        labels = {"action": "GracefulShutdown", "result": "accepted", "resend": resend}
        assert value("nodewarden_power_requests_total", **labels) is not None


@pytest.mark.parametrize(
    ("error", "cls"),
    [
        (AuthFailed("bmc", "401", 401), "auth"),
        (TlsError("bmc", "unknown CA", "unknown_ca"), "tls"),
        (RedfishTimeout("bmc", "slow", 10.0), "timeout"),
        (RedfishConnectionError("bmc", "refused"), "connection"),
        (RedfishProtocolError("bmc", "no JSON object"), "protocol"),
        (Conflict409("bmc", "busy", 409), "rejected"),
        (ActionNotSupported("bmc", "no", 400, "ForceOff"), "rejected"),
        (RedfishHttpError("bmc", "500", 500), "http"),
        (NotFound("bmc", "404", 404), "http"),
        (SystemDiscoveryError("bmc", "2 systems", ("a", "b")), "discovery"),
        (RedfishError("bmc", "?"), "other"),
    ],
)
def test_bmc_errors_are_classified(error: RedfishError, cls: str) -> None:
    assert bmc_error_class(error) == cls and cls in BMC_ERROR_CLASSES
