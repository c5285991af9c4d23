"""A cloud VM's node-manager facts (`VmReading`) from the pool's frozen snapshot of its
worker: launch time, when this process found it (a VM it did not launch: its boot grace
counts from then), pairing, heartbeat, probe attempts, broken / deletion / stopped."""

from __future__ import annotations

from datetime import datetime

from nodewarden.fleet.ports import WorkerSnapshot
from nodewarden.policy.facts import VmReading

SOURCE = "cloud list + ssh probes"


def vm_reading(worker: WorkerSnapshot, now: datetime) -> VmReading:
    """The reading, observed when the pool last read the cloud list or last began a
    probe, whichever is later (`now` when it has not listed yet); the launch time is
    never after the observation."""
    listed_at = worker.listed_at or now
    observed = max(listed_at, worker.last_attempt or listed_at)
    booted = min(worker.booted_at, observed)
    attempts = worker.attempts_since_success if worker.last_success else worker.attempts_total
    return VmReading(
        source=SOURCE,
        observed_at=observed,
        booted_at=booted,
        found_at=worker.found_at,
        paired=worker.last_success is not None,
        last_heartbeat=worker.last_success,
        probe_attempts=attempts,
        broken=worker.broken,
        deletion_requested=worker.deletion_requested,
        stopped=worker.instance_stopped,
    )
