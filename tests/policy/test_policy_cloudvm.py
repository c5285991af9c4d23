"""Cloud VMs: the node-manager rules in order, and their path through the state machine.

One named test per rule (deleted, down, lame, unpaired past boot grace, broken, pinned
off, drain, idle in an open billing window) and per reason a rule does not fire; then
the machine: a forced rule shuts a VM down from UNKNOWN without draining, an idle VM
drains first, a VM reaches OFF only when the cloud list no longer shows it.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from policy_builders import (
    NOW,
    at,
    capability,
    demand,
    desired,
    fleet,
    policy,
    power,
    ready,
    uptime,
)

from nodewarden.policy import (
    AdmissionClosed,
    Decision,
    DemandReread,
    Evaluate,
    GateName,
    NodeFacts,
    NodePowerState,
    PowerObserved,
    PowerState,
    ReasonCode,
    RequestAccepted,
    RequestPower,
    evaluate_shutdown,
    step,
)
from nodewarden.policy.cloudvm import RULES, fire
from nodewarden.policy.evaluation import Verdict
from nodewarden.policy.facts import VmReading, WorkReading
from nodewarden.policy.state import AdmissionState

R = ReasonCode
POLICY = policy(
    idleThreshold="5m",
    bootGrace="10m",
    heartbeatStaleAfter="5m",
    billing={"period": "1h", "windowStart": "50m", "windowEnd": "1h"},
    dispatch={"lameAfter": "8m", "lameMinProbes": 3},
)
VM = "vm-m5-large-0042"


def vm(**over: Any) -> VmReading:
    values: dict[str, Any] = {
        "source": "cloud:ec2 + ssh probes",
        "observed_at": at(-5),
        "booted_at": at(-(55 * 60)),  # 55 minutes into its billing hour: window open
        "paired": True,
        "last_heartbeat": at(-5),
        "probe_attempts": 0,
    }
    values.update(over)
    return VmReading(**values)


def idle_work(idle_for: float = 600, when: datetime | None = None) -> WorkReading:
    seen = when or at(-5)
    return WorkReading(
        source="ssh:runners+queue",
        observed_at=seen,
        active_jobs=0,
        idle_since=seen - timedelta(seconds=idle_for),
    )


def busy_work() -> WorkReading:
    return WorkReading(source="ssh:runners+queue", observed_at=at(-5), active_jobs=1)


def vm_facts(**over: Any) -> NodeFacts:
    values: dict[str, Any] = {
        "node": VM,
        "node_type": "CloudVM",
        "demand": demand(0, when=at(-5)),
        "work": idle_work(),
        "power": power(when=at(-5)),
        "ready": ready(when=at(-5)),
        "capability": capability("Cloud", ("GracefulShutdown",)),
        "uptime": uptime(up_for=55 * 60, when=at(-5)),
        "desired": desired(),
        "vm": vm(),
    }
    values.update(over)
    return NodeFacts(**values)


def vm_on_state() -> NodePowerState:
    return NodePowerState(
        node=VM,
        state=PowerState.ON_IDLE,
        admission=AdmissionState.OPEN,
        admission_since=at(-3600),
        on_since=at(-55 * 60),
        seq=4,
    )


def rule_codes(facts: NodeFacts) -> tuple[str | None, R | None]:
    fired = fire(facts, NOW, POLICY)
    return fired.rule, fired.code


def test_the_rules_are_tried_in_the_documented_order() -> None:
    assert [name for name, _ in RULES] == [
        "deleted",
        "down",
        "lame",
        "unpaired",
        "broken",
        "pinnedOff",
        "drain",
        "idle",
    ]


def test_deleted_wins_over_everything() -> None:
    facts = vm_facts(vm=vm(deletion_requested=True, broken=True), work=busy_work())
    assert rule_codes(facts) == ("deleted", R.NODE_DELETED)


def test_down_stale_heartbeat_is_forced() -> None:
    facts = vm_facts(vm=vm(last_heartbeat=at(-6 * 60)), work=busy_work())
    assert rule_codes(facts) == ("down", R.WORKER_DOWN)
    ev = evaluate_shutdown(facts, NOW, POLICY)
    assert ev.decision is Decision.SHUTDOWN and ev.forced
    assert ev.reasons == (R.GATES_PASSED, R.WORKER_DOWN)
    assert ev.gate(GateName.WORK).verdict is Verdict.SKIPPED  # type: ignore[union-attr]
    assert ev.gate(GateName.NODE_MANAGER).verdict is Verdict.PASS  # type: ignore[union-attr]


def test_lame_never_paired_after_enough_attempts() -> None:
    facts = vm_facts(
        vm=vm(paired=False, last_heartbeat=None, probe_attempts=3, booted_at=at(-9 * 60))
    )
    assert rule_codes(facts) == ("lame", R.LAME_NODE)
    too_few = vm_facts(
        vm=vm(paired=False, last_heartbeat=None, probe_attempts=2, booted_at=at(-9 * 60))
    )
    assert rule_codes(too_few) == (None, None)


def test_unpaired_past_boot_grace_is_forced_and_before_it_waits() -> None:
    late = vm_facts(vm=vm(paired=False, last_heartbeat=None, booted_at=at(-11 * 60)))
    assert rule_codes(late) == ("unpaired", R.BOOT_GRACE_EXCEEDED)
    early = vm_facts(vm=vm(paired=False, last_heartbeat=None, booted_at=at(-2 * 60)))
    ev = evaluate_shutdown(early, NOW, POLICY)
    assert ev.decision is Decision.DEFER and R.READY_PROBE_PENDING in ev.reasons
    assert ev.recheck_at == at(-2 * 60) + timedelta(minutes=10)


def test_a_vm_found_running_gets_its_boot_grace_and_lame_after_from_when_it_was_found() -> None:
    """A new process (a restart, a takeover) has no probe history of the VMs it finds: a
    VM launched long ago and not yet paired here is not destroyed for BOOT_GRACE_EXCEEDED
    or LAME_NODE until the grace has passed since it was found (chaos seed 835854: a
    new leader destroyed two VMs running work 0.5 s after taking over)."""
    found = vm(paired=False, last_heartbeat=None, booted_at=at(-2 * 3600), found_at=at(-30))
    assert rule_codes(vm_facts(vm=found)) == (None, None)
    ev = evaluate_shutdown(vm_facts(vm=found), NOW, POLICY)
    assert ev.decision is Decision.DEFER and R.READY_PROBE_PENDING in ev.reasons
    assert ev.recheck_at == at(-30) + timedelta(minutes=10)
    lame = found.model_copy(update={"probe_attempts": 5})
    assert rule_codes(vm_facts(vm=lame)) == (None, None)
    # the same grace, once over, fires as for a VM launched here
    long_found = found.model_copy(update={"found_at": at(-11 * 60)})
    assert rule_codes(vm_facts(vm=long_found)) == ("unpaired", R.BOOT_GRACE_EXCEEDED)
    # found before its launch (clock skew): the launch counts
    assert found.model_copy(update={"found_at": at(-3 * 3600)}).grace_from == at(-2 * 3600)
    # billing windows still count from the launch
    assert found.booted_at == at(-2 * 3600)


def test_broken_pinned_off_and_drain_drain_even_when_busy() -> None:
    for facts, code in (
        (vm_facts(vm=vm(broken=True), work=busy_work()), R.NODE_BROKEN),
        (vm_facts(desired=desired("Off"), work=busy_work()), R.POWER_PINNED_OFF),
        (vm_facts(desired=desired("Auto", "drain"), work=busy_work()), R.IDLE_BEHAVIOR_DRAIN),
    ):
        ev = evaluate_shutdown(facts, NOW, POLICY, vm_on_state())
        assert ev.decision is Decision.DRAIN and code in ev.reasons, (code, ev.reasons)
        assert R.ADMISSION_OPEN in ev.reasons


def test_idle_in_an_open_window_drains_outside_it_defers_to_the_window() -> None:
    ev = evaluate_shutdown(vm_facts(), NOW, POLICY, vm_on_state())
    assert ev.decision is Decision.DRAIN and R.IDLE_EXCEEDED in ev.reasons
    closed = vm_facts(vm=vm(booted_at=at(-(80 * 60))))  # 20 minutes into its second hour
    ev = evaluate_shutdown(closed, NOW, POLICY)
    assert ev.decision is Decision.DEFER and ev.reasons[0] is R.BILLING_WINDOW_CLOSED
    assert ev.recheck_at == at(-(80 * 60)) + timedelta(minutes=110)


def test_idle_wait_busy_and_hold_do_not_fire() -> None:
    ev = evaluate_shutdown(vm_facts(work=idle_work(idle_for=60)), NOW, POLICY)
    assert ev.decision is Decision.DEFER and ev.reasons[0] is R.IDLE_WINDOW_NOT_MET
    ev = evaluate_shutdown(vm_facts(work=busy_work()), NOW, POLICY)
    assert ev.decision is Decision.NONE and ev.reasons[0] is R.ACTIVE_WORK
    held = vm_facts(desired=desired("Auto", "hold"), vm=vm(last_heartbeat=at(-600)))
    ev = evaluate_shutdown(held, NOW, POLICY)
    assert ev.decision is Decision.NONE and R.IDLE_BEHAVIOR_HOLD in ev.reasons


def test_an_idle_vm_is_kept_for_queued_demand_and_min_warm() -> None:
    ev = evaluate_shutdown(vm_facts(demand=demand(2, when=at(-5))), NOW, POLICY)
    assert ev.decision is Decision.NONE and R.DEMAND_PRESENT in ev.reasons
    warm = policy(
        idleThreshold="5m", billing={"period": "0s", "windowStart": "0s", "windowEnd": "1s"},
        minWarmNodes=2,
    )  # fmt: skip
    ev = evaluate_shutdown(vm_facts(fleet=fleet(warm=1)), NOW, warm)
    assert ev.decision is Decision.NONE and R.MIN_WARM_NODES in ev.reasons


def test_stale_cloud_evidence_defers_even_a_forced_rule() -> None:
    facts = vm_facts(vm=vm(last_heartbeat=at(-600), observed_at=at(-600)))
    ev = evaluate_shutdown(facts, NOW, POLICY)
    assert ev.decision is Decision.DEFER and R.TELEMETRY_STALE in ev.reasons
    assert "vm" in ev.refresh


def test_a_paused_policy_stops_even_a_forced_rule() -> None:
    paused = policy(paused=True, heartbeatStaleAfter="5m")
    facts = vm_facts(vm=vm(last_heartbeat=at(-600)))
    ev = evaluate_shutdown(facts, NOW, paused)
    assert ev.decision is Decision.NONE and R.POLICY_PAUSED in ev.reasons


# -- through the state machine ---------------------------------------------------------


def test_a_forced_rule_destroys_from_unknown_without_draining_and_off_needs_the_list() -> None:
    state = NodePowerState.initial(VM)
    facts = vm_facts(vm=vm(paired=False, last_heartbeat=None, booted_at=at(-11 * 60)))
    first = step(state, facts, Evaluate(), NOW, POLICY)
    assert first.next.state is PowerState.SHUTTING_DOWN
    assert first.decision is Decision.SHUTDOWN
    assert R.BOOT_GRACE_EXCEEDED in first.reasons
    request = next(a for a in first.actions if isinstance(a, RequestPower))
    assert request.action == "GracefulShutdown" and request.attempt == 1
    assert first.record is not None and first.record.node_type == "CloudVM"
    gate_names = [g.gate for g in first.record.gates]
    assert GateName.NODE_MANAGER in gate_names
    t = first.next.transition
    assert t is not None
    accepted = step(
        first.next,
        first.facts,
        RequestAccepted(
            transition_id=t.id, attempt=1, action="GracefulShutdown", at=NOW, source="cloud"
        ),
        NOW,
        POLICY,
    )
    assert accepted.next.state is PowerState.SHUTTING_DOWN  # accepted proves nothing
    later = NOW + timedelta(seconds=3)
    gone = step(
        accepted.next,
        accepted.facts,
        PowerObserved(reading=power("Off", when=later)),
        later,
        POLICY,
    )
    assert gone.next.state is PowerState.OFF
    assert R.POWER_OFF_CONFIRMED in gone.reasons


def test_an_idle_vm_drains_then_is_destroyed_after_demand_is_re_read() -> None:
    first = step(vm_on_state(), vm_facts(), Evaluate(), NOW, POLICY)
    assert first.next.state is PowerState.DRAINING and first.decision is Decision.DRAIN
    t1 = NOW + timedelta(seconds=1)
    closed = step(first.next, first.facts, AdmissionClosed(at=t1), t1, POLICY)
    assert closed.next.admission is AdmissionState.CLOSED
    t2 = NOW + timedelta(seconds=2)
    facts = closed.facts.model_copy(
        update={"work": idle_work(when=t2), "vm": vm(observed_at=t2), "power": power(when=t2)}
    )
    reread = step(closed.next, facts, DemandReread(reading=demand(0, when=t2)), t2, POLICY)
    assert reread.next.state is PowerState.SHUTTING_DOWN, reread.reasons
    assert reread.reasons == (R.GATES_PASSED, R.IDLE_EXCEEDED)


def test_a_held_vm_set_to_drain_completes_its_drain() -> None:
    """Admission never opened (idleBehavior hold) counts as closed from the drain's start,
    so demand and work read after it prove the drain (a node used to wait forever)."""
    held = NodePowerState(
        node=VM, state=PowerState.ON_IDLE, on_since=at(-55 * 60), seq=3
    )  # admission Closed since it was first seen, never opened
    assert held.admission is AdmissionState.CLOSED and held.admission_since is None
    drain = vm_facts(desired=desired("Auto", "drain"))
    first = step(held, drain, Evaluate(), NOW, POLICY)
    assert first.next.state is PowerState.DRAINING
    assert first.next.admission_since == NOW
    t = NOW + timedelta(seconds=1)
    facts = first.facts.model_copy(
        update={"work": idle_work(when=t), "vm": vm(observed_at=t), "power": power(when=t)}
    )
    done = step(first.next, facts, Evaluate(), t, POLICY)
    assert done.next.state is PowerState.SHUTTING_DOWN, done.reasons
    assert R.IDLE_BEHAVIOR_DRAIN in done.reasons


def _stopped_off_state() -> NodePowerState:
    """A VM that stopped by itself: ACTIVE -> OFF on the cloud list's Off (UNEXPECTED)."""
    facts = vm_facts(power=power("Off", when=at(-2)), vm=vm(stopped=True))
    went = step(vm_on_state(), facts, PowerObserved(reading=facts.power), at(-2), POLICY)  # type: ignore[arg-type]
    assert went.next.state is PowerState.OFF
    return went.next


def test_a_vm_that_stopped_by_itself_is_down_and_destroyed_from_off() -> None:
    state = _stopped_off_state()
    facts = vm_facts(power=power("Off", when=at(-1)), vm=vm(stopped=True), work=None)
    assert rule_codes(facts) == ("down", R.WORKER_DOWN)
    result = step(state, facts, Evaluate(), NOW, POLICY)
    assert result.next.state is PowerState.SHUTTING_DOWN
    assert result.decision is Decision.SHUTDOWN
    assert R.WORKER_DOWN in result.reasons
    request = next(a for a in result.actions if isinstance(a, RequestPower))
    assert request.action == "GracefulShutdown"
    assert result.record is not None
    rule_gate = next(g for g in result.record.gates if g.gate is GateName.NODE_MANAGER)
    assert any(e.name == "stopped" and e.value is True for e in rule_gate.evidence)
    power_gate = next(g for g in result.record.gates if g.gate is GateName.POWER)
    assert power_gate.verdict is Verdict.PASS


def test_an_off_reading_in_off_opens_nothing_and_a_listed_vm_that_is_not_stopped_stays() -> None:
    state = _stopped_off_state()
    # the reading that says the instance left the list: nothing is requested for it
    facts = vm_facts(power=power("Off", when=at(-1)), vm=vm(stopped=True), work=None)
    gone = step(state, facts, PowerObserved(reading=facts.power), NOW, POLICY)  # type: ignore[arg-type]
    assert gone.next.state is PowerState.OFF
    assert not any(isinstance(a, RequestPower) for a in gone.actions)
    # an Off VM that is not listed stopped (a heartbeat still fresh) is not destroyed
    quiet = vm_facts(power=power("Off", when=at(-1)), vm=vm(), work=None)
    kept = step(state, quiet, Evaluate(), NOW, POLICY)
    assert kept.next.state is PowerState.OFF
    assert not any(isinstance(a, RequestPower) for a in kept.actions)
