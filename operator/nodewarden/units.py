"""Units used across nodewarden objects: Go-style durations and Kubernetes quantities.

Durations are written the way Kubernetes users already write them ("90s", "20m",
"1h30m"); quantities the way pod resources are written ("512Mi", "16Gi", "2G").
Both are validated by the CRD schema with the regular expressions defined here and
parsed by the functions here, so the apiserver and Python agree on what is valid.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Annotated, Any

from pydantic import AfterValidator, Field

# One to six <number><unit> groups, no sign (negative durations are rejected). The digits
# of each group are bounded by its unit (at most 5 before the point for hours, 7 for
# minutes, 9 for seconds, 12 for ms, 15 for us, 18 for ns; 9 after it), so the largest
# duration the pattern admits (6 groups of 10^18 ns, about 1.7 million hours) stays below
# what Go's time.Duration holds (about 2.56 million hours): the API server's own CEL
# `duration()` can never overflow on a value the schema let through, and neither can
# Python's timedelta. The maximum of each field is a CEL rule on top (8760h by default).
_GROUP = (
    r"([0-9]{1,5}(\.[0-9]{1,9})?h"
    r"|[0-9]{1,7}(\.[0-9]{1,9})?m"
    r"|[0-9]{1,9}(\.[0-9]{1,9})?s"
    r"|[0-9]{1,12}(\.[0-9]{1,9})?ms"
    r"|[0-9]{1,15}(\.[0-9]{1,9})?(us|µs)"
    r"|[0-9]{1,18}(\.[0-9]{1,9})?ns)"
)
DURATION_PATTERN = rf"^{_GROUP}{{1,6}}$"
DURATION_MAX_LENGTH = 64
MAX_DURATION = "8760h"
"""The default upper bound of a duration field (one year): nothing nodewarden waits for
sensibly takes longer."""
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

QUANTITY_PATTERN = r"^[0-9]{1,18}(\.[0-9]{1,9})?(Ki|Mi|Gi|Ti|Pi|k|M|G|T|P)?$"
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
    try:
        return timedelta(seconds=float(total))
    except OverflowError:  # unreachable through the pattern; a ValueError all the same
        raise ValueError(f"invalid duration {text!r}: too long") from None


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


def _duration_at_most(maximum: str) -> Callable[[str], str]:
    limit = parse_duration(maximum)

    def check(value: str) -> str:
        if parse_duration(value) > limit:
            raise ValueError(f"must be at most {maximum}")
        return value

    return check


def duration_schema(maximum: str = MAX_DURATION) -> Any:
    """The schema part of a duration field of at most `maximum`: pattern, length and a CEL
    rule, so the API server refuses what pydantic refuses (`_duration_at_most`).

    The rule converts only a value the pattern admits: a value an older release stored
    (say "99999999999h") would make `duration()` fail at run time, and a failing rule is
    not ratcheted -- every later write of that object, its status included, would be
    refused, so nodewarden could not even mark it invalid. Such a value fails the pattern
    instead, which the API server ratchets (an unchanged field is let through)."""
    return Field(
        pattern=DURATION_PATTERN,
        max_length=DURATION_MAX_LENGTH,
        json_schema_extra={
            "x-nodewarden-format": "duration",
            "x-kubernetes-validations": [
                {
                    "rule": cel_durations(f"duration(self) <= duration('{maximum}')", "self"),
                    "message": f"must be at most {maximum}",
                }
            ],
        },
    )


def cel_durations(rule: str, *fields: str) -> str:
    """`rule`, converting the duration `fields` only when each matches the pattern (see
    `duration_schema`: a run-time error in a rule would refuse every write of an object
    an older release stored)."""
    guards = [f"!{field}.matches(r'{DURATION_PATTERN}')" for field in fields]
    return " || ".join([*guards, f"({rule})"])


def _check_quantity(value: str) -> str:
    parse_quantity(value)
    return value


Duration = Annotated[str, duration_schema(), AfterValidator(_duration_at_most(MAX_DURATION))]
"""A Go-style duration string of at most 8760h; validated by the CRD schema and by pydantic."""

Quantity = Annotated[
    str,
    Field(pattern=QUANTITY_PATTERN, max_length=64),
    AfterValidator(_check_quantity),
]
"""A Kubernetes quantity string ("16Gi")."""

MacAddress = Annotated[str, Field(pattern=MAC_PATTERN, max_length=17)]
"""A 48-bit MAC address written as six hex pairs separated by ':' or '-'."""
