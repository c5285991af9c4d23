"""The one seam through which every node decision of the simulator goes.

    decide_node(MachineQuery(state, facts, event), now, policy) -> machine.Step

The simulator never decides anything itself: it builds the facts from the simulated
world and asks here, and here calls the operator's own pure code,
`nodewarden.policy.machine.step` -- the state machine the power controller steps for
every WorkerNode, event by event.

`PATHS` says which path each node type takes. Both take the machine path, as in the
operator: side nodes through the power gates, cloud VMs (`NodeFacts(node_type="CloudVM")`)
through the node-manager rules of `nodewarden.policy.cloudvm` that
`gates.evaluate_shutdown` hands them to (deleted, down, lame, unpaired past boot grace,
broken, pinned off, drain, idle in an open billing window), with the cloud's instance
list as their power source and a destroy as their shutdown request.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from nodewarden.api.workernode import NodeType
from nodewarden.policy.events import Event
from nodewarden.policy.facts import NodeFacts
from nodewarden.policy.machine import Step, step
from nodewarden.policy.state import NodePowerState
from nodewarden.simulate.policies import SimPolicy

DecisionPath = Literal["machine"]

PATHS: Mapping[NodeType, DecisionPath] = {"SideNode": "machine", "CloudVM": "machine"}
"""Which path each node type's decisions take (see the module docstring)."""


@dataclass(frozen=True, slots=True)
class MachineQuery:
    """One event for one node on the machine path."""

    state: NodePowerState
    facts: NodeFacts
    event: Event


def decide_node(query: MachineQuery, now: datetime, policy: SimPolicy) -> Step:
    """Decide for one node with the operator's pure code (see the module docstring)."""
    return step(query.state, query.facts, query.event, now, policy.view, with_record=False)
