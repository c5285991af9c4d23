"""The one wall clock: `utc_now()`, an aware UTC datetime.

Pure code never calls it: it takes a clock (a `Callable[[], datetime]`) or a `now`
argument, and the shell passes `utc_now` (tests pass a fake clock).
"""

from __future__ import annotations

from datetime import UTC, datetime


def utc_now() -> datetime:
    """Now, in UTC (timezone-aware)."""
    return datetime.now(tz=UTC)
