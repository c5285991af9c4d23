"""Whether each WorkerNode may be acted on: its spec validated against the policies,
the catalogue and its credentials (the `Valid` condition, a Warning Event when it turns
invalid), and its claim on its BMC (one machine, one BMC: a node whose claim may have
changed is validated again and looks at its BMC again).

`Validation` is called by the observations (a new spec, a node gone, a new identity) and
by the round (the periodic re-validation); it writes through the `Recorder`.
"""

from __future__ import annotations

import asyncio
import logging

from nodewarden.api.workernode import WorkerNodeSpec
from nodewarden.metrics import BMC_CLAIMED_TWICE
from nodewarden.power.context import PowerContext
from nodewarden.power.recording import Recorder
from nodewarden.power.runtime import NodeRuntime
from nodewarden.validation import Verdict, failure_verdict, validate_workernode

log = logging.getLogger(__name__)


class Validation:
    """See the module docstring."""

    def __init__(self, ctx: PowerContext, recorder: Recorder) -> None:
        self.ctx = ctx
        self.recorder = recorder

    def claim_bmc(self, rt: NodeRuntime) -> None:
        """Record the node's claim on its BMC (one machine, one BMC): every node whose
        ownership may have changed is validated again and looks at its BMC again."""
        claim = rt.identity.claim(rt.name, rt.spec, str(rt.meta.get("creationTimestamp") or ""))
        self._rejudge(self.ctx.credentials.bmc_claims.put(claim, rt.name), rt.name)

    def release_bmc(self, name: str) -> None:
        """Node `name` is gone: its claim too (the nodes it refused are judged again)."""
        self._rejudge(self.ctx.credentials.bmc_claims.put(None, name))

    def _rejudge(self, touched: set[str], current: str | None = None) -> None:
        if not touched:
            return
        ctx = self.ctx
        BMC_CLAIMED_TWICE.set(ctx.credentials.bmc_claims.refused())
        now = ctx.clock()
        for name in touched:
            other = ctx.nodes.get(name)
            if other is None:
                continue
            other.next_discovery = now
            other.next_poll = now
            if name != current or other.validated_generation == other.generation:
                ctx.spawn(self.validate(other))

    def resync(self) -> None:
        """Validate every node again (credentials may have changed)."""
        for rt in self.ctx.nodes.values():
            self.ctx.spawn(self.validate(rt))

    async def validate(self, rt: NodeRuntime) -> None:
        ctx = self.ctx
        body_spec = rt.spec
        generation = rt.generation
        if body_spec is None:
            verdict = Verdict(False, "InvalidSpec", "spec does not parse")
        else:
            try:
                verdict = await self._judge(rt.name, body_spec)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # one node's bug: it is marked, the others go on
                log.error("validation of WorkerNode %s failed", rt.name, exc_info=exc)
                verdict = failure_verdict(exc)
        if rt.name not in ctx.nodes or rt.generation != generation:
            return  # gone, or edited meanwhile: the new generation's validation is on its way
        previous = rt.verdict
        rt.verdict = verdict
        rt.validated_generation = generation
        if verdict.valid and previous is not None and not previous.valid:
            # an administrator designated the Secret or admitted the endpoint
            rt.next_discovery = ctx.clock()
            rt.discovery_retries = 0
        ctx.status.contribute(
            rt.name, {"conditions": self.recorder.conditions(rt), "observedGeneration": generation}
        )
        if not verdict.valid and (previous is None or previous.message != verdict.message):
            log.warning("WorkerNode %s is invalid: %s", rt.name, verdict.message)
        # its Event unless the stored Valid condition already says the same (a restart)
        self.recorder.announce_invalid(rt, previous.message if previous is not None else None)
        ctx.wake.set()

    async def _judge(self, name: str, spec: WorkerNodeSpec) -> Verdict:
        ctx = self.ctx
        refusals = await ctx.credentials.check(name, spec)
        catalogue = ctx.catalogue
        instance_types = [t.name for t in catalogue.types] if catalogue.types else None
        return validate_workernode(
            spec,
            namespace=ctx.namespace,
            policies=ctx.policies.policies.keys(),
            default_policy=ctx.default_policy,
            credential_problems=[(r.reason, r.message) for r in refusals],
            instance_types=instance_types,
        )
