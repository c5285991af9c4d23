"""The simulator reaches consolidation by drain only through the shared rules: a dear
VM left lightly used, whose work fits on a cheap one, stops admitting (the real machine's
DRAIN CONSOLIDATION_DRAIN, `rules.consolidation` via `simulate.consolidation`), so later
work goes elsewhere; in Shadow (the default) and Off nothing changes."""

from __future__ import annotations

from typing import Any

from nodewarden.api.powerpolicy import PowerPolicySpec
from nodewarden.simulate.engine import Simulation
from nodewarden.simulate.fleet import load_fleet
from nodewarden.simulate.policies import policy_from_spec
from nodewarden.simulate.trace import parse_trace

FLEET: dict[str, Any] = {
    "cloud": {
        "instanceTypes": [
            {"name": "small", "vcpus": 2, "ram": "4Gi", "price": 0.1},
            {"name": "large", "vcpus": 8, "ram": "32Gi", "price": 0.5},
        ],
        "billing": {"period": "0s", "minimum": "0s"},
        "instanceTypePolicy": {"ramOverhead": "0", "ramDiscountPercent": 0},
    },
}
# Each container runs on a VM of its cheapest fitting type (here all large). A gets a
# large VM; B, arriving once it runs, goes there too; E finds no room there and gets a
# second one, with room for B. A ends at about 500 s: the first VM runs B alone (5/32 of
# its RAM), which would fit beside E.
TRACE = """arrival,runtime,vcpus,ram
0,400,6,24Gi
150,3600,1,5Gi
300,3600,6,24Gi
"""


def _run(mode: str) -> Simulation:
    spec = PowerPolicySpec.model_validate({"consolidation": {"mode": mode}})
    trace = parse_trace(TRACE, "csv")
    sim = Simulation(trace, load_fleet(FLEET), policy_from_spec(spec, mode), 1)
    sim.run()
    return sim


def test_a_lightly_used_dear_vm_is_drained_through_the_live_rule_and_machine() -> None:
    on = _run("On")
    assert on.consolidation.drains == 1
    assert on.ledger.decisions["DRAIN CONSOLIDATION_DRAIN"] >= 1
    for mode in ("Shadow", "Off"):
        other = _run(mode)
        assert other.consolidation.drains == 0 and not other.consolidation.active
        assert other.ledger.decisions["DRAIN CONSOLIDATION_DRAIN"] == 0
