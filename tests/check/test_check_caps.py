"""`nodewarden check` before an upgrade: the fleet against the operator's new ceilings, and
whether anything can be created at all (pure)."""

from __future__ import annotations

from typing import Any

import yaml

from localcluster import REPO
from nodewarden.check.caps import CHART_DEFAULTS, caps_results
from nodewarden.check.result import Status
from nodewarden.config import OperatorConfig


def _config(**limits: Any) -> OperatorConfig:
    return OperatorConfig.model_validate(
        {
            "dispatcher_id": "fleet",
            "cloud": {
                "driver": "ec2",
                "image": "ami-1",
                "instance_types": [
                    {
                        "name": "gpu",
                        "provider_type": "g5.12xlarge",
                        "vcpus": 48,
                        "ram": "192Gi",
                        "gpus": 4,
                        "price": 3.26,
                    },
                ],
            },
            "dispatch": {"limits": limits},
        }
    )


def _vm(name: str, dispatcher: str = "fleet", price: float | None = None) -> dict[str, Any]:
    status = {"hourlyPrice": price} if price is not None else {}
    return {
        "metadata": {"name": name, "labels": {"nodewarden.io/dispatcher": dispatcher}},
        "spec": {"nodeType": "CloudVM", "instanceType": "gpu"},
        "status": status,
    }


def test_a_fleet_above_the_new_defaults_is_reported_with_the_value_to_set() -> None:
    fleet = [_vm(f"gpu-{i}") for i in range(22)] + [_vm("other", dispatcher="west")]
    results = caps_results(
        fleet, _config(max_nodes=20, max_hourly_spend=25, max_per_instance_type=10), None
    )
    lines = {r.message: r for r in results}
    nodes = next(r for m, r in lines.items() if "limits.maxNodes" in m)
    assert nodes.status is Status.WARN and "22 > 20" in nodes.message
    assert "limits.maxNodes in the Helm values to at least 22" in nodes.fix
    assert "nothing is destroyed" in nodes.fix
    spend = next(r for m, r in lines.items() if "limits.maxHourlySpend" in m)
    assert "71.72 > 25" in spend.message
    assert any("maxPerInstanceType (gpu)" in m for m in lines)


def test_without_ceilings_the_fleet_is_held_against_the_charts_new_defaults() -> None:
    results = caps_results([_vm(f"gpu-{i}") for i in range(60)], _config(), None)
    above = [r for r in results if "the chart's default" in r.message]
    assert {r.message.split(" (")[0] for r in above} == {
        "the fleet is above the chart's default limits.maxNodes",
        "the fleet is above the chart's default limits.maxHourlySpend",
        "the fleet is above the chart's default limits.maxPerInstanceType",
    }
    assert all("stops new creates" in r.message for r in above)


def test_the_charts_defaults_are_the_ones_check_knows() -> None:
    limits = yaml.safe_load((REPO / "helm" / "nodewarden" / "values.yaml").read_text())["limits"]
    assert CHART_DEFAULTS.max_nodes == limits["maxNodes"]
    assert CHART_DEFAULTS.max_hourly_spend == limits["maxHourlySpend"]
    assert CHART_DEFAULTS.max_per_type == limits["maxPerInstanceType"]


def test_within_the_ceilings_it_passes_and_a_missing_default_policy_fails() -> None:
    ok = caps_results(
        [_vm("a", price=1.0)],
        _config(max_nodes=5, max_hourly_spend=5, max_per_instance_type=5),
        None,
    )
    assert [r.status for r in ok] == [Status.PASS]
    stopped = caps_results(
        [], _config(max_nodes=5), "the default PowerPolicy 'default' does not exist"
    )
    failures = [r for r in stopped if r.status is Status.FAIL]
    assert len(failures) == 1 and "no instance will be created" in failures[0].message
    assert any("no operator ceiling for maxHourlySpend" in r.message for r in stopped)
