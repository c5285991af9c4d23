"""The shard owner's side of admission that crosses processes (docs/sharding.md section 2,
`fleet.admission`): a shutdown's power request is persisted and sent only after
`status.admission: Closed` is acknowledged on the WorkerNode by the API server and a
quorum read of the ContainerDispatches after it finds none holding the node.

Today's shutdown closes admission on the in-memory power board and waits for the
dispatcher's acknowledgement, which orders the dispatcher's starts and the demand re-read
only inside one process. `ShutdownGate` adds, right before persist-before-send of every
shutdown request (`Round._apply`), the two steps that order them through the API server
wherever the dispatcher runs:

1. the admission write (`ApiShutdown.close_admission`): a quorum GET of the WorkerNode;
   if it already reads Closed, that write was acknowledged earlier (only this node's
   owner reopens it), else a status patch `admission: Closed` with the resourceVersion
   the GET returned (a conflict: not now, the node is stepped again later);
2. the demand re-read (`ApiShutdown.read_containers`): a LIST of the ContainerDispatches
   without resourceVersion. A container holding the node (`fleet.admission.holding`)
   is work on it, read after admission closed: the request is not sent, the node's work
   reading says so and the node is stepped again (its shutdown aborts; admission reopens).

A manual ForceOff that overrides running work (`RequestPower.override_intent`) is not
held back: the administrator asked for the node off with its work.

On only when `ControllerSettings.cross_process_admission` is set; off, nothing here runs
and a shutdown costs no request beyond today's.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

from nodewarden.api.kinds import CONTAINER_DISPATCH, WORKER_NODE
from nodewarden.fleet import admission
from nodewarden.kube.client import Conflict, Kube, KubeError
from nodewarden.policy.actions import RequestPower
from nodewarden.policy.events import Evaluate
from nodewarden.policy.state import TransitionKind
from nodewarden.power.runtime import NodeRuntime
from nodewarden.rules.effects import Effect, SendPowerRequest
from nodewarden.rules.readings import work_reading

log = logging.getLogger(__name__)


class ApiShutdown:
    """`fleet.admission.ShutdownPort` over the API server. Every object read or written
    goes to `took` (the status writer's view of the node, through the informer)."""

    def __init__(
        self, kube: Kube, namespace: str, took: Callable[[str, Mapping[str, Any]], None]
    ) -> None:
        self.kube = kube
        self.namespace = namespace
        self.took = took
        self.requests = 0

    async def close_admission(self, node: str) -> bool:
        self.requests += 1
        body = await self.kube.get(WORKER_NODE, self.namespace, node)
        if body is None:
            return False
        self.took(node, body)
        if (body.get("status") or {}).get("admission") == admission.CLOSED:
            return True
        self.requests += 1
        try:
            written = await self.kube.patch_status(
                WORKER_NODE,
                self.namespace,
                node,
                {"admission": admission.CLOSED},
                resource_version=body["metadata"]["resourceVersion"],
            )
        except Conflict:
            return False
        self.took(node, written)
        return True

    async def read_containers(self, node: str) -> Iterable[Mapping[str, Any]]:
        self.requests += 1
        return await self.kube.list(CONTAINER_DISPATCH, self.namespace)


def held_request(fx: Iterable[Effect], rt: NodeRuntime) -> RequestPower | None:
    """The shutdown request among a step's effects that the gate must clear first."""
    transition = rt.state.transition
    if transition is None or transition.kind is not TransitionKind.SHUTDOWN:
        return None
    for effect in fx:
        if isinstance(effect, SendPowerRequest) and effect.request.override_intent is None:
            return effect.request
    return None


class ShutdownGate:
    """See the module docstring."""

    def __init__(
        self,
        port: admission.ShutdownPort,
        retry_after: timedelta,
        step: admission.Step = admission.no_step,
    ) -> None:
        self.port = port
        self.retry_after = retry_after
        """A shutdown held for a refused or failed request is stepped again after this."""
        self.step = step
        """A test's barrier before each operation (`fleet.admission.Step`)."""
        self.held = 0
        """Shutdown requests not sent: the re-read found work (or could not be made)."""

    async def may_send(self, rt: NodeRuntime, now: datetime) -> bool:
        """Whether `rt`'s shutdown request may be persisted and sent now. When not, `rt`
        is left to be stepped again: at once with the containers found as its work, or
        at its next recheck when the API server refused or could not be read."""
        try:
            found = await admission.shutdown(self.port, rt.name, self.step)
        except KubeError as exc:
            log.warning("WorkerNode %s: shutdown held, admission not confirmed (%s)", rt.name, exc)
            found = admission.Shutdown(closed=False)
        if found.may_send:
            return True
        self.held += 1
        if not found.closed:
            log.info("WorkerNode %s: shutdown held, admission not confirmed", rt.name)
            again = now + self.retry_after
            rt.due_at = again if rt.due_at is None else min(rt.due_at, again)
            return False
        log.info(
            "WorkerNode %s: shutdown held, %d containers hold it (%s)",
            rt.name,
            len(found.holding),
            ", ".join(found.holding[:5]),
        )
        work = rt.facts.work
        active = max(len(found.holding), work.active_jobs if work is not None else 0)
        reading = work_reading(active, "API server (containers locked on the node)", now, None)
        if work is not None:
            reading = reading.model_copy(update={"gpu": work.gpu})
        rt.facts = rt.facts.model_copy(update={"work": reading})
        rt.idle_since = None
        rt.events.append(Evaluate())  # busy: the shutdown aborts, admission reopens
        return False
