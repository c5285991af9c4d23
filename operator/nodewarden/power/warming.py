"""The power controller's side of warm capacity: each node's class, the class's counts
and the levers' target in its fleet reading, the targets at their due times, and the
forecast's persistence (`rules.warm`, `rules.forecast`, `power.warmbook`).

* `reading(rt, now)`: the node's fleet reading (`FleetTally`) with its class (the first
  `spec.nodeClasses` entry that matches it), the class's warm and coming nodes and the
  target the levers want now (`rules.warm.with_class`). The gates hold a node whose
  going would leave the class short (WARM_WINDOW, FORECAST_DEMAND) and wake an Off side
  node of a class short of warm and coming nodes (the wake gates still apply).
* `due(now)`: at the agenda's warm due time -- a window boundary or a forecast hour
  (`rules.warm.next_window_boundary`, `rules.forecast.next_due`), never a scan per round
  -- or when a policy changed: advance the histograms, compute every class's target,
  step the nodes of the classes whose target moved, and write each policy's
  `status.warmCapacity` and `status.forecast` (the histogram, so a restart or deleted
  ContainerDispatches lose nothing) when they changed.
* A class that loses a warm or coming node (`FleetTally.class_changed`) below its target
  steps its Off nodes: one of them may be woken.
* The default policy's targets go on the power board (`PowerBoard.set_warm`): the
  dispatcher creates cloud VMs for its cloud classes from them (`dispatch.warming`).
* The forecast's arrivals come from the dispatcher's plans (`planned`, `power.warmbook`);
  a policy's stored histogram from its status (`observe_policy`).

Calls nothing above it; the round calls `due` and `reading`, the controller `planned`
and `observe_policy`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from nodewarden.api.kinds import POWER_POLICY
from nodewarden.api.warmcapacity import ClassWarmth, ForecastWake, NodeClass, WarmStatus
from nodewarden.fleet.board import WarmWant
from nodewarden.fleet.policies import Policy
from nodewarden.kube.client import KubeError
from nodewarden.metrics import FORECAST_DAYS, WARM_TARGET
from nodewarden.policy.events import Evaluate
from nodewarden.policy.facts import FleetReading
from nodewarden.policy.state import PowerState
from nodewarden.power.context import PowerContext
from nodewarden.power.runtime import NodeRuntime
from nodewarden.power.warmbook import WarmBook
from nodewarden.rules.demand import node_view
from nodewarden.rules.forecast import Histogram, covered, forecast_want, next_due, to_status
from nodewarden.rules.warm import (
    NO_TARGET,
    ForecastFn,
    LeverWant,
    WarmTarget,
    class_of,
    next_window_boundary,
    targets,
    windows_of,
    with_class,
)
from nodewarden.scheduling.views import ContainerView

log = logging.getLogger(__name__)

_NOTHING: dict[str, WarmTarget] = {}


class PowerWarmth:
    """See the module docstring."""

    def __init__(self, ctx: PowerContext) -> None:
        self.ctx = ctx
        self.book = WarmBook(ctx.catalogue, ctx.type_policy)
        self.targets: dict[str, dict[str, WarmTarget]] = {}
        """Per PowerPolicy name: each class's target at the last due time."""
        self.next_due: datetime | None = None
        """The next window boundary or forecast hour (None: compute at the next round)."""
        self._versions: tuple[Any, ...] | None = None
        self._written: dict[str, dict[str, Any]] = {}
        ctx.tally.class_changed = self._class_changed

    # -- a node's class and reading ----------------------------------------------------

    def reading(self, rt: NodeRuntime, now: datetime) -> FleetReading | None:
        policy = self.ctx.policy(rt)
        self._classify(rt, policy)
        base = self.ctx.tally.reading(rt.policy_name, now)
        name = rt.node_class
        if name is None:
            return base
        target = self.targets.get(policy.name, _NOTHING).get(name, NO_TARGET)
        return with_class(base, name, self._counts(policy.name, name), target)

    def _counts(self, policy: str, node_class: str) -> tuple[int, int]:
        """(warm, coming) nodes of a class under a policy, whichever way they name it."""
        warm, coming = 0, 0
        for key in self._keys(policy):
            w, c = self.ctx.tally.class_counts(key, node_class)
            warm, coming = warm + w, coming + c
        return warm, coming

    def _classify(self, rt: NodeRuntime, policy: Policy) -> None:
        """Set `rt.node_class` (its fleet marks follow) when its spec or policy changed."""
        spec = rt.spec
        key = (id(spec), policy.view.version)
        if rt.classed_from == key:
            return
        rt.classed_from = key
        found = None
        if spec is not None and policy.spec.node_classes:
            gpu = spec.capacity.gpu_model if spec.capacity is not None else None
            found = class_of(
                rt.name, spec.node_type, spec.instance_type, gpu, policy.spec.node_classes
            )
            if found is not None and spec.node_type == "SideNode":
                view = node_view(rt.name, spec, self.ctx.catalogue)
                if view is not None:
                    self.book.register(policy.name, found, view)
        if rt.node_class != found:
            rt.node_class = found

    # -- due times ---------------------------------------------------------------------

    def due(self, now: datetime) -> None:
        """Recompute the targets when their due time came or a policy changed."""
        policies = self._policies()
        versions = tuple((p.name, p.view.version) for p in policies)
        if versions == self._versions and (self.next_due is None or now < self.next_due):
            return  # nothing due (None: nothing until a policy changes)
        self._versions = versions
        active = {p.name for p in policies}
        for name in [n for n in self.targets if n not in active]:  # its levers went Off
            for node_class in self.targets.pop(name):
                self._look_again(name, node_class, only_off=False)
                self._gauge(name, node_class, NO_TARGET)
        upcoming = [t for p in policies if (t := self._policy_due(p, now)) is not None]
        self.next_due = min(upcoming) if upcoming else None
        default = self.targets.get(self.ctx.policies.default_name, _NOTHING)
        self.ctx.board.set_warm(
            {name: WarmWant(t.count, t.shadow_count, t.why) for name, t in default.items()}
        )

    def _policy_due(self, policy: Policy, now: datetime) -> datetime | None:
        """One policy's targets now (the nodes of a class whose target moved step again);
        its status written when it changed; its next due time."""
        spec = policy.spec
        before = self.targets.get(policy.name, _NOTHING)
        h = self.book.histogram(policy.name, spec, now)
        if h is not None:
            h.advance(now)
            FORECAST_DAYS.labels(policy.name).set(h.days_observed)
        windows = windows_of(spec.warm_capacity)
        classes = covered(spec.forecast_wake, spec.node_classes)
        forecast = _forecast(h, classes, spec.forecast_wake)
        after = targets(
            spec.node_classes,
            windows,
            spec.warm_capacity.mode,
            forecast,
            spec.forecast_wake.mode,
            now,
        )
        self.targets[policy.name] = after
        for name in before.keys() | after.keys():
            if before.get(name) != after.get(name):
                self._look_again(policy.name, name, only_off=False)
                self._gauge(policy.name, name, after.get(name, NO_TARGET))
        upcoming: list[datetime] = []
        if spec.warm_capacity.mode != "Off" and windows:
            boundary = next_window_boundary(windows, now)
            if boundary is not None:
                upcoming.append(boundary)
        if h is not None and classes:
            hour = next_due(h, classes, now)
            if hour is not None:
                upcoming.append(hour)
        next_at = min(upcoming) if upcoming else None
        self._persist(policy, now, next_at)
        return next_at

    # -- inputs ------------------------------------------------------------------------

    def observe_policy(self, body: Mapping[str, Any], deleted: bool) -> None:
        """A PowerPolicy event: the histogram its status holds is kept the first time."""
        name = (body.get("metadata") or {}).get("name")
        if not name:
            return
        if deleted:
            self.book.forget(name)
        else:
            self.book.observe(name, body.get("status"))

    def planned(self, containers: list[ContainerView], now: datetime) -> None:
        """The dispatcher's plan: the containers it holds for the first time are the
        forecasts' arrivals (`WarmBook.planned`)."""
        policies = [
            (p.name, p.spec) for p in self._policies() if p.spec.forecast_wake.mode != "Off"
        ]
        if policies or self.book.started_at is None:
            self.book.planned(containers, policies, now)

    def _policies(self) -> list[Policy]:
        """The policies whose levers have something to do (classes, and a window or a
        forecast that is not Off)."""
        out: list[Policy] = []
        for policy in self.ctx.policies.policies.values():
            spec = policy.spec
            if policy.view.problems or not spec.node_classes:
                continue
            windows = spec.warm_capacity.mode != "Off" and spec.warm_capacity.windows
            if windows or spec.forecast_wake.mode != "Off":
                out.append(policy)
        return out

    def _keys(self, policy: str) -> tuple[str | None, ...]:
        """The tally keys of a policy's nodes (those naming it, and those naming none
        when it is the default policy)."""
        return (policy, None) if policy == self.ctx.policies.default_name else (policy,)

    def _look_again(self, policy: str, node_class: str, only_off: bool) -> None:
        for key in self._keys(policy):
            for member in sorted(self.ctx.tally.members(key, node_class)):
                rt = self.ctx.nodes.get(member)
                if rt is None or (only_off and rt.state.state is not PowerState.OFF):
                    continue
                rt.events.append(Evaluate())
        self.ctx.wake.set()

    def _class_changed(self, key: tuple[str | None, str]) -> None:
        """A class lost a warm or coming node: short of its target, its Off nodes look
        again (one may be woken)."""
        tally_key, name = key
        policy = tally_key if tally_key is not None else self.ctx.policies.default_name
        target = self.targets.get(policy, _NOTHING).get(name)
        if target is None or target.count <= 0:
            return
        warm, coming = self._counts(policy, name)
        if warm + coming < target.count:
            self._look_again(policy, name, only_off=True)

    @staticmethod
    def _gauge(policy: str, name: str, target: WarmTarget) -> None:
        WARM_TARGET.labels(policy, name, "On").set(target.count)
        WARM_TARGET.labels(policy, name, "Shadow").set(target.shadow_count)

    # -- status ------------------------------------------------------------------------

    def _persist(self, policy: Policy, now: datetime, next_due_at: datetime | None) -> None:
        """Write `status.warmCapacity` (and `status.forecast`) when they changed."""
        spec = policy.spec
        classes = [
            ClassWarmth(
                name=name,
                target=t.count,
                lever=t.lever,
                why=(t.why or "")[:1024] or None,
                shadow_target=t.shadow_count,
                shadow_why=(t.shadow_why or "")[:1024] or None,
                expected=t.expected,
            )
            for name, t in sorted(self.targets.get(policy.name, _NOTHING).items())
        ]
        status: dict[str, Any] = {
            "warmCapacity": WarmStatus(
                evaluated_at=now, next_due=next_due_at, classes=classes
            ).to_wire()
        }
        h = self.book.histogram(policy.name, spec, now)
        if h is not None:
            status["forecast"] = to_status(h, spec.forecast_wake).to_wire()
        compare = {
            "classes": status["warmCapacity"].get("classes"),
            "forecast": status.get("forecast"),
        }
        if self._written.get(policy.name) == compare:
            return
        self._written[policy.name] = compare
        self.ctx.spawn(self._write(policy.name, status))

    async def _write(self, name: str, status: dict[str, Any]) -> None:
        try:
            await self.ctx.kube.patch_status(POWER_POLICY, self.ctx.namespace, name, status)
        except KubeError as exc:
            log.warning("PowerPolicy %s: warm-capacity status not written (%s)", name, exc)
            self._written.pop(name, None)  # written again at the next due time


def _forecast(
    h: Histogram | None, classes: list[NodeClass], settings: ForecastWake
) -> ForecastFn | None:
    """The forecast lever of one policy (None: its forecast is Off)."""
    if h is None:
        return None
    names = {c.name for c in classes}

    def want(c: NodeClass, at: datetime) -> LeverWant | None:
        return forecast_want(h, c, at, settings) if c.name in names else None

    return want
