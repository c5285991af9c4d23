"""The simulation itself: decision paths, side-node realism, accounting invariants."""

from __future__ import annotations

from typing import Any

import pytest
from sim_builders import small_fleet

from nodewarden.api.powerpolicy import PowerPolicySpec
from nodewarden.policy.state import PowerState
from nodewarden.simulate import decide
from nodewarden.simulate.accounting import billed_us
from nodewarden.simulate.engine import Simulation
from nodewarden.simulate.fleet import Fleet
from nodewarden.simulate.policies import baselines, policy_from_spec
from nodewarden.simulate.results import RunResult, SimOptions
from nodewarden.simulate.trace import Trace, parse_trace

FAST = {
    "idleThreshold": "2m",
    "minOn": "0s",
    "minOff": "0s",
    "cooldown": "0s",
    "billing": {"period": "0s", "windowStart": "0s", "windowEnd": "1s"},
    "disruptionBudget": {"maxConcurrentTransitions": 5},
}


def trace_of(rows: list[str]) -> Trace:
    return parse_trace("arrival,runtime,vcpus,ram,gpus\n" + "\n".join(rows) + "\n", "csv")


def run(trace: Trace, fleet: Fleet, knobs: dict[str, Any], **options: Any) -> RunResult:
    policy = policy_from_spec(PowerPolicySpec.model_validate(knobs), "test")
    return Simulation(trace, fleet, policy, 1, SimOptions(**options)).run()


CPU_BURST = trace_of([f"{i * 20},{600 + i * 30},2,2Gi,0" for i in range(12)])
GPU_JOB = trace_of(["0,1800,4,8Gi,1", "7200,600,4,8Gi,1"])


def test_cloud_vms_take_the_machine_path() -> None:
    """VMs are decided by machine.step with the node-manager rules of policy/cloudvm.py:
    verified (listed On + first probe), admitted, drained by the idle rule and destroyed,
    the destroy confirmed by the instance leaving the cloud list."""
    assert decide.PATHS == {"SideNode": "machine", "CloudVM": "machine"}
    result = run(CPU_BURST, small_fleet(), FAST, record=frozenset({"vm-small-0"}))
    figures = result.figures
    assert figures["notRun"] == 0 and figures["unfinished"] == 0
    steps = result.recordings["vm-small-0"].steps
    assert steps[0].state is PowerState.UNKNOWN  # a new VM is verified first
    seen = [(s.decision.value, s.reasons, s.state.value) for s in steps]
    wanted = [
        ("START", "READY_CONFIRMED", "ON_IDLE"),  # listed On + first probe: admitted
        ("DRAIN", "IDLE_EXCEEDED", "DRAINING"),  # the cloud-VM idle rule fired
        ("SHUTDOWN", "GATES_PASSED", "SHUTTING_DOWN"),  # the destroy is requested
        ("NONE", "POWER_OFF_CONFIRMED", "OFF"),  # no longer listed: Off observed
    ]
    positions = [
        next(i for i, s in enumerate(seen) if s[0] == w[0] and w[1] in s[1]) for w in wanted
    ]
    assert positions == sorted(positions), seen
    assert [seen[i][2] for i in positions] == [w[2] for w in wanted]
    assert steps[-1].state is PowerState.OFF
    assert figures["transitions"]["Shutdown Succeeded"] >= 1


def test_a_vm_that_never_boots_is_destroyed_by_the_lame_rule() -> None:
    fleet = small_fleet(bootFailureRate=1.0)
    # the CPU side node takes one at a time; the VMs made for the others never answer
    result = run(trace_of(["0,3600,8,8Gi,0"] * 3), fleet, FAST)
    decisions = result.figures["decisions"]
    assert (
        decisions.get("SHUTDOWN LAME_NODE", 0) + decisions.get("SHUTDOWN BOOT_GRACE_EXCEEDED", 0)
        >= 1
    )
    assert result.figures["transitions"].get("Shutdown Succeeded", 0) >= 1


def test_gpu_work_wakes_the_side_node_and_it_is_switched_off_after() -> None:
    fleet = small_fleet(instanceTypes=[{"name": "small", "vcpus": 2, "ram": "4Gi", "price": 0.1}])
    result = run(GPU_JOB, fleet, FAST, record=frozenset({"gpu"}))
    steps = result.recordings["gpu"].steps
    decisions = [s.decision.value for s in steps]
    assert decisions.count("START") >= 2  # woken twice (wake request + admission opened)
    assert "SHUTDOWN" in decisions
    assert result.figures["notRun"] == 0
    # the GPU node could only draw power from its first wake: the cost is about 1.0/h x on-time
    assert result.figures["transitions"]["Wake Succeeded"] == 2


def test_a_dropped_bmc_request_is_resent_and_the_wake_still_succeeds() -> None:
    fleet = small_fleet(instanceTypes=[{"name": "small", "vcpus": 2, "ram": "4Gi", "price": 0.1}])
    dropped = 0
    for seed in range(8):
        policy = policy_from_spec(PowerPolicySpec.model_validate(FAST), "test")
        sim = Simulation(GPU_JOB, fleet, policy, seed, SimOptions(record=frozenset({"gpu"})))
        result = sim.run()
        attempts = [
            s.event.attempt
            for s in result.recordings["gpu"].steps
            if s.event.type == "RequestAccepted" and s.event.action == "On"
        ]
        if any(a > 1 for a in attempts):
            dropped += 1
            assert result.figures["notRun"] == 0
    assert dropped >= 1  # dropRate 0.2: some seed needs a re-send


def test_billing_rules() -> None:
    s = 1_000_000
    assert billed_us(10 * s, 0, 60 * s) == 60 * s
    assert billed_us(61 * s, 0, 60 * s) == 61 * s
    assert billed_us(61 * s, 3600 * s, 0) == 3600 * s
    assert billed_us(3601 * s, 3600 * s, 0) == 7200 * s


@pytest.mark.parametrize("policy", [*baselines(), policy_from_spec(PowerPolicySpec(), "default")])
def test_every_container_runs_and_accounts_add_up(policy: Any) -> None:
    result = Simulation(CPU_BURST, small_fleet(), policy, 2).run()
    f = result.figures
    assert f["notRun"] == 0 and f["containersRun"] == len(CPU_BURST.containers)
    assert 0 <= f["idleNodeHours"] <= f["nodeHours"]
    assert 0 <= f["idleSpendPercent"] <= 100
    assert f["waitSeconds"]["p50"] <= f["waitSeconds"]["p95"] <= f["waitSeconds"]["max"]
    assert f["waitSeconds"]["p50"] >= 2  # the runner's start latency at least


def test_fixed_timeout_cycles_more_than_never_off() -> None:
    trace = trace_of([f"{i * 900},120,2,2Gi,0" for i in range(8)])
    never, fixed = (Simulation(trace, small_fleet(), p, 1).run() for p in baselines())
    assert fixed.figures["powerCycles"] > never.figures["powerCycles"]
    assert fixed.figures["cost"] < never.figures["cost"]


def test_price_weighted_utilisation_of_one_container() -> None:
    """One 1-vCPU/1Gi container, 10 minutes: it starts on the side node `cpu`, on at the
    start (8 vCPUs, 32Gi, 0.2/h). Its share is its dominant one, vCPUs 1/8 (RAM with the
    550Mi overhead and 5 % discount is 1.63Gi/32Gi); the figure is runtime x 1/8 x 0.2/h
    over the run's whole cost (the node's idle time included)."""
    trace = trace_of(["0,600,1,1Gi,0"])
    sim = Simulation(
        trace, small_fleet(), policy_from_spec(PowerPolicySpec.model_validate(FAST), "t"), 1
    )
    result = sim.run()
    useful = 600 * (1 / 8) * 0.2 / 3600
    assert result.figures["notRun"] == 0 and result.figures["waitSeconds"]["max"] < 10
    assert result.figures["priceWeightedUtilisation"] == round(useful / sim.ledger.cost, 3)
    assert 0 < result.figures["priceWeightedUtilisation"] < 1
