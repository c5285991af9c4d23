"""Whether a node's new decision is worth an Event: at most one per real transition, and
none at start-up for a node whose state did not change.

Pure: the recorder hands in what the user last saw (the headline restored from the
node's stored status, or the last one announced) and the new headline; nothing here
reads a clock or the API.

The rule:
- the same headline as the one shown (decision, reasons, state, admission) is never
  announced;
- while a node is *starting* (this process has not yet reached a settled decision for
  it), the decisions that only gather evidence again -- a DEFER whose every reason is
  evidence not known yet (power, readiness, telemetry), a START confirming the machine
  is on and ready, and a NONE confirming the power observed (unless it closes a
  transition this process took over) -- are not announced: restarting the operator is not a
  transition of the node. The first other decision (a DEFER for time, a BLOCK, a
  request, NONE) ends the start-up: announced only if it differs from what was shown;
- after start-up, every change of headline is announced (today's decision history);
- an error (power source, validation) is announced when it is new or different from the
  one shown (the stored condition's message after a restart), never while it repeats.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nodewarden.policy.reasons import Decision, ReasonCode

R = ReasonCode

GATHERING = {
    Decision.DEFER.value: frozenset(
        r.value
        for r in (
            R.TELEMETRY_MISSING,
            R.TELEMETRY_STALE,
            R.POWER_STATE_UNKNOWN,
            R.READY_PROBE_PENDING,
            R.UNEXPECTED_POWER_CHANGE,  # with POWER_STATE_UNKNOWN: nothing observed yet
        )
    ),
    Decision.START.value: frozenset(
        r.value for r in (R.READY_CONFIRMED, R.POWER_ON_CONFIRMED, R.ALREADY_ON)
    ),
    Decision.NONE.value: frozenset(r.value for r in (R.POWER_OFF_CONFIRMED, R.POWER_ON_CONFIRMED)),
}
"""Per decision, the reasons that (all of them) make it evidence being gathered again."""


@dataclass(frozen=True)
class Headline:
    """What a user reads of a decision: the status fields it sets, as stored."""

    decision: str
    reasons: tuple[str, ...]
    state: str
    admission: str


@dataclass(frozen=True)
class Announcement:
    """The verdict for one decision: announce it or not, and whether the node is still
    starting after it."""

    announce: bool
    starting: bool


def stored_headline(status: dict[str, Any] | Any) -> Headline | None:
    """The headline a node's stored status shows (None without a recorded decision)."""
    record = status.get("lastSafetyRecord") if hasattr(status, "get") else None
    if not record or not record.get("decision"):
        return None
    return Headline(
        decision=str(record["decision"]),
        reasons=tuple(str(r) for r in record.get("reasons") or ()),
        state=str(status.get("state") or ""),
        admission=str(status.get("admission") or ""),
    )


def stored_condition_message(status: dict[str, Any] | Any, type_: str) -> str | None:
    """The message of the stored condition `type_` when its status is False."""
    conditions = status.get("conditions") if hasattr(status, "get") else None
    for cond in conditions or ():
        if hasattr(cond, "get") and cond.get("type") == type_ and cond.get("status") == "False":
            message = cond.get("message")
            return str(message) if message is not None else None
    return None


def gathering(new: Headline, closes: bool = False) -> bool:
    """Whether `new` only gathers evidence again (see the module docstring); a decision
    that closes a transition never does."""
    quiet = GATHERING.get(new.decision)
    return not closes and quiet is not None and all(r in quiet for r in new.reasons)


def announce_decision(
    shown: Headline | None, new: Headline, starting: bool, closes: bool = False
) -> Announcement:
    """See the module docstring. `closes`: the decision closes a transition."""
    if starting and gathering(new, closes):
        return Announcement(announce=False, starting=True)
    return Announcement(announce=new != shown, starting=False)


def announce_error(shown: str | None, new: str | None) -> bool:
    """An error Event when `new` is an error and not the one already shown."""
    return new is not None and new != shown
