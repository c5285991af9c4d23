"""The simulator's shell and the live power controller hand the core the same facts and
events for the same fleet: the two drifts the issue names, as parity cases.

Live side: the real `PowerController` in process (`tests/power/inproc/harness.py`: fake
clock, fake BMC and pool, the in-memory API). Simulator side: the real `Simulation`, its
nodes put in the same states. Each case builds the same fleet situation on both and
compares what each shell gives `policy.machine.step`:

- a cloud VM draining (and one being destroyed) next to side nodes: the fleet reading a
  side node is stepped with (the disruption-budget count, warm idle nodes) -- the live
  rule (`rules.fleet`) counts side-node transitions only;
- demand appearing for an idle side node: the event the shell feeds it (live: Evaluate),
  and so the event its Safety Record names.

Both cases failed on main 19404df (the simulator counted the VMs in the budget, and fed
NewDemand).
"""

from __future__ import annotations

import sys
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from nodewarden.api.powerpolicy import PowerPolicySpec
from nodewarden.policy.events import Event
from nodewarden.policy.facts import FleetReading, NodeFacts
from nodewarden.policy.machine import step
from nodewarden.policy.state import (
    AdmissionState,
    NodePowerState,
    PowerRequest,
    PowerState,
    Transition,
    TransitionKind,
)
from nodewarden.power import controller as live_controller
from nodewarden.scheduling.scheduler import ContainerView, Phase, Plan
from nodewarden.simulate.dispatching import SimContainer, container_shape
from nodewarden.simulate.engine import Simulation
from nodewarden.simulate.fleet import Fleet, load_fleet
from nodewarden.simulate.nodes import MachineNode
from nodewarden.simulate.policies import policy_from_spec
from nodewarden.simulate.trace import parse_trace

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "power" / "inproc"))
from harness import POLICY, PowerHarness

BUDGET = {**POLICY, "disruptionBudget": {"maxConcurrentTransitions": 1}}


def _sim(policy: dict[str, Any]) -> Simulation:
    fleet: Fleet = load_fleet(
        {
            "cloud": {
                "instanceTypes": [{"name": "small", "vcpus": 2, "ram": "4Gi", "price": 0.1}],
                "billing": {"period": "0s", "minimum": "0s"},
            },
            "sideNodes": [
                {
                    "name": "side-1",
                    "capacity": {"vcpus": 16, "ram": "64Gi", "gpus": 1},
                    "initialPower": "On",
                },
                {
                    "name": "side-2",
                    "capacity": {"vcpus": 16, "ram": "64Gi", "gpus": 1},
                    "initialPower": "On",
                },
            ],
        }
    )
    trace = parse_trace("arrival,runtime,vcpus,ram,gpus\n0,60,1,1Gi,1\n", "csv")
    sim = Simulation(trace, fleet, policy_from_spec(PowerPolicySpec.model_validate(policy), "p"), 1)
    for group in fleet.side_nodes:
        for name in group.names():
            sim._add_side_node(group, name)
    return sim


def _transition(name: str, kind: TransitionKind, at: datetime) -> Transition:
    request = PowerRequest(action="GracefulShutdown", attempt=1, requested_at=at)
    return Transition(
        id=f"t-{name}",
        kind=kind,
        started_at=at,
        deadline=at + timedelta(minutes=5),
        request=request,
    )


def _in(state: PowerState, name: str, at: datetime, transition: bool = True) -> NodePowerState:
    t = _transition(name, TransitionKind.SHUTDOWN, at) if transition else None
    admission = AdmissionState.OPEN if state is PowerState.ON_IDLE else AdmissionState.CLOSED
    return NodePowerState.initial(name).model_copy(
        update={"state": state, "transition": t, "admission": admission}
    )


def _counts(reading: FleetReading | None) -> tuple[int, int] | None:
    if reading is None:
        return None
    return reading.transitions_in_progress, reading.warm_idle_nodes


# -- a draining VM and the side nodes' disruption budget --------------------------------


async def _live_fleet_reading(monkeypatch: pytest.MonkeyPatch) -> tuple[int, int] | None:
    stepped: dict[str, NodeFacts] = {}
    original = step  # what the controller calls (`power.controller.step`)

    def spy(state: NodePowerState, facts: NodeFacts, event: Event, *a: Any, **k: Any) -> Any:
        stepped.setdefault(state.node, facts)
        return original(state, facts, event, *a, **k)

    async with PowerHarness(policy=BUDGET) as h:
        for name in ("side-1", "side-2"):
            h.side_node(name)
        for name in ("vm-1", "vm-2"):
            h.put_node(name, {"nodeType": "CloudVM", "instanceType": "small"})
        await h.start()
        now = h.clock()
        nodes = h.ctrl.nodes
        nodes["side-1"].state = _in(PowerState.ON_IDLE, "side-1", now, transition=False)
        nodes["side-2"].state = _in(PowerState.SHUTTING_DOWN, "side-2", now)
        nodes["vm-1"].state = _in(PowerState.DRAINING, "vm-1", now)
        nodes["vm-2"].state = _in(PowerState.SHUTTING_DOWN, "vm-2", now)
        for rt in nodes.values():
            rt.events.clear()
            rt.due_at = None
        nodes["side-1"].due_at = now
        monkeypatch.setattr(live_controller, "step", spy)
        await h.ctrl.round()
        monkeypatch.setattr(live_controller, "step", original)
        await h.settle()
    return _counts(stepped["side-1"].fleet)


def _sim_fleet_reading() -> tuple[int, int] | None:
    sim = _sim(BUDGET)
    sim._create_vm("small")
    sim._create_vm("small")
    at = sim.at(sim.now)
    states = {
        "side-1": _in(PowerState.ON_IDLE, "side-1", at, transition=False),
        "side-2": _in(PowerState.SHUTTING_DOWN, "side-2", at),
        "vm-small-0": _in(PowerState.DRAINING, "vm-small-0", at),
        "vm-small-1": _in(PowerState.SHUTTING_DOWN, "vm-small-1", at),
    }
    for name, state in states.items():
        node = sim.nodes[name]
        node.state = state.model_copy(update={"node": name})
        sim._touch(node)
    side: MachineNode = sim.nodes["side-1"]
    sim.sensing.telemetry(side, sim.now, len(sim._in_transition), len(sim._warm))
    return _counts(side.facts.fleet)


async def test_a_draining_vm_uses_none_of_the_side_nodes_disruption_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    live = await _live_fleet_reading(monkeypatch)
    assert live == (1, 1)  # side-2 shutting down; side-1 warm; the VMs count for nothing
    assert _sim_fleet_reading() == live


# -- demand for an idle side node: what the shell feeds it ------------------------------


async def _live_demand_events() -> tuple[list[str], str | None]:
    async with PowerHarness() as h:
        h.side_node("side-1")
        await h.start()
        rt = h.ctrl.nodes["side-1"]
        rt.events.clear()
        h.queue("c-1", vcpus=1, gpus=1)  # the next plan: a container side-1 can run
        events = [e.type for e in rt.events]
        result = step(rt.state, rt.facts, rt.events[0], h.clock(), h.book.for_node(None).view)
        return events, None if result.record is None else result.record.event


def _sim_demand_events() -> tuple[list[str], str | None]:
    sim = _sim(POLICY)
    node = sim.nodes["side-1"]
    node.state = _in(PowerState.ON_IDLE, "side-1", sim.at(0), transition=False)
    spec = sim.trace.containers[0]
    c = SimContainer(
        spec=spec,
        queued_view=ContainerView(
            spec.uuid, Phase.QUEUED, spec.priority, sim.at(0), spec.resources
        ),
        shape=container_shape(spec),
    )
    sim.dispatching.queued[spec.uuid] = c
    sim.dispatching.count_shape(c, 1)
    sim._heap.clear()
    sim.dispatching.update_demand(Plan())
    events: list[Event] = [
        arg[1] for _, _, _, arg in sim._heap if isinstance(arg, tuple) and arg[0] is node
    ]
    if not events:
        return [], None
    result = step(node.state, node.facts, events[0], sim.at(sim.now), sim.policy.view)
    return [e.type for e in events], None if result.record is None else result.record.event


async def test_demand_for_an_idle_side_node_is_fed_as_live_feeds_it() -> None:
    live = await _live_demand_events()
    assert live[0] == ["Evaluate"]
    assert _sim_demand_events() == live
