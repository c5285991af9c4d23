"""Why not yet, pure (issue 27): a node's eligibility from one step (`policy.eligibility`)
and a policy's in-force summary (`rules.inforce`), with no shell."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import yaml
from policy_builders import NOW, at, idle_facts, off_facts, off_state, on_state, policy, work

from nodewarden.api.inforce import PolicyInForce
from nodewarden.api.powerpolicy import PowerPolicySpec
from nodewarden.explain import result_document
from nodewarden.policy.eligibility import eligibility, to_status
from nodewarden.policy.events import Evaluate
from nodewarden.policy.machine import step
from nodewarden.policy.reasons import R
from nodewarden.policy.scenario import load_scenario, run_scenario
from nodewarden.policy.state import PowerState, Transition, TransitionKind
from nodewarden.rules.inforce import in_force, member

SCENARIOS = Path(__file__).parents[2] / "examples" / "scenarios"


def test_a_node_idle_for_less_than_the_threshold_is_eligible_when_it_has_been_idle_long_enough() -> (
    None
):
    pol = policy(idleThreshold="10m", minOn="0s", cooldown="0s")
    facts = idle_facts(work=work(idle_for=120))
    e = eligibility(step(on_state(), facts, Evaluate(), NOW, pol), pol)
    assert e.direction == "Shutdown" and e.held_by is R.IDLE_WINDOW_NOT_MET
    assert facts.work is not None and facts.work.idle_since is not None
    assert e.eligible_at == e.held_until == facts.work.idle_since + timedelta(minutes=10)
    later = step(on_state(), facts, Evaluate(), at(60), pol)
    assert eligibility(later, pol).eligible_at == e.eligible_at  # a time, not a countdown
    assert to_status(e)["idleThreshold"] == "10m"


def test_min_on_holds_after_the_idle_threshold_and_says_until_when() -> None:
    pol = policy(idleThreshold="1m", minOn="1h", cooldown="0s")
    state = on_state(on_since=at(-600), last_transition_at=at(-600))
    facts = idle_facts(uptime=None)
    e = eligibility(step(state, facts, Evaluate(), NOW, pol), pol)
    assert e.held_by is R.MIN_ON_NOT_MET
    assert e.held_until == e.eligible_at == at(-600) + timedelta(hours=1)


def test_a_busy_node_has_no_eligibility_time_and_an_eligible_one_is_held_by_nothing() -> None:
    pol = policy(idleThreshold="1m", minOn="0s", cooldown="0s")
    busy = step(
        on_state(state=PowerState.ACTIVE), idle_facts(work=work(active=2)), Evaluate(), NOW, pol
    )
    e = eligibility(busy, pol)
    assert e.eligible_at is None and e.held_by is not None
    drain = eligibility(step(on_state(), idle_facts(), Evaluate(), NOW, pol), pol)
    # the drain begins now: what holds the shutdown is the drain itself
    assert drain.decision.value == "DRAIN" and drain.held_by is R.ADMISSION_OPEN
    assert drain.eligible_at is not None and drain.eligible_at <= NOW


def test_an_off_node_waits_for_demand_and_then_for_min_off() -> None:
    pol = policy(minOff="30m", cooldown="0s")
    idle = eligibility(step(off_state(), off_facts(demand=None), Evaluate(), NOW, pol), pol)
    assert idle.direction == "Wake" and idle.held_by is not None
    wanted = step(off_state(off_since=at(-60)), off_facts(), Evaluate(), NOW, pol)
    e = eligibility(wanted, pol)
    assert e.held_by is R.MIN_OFF_NOT_MET and e.held_until == at(-60) + timedelta(minutes=30)


def _spec(**extra: object) -> PowerPolicySpec:
    return PowerPolicySpec.model_validate(
        {
            "nodeClasses": [{"name": "gpu", "nodeType": "SideNode", "namePrefix": "gpu"}],
            "warmCapacity": {
                "windows": [
                    {"name": "night", "nodeClass": "gpu", "minWarm": 2, "days": ["Fri"],
                     "start": "22:00", "end": "06:00", "timeZone": "Europe/Berlin"},
                ]
            },
            "disruptionBudget": {"maxConcurrentTransitions": 1},
            **extra,
        }
    )  # fmt: skip


def test_the_policy_in_force_names_the_open_window_and_its_next_boundary_in_utc() -> None:
    friday_night = datetime(2027, 1, 8, 23, 30, tzinfo=UTC)  # 00:30 Saturday in Berlin
    waking = off_state(
        state=PowerState.WAKING,
        transition=Transition(
            id="t-1", kind=TransitionKind.WAKE, started_at=friday_night, deadline=friday_night
        ),
    )
    members = [
        member("gpu", "SideNode", on_state()),
        member("gpu", "SideNode", waking),
        member(None, "CloudVM", off_state()),
    ]
    shown = in_force(_spec(), members, friday_night)
    PolicyInForce.model_validate(shown.status)  # the CRD's shape
    s = shown.status
    assert s["window"] == "night" and s["classes"][0]["minWarm"] == 2
    assert s["nextChangeAt"] == "2027-01-09T05:00:00Z" and s["nextChange"] == "window closes (gpu)"
    assert shown.next_change == datetime(2027, 1, 9, 5, 0, tzinfo=UTC)
    assert s["nodes"] == {"total": 3, "on": 1, "off": 1, "transitioning": 1, "unknown": 0}
    assert s["disruptionBudget"] == {"max": 1, "inUse": 1, "left": 0}
    assert [c["name"] for c in s["classes"]] == ["gpu", "(all)"]
    # consolidation by drain starts in Shadow: its own budget, apart from the transitions'
    assert s["consolidationBudget"] == {"max": 1, "inUse": 0, "left": 1}


def test_the_consolidation_budget_in_force_counts_the_nodes_draining_and_is_none_when_off() -> None:
    now = datetime(2027, 1, 6, 12, tzinfo=UTC)
    on = _spec(consolidation={"mode": "On", "maxConcurrent": 2})
    shown = in_force(on, [], now, consolidating=1).status
    PolicyInForce.model_validate(shown)
    assert shown["consolidationBudget"] == {"max": 2, "inUse": 1, "left": 1}
    assert in_force(on, [], now, consolidating=3).status["consolidationBudget"]["left"] == 0
    off = _spec(consolidation={"mode": "Off"})
    assert in_force(off, [], now, consolidating=0).status["consolidationBudget"] is None


def test_forecast_state_and_mode_in_force() -> None:
    spec = _spec(forecastWake={"mode": "Shadow", "minDays": 3}, paused=True)
    now = datetime(2027, 1, 6, 12, tzinfo=UTC)
    assert in_force(spec, [], now, forecast_days=1.5).status["forecast"] == "Learning"
    assert in_force(spec, [], now, forecast_days=3.0).status["forecast"] == "Shadow"
    assert in_force(spec, [], now).status["mode"] == "Paused"
    hourly = _spec(billing={"period": "1h", "windowStart": "50m", "windowEnd": "1h"})
    assert in_force(hourly, [], now).status["billingWindow"].startswith("50m-1h of each 1h")


def test_every_example_scenario_explains_its_eligibility_with_its_first_blocking_reason() -> None:
    """`nodewarden explain --scenario`: the document's eligibility comes from the same code
    as status, and its heldBy is the first reason of a decision that does not act."""
    found = sorted(SCENARIOS.glob("*.yaml"))
    assert len(found) >= 10
    held = set()
    for path in found:
        scenario, pol = load_scenario(yaml.safe_load(path.read_text()))
        doc = result_document(run_scenario(scenario, pol))
        acts = doc["decision"] in ("SHUTDOWN", "START")
        first = None if acts or not doc["reasons"] else doc["reasons"][0]
        assert doc["eligibility"]["heldBy"] == first, (path.name, doc["eligibility"])
        held.add(first)
    assert {"MIN_ON_NOT_MET", "INHIBITOR_ACTIVE", "BILLING_WINDOW_CLOSED"} <= held, held
