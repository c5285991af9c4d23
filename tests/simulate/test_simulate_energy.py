"""The simulator counts energy (`simulate.energy`): a side node's draw per phase, the
never-off saving by the live rule, cloud VM hours avoided, and the energy columns of
every `nodewarden simulate` row -- checked against hand computations."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest
from sim_builders import simulate
from test_simulate_engine import FAST, run, trace_of

from nodewarden.simulate.energy import EnergyLedger
from nodewarden.simulate.engine import Simulation
from nodewarden.simulate.fleet import load_fleet
from nodewarden.simulate.policies import baselines
from nodewarden.simulate.results import SimOptions

HOUR = 3_600_000_000
KWH = 3_600_000.0
ENERGY = {
    "idleWatts": 400,
    "busyWatts": 1400,
    "offWatts": 20,
    "bootEnergyWh": 12,
    "shutdownEnergyWh": 3,
    "pricePerKwh": 0.5,
}


@dataclass
class Node:
    name: str
    node_type: Any = "SideNode"
    instance_type: str | None = None
    slot: int = 0
    price: float = 0.0


def gpu_fleet(count: int = 2) -> Any:
    """GPU side nodes only (no instance type fits a GPU job): all work runs on them."""
    return load_fleet(
        {
            "cloud": {"instanceTypes": [{"name": "cpu", "vcpus": 2, "ram": "4Gi", "price": 0.1}]},
            "sideNodes": [
                {
                    "name": "gpu",
                    "count": count,
                    "capacity": {"vcpus": 16, "ram": "64Gi", "gpus": 1},
                    "boot": "2m",
                    "shutdown": "30s",
                    "bmc": {"latency": "1s", "pollInterval": "10s"},
                    "energy": ENERGY,
                }
            ],
        }
    )


def test_a_side_nodes_energy_and_saving_by_hand() -> None:
    fleet = gpu_fleet(1)
    ledger = EnergyLedger(fleet.side_nodes)
    node = Node("gpu")
    # off until 1 h, on 1 h..3 h (busy 1.5 h..2.5 h), off until the end at 5 h
    ledger.on_interval(node, 1 * HOUR, 3 * HOUR)
    ledger.busy_interval(node, HOUR * 3 // 2, HOUR * 5 // 2)
    got = ledger.figures(5 * HOUR)
    used = 2 * 3600 * 400 + 3600 * 1000 + 3 * 3600 * 20 + (12 + 3) * 3600
    saved = 3 * 3600 * (400 - 20) - (12 + 3) * 3600
    assert got["kWh"] == pytest.approx(used / KWH, abs=0.05)
    assert got["kWhSaved"] == pytest.approx(saved / KWH, abs=0.05)
    assert got["moneySaved"] == pytest.approx(saved / KWH * 0.5, abs=0.005)


def test_vm_hours_avoided_are_each_slots_life_since_its_first_launch_minus_its_time_on() -> None:
    ledger = EnergyLedger(())
    vm0 = Node("vm-cpu-0", "CloudVM", "cpu", 0, price=0.2)
    vm1 = Node("vm-cpu-1", "CloudVM", "cpu", 1, price=0.2)
    ledger.on_interval(vm0, 0, 2 * HOUR)  # slot 0: on 0-2 h, again 3-4 h
    ledger.on_interval(vm0, 3 * HOUR, 4 * HOUR)
    ledger.on_interval(vm1, HOUR, 2 * HOUR)  # slot 1: on 1-2 h
    got = ledger.figures(6 * HOUR)
    # never-off keeps slot 0 from 0 h and slot 1 from 1 h to the end at 6 h
    assert got["vmHoursAvoided"] == pytest.approx((6 - 3) + (5 - 1))
    assert got["moneySaved"] == pytest.approx(7 * 0.2)
    assert got["kWh"] == 0


def test_every_row_adds_up_to_the_never_off_draw() -> None:
    """For each policy, kWh + kWh saved = what the nodes would draw never switched off:
    the run's length x idle draw + busy time x (busy - idle draw), per node (the work is
    the same whatever the policy)."""
    trace = trace_of(["600,3600,4,8Gi,1", "14400,1800,4,8Gi,1", "30000,900,4,8Gi,1"])
    fleet = gpu_fleet(2)
    for knobs in (FAST, {**FAST, "idleThreshold": "30m"}):
        result = run(trace, fleet, knobs)
        figures = result.figures
        assert figures["notRun"] == 0
        busy_s = 3600 + 1800 + 900 + 3 * 2  # runtimes + the runner's start latency (2 s)
        never_off = (2 * result.end / 1e6 * 400 + busy_s * 1000) / KWH
        assert figures["kWh"] + figures["kWhSaved"] == pytest.approx(never_off, abs=0.15)
        assert figures["kWhSaved"] > 0 and figures["moneySaved"] > 0
    never = next(p for p in baselines() if p.name == "never-off")
    kept_on = Simulation(trace, fleet, never, 1, SimOptions()).run().figures
    assert kept_on["kWhSaved"] < figures["kWhSaved"]


def test_the_table_and_json_carry_the_energy_columns(tmp_path: Any) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("arrival,runtime,vcpus,ram,gpus\n0,600,4,8Gi,1\n")
    code, out, err = simulate("--trace", str(trace), "--policy", "builtin:default")
    assert code == 0, err
    header = next(line for line in out.splitlines() if line.startswith("POLICY"))
    assert header.split()[-4:-1] == ["KWH", "KWH-SAVED", "SAVED"]  # then PLACEMENT
    rows = [line for line in out.splitlines() if line.startswith(("default", "never-off"))]
    assert rows and all(len(r.split()) >= 16 for r in rows)
    code, out, err = simulate("--trace", str(trace), "--policy", "builtin:default", "-o", "json")
    assert code == 0, err
    for result in json.loads(out)["results"]:
        assert {"kWh", "kWhSaved", "moneySaved", "vmHoursAvoided"} <= set(result)


def test_saved_today_by_node_class_by_hand() -> None:
    """A run of 26 h from midnight: "today" is the last 2 h; gpu-01 is in class "a", gpu-02
    in none (counted as "(all)")."""
    ledger = EnergyLedger(gpu_fleet(2).side_nodes)
    # gpu-01: on 23 h..25 h (booted yesterday, shut down today); gpu-02 on 25.5 h..26 h
    ledger.on_interval(Node("gpu-01"), 23 * HOUR, 25 * HOUR)
    ledger.on_interval(Node("gpu-02"), HOUR * 51 // 2, 26 * HOUR)
    classes = {"gpu-01": "a"}
    got = ledger.saved_by_class(24 * HOUR, 26 * HOUR, classes.get, ["a", "b"], "(all)")
    assert [c["name"] for c in got] == ["a", "b", "(all)"]
    by = {c["name"]: c for c in got}
    a = 3600 * (400 - 20) - 3 * 3600  # off 1 h today, one shutdown today, no boot
    rest = 1.5 * 3600 * (400 - 20) - 12 * 3600  # off 1.5 h, one boot, still on at the end
    assert by["a"]["kWhSavedToday"] == pytest.approx(a / KWH, abs=5e-4)
    assert by["a"]["moneySavedToday"] == pytest.approx(a / KWH * 0.5, abs=5e-3)
    assert by["b"] == {"name": "b", "kWhSavedToday": 0.0, "moneySavedToday": 0.0}
    assert by["(all)"]["kWhSavedToday"] == pytest.approx(rest / KWH, abs=5e-4)


def test_each_result_carries_saved_today_by_class() -> None:
    """A run within its first day: the classes' saving today adds up to the run's."""
    trace = trace_of(["600,3600,4,8Gi,1", "14400,1800,4,8Gi,1"])
    knobs = {
        **FAST,
        "nodeClasses": [{"name": "first", "nodeType": "SideNode", "namePrefix": "gpu-01"}],
    }
    figures = run(trace, gpu_fleet(2), knobs).figures
    by = {c["name"]: c for c in figures["savedTodayByClass"]}
    assert set(by) == {"first", "(all)"}
    assert by["first"]["kWhSavedToday"] > 0 and by["(all)"]["kWhSavedToday"] > 0
    total = by["first"]["kWhSavedToday"] + by["(all)"]["kWhSavedToday"]
    assert total == pytest.approx(figures["kWhSaved"], abs=0.1)
