"""ContainerDispatch objects -> a workload trace (`nodewarden trace export`), pure.

`trace_from_dispatches(objects, since=None)` turns ContainerDispatch objects as listed
from the API into a trace: arrival = metadata.creationTimestamp (absolute, so the
replay keeps the site's time of day), run time = status.finishedAt - status.startedAt,
resources and priority from the spec. A container that never started, or has not
finished yet, has no run time and is skipped; so is one created before `since`. The
skipped ones are counted by reason for the summary line.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from nodewarden.api.containerdispatch import ContainerDispatchSpec
from nodewarden.simulate.trace import ShapeCache, Trace, TraceContainer, shared_resources

_US = 1_000_000


def _time(value: Any) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def trace_from_dispatches(
    objects: Iterable[Mapping[str, Any]], since: datetime | None = None, name: str = "export"
) -> tuple[Trace | None, Counter[str]]:
    """The trace of the finished containers among `objects`, and the skipped counts."""
    skipped: Counter[str] = Counter()
    rows: list[tuple[datetime, str, ContainerDispatchSpec, float]] = []
    for obj in objects:
        meta = obj.get("metadata") or {}
        status = obj.get("status") or {}
        created = _time(meta.get("creationTimestamp"))
        if created is None:
            skipped["no creationTimestamp"] += 1
            continue
        if since is not None and created < since:
            skipped["created before --since"] += 1
            continue
        try:
            spec = ContainerDispatchSpec.model_validate(obj.get("spec") or {})
        except ValidationError:
            skipped["invalid spec"] += 1
            continue
        started, finished = _time(status.get("startedAt")), _time(status.get("finishedAt"))
        if started is None:
            skipped["never started"] += 1
            continue
        if finished is None:
            skipped["not finished"] += 1
            continue
        runtime = (finished - started).total_seconds()
        if runtime <= 0:
            skipped["finished before it started"] += 1
            continue
        rows.append((created, meta.get("name") or spec.uuid, spec, runtime))
    if not rows:
        return None, skipped
    rows.sort(key=lambda r: (r[0], r[1]))
    start = rows[0][0].astimezone(UTC)
    shapes: ShapeCache = {}
    containers = tuple(
        TraceContainer(
            uuid=spec.uuid,
            arrival=round((created - start).total_seconds() * _US),
            runtime=max(1, round(runtime * _US)),
            resources=shared_resources(
                shapes,
                spec.resources.vcpus,
                spec.resources.ram,
                spec.resources.scratch,
                spec.resources.gpus,
                spec.resources.gpu_model,
                spec.resources.preemptible,
            ),
            priority=spec.priority,
        )
        for created, _, spec, runtime in rows
    )
    return (
        Trace(
            name=name, start=start, containers=containers, end=containers[-1].arrival, absolute=True
        ),
        skipped,
    )
