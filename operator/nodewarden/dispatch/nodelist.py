"""The management API's node and container list (`Dispatcher.snapshot`; live, not stored)."""

from __future__ import annotations

from typing import Any

from nodewarden.dispatch.context import DispatchContext
from nodewarden.policy.state import api_state
from nodewarden.pool.times import iso
from nodewarden.pool.worker import Worker


class NodeList:
    """The live view the management status endpoint serves."""

    def __init__(self, ctx: DispatchContext) -> None:
        self.ctx = ctx

    def _state_name(self, w: Worker) -> str:
        power = self.ctx.board.view(w.name)
        return api_state(power.state) if power is not None else "Unknown"

    def snapshot(self) -> dict[str, Any]:
        """Live view for the management status endpoint (not stored anywhere)."""
        now = self.ctx.clock()
        by_node = self.ctx.containers_by_node()
        instances = []
        if self.ctx.pool is not None:
            for w in sorted(self.ctx.pool.workers.values(), key=lambda w: w.name):
                running = by_node.get(w.name, [])
                instances.append(
                    {
                        "instanceId": w.instance.id if w.instance else None,
                        "workerNode": w.name,
                        "instanceType": w.instance_type.name if w.instance_type else None,
                        "state": self._state_name(w),
                        "currentContainers": running,
                        "lastContainer": w.last_container,
                        "hourlyPrice": w.price,
                        "idleSeconds": (now - w.idle_since).total_seconds()
                        if w.idle_since and not running
                        else 0,
                        "lastProbe": iso(w.last_attempt),
                        "lastProbeResult": w.probe_result,
                        "overCapacity": self.ctx.overcommitted.get(w.name),
                    }
                )
        containers = [
            {
                "name": c.name,
                "uuid": c.uuid,
                "phase": c.phase or "Queued",
                "node": c.status.node,
                "attempts": c.status.attempts,
                "schedulingStatus": c.status.scheduling_status,
            }
            for c in sorted(self.ctx.queue, key=lambda c: c.name)
        ]
        cloud = self.ctx.cloud.backoff.snapshot(now) if self.ctx.cloud is not None else None
        return {
            "dispatcherId": self.ctx.dispatcher_id,
            "time": iso(now),
            "recovered": self.ctx.recovered,
            "instances": instances,
            "containers": containers,
            "cloud": cloud,
        }
