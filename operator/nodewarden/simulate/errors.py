"""Input errors of the simulator: one message naming the file, line or field, and the fix.

Every loader of the simulator (traces, fleet files, policy files) raises `InputError`;
the CLI prints its message on one line and exits 2. `field_errors` turns a pydantic
`ValidationError` into that message ("cloud.boot.lognormal.sigma: Input should be ...").
"""

from __future__ import annotations

import re

from pydantic import ValidationError


class InputError(ValueError):
    """A trace, fleet or policy file is invalid; the message names where and why."""


def field_errors(error: ValidationError, prefix: str = "") -> str:
    """The errors of `error`, each as 'path.to.field: message', joined with '; '."""
    parts: list[str] = []
    for item in error.errors():
        loc = ".".join(str(p) for p in item["loc"] if not str(p).startswith("function-"))
        loc = re.sub(r"\.(\d+)(?=\.|$)", r"[\1]", loc)
        where = f"{prefix}{loc}" if loc else (prefix.rstrip(".") or "document")
        message = str(item["msg"]).removeprefix("Value error, ")
        parts.append(f"{where}: {message}")
    return "; ".join(parts)
