"""What a simulation run gives back, and the options and errors of a run.

`RunResult` (figures, series, recordings of chosen nodes), the `Recording` of one node's
every step for `nodewarden explain` replays (`StepRecord`: the readings the shell replaced
before the step, the event, the decision), `SimOptions`, `SimulationError`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from nodewarden.policy.events import Event
from nodewarden.policy.facts import NodeFacts
from nodewarden.policy.reasons import Decision
from nodewarden.policy.state import NodePowerState, PowerState
from nodewarden.simulate.policies import SimPolicy

_US = 1_000_000
READING_FIELDS = tuple(n for n in NodeFacts.model_fields if n not in ("node", "node_type"))
"""The readings a StepRecord's patch may carry."""


class SimulationError(RuntimeError):
    """The simulation cannot go on (a decision loop that never lets time advance)."""


@dataclass(frozen=True, slots=True)
class SimOptions:
    max_overrun: int = 2 * 86_400 * _US
    """How long past the trace's end the run may go on for queued work."""
    record: frozenset[str] = frozenset()
    """Nodes whose every step is recorded (for `nodewarden explain` replays); a VM name
    records the first VM of that name."""


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One recorded machine step: the readings the shell replaced before it, the event,
    and what the machine decided."""

    time: datetime
    event: Event
    patch: dict[str, Any]
    decision: Decision
    reasons: tuple[str, ...]
    state: PowerState
    admission: str


@dataclass(slots=True)
class Recording:
    node: str
    initial_state: NodePowerState
    initial_facts: NodeFacts
    steps: list[StepRecord] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class RunResult:
    policy: SimPolicy
    figures: dict[str, Any]
    series: tuple[tuple[int, int, int], ...]
    recordings: dict[str, Recording]
    end: int
