"""The hollow fleet's model: each node's power, readiness and runner, and the record of
every action that reached a node and who sent it. No I/O; a clock is passed in.

Power follows the requests with delays evaluated lazily (no task per node):

    request            now               after the delay
    On / ForceOn       PoweringOn        On (boot_delay), ready ready_delay later
    GracefulShutdown   PoweringOff       Off (shutdown_delay); runners lost
    ForceOff           Off at once       -
    ssh poweroff       PoweringOff       Off (shutdown_delay); the SSH link drops at once

Reset types outside `ALLOWABLE` are refused (HTTP 400), as a BMC does.

The evidence of ownership: `acted_on_by_several` (nodes that more than one actor ever acted
on: a handover shows here) and `interleaved` (nodes whose actors alternate, A then B then A:
two owners at once; a fenced handover never shows here).
"""

from __future__ import annotations

import random
import re
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import ClassVar

from nodewarden_doubles.stubworker.runner import FakeRunner

ALLOWABLE = ("On", "ForceOn", "GracefulShutdown", "ForceOff")
POWER_ACTIONS = frozenset({f"bmc:{t}" for t in ALLOWABLE} | {"ssh:poweroff"})
"""The kinds of `ActionRecord` that change a node's power."""

_REPLICA = re.compile(r"replica=([^;)\s]+)")


def replica_of(user_agent: str | None) -> str | None:
    """The replica a request names in its User-Agent (`compose.power_user_agent`)."""
    match = _REPLICA.search(user_agent or "")
    return match.group(1) if match else None


@dataclass(frozen=True, slots=True)
class ActionRecord:
    """One action that reached a node: a power request or a runner command."""

    node: str
    kind: str
    """``bmc:<ResetType>``, ``ssh:poweroff``, ``runner:run``, ``runner:kill``."""
    actor: str | None
    """Who sent it: the replica (User-Agent, or the dialer's actor); None if unnamed."""
    at: float
    accepted: bool


@dataclass
class HollowNode:
    name: str
    power: str = "On"
    """On, Off, PoweringOn, PoweringOff."""
    settles_at: float | None = None
    """When a Powering* state becomes On / Off."""
    on_since: float = 0.0
    system_uuid: str = ""
    runner: FakeRunner | None = None
    boots: int = 0
    """Power-ons seen (an SSH connection opened before the last one is dead)."""
    on_off: Callable[[], None] | None = None
    """Told when the node goes Off (the stub cloud marks its VM stopped)."""
    gone: bool = False
    """Its VM was destroyed: nothing answers any more."""
    reads: int = 0
    """BMC PowerState reads answered."""


@dataclass
class HollowFleet:
    """Every hollow node, one clock, one action log."""

    clock: Callable[[], float] = time.monotonic
    boot_delay: float = 0.0
    ready_delay: float = 0.0
    shutdown_delay: float = 0.0
    seed: int = 0
    streams: bool = True
    """Nodes answer ``RUNNER --watch`` (pushed state); False: as an older runner (exit 2)."""
    nodes: dict[str, HollowNode] = field(default_factory=dict)
    actions: list[ActionRecord] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _rng: random.Random = field(init=False, repr=False)
    _wakers: dict[str, set[Callable[[], None]]] = field(default_factory=dict, repr=False)
    """The stub cloud adds and removes VMs from its own thread (`hollow.cloud`)."""
    _published: ClassVar[dict[str, HollowFleet]] = {}

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    def publish(self, name: str) -> HollowFleet:
        """Make this fleet the one the driver plugin finds under `name` (the stub cloud's
        name: `cloud.driver_params.cloud`)."""
        self._published[name] = self
        return self

    def withdraw(self, name: str) -> None:
        if self._published.get(name) is self:
            del self._published[name]

    @classmethod
    def named(cls, name: str) -> HollowFleet:
        fleet = cls._published.get(name)
        if fleet is None:
            raise LookupError(f"no hollow fleet published as {name!r} in this process")
        return fleet

    def add(self, names: Iterable[str], power: str = "On") -> None:
        rng = self._rng
        with self._lock:
            for name in names:
                if name in self.nodes and not self.nodes[name].gone:
                    raise ValueError(f"hollow node {name} exists")
                node = HollowNode(
                    name=name,
                    power=power,
                    on_since=self.clock() - self.ready_delay,  # added On: already ready
                    system_uuid=str(uuid.UUID(int=rng.getrandbits(128), version=4)),
                )
                node.runner = FakeRunner(rng, self.clock, lambda: 0.0, lambda: 0.0)
                self.nodes[name] = node

    def destroyed(self, name: str) -> None:
        """Its VM is gone (the stub cloud's teardown): Off for good, recorded."""
        with self._lock:
            node = self.nodes.get(name)
            if node is None:
                return
            node.gone, node.on_off = True, None
            self._off(node)
            self._record(name, "cloud:destroy", None, True)
        self._touch(name)

    def wake_on_change(self, name: str, waker: Callable[[], None]) -> Callable[[], None]:
        """Call `waker` whenever the node's power, readiness or runners may have changed
        (a watch stream); returns the function that stops it."""
        self._wakers.setdefault(name, set()).add(waker)
        return lambda: self._wakers.get(name, set()).discard(waker)

    def _touch(self, name: str) -> None:
        for waker in list(self._wakers.get(name, ())):
            waker()

    def due(self, name: str) -> float | None:
        """The next time (fleet clock) the node changes by itself: a power state settles,
        it becomes ready, a container ends."""
        node = self.node(name)
        times = [node.settles_at] if node.settles_at is not None else []
        if node.power == "On" and self.clock() < node.on_since + self.ready_delay:
            times.append(node.on_since + self.ready_delay)
        if node.runner is not None and (end := node.runner.next_end()) is not None:
            times.append(end)
        return min(times) if times else None

    def node(self, name: str) -> HollowNode:
        node = self.nodes[name]
        self._settle(node)
        return node

    def _settle(self, node: HollowNode) -> None:
        now = self.clock()
        if node.settles_at is None or now < node.settles_at:
            return
        if node.power == "PoweringOn":
            node.power, node.on_since = "On", node.settles_at
            node.boots += 1
        elif node.power == "PoweringOff":
            self._off(node)
        node.settles_at = None

    def _off(self, node: HollowNode) -> None:
        node.power, node.settles_at = "Off", None
        if node.runner is not None:
            node.runner.reboot()
        if node.on_off is not None:
            node.on_off()

    # -- what the seams ask --------------------------------------------------------

    def power_state(self, name: str) -> str:
        node = self.node(name)
        node.reads += 1
        return node.power

    def ready(self, name: str) -> bool:
        node = self.node(name)
        return node.power == "On" and self.clock() >= node.on_since + self.ready_delay

    def reachable(self, name: str) -> bool:
        """An SSH server answers: the node is On (ready or not) and its VM not destroyed."""
        node = self.node(name)
        return node.power == "On" and not node.gone

    def reset(self, name: str, reset_type: str, actor: str | None) -> bool:
        """A BMC reset request; False when the type is not offered (nothing changes)."""
        node = self.node(name)
        accepted = reset_type in ALLOWABLE
        self._record(name, f"bmc:{reset_type}", actor, accepted)
        if not accepted:
            return False
        now = self.clock()
        if reset_type in ("On", "ForceOn") and node.power in ("Off", "PoweringOff"):
            node.power, node.settles_at = "PoweringOn", now + self.boot_delay
        elif reset_type == "GracefulShutdown" and node.power in ("On", "PoweringOn"):
            node.power, node.settles_at = "PoweringOff", now + self.shutdown_delay
        elif reset_type == "ForceOff":
            self._off(node)
        self._settle(node)
        self._touch(name)
        return True

    def poweroff(self, name: str, actor: str | None) -> None:
        """``systemctl poweroff`` over SSH."""
        node = self.node(name)
        self._record(name, "ssh:poweroff", actor, True)
        if node.power == "On":
            node.power, node.settles_at = "PoweringOff", self.clock() + self.shutdown_delay
            self._settle(node)
        self._touch(name)

    def _record(self, node: str, kind: str, actor: str | None, accepted: bool) -> None:
        self.actions.append(ActionRecord(node, kind, actor, self.clock(), accepted))

    def record_runner(self, node: str, kind: str, actor: str | None, accepted: bool) -> None:
        self._record(node, kind, actor, accepted)
        self._touch(node)

    # -- the evidence --------------------------------------------------------------

    def counts(self) -> Counter[tuple[str, str]]:
        """(node, kind) -> how many such actions reached the node (accepted or not)."""
        return Counter((a.node, a.kind) for a in self.actions)

    def actors(self, node: str, kinds: frozenset[str] = POWER_ACTIONS) -> set[str | None]:
        return {a.actor for a in self.actions if a.node == node and a.kind in kinds}

    def acted_on_by_several(
        self, kinds: frozenset[str] = POWER_ACTIONS
    ) -> dict[str, set[str | None]]:
        """Nodes whose actions of `kinds` came from more than one actor (an unnamed
        actor counts as one more)."""
        seen: dict[str, set[str | None]] = {}
        for action in self.actions:
            if action.kind in kinds:
                seen.setdefault(action.node, set()).add(action.actor)
        return {node: actors for node, actors in seen.items() if len(actors) > 1}

    def interleaved(
        self, kinds: frozenset[str] = POWER_ACTIONS, since: int = 0
    ) -> dict[str, list[str | None]]:
        """Nodes on which two actors' actions interleave (A, B, A in arrival order): two
        owners acting at once. A handover -- every action of A, then only B's -- is not
        listed (`acted_on_by_several` lists it). Per listed node: its actors in order.
        Meant for a window in which a node changes owner at most once (a shard that moves
        back to A later would show as A, B, A too): `since`, an index into `actions`,
        starts the window later."""
        order: dict[str, list[str | None]] = {}
        for action in self.actions[since:]:
            if action.kind in kinds:
                runs = order.setdefault(action.node, [])
                if not runs or runs[-1] != action.actor:
                    runs.append(action.actor)
        return {node: runs for node, runs in order.items() if len(runs) != len(set(runs))}
