"""How long nodes take to come up, as seen: the estimate the wait budget reads.

`BootTimes` keeps, per kind -- a side node by its name, a cloud VM by its instance type
-- the last `KEEP` durations from the moment a node began coming up
(`NodeView.coming_since`: its wake asked, its create asked) to the first view that shows
it ready; the estimate is their median. Both shells call `watch` with every node's view
when they plan (the live dispatcher: `dispatch/planner.py`; the simulator:
`simulate/dispatching.py`) and hand the estimates to the scheduler (`NodeView.boot_seconds`
and `boot_slowest` through `estimate`, `CloudState.boot_seconds` through `types`). A node first seen
already ready (adopted, on at start-up) teaches nothing; a kind never seen has no
estimate (the scheduler assumes `scheduling.waiting.ASSUMED_BOOT`).

The durations are as the dispatcher sees them: up to one plan late (a plan follows every
change of a node's view), never earlier than the node was ready. They are kept in memory
only: after a restart the first boot of each kind is assumed again. Pure: the caller
passes the time.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Iterable
from datetime import datetime

from nodewarden.scheduling.views import COMING_UP, NodeState, NodeView

KEEP = 5
"""Durations kept per kind."""

_COMING = COMING_UP | {NodeState.WAKING}


class BootTimes:
    """Boot durations seen per kind (module docstring)."""

    __slots__ = ("_coming", "_side", "_types")

    def __init__(self) -> None:
        self._coming: dict[str, tuple[bool, str, datetime]] = {}
        """Node name -> (a VM, its kind, when it began coming up), while it comes up."""
        self._side: dict[str, deque[float]] = {}
        self._types: dict[str, deque[float]] = {}

    def watch(self, views: Iterable[NodeView], now: datetime) -> None:
        """Every node's view at `now`: a node that came up since the last call teaches its
        kind how long that took."""
        coming: dict[str, tuple[bool, str, datetime]] = {}
        last = self._coming
        for view in views:
            if view.ready:
                began = last.get(view.name)
                if began is not None:
                    vm, kind, since = began
                    seen = (self._types if vm else self._side).setdefault(kind, deque(maxlen=KEEP))
                    seen.append(max(0.0, (now - since).total_seconds()))
            elif view.coming_since is not None and view.state in _COMING:
                vm = view.instance_type is not None
                coming[view.name] = (vm, view.instance_type or view.name, view.coming_since)
        self._coming = coming

    def tracking(self) -> list[str]:
        """The nodes seen coming up and not yet seen ready (a caller with nothing else to
        view may watch only these)."""
        return list(self._coming)

    def estimate(self, side_node: str) -> tuple[float | None, float | None]:
        """A side node's boot time as seen, and its slowest boot seen (None: never seen)."""
        seen = self._side.get(side_node)
        return (statistics.median(seen), max(seen)) if seen else (None, None)

    def types(self) -> dict[str, float]:
        """Instance type -> a new VM's boot time as seen."""
        return {kind: statistics.median(seen) for kind, seen in self._types.items() if seen}
