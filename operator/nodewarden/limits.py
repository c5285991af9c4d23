"""Process limits the operator raises for itself at start-up: open files.

A fleet of 10,000 nodes keeps a connection per node (SSH streams, BMC sessions) plus the
API server's, the cloud's and the metrics endpoint's: far above the soft RLIMIT_NOFILE of
1,024 most distributions start a process with. `raise_open_files` lifts the soft limit to
`want` (never above the hard limit, which only root or the container runtime can raise;
a limit already higher is kept). Elsewhere (no `resource` module) nothing happens.
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)

OPEN_FILES = 65536
"""The soft limit wanted: ~10,000 kept connections with room for bursts of new ones."""


def raise_open_files(want: int = OPEN_FILES) -> tuple[int, int] | None:
    """Raise the soft RLIMIT_NOFILE to `want` (at most the hard limit). Returns (before,
    after), or None where the platform has no such limit."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not POSIX
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError) as exc:
            log.warning("could not raise the open-files limit from %d to %d: %s", soft, target, exc)
            return soft, soft
        if target < want:
            log.warning(
                "open-files limit raised to %d only (the hard limit); a fleet of "
                "thousands of kept connections needs about %d",
                target,
                want,
            )
        return soft, target
    return soft, soft
