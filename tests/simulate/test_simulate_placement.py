"""The simulator places containers by the live scheduler and its levers: the policy under
test's `spec.placement` reaches `scheduling.scheduler.plan` through the same
`PlacementRules.of` the live planner calls, and a plan's due time is a round of the
simulated dispatcher (as it is a due time of the live one)."""

from __future__ import annotations

from typing import Any

from nodewarden.api.powerpolicy import PowerPolicySpec
from nodewarden.scheduling.placement import PlacementRules
from nodewarden.simulate.engine import Simulation
from nodewarden.simulate.fleet import load_fleet
from nodewarden.simulate.policies import policy_from_spec
from nodewarden.simulate.trace import parse_trace

FLEET: dict[str, Any] = {
    "cloud": {
        "instanceTypes": [{"name": "four", "vcpus": 4, "ram": "16Gi", "price": 0.20}],
        "billing": {"period": "0s", "minimum": "0s"},
    },
    "sideNodes": [
        {
            "name": "epyc",
            "count": 1,
            "capacity": {"vcpus": 64, "ram": "256Gi"},
            "costPerHour": 0.35,
            "initialPower": "Off",
            "boot": {"fixed": "100s"},
        }
    ],
}


def _run(placement: dict[str, Any], burst: int, min_off: str = "0s") -> Simulation:
    rows = "".join(f"{300 + i},600,4,8Gi\n" for i in range(burst))  # discovered by then
    trace = parse_trace("arrival,runtime,vcpus,ram\n" + rows, "csv")
    spec = PowerPolicySpec.model_validate({"minOff": min_off, "placement": placement})
    sim = Simulation(trace, load_fleet(FLEET), policy_from_spec(spec, "p"), 1)
    sim.run()
    return sim


def test_the_policy_under_test_sets_the_levers() -> None:
    sim = _run({"sideNodePrice": "PerNode", "waitBudget": "45s"}, 1)
    assert sim.dispatching.rules == PlacementRules.of(sim.policy.spec.placement)
    assert sim.dispatching.rules.wait_budget is not None
    assert not sim.dispatching.rules.per_resource_price


def test_a_burst_wakes_the_large_server_and_one_container_does_not() -> None:
    burst = _run({}, 4)
    assert burst.ledger.transitions["Wake opened"] >= 1
    alone = _run({}, 1)
    assert alone.ledger.transitions["Wake opened"] == 0
    per_node = _run({"sideNodePrice": "PerNode"}, 4)  # 0.35/h > 0.20/h: never woken
    assert per_node.ledger.transitions["Wake opened"] == 0


def test_a_wake_the_power_timing_holds_back_is_not_waited_for() -> None:
    # off since the start, min-off 10m: no wake before 600 s, the burst comes at 300 s
    held = _run({}, 4, min_off="10m")
    assert held.ledger.transitions["Wake opened"] == 0
    assert max(held.ledger.waits) < 150  # a VM's boot (100-ish s), not the min-off


GPU_FLEET: dict[str, Any] = {
    "cloud": FLEET["cloud"],
    "sideNodes": [
        {
            "name": "a100",
            "count": 1,
            "capacity": {"vcpus": 64, "ram": "256Gi", "gpus": 4, "gpuModel": "a100"},
            "costPerHour": 1.1,
            "initialPower": "On",
            "boot": {"fixed": "100s"},
        }
    ],
}


def test_a_gpu_node_running_only_cpu_work_turns_gpu_only_through_the_shared_rule() -> None:
    # a CPU job only the GPU server holds (no type has 32 vCPUs), for an hour
    trace = parse_trace("arrival,runtime,vcpus,ram\n60,3600,32,64Gi\n", "csv")
    decisions = {}
    for gpu_idle in ("GpuOnly", "Off"):
        spec = PowerPolicySpec.model_validate(
            {"idleThreshold": "5m", "placement": {"gpuIdle": gpu_idle}}
        )
        sim = Simulation(trace, load_fleet(GPU_FLEET), policy_from_spec(spec, "p"), 1)
        result = sim.run()
        decisions[gpu_idle] = dict(sim.ledger.decisions)
        assert result.figures["containersRun"] == 1, result.figures
        node = next(n for n in sim.nodes.values() if n.capacity.gpus)
        assert node.gpu_rule is not None and node.gpu_rule.enabled is (gpu_idle == "GpuOnly")
    assert decisions["GpuOnly"].get("NONE GPU_IDLE_CPU_DRAIN", 0) >= 1, decisions["GpuOnly"]
    assert "NONE GPU_IDLE_CPU_DRAIN" not in decisions["Off"]
    # never drained or switched off while the CPU job ran (the run ends with it)
    assert not any(k.startswith(("SHUTDOWN", "DRAIN")) for k in decisions["GpuOnly"])
