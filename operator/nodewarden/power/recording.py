"""Where the power controller's decisions are written down: Safety Records into the
transition's PowerIntent (policy-made ones opened and closed here, manual ones reflected),
the node's decision history, Events, and the status fields and conditions each node
contributes to the status writer.

Events follow `power.announcing`: what the user was last shown starts as the node's stored
status (read once, when this process first handles the node), so a restart announces
nothing for a node whose state, decision and reasons did not change.

`Recorder` writes; it decides nothing (the round hands it each step's record) and calls no
other collaborator of the controller.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from nodewarden.api.base import GROUP, VERSION
from nodewarden.api.powerintent import PowerAction
from nodewarden.metrics import POWER_DECISIONS
from nodewarden.policy.actions import CloseTransition, OpenTransition
from nodewarden.policy.machine import Step
from nodewarden.policy.reasons import Decision, DecisionClass, ReasonCode, decision_class
from nodewarden.policy.record import SafetyRecord, event_summary
from nodewarden.policy.state import PowerState, TransitionKind, api_admission
from nodewarden.power.announcing import (
    Headline,
    announce_decision,
    announce_error,
    stored_condition_message,
    stored_headline,
)
from nodewarden.power.context import PowerContext
from nodewarden.power.intents import record_fields, shadow_fields
from nodewarden.power.nodestatus import api_state_of, conditions, gpu_only_now, power_status
from nodewarden.power.phases import manual_phase, phase_message
from nodewarden.power.runtime import NodeRuntime, iso

R = ReasonCode


class Recorder:
    """See the module docstring."""

    def __init__(self, ctx: PowerContext) -> None:
        self.ctx = ctx
        self.shown: dict[str, Headline | None] = {}
        """Per node: the headline a user was last shown (stored, or announced since)."""
        self.starting: set[str] = set()
        """Nodes without a settled decision since this process first handled them."""
        self.shown_error: dict[str, str | None] = {}
        """Per node, until its first power-source report: the stored PowerSource error."""
        self.shown_invalid: dict[str, str | None] = {}
        """Per node, until its first verdict: the stored Valid=False message."""

    def _baseline(self, rt: NodeRuntime) -> None:
        """Once per node: what its stored status already shows a user."""
        if rt.name in self.shown:
            return
        stored = self.ctx.status.server_status(rt.name)
        self.shown[rt.name] = stored_headline(stored)
        self.starting.add(rt.name)
        self.shown_error[rt.name] = stored_condition_message(stored, "PowerSource")
        self.shown_invalid[rt.name] = stored_condition_message(stored, "Valid")

    # -- status ----------------------------------------------------------------------------

    def conditions(self, rt: NodeRuntime) -> list[dict[str, Any]]:
        ctx = self.ctx
        current = ctx.status.server_status(rt.name).get("conditions") or []
        return conditions(
            rt,
            [c for c in current if isinstance(c, Mapping)],
            ctx.control.last_error.get(rt.name),
            ctx.clock(),
            ctx.pool.holds.get(rt.name) if ctx.pool is not None else None,
        )

    def contribute_conditions(self, rt: NodeRuntime) -> None:
        """The node's conditions, as they are now, into its next status write."""
        self.ctx.status.contribute(rt.name, {"conditions": self.conditions(rt)})

    def power_status(
        self, rt: NodeRuntime, record: SafetyRecord | None, now: datetime | None = None
    ) -> dict[str, Any]:
        self._baseline(rt)  # before this process's first decision for the node is written
        at = now or self.ctx.clock()
        gpu_only = gpu_only_now(rt, self.ctx.policy(rt).view, at)
        out = power_status(rt, record, self.conditions(rt), gpu_only)
        if "powerState" in out:
            rt.persisted = rt.state
        return out

    # -- Events ----------------------------------------------------------------------------

    def event_object(self, rt: NodeRuntime) -> dict[str, Any]:
        return {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "WorkerNode",
            "metadata": {**rt.meta, "namespace": self.ctx.namespace},
        }

    def event(self, rt: NodeRuntime, record: SafetyRecord, extra: str = "") -> None:
        summary = event_summary(record)
        codes = ",".join(r.value for r in summary.reasons)
        message = f"{summary.decision.value} [{codes}]{extra}: {summary.message}"
        self.ctx.spawn(
            self.ctx.kube.emit_event(
                self.event_object(rt),
                reason=summary.reason,
                message=message[:1024],
                type_=summary.type,
                action=summary.decision.value.capitalize(),
                # one series per decision and state reached: reasons that flap within
                # it (a reading going stale and fresh) raise its count, not new Events
                message_key=f"{summary.decision.value} {record.state_after.value}",
            )
        )

    def announce_power_source_error(self, rt: NodeRuntime) -> None:
        """A Warning Event when the node's power source starts failing or fails
        differently (the PowerSource condition carries the same text); none while the
        same error repeats."""
        self._baseline(rt)
        error = self.ctx.control.last_error.get(rt.name)
        if error == rt.reported_error:
            return
        shown = self.shown_error.pop(rt.name, rt.reported_error)
        rt.reported_error = error
        if not announce_error(shown, error):
            return
        assert error is not None
        self.ctx.spawn(
            self.ctx.kube.emit_event(
                self.event_object(rt),
                reason="PowerSourceError",
                message=error[:1024],
                type_="Warning",
                action="Observe",
            )
        )

    def announce_invalid(self, rt: NodeRuntime, previous: str | None) -> None:
        """A Warning Event for an invalid spec, unless the same problem is what the user
        already sees (`previous`: the last verdict's message, or after a restart the
        stored Valid condition's)."""
        self._baseline(rt)
        verdict = rt.verdict
        shown = self.shown_invalid.pop(rt.name, previous)
        if verdict is None or verdict.valid or not announce_error(shown, verdict.message):
            return
        self.ctx.spawn(
            self.ctx.kube.emit_event(
                self.event_object(rt),
                reason=verdict.reason,
                message=verdict.message,
                type_="Warning",
                action="Validate",
            )
        )

    def _announce(self, rt: NodeRuntime, record: SafetyRecord, closes: bool) -> None:
        """The decision's Event, if `power.announcing` says a user should read it."""
        self._baseline(rt)
        new = Headline(
            decision=record.decision.value,
            reasons=tuple(r.value for r in record.reasons),
            state=api_state_of(rt),
            admission=api_admission(rt.state.admission),
        )
        starting = rt.name in self.starting
        verdict = announce_decision(self.shown.get(rt.name), new, starting, closes)
        if not verdict.starting:
            self.starting.discard(rt.name)
        if verdict.announce:
            self.shown[rt.name] = new
            self.event(rt, record)

    # -- intents and records ---------------------------------------------------------------

    async def shadow(
        self, rt: NodeRuntime, result: Step, record: SafetyRecord, now: datetime
    ) -> None:
        """What a step would have done in shadow mode: a PowerIntent in phase Shadow with
        its Safety Record, and an Event."""
        intents = self.ctx.intents
        opened = next((a for a in result.actions if isinstance(a, OpenTransition)), None)
        action: PowerAction = (
            "Wake" if opened is not None and opened.kind is TransitionKind.WAKE else "Shutdown"
        )
        tid = opened.transition_id if opened is not None else f"shadow-{now:%Y%m%d-%H%M%S}"
        intent = await intents.create_policy_intent(
            rt.name, f"shadow-{tid}", action, "shadow mode: not acted on", now
        )
        message = "shadow mode: decided and recorded, not acted on"
        await intents.write(intent, shadow_fields(record, message, now))
        self.event(rt, record, extra=" (shadow mode: not acted on)")

    async def open(self, rt: NodeRuntime, action: OpenTransition, now: datetime) -> None:
        if action.kind is TransitionKind.VERIFY:
            return
        intents = self.ctx.intents
        if action.intent is not None:
            rt.transition_intent = action.intent
            intent = intents.intents.get(action.intent)
            if intent is not None:
                intent.started_at = now
            return
        kind: PowerAction = "Wake" if action.kind is TransitionKind.WAKE else "Shutdown"
        reasons = ",".join(r.value for r in rt.state.last_reasons) or "policy"
        intent_obj = await intents.create_policy_intent(
            rt.name, action.transition_id, kind, f"policy decision: {reasons}", now
        )
        rt.transition_intent = intent_obj.name

    async def close(
        self, rt: NodeRuntime, action: CloseTransition, record: SafetyRecord | None, now: datetime
    ) -> None:
        name = rt.transition_intent
        rt.transition_intent = None
        intent = self.ctx.intents.intents.get(name or "")
        if intent is None:
            return
        phase: str = action.outcome
        manual = rt.facts.intent
        if action.outcome == "Aborted" and manual is not None and manual.name != intent.name:
            phase = "Superseded"
        fields: dict[str, Any] = {
            "phase": phase,
            "finishedAt": iso(now),
            "message": phase_message(phase, action.reasons),
        }
        if record is not None:
            fields.update(record_fields(record))
        await self.ctx.intents.write(intent, fields)

    async def record(
        self,
        rt: NodeRuntime,
        record: SafetyRecord,
        headline: tuple[Any, ...],
        now: datetime,
        closed: bool = False,
        requested: bool = False,
    ) -> None:
        changed = headline != rt.headline
        rt.headline = headline
        rt.record = record
        if changed and record.decision is Decision.BLOCK and not closed:
            await self._blocked_without_transition(rt, record, now)
        if rt.transition_intent is not None:
            intent = self.ctx.intents.intents.get(rt.transition_intent)
            if intent is not None and not intent.finished:
                fields = record_fields(record)
                fields.update(
                    phase="InProgress",
                    startedAt=iso(intent.started_at or now),
                    message=phase_message("InProgress", record.reasons),
                )
                if requested:
                    # kept when later records (the confirmation) replace safetyRecord
                    fields["requestRecord"] = fields["safetyRecord"]
                await self.ctx.intents.write(intent, fields)
        if changed:
            rt.history.append(
                {
                    "time": iso(record.decided_at),
                    "decision": record.decision.value,
                    "reasons": [r.value for r in record.reasons],
                    "stateBefore": record.state_before.value,
                    "stateAfter": record.state_after.value,
                    "event": record.event,
                    "powerIntent": record.power_intent,
                }
            )
            POWER_DECISIONS.labels(
                record.decision.value, record.reasons[0].value if record.reasons else ""
            ).inc()
        self._announce(rt, record, closed)

    async def _blocked_without_transition(
        self, rt: NodeRuntime, record: SafetyRecord, now: datetime
    ) -> None:
        """A BLOCK decision outside a transition (a gate forbids what the policy wants,
        e.g. an inhibitor on an idle node) is a power decision too: it gets a policy-made
        PowerIntent in phase Blocked carrying the record, once per episode."""
        intents = self.ctx.intents
        if rt.transition_intent is not None or intents.active(rt.name) is not None:
            return
        if rt.state.state is PowerState.BLOCKED:
            return  # the transition that ended BLOCKED already closed its intent
        if any(decision_class(r) is DecisionClass.DEFER for r in record.reasons):
            return  # not due yet (time or evidence missing): the block is not what holds it
        action: PowerAction = "Wake" if rt.state.state is PowerState.OFF else "Shutdown"
        intent = await intents.create_policy_intent(
            rt.name, f"blocked-{now:%Y%m%d-%H%M%S}", action, "policy decision blocked", now
        )
        fields = record_fields(record)
        fields.update(
            phase="Blocked",
            message=phase_message("Blocked", record.reasons),
            startedAt=iso(now),
            finishedAt=iso(now),
        )
        await intents.write(intent, fields)

    def reflect_manual(
        self, rt: NodeRuntime, result: Step, record: SafetyRecord | None, now: datetime
    ) -> None:
        """The active manual intent's phase from this step; later ones wait behind it.

        Only onto the intent the step was decided with (`rt.facts.intent`): one that became
        active during this step's awaits (its predecessor finished, its event queued) is
        reflected by the next step, which knows of it -- never with a decision made without
        it (an override the step never saw, the gates of the intent before)."""
        intents = self.ctx.intents
        active = intents.active(rt.name)
        if active is None:
            return
        decided_for = rt.facts.intent.name if rt.facts.intent is not None else None
        if active.name != decided_for:
            return
        for waiting in intents.waiting(rt.name):
            self.ctx.spawn(
                intents.write(
                    waiting,
                    {"phase": "Pending", "message": f"waiting behind PowerIntent {active.name}"},
                )
            )
        if active.settled and active.action != "Drain":
            return
        phase = manual_phase(active, result, rt.facts.work)
        if phase is None:
            return
        active.asked_phase = phase
        fields: dict[str, Any] = {"phase": phase, "message": phase_message(phase, result.reasons)}
        if record is not None or rt.record is not None:
            fields.update(record_fields(record or rt.record))  # type: ignore[arg-type]
        if phase in ("Succeeded", "Blocked", "Failed") and active.action != "Drain":
            fields["finishedAt"] = iso(now)
        self.ctx.spawn(intents.write(active, fields))
