"""ISO-8601 text of the timestamps the pool and the dispatcher write (status fields, tags)."""

from __future__ import annotations

from datetime import datetime


def iso(value: datetime | None) -> str | None:
    """`value` as RFC 3339 text with a `Z` for UTC (None stays None)."""
    return value.isoformat().replace("+00:00", "Z") if value is not None else None


def parse_time(text: str | None) -> datetime | None:
    """The datetime of an ISO-8601 text (a `Z` for UTC allowed); None when empty or bad."""
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
