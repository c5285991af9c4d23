"""The cluster-autoscaler row (kubernetes/autoscaler, cluster-autoscaler/FAQ.md).

Placement (the Kubernetes scheduler's and cluster-autoscaler's):
the scheduler binds pods to ready nodes (`packing.KubeScheduler`, LeastAllocated).
Every scan interval (10 s) the autoscaler looks at the pods it could not place: those
that fit on nodes already coming up wait for them; for the rest it estimates, for every
node group (one per instance type or side-node group), how many new nodes would hold
them (the bin-packing estimator: first-fit decreasing), and the `least-waste` expander
picks the group that leaves the least idle CPU (ties: least idle memory) after the
scale-up; that group grows by the estimate (one group per scan). Side-node groups are
node groups of at most `count` nodes (as with Cluster API and a bare-metal provider).
GPU node groups take GPU pods only (tainted).

Scale-down (FAQ "How does scale-down work?"): every scan a ready node is unneeded while
the sum of its pods' CPU and memory requests is below `scale-down-utilization-threshold`
(0.5) of its allocatable, each taken alone (GPU nodes: GPU requests,
`scale-down-gpu-utilization-threshold` 0.5), and all its pods fit on the other nodes (a
simulation that remembers where the pods of the nodes already found unneeded went). A
node unneeded for `scale-down-unneeded-time` (10 m) is removed, in a scan without a
scale-up once `scale-down-delay-after-add` (10 m) has passed since the last scale-up
(the unneeded time runs on meanwhile): empty ones up to 10 at a time
(`max-empty-bulk-delete`), a node with pods one at a time, its pods evicted (a batch pod
runs again from the start, its lost run billed and its wait counted). A node not
registered after `max-node-provision-time` (15 m) is removed.

Not modelled: scale-down-delay-after-failure, PodDisruptionBudgets, the 10-minute
graceful termination (pods are evicted at once), node-group min sizes and
max-nodes-total, scale-down-unready-time, balance-similar-node-groups, pods that block a
scale-down (local storage, no controller), new-pod-scale-up-delay.
"""

from __future__ import annotations

from nodewarden.simulate.peers.packing import (
    KubeScheduler,
    move_all,
    pack_kind,
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
SCAN = 10 * _US
PROVISION_TIME = 900 * _US
BULK_EMPTY = 10


def scale_up(world: PeerWorld, pods: list[PContainer]) -> bool:
    """One scan's scale-up: wait on coming nodes, else grow the least-waste group."""
    coming = [n for n in world.nodes.values() if n.phase is Phase.BOOTING and not n.cordoned]
    rest: list[PContainer] = []
    for c in sorted(pods, key=size_order):
        node = next((n for n in coming if n.fits(c.need)), None)
        if node is None:
            rest.append(c)
        else:
            world.assign(c, node)
    best: tuple[tuple[float, float, float, str], Kind, list[list[PContainer]]] | None = None
    for kind in world.kinds:
        limit = None
        if not kind.vm:
            limit = sum(
                1
                for m in kind.members
                if world.nodes[m].phase is Phase.OFF and not world.nodes[m].down
            )
            if limit == 0:
                continue
        bins = pack_kind(rest, kind, limit)
        if not bins:
            continue
        cap = kind.capacity
        cpu = sum(c.need.vcpus for b in bins for c in b)
        ram = sum(c.need.ram for b in bins for c in b)
        n = len(bins)
        key = (1 - cpu / (n * cap.vcpus), 1 - ram / (n * cap.ram), kind.price, kind.name)
        if best is None or key < best[0]:
            best = (key, kind, bins)
    if best is None:
        return False
    _, kind, bins = best
    for members in bins:
        node = world.launch(kind)
        if node is None:
            break
        for c in members:
            world.assign(c, node)
    return True


def utilisation(node: PNode) -> float:
    cpu, ram, gpu = node.usage()
    return gpu if node.kind.capacity.gpus else max(cpu, ram)


class ClusterAutoscaler:
    """cluster-autoscaler's scan loop (module docstring)."""

    placement = "kube-scheduler + autoscaler"
    observes_power = True

    def __init__(
        self,
        unneeded_s: float = 600.0,
        threshold: float = 0.5,
        delay_after_add_s: float = 600.0,
    ) -> None:
        self.unneeded = round(unneeded_s * _US)
        self.threshold = threshold
        self.delay_after_add = round(delay_after_add_s * _US)
        self.name = f"cluster-autoscaler scale-down-unneeded-time={span(unneeded_s)}"
        self.kube = KubeScheduler()
        self.next_scan = 0
        self.last_scale_up = -(1 << 62)
        self.since: dict[str, int] = {}
        self.looked = -1

    def round(self, world: PeerWorld) -> None:
        left = self.kube.schedule(world)
        now = world.now
        if now < self.next_scan:
            if left or any(n.phase is not Phase.OFF for n in world.nodes.values()):
                world.request_round(self.next_scan)
            return
        self.next_scan = (now // SCAN + 1) * SCAN
        scaled = bool(left) and scale_up(world, left)
        if scaled:
            self.last_scale_up = now
        for node in list(world.nodes.values()):
            if node.phase is Phase.BOOTING and now - node.launched_at >= PROVISION_TIME:
                world.power_off(node)
        self._track_unneeded(world)
        if not scaled and now - self.last_scale_up >= self.delay_after_add:
            self._scale_down(world)
        if world.queued() or any(n.phase is not Phase.OFF for n in world.nodes.values()):
            world.request_round(self.next_scan)

    def _track_unneeded(self, world: PeerWorld) -> None:
        """Every scan, scale-up or not: which nodes are unneeded, and since when."""
        if world.version != self.looked:
            self.looked = world.version
            ready = [n for n in world.nodes.values() if schedulable(n) and not n.planned]
            now = world.now
            self.since = {name: self.since.get(name, now) for name in self._unneeded(ready)}

    def _scale_down(self, world: PeerWorld) -> None:
        now = world.now
        ready = [n for n in world.nodes.values() if schedulable(n) and not n.planned]
        ripe = [
            n for n in ready if n.name in self.since and now - self.since[n.name] >= self.unneeded
        ]
        empty = [n for n in ripe if not n.running][:BULK_EMPTY]
        for node in empty:
            world.power_off(node)
            del self.since[node.name]
        if not empty:
            busy = [n for n in ripe if n.running]
            if busy:
                world.power_off(busy[0])  # drain: its pods are evicted
                del self.since[busy[0].name]

    def _unneeded(self, ready: list[PNode]) -> list[str]:
        room = {n.name: list(n.free) for n in ready}
        gone: set[str] = set()
        for node in sorted(ready, key=lambda n: (utilisation(n), n.name)):
            if utilisation(node) >= self.threshold or room[node.name] != node.free:
                continue  # busy enough, or already holds pods moved from a node found unneeded
            others = [m for m in ready if m is not node and m.name not in gone]
            if move_all(node.running.values(), others, room):
                gone.add(node.name)
        return sorted(gone)
