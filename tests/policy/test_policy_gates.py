"""The power gates: one named test per gate rule, plus decision precedence and wake gates."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from policy_builders import (
    NOW,
    at,
    block_lock,
    capability,
    demand,
    desired,
    fleet,
    identity,
    idle_facts,
    inhibitors,
    intent,
    off_facts,
    off_state,
    on_state,
    policy,
    power,
    uptime,
    work,
)

from nodewarden.policy.evaluation import Evaluation, GateName, Verdict
from nodewarden.policy.facts import NodeFacts, OverrideRequest
from nodewarden.policy.gates import evaluate_shutdown, evaluate_wake
from nodewarden.policy.overrides import force_off_permitted
from nodewarden.policy.reasons import Decision, ReasonCode
from nodewarden.policy.state import (
    AdmissionState,
    NodePowerState,
    PowerState,
    Transition,
    TransitionKind,
)

R = ReasonCode
DEFAULT = policy()
IDLE_20M = policy(idleThreshold="20m")
BUDGET_1 = policy(disruptionBudget={"maxConcurrentTransitions": 1})


def closed_state(closed_at: float = -60, **overrides: Any) -> NodePowerState:
    """A node draining for a shutdown: admission confirmed closed at NOW+closed_at."""
    t = Transition(
        id="shutdown-test",
        kind=TransitionKind.SHUTDOWN,
        started_at=at(closed_at - 5),
        deadline=at(7200),
    )
    values: dict[str, Any] = {
        "state": PowerState.DRAINING,
        "admission": AdmissionState.CLOSED,
        "admission_since": at(closed_at),
        "transition": t,
    }
    values.update(overrides)
    return on_state(**values)


def shutdown(
    facts: NodeFacts | None = None,
    state: NodePowerState | None = None,
    pol: Any = DEFAULT,
    now: datetime = NOW,
) -> Evaluation:
    return evaluate_shutdown(
        facts or idle_facts(), now, pol, closed_state() if state is None else state
    )


def gate(evaluation: Evaluation, name: GateName) -> tuple[Verdict, tuple[ReasonCode, ...]]:
    result = evaluation.gate(name)
    assert result is not None
    return result.verdict, result.reasons


# -- the whole table -----------------------------------------------------------------------


def test_all_gates_pass_gives_shutdown_with_graceful_action() -> None:
    ev = shutdown()
    assert ev.decision is Decision.SHUTDOWN
    assert ev.reasons == (R.GATES_PASSED,)
    assert ev.passed and ev.action == "GracefulShutdown"
    assert [g.gate for g in ev.gates] == [g for g in GateName if g is not GateName.NODE_MANAGER]
    assert all(g.verdict in (Verdict.PASS, Verdict.SKIPPED) for g in ev.gates)


def test_periodic_check_on_open_idle_node_says_drain_first() -> None:
    ev = evaluate_shutdown(idle_facts(), NOW, DEFAULT, on_state())
    assert ev.decision is Decision.DRAIN
    assert gate(ev, GateName.WORK) == (Verdict.FAIL, (R.ADMISSION_OPEN,))
    assert not ev.passed


def test_without_state_admission_is_unproven() -> None:
    ev = evaluate_shutdown(idle_facts(), NOW, DEFAULT)
    assert ev.decision is Decision.DRAIN
    assert R.DEMAND_NOT_REREAD in ev.reasons and R.DRAIN_INCOMPLETE in ev.reasons


# -- gate: policy --------------------------------------------------------------------------


def test_policy_gate_invalid_policy_blocks() -> None:
    bad = policy(billing={"period": "1h", "windowStart": "50m", "windowEnd": "40m"})
    assert bad.problems
    ev = shutdown(pol=bad)
    assert ev.decision is Decision.BLOCK and R.POLICY_INVALID in ev.reasons
    assert evaluate_wake(off_facts(), NOW, bad, off_state()).decision is Decision.BLOCK


def test_policy_gate_paused_policy_does_nothing() -> None:
    ev = shutdown(pol=policy(paused=True))
    assert ev.decision is Decision.NONE and ev.reasons[0] is R.POLICY_PAUSED


# -- gate: desired -------------------------------------------------------------------------


def test_desired_power_on_is_never_switched_off() -> None:
    ev = shutdown(idle_facts(desired=desired("On")))
    assert ev.decision is Decision.NONE and R.DESIRED_ON in ev.reasons


def test_idle_behavior_hold_is_not_switched_off_automatically() -> None:
    ev = shutdown(idle_facts(desired=desired(behavior="hold")))
    assert ev.decision is Decision.NONE and R.IDLE_BEHAVIOR_HOLD in ev.reasons


@pytest.mark.parametrize("source", ["spec-off", "drain-behavior", "manual-intent"])
def test_wanted_shutdown_waives_idle_threshold_only(source: str) -> None:
    overrides: dict[str, Any] = {"work": work(idle_for=30)}
    if source == "spec-off":
        overrides["desired"] = desired("Off")
    elif source == "drain-behavior":
        overrides["desired"] = desired(behavior="drain")
    else:
        overrides["intent"] = intent("Shutdown")
    ev = shutdown(idle_facts(**overrides))
    assert ev.decision is Decision.SHUTDOWN and ev.forced
    idle = ev.timing[0]
    assert (
        evaluate_shutdown(idle_facts(**overrides), NOW, DEFAULT, on_state()).decision
        is Decision.DRAIN
    )
    assert idle.name == "idleThreshold" and idle.waived
    # ...but min-on still applies
    ev = shutdown(idle_facts(uptime=uptime(up_for=600), **overrides))
    assert ev.decision is Decision.DEFER and R.MIN_ON_NOT_MET in ev.reasons


def test_restart_intent_is_not_supported() -> None:
    ev = shutdown(idle_facts(intent=intent("Restart")))
    assert ev.decision is Decision.BLOCK and R.INTENT_NOT_SUPPORTED in ev.reasons


def test_drain_intent_holds_the_node() -> None:
    ev = shutdown(idle_facts(intent=intent("Drain")))
    assert ev.decision is Decision.NONE and R.IDLE_BEHAVIOR_HOLD in ev.reasons


def test_pinned_spec_power_wins_over_manual_intents() -> None:
    ev = shutdown(idle_facts(desired=desired("On"), intent=intent("Shutdown")))
    assert ev.decision is Decision.NONE and R.DESIRED_ON in ev.reasons
    ev = evaluate_wake(
        off_facts(desired=desired("Off"), intent=intent("Wake")), NOW, DEFAULT, off_state()
    )
    assert ev.decision is Decision.NONE and R.DESIRED_OFF in ev.reasons


def test_wake_intent_prevents_shutdown() -> None:
    ev = shutdown(idle_facts(intent=intent("Wake")))
    assert ev.decision is Decision.NONE and R.DESIRED_ON in ev.reasons


# -- gate 1: demand ------------------------------------------------------------------------


def test_demand_gate_queued_demand_means_node_is_needed() -> None:
    ev = shutdown(idle_facts(demand=demand(3)))
    assert ev.decision is Decision.NONE
    assert gate(ev, GateName.DEMAND) == (Verdict.FAIL, (R.DEMAND_PRESENT,))


def test_demand_gate_missing_reading_defers() -> None:
    ev = shutdown(idle_facts(demand=None))
    assert ev.decision is Decision.DEFER and R.TELEMETRY_MISSING in ev.reasons


def test_demand_gate_reading_older_than_admission_close_must_be_reread() -> None:
    facts = idle_facts(demand=demand(0, when=at(-90)))
    ev = shutdown(facts, closed_state(closed_at=-60))
    assert ev.decision is Decision.DRAIN
    assert gate(ev, GateName.DEMAND) == (Verdict.FAIL, (R.DEMAND_NOT_REREAD,))
    assert "demand" in ev.refresh


def test_demand_gate_manual_shutdown_with_demand_defers_rather_than_none() -> None:
    ev = shutdown(idle_facts(demand=demand(1), intent=intent("Shutdown")))
    assert ev.decision is Decision.DEFER and R.DEMAND_PRESENT in ev.reasons


# -- gate 2: work / drain --------------------------------------------------------------------


def test_work_gate_active_jobs_with_open_admission_means_busy() -> None:
    ev = evaluate_shutdown(idle_facts(work=work(active=2)), NOW, DEFAULT, on_state())
    assert ev.decision is Decision.NONE and ev.reasons[0] is R.ACTIVE_WORK


def test_work_gate_jobs_still_running_after_admission_closed_is_drain_incomplete() -> None:
    ev = shutdown(idle_facts(work=work(active=1)))
    assert ev.decision is Decision.DRAIN
    verdict, reasons = gate(ev, GateName.WORK)
    assert verdict is Verdict.FAIL and reasons == (R.DRAIN_INCOMPLETE,)


def test_work_gate_job_count_read_before_admission_closed_proves_nothing() -> None:
    ev = shutdown(idle_facts(work=work(when=at(-70))), closed_state(closed_at=-60))
    assert ev.decision is Decision.DRAIN and R.DRAIN_INCOMPLETE in ev.reasons
    assert "work" in ev.refresh


def test_work_gate_admission_closing_is_not_closed() -> None:
    ev = shutdown(state=closed_state(admission=AdmissionState.CLOSING))
    assert ev.decision is Decision.DRAIN and R.ADMISSION_OPEN in ev.reasons


def test_work_gate_manual_shutdown_of_busy_node_drains() -> None:
    ev = evaluate_shutdown(
        idle_facts(work=work(active=2), intent=intent("Shutdown")), NOW, DEFAULT, on_state()
    )
    assert ev.decision is Decision.DRAIN and R.ADMISSION_OPEN in ev.reasons


# -- gate 3: telemetry freshness ---------------------------------------------------------------


@pytest.mark.parametrize("reading", ["demand", "work", "power", "inhibitors"])
def test_telemetry_gate_each_stale_decisive_reading_defers(reading: str) -> None:
    old = at(-121)
    stale = {
        "demand": demand(when=old),
        "work": work(when=old),
        "power": power(when=old),
        "inhibitors": inhibitors(when=old),
    }[reading]
    state = closed_state(closed_at=-200)
    ev = shutdown(idle_facts(**{reading: stale}), state)
    assert ev.decision is Decision.DEFER
    assert gate(ev, GateName.TELEMETRY) == (Verdict.FAIL, (R.TELEMETRY_STALE,))
    assert ev.stale == (reading,) and reading in ev.refresh


@pytest.mark.parametrize("reading", ["demand", "work", "power", "inhibitors"])
def test_telemetry_gate_each_missing_decisive_reading_defers(reading: str) -> None:
    ev = shutdown(idle_facts(**{reading: None}))
    assert ev.decision is Decision.DEFER
    assert R.TELEMETRY_MISSING in gate(ev, GateName.TELEMETRY)[1]
    assert ev.missing == (reading,)


def test_telemetry_gate_age_equal_to_limit_is_fresh_one_second_more_is_stale() -> None:
    state = closed_state(closed_at=-300)
    edge = idle_facts(demand=demand(when=at(-120)))
    assert shutdown(edge, state).decision is Decision.SHUTDOWN
    over = idle_facts(demand=demand(when=at(-121)))
    assert shutdown(over, state).decision is Decision.DEFER


def test_telemetry_gate_reading_from_the_future_defers() -> None:
    ev = shutdown(idle_facts(power=power(when=at(30))))
    assert ev.decision is Decision.DEFER and R.TELEMETRY_FROM_FUTURE in ev.reasons
    # within the 5 s skew tolerance it counts as fresh
    assert shutdown(idle_facts(power=power(when=at(4)))).decision is Decision.SHUTDOWN


# -- observed power ---------------------------------------------------------------------------


def test_power_gate_already_off_is_nothing_to_do() -> None:
    ev = shutdown(idle_facts(power=power("Off")))
    assert ev.decision is Decision.NONE and R.ALREADY_OFF in ev.reasons


@pytest.mark.parametrize("value", ["Unknown", "PoweringOn", "PoweringOff"])
def test_power_gate_unknown_power_defers(value: str) -> None:
    ev = shutdown(idle_facts(power=power(value)))
    assert ev.decision is Decision.DEFER and R.POWER_STATE_UNKNOWN in ev.reasons


# -- gate 4: timing ------------------------------------------------------------------------


def test_timing_gate_idle_threshold_not_met_defers_until_reached() -> None:
    ev = evaluate_shutdown(idle_facts(work=work(idle_for=600)), NOW, IDLE_20M, on_state())
    assert ev.decision is Decision.DEFER and ev.reasons[0] is R.IDLE_WINDOW_NOT_MET
    idle_since = at(-10) - timedelta(seconds=600)
    assert ev.recheck_at == idle_since + timedelta(minutes=20)


def test_timing_gate_idle_exactly_threshold_passes() -> None:
    """Idle for exactly the threshold passes; a second less defers."""
    ev = evaluate_shutdown(idle_facts(work=work(idle_for=1200 - 10)), NOW, IDLE_20M, on_state())
    assert ev.decision is Decision.DRAIN and ev.reasons == (R.ADMISSION_OPEN,)
    ev = evaluate_shutdown(idle_facts(work=work(idle_for=1200 - 11)), NOW, IDLE_20M, on_state())
    assert ev.decision is Decision.DEFER and ev.reasons[0] is R.IDLE_WINDOW_NOT_MET


def test_timing_gate_spec_min_on_example_defers() -> None:
    """Idle threshold 20 m reached, min-on 30 m, up 22 m -> DEFER (SPEC example)."""
    pol = policy(idleThreshold="20m", minOn="30m")
    facts = idle_facts(work=work(idle_for=21 * 60), uptime=uptime(up_for=22 * 60 - 10))
    state = on_state(on_since=at(-22 * 60), last_transition_at=at(-22 * 60))
    ev = evaluate_shutdown(facts, NOW, pol, state)
    assert ev.decision is Decision.DEFER and ev.reasons == (R.MIN_ON_NOT_MET, R.ADMISSION_OPEN)
    measures = {m.name: m for m in ev.timing}
    assert measures["idleThreshold"].met is True
    assert measures["minOn"].met is False and measures["minOn"].measured == 22 * 60
    assert ev.recheck_at == at(-22 * 60) + timedelta(minutes=30)


def test_timing_gate_min_on_uses_the_later_of_boot_time_and_recorded_on() -> None:
    facts = idle_facts(uptime=uptime(up_for=10 * 3600))
    ev = shutdown(facts, closed_state(on_since=at(-600)))
    assert ev.decision is Decision.DEFER and R.MIN_ON_NOT_MET in ev.reasons


def test_timing_gate_unknown_uptime_defers() -> None:
    ev = shutdown(idle_facts(uptime=None), closed_state(on_since=None))
    assert ev.decision is Decision.DEFER and R.TELEMETRY_MISSING in gate(ev, GateName.TIMING)[1]


def test_timing_gate_cooldown_defers() -> None:
    ev = shutdown(state=closed_state(last_transition_at=at(-120)))
    assert ev.decision is Decision.DEFER and ev.reasons == (R.COOLDOWN,)
    assert ev.recheck_at == at(-120) + timedelta(minutes=5)


def test_timing_gate_no_previous_transition_passes_cooldown() -> None:
    assert shutdown(state=closed_state(last_transition_at=None)).decision is Decision.SHUTDOWN


def test_timing_gate_billing_window_ignored_for_side_nodes() -> None:
    ev = shutdown(idle_facts(uptime=uptime(up_for=2 * 3600 + 20 * 60)), closed_state(on_since=None))
    assert ev.decision is Decision.SHUTDOWN


# -- gate 5: inhibitors -------------------------------------------------------------------


def test_inhibitor_gate_block_mode_shutdown_lock_blocks() -> None:
    ev = shutdown(idle_facts(inhibitors=inhibitors(block_lock())))
    assert ev.decision is Decision.BLOCK
    assert gate(ev, GateName.INHIBITORS) == (Verdict.FAIL, (R.INHIBITOR_ACTIVE,))


def test_inhibitor_gate_block_weak_counts_as_block() -> None:
    ev = shutdown(idle_facts(inhibitors=inhibitors(block_lock(mode="block-weak"))))
    assert ev.decision is Decision.BLOCK


@pytest.mark.parametrize(
    ("what", "mode"),
    [("shutdown", "delay"), ("sleep", "block"), ("idle:handle-lid-switch", "block")],
)
def test_inhibitor_gate_delay_or_non_shutdown_locks_do_not_block(what: str, mode: str) -> None:
    ev = shutdown(idle_facts(inhibitors=inhibitors(block_lock(what, mode))))
    assert ev.decision is Decision.SHUTDOWN


def test_inhibitor_gate_shutdown_in_colon_list_blocks() -> None:
    assert (
        shutdown(idle_facts(inhibitors=inhibitors(block_lock("sleep:shutdown")))).decision
        is Decision.BLOCK
    )


def test_inhibitor_gate_permitted_override_waives_and_is_recorded() -> None:
    pol = policy(inhibitorOverride={"permitted": True, "allowedRequesters": ["alice"]})
    facts = idle_facts(
        inhibitors=inhibitors(block_lock()), intent=intent("Shutdown", override_inhibitors=True)
    )
    ev = shutdown(facts, pol=pol)
    assert ev.decision is Decision.SHUTDOWN
    assert ev.reasons == (R.GATES_PASSED, R.OVERRIDE_APPLIED)
    assert gate(ev, GateName.INHIBITORS) == (
        Verdict.WAIVED,
        (R.INHIBITOR_ACTIVE, R.OVERRIDE_APPLIED),
    )
    assert ev.overrides_applied == ("inhibitors",)


def test_inhibitor_gate_override_not_permitted_by_policy_blocks() -> None:
    facts = idle_facts(
        inhibitors=inhibitors(block_lock()), intent=intent("Shutdown", override_inhibitors=True)
    )
    ev = shutdown(facts)
    assert ev.decision is Decision.BLOCK and R.OVERRIDE_NOT_PERMITTED in ev.reasons


def test_inhibitor_gate_override_from_unlisted_requester_blocks() -> None:
    pol = policy(inhibitorOverride={"permitted": True, "allowedRequesters": ["bob"]})
    facts = idle_facts(
        inhibitors=inhibitors(block_lock()), intent=intent("Shutdown", override_inhibitors=True)
    )
    ev = shutdown(facts, pol=pol)
    assert ev.decision is Decision.BLOCK and R.OVERRIDE_NOT_PERMITTED in ev.reasons


def test_an_override_of_an_unverified_requester_is_refused() -> None:
    """Issue 20: requestedBy is a free string unless the admission policy verified it."""
    pol = policy(inhibitorOverride={"permitted": True, "allowedRequesters": ["alice"]})
    forged = intent("Shutdown", override_inhibitors=True, verified=False)
    ev = shutdown(idle_facts(inhibitors=inhibitors(block_lock()), intent=forged), pol=pol)
    assert ev.decision is Decision.BLOCK
    assert gate(ev, GateName.INHIBITORS) == (
        Verdict.FAIL,
        (R.INHIBITOR_ACTIVE, R.REQUESTER_UNVERIFIED),
    )
    permissive = policy(
        allowedActions=["On", "GracefulShutdown", "ForceOff"],
        inhibitorOverride={"permitted": True, "permitForceOff": True},
    )
    force = idle_facts(intent=intent("Shutdown", force_off=True, verified=False))
    assert not force_off_permitted(force, permissive)


def test_inhibitor_gate_missing_reading_defers() -> None:
    ev = shutdown(idle_facts(inhibitors=None))
    assert ev.decision is Decision.DEFER
    assert gate(ev, GateName.INHIBITORS) == (Verdict.FAIL, (R.TELEMETRY_MISSING,))


# -- gate 6: capability ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "cap",
    [
        None,
        capability("None", ()),
        capability("Redfish", None),
        capability("Redfish", ("On", "ForceOff")),
        capability("WakeOnLan", ("WakeOnLan",)),
    ],
    ids=[
        "no-reading",
        "method-none",
        "allowable-unknown",
        "graceful-unsupported",
        "wol-without-ssh",
    ],
)
def test_capability_gate_unavailable_control_blocks(cap: Any) -> None:
    ev = shutdown(idle_facts(capability=cap))
    assert ev.decision is Decision.BLOCK
    assert gate(ev, GateName.CAPABILITY) == (Verdict.FAIL, (R.POWER_CONTROL_UNAVAILABLE,))
    assert ev.action is None


def test_capability_gate_action_not_allowed_by_policy_blocks() -> None:
    ev = shutdown(pol=policy(allowedActions=["On"]))
    assert ev.decision is Decision.BLOCK
    assert gate(ev, GateName.CAPABILITY) == (Verdict.FAIL, (R.ACTION_NOT_ALLOWED,))


def test_capability_gate_wake_on_lan_node_is_switched_off_over_ssh() -> None:
    ev = shutdown(idle_facts(capability=capability("WakeOnLan", ("WakeOnLan", "SshPoweroff"))))
    assert ev.decision is Decision.SHUTDOWN and ev.action == "SshPoweroff"


def test_force_off_needs_intent_override_policy_and_capability() -> None:
    permissive = policy(
        allowedActions=["On", "GracefulShutdown", "ForceOff"],
        inhibitorOverride={"permitted": True, "permitForceOff": True},
    )
    with_override = idle_facts(intent=intent("Shutdown", force_off=True))
    assert force_off_permitted(with_override, permissive)
    assert not force_off_permitted(idle_facts(), permissive)
    assert not force_off_permitted(idle_facts(intent=intent("Shutdown")), permissive)
    assert not force_off_permitted(with_override, DEFAULT)
    not_listed = policy(inhibitorOverride={"permitted": True, "permitForceOff": True})
    assert not force_off_permitted(with_override, not_listed)
    no_cap = idle_facts(
        intent=intent("Shutdown", force_off=True),
        capability=capability("Redfish", ("On", "GracefulShutdown")),
    )
    assert not force_off_permitted(no_cap, permissive)


# -- identity: one machine, one BMC (issue 20) ------------------------------------------------

OTHER = "4c4c4544-0000-0000-0000-00000000beef"


def test_identity_gate_passes_when_the_bmc_manages_the_host() -> None:
    ev = shutdown(idle_facts())
    assert ev.decision is Decision.SHUTDOWN
    assert gate(ev, GateName.IDENTITY) == (Verdict.PASS, ())


def test_a_bmc_of_another_machine_blocks_the_shutdown() -> None:
    """Own idle host's ssh block, the victim's BMC: every other gate passes."""
    ev = shutdown(idle_facts(identity=identity(host=OTHER)))
    assert ev.decision is Decision.BLOCK and ev.reasons == (R.IDENTITY_MISMATCH,)
    values = {
        e.name: e.value for e in next(g for g in ev.gates if g.gate is GateName.IDENTITY).evidence
    }
    assert values["bmcUuid"] != values["hostUuid"]


@pytest.mark.parametrize(
    ("reading", "code", "decision"),
    [
        (
            identity(host=None, problem="exit 1: Permission denied"),
            R.IDENTITY_UNVERIFIED,
            Decision.BLOCK,
        ),
        (identity(bmc=None), R.IDENTITY_UNVERIFIED, Decision.BLOCK),
        (None, R.IDENTITY_UNVERIFIED, Decision.BLOCK),
        (identity(when=at(-3600)), R.TELEMETRY_STALE, Decision.DEFER),
    ],
    ids=["unreadable", "bmc-without-uuid", "no-reading", "host-not-answering"],
)
def test_an_unproven_identity_never_lets_the_bmc_switch_off(
    reading: Any, code: ReasonCode, decision: Decision
) -> None:
    ev = shutdown(idle_facts(identity=reading))
    assert ev.decision is decision and code in ev.reasons
    assert gate(ev, GateName.IDENTITY)[0] is Verdict.FAIL


def test_only_an_audited_override_may_rely_on_the_recorded_match() -> None:
    stale = identity(when=at(-3600), matched_at=at(-7200))
    manual = intent("Shutdown")
    override = manual.model_copy(
        update={
            "override": OverrideRequest(
                recorded_identity=True, justification="host agent down INC-9"
            )
        }
    )
    assert shutdown(idle_facts(identity=stale, intent=manual)).decision is not Decision.SHUTDOWN
    ev = shutdown(idle_facts(identity=stale, intent=override))
    assert gate(ev, GateName.IDENTITY) == (Verdict.WAIVED, (R.TELEMETRY_STALE, R.OVERRIDE_APPLIED))
    assert "identity" in ev.overrides_applied
    evidence = next(g for g in ev.gates if g.gate is GateName.IDENTITY).evidence
    assert any(e.name == "recordedMatch" and "7200 s old" in str(e.value) for e in evidence)
    unverified = override.model_copy(update={"requester_verified": False})
    ev = shutdown(idle_facts(identity=stale, intent=unverified))
    assert gate(ev, GateName.IDENTITY)[0] is Verdict.FAIL
    # a mismatch is never waived
    mismatch = identity(host=OTHER, matched_at=at(-7200))
    assert shutdown(idle_facts(identity=mismatch, intent=override)).decision is Decision.BLOCK


def test_the_identity_gate_is_skipped_when_the_bmc_does_not_switch_off() -> None:
    wol = capability("WakeOnLan", ("WakeOnLan", "SshPoweroff"))
    ev = shutdown(idle_facts(capability=wol, identity=None))
    assert ev.decision is Decision.SHUTDOWN
    assert gate(ev, GateName.IDENTITY) == (Verdict.SKIPPED, ())


# -- fleet -----------------------------------------------------------------------------------


def test_fleet_gate_disruption_budget_exhausted_defers() -> None:
    ev = evaluate_shutdown(idle_facts(fleet=fleet(in_progress=1)), NOW, BUDGET_1, on_state())
    assert ev.decision is Decision.DEFER and R.DISRUPTION_BUDGET_EXHAUSTED in ev.reasons


def test_fleet_gate_own_transition_is_not_counted_twice() -> None:
    facts = idle_facts(fleet=fleet(in_progress=1))
    assert shutdown(facts, pol=BUDGET_1).decision is Decision.SHUTDOWN


def test_fleet_gate_min_warm_nodes_keeps_node_on() -> None:
    ev = shutdown(idle_facts(fleet=fleet(warm=1)), pol=policy(minWarmNodes=2))
    assert ev.decision is Decision.NONE and R.MIN_WARM_NODES in ev.reasons


def test_min_warm_counts_the_warm_nodes_left_once_this_one_goes() -> None:
    # this node is idle with admission open: it is one of the 2 warm idle nodes
    pol = policy(minWarmNodes=2)
    ev = evaluate_shutdown(idle_facts(fleet=fleet(warm=2)), NOW, pol, on_state())
    assert R.MIN_WARM_NODES in ev.reasons  # going would leave 1 < 2
    ev = evaluate_shutdown(idle_facts(fleet=fleet(warm=3)), NOW, pol, on_state())
    assert R.MIN_WARM_NODES not in ev.reasons  # 2 stay warm
    # a draining node no longer counts itself (admission closed): 2 others are warm
    assert R.MIN_WARM_NODES not in shutdown(idle_facts(fleet=fleet(warm=2)), pol=pol).reasons


def test_fleet_gate_without_reading_is_skipped() -> None:
    ev = shutdown()
    assert gate(ev, GateName.FLEET) == (Verdict.SKIPPED, ())


# -- precedence --------------------------------------------------------------------------------


def test_precedence_none_over_block_over_defer_over_drain() -> None:
    lock = inhibitors(block_lock())
    stale_power = power(when=at(-500))
    assert shutdown(idle_facts(demand=demand(1), inhibitors=lock)).decision is Decision.NONE
    ev = shutdown(idle_facts(inhibitors=lock, power=stale_power))
    assert ev.decision is Decision.BLOCK and ev.reasons[0] is R.INHIBITOR_ACTIVE
    assert R.TELEMETRY_STALE in ev.reasons
    ev = evaluate_shutdown(idle_facts(power=stale_power), NOW, DEFAULT, on_state())
    assert ev.decision is Decision.DEFER and set(ev.reasons) == {
        R.TELEMETRY_STALE,
        R.ADMISSION_OPEN,
    }


def test_same_facts_same_evaluation() -> None:
    facts = idle_facts(inhibitors=inhibitors(block_lock()))
    a, b = shutdown(facts), shutdown(facts)
    assert a == b


def test_naive_clock_is_rejected() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        evaluate_shutdown(idle_facts(), NOW.replace(tzinfo=None), DEFAULT)


# -- wake gates ---------------------------------------------------------------------------------


def wake(
    facts: NodeFacts | None = None, state: NodePowerState | None = None, pol: Any = DEFAULT
) -> Evaluation:
    return evaluate_wake(facts or off_facts(), NOW, pol, state or off_state())


def test_wake_all_gates_pass_starts_with_redfish_on() -> None:
    ev = wake()
    assert ev.decision is Decision.START and ev.action == "On" and ev.reasons == (R.GATES_PASSED,)


def test_wake_wake_on_lan_node_uses_magic_packet() -> None:
    ev = wake(off_facts(capability=capability("WakeOnLan", ("WakeOnLan", "SshPoweroff"))))
    assert ev.decision is Decision.START and ev.action == "WakeOnLan"


def test_wake_no_demand_does_nothing() -> None:
    ev = wake(off_facts(demand=demand(0)))
    assert ev.decision is Decision.NONE and ev.reasons[0] is R.NO_DEMAND


def test_wake_min_off_not_met_defers() -> None:
    ev = wake(state=off_state(off_since=at(-300), last_transition_at=at(-3600)))
    assert ev.decision is Decision.DEFER and ev.reasons == (R.MIN_OFF_NOT_MET,)
    assert ev.recheck_at == at(-300) + timedelta(minutes=10)


def test_wake_cooldown_defers() -> None:
    ev = wake(state=off_state(last_transition_at=at(-60)))
    assert ev.decision is Decision.DEFER and R.COOLDOWN in ev.reasons


def test_wake_unknown_off_time_defers() -> None:
    ev = wake(state=off_state(off_since=None))
    assert ev.decision is Decision.DEFER and R.TELEMETRY_MISSING in ev.reasons


def test_wake_already_on_is_nothing_to_do() -> None:
    ev = wake(off_facts(power=power("On")))
    assert ev.decision is Decision.NONE and R.ALREADY_ON in ev.reasons


def test_wake_stale_demand_defers() -> None:
    ev = wake(off_facts(demand=demand(2, when=at(-600))))
    assert ev.decision is Decision.DEFER and R.TELEMETRY_STALE in ev.reasons


def test_wake_capability_missing_blocks() -> None:
    ev = wake(off_facts(capability=capability("Redfish", ("GracefulShutdown",))))
    assert ev.decision is Decision.BLOCK and R.POWER_CONTROL_UNAVAILABLE in ev.reasons


def test_wake_desired_on_wakes_without_demand() -> None:
    ev = wake(off_facts(demand=None, desired=desired("On")))
    assert ev.decision is Decision.START and ev.forced


def test_wake_intent_wakes_without_demand() -> None:
    ev = wake(off_facts(demand=demand(0), intent=intent("Wake")))
    assert ev.decision is Decision.START


def test_wake_desired_off_or_hold_never_wakes() -> None:
    assert wake(off_facts(desired=desired("Off"))).reasons[0] is R.DESIRED_OFF
    assert wake(off_facts(desired=desired(behavior="hold"))).reasons[0] is R.IDLE_BEHAVIOR_HOLD
    assert wake(off_facts(intent=intent("Shutdown"))).decision is Decision.NONE


def test_wake_disruption_budget_defers() -> None:
    ev = wake(off_facts(fleet=fleet(in_progress=1)), pol=BUDGET_1)
    assert ev.decision is Decision.DEFER and R.DISRUPTION_BUDGET_EXHAUSTED in ev.reasons


def test_an_evaluation_runs_its_table_once_in_order() -> None:
    """The gates of an evaluation are the entries of its table, each run once, in order
    (the table is compiled into one call sequence at import: `gates._in_order`)."""
    from nodewarden.policy import gates

    shutdown = evaluate_shutdown(idle_facts(), NOW, policy(), on_state())
    assert [g.gate for g in shutdown.gates] == [name for name, _ in gates.SHUTDOWN_GATES]
    wake = evaluate_wake(off_facts(), NOW, policy(), off_state())
    assert [g.gate for g in wake.gates] == [name for name, _ in gates.WAKE_GATES]

    calls: list[str] = []

    def gate(name: str) -> Any:
        def judge(c: Any) -> str:
            calls.append(name)
            return f"{name}:{c}"

        return judge

    table = tuple((GateName(n), gate(n)) for n in ("policy", "work", "power"))
    run = gates._in_order(table, "probe")
    assert run("c") == ("policy:c", "work:c", "power:c")
    assert calls == ["policy", "work", "power"]
