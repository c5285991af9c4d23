"""The Karpenter rows: consolidation `WhenEmpty` and `WhenEmptyOrUnderutilized` (v1).

Placement, both rows (Karpenter's own): the Kubernetes scheduler
binds pods to ready nodes (`packing.KubeScheduler`, LeastAllocated); the pods it cannot
place are batched -- the window closes 1 s after the last new pending pod, at most 10 s
after it opened (BATCH_IDLE_DURATION, BATCH_MAX_DURATION) -- and Karpenter's scheduling
simulation places the batch: onto nodes already launched and still booting where they
fit, then first-fit decreasing onto new NodeClaims, each keeping every instance type that
still holds all its pods; a NodeClaim launches the cheapest of them (on-demand: lowest
price). So one launch packs several pending pods onto one new node. Two NodePools: GPU
kinds (tainted: GPU pods only) and the rest. Side-node groups are instance types with at
most `count` nodes (Karpenter has no bare-metal provider: as if it had one).

Disruption (concepts/disruption): a node is consolidatable once `consolidateAfter` has
passed since a pod last scheduled to it or left it (v1 default 0s).

* `WhenEmpty`: consolidatable nodes with no pods are deleted.
* `WhenEmptyOrUnderutilized` (the v1 default): empty nodes first; then several nodes at
  once -- the largest prefix (of at most 100 candidates, fewest pods first) whose pods fit
  on the other nodes plus at most one new node cheaper than them all; then single nodes,
  deleted when their pods fit elsewhere, replaced when they fit on one cheaper new node.
  Pods are evicted: a batch pod runs again from the start (no do-not-disrupt
  annotation), its lost run billed and its wait counted. A replacement is launched first;
  the nodes drain once it is ready. One consolidation at a time.

The disruption budget (default `nodes: 10%` per NodePool: rounded up, minus the nodes
being deleted and those not ready) bounds the nodes disrupted at once; the disruption
controller looks at most every 10 s, when something changed or a consolidateAfter
passed.

Not modelled: drift, expiration (expireAfter 720h exceeds every trace), spot interruption,
the 15 s validation before a consolidation runs, max pods per node, daemonsets and
kube-reserved, topology spread and affinity, price-capacity-optimised spot choice,
registration TTL (a launch that never boots is deleted after 15 m, as cluster-autoscaler
does).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from nodewarden.simulate.peers.packing import (
    KubeScheduler,
    fit_elsewhere,
    pack_new,
    schedulable,
    size_order,
)
from nodewarden.simulate.peers.world import (
    Kind,
    PContainer,
    PeerWorld,
    Phase,
    PNode,
    span,
)

_US = 1_000_000
BATCH_IDLE = 1 * _US
BATCH_MAX = 10 * _US
DISRUPTION_PERIOD = 10 * _US
BUDGET = 0.10
MULTI_MAX = 100
REGISTRATION_TTL = 900 * _US


def available(world: PeerWorld, kind: Kind, taken: dict[str, int]) -> bool:
    """A node of the kind can be launched (side kinds: an off member not yet taken)."""
    if kind.vm:
        return True
    free = sum(
        1 for name in kind.members if (n := world.nodes[name]).phase is Phase.OFF and not n.down
    )
    return free > taken.get(kind.name, 0)


def launch_claims(world: PeerWorld, pods: Sequence[PContainer]) -> None:
    """Karpenter's launch for unschedulable pods: booting nodes with room, then new
    NodeClaims packed first-fit decreasing, each the cheapest kind holding its pods."""
    booting = [n for n in world.nodes.values() if n.phase is Phase.BOOTING and not n.cordoned]
    rest: list[PContainer] = []
    for c in sorted(pods, key=size_order):
        node = next((n for n in booting if n.fits(c.need)), None)
        if node is None:
            rest.append(c)
        else:
            world.assign(c, node)
    taken: dict[str, int] = {}
    for claim in pack_new(rest, world.kinds, lambda k: available(world, k, {})):
        kind = claim.cheapest(lambda k: available(world, k, taken))
        if kind is None:
            continue
        node = world.launch(kind)
        if node is None:
            continue
        taken[kind.name] = taken.get(kind.name, 0) + (not kind.vm)
        for c in claim.pods:
            world.assign(c, node)


class Karpenter:
    """A Karpenter NodePool's provisioning and disruption (module docstring)."""

    placement = "karpenter"
    observes_power = True

    def __init__(self, consolidate_after_s: float = 0.0, underutilized: bool = True) -> None:
        self.after = round(consolidate_after_s * _US)
        self.underutilized = underutilized
        policy = "WhenEmptyOrUnderutilized" if underutilized else "WhenEmpty"
        self.name = f"karpenter {policy} consolidateAfter={span(consolidate_after_s)}"
        self.kube = KubeScheduler()
        self.batch_open: int | None = None
        self.batch_last = 0
        self.seen: set[str] = set()
        self.closed_at = -1
        self.next_look = 0
        self.looked = -1
        self.ripe_seen: set[str] = set()
        self.action: tuple[list[PNode], PNode | None] | None = None

    def round(self, world: PeerWorld) -> None:
        left = self.kube.schedule(world)
        self._provision(world, left)
        self._registration(world)
        self._disrupt(world)

    # -- provisioning -----------------------------------------------------------------------

    def _provision(self, world: PeerWorld, left: list[PContainer]) -> None:
        if not left:
            self.batch_open = None
            return
        new = {c.uuid for c in left} - self.seen
        if self.batch_open is None:
            if not new and self.closed_at == world.changes:
                return  # nothing new since the last batch found no room
            self.batch_open = self.batch_last = world.now
            self.seen = {c.uuid for c in left}
        elif new:
            self.batch_last = world.now
            self.seen |= new
        close = min(self.batch_last + BATCH_IDLE, self.batch_open + BATCH_MAX)
        if world.now < close:
            world.request_round(close)
            return
        self.batch_open = None
        launch_claims(world, left)
        self.closed_at = world.changes

    def _registration(self, world: PeerWorld) -> None:
        for node in list(world.nodes.values()):
            if node.phase is Phase.BOOTING:
                due = node.launched_at + REGISTRATION_TTL
                if world.now >= due:
                    world.power_off(node)
                else:
                    world.request_round(due)

    # -- disruption -------------------------------------------------------------------------

    def _disrupt(self, world: PeerWorld) -> None:
        if self.action is not None:
            self._carry_on(world)
        now = world.now
        ready = [n for n in world.nodes.values() if schedulable(n)]
        ripe = {n.name for n in ready if now - n.last_event >= self.after}
        later = [n.last_event + self.after for n in ready if n.name not in ripe]
        if later:
            world.request_round(min(later))
        if not ripe or (world.changes == self.looked and ripe <= self.ripe_seen):
            return  # nothing new to consolidate since the last look
        if now < self.next_look:
            world.request_round(self.next_look)
            return
        self.looked, self.ripe_seen, self.next_look = world.changes, ripe, now + DISRUPTION_PERIOD
        up = [n for n in world.nodes.values() if n.phase is not Phase.OFF]
        self._consolidate(world, up, ready, ripe)

    def _budgets(self, up: list[PNode]) -> dict[bool, int]:
        out: dict[bool, int] = {}
        for pool in (False, True):
            nodes = [n for n in up if (n.kind.capacity.gpus > 0) is pool]
            deleting = sum(1 for n in nodes if n.phase is Phase.STOPPING or n.cordoned)
            notready = sum(1 for n in nodes if n.phase is Phase.BOOTING)
            out[pool] = math.ceil(len(nodes) * BUDGET) - deleting - notready
        return out

    def _consolidate(
        self, world: PeerWorld, up: list[PNode], ready: list[PNode], ripe: set[str]
    ) -> None:
        budget = self._budgets(up)
        candidates = [n for n in ready if n.name in ripe]
        for node in candidates:
            pool = node.kind.capacity.gpus > 0
            if node.empty and budget[pool] > 0:
                budget[pool] -= 1
                world.power_off(node)
        if not self.underutilized or self.action is not None:
            return
        busy = [n for n in candidates if n.running and not n.planned]
        busy.sort(key=lambda n: (len(n.running), -n.kind.price, n.name))
        for pool in (False, True):
            mine = [n for n in busy if (n.kind.capacity.gpus > 0) is pool]
            if budget[pool] <= 0 or not mine:
                continue
            if self._multi(world, mine, ready, budget[pool]) or self._single(world, mine, ready):
                return

    def _multi(self, world: PeerWorld, mine: list[PNode], ready: list[PNode], budget: int) -> bool:
        hi = min(len(mine), MULTI_MAX, budget)
        lo, best = 2, None
        while lo <= hi:
            mid = (lo + hi) // 2
            plan = self._plan(world, mine[:mid], ready)
            if plan is not None:
                best, lo = (mine[:mid], plan), mid + 1
            else:
                hi = mid - 1
        if best is None:
            return False
        self._execute(world, best[0], best[1])
        return True

    def _single(self, world: PeerWorld, mine: list[PNode], ready: list[PNode]) -> bool:
        for node in mine:
            plan = self._plan(world, [node], ready)
            if plan is not None:
                self._execute(world, [node], plan)
                return True
        return False

    def _plan(
        self, world: PeerWorld, nodes: list[PNode], ready: list[PNode]
    ) -> tuple[Kind | None] | None:
        """Can `nodes` go: their pods on the other nodes plus at most one new node cheaper
        than them all? (None: no; (None,): deletion; (kind,): replacement.)"""
        gone = {n.name for n in nodes}
        others = [n for n in ready if n.name not in gone and schedulable(n)]
        room = {n.name: list(n.free) for n in others}
        pods = [c for n in nodes for c in n.running.values()]
        left = fit_elsewhere(pods, others, room)
        if not left:
            return (None,)
        claims = pack_new(left, world.kinds, lambda k: available(world, k, {}))
        if len(claims) != 1 or sum(len(c.pods) for c in claims) != len(left):
            return None
        kind = claims[0].cheapest(lambda k: available(world, k, {}))
        if kind is None or kind.price >= sum(n.kind.price for n in nodes):
            return None
        return (kind,)

    def _execute(self, world: PeerWorld, nodes: list[PNode], plan: tuple[Kind | None]) -> None:
        for node in nodes:
            node.cordoned = True
        replacement = world.launch(plan[0]) if plan[0] is not None else None
        self.action = (nodes, replacement)
        self._carry_on(world)

    def _carry_on(self, world: PeerWorld) -> None:
        assert self.action is not None
        nodes, replacement = self.action
        if replacement is not None and replacement.phase is Phase.BOOTING:
            return  # pre-spin: drain once the replacement is ready
        for node in nodes:
            if node.phase is Phase.READY:
                world.power_off(node)  # drain: the pods are evicted and go back to the queue
        if all(n.phase is not Phase.READY for n in nodes):
            self.action = None
