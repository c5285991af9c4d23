"""The create choke point: every create, planned or declared, passes `Admissions.admit`
-- the hard caps and back-off of `scheduling.caps` against what exists or is being
created right then. A declared CloudVM WorkerNode over a cap is held (its `Launched`
condition names the cap, through the observer) until a round allows it.
"""

from __future__ import annotations

import logging

from nodewarden.metrics import CREATE_REFUSALS, HELD_NODES
from nodewarden.pool.context import PoolContext
from nodewarden.pool.worker import PoolState
from nodewarden.scheduling.caps import Admission, Fleet, PolicyLimits, admit_create
from nodewarden.scheduling.instancetypes import InstanceType

log = logging.getLogger(__name__)


class Admissions:
    """Whether a create may go now, and the declared WorkerNodes held back (`holds`)."""

    def __init__(self, ctx: PoolContext) -> None:
        self.ctx = ctx
        self.holds: dict[str, Admission] = {}
        """Declared WorkerNodes waiting for an instance -> the refusal that holds them."""

    def fleet(self) -> Fleet:
        """This pool's cloud instances that exist or are being created (caps count them)."""
        return Fleet.of(
            (w.instance_type.name if w.instance_type else "unknown", w.price)
            for w in self.ctx.workers.values()
            if not w.side and w.state is not PoolState.GONE
        )

    def admit(self, itype: InstanceType) -> Admission:
        """The check every create passes, planned or declared: the operator's ceilings, the
        default policy's limits (none at all while it is missing or invalid) and the
        cloud's back-off, against the fleet as it is now (`scheduling.caps`)."""
        if self.ctx.policies is not None:
            policy, stopped = self.ctx.policies.create_limits()
        else:
            policy, stopped = PolicyLimits(name="builtin"), None
        permission = self.ctx.cloud_.may_create(itype, self.ctx.clock())
        admission = admit_create(
            itype.name,
            itype.price,
            self.fleet(),
            policy,
            self.ctx.settings.limits.ceilings(),
            stopped=stopped,
            backoff=None if permission.allowed else permission.reason,
        )
        if not admission.allowed and admission.cap is not None:
            CREATE_REFUSALS.labels(admission.cap.value).inc()
        return admission

    def hold(self, name: str, admission: Admission) -> None:
        if self.holds.get(name) == admission:
            return
        if name not in self.holds:
            log.info("declared WorkerNode %s waits for an instance: %s", name, admission.message)
        self.holds[name] = admission
        HELD_NODES.set(len(self.holds))
        self.ctx.observer.held(name, admission)

    def release(self, name: str) -> None:
        if self.holds.pop(name, None) is not None:
            HELD_NODES.set(len(self.holds))
            self.ctx.observer.held(name, None)
