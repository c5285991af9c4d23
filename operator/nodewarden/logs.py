"""Logging set-up: structured JSON (or text) lines on stderr, and secret redaction.

Secrets are never passed to loggers, statuses or Events on purpose; as a second line of
defence every secret value the operator loads is registered with `register_secret`, the
log formatters replace any occurrence in a formatted record with `***`, and the
Kubernetes adapter passes every status patch and Event through `redact_tree`.

Values shorter than `MIN_REDACTED` characters are not registered: masking a short value
("admin", a 6-character PIN) would garble ordinary text. They are kept out of every
message structurally instead -- a message about a Secret names the Secret and the key,
never anything derived from its content (docs/security.md).
"""

from __future__ import annotations

import json
import logging
import re
import sys
import threading
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

MIN_REDACTED = 8
"""Shortest value that is masked (see the module docstring)."""
_LINE_MIN = 16
"""Lines of a multi-line secret (a key) at least this long are masked on their own too."""

_lock = threading.Lock()
_secrets: set[str] = set()
_pattern: re.Pattern[str] | None = None

_STANDARD_ATTRS = frozenset(
    logging.LogRecord("x", 0, "x", 0, "x", None, None).__dict__.keys()
    | {"message", "asctime", "taskName", "settings", "k8s_skip"}  # kopf's bulky extras
)


def register_secret(value: str | bytes | None) -> None:
    """Remember a secret so that it is masked if it ever reaches a log line."""
    if not value:
        return
    text = value.decode(errors="ignore") if isinstance(value, bytes) else value
    text = text.strip()
    if len(text) < MIN_REDACTED:
        return
    global _pattern
    with _lock:
        before = len(_secrets)
        _secrets.add(text)
        # multi-line secrets (keys): also mask each long line on its own
        for line in text.splitlines():
            if len(line.strip()) >= _LINE_MIN:
                _secrets.add(line.strip())
        if len(_secrets) != before:
            _pattern = None


def _compiled() -> re.Pattern[str] | None:
    global _pattern
    with _lock:
        if _pattern is None and _secrets:
            # longest first: a key's whole text before its single lines
            alternatives = sorted(_secrets, key=len, reverse=True)
            _pattern = re.compile("|".join(re.escape(s) for s in alternatives))
        return _pattern


def redact(text: str) -> str:
    """`text` with every registered secret replaced by ``***``."""
    pattern = _compiled()
    if pattern is None:
        return text
    return pattern.sub("***", text)


def redact_tree(value: Any) -> Any:
    """A copy of a JSON-like value (a status patch, an Event field) with every registered
    secret masked in every string; the value itself when nothing is registered."""
    if _compiled() is None:
        return value
    return _redact_tree(value)


def _redact_tree(value: Any) -> Any:
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, Mapping):
        return {key: _redact_tree(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_redact_tree(item) for item in value]
    return value


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, and any `extra=` fields."""

    def format(self, record: logging.LogRecord) -> str:
        payload: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, tz=UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key in _STANDARD_ATTRS or key.startswith("_"):
                continue
            try:
                json.dumps(value)
                payload[key] = value
            except (TypeError, ValueError):
                payload[key] = repr(value)
        if record.exc_info:
            payload["exception"] = self.formatException(record.exc_info)
        return redact(json.dumps(payload, default=str))


class RedactingTextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))


def setup_logging(fmt: str = "json", level: str = "INFO", stream: Any = None) -> None:
    """Configure the root logger once for the operator process."""
    handler = logging.StreamHandler(stream or sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(
            RedactingTextFormatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s")
        )
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    # Third-party chatter that would otherwise drown the operator's own lines.
    for noisy in ("asyncssh", "aiohttp.access", "kubernetes_asyncio"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
    # kopf reports every successful handler and timer run at INFO; keep its warnings.
    if root.level > logging.DEBUG:
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
