"""The core's readings that take plain values: the one idle-since rule (`work_reading`),
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


def work_reading(
    active_jobs: int, source: str, observed_at: datetime, idle_since: datetime | None
) -> WorkReading:
    """Active jobs on the node; `idle_since` is kept only while no job runs."""
    if active_jobs > 0:
        return WorkReading(source=source, observed_at=observed_at, active_jobs=active_jobs)
    since = idle_since if idle_since is not None and idle_since <= observed_at else observed_at
    return WorkReading(source=source, observed_at=observed_at, active_jobs=0, idle_since=since)


def cloud_capability(source: str, observed_at: datetime) -> CapabilityReading:
    """A cloud VM is destroyed through the cloud API (GracefulShutdown = destroy)."""
    return CapabilityReading(
        source=f"{source} (destroy)",
        observed_at=observed_at,
        control_method="Cloud",
        allowable=("GracefulShutdown",),
    )
