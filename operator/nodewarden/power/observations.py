"""Facts in, from the feed: WorkerNodes (claimed, restored from their stored power state,
forgotten), PowerIntents, PowerPolicies and the requester admission policy, turned into
each node's runtime facts and the events its next step reads.

`Observations` owns the node table's entries (`PowerContext.nodes`); it calls `Validation`
for a new spec or a node gone, and `Recorder` for the fields it contributes. The pool's and
the dispatcher's facts come in through `poolfacts`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from nodewarden.api.workernode import WorkerNodeSpec
from nodewarden.kube.requesters import RequesterAdmission
from nodewarden.ownership import Ownership, claim, ownership
from nodewarden.policy.events import Evaluate, ManualOverride, PolicyChanged
from nodewarden.policy.facts import CapabilityReading, ManualIntent, NodeFacts
from nodewarden.policy.state import NodePowerState, TransitionKind, rebased
from nodewarden.power.context import PowerContext
from nodewarden.power.energy import Energy
from nodewarden.power.enrolment import IdentityState
from nodewarden.power.intents import policy_intent_name
from nodewarden.power.runtime import NodeRuntime
from nodewarden.power.validation import Validation

log = logging.getLogger(__name__)


class Observations:
    """See the module docstring."""

    def __init__(self, ctx: PowerContext, validation: Validation, energy: Energy) -> None:
        self.ctx = ctx
        self.validation = validation
        self.energy = energy
        self.fold: Callable[[Mapping[str, Any]], bool] | None = None
        """Where a WorkerNode this controller labelled goes (the WorkerNode informer)."""
        self._policy_generations: dict[str | None, int | None] = {}
        self._claims = asyncio.Semaphore(16)
        self._claiming: dict[str, str] = {}
        """Unlabelled side nodes: the resourceVersion a claim was sent for."""

    # -- WorkerNodes -----------------------------------------------------------------------

    def observe_node(
        self, body: Mapping[str, Any], deleted: bool = False, spec: WorkerNodeSpec | None = None
    ) -> None:
        """A WorkerNode from the feed (its informer's compact body, shared: read-only), with
        its spec as the feed parsed it (None: parsed here)."""
        ctx = self.ctx
        meta = dict(body.get("metadata") or {})
        name = meta.get("name")
        if not name or (meta.get("namespace") or ctx.namespace) != ctx.namespace:
            return
        if deleted:
            self._forget(name)
            return
        owned = ownership(body, ctx.dispatcher_id)
        if owned in (Ownership.FOREIGN, Ownership.CLAIMABLE):
            # another install's node is none of ours; an unlabelled side node is claimed
            # first (a preconditioned label write: `nodewarden.ownership`)
            if name in ctx.nodes:
                self._forget(name)
            if owned is Ownership.CLAIMABLE:
                self._claim_node(name, body)
            return
        ctx.status.observe(name, body)
        now = ctx.clock()
        rt = ctx.nodes.get(name)
        if rt is None:
            rt = self._new_runtime(
                name, spec if spec is not None else _spec(body), meta, body.get("status") or {}, now
            )
            ctx.admit(rt)
            rt.events.append(Evaluate())
        else:
            changed = rt.generation != meta.get("generation")
            deleting = bool(meta.get("deletionTimestamp")) != bool(rt.meta.get("deletionTimestamp"))
            rt.meta = meta
            if changed:
                rt.spec = spec if spec is not None else _spec(body)
                rt.spec_seen_at = now
                rt.energy_none = None  # a new BMC endpoint may offer a power reading
                self.energy.arrived(rt)  # a VM whose policy changed is counted there
                rt.next_discovery = now
                rt.next_poll = now  # a BMC added by the edit is read at once
                ctx.control.last_error.pop(name, None)
            if changed or deleting:
                rt.events.append(Evaluate())
        self.validation.claim_bmc(rt)
        if rt.validated_generation != rt.generation:
            ctx.spawn(self.validation.validate(rt))
        ctx.wake.set()

    def identity_observed(self, rt: NodeRuntime) -> None:
        """A BMC or host UUID arrived: the gates' evidence, the enrolment, the claim."""
        rt.facts = rt.facts.model_copy(update={"identity": rt.identity.reading()})
        if rt.spec is not None:
            enrolment = rt.identity.enrolment(rt.spec)
            if enrolment is not None and enrolment != rt.identity.enrolled:
                rt.identity.enrolled = enrolment
                self.ctx.status.contribute(rt.name, {"enrolment": enrolment})
        self.validation.claim_bmc(rt)
        rt.events.append(Evaluate())
        self.ctx.wake.set()

    def _new_runtime(
        self,
        name: str,
        spec: WorkerNodeSpec | None,
        meta: dict[str, Any],
        status: Mapping[str, Any],
        now: datetime,
    ) -> NodeRuntime:
        state = NodePowerState.initial(name)
        stored = status.get("powerState")
        if isinstance(stored, Mapping):
            try:
                state = _restored(name, NodePowerState.model_validate(stored), now)
            except ValidationError as exc:
                log.warning(
                    "WorkerNode %s: stored power state unreadable (%s); verifying", name, exc
                )
        node_type = spec.node_type if spec is not None else "SideNode"
        facts = NodeFacts(node=name, node_type=node_type)
        control = status.get("powerControl")
        if isinstance(control, Mapping):
            with contextlib.suppress(ValidationError):
                facts = facts.model_copy(
                    update={"capability": CapabilityReading.model_validate(control)}
                )
        rt = NodeRuntime(name, spec, meta, state, facts, spec_seen_at=now)
        rt.identity = IdentityState.from_status(status.get("enrolment"))
        rt.facts = rt.facts.model_copy(update={"identity": rt.identity.reading()})
        rt.next_discovery = now
        rt.next_poll = now
        self.energy.restore(rt, status, now)
        t = state.transition
        if t is not None and t.kind is not TransitionKind.VERIFY:
            # a manual intent's name, or the policy-made one named after the transition
            rt.transition_intent = t.intent or policy_intent_name(name, t.id)
        return rt

    def reload(self, rt: NodeRuntime) -> None:
        """The node's power state as stored on the server (a write of it was refused)."""
        stored = self.ctx.status.server_status(rt.name).get("powerState")
        if isinstance(stored, Mapping):
            with contextlib.suppress(ValidationError):
                rt.state = _restored(
                    rt.name, NodePowerState.model_validate(stored), self.ctx.clock()
                )
        rt.events.append(Evaluate())

    def _claim_node(self, name: str, body: Mapping[str, Any]) -> None:
        """Claim an unlabelled side node for this install (`nodewarden.ownership`)."""
        version = str((body.get("metadata") or {}).get("resourceVersion") or "")
        if self._claiming.get(name) == version:
            return  # a claim of this version is under way or was lost: wait for news
        self._claiming[name] = version
        ctx = self.ctx

        async def run() -> None:
            async with self._claims:  # a fleet of unlabelled nodes is claimed in steps
                claimed = await claim(ctx.kube, ctx.namespace, body, ctx.dispatcher_id)
            if claimed is not None and self.fold is not None:
                self.fold(claimed)

        ctx.spawn(run())

    def _forget(self, name: str) -> None:
        ctx = self.ctx
        rt = ctx.dismiss(name)
        self.energy.left(name)
        self.validation.release_bmc(name)
        ctx.board.forget(name)
        ctx.status.observe(name, None)
        if rt is not None:
            ctx.spawn(ctx.control.forget(name))

    # -- PowerIntents, PowerPolicies, the requester admission ------------------------------

    def observe_intent(self, body: Mapping[str, Any], deleted: bool = False) -> None:
        """A PowerIntent event (manual or policy-made)."""
        ctx = self.ctx
        node = ctx.intents.observe(body, deleted)
        if node is not None and node in ctx.nodes:
            self.sync_intent(ctx.nodes[node])
            ctx.wake.set()

    def observe_policy(self, body: Mapping[str, Any], deleted: bool = False) -> None:
        """A PowerPolicy event: the book is updated by its owner; every node under it
        re-evaluates with the new version (records carry it from now on)."""
        ctx = self.ctx
        meta = body.get("metadata") or {}
        name = meta.get("name")
        if not deleted:
            self.energy.policy_seen(body)
        generation = None if deleted else meta.get("generation")
        if name in self._policy_generations and self._policy_generations[name] == generation:
            return  # a status write (content hash, node count): not a change of the knobs
        self._policy_generations[name] = generation
        for rt in ctx.nodes.values():
            if rt.policy_name == name or (
                rt.spec is not None and rt.spec.policy_ref is None and name == ctx.default_policy
            ):
                rt.events.append(PolicyChanged())
        ctx.wake.set()

    def sync_intent(self, rt: NodeRuntime) -> None:
        intents = self.ctx.intents
        active = intents.active(rt.name)
        manual: ManualIntent | None = intents.manual_fact(active) if active is not None else None
        if rt.facts.intent != manual:  # another intent, or its requester verified now
            rt.events.append(ManualOverride(intent=manual))

    def requester_admission(self, admission: RequesterAdmission) -> None:
        """The last check of the requester admission policy (`kube.requesters`): overrides
        are honoured only while it is in force. A change re-judges the active intents."""
        ctx = self.ctx
        previous = ctx.intents.admission
        ctx.intents.admission = admission
        if previous.enforced == admission.enforced and previous.checked:
            return
        level = logging.INFO if admission.enforced else logging.WARNING
        log.log(level, "requester admission: %s", admission.detail)
        for rt in ctx.nodes.values():
            self.sync_intent(rt)
        ctx.wake.set()


def _restored(name: str, state: NodePowerState, now: datetime) -> NodePowerState:
    """A stored power state on this replica's clock (`state.rebased`)."""
    state, lead = rebased(state, now)
    if lead:
        log.warning(
            "WorkerNode %s: the stored power state was written by a clock %.1fs ahead "
            "of this replica's; its times are moved back by that much",
            name,
            lead.total_seconds(),
        )
    return state


def _spec(body: Mapping[str, Any]) -> WorkerNodeSpec | None:
    try:
        return WorkerNodeSpec.model_validate(body.get("spec") or {})
    except ValidationError:
        return None
