"""Leadership by this replica's own monotonic clock (`nodewarden.fence`), with a fake clock.

The rules (client-go's leader-election reasoning): valid until the renewal's *send* time
plus duration minus margin; a standby counts from when it saw the record change; a stall
longer than the margin steps the leader down before it acts again.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fencekit import Clock
from nodewarden.fence import FenceToken, Leadership, LeaseWatch, NotLeader, Unfenced


def leadership(clock: Clock, duration: float = 15.0, margin: float = 5.0) -> Leadership:
    return Leadership("nodewarden-d", duration, margin, clock=clock)


def test_validity_counts_from_before_the_renewal_was_sent() -> None:
    clock = Clock()
    lead = leadership(clock)
    sent_at = clock.now
    clock.now += 3.0  # the API server took 3 s to answer
    lead.renewed(sent_at, transitions=7)
    assert lead.check("runner start") == FenceToken("nodewarden-d", 7)
    clock.run(sent_at + 9.9 - clock.now, lead)  # the heartbeat beats meanwhile
    assert lead.valid
    clock.now = sent_at + 10.0  # duration 15 - margin 5, from the send: not from the answer
    with pytest.raises(NotLeader, match="not renewed in time"):
        lead.check("runner start")
    assert lead.lost_reason is not None


def test_not_held_until_a_write_succeeded_and_a_step_down_is_final() -> None:
    clock = Clock()
    lead = leadership(clock)
    with pytest.raises(NotLeader, match="not held"):
        lead.check("cloud create")
    lost: list[str] = []
    lead.on_lost(lost.append)
    lead.renewed(clock.now, 3)
    lead.rejected("the runner on side-1")
    lead.step_down("again")  # idempotent: told once
    assert len(lost) == 1 and "newer fencing token" in lost[0]
    lead.renewed(clock.now, 4)  # a renewal that lands afterwards does not revive it
    with pytest.raises(NotLeader, match="newer fencing token"):
        lead.check("cloud create")
    assert lead.remaining() == 0


def test_a_stall_longer_than_the_margin_steps_down_before_the_next_action() -> None:
    clock = Clock()
    lead = leadership(clock)
    lead.renewed(clock.now, 1)
    for _ in range(5):  # a healthy loop: beats well within the margin
        clock.now += 1.0
        lead.beat()
    assert lead.check("power request").value == 1
    lead.renewed(clock.now, 1)  # renewed just before the loop froze
    clock.now += 5.5  # the loop was blocked 5.5 s: the action after it must not go
    with pytest.raises(NotLeader, match=r"stalled for 5\.5s"):
        lead.check("power request")
    assert lead.lost_reason is not None and "stalled" in lead.lost_reason


def test_the_heartbeat_itself_sees_a_stall() -> None:
    clock = Clock()
    lead = leadership(clock)
    lost: list[str] = []
    lead.on_lost(lost.append)
    lead.renewed(clock.now, 1)
    clock.now += 6.0
    lead.beat()
    assert len(lost) == 1 and not lead.valid


def test_a_standby_counts_from_when_it_saw_the_record_change() -> None:
    clock = Clock()
    watch = LeaseWatch(clock=clock)
    assert not watch.expired(15)  # never seen: watch it first
    watch.seen("41")
    clock.now += 14.9
    watch.seen("41")  # unchanged: the count goes on
    assert not watch.expired(15)
    clock.now += 0.1
    assert watch.expired(15)
    watch.seen("42")  # renewed: a fresh count, whatever renewTime says
    assert not watch.expired(15)


def test_unfenced_always_allows_and_carries_no_token() -> None:
    assert Unfenced().check("anything") is None


def test_the_margin_must_fit_in_the_duration() -> None:
    with pytest.raises(ValueError, match="margin"):
        Leadership("l", 15.0, 15.0)


@settings(max_examples=200, deadline=None)
@given(
    renewals=st.lists(
        st.tuples(
            st.floats(0.5, 5.0),  # seconds between renewal attempts
            st.floats(0.0, 6.0),  # how long the request took to reach the API server
            st.floats(0.0, 6.0),  # and how long its answer took to come back
            st.booleans(),  # whether the write succeeded
        ),
        min_size=1,
        max_size=30,
    ),
    poll=st.floats(0.1, 3.0),
    drift=st.floats(0.995, 1.005),
)
def test_leadership_always_ends_here_before_a_standby_may_take_over(
    renewals: list[tuple[float, float, float, bool]], poll: float, drift: float
) -> None:
    """Whatever the latencies, failures and poll period, and with the standby's clock
    running up to 0.5 % fast or slow: the last instant the leader may act comes before
    the first instant the standby may take the Lease. Wall clocks play no part."""
    duration, margin = 15.0, 5.0
    leader_clock = Clock(0.0)
    lead = leadership(leader_clock, duration, margin)
    writes: list[float] = []  # true times at which the API server changed the record
    t = 0.0
    for gap, up, down, ok in renewals:
        t += gap
        if lead.lost_reason is not None or (lead.valid_until is not None and t >= lead.valid_until):
            break  # the leader stops (keep() steps down) and never renews again
        if ok:
            writes.append(t + up)
            leader_clock.now = t + up + down
            lead.renewed(t, transitions=1)
    if not writes:
        return
    last_valid = lead.valid_until
    assert last_valid is not None
    # the standby polls every `poll` s of its own clock; the first poll after the last
    # write sees the change; from there it counts `duration` on its own (drifting) clock
    seen_at = (int(writes[-1] / poll) + 1) * poll
    takeover = seen_at + duration / drift
    assert last_valid < takeover
