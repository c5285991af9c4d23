"""The pure confirmation rule: facts and a clock in, the next step out (no I/O)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nodewarden.redfish import (
    ConfirmationSettings,
    PowerState,
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
    observed: PowerState | None,
    *,
    target: PowerState = PowerState.ON,
    accepted: int = 0,
    last_answered_at: datetime | None = None,
    now: datetime = START,
) -> tuple[StepKind, str]:
    decided = decide_confirmation_step(
        target=target,
        observed=observed,
        accepted_requests=accepted,
        last_answered_at=last_answered_at,
        deadline=DEADLINE,
        settings=SETTINGS,
        now=now,
    )
    return decided.kind, decided.reason


@pytest.mark.parametrize(
    ("observed", "accepted", "since_request", "expected"),
    [
        (PowerState.ON, 0, None, (StepKind.CONFIRMED, "OBSERVED_TARGET_STATE")),
        (PowerState.ON, 2, 5, (StepKind.CONFIRMED, "OBSERVED_TARGET_STATE")),
        (PowerState.OFF, 0, None, (StepKind.SEND, "NOT_REQUESTED_YET")),
        (PowerState.PAUSED, 0, None, (StepKind.SEND, "NOT_REQUESTED_YET")),
        (PowerState.POWERING_ON, 0, None, (StepKind.WAIT, "TRANSITION_IN_PROGRESS")),
        (PowerState.POWERING_OFF, 0, None, (StepKind.WAIT, "TRANSITION_IN_PROGRESS")),
        (PowerState.POWERING_ON, 1, 300, (StepKind.WAIT, "TRANSITION_IN_PROGRESS")),
        (PowerState.UNKNOWN, 0, None, (StepKind.WAIT, "POWER_STATE_UNKNOWN")),
        (None, 0, None, (StepKind.WAIT, "POWER_STATE_UNREADABLE")),
        (PowerState.OFF, 1, 10, (StepKind.WAIT, "AWAITING_CHANGE")),
        (PowerState.OFF, 1, 45, (StepKind.RESEND, "NO_CHANGE_AFTER_REQUEST")),
        (PowerState.OFF, 2, 300, (StepKind.WAIT, "AWAITING_CHANGE")),  # budget used
    ],
)
def test_step_table(
    observed: PowerState | None,
    accepted: int,
    since_request: int | None,
    expected: tuple[StepKind, str],
) -> None:
    now = START + timedelta(seconds=since_request or 0)
    last = START if since_request is not None else None
    assert step(observed, accepted=accepted, last_answered_at=last, now=now) == expected


def test_deadline_wins_over_everything_but_the_target() -> None:
    assert step(PowerState.OFF, now=DEADLINE)[0] is StepKind.DEADLINE_EXCEEDED
    assert step(PowerState.POWERING_ON, now=DEADLINE)[0] is StepKind.DEADLINE_EXCEEDED
    assert step(PowerState.ON, now=DEADLINE)[0] is StepKind.CONFIRMED


def test_off_target_is_not_confirmed_by_poweringoff() -> None:
    assert step(PowerState.POWERING_OFF, target=PowerState.OFF)[0] is StepKind.WAIT
    assert step(PowerState.OFF, target=PowerState.OFF)[0] is StepKind.CONFIRMED


def test_settings_reject_nonsense() -> None:
    with pytest.raises(ValueError):
        ConfirmationSettings(deadline=timedelta(0))
    with pytest.raises(ValueError):
        ConfirmationSettings(deadline=timedelta(seconds=1), poll_interval=timedelta(0))
    with pytest.raises(ValueError):
        ConfirmationSettings(deadline=timedelta(seconds=1), max_resends=-1)


states = st.one_of(st.none(), st.sampled_from(list(PowerState)))


@given(
    target=st.sampled_from([PowerState.ON, PowerState.OFF]),
    observed=states,
    accepted=st.integers(min_value=0, max_value=5),
    elapsed=st.integers(min_value=0, max_value=1200),
    since_request=st.integers(min_value=0, max_value=1200),
)
def test_rule_invariants(
    target: PowerState,
    observed: PowerState | None,
    accepted: int,
    elapsed: int,
    since_request: int,
) -> None:
    now = START + timedelta(seconds=elapsed)
    last = now - timedelta(seconds=since_request) if accepted else None
    kind, _reason = step(observed, target=target, accepted=accepted, last_answered_at=last, now=now)
    # Only an observation of the target confirms; acceptance never does.
    assert (kind is StepKind.CONFIRMED) == (observed == target)
    if kind in (StepKind.SEND, StepKind.RESEND):
        assert now < DEADLINE
        assert observed is not None and not observed.transitional
        assert observed is not PowerState.UNKNOWN
    if kind is StepKind.SEND:
        assert accepted == 0
    if kind is StepKind.RESEND:
        assert 1 <= accepted <= SETTINGS.max_resends
        assert SETTINGS.resend_after is not None and since_request >= 45
    if now >= DEADLINE and observed != target:
        assert kind is StepKind.DEADLINE_EXCEEDED
