"""The built-in fleet the built-in traces run on (`--fleet` omitted, the benchmark).

`BUILTIN_FLEET` is the parsed form of examples/simulate/fleet.yaml (a test keeps the two
equal): an AWS-like catalogue of eight instance types billed per second with a
one-minute minimum, six Redfish GPU servers (4x A100 each, off at the start) and six
Wake-on-LAN CPU servers (on at the start). With the bursts of the `bursty-week` trace the
fleet runs well over 50 nodes at its peak.
"""

from __future__ import annotations

from typing import Any

from nodewarden.simulate.fleet import Fleet, load_fleet

_GI = "Gi"

BUILTIN_FLEET_DOCUMENT: dict[str, Any] = {
    "description": "Built-in fleet: AWS-like VMs billed per second, 6 GPU + 6 CPU side nodes.",
    "cloud": {
        "instanceTypes": [
            {"name": "t3.small", "vcpus": 2, "ram": "2Gi", "price": 0.0208},
            {
                "name": "t3.medium-spot",
                "providerType": "t3.medium",
                "vcpus": 2,
                "ram": "4Gi",
                "price": 0.0125,
                "preemptible": True,
            },
            {"name": "m5.large", "vcpus": 2, "ram": "8Gi", "scratch": "32Gi", "price": 0.096},
            {"name": "m5.xlarge", "vcpus": 4, "ram": "16Gi", "scratch": "64Gi", "price": 0.192},
            {"name": "m5.2xlarge", "vcpus": 8, "ram": "32Gi", "scratch": "128Gi", "price": 0.384},
            {"name": "r5.2xlarge", "vcpus": 8, "ram": "64Gi", "scratch": "128Gi", "price": 0.504},
            {
                "name": "g5.xlarge",
                "vcpus": 4,
                "ram": "16Gi",
                "scratch": "250Gi",
                "gpus": 1,
                "gpuModel": "a10g",
                "price": 1.006,
            },
            {
                "name": "g5.4xlarge",
                "vcpus": 16,
                "ram": "64Gi",
                "scratch": "600Gi",
                "gpus": 1,
                "gpuModel": "a10g",
                "price": 1.624,
            },
        ],
        "billing": {"period": "0s", "minimum": "60s"},
        "createLatency": {"uniform": {"min": "1s", "max": "5s"}},
        "boot": {"lognormal": {"median": "100s", "sigma": 0.25, "min": "50s", "max": "10m"}},
        "shutdown": {"uniform": {"min": "20s", "max": "60s"}},
        "bootFailureRate": 0.01,
        "maxNewNodesPerRound": 50,
        "listInterval": "10s",
    },
    "sideNodes": [
        {
            "name": "gpu-a100",
            "count": 6,
            "capacity": {
                "vcpus": 64,
                "ram": "512Gi",
                "scratch": "3Ti",
                "gpus": 4,
                "gpuModel": "a100",
            },
            "costPerHour": 1.1,
            "controlMethod": "Redfish",
            "initialPower": "Off",
            "boot": {"lognormal": {"median": "4m", "sigma": 0.2, "min": "2m30s", "max": "15m"}},
            "shutdown": {"uniform": {"min": "45s", "max": "2m"}},
            "bmc": {
                "latency": {"uniform": {"min": "500ms", "max": "3s"}},
                "dropRate": 0.05,
                "errorRate": 0.01,
                "pollInterval": "10s",
            },
            "energy": {
                "idleWatts": 520,
                "busyWatts": 1900,
                "offWatts": 18,
                "bootEnergyWh": 15,
                "shutdownEnergyWh": 3,
                "pricePerKwh": 0.25,
            },
        },
        {
            "name": "cpu-epyc",
            "count": 6,
            "capacity": {"vcpus": 96, "ram": "384Gi", "scratch": "2Ti"},
            "costPerHour": 0.35,
            "controlMethod": "WakeOnLan",
            "initialPower": "On",
            "boot": {"lognormal": {"median": "150s", "sigma": 0.2, "min": "90s", "max": "10m"}},
            "shutdown": {"uniform": {"min": "30s", "max": "90s"}},
            "bmc": {
                "latency": {"uniform": {"min": "100ms", "max": "1s"}},
                "dropRate": 0.1,
                "pollInterval": "10s",
            },
            "energy": {
                "idleWatts": 210,
                "busyWatts": 620,
                "offWatts": 9,
                "bootEnergyWh": 6,
                "shutdownEnergyWh": 1,
                "pricePerKwh": 0.25,
            },
        },
    ],
    "probe": {"interval": "10s", "bootInterval": "2s", "failureRate": 0.002},
    "controller": {
        "tickInterval": "1s",
        "apiLatency": "1s",
        "resyncInterval": "30s",
        "startLatency": "2s",
    },
}


def builtin_fleet() -> Fleet:
    return load_fleet(BUILTIN_FLEET_DOCUMENT)
