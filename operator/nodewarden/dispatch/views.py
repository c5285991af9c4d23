"""The scheduler's view of each node of the pool (`NodeView`): the rule is
`rules.nodeview` (shared with the simulator); this module feeds it the live facts --
capacity from the catalogue (VMs) or the spec (side nodes), state, readiness, admission
and wakeability from the power controller's board, the pool's worker for the rest, and
how long each kind of node took to come up (`rules.boots`, fed by the planner) -- and
reuses a side node's view until its spec, its power view or its boot estimate changes,
a cloud VM's until its power view or a worker fact the view reads changes (1,000
containers on 500 VMs: building every VM's view again was an eighth of each plan).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from nodewarden.api.workernode import WorkerNodeSpec
from nodewarden.fleet.board import NodePowerView, PowerBoard
from nodewarden.pool.worker import Worker
from nodewarden.rules.boots import BootTimes
from nodewarden.rules.nodeview import NO_CAPACITY, cloud_view, side_view, spec_capacity
from nodewarden.scheduling.views import Capacity, NodeView

CloudKey = tuple[object, ...]
"""What a cloud VM's view is made from (`NodeViews._cloud_key`)."""


class NodeViews:
    """Node views from the power board (a node's is reused until what it is made from
    changes)."""

    def __init__(self, board: PowerBoard) -> None:
        self.board = board
        self._side: dict[str, tuple[WorkerNodeSpec | None, NodePowerView | None, NodeView]] = {}
        """Each side node's last view, with the spec and power view it was made from."""
        self._cloud: dict[str, tuple[CloudKey, NodeView]] = {}
        """Each cloud VM's last view, with what it was made from."""
        self.boots = BootTimes()
        """How long nodes took to come up, as the plans saw them (`rules.boots`)."""

    def nodes(self, workers: Iterable[Worker]) -> list[NodeView]:
        """The view of every node of the pool (side nodes no longer in it are forgotten)."""
        last, self._side = self._side, {}
        last_cloud, self._cloud = self._cloud, {}
        return [self._view(w, last, last_cloud) for w in workers]

    def node_view(self, w: Worker) -> NodeView:
        """The scheduler's view of a node: capacity from the catalogue (VMs) or the spec
        (side nodes); state, readiness and admission from the power controller."""
        return self._view(w, self._side, self._cloud)

    def _view(
        self,
        w: Worker,
        last: Mapping[str, tuple[WorkerNodeSpec | None, NodePowerView | None, NodeView]],
        last_cloud: Mapping[str, tuple[CloudKey, NodeView]],
    ) -> NodeView:
        power = self.board.view(w.name)
        if w.side:
            # the same node view until its spec or its power view changes (10,000 side
            # nodes are viewed at every round)
            cached = last.get(w.name)
            boot = self.boots.estimate(w.name)
            if (
                cached is not None
                and cached[0] is w.spec
                and cached[1] == power
                and (cached[2].boot_seconds, cached[2].boot_slowest) == boot
            ):
                self._side[w.name] = cached
                return cached[2]
            view = NodeViews._side_view(w, power, boot)
            self._side[w.name] = (w.spec, power, view)
            return view
        key = NodeViews._cloud_key(w, power)
        made = last_cloud.get(w.name)
        if made is not None and made[0] == key:
            self._cloud[w.name] = made
            return made[1]
        view = NodeViews._cloud_view(w, power)
        self._cloud[w.name] = (key, view)
        return view

    @staticmethod
    def _cloud_key(w: Worker, power: NodePowerView | None) -> CloudKey:
        """Everything `_cloud_view` reads (keep the two in step)."""
        return (
            w.instance_type,
            w.price,
            power,
            w.instance is not None,
            w.destroy_requested_at is not None,
            w.idle_behavior,
            w.broken,
            w.created_at,
        )

    @staticmethod
    def _side_view(
        w: Worker, power: NodePowerView | None, boot: tuple[float | None, float | None]
    ) -> NodeView:
        return side_view(
            w.name,
            spec_capacity(w.spec.capacity if w.spec is not None else None),
            w.price,
            power.state if power is not None else None,
            admission_open=power is not None and power.admission_open,
            ready=power is not None and power.ready,
            wakeable=power is not None and power.wakeable,
            coming_since=power.waking_since if power is not None else None,
            boot_seconds=boot[0],
            boot_slowest=boot[1],
            wake_after=power.wake_after if power is not None else None,
            gpu_only=power is not None and power.gpu_only,
        )

    @staticmethod
    def _cloud_view(w: Worker, power: NodePowerView | None) -> NodeView:
        itype = w.instance_type
        return cloud_view(
            w.name,
            Capacity.of(itype) if itype else NO_CAPACITY,
            itype.name if itype else "unknown",
            w.price,
            power.state if power is not None else None,
            admission_open=power is not None and power.admission_open,
            ready=power is not None and power.ready,
            listed=w.instance is not None,
            destroying=w.destroy_requested_at is not None,
            runs_work=w.idle_behavior == "run" and not w.broken,
            created_at=w.created_at,
            gpu_only=power is not None and power.gpu_only,
        )
