"""The pure confirmation rule: facts and a clock in, the next step out (no I/O)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nodewarden.redfish import (
    ConfirmationSettings,
    RedfishPowerState,
    StepKind,
    decide_confirmation_step,
)

START = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
SETTINGS = ConfirmationSettings(
    deadline=timedelta(minutes=10),
    poll_interval=timedelta(seconds=2),
    resend_after=timedelta(seconds=45),
    max_resends=1,
)
DEADLINE = START + SETTINGS.deadline


def step(
    observed: RedfishPowerState | None,
    *,
    target: RedfishPowerState = RedfishPowerState.ON,
    accepted: int = 0,
    failed: int = 0,
    last_answered_at: datetime | None = None,
    now: datetime = START,
    settings: ConfirmationSettings = SETTINGS,
) -> tuple[StepKind, str]:
    decided = decide_confirmation_step(
        target=target,
        observed=observed,
        accepted_requests=accepted,
        failed_requests=failed,
        last_answered_at=last_answered_at,
        deadline=DEADLINE,
        settings=settings,
        now=now,
    )
    return decided.kind, decided.reason


@pytest.mark.parametrize(
    ("observed", "accepted", "failed", "since_request", "expected"),
    [
        (RedfishPowerState.ON, 0, 0, None, (StepKind.CONFIRMED, "OBSERVED_TARGET_STATE")),
        (RedfishPowerState.ON, 2, 0, 5, (StepKind.CONFIRMED, "OBSERVED_TARGET_STATE")),
        (RedfishPowerState.OFF, 0, 0, None, (StepKind.SEND, "NOT_REQUESTED_YET")),
        (RedfishPowerState.PAUSED, 0, 0, None, (StepKind.SEND, "NOT_REQUESTED_YET")),
        (RedfishPowerState.POWERING_ON, 0, 0, None, (StepKind.WAIT, "TRANSITION_IN_PROGRESS")),
        (RedfishPowerState.POWERING_OFF, 0, 0, None, (StepKind.WAIT, "TRANSITION_IN_PROGRESS")),
        (RedfishPowerState.POWERING_ON, 1, 0, 300, (StepKind.WAIT, "TRANSITION_IN_PROGRESS")),
        (RedfishPowerState.UNKNOWN, 0, 0, None, (StepKind.WAIT, "POWER_STATE_UNKNOWN")),
        (None, 0, 0, None, (StepKind.WAIT, "POWER_STATE_UNREADABLE")),
        (RedfishPowerState.OFF, 1, 0, 10, (StepKind.WAIT, "AWAITING_CHANGE")),
        (RedfishPowerState.OFF, 1, 0, 45, (StepKind.RESEND, "NO_CHANGE_AFTER_REQUEST")),
        (RedfishPowerState.OFF, 2, 0, 300, (StepKind.WAIT, "RESEND_BUDGET_USED")),
        # a failed reset (5xx, timeout) is an attempt: paced and budgeted like an accepted one
        (RedfishPowerState.OFF, 0, 1, 1, (StepKind.WAIT, "AWAITING_CHANGE")),
        (RedfishPowerState.OFF, 0, 1, 45, (StepKind.RESEND, "REQUEST_FAILED")),
        (RedfishPowerState.OFF, 0, 2, 300, (StepKind.WAIT, "RESEND_BUDGET_USED")),
        (RedfishPowerState.OFF, 1, 1, 300, (StepKind.WAIT, "RESEND_BUDGET_USED")),
        (RedfishPowerState.OFF, 0, 1, 300, (StepKind.RESEND, "REQUEST_FAILED")),
    ],
)
def test_step_table(
    observed: RedfishPowerState | None,
    accepted: int,
    failed: int,
    since_request: int | None,
    expected: tuple[StepKind, str],
) -> None:
    now = START + timedelta(seconds=since_request or 0)
    last = START if since_request is not None else None
    assert (
        step(observed, accepted=accepted, failed=failed, last_answered_at=last, now=now) == expected
    )


def test_without_resend_after_a_failed_reset_is_not_retried() -> None:
    never = ConfirmationSettings(deadline=SETTINGS.deadline, resend_after=None, max_resends=5)
    later = START + timedelta(seconds=300)
    for accepted, failed in ((1, 0), (0, 1)):
        assert step(
            RedfishPowerState.OFF,
            accepted=accepted,
            failed=failed,
            last_answered_at=START,
            now=later,
            settings=never,
        ) == (StepKind.WAIT, "AWAITING_CHANGE")


def test_deadline_wins_over_everything_but_the_target() -> None:
    assert step(RedfishPowerState.OFF, now=DEADLINE)[0] is StepKind.DEADLINE_EXCEEDED
    assert step(RedfishPowerState.POWERING_ON, now=DEADLINE)[0] is StepKind.DEADLINE_EXCEEDED
    assert step(RedfishPowerState.ON, now=DEADLINE)[0] is StepKind.CONFIRMED


def test_off_target_is_not_confirmed_by_poweringoff() -> None:
    assert step(RedfishPowerState.POWERING_OFF, target=RedfishPowerState.OFF)[0] is StepKind.WAIT
    assert step(RedfishPowerState.OFF, target=RedfishPowerState.OFF)[0] is StepKind.CONFIRMED


def test_settings_reject_nonsense() -> None:
    with pytest.raises(ValueError):
        ConfirmationSettings(deadline=timedelta(0))
    with pytest.raises(ValueError):
        ConfirmationSettings(deadline=timedelta(seconds=1), poll_interval=timedelta(0))
    with pytest.raises(ValueError):
        ConfirmationSettings(deadline=timedelta(seconds=1), max_resends=-1)
    with pytest.raises(ValueError):
        ConfirmationSettings(deadline=timedelta(seconds=1), final_read_timeout=timedelta(0))


states = st.one_of(st.none(), st.sampled_from(list(RedfishPowerState)))


@given(
    target=st.sampled_from([RedfishPowerState.ON, RedfishPowerState.OFF]),
    observed=states,
    accepted=st.integers(min_value=0, max_value=5),
    failed=st.integers(min_value=0, max_value=5),
    elapsed=st.integers(min_value=0, max_value=1200),
    since_request=st.integers(min_value=0, max_value=1200),
)
def test_rule_invariants(
    target: RedfishPowerState,
    observed: RedfishPowerState | None,
    accepted: int,
    failed: int,
    elapsed: int,
    since_request: int,
) -> None:
    now = START + timedelta(seconds=elapsed)
    last = now - timedelta(seconds=since_request) if accepted or failed else None
    kind, _reason = step(
        observed, target=target, accepted=accepted, failed=failed, last_answered_at=last, now=now
    )
    # Only an observation of the target confirms; acceptance never does.
    assert (kind is StepKind.CONFIRMED) == (observed == target)
    if kind in (StepKind.SEND, StepKind.RESEND):
        assert now < DEADLINE
        assert observed is not None and not observed.transitional
        assert observed is not RedfishPowerState.UNKNOWN
    if kind is StepKind.SEND:
        assert accepted == failed == 0
    if kind is StepKind.RESEND:
        # every attempt, accepted or failed, uses the budget of 1 + max_resends
        assert 1 <= accepted + failed <= SETTINGS.max_resends
        assert SETTINGS.resend_after is not None and since_request >= 45
    if now >= DEADLINE and observed != target:
        assert kind is StepKind.DEADLINE_EXCEEDED
