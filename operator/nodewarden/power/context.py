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
from nodewarden.power.control import PowerControl
from nodewarden.power.intents import IntentBook
from nodewarden.power.runtime import ControllerSettings, NodeRuntime
from nodewarden.scheduling.instancetypes import Catalogue, InstanceTypePolicy


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
    nodes: dict[str, NodeRuntime] = field(default_factory=dict)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    """Set by every observation that gives a node something to step (see `run`)."""
    synced: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once the controller holds the whole fleet (`PowerController.start`)."""
    tasks: set[asyncio.Task[Any]] = field(default_factory=set)

    def spawn(self, coro: Awaitable[Any]) -> None:
        """Run `coro` beside the round (awaited by `stop` through `nodewarden.drain`)."""
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def policy(self, rt: NodeRuntime) -> Policy:
        return self.policies.for_node(rt.policy_name)
