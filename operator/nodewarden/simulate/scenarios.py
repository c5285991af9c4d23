"""Recorded machine steps of a simulation as `nodewarden explain` scenario documents.

`Simulation(..., SimOptions(record={"gpu-a100-01"}))` records every step of that node:
the readings the simulated shell replaced before the step, the event and the decision.
`scenario_document(recording, policy, upto=k)` turns the first k+1 steps into a
scenario (docs/scenarios.md): the node's initial state and facts, then each event with
its facts patch, `now` = the time of step k. `nodewarden explain --scenario` on it
replays the same events through the same core, so its final decision must equal the
simulator's decision at step k (a test checks it), and a reviewer can ask "why did the
simulation decide that, there?" with the tool they already use.
"""

from __future__ import annotations

from typing import Any

from nodewarden.simulate.policies import SimPolicy
from nodewarden.simulate.results import Recording


def _iso(when: Any) -> str:
    return str(when.isoformat()).replace("+00:00", "Z")


def scenario_document(recording: Recording, policy: SimPolicy, upto: int) -> dict[str, Any]:
    """The scenario replaying steps 0..upto of `recording` under `policy`."""
    if not 0 <= upto < len(recording.steps):
        raise IndexError(f"step {upto} not recorded (0..{len(recording.steps) - 1})")
    steps = recording.steps[: upto + 1]
    events = []
    for entry in steps:
        item: dict[str, Any] = {
            "time": _iso(entry.time),
            "event": entry.event.model_dump(mode="json", by_alias=True),
        }
        if entry.patch:
            item["facts"] = {
                _camel(name): reading.model_dump(mode="json", by_alias=True)
                if reading is not None
                else None
                for name, reading in entry.patch.items()
            }
        events.append(item)
    last = steps[-1]
    return {
        "description": (
            f"Recorded by nodewarden simulate: node {recording.node}, steps 0..{upto}; "
            f"the simulator decided {last.decision.value} "
            f"({', '.join(last.reasons) or '-'}) at the last one."
        ),
        "now": _iso(last.time),
        "policy": {
            "name": policy.view.version.name,
            **(
                {"generation": policy.view.version.generation}
                if policy.view.version.generation is not None
                else {}
            ),
            "spec": policy.spec.to_wire(),
        },
        "state": recording.initial_state.model_dump(mode="json", by_alias=True),
        "facts": recording.initial_facts.model_dump(mode="json", by_alias=True),
        "events": events,
    }


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)
