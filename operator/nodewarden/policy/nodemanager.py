"""The node-manager policy matrix for cloud worker nodes, and the derivation of its inputs.

    decide(worker_state, billing_window, boot_grace, idle_grace) -> NodeManagerAction | None

takes exactly the strings of the spec (or the str enums below):

    worker_state    unpaired | busy | idle | down
    billing_window  open | closed
    boot_grace      boot wait | boot exceeded
    idle_grace      not idle | idle wait | idle exceeded

Rules (SPEC.md "Node-manager policy matrix"):

    busy      -> None
    down      -> START_SHUTDOWN (always)
    idle      -> START_DRAIN if billing window open AND idle grace exceeded, else None
    unpaired  -> START_SHUTDOWN if boot grace exceeded, else None

The derivation functions compute each input from raw facts: `worker_state_from`
(pairing, last heartbeat + staleness, scheduler state string), `boot_grace_from`
(boot time + boot expiry), `idle_grace_from` (idle-since + idle grace) and
`billing_window_from` (boot time + billing period and shutdown window offsets; the
window repeats in every period counted from boot; period 0s = per-second billing, always
open). `derive_inputs` / `decide_for` do it all from a `CloudWorkerFacts` and a
`PolicyView`. Unknown strings raise ValueError naming the accepted values; all
functions are pure (the clock is a parameter).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import TypeVar

from nodewarden.policy.base import require_aware
from nodewarden.policy.view import PolicyView


class WorkerState(StrEnum):
    UNPAIRED = "unpaired"
    BUSY = "busy"
    IDLE = "idle"
    DOWN = "down"


class BillingWindowState(StrEnum):
    OPEN = "open"
    CLOSED = "closed"


class BootGrace(StrEnum):
    WAIT = "boot wait"
    EXCEEDED = "boot exceeded"


class IdleGrace(StrEnum):
    NOT_IDLE = "not idle"
    WAIT = "idle wait"
    EXCEEDED = "idle exceeded"


class NodeManagerAction(StrEnum):
    START_DRAIN = "START_DRAIN"
    START_SHUTDOWN = "START_SHUTDOWN"


_E = TypeVar("_E", bound=StrEnum)


def _coerce(enum: type[_E], value: str, what: str) -> _E:
    if isinstance(value, enum):
        return value
    try:
        return enum(value)
    except ValueError:
        allowed = ", ".join(repr(m.value) for m in enum)
        raise ValueError(f"unknown {what} {value!r}; expected one of {allowed}") from None


def decide(
    worker_state: WorkerState | str,
    billing_window: BillingWindowState | str,
    boot_grace: BootGrace | str,
    idle_grace: IdleGrace | str,
) -> NodeManagerAction | None:
    """The matrix. Returns None (do nothing), START_DRAIN or START_SHUTDOWN."""
    ws = _coerce(WorkerState, worker_state, "worker state")
    bw = _coerce(BillingWindowState, billing_window, "billing window")
    bg = _coerce(BootGrace, boot_grace, "boot grace")
    ig = _coerce(IdleGrace, idle_grace, "idle grace")
    if ws is WorkerState.BUSY:
        return None
    if ws is WorkerState.DOWN:
        return NodeManagerAction.START_SHUTDOWN
    if ws is WorkerState.IDLE:
        if bw is BillingWindowState.OPEN and ig is IdleGrace.EXCEEDED:
            return NodeManagerAction.START_DRAIN
        return None
    # unpaired
    if bg is BootGrace.EXCEEDED:
        return NodeManagerAction.START_SHUTDOWN
    return None


# -- scheduler state strings ---------------------------------------------------------

_SCHEDULER_IDLE = frozenset({"idle"})
_SCHEDULER_BUSY = frozenset({"alloc", "mix", "comp", "drng", "maint"})
_SCHEDULER_DOWN = frozenset({"drain", "down", "error", "fail", "unknown"})
KNOWN_SCHEDULER_STATES = _SCHEDULER_IDLE | _SCHEDULER_BUSY | _SCHEDULER_DOWN


def scheduler_worker_state(scheduler_state: str) -> WorkerState:
    """Map the scheduler's node state string to busy / idle / down.

    idle -> idle; alloc, mix, comp, drng (draining but still running), maint
    (reserved for maintenance: a person is working on it, leave it alone) -> busy;
    drain, down, error, fail, unknown, and any state suffixed '*' (the scheduler
    cannot reach the node) -> down. Anything else raises ValueError.
    """
    if not isinstance(scheduler_state, str):
        raise ValueError(f"scheduler state must be a string, got {scheduler_state!r}")
    text = scheduler_state.strip().lower()
    if text.endswith("*"):
        base = text.rstrip("*")
        if base not in KNOWN_SCHEDULER_STATES:
            raise ValueError(_unknown_scheduler(scheduler_state))
        return WorkerState.DOWN
    if text in _SCHEDULER_IDLE:
        return WorkerState.IDLE
    if text in _SCHEDULER_BUSY:
        return WorkerState.BUSY
    if text in _SCHEDULER_DOWN:
        return WorkerState.DOWN
    raise ValueError(_unknown_scheduler(scheduler_state))


def _unknown_scheduler(value: str) -> str:
    known = ", ".join(sorted(KNOWN_SCHEDULER_STATES))
    return f"unknown scheduler state {value!r}; expected one of {known} (optionally suffixed '*')"


def worker_state_from(
    *,
    paired: bool,
    scheduler_state: str | None,
    last_heartbeat: datetime | None,
    stale_after: timedelta,
    now: datetime,
) -> WorkerState:
    """Derive the worker state.

    Not paired (a cloud node with no platform record) -> unpaired. A paired node whose
    last heartbeat is missing or older than `stale_after` -> down. Otherwise the
    scheduler's state string decides (see `scheduler_worker_state`); a paired node
    without a scheduler state is down (nothing vouches for it).
    """
    require_aware(now)
    if not paired:
        return WorkerState.UNPAIRED
    if last_heartbeat is None:
        return WorkerState.DOWN
    require_aware(last_heartbeat, "last_heartbeat")
    if now - last_heartbeat > stale_after:
        return WorkerState.DOWN
    if scheduler_state is None:
        return WorkerState.DOWN
    return scheduler_worker_state(scheduler_state)


def boot_grace_from(*, booted_at: datetime, boot_expiry: timedelta, now: datetime) -> BootGrace:
    """`boot wait` while younger than the boot expiry, `boot exceeded` from then on."""
    require_aware(now)
    require_aware(booted_at, "booted_at")
    return BootGrace.WAIT if now - booted_at < boot_expiry else BootGrace.EXCEEDED


def idle_grace_from(
    *, idle_since: datetime | None, idle_grace: timedelta, now: datetime
) -> IdleGrace:
    """`not idle` without idle-since; `idle wait` before the grace is over; else exceeded."""
    require_aware(now)
    if idle_since is None:
        return IdleGrace.NOT_IDLE
    require_aware(idle_since, "idle_since")
    return IdleGrace.WAIT if now - idle_since < idle_grace else IdleGrace.EXCEEDED


def _check_window(period: timedelta, start: timedelta, end: timedelta) -> None:
    zero = timedelta(0)
    if period < zero or start < zero or end < zero:
        raise ValueError("billing period and window offsets must not be negative")
    if start >= end:
        raise ValueError(f"billing window start {start} must be before its end {end}")
    if period != zero and end > period:
        raise ValueError(f"billing window end {end} must not be after the period {period}")


def billing_window_from(
    *,
    booted_at: datetime,
    period: timedelta,
    window_start: timedelta,
    window_end: timedelta,
    now: datetime,
) -> BillingWindowState:
    """Whether `now` falls in the shutdown window of the current billing period.

    Periods are counted from boot: offset = (now - booted_at) mod period; the window is
    open for window_start <= offset < window_end. period 0 = always open. Before the
    boot time (clock skew) the window is closed.
    """
    require_aware(now)
    require_aware(booted_at, "booted_at")
    _check_window(period, window_start, window_end)
    if period == timedelta(0):
        return BillingWindowState.OPEN
    uptime = now - booted_at
    if uptime < timedelta(0):
        return BillingWindowState.CLOSED
    offset = uptime % period
    if window_start <= offset < window_end:
        return BillingWindowState.OPEN
    return BillingWindowState.CLOSED


def next_billing_window_open(
    *,
    booted_at: datetime,
    period: timedelta,
    window_start: timedelta,
    window_end: timedelta,
    now: datetime,
) -> datetime:
    """When the shutdown window is next open (now itself if it is open now)."""
    state = billing_window_from(
        booted_at=booted_at,
        period=period,
        window_start=window_start,
        window_end=window_end,
        now=now,
    )
    if state is BillingWindowState.OPEN:
        return now
    uptime = now - booted_at
    if uptime < timedelta(0):
        return booted_at + window_start
    period_start = booted_at + (uptime // period) * period
    candidate = period_start + window_start
    if candidate <= now:
        candidate += period
    return candidate


@dataclass(frozen=True, slots=True)
class CloudWorkerFacts:
    """Raw facts about one cloud worker node, as the dispatcher sees them."""

    paired: bool
    scheduler_state: str | None
    last_heartbeat: datetime | None
    booted_at: datetime
    idle_since: datetime | None
    grace_from: datetime | None = None
    """Where the boot grace counts from when not the boot (a VM this process found
    running: when it found it); None: `booted_at`."""


@dataclass(frozen=True, slots=True)
class MatrixInputs:
    worker_state: WorkerState
    billing_window: BillingWindowState
    boot_grace: BootGrace
    idle_grace: IdleGrace


@dataclass(frozen=True, slots=True)
class MatrixDecision:
    inputs: MatrixInputs
    action: NodeManagerAction | None


def derive_inputs(facts: CloudWorkerFacts, policy: PolicyView, now: datetime) -> MatrixInputs:
    """The matrix tuple for `facts` under `policy` at `now`.

    Uses policy.heartbeat_stale_after (staleness), boot_grace (boot expiry),
    idle_threshold (idle grace) and billing (period, windowStart, windowEnd).
    """
    return MatrixInputs(
        worker_state=worker_state_from(
            paired=facts.paired,
            scheduler_state=facts.scheduler_state,
            last_heartbeat=facts.last_heartbeat,
            stale_after=policy.heartbeat_stale_after,
            now=now,
        ),
        billing_window=billing_window_from(
            booted_at=facts.booted_at,
            period=policy.billing_period,
            window_start=policy.billing_window_start,
            window_end=policy.billing_window_end,
            now=now,
        ),
        boot_grace=boot_grace_from(
            booted_at=facts.grace_from or facts.booted_at,
            boot_expiry=policy.boot_grace,
            now=now,
        ),
        idle_grace=idle_grace_from(
            idle_since=facts.idle_since, idle_grace=policy.idle_threshold, now=now
        ),
    )


def decide_for(facts: CloudWorkerFacts, policy: PolicyView, now: datetime) -> MatrixDecision:
    """Derive the tuple and apply the matrix."""
    inputs = derive_inputs(facts, policy, now)
    action = decide(
        inputs.worker_state, inputs.billing_window, inputs.boot_grace, inputs.idle_grace
    )
    return MatrixDecision(inputs=inputs, action=action)
