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
  and so the event its Safety Record names;
- one scripted side-node cycle (on and idle -> drained and off -> a container the plan
  wakes it for -> on, ready, runs it -> idle -> off again) through both, the simulator's
  physics set to the harness's host: the milestone steps (drain, shutdown, start, Off
  observed) have equal (decision, reason codes), at times within one tick (an observed
  power change within one BMC pollInterval: the simulator draws its read phase), the
  drain's second step included (the harness acknowledges a closed admission one
  `controller.apiLatency` after the close, as the simulator's dispatcher does);
- a cloud VM idle shutdown (listed, ready, idle past idleThreshold -> drained ->
  destroyed -> gone from the cloud list = Off observed), both sides with the same
  instance-type catalogue and no API latency: every step that moves the node equal
  (the drain's second step included) within one tick, and (decision, reasons, event)
  equal for the steps both are fed alike;
- a PowerPolicy edit at 30 s (idleThreshold 60 s -> 120 s): both step the node with
  PolicyChanged at once and decide alike, and drain at 120 s, not 60 s.
- the idle-since rule's input: on both, a node is idle since the first probe that saw
  it idle (an observation time), not the moment its last job ended.

The two drift cases failed on main 19404df (the simulator counted the VMs in the budget,
and fed NewDemand); the idle-since case failed on be891f4 (the simulator fed the rule
the moment the last job ended, up to one probe interval before any probe saw it).
"""

from __future__ import annotations

import sys
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from nodewarden.api.powerpolicy import PowerPolicySpec
from nodewarden.policy.events import Event, PolicyChanged
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
from nodewarden.power import round as live_controller
from nodewarden.scheduling.views import ContainerView, Phase, Plan
from nodewarden.simulate import steps as sim_steps
from nodewarden.simulate.dispatching import SimContainer, container_shape
from nodewarden.simulate.engine import Simulation
from nodewarden.simulate.fleet import Fleet, load_fleet
from nodewarden.simulate.nodes import MachineNode
from nodewarden.simulate.policies import policy_from_spec
from nodewarden.simulate.results import SimOptions
from nodewarden.simulate.trace import parse_trace

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "power" / "inproc"))
from harness import POLICY, PowerHarness
from parity_steps import Fed, fed, idle_unseen, recorded_steps, recorder, vm_fleet

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
    original = step  # what the controller calls (`power.round.step`)

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


# -- a side-node cycle off -> on -> off, the same script on both ------------------------

Milestone = tuple[int, str, tuple[str, ...]]
_PROGRESS = {"DRAIN", "SHUTDOWN", "START"}
_OBSERVED = {"POWER_OFF_CONFIRMED", "POWER_ON_CONFIRMED"}


def _headlines(seq: list[Milestone]) -> list[Milestone]:
    """Each change of (decision, reasons), with the second when it changed."""
    out: list[Milestone] = []
    for x in seq:
        if not out or out[-1][1:] != x[1:]:
            out.append(x)
    return out


def _milestones(seq: list[Milestone], second_drain_step: bool) -> list[Milestone]:
    """What moves the node: drain, shutdown, start, and Off observed (the drain's second
    step, which waits for the demand re-read, only when asked)."""
    out = []
    for t, decision, reasons in _headlines(seq):
        if decision == "DRAIN" and "ADMISSION_OPEN" not in reasons and not second_drain_step:
            continue
        if decision in _PROGRESS or "POWER_OFF_CONFIRMED" in reasons:
            out.append((t, decision, reasons))
    return out


SIM_ACK = 1.0
"""The harness acknowledges a closed admission as the simulator's dispatcher does: one
`controller.apiLatency` (1 s, `_side_fleet`'s default) after the close."""


async def _live_cycle(monkeypatch: pytest.MonkeyPatch) -> list[Milestone]:
    seen: list[Milestone] = []

    def spy(
        state: NodePowerState, facts: NodeFacts, event: Event, now: datetime, *a: Any, **k: Any
    ) -> Any:
        result = step(state, facts, event, now, *a, **k)
        if state.node == "side-1":
            t = round((now - t0).total_seconds())
            seen.append((t, result.decision.value, tuple(r.value for r in result.reasons)))
        return result

    monkeypatch.setattr(live_controller, "step", spy)
    async with PowerHarness(probe_interval=5.0, acknowledge_after=SIM_ACK) as h:
        h.side_node("side-1")  # On, idle; its BMC applies a request 5 s after accepting it
        t0 = h.clock()
        await h.start()
        await h.run_for(300)  # idle 60 s: drained and switched off
        h.queue("c-1", vcpus=1, gpus=1, wake="side-1")  # the plan waits for side-1
        state = h.ctrl.nodes["side-1"].state
        await h.run_until(lambda: state is not h.ctrl.nodes["side-1"].state and _idle(h))
        h.place("c-1", "side-1")
        h.hosts["side-1"].runners = 1
        await h.run_for(3)
        h.hosts["side-1"].runners = 0
        h.finish("c-1")
        await h.run_for(120)  # idle again: off again
    return seen


def _idle(h: PowerHarness) -> bool:
    return h.ctrl.nodes["side-1"].state.state is PowerState.ON_IDLE


def _side_fleet() -> Fleet:
    """side-1 as the harness's host: on 5 s after the request, ready 5 s later, seen by
    the next probe; off 5 s after the request."""
    return load_fleet(
        {
            "cloud": {"instanceTypes": []},
            "sideNodes": [
                {
                    "name": "side-1",
                    "capacity": {"vcpus": 16, "ram": "64Gi", "gpus": 1},
                    "initialPower": "On",
                    "boot": "12s",
                    "shutdown": "5s",
                    "bmc": {"latency": "0s", "pollInterval": "5s"},
                }
            ],
            "probe": {"interval": "5s", "bootInterval": "4s"},
        }
    )


def _sim_cycle() -> list[Milestone]:
    fleet = _side_fleet()
    trace = parse_trace(
        "arrival,runtime,vcpus,ram,gpus,priority\n"
        "0,1,1,1Gi,0,0\n"  # held (never starts): anchors the trace at 0
        "300,1,1,1Gi,1,500\n"  # the container the plan wakes side-1 for
        "600,1,1,1Gi,0,0\n",  # held: the trace goes on to 600 s
        "csv",
    )
    policy = policy_from_spec(PowerPolicySpec.model_validate(POLICY), "p")
    options = SimOptions(record=frozenset({"side-1"}))
    result = Simulation(trace, fleet, policy, 1, options).run()
    return [
        (round((s.time - trace.start).total_seconds()), s.decision.value, s.reasons)
        for s in result.recordings["side-1"].steps
    ]


def _assert_same(live: list[Milestone], sim: list[Milestone]) -> None:
    assert [m[1:] for m in sim] == [m[1:] for m in live]
    for (lt, decision, reasons), (st, _, _) in zip(live, sim, strict=True):
        # one tick (1 s); an observed power change is seen at the next BMC read, whose
        # phase the simulator draws (one pollInterval, 5 s)
        slack = 5 if _OBSERVED & set(reasons) else 1
        assert abs(lt - st) <= slack, (decision, reasons, lt, st)


async def test_a_side_node_cycle_moves_alike_live_and_simulated(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    live = _milestones(await _live_cycle(monkeypatch), second_drain_step=False)
    sim = _milestones(_sim_cycle(), second_drain_step=False)
    assert [m[1] for m in live].count("SHUTDOWN") == 2  # off, on, off again
    _assert_same(live, sim)


async def test_the_drains_second_step_is_alike_live_and_simulated(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    live = _milestones(await _live_cycle(monkeypatch), second_drain_step=True)
    _assert_same(live, _milestones(_sim_cycle(), second_drain_step=True))


# -- a cloud VM idle shutdown, the same script on both ----------------------------------


async def _live_vm(monkeypatch: pytest.MonkeyPatch) -> list[Fed]:
    seen, spy, t0 = recorder("vm1")
    monkeypatch.setattr(live_controller, "step", spy)
    async with PowerHarness(probe_interval=5.0) as h:
        t0.append(h.clock())
        # the operator's instance-type catalogue, as its cloud config gives it (the
        # harness has none): the VM's planned demand (`rules.demand.planned_demand`) is
        # read every round, as in the simulator
        h.ctrl._ctx.catalogue = vm_fleet().cloud.catalogue
        h.cloud_vm("vm1")  # listed, booted and ready at 0, idle; listed every 5 s
        await h.start()
        await h.run_until(lambda: h.state("vm1") == "Off", within=400, what="vm1 Off")
        await h.run_for(10)
        assert h.control.sent("vm1")  # destroyed once
    return seen


def _sim_vm() -> list[Fed]:
    fleet = vm_fleet()
    trace = parse_trace(
        "arrival,runtime,vcpus,ram,gpus,priority\n0,1,1,1Gi,0,0\n300,1,1,1Gi,0,0\n", "csv"
    )  # held containers: the trace spans 0..300 s, nothing runs on the VM
    policy = policy_from_spec(PowerPolicySpec.model_validate(POLICY), "p")
    sim = Simulation(trace, fleet, policy, 1, SimOptions(record=frozenset({"vm-small-0"})))
    # the harness's VM exists from the start: the dispatcher created it at 0
    sim._schedule(0, lambda _: sim._create_vm("small"), None)
    return recorded_steps(sim, "vm-small-0")


def _vm_milestones(seq: list[Fed], second: bool) -> list[Milestone]:
    return _milestones([s[:3] for s in seq], second_drain_step=second)


async def test_a_cloud_vm_idle_shutdown_moves_alike_live_and_simulated(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    live = await _live_vm(monkeypatch)
    sim = _sim_vm()
    # idle past idleThreshold -> drain (IDLE_EXCEEDED) -> destroy -> gone from the list
    lm = _vm_milestones(live, second=True)  # the drain's second step included
    assert [m[1:] for m in lm] == [
        ("START", ("READY_CONFIRMED",)),  # first seen ready
        ("DRAIN", ("ADMISSION_OPEN", "IDLE_EXCEEDED")),
        ("SHUTDOWN", ("GATES_PASSED", "IDLE_EXCEEDED")),
        ("NONE", ("POWER_OFF_CONFIRMED",)),
    ], live
    _assert_same(lm, _vm_milestones(sim, second=True))
    # with no API latency, the admission acknowledgement is fed alike too: the drain's
    # second step is the shutdown request on both
    closed = frozenset({"AdmissionClosed"})
    assert fed(sim, closed) == fed(live, closed)
    assert ("SHUTDOWN", ("GATES_PASSED", "IDLE_EXCEEDED"), "AdmissionClosed") in fed(live, closed)


# -- a PowerPolicy edit mid-scenario ----------------------------------------------------

EDIT_AT = 30
EDITED = {**POLICY, "idleThreshold": "120s"}


async def _live_edit(monkeypatch: pytest.MonkeyPatch) -> list[Fed]:
    seen, spy, t0 = recorder("side-1")
    monkeypatch.setattr(live_controller, "step", spy)
    async with PowerHarness(probe_interval=5.0, acknowledge_after=SIM_ACK) as h:
        t0.append(h.clock())
        h.side_node("side-1")
        await h.start()
        await h.run_for(EDIT_AT)
        h.set_policy("default", **EDITED)  # idleThreshold 60 s -> 120 s, at 30 s
        await h.run_until(lambda: h.state("side-1") == "Off", within=300, what="side-1 Off")
        await h.run_for(5)
    return seen


def _sim_edit() -> list[Fed]:
    fleet = _side_fleet()
    trace = parse_trace(
        "arrival,runtime,vcpus,ram,gpus,priority\n0,1,1,1Gi,0,0\n300,1,1,1Gi,0,0\n", "csv"
    )
    policy = policy_from_spec(PowerPolicySpec.model_validate(POLICY), "p")
    sim = Simulation(trace, fleet, policy, 1, SimOptions(record=frozenset({"side-1"})))

    def edit(_: object) -> None:
        # The simulator takes no policy edit mid-run: the test feeds it as the live shell
        # takes one (power.observations.observe_policy: the new version, then every node
        # under it is stepped with PolicyChanged).
        sim.policy = policy_from_spec(PowerPolicySpec.model_validate(EDITED), "p")
        for node in list(sim.nodes.values()):
            sim.machines.step(node, PolicyChanged())

    sim._schedule(EDIT_AT * 1_000_000, edit, None)
    return recorded_steps(sim, "side-1")


async def test_a_policy_edit_is_seen_at_once_and_decided_alike_live_and_simulated(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    live = await _live_edit(monkeypatch)
    sim = _sim_edit()
    for seq in (live, sim):
        # the edit re-evaluates at once, under the new threshold
        edit = [s for s in seq if s[3] == "PolicyChanged"]
        assert [e[:3] for e in edit] == [
            (EDIT_AT, "DEFER", ("IDLE_WINDOW_NOT_MET", "ADMISSION_OPEN"))
        ], seq
    lm = _milestones([s[:3] for s in live], second_drain_step=False)
    drains = [t for t, decision, _ in lm if decision == "DRAIN"]
    assert drains == [120], lm  # idle 120 s (the edited threshold), not 60 s
    _assert_same(lm, _milestones([s[:3] for s in sim], second_drain_step=False))
    assert fed(sim) == fed(live)


# -- the idle-since rule's input ---------------------------------------------------------


async def test_idle_since_is_the_first_probe_that_saw_the_node_idle_live_and_simulated(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    live: list[Any] = []

    def spy(state: NodePowerState, facts: NodeFacts, *a: Any, **k: Any) -> Any:
        if state.node == "side-1" and facts.work is not None:
            live.append(facts.work)
        return step(state, facts, *a, **k)

    async with PowerHarness(probe_interval=5.0) as h:
        h.side_node("side-1")
        await h.start()
        monkeypatch.setattr(live_controller, "step", spy)
        h.queue("c-1", vcpus=1, gpus=1)
        h.place("c-1", "side-1")
        h.hosts["side-1"].runners = 1
        await h.run_for(7)
        h.hosts["side-1"].runners = 0  # between two probes
        h.finish("c-1")
        await h.run_for(20)
    assert live and not idle_unseen(live)

    simulated: list[Any] = []
    original = sim_steps.decide_node

    def sim_spy(query: Any, *a: Any) -> Any:
        if query.state.node == "side-1" and query.facts.work is not None:
            simulated.append(query.facts.work)
        return original(query, *a)

    monkeypatch.setattr(sim_steps, "decide_node", sim_spy)
    _sim_cycle()
    assert simulated and not idle_unseen(simulated)
