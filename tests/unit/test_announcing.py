"""`power.announcing`: which decisions a user reads as Events -- none at start-up for a
node whose stored state, decision and reasons hold; one per real transition."""

from __future__ import annotations

from nodewarden.power.announcing import (
    Headline,
    announce_decision,
    announce_error,
    stored_condition_message,
    stored_headline,
)

BUSY = Headline("NONE", ("ACTIVE_WORK", "IDLE_WINDOW_NOT_MET"), "Active", "Open")
UNKNOWN = Headline("DEFER", ("UNEXPECTED_POWER_CHANGE", "POWER_STATE_UNKNOWN"), "Unknown", "Closed")
READY = Headline("START", ("READY_CONFIRMED",), "Active", "Open")
DRAIN = Headline("DRAIN", ("IDLE_EXCEEDED",), "Draining", "Closed")
MIN_ON = Headline("DEFER", ("MIN_ON_NOT_MET",), "Active", "Open")


def run(shown: Headline | None, decisions: list[Headline]) -> list[Headline]:
    """The decisions a node makes from its start-up on; those announced."""
    starting, out = True, []
    for new in decisions:
        verdict = announce_decision(shown, new, starting)
        starting = verdict.starting
        if verdict.announce:
            shown = new
            out.append(new)
    return out


def test_a_restart_back_to_the_stored_headline_announces_nothing() -> None:
    assert run(BUSY, [UNKNOWN, UNKNOWN, READY, BUSY, BUSY]) == []


def test_a_restart_after_a_real_change_announces_it_once() -> None:
    assert run(BUSY, [UNKNOWN, READY, DRAIN, DRAIN]) == [DRAIN]


def test_a_node_without_a_stored_decision_gets_one_event_for_its_first_settled_one() -> None:
    assert run(None, [UNKNOWN, READY, BUSY]) == [BUSY]


def test_a_defer_for_time_is_a_decision_even_at_start_up() -> None:
    assert run(None, [UNKNOWN, MIN_ON]) == [MIN_ON]


def test_after_start_up_every_change_is_announced_even_evidence_gathering() -> None:
    assert run(BUSY, [DRAIN, UNKNOWN, READY, BUSY]) == [DRAIN, UNKNOWN, READY, BUSY]


def test_the_stored_headline_and_conditions_are_read_from_the_status() -> None:
    status = {
        "state": "Active",
        "admission": "Open",
        "lastSafetyRecord": {"decision": "NONE", "reasons": ["ACTIVE_WORK", "IDLE_WINDOW_NOT_MET"]},
        "conditions": [
            {"type": "PowerSource", "status": "False", "message": "BMC timed out"},
            {"type": "Valid", "status": "True", "message": "spec is valid"},
        ],
    }
    assert stored_headline(status) == BUSY
    assert stored_headline({}) is None
    assert stored_condition_message(status, "PowerSource") == "BMC timed out"
    assert stored_condition_message(status, "Valid") is None


def test_an_error_is_announced_when_new_or_different_never_while_it_repeats() -> None:
    assert announce_error(None, "BMC timed out")
    assert not announce_error("BMC timed out", "BMC timed out")
    assert announce_error("BMC timed out", "BMC refused the password")
    assert not announce_error("BMC timed out", None)


def test_the_power_confirmed_at_start_up_is_quiet_unless_it_closes_a_transition() -> None:
    confirmed = Headline("NONE", ("POWER_OFF_CONFIRMED",), "Off", "Closed")
    off = Headline("NONE", ("NO_DEMAND",), "Off", "Closed")
    assert run(BUSY, [UNKNOWN, confirmed, off]) == [off]
    verdict = announce_decision(DRAIN, confirmed, starting=True, closes=True)
    assert verdict.announce and not verdict.starting  # a shutdown taken over, now ended
