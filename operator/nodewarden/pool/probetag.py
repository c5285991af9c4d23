"""When a cloud VM's last-probe tag is rewritten: a coarse heartbeat, not every probe.

Another dispatcher sharing the tag prefix claims (or destroys) an instance whose
last-probe tag is older than `takeover_after` (T) when it lists the cloud
(`pool/cloudsync.py`). This dispatcher rewrites the tag after a successful probe only
when the tag it last wrote (or, after a restart, the one the cloud list shows) is at
least `probe_tag_interval` (I) old. On a live dispatcher the tag's age seen by the other
one is then at most

    I + P + W

(I until the rewrite is due, P = `probe_interval` until the next successful probe after
that, W = `cloud.tag_write_max_wait`, the longest a tag write waits behind creates and
destroys), and it compares with T at the start of its sync, before its list is read, so
a list that is old only makes the tag look younger. The default I is T ÷ 4: with T = 10
min that is 150 s, and even one failed write (the next attempt is I later) leaves the
age at most 2·I + P + W = T/2 + P + W, under T while P + W < T/2 (5 minutes at the
defaults of 10 s and 10 s). An explicit I is used as given; keep 2·I + P + W < T.

Pure: the caller reads the clock and the tags and writes the tag.
"""

from __future__ import annotations

from datetime import datetime, timedelta

TAKEOVER_FRACTION = 4
"""The default `probe_tag_interval` is `takeover_after` divided by this."""


def tag_interval(configured: float | None, takeover_after: timedelta) -> timedelta:
    """`probe_tag_interval` in force: the configured seconds, else `takeover_after` ÷ 4."""
    if configured is not None:
        return timedelta(seconds=configured)
    return takeover_after / TAKEOVER_FRACTION


def tag_due(
    now: datetime,
    *,
    written_at: datetime | None,
    listed_stamp: datetime | None,
    interval: timedelta,
) -> bool:
    """Rewrite the last-probe tag now? Only once the newest stamp known is `interval` old.

    `written_at`: when this process last wrote (or tried to write) the tag; `listed_stamp`:
    the tag's value in the last cloud list (what a restarted dispatcher starts from).
    Neither known: due at once."""
    stamps = [s for s in (written_at, listed_stamp) if s is not None]
    if not stamps:
        return True
    return now - max(stamps) >= interval
