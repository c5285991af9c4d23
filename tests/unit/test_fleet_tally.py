"""`FleetTally` keeps, node by node, exactly the counts `fleet_readings` makes of the
whole fleet: any sequence of joins, state changes, policy moves and departures."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from test_power_demand import shutting_down

from nodewarden.policy.state import AdmissionState, NodePowerState, PowerState
from nodewarden.rules.fleet import FleetTally, fleet_readings
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
    fleet: dict[str, tuple[str | None, str, NodePowerState]] = {}
    for name, policy, node_type, kind in changes:
        if policy == "gone":
            tally.forget(name)
            fleet.pop(name, None)
        else:
            state = _state(name, kind)
            tally.set(name, policy, node_type, state)
            fleet[name] = (policy, node_type, state)
        assert tally.readings(NOW) == fleet_readings(fleet.values(), NOW)
