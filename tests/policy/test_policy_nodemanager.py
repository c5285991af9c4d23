"""The node-manager matrix: one named test per rule, the full table, and every derivation."""

from __future__ import annotations

import itertools
from datetime import datetime, timedelta

import pytest
from policy_builders import NOW, at, policy

from nodewarden.policy.nodemanager import (
    BillingWindowState,
    BootGrace,
    CloudWorkerFacts,
    IdleGrace,
    NodeManagerAction,
    WorkerState,
    billing_window_from,
    boot_grace_from,
    decide,
    decide_for,
    idle_grace_from,
    next_billing_window_open,
    scheduler_worker_state,
    worker_state_from,
)

WORKER = ["unpaired", "busy", "idle", "down"]
BILLING = ["open", "closed"]
BOOT = ["boot wait", "boot exceeded"]
IDLE = ["not idle", "idle wait", "idle exceeded"]


# -- one test per rule of the matrix ------------------------------------------------------


@pytest.mark.parametrize(("billing", "boot", "idle"), list(itertools.product(BILLING, BOOT, IDLE)))
def test_rule_busy_does_nothing(billing: str, boot: str, idle: str) -> None:
    assert decide("busy", billing, boot, idle) is None


@pytest.mark.parametrize(("billing", "boot", "idle"), list(itertools.product(BILLING, BOOT, IDLE)))
def test_rule_down_always_starts_shutdown(billing: str, boot: str, idle: str) -> None:
    assert decide("down", billing, boot, idle) == "START_SHUTDOWN"


@pytest.mark.parametrize("boot", BOOT)
def test_rule_idle_drains_when_window_open_and_idle_grace_exceeded(boot: str) -> None:
    assert decide("idle", "open", boot, "idle exceeded") == "START_DRAIN"


@pytest.mark.parametrize(
    ("billing", "idle"),
    [
        ("closed", "idle exceeded"),
        ("open", "idle wait"),
        ("open", "not idle"),
        ("closed", "idle wait"),
    ],
)
@pytest.mark.parametrize("boot", BOOT)
def test_rule_idle_otherwise_does_nothing(billing: str, idle: str, boot: str) -> None:
    assert decide("idle", billing, boot, idle) is None


@pytest.mark.parametrize(("billing", "idle"), list(itertools.product(BILLING, IDLE)))
def test_rule_unpaired_shuts_down_once_boot_grace_exceeded(billing: str, idle: str) -> None:
    assert decide("unpaired", billing, "boot exceeded", idle) == "START_SHUTDOWN"


@pytest.mark.parametrize(("billing", "idle"), list(itertools.product(BILLING, IDLE)))
def test_rule_unpaired_within_boot_grace_does_nothing(billing: str, idle: str) -> None:
    assert decide("unpaired", billing, "boot wait", idle) is None


def test_full_table_has_exactly_the_spec_actions() -> None:
    """All 48 combinations; the expected action is written out from the spec's wording."""
    seen: dict[str | None, int] = {}
    for ws, bw, bg, ig in itertools.product(WORKER, BILLING, BOOT, IDLE):
        action = decide(ws, bw, bg, ig)
        if ws == "down" or (ws == "unpaired" and bg == "boot exceeded"):
            expected: str | None = "START_SHUTDOWN"
        elif ws == "idle" and bw == "open" and ig == "idle exceeded":
            expected = "START_DRAIN"
        else:
            expected = None
        assert action == expected, (ws, bw, bg, ig)
        seen[action] = seen.get(action, 0) + 1
    assert seen == {"START_SHUTDOWN": 18, "START_DRAIN": 2, None: 28}


def test_decide_accepts_enums_and_returns_str_enum() -> None:
    action = decide(WorkerState.IDLE, BillingWindowState.OPEN, BootGrace.WAIT, IdleGrace.EXCEEDED)
    assert action is NodeManagerAction.START_DRAIN
    assert action == "START_DRAIN"


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (("sleeping", "open", "boot wait", "not idle"), "worker state"),
        (("idle", "half-open", "boot wait", "not idle"), "billing window"),
        (("idle", "open", "boot_wait", "not idle"), "boot grace"),
        (("idle", "open", "boot wait", "idle"), "idle grace"),
    ],
)
def test_unknown_matrix_input_raises_naming_it(args: tuple[str, str, str, str], field: str) -> None:
    with pytest.raises(ValueError, match=field) as info:
        decide(*args)
    assert "expected one of" in str(info.value)


# -- derivations ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("idle", "idle"),
        ("IDLE", "idle"),
        (" alloc ", "busy"),
        ("mix", "busy"),
        ("comp", "busy"),
        ("drng", "busy"),
        ("maint", "busy"),
        ("drain", "down"),
        ("down", "down"),
        ("error", "down"),
        ("fail", "down"),
        ("unknown", "down"),
        ("idle*", "down"),
        ("alloc*", "down"),
        ("down*", "down"),
    ],
)
def test_scheduler_state_mapping(text: str, expected: str) -> None:
    assert scheduler_worker_state(text) == expected


@pytest.mark.parametrize("text", ["", "sleeping", "idl", "*", "future*"])
def test_unknown_scheduler_state_raises(text: str) -> None:
    with pytest.raises(ValueError, match="unknown scheduler state"):
        scheduler_worker_state(text)


def test_unpaired_wins_over_everything() -> None:
    state = worker_state_from(
        paired=False,
        scheduler_state="alloc",
        last_heartbeat=NOW,
        stale_after=timedelta(minutes=5),
        now=NOW,
    )
    assert state is WorkerState.UNPAIRED


def test_heartbeat_exactly_at_limit_is_fresh_one_second_later_down() -> None:
    limit = timedelta(minutes=5)
    fresh = worker_state_from(
        paired=True, scheduler_state="idle", last_heartbeat=at(-300), stale_after=limit, now=NOW
    )
    stale = worker_state_from(
        paired=True, scheduler_state="idle", last_heartbeat=at(-301), stale_after=limit, now=NOW
    )
    assert (fresh, stale) == (WorkerState.IDLE, WorkerState.DOWN)


def test_missing_heartbeat_or_scheduler_state_is_down() -> None:
    limit = timedelta(minutes=5)
    assert (
        worker_state_from(
            paired=True, scheduler_state="idle", last_heartbeat=None, stale_after=limit, now=NOW
        )
        is WorkerState.DOWN
    )
    assert (
        worker_state_from(
            paired=True, scheduler_state=None, last_heartbeat=NOW, stale_after=limit, now=NOW
        )
        is WorkerState.DOWN
    )


def test_boot_grace_boundary() -> None:
    expiry = timedelta(minutes=10)
    assert boot_grace_from(booted_at=at(-599), boot_expiry=expiry, now=NOW) is BootGrace.WAIT
    assert boot_grace_from(booted_at=at(-600), boot_expiry=expiry, now=NOW) is BootGrace.EXCEEDED


def test_idle_grace_three_values() -> None:
    grace = timedelta(minutes=20)
    assert idle_grace_from(idle_since=None, idle_grace=grace, now=NOW) is IdleGrace.NOT_IDLE
    assert idle_grace_from(idle_since=at(-1199), idle_grace=grace, now=NOW) is IdleGrace.WAIT
    assert idle_grace_from(idle_since=at(-1200), idle_grace=grace, now=NOW) is IdleGrace.EXCEEDED


HOUR = timedelta(hours=1)
W_START, W_END = timedelta(minutes=50), timedelta(hours=1)


@pytest.mark.parametrize(
    ("uptime_minutes", "expected"),
    [
        (0, "closed"),
        (49, "closed"),
        (50, "open"),
        (59, "open"),
        (60, "closed"),  # a new period starts at the hour
        (110, "open"),  # 50 minutes into the second period
        (125, "closed"),
    ],
)
def test_billing_window_repeats_each_period_from_boot(uptime_minutes: int, expected: str) -> None:
    booted = NOW - timedelta(minutes=uptime_minutes)
    state = billing_window_from(
        booted_at=booted, period=HOUR, window_start=W_START, window_end=W_END, now=NOW
    )
    assert state == expected


def test_billing_period_zero_is_always_open() -> None:
    for minutes in (0, 1, 59, 61, 1000):
        booted = NOW - timedelta(minutes=minutes)
        state = billing_window_from(
            booted_at=booted,
            period=timedelta(0),
            window_start=timedelta(0),
            window_end=timedelta(seconds=1),
            now=NOW,
        )
        assert state is BillingWindowState.OPEN


def test_billing_before_boot_is_closed() -> None:
    state = billing_window_from(
        booted_at=at(60), period=HOUR, window_start=W_START, window_end=W_END, now=NOW
    )
    assert state is BillingWindowState.CLOSED


@pytest.mark.parametrize(
    ("start", "end", "message"),
    [
        (timedelta(minutes=50), timedelta(minutes=40), "before its end"),
        (timedelta(minutes=50), timedelta(minutes=70), "after the period"),
    ],
)
def test_billing_window_impossible_offsets_raise(
    start: timedelta, end: timedelta, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        billing_window_from(
            booted_at=at(-100), period=HOUR, window_start=start, window_end=end, now=NOW
        )


def test_next_billing_window_open() -> None:
    booted = NOW - timedelta(minutes=20)
    nxt = next_billing_window_open(
        booted_at=booted, period=HOUR, window_start=W_START, window_end=W_END, now=NOW
    )
    assert nxt == booted + W_START
    booted = NOW - timedelta(minutes=65)  # 5 minutes into the 2nd period
    nxt = next_billing_window_open(
        booted_at=booted, period=HOUR, window_start=W_START, window_end=W_END, now=NOW
    )
    assert nxt == booted + HOUR + W_START
    assert (
        billing_window_from(
            booted_at=booted, period=HOUR, window_start=W_START, window_end=W_END, now=nxt
        )
        == "open"
    )


def test_naive_clock_rejected() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        idle_grace_from(idle_since=None, idle_grace=HOUR, now=datetime(2026, 1, 1))


def test_decide_for_derives_the_tuple_from_policy() -> None:
    pol = policy(
        idleThreshold="20m",
        bootGrace="10m",
        heartbeatStaleAfter="5m",
        billing={"period": "1h", "windowStart": "50m", "windowEnd": "1h"},
    )
    facts = CloudWorkerFacts(
        paired=True,
        scheduler_state="idle",
        last_heartbeat=at(-30),
        booted_at=NOW - timedelta(minutes=55),
        idle_since=at(-25 * 60),
    )
    result = decide_for(facts, pol, NOW)
    assert (result.inputs.worker_state, result.inputs.billing_window) == ("idle", "open")
    assert (result.inputs.boot_grace, result.inputs.idle_grace) == (
        "boot exceeded",
        "idle exceeded",
    )
    assert result.action is NodeManagerAction.START_DRAIN
    # ten minutes later (fresh heartbeat) the billing window has closed again: nothing to do
    later_facts = CloudWorkerFacts(
        paired=True,
        scheduler_state="idle",
        last_heartbeat=at(570),
        booted_at=facts.booted_at,
        idle_since=facts.idle_since,
    )
    later = decide_for(later_facts, pol, NOW + timedelta(minutes=10))
    assert later.inputs.billing_window == "closed" and later.action is None
    # and with the heartbeat 10 minutes old the node counts as down: shut it down
    stale = decide_for(facts, pol, NOW + timedelta(minutes=10))
    assert stale.inputs.worker_state == "down" and stale.action == "START_SHUTDOWN"
