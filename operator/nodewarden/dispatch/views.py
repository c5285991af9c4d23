"""The scheduler's view of a node (`NodeView`): capacity from the catalogue (VMs) or the
spec (side nodes); state, readiness and admission from the power controller's board.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from nodewarden.api.workernode import WorkerNodeSpec
from nodewarden.fleet.board import NodePowerView, PowerBoard
from nodewarden.policy.state import PowerState
from nodewarden.pool.worker import Worker
from nodewarden.scheduling.views import Capacity, NodeState, NodeView
from nodewarden.units import parse_quantity

_SIDE_STATE: dict[PowerState, NodeState] = {
    PowerState.OFF: NodeState.OFF,
    PowerState.WAKING: NodeState.WAKING,
    PowerState.ON_IDLE: NodeState.IDLE,
    PowerState.ACTIVE: NodeState.ACTIVE,
    PowerState.DRAINING: NodeState.DRAINING,
    PowerState.SHUTTING_DOWN: NodeState.SHUTTING_DOWN,
    PowerState.UNKNOWN: NodeState.UNKNOWN,
    PowerState.BLOCKED: NodeState.UNKNOWN,
}


class NodeViews:
    """Node views from the power board (a side node's is reused until its spec or its
    power view changes)."""

    def __init__(self, board: PowerBoard) -> None:
        self.board = board
        self._side: dict[str, tuple[WorkerNodeSpec | None, NodePowerView | None, NodeView]] = {}
        """Each side node's last view, with the spec and power view it was made from."""

    def nodes(self, workers: Iterable[Worker]) -> list[NodeView]:
        """The view of every node of the pool (side nodes no longer in it are forgotten)."""
        last, self._side = self._side, {}
        return [self._view(w, last) for w in workers]

    def node_view(self, w: Worker) -> NodeView:
        """The scheduler's view of a node: capacity from the catalogue (VMs) or the spec
        (side nodes); state, readiness and admission from the power controller."""
        return self._view(w, self._side)

    def _view(
        self,
        w: Worker,
        last: Mapping[str, tuple[WorkerNodeSpec | None, NodePowerView | None, NodeView]],
    ) -> NodeView:
        power = self.board.view(w.name)
        if w.side:
            # the same node view until its spec or its power view changes (10,000 side
            # nodes are viewed at every round)
            cached = last.get(w.name)
            if cached is not None and cached[0] is w.spec and cached[1] == power:
                self._side[w.name] = cached
                return cached[2]
            view = NodeViews._side_view(w, power)
            self._side[w.name] = (w.spec, power, view)
            return view
        return NodeViews._cloud_view(w, power)

    @staticmethod
    def _side_view(w: Worker, power: NodePowerView | None) -> NodeView:
        spec = w.spec
        cap = spec.capacity if spec is not None else None
        capacity = (
            Capacity(
                cap.vcpus,
                parse_quantity(cap.ram),
                parse_quantity(cap.scratch),
                cap.gpus,
                cap.gpu_model,
            )
            if cap is not None
            else Capacity(0, 0, 0, 0)
        )
        state = _SIDE_STATE.get(power.state, NodeState.UNKNOWN) if power else NodeState.UNKNOWN
        return NodeView(
            name=w.name,
            state=state,
            capacity=capacity,
            instance_type=None,
            price=w.price,
            admission_open=power is not None and power.admission_open,
            ready=power is not None and power.ready,
            wakeable=power is not None and power.wakeable,
        )

    @staticmethod
    def _cloud_view(w: Worker, power: NodePowerView | None) -> NodeView:
        leaving = power is not None and power.state in (
            PowerState.DRAINING,
            PowerState.SHUTTING_DOWN,
            PowerState.BLOCKED,
        )
        admission_open = power is not None and power.admission_open
        if w.destroy_requested_at is not None:
            state = NodeState.SHUTTING_DOWN
        elif leaving:
            state = NodeState.DRAINING
        elif w.instance is None or power is None or not power.ready:
            state = NodeState.PENDING if w.instance is None else NodeState.BOOTING
            # a VM coming up takes the work planned for it once verified ready: count it
            admission_open = w.idle_behavior == "run" and not w.broken
        else:
            state = NodeState.ACTIVE if power.state is PowerState.ACTIVE else NodeState.IDLE
        itype = w.instance_type
        capacity = Capacity.of(itype) if itype else Capacity(0, 0, 0, 0)
        return NodeView(
            name=w.name,
            state=state,
            capacity=capacity,
            instance_type=itype.name if itype else "unknown",
            price=w.price,
            admission_open=admission_open,
            ready=power is not None and power.ready,
        )
