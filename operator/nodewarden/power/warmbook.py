"""The forecast's memory in the live operator: each PowerPolicy's histogram of arrivals
(`rules.forecast.Histogram`), the node shapes of its side-node classes, and the arrivals
taken from the dispatcher's plans.

* Arrivals: every container the dispatcher's ledger holds for the first time
  (`planned`, whatever its phase: one started in the plan that saw it arrive counts too),
  created after this process started, is classified (`rules.forecast.container_class`,
  from the class shapes) and counted in the histogram of every policy whose forecast is
  not Off. A container is an arrival once: the book remembers the uuids of the last plan.
* Persistence: the histogram lives in its PowerPolicy's `status.forecast`
  (`power.warming` writes it at the forecast's due times). The first time a policy is
  read (`observe`) the histogram in its status is kept and restored on first use
  (`histogram`), so a restart -- or ContainerDispatches deleted meanwhile -- loses at most
  the arrivals since the last write; the time the operator was down is not counted as
  watched, and containers created before this process started are not counted again.

Pure bookkeeping (no I/O); one per power controller.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from contextlib import suppress
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from nodewarden.api.powerpolicy import PowerPolicySpec
from nodewarden.api.warmcapacity import ForecastStatus
from nodewarden.rules.demand import idle_view
from nodewarden.rules.forecast import Histogram, container_class, covered, fresh, from_status
from nodewarden.scheduling.instancetypes import Catalogue, InstanceTypePolicy
from nodewarden.scheduling.views import Capacity, ContainerView, NodeView


@dataclass
class WarmBook:
    """See the module docstring."""

    catalogue: Catalogue
    type_policy: InstanceTypePolicy
    started_at: datetime | None = None
    """Containers created before this are not counted as arrivals (the first plan's time)."""
    histograms: dict[str, Histogram] = field(default_factory=dict)
    """Per PowerPolicy name whose forecast is not Off."""
    stored: dict[str, ForecastStatus] = field(default_factory=dict)
    """Per PowerPolicy name: the histogram its status held when it was first read."""
    shapes: dict[tuple[str, str], NodeView] = field(default_factory=dict)
    """Per (policy name, side-node class): a member node as the scheduler sees it idle."""
    seen: frozenset[str] = frozenset()
    """The uuids of the containers in the dispatcher's last plan."""
    since: dict[str, datetime] = field(default_factory=dict)
    """Per PowerPolicy name: when this process began counting into its histogram (an
    arrival from before -- the forecast was Off then -- is not counted)."""

    def observe(self, name: str, status: Any) -> None:
        """A PowerPolicy was read: keep the histogram its status holds, the first time
        (what this process learns afterwards is newer than what it wrote)."""
        if name in self.stored or name in self.histograms:
            return
        if isinstance(status, Mapping) and isinstance(status.get("forecast"), Mapping):
            with suppress(ValidationError):  # unreadable: the histogram starts afresh
                self.stored[name] = ForecastStatus.model_validate(status["forecast"])

    def forget(self, name: str) -> None:
        """The PowerPolicy was deleted: its histogram goes with it."""
        self.histograms.pop(name, None)
        self.stored.pop(name, None)
        self.since.pop(name, None)

    def histogram(self, name: str, spec: PowerPolicySpec, now: datetime) -> Histogram | None:
        """The policy's histogram (made, or restored from its status, on first use), or
        None while its forecast is Off."""
        if spec.forecast_wake.mode == "Off":
            return None
        tz = spec.forecast_wake.time_zone
        h = self.histograms.get(name)
        if h is not None and h.time_zone == tz:
            return h
        stored = self.stored.pop(name, None)
        restored = from_status(stored, tz) if stored is not None else None
        if restored is not None:
            restored.counted_until = max(restored.counted_until, now)  # downtime: not watched
            h = restored
        else:
            h = fresh(tz, now)
        self.histograms[name] = h
        self.since[name] = now
        return h

    def register(self, policy: str, node_class: str, view: NodeView) -> None:
        """A side node of `node_class` under `policy`: its shape stands for the class."""
        self.shapes.setdefault((policy, node_class), view)

    def class_views(self, policy: str, spec: PowerPolicySpec) -> list[tuple[str, NodeView]]:
        """Each covered class's node as the scheduler sees an idle one (a cloud type from
        the catalogue; a side class from a member node seen so far)."""
        out: list[tuple[str, NodeView]] = []
        for c in covered(spec.forecast_wake, spec.node_classes):
            if c.node_type == "CloudVM":
                itype = self.catalogue.by_name(c.instance_type or "")
                if itype is not None:
                    view = idle_view(c.name, Capacity.of(itype), itype.name, itype.price)
                    out.append((c.name, view))
            elif (shape := self.shapes.get((policy, c.name))) is not None:
                out.append((c.name, shape))
        return out

    def planned(
        self,
        containers: Iterable[ContainerView],
        policies: Iterable[tuple[str, PowerPolicySpec]],
        now: datetime,
    ) -> set[str]:
        """The dispatcher's plan: count the containers it holds for the first time in the
        histogram of each policy given. Returns the policies whose histogram changed."""
        if self.started_at is None:
            self.started_at = now
        histograms = [(name, spec, self.histogram(name, spec, now)) for name, spec in policies]
        uuids: set[str] = set()
        fresh_ones: list[ContainerView] = []
        for c in containers:
            uuids.add(c.uuid)
            if c.uuid not in self.seen and c.first_seen >= self.started_at:
                fresh_ones.append(c)
        self.seen = frozenset(uuids)
        changed: set[str] = set()
        if not fresh_ones:
            return changed
        for name, spec, h in histograms:
            if h is None:
                continue
            views = self.class_views(name, spec)
            since = self.since.get(name, now)
            for c in fresh_ones:
                if c.first_seen < since:
                    continue
                found = container_class(c.resources, views, self.catalogue, self.type_policy)
                if found is not None:
                    h.arrive(found[0], found[1], c.first_seen)
                    changed.add(name)
        return changed
