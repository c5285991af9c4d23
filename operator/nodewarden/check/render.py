"""Printing a check report: aligned lines (table) or one JSON document (pure)."""

from __future__ import annotations

import json

from nodewarden import __version__
from nodewarden.check.result import Report, summary


def render_table(report: Report) -> str:
    width = max((len(r.check) for r in report.results), default=0)
    width = min(max(width, 6), 14)
    lines = [r.line(width) for r in report.results]
    return "\n".join([*lines, summary(report)]) + "\n"


def render_json(report: Report) -> str:
    doc = {
        "nodewardenVersion": __version__,
        "exitCode": report.exit_code,
        "summary": summary(report),
        "checks": [r.as_dict() for r in report.results],
    }
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"
