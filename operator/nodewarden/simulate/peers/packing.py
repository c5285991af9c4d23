"""Placement pieces the peers share (pure functions on the world's nodes).

* `KubeScheduler`: the Kubernetes scheduler's default choice among ready nodes: a pod
  goes to the feasible node with the most room left after it (NodeResourcesFit,
  `LeastAllocated`: the mean of the free CPU and memory shares), so pods spread;
  unschedulable pods are what Karpenter and cluster-autoscaler act on. A pod that did
  not fit is tried again only after capacity was freed (the scheduler's backoff, a
  memo here).
* `pack_new`: first-fit decreasing onto new nodes (pods by CPU then memory, largest
  first): Karpenter's launch (a new NodeClaim keeps every instance type that still fits
  all its pods, and launches the cheapest of them) and cluster-autoscaler's
  bin-packing estimator (one kind at a time).
* `fits_total`: whether a kind holds a sum of needs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from nodewarden.scheduling.instancetypes import Requirements
from nodewarden.simulate.peers.world import Kind, PContainer, PeerWorld, Phase, PNode


def size_order(c: PContainer) -> tuple[int, int, int, str]:
    """First-fit decreasing order: more vCPUs first, then more RAM, then arrival."""
    return (-c.need.vcpus, -c.need.ram, c.spec.arrival, c.uuid)


def shape(need: Requirements) -> tuple[object, ...]:
    return (need.vcpus, need.ram, need.scratch, need.gpus, need.gpu_model, need.preemptible)


def schedulable(node: PNode) -> bool:
    """A ready node that takes new pods."""
    return node.phase is Phase.READY and not node.cordoned and not node.down


class KubeScheduler:
    """Binds queued pods to ready nodes, `LeastAllocated` (see the module docstring)."""

    def __init__(self) -> None:
        self._freed = -1
        self._tried: set[str] = set()

    def schedule(self, world: PeerWorld) -> list[PContainer]:
        """Bind what fits; returns the pods still unschedulable (by priority)."""
        queued = world.queued()
        if world.changes != self._freed:
            self._freed = world.changes
            self._tried.clear()
        nodes = [n for n in world.nodes.values() if schedulable(n)]
        failed: set[tuple[object, ...]] = set()
        left: list[PContainer] = []
        for c in queued:
            key = shape(c.need)
            if c.uuid in self._tried or key in failed:
                left.append(c)
                continue
            node = least_allocated(c.need, nodes)
            if node is None:
                failed.add(key)
                self._tried.add(c.uuid)
                left.append(c)
                continue
            world.assign(c, node)
        return left


def least_allocated(need: Requirements, nodes: Iterable[PNode]) -> PNode | None:
    best: PNode | None = None
    best_score = -1.0
    for node in nodes:
        free = node.free
        if need.vcpus > free[0] or need.ram > free[1] or not node.fits(need):
            continue
        cap = node.kind.capacity
        score = (free[0] - need.vcpus) / cap.vcpus + (free[1] - need.ram) / cap.ram
        if score > best_score:
            best, best_score = node, score
    return best


def fits_total(kind: Kind, used: Sequence[int]) -> bool:
    cap = kind.capacity
    return (
        used[0] <= cap.vcpus
        and used[1] <= cap.ram
        and used[2] <= cap.scratch
        and used[3] <= cap.gpus
    )


@dataclass(slots=True)
class Claim:
    """A new node being filled: the kinds that still hold all its pods."""

    options: list[Kind]
    pods: list[PContainer] = field(default_factory=list)
    used: list[int] = field(default_factory=lambda: [0, 0, 0, 0])

    def add(self, c: PContainer) -> None:
        self.pods.append(c)
        need = c.need
        self.used = [
            self.used[0] + need.vcpus,
            self.used[1] + need.ram,
            self.used[2] + need.scratch,
            self.used[3] + need.gpus,
        ]

    def cheapest(self, available: Callable[[Kind], bool]) -> Kind | None:
        return next((k for k in self.options if available(k)), None)


def _plus(used: Sequence[int], need: Requirements) -> list[int]:
    return [used[0] + need.vcpus, used[1] + need.ram, used[2] + need.scratch, used[3] + need.gpus]


def pack_new(
    pods: Iterable[PContainer], kinds: Sequence[Kind], usable: Callable[[Kind], bool]
) -> list[Claim]:
    """First-fit decreasing of `pods` onto new claims whose options are the `usable` kinds
    that hold them all (cheapest first). Pods no usable kind fits are left out."""
    claims: list[Claim] = []
    for c in sorted(pods, key=size_order):
        need = c.need
        for claim in claims:
            total = _plus(claim.used, need)
            options = [k for k in claim.options if k.fits(need) and fits_total(k, total)]
            if options:
                claim.options = options
                claim.add(c)
                break
        else:
            options = [k for k in kinds if usable(k) and k.fits(need)]
            if options:
                claim = Claim(options)
                claim.add(c)
                claims.append(claim)
    return claims


def pack_kind(pods: Iterable[PContainer], kind: Kind, limit: int | None) -> list[list[PContainer]]:
    """First-fit decreasing of the pods `kind` fits onto at most `limit` nodes of it."""
    bins: list[tuple[list[int], list[PContainer]]] = []
    for c in sorted(pods, key=size_order):
        if not kind.fits(c.need):
            continue
        for used, members in bins:
            total = _plus(used, c.need)
            if fits_total(kind, total):
                used[:] = total
                members.append(c)
                break
        else:
            if limit is not None and len(bins) >= limit:
                continue
            bins.append((_plus([0, 0, 0, 0], c.need), [c]))
    return [members for _, members in bins]


def _take_room(
    need: Requirements, nodes: Sequence[PNode], room: dict[str, list[int]]
) -> list[int] | None:
    """The first node's room `need` fits in, taken from it (None: none fits)."""
    for node in nodes:
        free = room[node.name]
        if (
            need.vcpus <= free[0]
            and need.ram <= free[1]
            and need.scratch <= free[2]
            and need.gpus <= free[3]
            and node.kind.fits(need)
        ):
            _minus(free, need, 1)
            return free
    return None


def fit_elsewhere(
    pods: Iterable[PContainer], nodes: Sequence[PNode], room: dict[str, list[int]]
) -> list[PContainer]:
    """Place `pods` (largest first) on `nodes`' free room, first fit, updating `room`;
    returns the pods that found no room."""
    return [c for c in sorted(pods, key=size_order) if _take_room(c.need, nodes, room) is None]


def move_all(
    pods: Iterable[PContainer], nodes: Sequence[PNode], room: dict[str, list[int]]
) -> bool:
    """Place every pod (largest first) on `nodes`' room, first fit, taking it from `room`;
    when one finds no room, undo and return False."""
    taken: list[tuple[list[int], Requirements]] = []
    for c in sorted(pods, key=size_order):
        free = _take_room(c.need, nodes, room)
        if free is None:
            for undo, need in taken:
                _minus(undo, need, -1)
            return False
        taken.append((free, c.need))
    return True


def _minus(free: list[int], need: Requirements, sign: int) -> None:
    free[0] -= sign * need.vcpus
    free[1] -= sign * need.ram
    free[2] -= sign * need.scratch
    free[3] -= sign * need.gpus
