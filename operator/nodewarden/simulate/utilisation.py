"""Price-weighted utilisation: how much of what the nodes cost paid for work.

    price-weighted utilisation = Σ over containers that ran to the end of
                                 run time x share of its node x the node's price ÷ cost

A container's share of its node is its dominant share: the largest, over vCPUs, RAM,
scratch and GPUs, of what it reserves (its effective requirements, RAM overhead and
discount included, as the scheduler counts them) divided by what the node has, at most 1.
A node running one container that reserves all of it for its whole life, billed per
second, scores 1; a node billed for an idle hour, or running one small container, scores
far less. Evicted runs (re-run elsewhere) count nothing: only the run that finished is
work. The same figure is computed for nodewarden's policies (`simulate.engine`), the
peers and the prophet (`simulate.peers`).
"""

from __future__ import annotations

from nodewarden.scheduling.instancetypes import Requirements
from nodewarden.scheduling.views import Capacity

_HOUR = 3600 * 1_000_000


def dominant_share(need: Requirements, capacity: Capacity) -> float:
    """The largest share of the node's capacity the container reserves (≤ 1)."""
    share = 0.0
    for used, have in (
        (need.vcpus, capacity.vcpus),
        (need.ram, capacity.ram),
        (need.scratch, capacity.scratch),
        (need.gpus, capacity.gpus),
    ):
        if used and have:
            share = max(share, used / have)
    return min(share, 1.0)


def weighted_work(runtime_us: int, share: float, price: float) -> float:
    """A finished container's price-weighted work (currency units)."""
    return runtime_us * share * price / _HOUR
