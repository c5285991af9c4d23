"""PowerIntent phases the controller derives from a step: the phase of a manual intent
while its node moves, and the one-line message of each phase (docs/state-machine.md lists
every phase and its meaning)."""

from __future__ import annotations

from nodewarden.policy.facts import WorkReading
from nodewarden.policy.machine import Step
from nodewarden.policy.reasons import Decision, ReasonCode
from nodewarden.policy.state import ON_STATES, PowerState, TransitionKind, api_admission
from nodewarden.power.intents import Intent


def manual_phase(intent: Intent, result: Step, work: WorkReading | None) -> str | None:
    """The phase of the active manual `intent` after `result` (None = leave it)."""
    state = result.next
    t = state.transition
    if t is not None and t.intent == intent.name:
        return "InProgress"
    if t is not None and t.kind is not TransitionKind.VERIFY:
        return "Pending"  # another transition (policy-made) runs first
    if intent.action == "Drain":
        drained = (
            api_admission(state.admission) == "Closed"
            and work is not None
            and work.active_jobs == 0
        )
        return "Succeeded" if drained else "InProgress"
    if intent.action == "Shutdown" and state.state is PowerState.OFF:
        return "Succeeded" if intent.phase != "InProgress" else None
    if intent.action == "Wake" and state.state in ON_STATES:
        return "Succeeded" if intent.phase != "InProgress" else None
    if state.state is PowerState.UNKNOWN:
        return "Pending"
    decision = result.decision
    if decision is Decision.DEFER:
        return "Deferred"
    if decision in (Decision.BLOCK, Decision.NONE):
        return "Blocked"
    return None


_MESSAGES = {
    "InProgress": "transition in progress",
    "Succeeded": "done: the requested state was observed",
    "Blocked": "blocked: a person must act",
    "Aborted": "aborted before the irreversible step",
    "Superseded": "superseded by a newer intent",
    "Deferred": "waiting for time or fresh evidence",
    "Pending": "waiting",
    "Failed": "failed",
}


def phase_message(phase: str, reasons: tuple[ReasonCode, ...]) -> str:
    """`<what the phase means> (<reason codes>)`."""
    codes = ", ".join(r.value for r in reasons) or "-"
    meaning = _MESSAGES.get(phase)
    return f"{meaning} ({codes})" if meaning is not None else codes
