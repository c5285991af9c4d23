"""Small fleets, traces and CLI helpers shared by the simulator tests."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from nodewarden.simulate.cli import simulate_main, trace_main
from nodewarden.simulate.fleet import Fleet, load_fleet

ROOT = Path(__file__).resolve().parents[2]


def small_fleet(**cloud: Any) -> Fleet:
    """Two CPU types billed per second, one Redfish GPU side node (off), one CPU side node
    (on); short fixed delays so runs are quick."""
    return load_fleet(
        {
            "cloud": {
                "instanceTypes": [
                    {"name": "small", "vcpus": 2, "ram": "4Gi", "price": 0.1},
                    {"name": "large", "vcpus": 8, "ram": "32Gi", "price": 0.5},
                ],
                "billing": {"period": "0s", "minimum": "0s"},
                "createLatency": "2s",
                "boot": "60s",
                "shutdown": "20s",
                **cloud,
            },
            "sideNodes": [
                {
                    "name": "gpu",
                    "capacity": {"vcpus": 16, "ram": "64Gi", "gpus": 2},
                    "costPerHour": 1.0,
                    "boot": "2m",
                    "shutdown": "30s",
                    "bmc": {"latency": "1s", "dropRate": 0.2, "pollInterval": "10s"},
                },
                {
                    "name": "cpu",
                    "capacity": {"vcpus": 8, "ram": "32Gi"},
                    "costPerHour": 0.2,
                    "controlMethod": "WakeOnLan",
                    "initialPower": "On",
                    "boot": "90s",
                    "shutdown": "20s",
                },
            ],
        }
    )


def run_cli(main: Any, *args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(args), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def simulate(*args: str) -> tuple[int, str, str]:
    return run_cli(simulate_main, *args)


def trace_cmd(*args: str) -> tuple[int, str, str]:
    return run_cli(trace_main, *args)
