"""The power board: what the dispatcher may know about power, per node, in memory.

The power controller owns every power decision; the dispatcher asks only whether it may
place work on a node (`admission_open`; `admits` for a container's kind: a node open to
GPU work only takes no CPU-only work that fits elsewhere) and how to count it (`view`:
state, readiness, whether an off side node can be woken). Closing admission is a handshake: the controller
`close`s, the dispatcher `acknowledge`s at the start of a round once no runner start is
in flight for the node, and the controller turns the acknowledgement into the state
machine's AdmissionClosed event. The controller also puts up what the warm-capacity levers
want of each node class (`warm`): the dispatcher creates cloud VMs ahead of demand from
it. Nothing here is I/O; both sides run in one event loop.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from nodewarden.policy.state import PowerState


@dataclass(frozen=True, slots=True)
class NodePowerView:
    """One node's power as the dispatcher sees it."""

    state: PowerState
    admission_open: bool
    ready: bool
    wakeable: bool = False
    """A side node that is off (or waking) and that the controller may wake for demand."""
    waking_since: datetime | None = None
    """A waking side node: when its wake began (`rules.nodeview.waking_since`)."""
    wake_after: datetime | None = None
    """An off side node: when its wake timing lets it be woken (`rules.nodeview.wake_not_before`)."""
    gpu_only: bool = False
    """Admission open to GPU work only (`policy.gpuidle`: its GPUs are idle, its CPU work
    drains away): no CPU-only container that could run elsewhere starts there."""


@dataclass(frozen=True, slots=True)
class WarmWant:
    """What the warm-capacity levers want of one node class of the default policy now
    (`power.warming`): warm nodes in force, and what a lever in Shadow would want."""

    count: int
    shadow: int = 0
    why: str | None = None


@dataclass
class PowerBoard:
    views: dict[str, NodePowerView] = field(default_factory=dict)
    closing: dict[str, datetime] = field(default_factory=dict)
    """Nodes whose admission was closed and not yet acknowledged (name -> when closed)."""
    acknowledged: dict[str, datetime] = field(default_factory=dict)
    """Acknowledgements not yet consumed by the controller (name -> when)."""
    version: int = 0
    """Bumped on every change of what placement reads (a node's view, admission): the
    dispatcher plans again only when it moved (`dispatch.replan`)."""

    warm: dict[str, WarmWant] = field(default_factory=dict)
    """Per node class of the default policy: what the warm-capacity levers want now (the
    dispatcher creates cloud VMs for its cloud classes from it, `dispatch.warming`)."""

    def set_warm(self, wants: dict[str, WarmWant]) -> None:
        """The levers' wants at the power controller's due time (a change is planned on)."""
        if wants != self.warm:
            self.warm = wants
            self.version += 1

    def view(self, node: str) -> NodePowerView | None:
        return self.views.get(node)

    def admission_open(self, node: str) -> bool:
        view = self.views.get(node)
        return view is not None and view.admission_open

    def admits(self, node: str, gpu_work: bool) -> bool:
        """Admission is open to a container of this kind: open, and on a node open to GPU
        work only (`NodePowerView.gpu_only`) only for work that may use GPUs (`gpu_work`:
        it asks for GPUs, or nothing without GPUs could ever fit it)."""
        view = self.views.get(node)
        return view is not None and view.admission_open and (gpu_work or not view.gpu_only)

    def set(self, node: str, view: NodePowerView) -> None:
        if self.views.get(node) != view:
            self.version += 1
        self.views[node] = view
        if view.admission_open:
            self.closing.pop(node, None)

    def close(self, node: str, at: datetime) -> None:
        """Admission closes now; the dispatcher acknowledges it (see the module docstring)."""
        view = self.views.get(node)
        if view is not None and view.admission_open:
            self.views[node] = NodePowerView(
                view.state,
                False,
                view.ready,
                view.wakeable,
                view.waking_since,
                view.wake_after,
                view.gpu_only,
            )
            self.version += 1
        self.closing[node] = at

    def acknowledge(self, node: str, at: datetime) -> None:
        """The dispatcher binds no more work to `node` (no start in flight)."""
        if self.closing.pop(node, None) is not None:
            self.acknowledged[node] = at

    def take_acknowledgements(self) -> dict[str, datetime]:
        out, self.acknowledged = self.acknowledged, {}
        return out

    def forget(self, node: str) -> None:
        if self.views.pop(node, None) is not None:
            self.version += 1
        self.closing.pop(node, None)
        self.acknowledged.pop(node, None)
