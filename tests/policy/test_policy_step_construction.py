"""The state machine's unvalidated constructions equal validated ones.

`machine.step` builds the next `NodePowerState` without re-validating it (`base.trusted`,
the invariants checked by `state.check_invariants`), emits the frequent actions from
`actions.schedule_recheck` / `reread_demand` / `refresh_facts` and shared constants, and
`events.apply_event` merges readings with `base.replaced` instead of `model_copy`, and
transitions and their requests are opened with `state.new_transition` / `new_request`. Over
random walks through the state machine (the walks of test_policy_record_construction:
every state, requests, retries, overrides, races, cloud VMs), every next state, action and
merged facts must survive a full pydantic validation round trip unchanged.
"""

from __future__ import annotations

import hashlib
import itertools
import random
import typing
from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from policy_builders import NOW, idle_facts, off_facts, off_state, on_state
from pydantic import BaseModel
from test_policy_record_construction import POLICIES, _event, _healthy, _refresh

from nodewarden.policy.actions import (
    ACTION_TYPES,
    POLL_OBSERVED_POWER,
    Action,
    CloseTransition,
    OpenTransition,
    describe,
    refresh_facts,
    request_power,
    reread_demand,
    schedule_recheck,
)
from nodewarden.policy.base import replaced
from nodewarden.policy.events import AdmissionClosed, Evaluate, Event, PolicyChanged
from nodewarden.policy.facts import DemandReading, FleetReading, NodeFacts
from nodewarden.policy.gateblocks import _fleet_gate, fleet_gate
from nodewarden.policy.machine import Step, step
from nodewarden.policy.state import (
    AdmissionState,
    NodePowerState,
    PowerRequest,
    PowerState,
    Transition,
    TransitionKind,
    check_invariants,
    new_request,
    new_transition,
)
from nodewarden.policy.states.context import transition_id
from nodewarden.policy.timing import cooldown


def _validated(model: BaseModel) -> BaseModel:
    return type(model).model_validate(model.model_dump())


def assert_valid_step(result: Step) -> None:
    again = _validated(result.next)
    assert again == result.next
    assert again.model_dump(mode="json") == result.next.model_dump(mode="json")
    assert list(result.next.__dict__) == list(NodePowerState.model_fields)
    assert _validated(result.facts) == result.facts
    for action in result.actions:
        assert _validated(action) == action, action
        assert list(action.__dict__) == list(type(action).model_fields)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(min_value=0, max_value=2**32 - 1), start=st.sampled_from(["on", "off"]))
def test_every_step_builds_what_validation_builds(seed: int, start: str) -> None:
    rng = random.Random(seed)
    pol = rng.choice(POLICIES)
    state, facts = (on_state(), idle_facts()) if start == "on" else (off_state(), off_facts())
    now = NOW
    for _ in range(20):
        now += timedelta(seconds=rng.choice([1, 5, 61, 301, 1801]))
        facts = _refresh(rng, facts, now)
        plan: list[Event]
        if rng.random() < 0.3:
            plan = [Evaluate(), AdmissionClosed(at=now + timedelta(seconds=1))]
            facts = _healthy(rng, facts, now)
        else:
            plan = [_event(rng, state, now)]
        for event in plan:
            if isinstance(event, PolicyChanged):
                pol = rng.choice(POLICIES)
            result = step(state, facts, event, now, pol)
            assert_valid_step(result)
            state, facts = result.next, result.facts
            now += timedelta(seconds=1)


def test_check_invariants_rejects_what_the_validator_rejects() -> None:
    with pytest.raises(ValueError, match="needs a transition"):
        check_invariants(PowerState.DRAINING, None, 3, AdmissionState.CLOSED)
    with pytest.raises(ValueError, match="cannot be Open"):
        check_invariants(PowerState.OFF, None, 3, AdmissionState.OPEN)
    check_invariants(PowerState.UNKNOWN, None, 0, AdmissionState.CLOSED)  # the initial state
    with pytest.raises(ValueError, match="cannot be Open"):
        NodePowerState(node="n", state=PowerState.OFF, admission=AdmissionState.OPEN)


def test_replaced_is_model_copy() -> None:
    facts = NodeFacts(node="n-1", demand=DemandReading(source="q", observed_at=NOW, queued=1))
    demand = DemandReading(source="q", observed_at=NOW + timedelta(seconds=1), queued=0)
    fast = replaced(facts, {"demand": demand, "work": None})
    copied = facts.model_copy(update={"demand": demand, "work": None})
    assert fast == copied and type(fast) is NodeFacts
    assert list(fast.__dict__) == list(copied.__dict__)
    assert fast.model_fields_set == copied.model_fields_set == {"node", "demand", "work"}
    assert fast.model_dump(exclude_unset=True) == copied.model_dump(exclude_unset=True)
    assert fast.__pydantic_extra__ is None and fast.__pydantic_private__ is None
    assert facts.demand is not None and facts.demand.queued == 1  # the original is untouched


def test_the_shared_never_transitioned_cooldown_measure_is_not_changed() -> None:
    pol = POLICIES[1]
    first = cooldown(None, NOW, pol, [], [], [])
    state = on_state()
    for _ in range(3):
        result = step(state, idle_facts(), Evaluate(), NOW + timedelta(minutes=30), pol)
        state = result.next
    again = cooldown(None, NOW, pol, [], [], [])
    assert again is first
    assert (again.name, again.required, again.measured, again.since, again.met) == (
        "cooldown",
        60.0,
        None,
        None,
        True,
    )


def test_transition_ids_follow_the_documented_formula_in_any_zone() -> None:
    def by_formula(node: str, kind: TransitionKind, now: datetime, seq: int) -> str:
        text = f"{node}|{kind.value}|{now.isoformat()}|{seq}"
        digest = hashlib.sha256(text.encode()).hexdigest()
        return f"{kind.value.lower()}-{now.astimezone(UTC):%Y%m%d-%H%M%S}-{digest[:8]}"

    plus_two = NOW.astimezone(timezone(timedelta(hours=2)))
    ids = set()
    for now in (NOW, plus_two, NOW, NOW + timedelta(microseconds=1)):
        for kind in TransitionKind:
            tid = transition_id("node-1", kind, now, 7)
            assert tid == by_formula("node-1", kind, now, 7)
            ids.add(tid)
    assert len(ids) == 3 * len(TransitionKind)  # the same instant in +02:00 hashes otherwise


def test_models_built_without_validation_copy_like_validated_ones() -> None:
    """model_copy(update=...) adds to the copy's fields-set: a trusted model's (every
    field, shared) takes that (the machine copies transitions it opened, and requests)."""
    opened = new_transition(id="t-1", kind=TransitionKind.WAKE, started_at=NOW, deadline=NOW)
    validated = Transition(id="t-1", kind=TransitionKind.WAKE, started_at=NOW, deadline=NOW)
    assert opened == validated
    later = NOW + timedelta(seconds=1)
    assert opened.model_copy(update={"deadline": later}) == validated.model_copy(
        update={"deadline": later}
    )
    assert opened.model_fields_set == set(Transition.model_fields)
    assert opened.model_copy(update={"deadline": later}, deep=True).deadline == later
    with pytest.raises(ValueError, match="not fields"):
        opened.model_fields_set.update({"no_such_field"})  # type: ignore[attr-defined]
    request = new_request("On", 1, NOW)
    assert request == PowerRequest(action="On", attempt=1, requested_at=NOW)
    assert request.model_copy(update={"detail": "x"}).detail == "x"


def _subclasses(cls: type) -> list[type]:
    found = list(cls.__subclasses__())
    for sub in cls.__subclasses__():
        found += _subclasses(sub)
    return found


def test_action_and_event_models_have_no_subclasses_the_exact_type_checks_would_miss() -> None:
    """The step tells actions and events apart by exact type (`type(a) is X`, cheaper than
    a failing isinstance against a pydantic model): a subclass would slip past it."""
    events = typing.get_args(typing.get_args(Event)[0])
    assert len(events) == 12 and len(ACTION_TYPES) == len(
        typing.get_args(typing.get_args(Action)[0])
    )
    for model in (*ACTION_TYPES, *events):
        assert _subclasses(model) == [], model
    assert set(typing.get_args(typing.get_args(Action)[0])) == set(ACTION_TYPES)


def test_describe_names_every_action_as_before() -> None:
    at = NOW + timedelta(seconds=90)
    assert [
        describe(a)
        for a in (
            schedule_recheck(at, "DEFER"),
            request_power("wake-1", "On", 2),
            refresh_facts(("work", "inhibitors")),
            CloseTransition(transition_id="t", kind=TransitionKind.WAKE, outcome="Aborted"),
            OpenTransition(
                transition_id="t", kind=TransitionKind.SHUTDOWN, origin="Policy", deadline=at
            ),
            POLL_OBSERVED_POWER,
            reread_demand(None),
        )
    ] == [
        f"ScheduleRecheck({at.isoformat()})",
        "RequestPower(On, attempt 2)",
        "RefreshFacts(work,inhibitors)",
        "CloseTransition(Wake, Aborted)",
        "OpenTransition(Shutdown)",
        "PollObservedPower",
        "RereadDemand",
    ]


def test_the_fleet_gate_kept_for_a_reading_is_the_one_computed_for_its_inputs() -> None:
    """`fleet_gate` keeps its results for the last reading per policy: every combination
    of flags and node (counted as warm idle or not) still gets its own result, and a new
    reading, even an equal one, is judged afresh."""
    fleet = FleetReading(
        source="fleet",
        observed_at=NOW,
        transitions_in_progress=2,
        warm_idle_nodes=1,
        node_class="gpu",
        class_warm_idle=1,
        warm_target=1,
        warm_lever="WarmWindow",
        warm_why="window",
    )
    pol = replace(POLICIES[0], max_concurrent_transitions=2, min_warm_nodes=1)
    idle, busy = on_state(), on_state().model_copy(update={"state": PowerState.ACTIVE})
    for reading in (fleet, fleet.model_copy(), fleet.model_copy(update={"warm_idle_nodes": 3})):
        for _ in range(2):  # computed, then kept
            for flags in itertools.product((False, True), repeat=3):
                for state in (idle, busy, None):
                    own, warm, budget = flags
                    got = fleet_gate(reading, pol, own, warm, budget, state)
                    counted = state is idle
                    assert got == _fleet_gate(reading, pol, own, warm, budget, counted)
    kept = fleet_gate(fleet, pol, False, True, True, idle)
    assert fleet_gate(fleet, pol, False, True, True, idle) is kept
    assert fleet_gate(fleet, pol, False, True, True, busy) != kept  # one warm node fewer
