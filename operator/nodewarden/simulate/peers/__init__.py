"""nodewarden.simulate.peers: other schedulers' power rules, as they behave, and the prophet.

Each peer row runs its own placement and power rules, from its own documentation
(docs/simulation.md "Peers" cites the sources and says what is not modelled), on the
same simulated fleet, trace and seed as nodewarden's policies, priced the same way:

    world       the fleet, physics and bookkeeping the peers act on (`PeerWorld`)
    packing     placement pieces: the Kubernetes scheduler, first-fit decreasing
    arvados     arvados-dispatch-cloud (TimeoutIdle) and the Arvados node manager
    karpenter   Karpenter WhenEmpty / WhenEmptyOrUnderutilized and its packing launch
    autoscaler  cluster-autoscaler (unneeded time, utilisation threshold, least-waste)
    slurm       SLURM power save (SuspendTime, rates, power state assumed)
    prophet     the clairvoyant reference: a run's placement with perfect power, no
                avoidable wait
    sweep       each peer's main knob swept; the cheapest at equal service

`PEERS` lists the rows: name, the knob swept, its default and sweep values, and how to
build the peer at a value.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from nodewarden.simulate.fleet import Fleet
from nodewarden.simulate.peers.arvados import DispatchCloud, NodeManager
from nodewarden.simulate.peers.autoscaler import ClusterAutoscaler
from nodewarden.simulate.peers.karpenter import Karpenter
from nodewarden.simulate.peers.prophet import prophet_of_world
from nodewarden.simulate.peers.slurm import Slurm
from nodewarden.simulate.peers.world import Peer, PeerRun, PeerWorld
from nodewarden.simulate.trace import Trace


@dataclass(frozen=True, slots=True)
class PeerSpec:
    """One peer row: how to build it at a knob value."""

    name: str
    knob: str
    unit: str
    default: float
    sweep: tuple[float, ...]
    build: Callable[[float], Peer]


PEERS: tuple[PeerSpec, ...] = (
    PeerSpec(
        "arvados dispatch-cloud",
        "TimeoutIdle",
        "s",
        60,
        (0, 30, 60, 120, 300),
        DispatchCloud,
    ),
    PeerSpec(
        "arvados node manager",
        "first shutdown window",
        "min",
        54,
        (54, 45, 30, 15, 0),
        lambda v: NodeManager(int(v)),
    ),
    PeerSpec(
        "karpenter WhenEmpty",
        "consolidateAfter",
        "s",
        0,
        (0, 30, 120, 300, 900),
        lambda v: Karpenter(v, underutilized=False),
    ),
    PeerSpec(
        "karpenter WhenEmptyOrUnderutilized",
        "consolidateAfter",
        "s",
        0,
        (0, 30, 120, 300, 900),
        lambda v: Karpenter(v, underutilized=True),
    ),
    PeerSpec(
        "cluster-autoscaler",
        "scale-down-unneeded-time",
        "s",
        600,
        (60, 120, 300, 600, 1200),
        ClusterAutoscaler,
    ),
    PeerSpec(
        "slurm power save",
        "SuspendTime",
        "s",
        600,
        (60, 120, 300, 600, 1800),
        Slurm,
    ),
)


def run_peer(trace: Trace, fleet: Fleet, peer: Peer, seed: int) -> PeerRun:
    """One peer on one trace, fleet and seed."""
    return PeerWorld(trace, fleet, peer, seed).run()


def run_peer_and_prophet(
    trace: Trace, fleet: Fleet, peer: Peer, seed: int
) -> tuple[PeerRun, PeerRun]:
    """One peer's run, and the prophet of that run (its placement, clairvoyant power)."""
    world = PeerWorld(trace, fleet, peer, seed)
    run = world.run()
    return run, prophet_of_world(world)


__all__ = ["PEERS", "PeerRun", "PeerSpec", "run_peer", "run_peer_and_prophet"]
