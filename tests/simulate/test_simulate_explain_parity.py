"""The simulator decides with the operator's code: its decisions equal `nodewarden explain`.

Two directions:

* every recorded scenario of examples/scenarios/ is fed through the simulator's decision
  seam (`decide_node`), event by event, and must give the decisions `nodewarden explain`
  prints for the same file;
* steps the simulator took on its own (side nodes and cloud VMs over six simulated hours)
  are written as scenario files and `nodewarden explain` must reach the simulator's
  decision.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from sim_builders import ROOT, run_cli

from nodewarden.api.powerpolicy import PowerPolicySpec
from nodewarden.explain import main as explain_main
from nodewarden.policy.events import Evaluate
from nodewarden.policy.scenario import _bind_current, load_scenario
from nodewarden.policy.state import NodePowerState
from nodewarden.simulate.decide import MachineQuery, decide_node
from nodewarden.simulate.engine import Simulation
from nodewarden.simulate.generate import PRESETS, generate
from nodewarden.simulate.policies import policy_from_spec
from nodewarden.simulate.presets import builtin_fleet
from nodewarden.simulate.results import SimOptions
from nodewarden.simulate.scenarios import scenario_document

SCENARIOS = sorted((ROOT / "examples" / "scenarios").glob("*.yaml"))


def explain_json(path: Path) -> dict[str, Any]:
    code, out, err = run_cli(explain_main, "--scenario", str(path), "-o", "json")
    assert code == 0, err
    doc: dict[str, Any] = json.loads(out)
    return doc


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_recorded_scenario_through_the_simulator_seam_matches_explain(path: Path) -> None:
    expected = explain_json(path)
    scenario, view = load_scenario(yaml.safe_load(path.read_text()))
    policy = policy_from_spec(
        PowerPolicySpec.model_validate(scenario.policy.spec),
        scenario.policy.name,
        scenario.policy.generation,
    )
    assert policy.view.version == view.version
    state = scenario.state or NodePowerState.initial(scenario.facts.node)
    facts = scenario.facts
    if not scenario.events:
        # explain evaluates the gates; the simulator steps the machine with Evaluate
        result = decide_node(MachineQuery(state, facts, Evaluate()), scenario.now, policy)
        assert result.evaluation is not None
        assert result.evaluation.kind == expected["gates"]["kind"]
        assert result.evaluation.decision.value == expected["decision"]
        assert [r.value for r in result.evaluation.reasons] == expected["reasons"]
        return
    history = []
    for entry in scenario.events:
        if entry.facts is not None:
            facts = entry.facts.apply(facts)
        event = _bind_current(entry.event, state)
        result = decide_node(MachineQuery(state, facts, event), entry.time, policy)
        history.append(
            {
                "decision": result.decision.value,
                "reasons": [r.value for r in result.reasons],
                "stateAfter": result.next.state.value,
                "admission": result.next.admission.value,
            }
        )
        state, facts = result.next, result.facts
    assert history == [
        {k: h[k] for k in ("decision", "reasons", "stateAfter", "admission")}
        for h in expected["history"]
    ]
    assert state.state.value == expected["state"]


@pytest.fixture(scope="module")
def recorded() -> tuple[Any, Any]:
    trace = generate(PRESETS["smoke"], 5)
    policy = policy_from_spec(PowerPolicySpec(), "default", 3)
    fleet = builtin_fleet()
    nodes = frozenset(name for group in fleet.side_nodes for name in group.names())
    nodes |= {f"vm-{t.name}-0" for t in fleet.cloud.instance_types}  # each type's first VM
    run = Simulation(trace, fleet, policy, 5, SimOptions(record=nodes)).run()
    return run, policy


def _interesting(steps: list[Any]) -> list[int]:
    """Indexes of the first step of each decision kind, and the last step."""
    seen: dict[str, int] = {}
    for i, s in enumerate(steps):
        seen.setdefault(s.decision.value, i)
    return sorted({*seen.values(), len(steps) - 1})


@pytest.mark.parametrize("group", ["gpu-a100", "cpu-epyc", "vm-"])
def test_simulated_steps_replayed_by_explain_give_the_same_decisions(
    recorded: tuple[Any, Any], group: str, tmp_path: Path
) -> None:
    run, policy = recorded
    node = max(
        (name for name in run.recordings if name.startswith(group)),
        key=lambda name: (len({s.decision for s in run.recordings[name].steps}), name),
    )
    recording = run.recordings[node]
    decisions = {s.decision.value for s in recording.steps}
    assert {"START", "DEFER"} <= decisions  # the node woke or was verified, and waited
    for index in _interesting(recording.steps):
        step = recording.steps[index]
        path = tmp_path / f"{node}-{index}.yaml"
        path.write_text(yaml.safe_dump(scenario_document(recording, policy, index)))
        doc = explain_json(path)
        assert len(doc["history"]) == index + 1
        assert doc["decision"] == step.decision.value, (index, doc["summary"])
        assert doc["reasons"] == list(step.reasons)
        assert doc["state"] == step.state.value
        assert doc["admission"] == step.admission
        assert datetime.fromisoformat(doc["now"]) == step.time
