"""Units used across nodewarden objects: Go-style durations and Kubernetes quantities.

Durations are written the way Kubernetes users already write them ("90s", "20m",
"1h30m"); quantities the way pod resources are written ("512Mi", "16Gi", "2G").
Both are validated by the CRD schema with the regular expressions defined here and
parsed by the functions here, so the apiserver and Python agree on what is valid.
"""

from __future__ import annotations

import functools
import re
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Annotated

from pydantic import AfterValidator, Field

# One or more <number><unit> groups, no sign (negative durations are rejected).
DURATION_PATTERN = r"^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$"
_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ns|us|µs|ms|s|m|h)")
_DURATION_FULL = re.compile(DURATION_PATTERN)
_DURATION_SECONDS = {
    "ns": Decimal("1e-9"),
    "us": Decimal("1e-6"),
    "µs": Decimal("1e-6"),
    "ms": Decimal("1e-3"),
    "s": Decimal(1),
    "m": Decimal(60),
    "h": Decimal(3600),
}

QUANTITY_PATTERN = r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|k|M|G|T|P)?$"
_QUANTITY_FULL = re.compile(QUANTITY_PATTERN)
_QUANTITY_FACTORS = {
    "": 1,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
}

MAC_PATTERN = r"^([0-9A-Fa-f]{2}[:-]){5}[0-9A-Fa-f]{2}$"


def rfc3339(value: datetime | None) -> str | None:
    """A time as Kubernetes writes it (RFC 3339 with a Z)."""
    return value.isoformat().replace("+00:00", "Z") if value is not None else None


def parse_rfc3339(text: object) -> datetime | None:
    """A time Kubernetes wrote (None when absent or unreadable)."""
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def parse_duration(text: str) -> timedelta:
    """Parse a Go-style duration ("1h30m", "90s", "250ms") into a timedelta.

    Raises ValueError naming the accepted form when the text is not a duration.
    """
    if not isinstance(text, str) or not _DURATION_FULL.match(text):
        raise ValueError(
            f"invalid duration {text!r}: write a non-negative number with a unit, "
            "e.g. '90s', '20m', '1h30m' (units: ns, us, ms, s, m, h)"
        )
    total = Decimal(0)
    for number, unit in _DURATION_PART.findall(text):
        total += Decimal(number) * _DURATION_SECONDS[unit]
    return timedelta(seconds=float(total))


def format_duration(value: timedelta | float) -> str:
    """Format seconds (or a timedelta) as a compact Go-style duration, e.g. '1h2m3s'."""
    seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    if seconds < 0:
        return "-" + format_duration(-seconds)
    whole = int(seconds)
    frac = seconds - whole
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    out = ""
    if hours:
        out += f"{hours}h"
    if minutes:
        out += f"{minutes}m"
    if secs or frac or not out:
        out += f"{secs + frac:g}s" if frac else f"{secs}s"
    return out


@functools.lru_cache(maxsize=4096, typed=True)
def parse_quantity(text: str | int) -> int:
    """Parse a Kubernetes quantity ("512Mi", "16Gi", "2G", "1000") into an integer count.

    Cached: planning rounds parse the same few capacities of every node again and again."""
    if isinstance(text, int) and not isinstance(text, bool):
        if text < 0:
            raise ValueError(f"invalid quantity {text!r}: must not be negative")
        return text
    if not isinstance(text, str):
        raise ValueError(f"invalid quantity {text!r}: expected a string such as '16Gi'")
    match = _QUANTITY_FULL.match(text)
    if not match:
        raise ValueError(
            f"invalid quantity {text!r}: write a number with an optional suffix, "
            "e.g. '512Mi', '16Gi', '2G' (suffixes: Ki Mi Gi Ti Pi k M G T P)"
        )
    suffix = match.group(2) or ""
    number = Decimal(text[: len(text) - len(suffix)] if suffix else text)
    return int(number * _QUANTITY_FACTORS[suffix])


def _check_duration(value: str) -> str:
    parse_duration(value)
    return value


def _check_quantity(value: str) -> str:
    parse_quantity(value)
    return value


Duration = Annotated[
    str,
    Field(
        pattern=DURATION_PATTERN,
        max_length=64,
        json_schema_extra={"x-nodewarden-format": "duration"},
    ),
    AfterValidator(_check_duration),
]
"""A Go-style duration string; validated by the CRD schema and by pydantic."""

Quantity = Annotated[
    str,
    Field(pattern=QUANTITY_PATTERN, max_length=64),
    AfterValidator(_check_quantity),
]
"""A Kubernetes quantity string ("16Gi")."""

MacAddress = Annotated[str, Field(pattern=MAC_PATTERN)]
"""A 48-bit MAC address written as six hex pairs separated by ':' or '-'."""
