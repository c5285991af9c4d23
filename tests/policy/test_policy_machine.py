"""The power state machine: flows, races, confirmations, retries, deadlines, overrides."""

from __future__ import annotations

import json
import re
from datetime import timedelta

import pytest
from policy_builders import (
    NODE,
    NOW,
    accepted,
    at,
    baseline_wake,
    block_lock,
    capability,
    demand,
    drive_to_shutting_down,
    idle_facts,
    inhibitors,
    intent,
    observed,
    off_facts,
    off_state,
    on_state,
    policy,
    power,
    probed,
    ready,
    refreshed,
    run,
    work,
)

from nodewarden.policy.actions import (
    CancelPendingShutdown,
    CloseAdmission,
    CloseTransition,
    OpenAdmission,
    PollObservedPower,
    RequestPower,
    RereadDemand,
    RunReadyProbe,
    ScheduleRecheck,
)
from nodewarden.policy.backoff import backoff_delay, jitter_fraction
from nodewarden.policy.events import (
    DeadlineReached,
    Evaluate,
    ManualOverride,
    NewDemand,
    PolicyChanged,
    RequestAccepted,
    RequestErrored,
    RequestRejected,
)
from nodewarden.policy.facts import NodeFacts
from nodewarden.policy.machine import Step, step
from nodewarden.policy.reasons import Decision, ReasonCode
from nodewarden.policy.state import (
    AdmissionState,
    NodePowerState,
    PowerState,
    RequestStatus,
    TransitionKind,
)
from nodewarden.policy.states.context import transition_id
from nodewarden.policy.view import PolicyView

R = ReasonCode
DEFAULT = policy()


def types(result: Step) -> list[str]:
    return [a.type for a in result.actions]


def requests(result: Step) -> list[RequestPower]:
    return [a for a in result.actions if isinstance(a, RequestPower)]


def rejected(
    result: Step, seconds: float, *, errored: bool = False
) -> RequestRejected | RequestErrored:
    t = result.next.transition
    assert t is not None and t.request is not None
    cls = RequestErrored if errored else RequestRejected
    return cls(
        transition_id=t.id,
        attempt=t.request.attempt,
        action=t.request.action,
        at=at(seconds),
        source="redfish",
        detail="HTTP 409" if not errored else "timeout",
    )


# -- start-up -------------------------------------------------------------------------------


def test_unknown_node_is_verified_before_admission_opens() -> None:
    state = NodePowerState.initial(NODE)
    facts = idle_facts()
    first = step(state, facts, Evaluate(), NOW, DEFAULT)
    assert first.next.state is PowerState.UNKNOWN and first.next.transition is not None
    assert first.next.admission is AdmissionState.CLOSED
    assert {"PollObservedPower", "RunReadyProbe"} <= set(types(first))
    # facts observed before verification began are not enough
    second = step(first.next, first.facts, Evaluate(), at(1), DEFAULT)
    assert (
        second.next.state is PowerState.UNKNOWN and second.next.admission is AdmissionState.CLOSED
    )
    steps = run(second.next, second.facts, DEFAULT, (2, observed("On", 2)), (3, probed(True, 3)))
    assert steps[0].next.admission is AdmissionState.CLOSED
    final = steps[-1]
    assert final.next.state is PowerState.ON_IDLE and final.next.admission is AdmissionState.OPEN
    assert final.decision is Decision.START and R.READY_CONFIRMED in final.reasons
    assert "OpenAdmission" in types(final)


def test_unknown_node_observed_off_goes_off() -> None:
    first = step(NodePowerState.initial(NODE), off_facts(), Evaluate(), NOW, DEFAULT)
    second = step(first.next, first.facts, observed("Off", 1), at(1), DEFAULT)
    assert second.next.state is PowerState.OFF and second.next.off_since == at(1)
    assert R.POWER_OFF_CONFIRMED in second.reasons


def test_unknown_verification_ready_failing_backs_off_then_blocks_at_deadline() -> None:
    pol = policy(retry={"budget": 0}, deadlines={"ready": "5m"})
    first = step(NodePowerState.initial(NODE), idle_facts(), Evaluate(), NOW, pol)
    steps = run(first.next, first.facts, pol, (1, observed("On", 1)), (2, probed(False, 2)))
    assert steps[-1].decision is Decision.DEFER and R.READY_PROBE_FAILED in steps[-1].reasons
    assert (
        steps[-1].next.transition is not None
        and steps[-1].next.transition.next_attempt_at is not None
    )
    final = step(steps[-1].next, steps[-1].facts, DeadlineReached(), at(301), pol)
    assert (
        final.next.state is PowerState.BLOCKED and final.next.admission is not AdmissionState.OPEN
    )
    assert R.DEADLINE_EXCEEDED in final.reasons


# -- shutdown flow ---------------------------------------------------------------------------


def test_shutdown_flow_closes_admission_rereads_demand_then_requests() -> None:
    first, second, third = drive_to_shutting_down(DEFAULT)
    assert first.next.state is PowerState.DRAINING and first.decision is Decision.DRAIN
    assert types(first)[:2] == ["OpenTransition", "CloseAdmission"]
    assert first.next.admission is AdmissionState.CLOSING
    assert not requests(first) and not requests(second)
    assert second.next.admission is AdmissionState.CLOSED
    assert any(isinstance(a, RereadDemand) for a in second.actions)
    assert third.decision is Decision.SHUTDOWN and third.reasons == (R.GATES_PASSED,)
    assert third.next.state is PowerState.SHUTTING_DOWN
    [request] = requests(third)
    assert request.action == "GracefulShutdown" and request.attempt == 1
    assert third.next.transition is not None and third.next.transition.deadline == at(
        4
    ) + timedelta(minutes=10)


def test_request_acceptance_does_not_record_off() -> None:
    *_, sent = drive_to_shutting_down(DEFAULT)
    result = step(sent.next, sent.facts, accepted(sent, 5), at(5), DEFAULT)
    assert result.next.state is PowerState.SHUTTING_DOWN
    assert result.decision is Decision.DEFER and result.reasons == (R.CONFIRMATION_PENDING,)
    t = result.next.transition
    assert t is not None and t.request is not None and t.request.status is RequestStatus.ACCEPTED
    assert any(isinstance(a, PollObservedPower) for a in result.actions)
    assert result.record is not None and result.record.confirmation.confirmed is False


def test_off_is_recorded_only_on_an_observed_off_event() -> None:
    *_, sent = drive_to_shutting_down(DEFAULT)
    ack = step(sent.next, sent.facts, accepted(sent, 5), at(5), DEFAULT)
    # facts claiming Off arriving with a mere Evaluate do not make the node OFF
    sneaky = ack.facts.model_copy(update={"power": power("Off", when=at(60))})
    tick = step(ack.next, sneaky, Evaluate(), at(61), DEFAULT)
    assert tick.next.state is PowerState.SHUTTING_DOWN
    done = step(tick.next, tick.facts, observed("Off", 62), at(62), DEFAULT)
    assert done.next.state is PowerState.OFF and done.decision is Decision.NONE
    assert done.reasons == (R.POWER_OFF_CONFIRMED,)
    assert done.next.last_transition_at == at(62) and done.next.off_since == at(62)
    # admission stays dated from the drain that closed it, not from the Off
    assert done.next.admission_since == sent.next.admission_since is not None
    assert done.next.admission_since < at(62)
    closes = [a for a in done.actions if isinstance(a, CloseTransition)]
    assert closes and closes[0].outcome == "Succeeded"
    assert done.record is not None and done.record.confirmation.confirmed


def test_off_observed_before_the_request_is_not_a_confirmation() -> None:
    *_, sent = drive_to_shutting_down(DEFAULT)
    result = step(sent.next, sent.facts, observed("Off", 3.5), at(6), DEFAULT)
    assert result.next.state is PowerState.SHUTTING_DOWN


def test_new_demand_during_draining_aborts_with_race_and_reopens_after_on_ready() -> None:
    _first, second = drive_to_shutting_down(DEFAULT)[:2]
    raced = step(
        second.next, second.facts, NewDemand(reading=demand(1, when=at(3))), at(3), DEFAULT
    )
    assert raced.next.state is PowerState.UNKNOWN and raced.next.race
    assert raced.next.admission is AdmissionState.CLOSED
    assert R.RACE_DEMAND_ARRIVED in raced.reasons
    assert any(isinstance(a, CancelPendingShutdown) for a in raced.actions)
    assert not requests(raced)
    aborted = [a for a in raced.actions if isinstance(a, CloseTransition)]
    assert aborted and aborted[0].outcome == "Aborted"
    # fresh On alone is not enough; On + ready after the abort reopens admission
    on = step(raced.next, raced.facts, observed("On", 4), at(4), DEFAULT)
    assert on.next.admission is AdmissionState.CLOSED
    back = step(on.next, on.facts, probed(True, 5), at(5), DEFAULT)
    assert back.next.state is PowerState.ON_IDLE and back.next.admission is AdmissionState.OPEN
    assert back.decision is Decision.START and back.next.race


def test_demand_after_accepted_request_runs_to_off_and_keeps_race_flag() -> None:
    *_, sent = drive_to_shutting_down(DEFAULT)
    ack = step(sent.next, sent.facts, accepted(sent, 5), at(5), DEFAULT)
    raced = step(ack.next, ack.facts, NewDemand(reading=demand(2, when=at(6))), at(6), DEFAULT)
    assert raced.next.state is PowerState.SHUTTING_DOWN and raced.next.race
    assert R.RACE_DEMAND_ARRIVED in raced.reasons and not requests(raced)
    off = step(raced.next, raced.facts, observed("Off", 30), at(30), DEFAULT)
    assert off.next.state is PowerState.OFF
    assert R.RACE_DEMAND_ARRIVED in off.reasons and off.next.race
    assert any(isinstance(a, ScheduleRecheck) and a.at == at(30) for a in off.actions)


def test_demand_after_rejected_request_aborts_because_host_is_recoverable() -> None:
    *_, sent = drive_to_shutting_down(DEFAULT)
    nak = step(sent.next, sent.facts, rejected(sent, 5), at(5), DEFAULT)
    assert nak.decision is Decision.DEFER and R.BACKOFF in nak.reasons
    raced = step(nak.next, nak.facts, NewDemand(reading=demand(1, when=at(6))), at(6), DEFAULT)
    assert raced.next.state is PowerState.UNKNOWN and raced.next.race
    assert any(isinstance(a, CancelPendingShutdown) for a in raced.actions)


def test_errored_request_is_treated_as_possibly_applied() -> None:
    *_, sent = drive_to_shutting_down(DEFAULT)
    err = step(sent.next, sent.facts, rejected(sent, 5, errored=True), at(5), DEFAULT)
    assert R.REQUEST_ERRORED in err.reasons and any(
        isinstance(a, PollObservedPower) for a in err.actions
    )
    raced = step(err.next, err.facts, NewDemand(reading=demand(1, when=at(6))), at(6), DEFAULT)
    assert raced.next.state is PowerState.SHUTTING_DOWN and raced.next.race


def test_rejected_request_is_retried_after_backoff_only_if_gates_still_pass() -> None:
    *_, sent = drive_to_shutting_down(DEFAULT)
    nak = step(sent.next, sent.facts, rejected(sent, 5), at(5), DEFAULT)
    t = nak.next.transition
    assert t is not None and t.retries_used == 1 and t.next_attempt_at is not None
    delay = t.next_attempt_at - at(5)
    assert delay == backoff_delay(1, DEFAULT, t.id)
    assert timedelta(seconds=8) <= delay <= timedelta(seconds=12)  # 10 s +- 20 % jitter
    early = step(nak.next, nak.facts, Evaluate(), at(6), DEFAULT)
    assert not requests(early) and R.BACKOFF in early.reasons
    due = (t.next_attempt_at - NOW).total_seconds() + 1
    fresh = refreshed(early.facts, at(due - 1))
    again = step(early.next, fresh, Evaluate(), at(due), DEFAULT)
    assert [r.attempt for r in requests(again)] == [2]
    assert again.decision is Decision.SHUTDOWN
    # with an inhibitor appearing meanwhile the retry is not sent and the shutdown aborts
    locked = fresh.model_copy(update={"inhibitors": inhibitors(block_lock(), when=at(due - 1))})
    blocked = step(early.next, locked, Evaluate(), at(due), DEFAULT)
    assert not requests(blocked) and blocked.next.state is PowerState.UNKNOWN
    assert R.INHIBITOR_ACTIVE in blocked.reasons


def test_retry_budget_exhausted_blocks_without_force_off() -> None:
    pol = policy(retry={"budget": 0})
    *_, sent = drive_to_shutting_down(pol)
    nak = step(sent.next, sent.facts, rejected(sent, 5), at(5), pol)
    assert nak.next.state is PowerState.BLOCKED and nak.decision is Decision.BLOCK
    assert R.RETRY_BUDGET_EXHAUSTED in nak.reasons and not requests(nak)
    closes = [a for a in nak.actions if isinstance(a, CloseTransition)]
    assert closes and closes[0].outcome == "Blocked"


def test_shutdown_deadline_resends_then_blocks() -> None:
    pol = policy(retry={"budget": 1})
    *_, sent = drive_to_shutting_down(pol)
    ack = step(sent.next, sent.facts, accepted(sent, 5), at(5), pol)
    deadline = ack.next.deadline
    assert deadline is not None
    t_s = (deadline - NOW).total_seconds()
    fresh_facts = refreshed(ack.facts, at(t_s - 1))
    resent = step(ack.next, fresh_facts, DeadlineReached(), at(t_s), pol)
    assert [r.attempt for r in requests(resent)] == [2]
    assert R.DEADLINE_EXCEEDED in resent.reasons and resent.decision is Decision.SHUTDOWN
    second_deadline = resent.next.deadline
    assert second_deadline is not None and second_deadline > deadline
    t2 = (second_deadline - NOW).total_seconds()
    final = step(resent.next, resent.facts, DeadlineReached(), at(t2), pol)
    assert final.next.state is PowerState.BLOCKED
    assert R.DEADLINE_EXCEEDED in final.reasons and R.RETRY_BUDGET_EXHAUSTED in final.reasons


def test_force_off_only_with_permitted_override_and_recorded() -> None:
    pol = policy(
        retry={"budget": 0},
        allowedActions=["On", "GracefulShutdown", "ForceOff"],
        inhibitorOverride={"permitted": True, "permitForceOff": True},
    )
    override = intent("Shutdown", force_off=True)
    *_, sent = drive_to_shutting_down(pol, intent=override)
    assert sent.next.transition is not None and sent.next.transition.origin == "Manual"
    nak = step(sent.next, sent.facts, rejected(sent, 5), at(5), pol)
    [force] = requests(nak)
    assert force.action == "ForceOff" and force.override_intent == "manual-1"
    assert nak.decision is Decision.SHUTDOWN and R.OVERRIDE_APPLIED in nak.reasons
    assert nak.record is not None and nak.record.manual_override is not None
    assert "forceOff" in nak.record.manual_override.applied
    assert nak.record.manual_override.justification.startswith("maintenance")


def test_no_force_off_for_policy_shutdowns_even_if_policy_permits_it() -> None:
    pol = policy(
        retry={"budget": 0},
        allowedActions=["On", "GracefulShutdown", "ForceOff"],
        inhibitorOverride={"permitted": True, "permitForceOff": True},
    )
    *_, sent = drive_to_shutting_down(pol)
    nak = step(sent.next, sent.facts, rejected(sent, 5), at(5), pol)
    assert not requests(nak) and nak.next.state is PowerState.BLOCKED


def test_stale_request_outcomes_are_ignored() -> None:
    *_, sent = drive_to_shutting_down(DEFAULT)
    t = sent.next.transition
    assert t is not None
    wrong = RequestAccepted(
        transition_id="shutdown-other",
        attempt=1,
        action="GracefulShutdown",
        at=at(5),
        source="redfish",
    )
    result = step(sent.next, sent.facts, wrong, at(5), DEFAULT)
    assert R.STALE_EVENT_IGNORED in result.reasons
    assert result.next.transition is not None and result.next.transition.request is not None
    assert result.next.transition.request.status is RequestStatus.IN_FLIGHT
    ack = step(sent.next, sent.facts, accepted(sent, 5), at(5), DEFAULT)
    duplicate = step(ack.next, ack.facts, rejected(sent, 6), at(6), DEFAULT)
    assert R.STALE_EVENT_IGNORED in duplicate.reasons
    assert duplicate.next.transition is not None and duplicate.next.transition.retries_used == 0


def test_drain_deadline_aborts_and_reverifies() -> None:
    _first, second = drive_to_shutting_down(DEFAULT)[:2]
    busy = second.facts.model_copy(update={"work": work(active=1, when=at(7000))})
    late = step(second.next, busy, DeadlineReached(), at(7201), DEFAULT)
    assert late.next.state is PowerState.UNKNOWN and late.decision is Decision.DEFER
    assert R.DEADLINE_EXCEEDED in late.reasons and not requests(late)


def test_inhibitor_appearing_during_drain_aborts_without_race_flag() -> None:
    _first, second = drive_to_shutting_down(DEFAULT)[:2]
    locked = second.facts.model_copy(
        update={"inhibitors": inhibitors(block_lock(), when=at(3)), "work": work(when=at(3))}
    )
    result = step(second.next, locked, Evaluate(), at(3), DEFAULT)
    assert result.next.state is PowerState.UNKNOWN and not result.next.race
    assert result.decision is Decision.BLOCK and R.INHIBITOR_ACTIVE in result.reasons


def test_policy_becoming_invalid_aborts_a_drain() -> None:
    _first, second = drive_to_shutting_down(DEFAULT)[:2]
    bad = policy(retry={"initialBackoff": "10m", "maxBackoff": "1m"})
    result = step(second.next, second.facts, PolicyChanged(), at(3), bad)
    assert result.next.state is PowerState.UNKNOWN and R.POLICY_INVALID in result.reasons
    assert result.record is not None and result.record.policy == bad.version


# -- wake flow ---------------------------------------------------------------------------------


def wake_requested(pol: PolicyView = DEFAULT) -> Step:
    result = step(off_state(), off_facts(), Evaluate(), NOW, pol)
    assert result.decision is Decision.START and result.next.state is PowerState.WAKING
    return result


def test_wake_flow_opens_admission_only_after_on_and_ready() -> None:
    sent, ack, on, ready_step = baseline_wake(DEFAULT)
    assert sent.decision is Decision.START and sent.next.state is PowerState.WAKING
    [request] = requests(sent)
    assert request.action == "On" and sent.next.admission is AdmissionState.CLOSED
    assert ack.decision is Decision.DEFER and R.CONFIRMATION_PENDING in ack.reasons
    assert on.decision is Decision.DEFER and R.POWER_ON_CONFIRMED in on.reasons
    assert on.next.admission is AdmissionState.CLOSED and any(
        isinstance(a, RunReadyProbe) for a in on.actions
    )
    assert (
        ready_step.decision is Decision.START and ready_step.next.admission is AdmissionState.OPEN
    )
    assert any(isinstance(a, OpenAdmission) for a in ready_step.actions)
    assert ready_step.next.on_since == at(60) and ready_step.next.last_transition_at == at(90)


def test_wake_acknowledged_without_passing_ready_probe_is_not_start() -> None:
    steps = baseline_wake(DEFAULT, ready_passes=False)[1:]
    for s in steps:
        assert s.decision is not Decision.START
        assert s.next.admission is not AdmissionState.OPEN
    assert R.READY_PROBE_FAILED in steps[-1].reasons


def test_wake_ready_probe_failing_past_deadline_blocks_and_never_binds() -> None:
    pol = policy(retry={"budget": 1}, deadlines={"ready": "5m"})
    sent = wake_requested(pol)
    events: list[tuple[float, object]] = [(1, accepted(sent, 1)), (60, observed("On", 60))]
    events += [(60 + 30 * i, probed(False, 60 + 30 * i)) for i in range(1, 25)]
    events += [(60 + 300, DeadlineReached()), (60 + 300 + 301, DeadlineReached())]
    events.sort(key=lambda e: e[0])
    steps = run(sent.next, sent.facts, pol, *events)
    for s in steps:
        assert s.decision is not Decision.START
        assert s.next.admission is not AdmissionState.OPEN
        assert not any(isinstance(a, OpenAdmission) for a in s.actions)
    assert steps[-1].next.state is PowerState.BLOCKED
    assert R.DEADLINE_EXCEEDED in steps[-1].reasons and R.READY_PROBE_FAILED in steps[-1].reasons


def test_wake_power_on_observed_before_request_does_not_count() -> None:
    sent = wake_requested()
    result = step(sent.next, sent.facts, observed("On", -1), at(2), DEFAULT)
    assert result.next.transition is not None and result.next.transition.power_on_seen_at is None


def test_wake_rejected_is_retried_with_backoff_then_blocked() -> None:
    pol = policy(retry={"budget": 1})
    sent = wake_requested(pol)
    nak = step(sent.next, sent.facts, rejected(sent, 1), at(1), pol)
    t = nak.next.transition
    assert nak.next.state is PowerState.WAKING and t is not None and t.next_attempt_at is not None
    due = (t.next_attempt_at - NOW).total_seconds()
    again = step(nak.next, nak.facts, Evaluate(), at(due), pol)
    assert [r.attempt for r in requests(again)] == [2]
    nak2 = step(again.next, again.facts, rejected(again, due + 1), at(due + 1), pol)
    assert nak2.next.state is PowerState.BLOCKED and R.RETRY_BUDGET_EXHAUSTED in nak2.reasons


def test_wake_confirmation_deadline_resends_on() -> None:
    pol = policy(retry={"budget": 2})
    sent = wake_requested(pol)
    ack = step(sent.next, sent.facts, accepted(sent, 1), at(1), pol)
    late = step(ack.next, ack.facts, DeadlineReached(), at(601), pol)
    assert [r.attempt for r in requests(late)] == [2] and late.decision is Decision.DEFER
    assert R.DEADLINE_EXCEEDED in late.reasons and late.next.state is PowerState.WAKING


def test_off_node_waits_for_min_off() -> None:
    result = step(
        off_state(off_since=at(-60), last_transition_at=at(-60)),
        off_facts(),
        Evaluate(),
        NOW,
        DEFAULT,
    )
    assert result.next.state is PowerState.OFF and result.decision is Decision.DEFER
    assert not requests(result)
    assert any(
        isinstance(a, ScheduleRecheck) and a.at == at(-60) + timedelta(minutes=10)
        for a in result.actions
    )


def test_off_node_unexpectedly_on_is_reverified() -> None:
    result = step(off_state(), off_facts(), observed("On", 1), at(1), DEFAULT)
    assert result.next.state is PowerState.UNKNOWN and R.UNEXPECTED_POWER_CHANGE in result.reasons


# -- on states -----------------------------------------------------------------------------------


def test_ready_probe_failure_closes_admission() -> None:
    result = step(on_state(), idle_facts(), probed(False, 1), at(1), DEFAULT)
    assert result.next.state is PowerState.UNKNOWN
    assert result.next.admission is AdmissionState.CLOSING
    assert any(isinstance(a, CloseAdmission) for a in result.actions)


def test_unexpected_power_off_closes_admission_and_records_off() -> None:
    result = step(on_state(), idle_facts(), observed("Off", 1), at(1), DEFAULT)
    assert result.next.state is PowerState.OFF and result.next.admission is AdmissionState.CLOSED
    assert R.UNEXPECTED_POWER_CHANGE in result.reasons
    assert any(isinstance(a, CloseAdmission) for a in result.actions)


def test_busy_node_is_active_and_stays_on() -> None:
    result = step(on_state(), idle_facts(work=work(active=3)), Evaluate(), NOW, DEFAULT)
    assert result.next.state is PowerState.ACTIVE and result.decision is Decision.NONE
    assert result.next.admission is AdmissionState.OPEN and R.ACTIVE_WORK in result.reasons


def test_hold_closes_admission_and_never_shuts_down() -> None:
    from policy_builders import desired

    result = step(
        on_state(), idle_facts(desired=desired(behavior="hold")), Evaluate(), NOW, DEFAULT
    )
    assert result.next.state is PowerState.ON_IDLE and result.decision is Decision.NONE
    assert result.next.admission is AdmissionState.CLOSING and not requests(result)
    released = step(result.next, idle_facts(), Evaluate(), at(1), DEFAULT)
    assert (
        released.next.admission is not AdmissionState.OPEN
        or released.next.state is PowerState.DRAINING
    )


def test_manual_shutdown_intent_drains_a_busy_node() -> None:
    facts = idle_facts(work=work(active=2), intent=intent("Shutdown"))
    result = step(on_state(), facts, ManualOverride(intent=intent("Shutdown")), NOW, DEFAULT)
    assert result.next.state is PowerState.DRAINING and result.decision is Decision.DRAIN
    assert result.next.transition is not None and result.next.transition.origin == "Manual"
    assert result.next.transition.intent == "manual-1"


# -- blocked -------------------------------------------------------------------------------


def blocked_state() -> Step:
    pol = policy(retry={"budget": 0})
    *_, sent = drive_to_shutting_down(pol)
    result = step(sent.next, sent.facts, rejected(sent, 5), at(5), pol)
    assert result.next.state is PowerState.BLOCKED
    return result


def test_blocked_stays_blocked_on_evaluate() -> None:
    b = blocked_state()
    again = step(b.next, b.facts, Evaluate(), at(100), DEFAULT)
    assert again.next.state is PowerState.BLOCKED and again.decision is Decision.BLOCK
    assert again.reasons == b.next.blocked_reasons and not again.actions


def test_blocked_is_left_by_a_manual_intent_or_policy_change() -> None:
    b = blocked_state()
    for event in (ManualOverride(intent=None), PolicyChanged()):
        result = step(b.next, b.facts, event, at(100), DEFAULT)
        assert result.next.state is PowerState.UNKNOWN


def test_blocked_node_observed_off_is_recorded_off() -> None:
    b = blocked_state()
    result = step(b.next, b.facts, observed("Off", 100), at(100), DEFAULT)
    assert result.next.state is PowerState.OFF


# -- model rules, ids, persistence ------------------------------------------------------------


def test_non_terminal_state_without_deadline_is_rejected() -> None:
    with pytest.raises(ValueError, match="needs a transition with a deadline"):
        NodePowerState(node=NODE, state=PowerState.WAKING, seq=3)


def test_admission_open_outside_on_states_is_rejected() -> None:
    with pytest.raises(ValueError, match="admission cannot be Open"):
        NodePowerState(node=NODE, state=PowerState.OFF, admission=AdmissionState.OPEN)


def test_api_mappings_cover_every_state() -> None:
    from typing import get_args

    from nodewarden.api.workernode import NodeState
    from nodewarden.policy.state import api_admission, api_state

    assert {api_state(s) for s in PowerState} <= set(get_args(NodeState))
    assert len({api_state(s) for s in PowerState}) == len(PowerState)
    assert api_admission(AdmissionState.OPEN) == "Open"
    assert api_admission(AdmissionState.CLOSING) == api_admission(AdmissionState.CLOSED) == "Closed"


def test_state_round_trips_through_json() -> None:
    *_, sent = drive_to_shutting_down(DEFAULT)
    wire = json.loads(json.dumps(sent.next.model_dump(mode="json", by_alias=True)))
    assert "admissionSince" in wire and wire["transition"]["kind"] == "Shutdown"
    assert NodePowerState.model_validate(wire) == sent.next


def test_transition_ids_are_deterministic_and_dns_safe() -> None:
    a = transition_id(NODE, TransitionKind.SHUTDOWN, NOW, 3)
    assert a == transition_id(NODE, TransitionKind.SHUTDOWN, NOW, 3)
    assert a != transition_id(NODE, TransitionKind.SHUTDOWN, NOW, 4)
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", a) and len(a) < 64


def test_backoff_is_deterministic_bounded_and_grows() -> None:
    pol = policy(
        retry={"initialBackoff": "10s", "maxBackoff": "5m", "multiplier": 2.0, "jitter": 0.2}
    )
    delays = [backoff_delay(n, pol, "t-1").total_seconds() for n in range(1, 12)]
    assert delays == [backoff_delay(n, pol, "t-1").total_seconds() for n in range(1, 12)]
    for n, d in enumerate(delays, start=1):
        base = min(300.0, 10.0 * 2 ** (n - 1))
        assert base * 0.8 - 1e-9 <= d <= min(base * 1.2, 300.0) + 1e-9
    assert delays[-1] <= 300.0 and delays[3] > delays[0]
    assert {round(jitter_fraction(f"t-{i}", 1), 6) for i in range(50)} != {0.5}
    with pytest.raises(ValueError):
        backoff_delay(0, pol, "t-1")


def test_step_rejects_naive_clock_and_foreign_facts() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        step(on_state(), idle_facts(), Evaluate(), NOW.replace(tzinfo=None), DEFAULT)
    with pytest.raises(ValueError, match="facts are for node"):
        step(on_state(), idle_facts(node="other"), Evaluate(), NOW, DEFAULT)


def test_step_does_not_mutate_its_inputs() -> None:
    state, facts = on_state(), idle_facts()
    before = (state.model_dump(), facts.model_dump())
    step(state, facts, NewDemand(reading=demand(1, when=at(1))), at(1), DEFAULT)
    assert (state.model_dump(), facts.model_dump()) == before


def test_every_step_has_a_record_naming_the_policy_version() -> None:
    for s in drive_to_shutting_down(DEFAULT):
        assert s.record is not None and s.record.policy == DEFAULT.version
        assert s.record.decision is s.decision and s.record.reasons == s.reasons


def test_capability_missing_on_retry_blocks_wake() -> None:
    pol = policy(retry={"budget": 2})
    sent = wake_requested(pol)
    nak = step(sent.next, sent.facts, rejected(sent, 1), at(1), pol)
    t = nak.next.transition
    assert t is not None and t.next_attempt_at is not None
    broken = nak.facts.model_copy(update={"capability": capability("Redfish", None)})
    result = step(nak.next, broken, Evaluate(), t.next_attempt_at, pol)
    assert result.next.state is PowerState.BLOCKED and not requests(result)
    assert R.POWER_CONTROL_UNAVAILABLE in result.reasons
    assert ready(True).passed  # builder sanity


def test_refused_credentials_block_at_once_and_a_fix_re_verifies() -> None:
    from nodewarden.policy.facts import CapabilityReading

    refused = CapabilityReading(
        source="credentials",
        observed_at=at(-1),
        control_method="Redfish",
        refusal="spec.bmc.endpoint: bmc.lab.example:443 is not an admitted BMC endpoint",
    )
    facts = NodeFacts(node=NODE, capability=refused)
    first = step(NodePowerState.initial(NODE), facts, Evaluate(), NOW, policy())
    assert first.next.state is PowerState.BLOCKED
    assert first.reasons[:2] == (R.CREDENTIALS_REFUSED, R.POWER_CONTROL_UNAVAILABLE)
    assert not any(isinstance(a, RequestPower) for a in first.actions)
    fixed = facts.model_copy(update={"capability": capability()})
    again = step(first.next, fixed, Evaluate(), NOW, policy())
    assert again.next.state is PowerState.UNKNOWN and again.decision is Decision.DEFER
