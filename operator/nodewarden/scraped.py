"""Metrics read or brought up to date at a /metrics scrape, not stored as they change.

- `Sourced`        a metric whose samples are summed from its sources at every scrape
                   (the spend and energy figures: never a stored value that could drift)
- `before_scrape`  a refresh run before each scrape (`scraping`, called by the /metrics
                   handler): what would cost a pass over every node after every change
                   (the power path's gauges) is brought up to date once per scrape
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Literal

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

Samples = Iterable[tuple[tuple[str, ...], float]]
"""What a source gives a sourced metric at a scrape: (label values, value) pairs."""


def _weakly(fn: Callable[..., Any]) -> weakref.ReferenceType[Any]:
    """A weak reference to `fn`; a bound method is held while its owner lives."""
    return weakref.WeakMethod(fn) if hasattr(fn, "__self__") else weakref.ref(fn)


class Sourced(Collector):
    """A metric whose samples are read from its sources at every scrape (never a stored
    value that could drift from what it sums). A source is a callable held weakly (a
    bound method's owner may go: its samples go with it)."""

    def __init__(
        self, name: str, documentation: str, kind: Literal["gauge", "counter"], labels: list[str]
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.kind = kind
        self._labelnames = tuple(labels)
        self._sources: list[weakref.ReferenceType[Callable[[], Samples]]] = []

    def add_source(self, source: Callable[[], Samples]) -> None:
        self._sources.append(_weakly(source))

    def remove_source(self, source: Callable[[], Samples]) -> None:
        """Stop reading `source` (its owner stopped)."""
        self._sources = [ref for ref in self._sources if ref() not in (None, source)]

    def _family(self) -> GaugeMetricFamily | CounterMetricFamily:
        if self.kind == "counter":
            return CounterMetricFamily(self.name, self.documentation, labels=self._labelnames)
        return GaugeMetricFamily(self.name, self.documentation, labels=self._labelnames)

    def describe(self) -> Iterator[Metric]:
        yield self._family()

    def collect(self) -> Iterator[Metric]:
        family = self._family()
        totals: dict[tuple[str, ...], float] = {}
        live = []
        for ref in self._sources:
            source = ref()
            if source is None:
                continue
            live.append(ref)
            for labels, value in source():
                totals[labels] = totals.get(labels, 0.0) + value
        self._sources = live
        for labels, value in sorted(totals.items()):
            family.add_metric(list(labels), value)
        yield family


_BEFORE_SCRAPE: list[weakref.ref[Callable[[], None]]] = []


def before_scrape(refresh: Callable[[], None]) -> None:
    """Run `refresh` before each /metrics scrape (`scraping`): what is costly to keep
    current after every change (a pass over every node) is brought up to date once per
    scrape instead. Held weakly, like `Sourced`'s sources."""
    _BEFORE_SCRAPE.append(_weakly(refresh))


def no_longer_before_scrape(refresh: Callable[[], None]) -> None:
    """Stop running `refresh` before scrapes (its owner stopped)."""
    _BEFORE_SCRAPE[:] = [ref for ref in _BEFORE_SCRAPE if ref() not in (None, refresh)]


def scraping() -> None:
    """Bring the refreshed metrics up to date (the /metrics handler, before it renders)."""
    live = []
    for ref in _BEFORE_SCRAPE:
        refresh = ref()
        if refresh is None:
            continue
        live.append(ref)
        refresh()
    _BEFORE_SCRAPE[:] = live
