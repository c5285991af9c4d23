"""Waiting for cheaper capacity within a budget: when a side node is expected ready, how
long a container may wait for it, and what its scheduling status says (pure).

A container that could have a new VM (its cheapest fitting type is available and creates
are not blocked: it has an alternative) may wait instead for cheaper capacity -- a side
node that is waking up, one the plan would wake for it, or a node whose room comes back
soon (containers being cancelled there) -- only while that is expected to delay its
start by at most its wait budget (`PlacementRules.budget`: the policy's
`waitBudget`, 0 s above `noWaitAbovePriority`):

    a waking node:   expected ready  <=  max(now, first seen + budget) + lead
    (a node freeing up: its room expected back by the same bound)
    an off node:     expected ready  <=  first seen + budget + lead

where `lead` is how long a new VM of its type takes to come up (as seen, `rules.boots`;
`ASSUMED_BOOT` before any was seen). So a container never waits for cheaper capacity
longer than the budget beyond what a VM would have given it at arrival; after its budget
it still takes a wake under way that is no slower than a new VM, but no longer counts on
a wake that has not begun. A container without
an alternative waits for whatever can run it (no budget applies); with the lever off
(`Unbounded`, earlier releases) every container does.

A side node is expected ready at its wake's start + its boot time as seen (`boot_seconds`,
the median of its last boots; `ASSUMED_BOOT` before any wake was seen); once that has
passed, by its slowest boot seen (twice the usual before any was seen); past that too the
wake is taken for hung and is waited for only by containers without an alternative. The plan names
the moments these judgements can change though nothing else does -- a budget running out
(first seen + budget), a waking node falling behind -- as its due time (`Plan.due`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from nodewarden.scheduling.placement import Ask, PlacementRules
from nodewarden.scheduling.views import CloudState, ContainerView, NodeState, NodeView
from nodewarden.units import format_duration

ASSUMED_BOOT = timedelta(minutes=2)
"""How long a node of a kind not yet seen coming up is assumed to take."""


@dataclass(frozen=True, slots=True)
class Patience:
    """How long one container may wait for cheaper capacity (module docstring)."""

    until: datetime | None
    """Capacity expected ready by then may be waited for; None: any (no alternative, or
    the lever is off)."""
    budget: timedelta | None
    ends: datetime | None = None
    """first seen + budget."""
    lead: timedelta = timedelta(0)

    def allows(self, ready_at: datetime | None, off: bool = False) -> bool:
        """It may wait for capacity expected ready at `ready_at` (None: a wake taken for
        hung, waited for only without an alternative). `off`: a side node not yet waking
        (the plan would wake it): only by first seen + budget + lead -- a wake the power
        controller holds back is not waited for past the budget."""
        if self.until is None:
            return True
        if ready_at is None:
            return False
        if off:
            assert self.ends is not None
            return ready_at <= self.ends + self.lead
        return ready_at <= self.until

    def due(self, view: NodeView, now: datetime) -> datetime | None:
        """When the judgement "it may wait for side node `view`" can change though nothing
        else does: a wake when it falls behind its usual boot, or its slowest; an off node
        (woken now: ready a boot from now) when `now + boot` passes the budget's end +
        lead."""
        if self.until is None or self.ends is None:
            return None
        _, changes = expected_ready(view, now)
        if view.state is NodeState.WAKING:
            return changes  # None: hung, stays so
        flips = self.ends + self.lead - boot_time(view)
        times = [t for t in (changes, flips) if t is not None and t > now]
        return min(times, default=None)


def lead(ask: Ask, cloud: CloudState) -> timedelta:
    """How long a new VM of the container's type takes to come up, as seen."""
    chosen = ask.choice.instance_type
    seen = cloud.boot_seconds.get(chosen.name) if chosen is not None else None
    return ASSUMED_BOOT if seen is None else timedelta(seconds=seen)


def patience(
    c: ContainerView, ask: Ask, rules: PlacementRules, cloud: CloudState, now: datetime
) -> Patience:
    budget = rules.budget(c.priority)
    alternative = ask.choice.instance_type is not None and cloud.creates_blocked is None
    if budget is None or not alternative:
        return Patience(None, budget, None)
    ends = c.first_seen + budget
    takes = lead(ask, cloud)
    return Patience(max(now, ends) + takes, budget, ends, takes)


def boot_time(view: NodeView) -> timedelta:
    seen = view.boot_seconds
    return ASSUMED_BOOT if seen is None else timedelta(seconds=seen)


def expected_ready(view: NodeView, now: datetime) -> tuple[datetime | None, datetime | None]:
    """When a side node that is waking (or would be woken now) is expected ready, and
    when that expectation changes though nothing else does (a due time). A wake is on
    time until its usual boot (the median seen) has passed, then late -- expected by its
    slowest boot seen (twice the usual when none is known) -- and past that taken for
    hung (None: not expected). An off node would be ready a boot after it may be woken
    (`NodeView.wake_after`: the power controller's min-off and cooldown)."""
    boot = boot_time(view)
    if view.state is not NodeState.WAKING:
        after = view.wake_after
        if after is not None and after > now:
            return after + boot, after
        return now + boot, None
    since = view.coming_since or now
    on_time = since + boot
    if on_time > now:
        return on_time, on_time
    slowest = timedelta(seconds=view.boot_slowest) if view.boot_slowest is not None else 2 * boot
    late = since + max(slowest, boot)
    if late > now:
        return late, late
    return None, None


def percent_cheaper(price: float, standalone: float | None) -> int | None:
    """How much cheaper per hour `price` is than the container's own cheapest type, in
    whole percent (None: not cheaper, or no type fits it)."""
    if standalone is None or standalone <= 0 or price >= standalone:
        return None
    return round(100 * (1 - price / standalone))


def freeing_status(node: str, wait: Patience) -> str:
    """The scheduling status of a container waiting for room on `node` to come back."""
    if wait.until is not None and wait.budget is not None:
        return f"waiting up to {format_duration(wait.budget)} for node {node} to free up"
    return f"waiting for node {node} to free up"


def side_status(node: str, wait: Patience, cheaper: int | None) -> str:
    """The scheduling status of a container waiting for side node `node` to wake."""
    if wait.until is not None and wait.budget is not None and cheaper is not None:
        return (
            f"waiting up to {format_duration(wait.budget)} for side node {node}: "
            f"{cheaper} % cheaper"
        )
    return f"waiting for side node {node} to wake"
