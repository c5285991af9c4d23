"""The Arvados rows: the cloud dispatcher (arvados-dispatch-cloud) and the node manager.

Placement, both rows (Arvados' own, `ArvadosPlacement`): each container gets the
cheapest instance type that fits it -- within MaximumPriceFactor (the fleet's
`instanceTypePolicy.price_factor`, 1.5 by default) of that price the next type is used
when the cheaper has no capacity -- and runs alone on a node of that
type: "the dispatcher only runs one container at a time on an instance, even if the
instance has enough RAM and CPUs to accommodate more" (doc/architecture/dispatchcloud).
An idle node of the type first, else a node of it booting for no other container, else
a new one; containers by priority, then age. Side-node groups are types of their own
with a quota of their `count` (Arvados has no bare-metal driver: as if it had one).

* **dispatch-cloud** (`DispatchCloud`): an idle node is shut down after `TimeoutIdle`
  (default 1m); a node whose boot probe has not passed within the boot timeout
  (`TimeoutBooting`, 10m here) is shut down.
* **node manager** (`NodeManager`, services/nodemanager, retired in Arvados 2.0 with
  crunch-dispatch-slurm): polls every `poll_time` (60 s) and boots the cheapest size for
  each queued container no idle or booting node covers (containers start on idle nodes
  of their size whenever one is free: SLURM with the `instancetype` constraint); shuts a
  node down only when it is idle and its uptime is inside a shutdown window
  (`shutdown_windows = 54, 5, 1`: from minute 54 to minute 59 of every hour of uptime,
  made for clouds billing per started hour); a node that never paired is shut down in a
  window after `boot_fail_after` (30 m). Its transition table's idle grace was never
  implemented (always "idle exceeded"). The knob swept is the first window (54).

Not modelled: cloud quota and rate-limit errors (and the shutdown of idle nodes they
trigger), the drain / hold idle behaviours, the node manager's max_nodes /
max_total_price, SLURM packing several containers onto one node-manager node, the
crunch-run start-up and the dispatcher's queue poll (a container is seen at arrival).
"""

from __future__ import annotations

from nodewarden.simulate.peers.world import (
    Kind,
    PContainer,
    PeerWorld,
    Phase,
    PNode,
    span,
)

_US = 1_000_000
TIMEOUT_BOOTING = 600 * _US
POLL = 60 * _US
BOOT_FAIL_AFTER = 1800 * _US


class ArvadosPlacement:
    """Cheapest type per container, one container per node (module docstring)."""

    name = "arvados"

    def __init__(self) -> None:
        self.creates = True

    def place(self, world: PeerWorld) -> None:
        idle: dict[str, list[PNode]] = {}
        booting: dict[str, list[PNode]] = {}
        for node in world.nodes.values():
            if node.running or node.planned or node.cordoned or node.down:
                continue
            if node.phase is Phase.READY:
                idle.setdefault(node.kind.name, []).append(node)
            elif node.phase is Phase.BOOTING:
                booting.setdefault(node.kind.name, []).append(node)
        factor = world.fleet.cloud.instance_type_policy.price_factor
        for c in world.queued():
            for kind in candidates(c, world.kinds, factor):
                chosen = _take(idle, kind) or _take(booting, kind)
                if chosen is None and self.creates:
                    chosen = world.launch(kind)
                if chosen is not None:
                    world.assign(c, chosen)
                    break


def _take(pool: dict[str, list[PNode]], kind: Kind) -> PNode | None:
    nodes = pool.get(kind.name)
    return nodes.pop(0) if nodes else None


def candidates(c: PContainer, kinds: list[Kind], factor: float) -> list[Kind]:
    """The kinds that fit, cheapest first, within `factor` of the cheapest's price."""
    fitting = [k for k in kinds if k.fits(c.need)]
    if not fitting:
        return []
    ceiling = fitting[0].price * factor
    return [k for k in fitting if k.price <= ceiling]


class DispatchCloud:
    """arvados-dispatch-cloud: TimeoutIdle, TimeoutBooting (module docstring)."""

    placement = ArvadosPlacement.name
    observes_power = True

    def __init__(self, timeout_idle_s: float = 60.0) -> None:
        self.timeout = round(timeout_idle_s * _US)
        self.name = f"arvados dispatch-cloud TimeoutIdle={span(timeout_idle_s)}"
        self.placer = ArvadosPlacement()

    def round(self, world: PeerWorld) -> None:
        self.placer.place(world)
        now = world.now
        for node in list(world.nodes.values()):
            if node.phase is Phase.READY and node.empty and node.idle_since is not None:
                due = node.idle_since + self.timeout
                if now >= due:
                    world.power_off(node)
                else:
                    world.request_round(due)
            elif node.phase is Phase.BOOTING:
                due = node.launched_at + TIMEOUT_BOOTING
                if now >= due:
                    world.power_off(node)
                else:
                    world.request_round(due)


class NodeManager:
    """The Arvados node manager: poll, shutdown windows (module docstring)."""

    placement = ArvadosPlacement.name
    observes_power = True

    def __init__(self, first_window_min: int = 54) -> None:
        if not 0 <= first_window_min <= 58:
            raise ValueError("the first shutdown window must be 0..58 minutes")
        self.closed = first_window_min * 60 * _US
        self.open = (59 - first_window_min) * 60 * _US
        self.name = (
            f"arvados node manager shutdown_windows={first_window_min},{59 - first_window_min},1"
        )
        self.placer = ArvadosPlacement()

    def in_window(self, node: PNode, now: int) -> bool:
        into_hour = (now - node.launched_at) % (3600 * _US)
        return self.closed <= into_hour < self.closed + self.open

    def round(self, world: PeerWorld) -> None:
        now = world.now
        poll = now % POLL == 0  # the node manager polls on its own clock
        self.placer.creates = poll
        self.placer.place(world)
        next_poll = (now // POLL + 1) * POLL
        if world.queued() or any(n.phase is not Phase.OFF for n in world.nodes.values()):
            world.request_round(next_poll)
        if not poll:
            return
        for node in list(world.nodes.values()):
            if not self.in_window(node, now):
                continue
            idle = node.phase is Phase.READY and node.empty
            failed = node.phase is Phase.BOOTING and now - node.launched_at >= BOOT_FAIL_AFTER
            if idle or failed:
                world.power_off(node)
