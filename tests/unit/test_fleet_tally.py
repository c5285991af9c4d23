"""`FleetTally` keeps, node by node, exactly the counts `fleet_readings` makes of the
whole fleet: any sequence of joins, state changes, policy moves and departures."""

from __future__ import annotations

from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_power_demand import shutting_down

from nodewarden.policy.state import AdmissionState, NodePowerState, PowerState, api_admission
from nodewarden.rules.fleet import FleetTally, fleet_readings, warm_idle
from policy.policy_builders import NOW

POLICIES = (None, "gpu", "batch")
TYPES = ("SideNode", "CloudVM")
STATES = ("idle", "active", "off", "shutting_down", "unknown")


def _state(name: str, kind: str) -> NodePowerState:
    if kind == "shutting_down":
        return shutting_down(name)
    if kind == "unknown":
        return NodePowerState.initial(name)
    power = {"idle": PowerState.ON_IDLE, "active": PowerState.ACTIVE, "off": PowerState.OFF}[kind]
    return NodePowerState.initial(name).model_copy(
        update={"state": power, "admission": AdmissionState.OPEN}
    )


Fleet = dict[str, tuple[str | None, str, NodePowerState]]


def _apply(tally: FleetTally, fleet: Fleet, one: tuple[str, str | None, str, str]) -> None:
    """One change to the tally and to the fleet it must match."""
    name, policy, node_type, kind = one
    if policy == "gone":
        tally.forget(name)
        fleet.pop(name, None)
    else:
        state = _state(name, kind)
        tally.set(name, policy, node_type, state)
        fleet[name] = (policy, node_type, state)


change = st.tuples(
    st.sampled_from([f"n{i}" for i in range(6)]),
    st.sampled_from((*POLICIES, "gone")),
    st.sampled_from(TYPES),
    st.sampled_from(STATES),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(change, max_size=40))
def test_the_tally_equals_a_recount_after_every_change(
    changes: list[tuple[str, str | None, str, str]],
) -> None:
    tally = FleetTally()
    fleet: Fleet = {}
    for one in changes:
        _apply(tally, fleet, one)
        assert tally.readings(NOW) == fleet_readings(fleet.values(), NOW)


@settings(max_examples=200, deadline=None)
@given(st.lists(change, max_size=40))
def test_each_policys_reading_equals_a_recount_after_every_change(
    changes: list[tuple[str, str | None, str, str]],
) -> None:
    """`reading` hands out the last reading it made while the counts and the clock reading
    stay the same: after any change it must still be the recount's."""
    tally = FleetTally()
    fleet: Fleet = {}
    for one in changes:
        _apply(tally, fleet, one)
        recount = fleet_readings(fleet.values(), NOW)
        for key in POLICIES:
            assert tally.reading(key, NOW) == recount.get(key)


def test_a_reading_is_made_once_per_clock_reading_while_the_counts_stay() -> None:
    tally = FleetTally()
    tally.set("a", None, "SideNode", _state("a", "idle"))
    first = tally.reading(None, NOW)
    assert tally.reading(None, NOW) is first
    later = NOW + timedelta(seconds=1)
    moved = tally.reading(None, later)
    assert moved is not first and moved is not None and moved.observed_at == later
    tally.set("b", None, "SideNode", _state("b", "idle"))
    grown = tally.reading(None, later)
    assert grown is not None and grown.warm_idle_nodes == 2 and moved.warm_idle_nodes == 1


@pytest.mark.parametrize("power", list(PowerState))
@pytest.mark.parametrize("admission", list(AdmissionState))
def test_warm_idle_is_on_idle_with_api_admission_open(
    power: PowerState, admission: AdmissionState
) -> None:
    state = NodePowerState.initial("a").model_construct(
        **{**NodePowerState.initial("a").__dict__, "state": power, "admission": admission}
    )
    expected = power is PowerState.ON_IDLE and api_admission(admission) == "Open"
    assert warm_idle(state) is expected
