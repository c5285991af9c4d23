#!/usr/bin/env python3
"""The machine's calibration figure, and test deadlines scaled by it.

The figure is the CPU time of a fixed pure-Python loop (10 million `s += i*i` at module level): 2.34 s
on the slowest machine this project's CI has been seen on (late 2026), about half that on
a developer laptop. Every benchmark prints it beside its own figures so that results from
different machines compare through it, and CI prints it first.

Test deadlines are written for the reference machine; `scaled(seconds)` stretches them
on a slower one (never shrinks them on a faster one). Tests wait on conditions with such
deadlines, never on sleeps.

The figure is measured once per boot of the machine and cached in
`~/.cache/nodewarden/calibration-<boot id>.json`; `NODEWARDEN_CALIBRATION=<seconds>`
overrides it (subprocesses inherit the measured value through that variable).
Standard library only: `.ci/run` calls this file before anything is installed.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

REFERENCE_SECONDS = 2.34
"""The calibration figure of the machine the suite's deadlines were sized on."""

ENV = "NODEWARDEN_CALIBRATION"
LOOP_ITERATIONS = 10_000_000


LOOP = f"s = 0\nfor i in range({LOOP_ITERATIONS}):\n    s += i * i\n"
"""The loop as a script runs it: at module level, so `s` and `i` are global names (the way
the reference figure was taken; the same loop inside a function is about 3x faster)."""


def measure() -> float:
    """CPU seconds of the fixed loop (process time, so other processes' load counts little)."""
    code = compile(LOOP, "<calibration>", "exec")
    start = time.process_time()
    exec(code, {})  # noqa: S102 - a fixed, local loop
    return time.process_time() - start


def _cache_file() -> Path:
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = "unknown"
    return Path.home() / ".cache" / "nodewarden" / f"calibration-{boot}.json"


def figure() -> float:
    """The calibration figure in seconds: from the environment, the boot's cache, or measured."""
    given = os.environ.get(ENV)
    if given:
        try:
            value = float(given)
        except ValueError:
            raise SystemExit(f"{ENV}={given!r} is not a number of seconds") from None
        if value > 0:
            return value
    cache = _cache_file()
    try:
        value = float(json.loads(cache.read_text())["seconds"])
    except (OSError, ValueError, KeyError, TypeError):
        value = measure()
        try:
            cache.parent.mkdir(parents=True, exist_ok=True)
            cache.write_text(json.dumps({"seconds": round(value, 3), "loop": LOOP_ITERATIONS}))
        except OSError:
            pass
    os.environ[ENV] = f"{value:.3f}"
    return value


def factor() -> float:
    """How much slower this machine is than the reference one (at least 1)."""
    return max(1.0, figure() / REFERENCE_SECONDS)


def scaled(seconds: float) -> float:
    """A test deadline written for the reference machine, stretched for this one."""
    return seconds * factor()


def load() -> str:
    try:
        one, five, fifteen = os.getloadavg()
    except OSError:
        return "load n/a"
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f} on {os.cpu_count()} cores"


def summary() -> str:
    """One line for the top of a CI log or a benchmark's output."""
    return (
        f"calibration: {figure():.2f} s CPU for {LOOP_ITERATIONS:,} `s += i*i` "
        f"(reference {REFERENCE_SECONDS} s; test deadlines x{factor():.2f}); {load()}"
    )


if __name__ == "__main__":
    print(summary(), flush=True)
