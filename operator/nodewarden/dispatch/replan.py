"""When the dispatcher plans: only when something the plan reads changed, or a time came.

A plan reads the queue, the pool's nodes (capacity, listings, creates under way), the
power board (state, readiness, admission), the default policy, the settings and the
cloud's create permissions. Each tick the loop takes `PlanMarks` -- counters and
identities, cheap to take -- and `plan_wanted` (pure) compares them with the marks of the
last plan:

- `FIRST`: no plan yet;
- `CHANGE`: a mark moved (a container, node or policy observed, a worker probe whose
  plan-relevant facts changed, a start, claim or write that ended, a board change, a
  create permission that came or went -- a cloud back-off's `retry_at` passing moves it);
- `OUTSTANDING`: starts, claims or writes are under way (their end may free a node);
- `DUE`: a time the last plan named came (a lock-flap retry, a deferred scheduling-status
  write);
- `BACKSTOP`: `dispatch.replan_backstop` seconds since the last plan (a safety net).

An idle tick (none of these) plans nothing and writes nothing. Worker probes poke the
loop after every probe; `NodeMarks` turns the pool into one counter that moves only when
a node's plan-relevant facts did, so a probe that found nothing new is ignored.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from nodewarden.pool.worker import Worker


class PlanTrigger(StrEnum):
    """Why a tick plans (the label of `nodewarden_dispatch_plans_total`)."""

    FIRST = "first"
    CHANGE = "change"
    OUTSTANDING = "outstanding"
    DUE = "due"
    BACKSTOP = "backstop"


@dataclass(frozen=True, slots=True)
class PlanMarks:
    """What a plan was made from, as counters and identities (module docstring). Two
    marks are equal when nothing the plan reads moved between them."""

    queue: int
    """The queue's version (bumped by every container observed)."""
    nodes: int
    """`NodeMarks.version`: bumped when a node's plan-relevant facts changed."""
    board: int
    """The power board's version (views and admission)."""
    tasks: int
    """`DispatchContext.task_ends`: starts, claims, lock checks and writes that ended."""
    cloud: tuple[object, ...]
    """Each instance type's create permission now (a lifted back-off changes it)."""
    policy: object
    """The default policy as the book holds it (a new object per observed version)."""
    settings: object
    recovered: bool


def plan_wanted(
    marks: PlanMarks,
    last: PlanMarks | None,
    now: datetime,
    *,
    planned_at: datetime | None,
    due_at: datetime | None,
    backstop: timedelta,
    outstanding: bool,
) -> PlanTrigger | None:
    """Why this tick plans, or None: nothing changed, nothing is under way, no time came."""
    if last is None or planned_at is None:
        return PlanTrigger.FIRST
    if marks != last:
        return PlanTrigger.CHANGE
    if outstanding:
        return PlanTrigger.OUTSTANDING
    if due_at is not None and now >= due_at:
        return PlanTrigger.DUE
    if now - planned_at >= backstop:
        return PlanTrigger.BACKSTOP
    return None


def earliest(times: Iterable[datetime | None]) -> datetime | None:
    """The first of `times` (None entries left out), or None."""
    return min((t for t in times if t is not None), default=None)


_Facts = tuple[object, ...]
"""A node's plan-relevant facts but its runner list (`_facts`)."""


def _facts(w: Worker) -> _Facts:
    """What the plan reads of a node besides its runner list: capacity and price (spec,
    instance type, instance), whether it is listed, destroyed, broken or being created."""
    return (
        w.spec,
        w.instance_type,
        w.price,
        w.instance is None,
        w.destroy_requested_at is None,
        w.broken,
        w.creating,
        w.side,
    )


class NodeMarks:
    """The pool as one counter that moves only when a node's plan-relevant facts did
    (`_facts`, and the runners it lists): one pass of comparisons per tick, a copy only
    of what changed."""

    def __init__(self) -> None:
        self.version = 0
        self._seen: dict[str, tuple[_Facts, dict[str, int] | None]] = {}

    def observe(self, workers: Mapping[str, Worker]) -> int:
        """Compare every node with what was seen last; the version after."""
        seen = self._seen
        changed = len(workers) != len(seen)
        for name, w in workers.items():
            facts = _facts(w)
            last = seen.get(name)
            if last is None or last[0] != facts or last[1] != w.runners:
                seen[name] = (facts, None if w.runners is None else dict(w.runners))
                changed = True
        if len(seen) != len(workers):
            for name in [n for n in seen if n not in workers]:
                del seen[name]
        if changed:
            self.version += 1
        return self.version


def handover_interval(max_ages: Iterable[timedelta], backstop: timedelta) -> timedelta:
    """How often an unchanged plan is handed to the power controller again: a quarter of
    the shortest telemetry max age of the policies (its demand and work readings carry
    the hand-over's time), never longer than the backstop (an invalid policy's age of
    zero or less is left out)."""
    shortest = min((age for age in max_ages if age > timedelta(0)), default=None)
    return backstop if shortest is None else min(shortest / 4, backstop)
