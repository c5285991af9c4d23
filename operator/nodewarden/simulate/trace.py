"""Workload traces: the containers to replay, in a documented CSV or JSONL format.

One container per row (CSV, with a header) or per line (JSONL, one JSON object each):

    column        required  meaning
    arrival       yes       seconds since the trace start (number >= 0), or an RFC 3339
                            time with a zone (then the earliest arrival is the start;
                            all rows use one form)
    runtime       yes       run time once started: seconds (number > 0) or a duration ("1h30m")
    vcpus         no (1)    virtual CPUs
    ram           no (1Gi)  memory, a Kubernetes quantity ("4Gi") or bytes
    scratch       no (0)    local scratch space, a quantity
    gpus          no (0)    number of GPUs
    gpu_model     no        required GPU model (gpuModel in JSONL is accepted too)
    preemptible   no (false) run on a preemptible (spot) type: true/false
    priority      no (500)  0-1000, higher first; 0 = held (never started)
    uuid          no        container id (default: c + line number); unique

CSV lines starting with '#' and blank lines are ignored; so are blank JSONL lines.
`parse_trace(text, fmt, name)` returns a `Trace` or raises `InputError` naming the line
and the field ("trace.csv:17: ram: invalid quantity 'lots' ..."). `dump_trace` writes the
same format back (absolute arrivals stay absolute).
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic.alias_generators import to_camel

from nodewarden.api.containerdispatch import ContainerResources
from nodewarden.simulate.errors import InputError, field_errors
from nodewarden.units import format_duration, parse_duration

TraceFormat = Literal["csv", "jsonl"]
COLUMNS = (
    "uuid",
    "arrival",
    "runtime",
    "vcpus",
    "ram",
    "scratch",
    "gpus",
    "gpu_model",
    "preemptible",
    "priority",
)
DEFAULT_START = datetime(2026, 11, 30, tzinfo=UTC)  # a Monday, 00:00 UTC
"""Where relative arrival times are anchored (the decisions need wall-clock times)."""
_US = 1_000_000


@dataclass(frozen=True, slots=True)
class TraceContainer:
    """One container of a trace; times in integer microseconds since the trace start."""

    uuid: str
    arrival: int
    runtime: int
    resources: ContainerResources
    priority: int


@dataclass(frozen=True, slots=True)
class Trace:
    """Containers sorted by arrival; `start` anchors time 0, `end` is the trace's span."""

    name: str
    start: datetime
    containers: tuple[TraceContainer, ...]
    end: int
    absolute: bool = False

    def at(self, us: int) -> datetime:
        return self.start + timedelta(microseconds=us)


class _Row(BaseModel):
    model_config = ConfigDict(extra="forbid", alias_generator=to_camel, populate_by_name=True)

    uuid: str | None = Field(default=None, min_length=1, max_length=128)
    arrival: float | str
    runtime: float | str
    vcpus: int = Field(default=1, ge=1, le=4096)
    ram: str | int = "1Gi"
    scratch: str | int = "0"
    gpus: int = Field(default=0, ge=0, le=64)
    gpu_model: str | None = Field(default=None, max_length=128)
    preemptible: bool = False
    priority: int = Field(default=500, ge=0, le=1000)

    @field_validator("gpu_model", "uuid", mode="before")
    @classmethod
    def _empty_is_none(cls, value: Any) -> Any:
        return None if value == "" else value

    @field_validator("preemptible", mode="before")
    @classmethod
    def _boolean(cls, value: Any) -> Any:
        if isinstance(value, str):
            text = value.strip().lower()
            if text in ("", "false", "0", "no"):
                return False
            if text in ("true", "1", "yes"):
                return True
            raise ValueError(f"write true or false, not {value!r}")
        return value


def _seconds(value: float | str, what: str) -> float:
    """A number of seconds, or a duration string, as float seconds."""
    if isinstance(value, (int, float)):
        return float(value)
    text = value.strip()
    try:
        return float(text)
    except ValueError:
        pass
    try:
        return parse_duration(text).total_seconds()
    except ValueError:
        raise ValueError(
            f"{what}: {value!r} is neither a number of seconds nor a duration such as '90s'"
        ) from None


def _absolute(value: str) -> datetime | None:
    try:
        parsed = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed


ShapeCache = dict[tuple[object, ...], ContainerResources]


def shared_resources(
    cache: ShapeCache,
    vcpus: int,
    ram: str | int,
    scratch: str | int = "0",
    gpus: int = 0,
    gpu_model: str | None = None,
    preemptible: bool = False,
) -> ContainerResources:
    """Validated resources, one shared instance per distinct shape in `cache`."""
    key = (vcpus, ram, scratch, gpus, gpu_model, preemptible)
    hit = cache.get(key)
    if hit is None:
        hit = ContainerResources(
            vcpus=vcpus,
            ram=str(ram),
            scratch=str(scratch),
            gpus=gpus,
            gpu_model=gpu_model,
            preemptible=preemptible,
        )
        cache[key] = hit
    return hit


def _resources(cache: ShapeCache, row: _Row) -> ContainerResources:
    return shared_resources(
        cache, row.vcpus, row.ram, row.scratch, row.gpus, row.gpu_model, row.preemptible
    )


def _rows(text: str, fmt: TraceFormat, name: str) -> list[tuple[int, dict[str, Any]]]:
    """(line number, raw row) pairs."""
    out: list[tuple[int, dict[str, Any]]] = []
    if fmt == "jsonl":
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except json.JSONDecodeError as exc:
                raise InputError(f"{name}:{number}: not valid JSON: {exc.msg}") from None
            if not isinstance(value, dict):
                raise InputError(f"{name}:{number}: each line must be a JSON object")
            out.append((number, value))
        return out
    lines = [
        (n, line)
        for n, line in enumerate(text.splitlines(), start=1)
        if line.strip() and not line.lstrip().startswith("#")
    ]
    if not lines:
        return out
    header_line, header = lines[0]
    columns = [c.strip() for c in next(csv.reader([header]))]
    unknown = [c for c in columns if c not in COLUMNS and c != "gpuModel"]
    if unknown:
        raise InputError(
            f"{name}:{header_line}: unknown column {unknown[0]!r}; columns are {', '.join(COLUMNS)}"
        )
    for number, line in lines[1:]:
        cells = next(csv.reader([line]))
        if len(cells) != len(columns):
            raise InputError(
                f"{name}:{number}: {len(cells)} fields, but the header names {len(columns)}"
            )
        out.append(
            (number, {c: v.strip() for c, v in zip(columns, cells, strict=True) if v.strip()})
        )
    return out


def parse_trace(text: str, fmt: TraceFormat, name: str = "trace") -> Trace:
    """Parse a trace; InputError names the line and field of the first problem."""
    raw = _rows(text, fmt, name)
    if not raw:
        raise InputError(f"{name}: the trace has no containers")
    parsed: list[tuple[int, _Row, float | datetime, float]] = []
    shapes: ShapeCache = {}
    absolute: bool | None = None
    for number, data in raw:
        try:
            row = _Row.model_validate(data)
            runtime = _seconds(row.runtime, "runtime")
            if runtime <= 0:
                raise ValueError(f"runtime: must be greater than 0 (got {row.runtime!r})")
            when: float | datetime
            stamp = _absolute(row.arrival) if isinstance(row.arrival, str) else None
            if stamp is not None:
                if stamp.tzinfo is None:
                    raise ValueError("arrival: an RFC 3339 time needs a zone (e.g. a trailing Z)")
                when = stamp
            else:
                when = _seconds(row.arrival, "arrival")
                if when < 0:
                    raise ValueError("arrival: must not be negative")
            is_absolute = isinstance(when, datetime)
            if absolute is None:
                absolute = is_absolute
            elif absolute != is_absolute:
                raise ValueError(
                    "arrival: mixes RFC 3339 times and seconds; use one form for every row"
                )
            _resources(shapes, row)
        except ValidationError as exc:
            raise InputError(f"{name}:{number}: {field_errors(exc)}") from None
        except ValueError as exc:
            raise InputError(f"{name}:{number}: {exc}") from None
        parsed.append((number, row, when, runtime))
    if absolute:
        start = min(w for _, _, w, _ in parsed if isinstance(w, datetime)).astimezone(UTC)
    else:
        start = DEFAULT_START
    containers: list[TraceContainer] = []
    seen: dict[str, int] = {}
    for number, row, when, runtime in parsed:
        uuid = row.uuid or f"c{number:07d}"
        if uuid in seen:
            raise InputError(
                f"{name}:{number}: uuid: {uuid!r} is already used on line {seen[uuid]}"
            )
        seen[uuid] = number
        if isinstance(when, datetime):
            arrival = round((when - start).total_seconds() * _US)
        else:
            arrival = round(when * _US)
        containers.append(
            TraceContainer(
                uuid=uuid,
                arrival=arrival,
                runtime=max(1, round(runtime * _US)),
                resources=_resources(shapes, row),
                priority=row.priority,
            )
        )
    containers.sort(key=lambda c: c.arrival)  # stable: file order breaks ties
    end = containers[-1].arrival
    return Trace(
        name=name, start=start, containers=tuple(containers), end=end, absolute=bool(absolute)
    )


def _number(us: int) -> str:
    seconds = us / _US
    return f"{seconds:.6f}".rstrip("0").rstrip(".")


def _row_of(trace: Trace, c: TraceContainer) -> dict[str, Any]:
    r = c.resources
    arrival: str | float = (
        trace.at(c.arrival).isoformat().replace("+00:00", "Z")
        if trace.absolute
        else float(_number(c.arrival))
    )
    return {
        "uuid": c.uuid,
        "arrival": arrival,
        "runtime": float(_number(c.runtime)),
        "vcpus": r.vcpus,
        "ram": r.ram,
        "scratch": r.scratch,
        "gpus": r.gpus,
        "gpu_model": r.gpu_model,
        "preemptible": r.preemptible,
        "priority": c.priority,
    }


def dump_trace(trace: Trace, fmt: TraceFormat) -> str:
    """The trace in `fmt` (the format parse_trace reads)."""
    rows = [_row_of(trace, c) for c in trace.containers]
    if fmt == "jsonl":
        return "".join(
            json.dumps({k: v for k, v in row.items() if v is not None}, separators=(",", ":"))
            + "\n"
            for row in rows
        )
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(COLUMNS)
    for row in rows:
        writer.writerow([_cell(row[c]) for c in COLUMNS])
    return buffer.getvalue()


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:.6f}".rstrip("0").rstrip(".")
    return str(value)


def describe(trace: Trace) -> dict[str, Any]:
    """Summary figures of a trace (for the report header)."""
    gpu = sum(1 for c in trace.containers if c.resources.gpus > 0)
    return {
        "name": trace.name,
        "containers": len(trace.containers),
        "gpuContainers": gpu,
        "cpuContainers": len(trace.containers) - gpu,
        "start": trace.start.isoformat().replace("+00:00", "Z"),
        "span": format_duration(timedelta(microseconds=trace.end)),
        "containerHours": round(sum(c.runtime for c in trace.containers) / _US / 3600, 1),
    }
