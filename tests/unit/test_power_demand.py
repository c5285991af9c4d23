"""Fleet counts per policy: the disruption budget counts side-node transitions only (cloud
VMs are not fixed capacity: a VM being destroyed must not hold a side node's shutdown
back), while warm idle nodes of every type count for minWarmNodes."""

from __future__ import annotations

from nodewarden.api.workernode import WorkerNodeSpec
from nodewarden.policy.facts import NodeFacts
from nodewarden.policy.state import NodePowerState, PowerRequest, PowerState, Transition
from nodewarden.policy.state import TransitionKind as K
from nodewarden.power.runtime import NodeRuntime
from nodewarden.rules.fleet import fleet_readings
from policy.policy_builders import NOW, at, off_state, on_state

VM = WorkerNodeSpec.model_validate({"nodeType": "CloudVM", "instanceType": "m5.large"})


def runtime(state: NodePowerState, spec: WorkerNodeSpec | None = None) -> NodeRuntime:
    node_type = spec.node_type if spec is not None else "SideNode"
    facts = NodeFacts(node=state.node, node_type=node_type)
    return NodeRuntime(state.node, spec, {}, state, facts, spec_seen_at=NOW)


def shutting_down(name: str) -> NodePowerState:
    request = PowerRequest(action="GracefulShutdown", attempt=1, requested_at=at(-5))
    t = Transition(
        id=f"t-{name}", kind=K.SHUTDOWN, started_at=at(-10), deadline=at(300), request=request
    )
    return off_state(node=name, state=PowerState.SHUTTING_DOWN, transition=t, seq=7)


def test_vm_transitions_do_not_use_the_side_nodes_budget() -> None:
    nodes = [
        runtime(shutting_down("vm-1"), VM),
        runtime(shutting_down("vm-2"), VM),
        runtime(shutting_down("side-1")),
        runtime(on_state(node="side-2")),
        runtime(on_state(node="vm-3"), VM),
    ]
    reading = fleet_readings(((n.policy_name, n.node_type, n.state) for n in nodes), NOW)[None]
    assert reading.transitions_in_progress == 1
    assert reading.warm_idle_nodes == 2
