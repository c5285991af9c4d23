"""The core's readings that take plain values: the one idle-since rule (`idle_since`, read
by `work_reading` and by the worker pool),
a cloud VM's destroy capability and its Off once the cloud no longer lists it.

Pure. Each reading's `observed_at` is when the value was *observed*, never when it was
cached or converted, so freshness gates measure the evidence itself. (Readings converted
from an adapter's own fact types live with the shell: `power/readings.py`.)
"""

from __future__ import annotations

from datetime import datetime

from nodewarden.policy.facts import CapabilityReading, PowerReading, WorkReading


def cloud_gone(source: str, instance_id: str | None, listed_at: datetime) -> PowerReading:
    """The instance is no longer in the cloud's list: destroyed, observed Off."""
    return PowerReading(
        source=f"{source} list (instance {instance_id or '?'} no longer listed)",
        observed_at=listed_at,
        power="Off",
    )


def idle_since(
    active_jobs: int, observed_at: datetime, previous: datetime | None
) -> datetime | None:
    """The one idle-since rule: None while a job runs; else the earlier idle time kept
    (`previous`, unless it lies after this observation), or this observation's time."""
    if active_jobs > 0:
        return None
    return previous if previous is not None and previous <= observed_at else observed_at


def work_reading(
    active_jobs: int, source: str, observed_at: datetime, previous_idle: datetime | None
) -> WorkReading:
    """Active jobs on the node, idle since when (`idle_since`) while none runs."""
    since = idle_since(active_jobs, observed_at, previous_idle)
    if since is None:
        return WorkReading(source=source, observed_at=observed_at, active_jobs=active_jobs)
    return WorkReading(source=source, observed_at=observed_at, active_jobs=0, idle_since=since)


def cloud_capability(source: str, observed_at: datetime) -> CapabilityReading:
    """A cloud VM is destroyed through the cloud API (GracefulShutdown = destroy)."""
    return CapabilityReading(
        source=f"{source} (destroy)",
        observed_at=observed_at,
        control_method="Cloud",
        allowable=("GracefulShutdown",),
    )
