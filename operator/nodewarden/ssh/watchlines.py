"""The watch command's lines (``RUNNER --watch``): one JSON object per line, versioned.

Pure parsing and printing, no I/O: the stub worker prints with `state_line` and
`heartbeat_line`, the SSH stream (`nodewarden.ssh.stream`) reads with `parse_watch_line`.
The format is part of the node contract (`nodewarden.ssh.protocol`, "Watch"):

- ``{"v":1,"kind":"state","ready":true,"detail":"running","broken":false,"runners":[LINE, ...]}``
  the whole runner list and ready state, printed first and then on every change; each
  ``LINE`` is one ``RUNNER --list`` line (``<pid> <uuid> dispatcher=... uid=... fence=...``).
- ``{"v":1,"kind":"heartbeat"}`` every ``--heartbeat N`` seconds: nothing changed.

A line of another version or with malformed fields is an error (`OutputError`); a v1 line
of an unknown kind is skipped (None), so the contract can grow.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from nodewarden.ssh.facts import RunnerProcess
from nodewarden.ssh.parsing import OutputError, parse_runner_list

WATCH_VERSION = 1
HEARTBEAT_LINE = '{"v":1,"kind":"heartbeat"}'
"""The heartbeat exactly as the contract prints it (compared before any JSON decoding)."""


@dataclass(frozen=True, slots=True)
class WatchState:
    """A ``state`` line: the node's ready state and its whole runner list."""

    ready: bool
    detail: str
    broken: bool
    runners: tuple[RunnerProcess, ...]


@dataclass(frozen=True, slots=True)
class WatchHeartbeat:
    """A ``heartbeat`` line: the stream is alive and nothing changed."""


HEARTBEAT = WatchHeartbeat()


def parse_watch_line(line: str) -> WatchState | WatchHeartbeat | None:
    """One line of the watch command; None for a v1 kind this reader does not know."""
    text = line.strip()
    if text == HEARTBEAT_LINE:
        return HEARTBEAT
    try:
        data = json.loads(text)
    except ValueError:
        raise OutputError(f"watch line is not JSON: {text[:80]!r}") from None
    if not isinstance(data, dict) or data.get("v") != WATCH_VERSION:
        raise OutputError(f"watch line is not version {WATCH_VERSION}: {text[:80]!r}")
    kind = data.get("kind")
    if kind == "heartbeat":
        return HEARTBEAT
    if kind != "state":
        return None
    ready, detail, broken = data.get("ready"), data.get("detail", ""), data.get("broken", False)
    runners = data.get("runners")
    if not isinstance(ready, bool) or not isinstance(broken, bool) or not isinstance(detail, str):
        raise OutputError(f"watch state line has malformed fields: {text[:80]!r}")
    if not isinstance(runners, list) or not all(isinstance(r, str) for r in runners):
        raise OutputError(f"watch state line has no runner list: {text[:80]!r}")
    return WatchState(
        ready=ready,
        detail=detail[:200],
        broken=broken,
        runners=parse_runner_list("\n".join(runners)),
    )


def state_line(ready: bool, detail: str, broken: bool, runner_lines: Sequence[str]) -> str:
    """A ``state`` line (with its newline) as the watch command prints it."""
    body = {
        "v": WATCH_VERSION,
        "kind": "state",
        "ready": ready,
        "detail": detail,
        "broken": broken,
        "runners": list(runner_lines),
    }
    return json.dumps(body, separators=(",", ":")) + "\n"


def heartbeat_line() -> str:
    """A ``heartbeat`` line (with its newline)."""
    return HEARTBEAT_LINE + "\n"


def watch_command(runner_command: str, heartbeat: float) -> str:
    """``RUNNER --watch --heartbeat N`` (N in seconds, as short as it prints)."""
    return f"{runner_command} --watch --heartbeat {heartbeat:g}"
