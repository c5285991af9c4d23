"""PowerPolicy `status.inForce` (issue 27): the policy in force now, per node class it
governs -- effective thresholds, budgets in use and left, windows and the next change by
the clock, the forecast's state, nodes by power phase. Built by `rules.inforce`; written
by `power.inforce`; the simulator puts the same document in each result.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import Field

from nodewarden.api.base import StatusModel
from nodewarden.api.warmcapacity import MAX_NODE_CLASSES


class NodeCounts(StatusModel):
    """A policy's (or one node class's) nodes by power phase."""

    total: int = Field(default=0, ge=0, le=2**31, description="Nodes.")
    on: int = Field(default=0, ge=0, le=2**31, description="On (idle or busy).")
    off: int = Field(default=0, ge=0, le=2**31, description="Off.")
    transitioning: int = Field(
        default=0, ge=0, le=2**31, description="Draining, shutting down or waking."
    )
    unknown: int = Field(default=0, ge=0, le=2**31, description="Unknown or Blocked.")


class BudgetInForce(StatusModel):
    """A budget: its size, how much of it is in use, what is left."""

    max: int = Field(ge=0, le=2**31, description="The budget.")
    in_use: int = Field(ge=0, le=2**31, description="Used now.")
    left: int = Field(ge=0, le=2**31, description="Left now.")


class ThresholdsInForce(StatusModel):
    """The effective thresholds (spec values after defaults)."""

    idle_threshold: str = Field(max_length=32, description="Idle threshold.")
    min_on: str = Field(max_length=32, description="Minimum on time.")
    min_off: str = Field(max_length=32, description="Minimum off time.")
    cooldown: str = Field(max_length=32, description="Cooldown between transitions.")
    boot_grace: str = Field(max_length=32, description="Boot grace.")
    telemetry_max_age: str = Field(max_length=32, description="Telemetry max age.")
    min_warm_nodes: int = Field(ge=0, le=100000, description="Idle nodes kept on.")


class ClassInForce(StatusModel):
    """One node class the policy governs ('(all)': its nodes in no class)."""

    name: str = Field(max_length=63, description="The node class.")
    nodes: NodeCounts = Field(description="Its nodes by power phase.")
    warm_window: str | None = Field(
        default=None, max_length=63, description="The warm window open now (largest minWarm)."
    )
    min_warm: int | None = Field(
        default=None, ge=0, le=100000, description="Warm nodes the open window wants."
    )
    window_mode: str | None = Field(
        default=None, max_length=16, description="The warm windows' lever mode."
    )
    next_window_change_at: datetime | None = Field(
        default=None, description="When one of the class's windows opens or closes next."
    )
    forecast: str | None = Field(
        default=None, max_length=16, description="Off, Learning, Shadow or On."
    )


class PolicyInForce(StatusModel):
    """The policy in force now (`rules.inforce`): written when a node moves or a window
    boundary comes, never as a countdown."""

    mode: str = Field(max_length=16, description="Normal, Shadow or Paused.")
    thresholds: ThresholdsInForce = Field(description="Effective thresholds.")
    disruption_budget: BudgetInForce = Field(
        description="Side-node transitions at once: the budget, in use, left."
    )
    consolidation_budget: BudgetInForce | None = Field(
        default=None,
        description="Consolidation by drain: the budget, in use, left (when configured).",
    )
    window: str = Field(
        max_length=512, description="The warm windows open now ('none' when none is)."
    )
    billing_window: str = Field(max_length=256, description="The billing window in force.")
    forecast: str = Field(max_length=16, description="Forecast wake: Off, Learning, Shadow or On.")
    nodes: NodeCounts = Field(description="The policy's nodes by power phase.")
    classes: list[ClassInForce] = Field(
        default_factory=list, max_length=MAX_NODE_CLASSES + 1, description="Per node class."
    )
    next_change_at: datetime | None = Field(
        default=None, description="When what is in force changes next by the clock."
    )
    next_change: str | None = Field(default=None, max_length=256, description="What changes then.")
