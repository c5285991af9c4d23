"""When a node's evidence needs a step and when it does not: the due time at which its
decisive telemetry expires, and whether a new observation only confirms what it held.

    DECISIVE[node_type]                  the readings the telemetry gates judge
    expires_at(facts, max_age, ...)      when the oldest decisive reading turns stale
    only_time_moved(old, new)            the same values, observed again (no step needed)

Pure. The power controller (`power.agenda`) steps a node at `expires_at` even when
nothing arrives, so a probe or a stream that stops turns into a DEFER for stale
telemetry on time; and it folds an observation for which `only_time_moved` holds into
the node's facts without a step (the readings' times move, the decision cannot: the
same facts at a later time, before any due time, decide the same).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from nodewarden.policy.facts import GpuWork, NodeFacts, Reading, UptimeReading

DECISIVE: dict[str, tuple[str, ...]] = {
    "SideNode": ("demand", "work", "power", "inhibitors"),
    "CloudVM": ("demand", "work", "power", "vm"),
}
"""The readings whose age the telemetry gates judge, by node type (`policy.gates`
`shutdown_telemetry`, `policy.cloudvm`): the expiry of any of them can change a decision."""

ON_SINCE_TOLERANCE = timedelta(seconds=5)
"""A boot time read again (now minus the uptime) moves by the probe's own latency: within
this it is the same boot."""

_TIMES = {"observed_at", "bmc_observed_at", "host_observed_at", "matched_at", "last_heartbeat"}
"""Fields that say when a value was seen, not what it is."""


def expires_at(
    facts: NodeFacts,
    max_age: timedelta,
    heartbeat_stale_after: timedelta | None = None,
    demand_confirmed_at: datetime | None = None,
) -> datetime | None:
    """When the first decisive reading present turns stale (None: none is present; a
    missing reading is judged by the step that finds it missing, not by a due time).

    `demand_confirmed_at`: the dispatcher's last word that its plan did not change (its
    demand readings hold at that time too). For a cloud VM, its last heartbeat turning
    stale is a due time as well (the node-manager rules judge it)."""
    soonest: datetime | None = None
    for name in DECISIVE.get(facts.node_type, DECISIVE["SideNode"]):
        reading: Reading | None = getattr(facts, name)
        if reading is None:
            continue
        at = reading.observed_at
        if name == "demand" and demand_confirmed_at is not None and demand_confirmed_at > at:
            at = demand_confirmed_at
        due = at + max_age
        if soonest is None or due < soonest:
            soonest = due
    vm = facts.vm
    if vm is not None and vm.last_heartbeat is not None and heartbeat_stale_after is not None:
        due = vm.last_heartbeat + heartbeat_stale_after
        if soonest is None or due < soonest:
            soonest = due
    return soonest


def only_time_moved(old: NodeFacts, new: NodeFacts) -> bool:
    """Whether `new` holds the same values as `old` and differs only in when they were
    observed (a boot time within `ON_SINCE_TOLERANCE` is the same boot)."""
    if old.node_type != new.node_type:
        return False
    for name in type(old).model_fields:
        a = getattr(old, name)
        b = getattr(new, name)
        if a is b or a == b:
            continue
        if not isinstance(a, Reading) or not isinstance(b, Reading) or type(a) is not type(b):
            return False
        if not _same_values(a, b):
            return False
    return True


def _same_values(a: Reading, b: Reading) -> bool:
    for field in type(a).model_fields:
        if field in _TIMES or (field == "source" and isinstance(a, UptimeReading)):
            continue  # a boot time read from the cloud or from the node is the same boot
        x, y = getattr(a, field), getattr(b, field)
        if x == y:
            continue
        if isinstance(x, GpuWork) and isinstance(y, GpuWork) and _same_gpu(x, y):
            continue  # a work reading's GPU evidence, read again
        times = isinstance(x, datetime) and isinstance(y, datetime)
        if field == "on_since" and times and abs(x - y) <= ON_SINCE_TOLERANCE:
            continue
        return False
    return True


_GPU_TIMES = frozenset({"source", "observed_at", "utilisation_source", "utilisation_at"})


def _same_gpu(a: GpuWork, b: GpuWork) -> bool:
    """The same GPU evidence but for when (and by whom) it was read."""
    return all(getattr(a, f) == getattr(b, f) for f in type(a).model_fields if f not in _GPU_TIMES)
