"""Consolidation by drain in a PowerPolicy (`spec.consolidation`): when a node whose
containers could all run on other open nodes, and whose price per used resource is high,
stops admitting new work. It finishes what it runs; then the usual idle path applies.
Never an eviction.

The lever's mode is Off / Shadow / On like the warm-capacity levers; it starts in Shadow
(what it would drain is recorded as PowerIntents in phase Shadow, nothing is done). The
pure rule is `rules.consolidation`; the annotation that keeps a node or a container out
of it is `DO_NOT_CONSOLIDATE`.
"""

from __future__ import annotations

from pydantic import Field

from nodewarden.api.base import ApiModel
from nodewarden.api.warmcapacity import LeverMode
from nodewarden.units import Duration

DO_NOT_CONSOLIDATE = "nodewarden.io/do-not-consolidate"
"""On a WorkerNode or a ContainerDispatch (value "true"): the node (or the node the
container runs on) is never drained by consolidation (Karpenter's do-not-disrupt)."""


class Consolidation(ApiModel):
    """Consolidation by drain, never by eviction."""

    mode: LeverMode = Field(
        default="Shadow",
        description=(
            "Shadow (default): what it would drain is recorded (PowerIntents in phase "
            "Shadow with their Safety Record), nothing is done. On: a lightly used, dear "
            "node whose work fits elsewhere stops admitting new work; it finishes what it "
            "runs and then goes the usual idle way. Off: not even evaluated."
        ),
    )
    max_utilisation: float = Field(
        default=0.5,
        ge=0.0,
        le=1.0,
        description=(
            "A node is lightly used when the share of its vCPUs, RAM and GPUs its "
            "containers hold (the largest of the three) is at most this."
        ),
    )
    min_price_ratio: float = Field(
        default=1.5,
        ge=1.0,
        le=1000.0,
        description=(
            "A node is dear when its hourly price divided by its used share is at least "
            "this many times the price per used resource its work would have on the "
            "nodes it could move to (those nodes' price over their share used after the "
            "move)."
        ),
    )
    consolidate_after: Duration = Field(
        default="5m",
        description=(
            "How long a node's work must stay unchanged before it is considered (its "
            "containers' starts and ends are its due times, never a scan of the fleet)."
        ),
    )
    recheck_after: Duration = Field(
        default="15m",
        description=(
            "A lightly used node whose work did not fit elsewhere is considered again "
            "this long after (other nodes may have freed room)."
        ),
    )
    max_concurrent: int = Field(
        default=1,
        ge=0,
        le=10000,
        description=(
            "Consolidation budget: nodes draining for consolidation at once under this "
            "policy (a node counts until its work has ended). Separate from "
            "disruptionBudget.maxConcurrentTransitions: a drain waiting hours for a long "
            "job never blocks a wake or a shutdown."
        ),
    )
