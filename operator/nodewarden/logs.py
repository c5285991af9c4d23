"""Logging set-up: structured JSON (or text) lines on stderr, with secret redaction.

Secrets are never passed to loggers on purpose; as a second line of defence every
secret value the operator loads is registered with `register_secret`, and a filter on
the root handler replaces any occurrence in a formatted record with `***`.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
from datetime import UTC, datetime
from typing import Any

_lock = threading.Lock()
_secrets: set[str] = set()

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
    if len(text) < 4:  # too short to mask without destroying ordinary text
        return
    with _lock:
        _secrets.add(text)
        # multi-line secrets (keys): also mask each long line on its own
        for line in text.splitlines():
            if len(line.strip()) >= 16:
                _secrets.add(line.strip())


def redact(text: str) -> str:
    with _lock:
        secrets = sorted(_secrets, key=len, reverse=True)
    for secret in secrets:
        if secret in text:
            text = text.replace(secret, "***")
    return text


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
