"""What the power controller's collaborators share: the adapters and books they act
through, the table of node runtimes, the wake event and the tasks under way.

`PowerController` builds one `PowerContext` and hands it to each of its collaborators
(`recording`, `validation`, `observations`, `sensing`, `round`); each collaborator keeps
its own bookkeeping and calls only the ones below it, never back up.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from nodewarden.credentials import CredentialResolver
from nodewarden.fleet.board import PowerBoard
from nodewarden.fleet.policies import Policy, PolicyBook
from nodewarden.fleet.ports import PoolPort
from nodewarden.fleet.status import NodeStatusWriter
from nodewarden.kube.client import Kube
from nodewarden.power.admitting import ShutdownGate
from nodewarden.power.agenda import Agenda
from nodewarden.power.control import PowerControl
from nodewarden.power.firstwrites import FirstWrites
from nodewarden.power.intents import IntentBook
from nodewarden.power.runtime import ControllerSettings, NodeRuntime
from nodewarden.rules.fleet import FleetTally
from nodewarden.rules.freshness import expires_at
from nodewarden.scheduling.instancetypes import Catalogue, InstanceTypePolicy
from nodewarden.scheduling.placement import PlacementRules


@dataclass
class PowerContext:
    """The power controller's shared state (one per controller)."""

    kube: Kube
    namespace: str
    dispatcher_id: str
    default_policy: str
    credentials: CredentialResolver
    policies: PolicyBook
    pool: PoolPort | None
    board: PowerBoard
    status: NodeStatusWriter
    control: PowerControl
    settings: ControllerSettings
    clock: Callable[[], datetime]
    catalogue: Catalogue
    type_policy: InstanceTypePolicy
    intents: IntentBook
    acknowledge_admission: bool = False
    """No dispatcher places work: closing admission is acknowledged at once."""
    admission: ShutdownGate | None = None
    """Cross-process admission (`power.admitting`; None: off, the in-memory board alone)."""
    nodes: dict[str, NodeRuntime] = field(default_factory=dict)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    """Set by every observation that gives a node something to step (see `run`)."""
    synced: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once the controller holds the whole fleet (`PowerController.start`)."""
    tasks: set[asyncio.Task[Any]] = field(default_factory=set)
    agenda: Agenda = field(default_factory=Agenda)
    """The nodes with events and the due times (`power.agenda`)."""
    demand_confirmed_at: datetime | None = None
    """The dispatcher's last word that its plan did not change (`plan_unchanged`): every
    node's demand reading holds at that time too."""
    tally: FleetTally = field(default_factory=FleetTally)
    """Every node's fleet marks, kept as nodes change (`rules.fleet.FleetTally`)."""
    arrivals: int = 0
    """Nodes that arrived so far (each one's `NodeRuntime.order`)."""
    first_writes: FirstWrites = field(default_factory=FirstWrites)
    """Starting nodes whose first status write waits for their facts (`power.firstwrites`)."""

    def spawn(self, coro: Awaitable[Any]) -> None:
        """Run `coro` beside the round (awaited by `stop` through `nodewarden.drain`)."""
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def admit(self, rt: NodeRuntime) -> None:
        """Node `rt` joins the fleet: on the agenda, in arrival order."""
        self.arrivals += 1
        self.nodes[rt.name] = rt
        rt.bind(self.agenda, self.arrivals, self.tally)
        self.first_writes.arrive(rt.name, self.clock())
        self.agenda.roster_changed = True

    def dismiss(self, name: str) -> NodeRuntime | None:
        """Node `name` leaves the fleet (its agenda entries go stale)."""
        rt = self.nodes.pop(name, None)
        self.first_writes.forget(name)
        if rt is not None:
            rt.unbind()
            self.agenda.roster_changed = True
        return rt

    def expiry(self, rt: NodeRuntime) -> datetime | None:
        """When `rt`'s decisive telemetry turns stale (`rules.freshness.expires_at`)."""
        view = self.policy(rt).view
        return expires_at(
            rt.facts, view.telemetry_max_age, view.heartbeat_stale_after, self.demand_confirmed_at
        )

    def confirmed(self, rt: NodeRuntime) -> None:
        """An observation refreshed `rt`'s evidence without a step: its expiry moves
        later, found when the due time it holds comes (`Round._expired`), so no heap
        entry is pushed per confirmation."""
        if rt.expires_at is None:
            rt.expires_at = self.expiry(rt)

    def policy(self, rt: NodeRuntime) -> Policy:
        return self.policies.for_node(rt.policy_name)

    def placement(self) -> PlacementRules:
        """The placement levers the dispatcher plans with (the default policy's): demand
        is judged by the same fit rules."""
        return PlacementRules.of(self.policies.default.spec.placement)
