"""One check's outcome (✓ pass / ! warn / ✗ fail) and the exit code of a whole run (pure).

A `CheckResult` is one line for the user: which check, what was found, and -- when it
did not pass -- the fix. Exit code: 0 when everything passed or only warned, 1 when a
check failed, 2 when the checks could not run (the API server could not be reached).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum

EXIT_OK, EXIT_FAILED, EXIT_COULD_NOT_RUN = 0, 1, 2


class Status(StrEnum):
    PASS = "pass"
    WARN = "warn"
    FAIL = "fail"

    @property
    def symbol(self) -> str:
        return {"pass": "✓", "warn": "!", "fail": "✗"}[self.value]


def _flat(text: str) -> str:
    return " ".join(text.split())


@dataclass(frozen=True, slots=True)
class CheckResult:
    """One line of `nodewarden check`: the check's name, status, finding and fix."""

    check: str
    status: Status
    message: str
    fix: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "message", _flat(self.message))
        object.__setattr__(self, "fix", _flat(self.fix))

    def line(self, width: int = 11) -> str:
        text = f"{self.status.symbol} {self.check:<{width}} {self.message}"
        return f"{text} -> fix: {self.fix}" if self.fix else text

    def as_dict(self) -> dict[str, str]:
        return {
            "check": self.check,
            "status": self.status.value,
            "message": self.message,
            "fix": self.fix,
        }


def passed(check: str, message: str) -> CheckResult:
    return CheckResult(check, Status.PASS, message)


def warned(check: str, message: str, fix: str = "") -> CheckResult:
    return CheckResult(check, Status.WARN, message, fix)


def failed(check: str, message: str, fix: str = "") -> CheckResult:
    return CheckResult(check, Status.FAIL, message, fix)


@dataclass(frozen=True, slots=True)
class Report:
    """Every line of one run, in order, and whether the cluster checks could run at all."""

    results: tuple[CheckResult, ...]
    could_not_run: bool = False

    @property
    def exit_code(self) -> int:
        if self.could_not_run:
            return EXIT_COULD_NOT_RUN
        if any(r.status is Status.FAIL for r in self.results):
            return EXIT_FAILED
        return EXIT_OK

    @property
    def failures(self) -> list[CheckResult]:
        return [r for r in self.results if r.status is Status.FAIL]

    def counts(self) -> dict[Status, int]:
        return {s: sum(1 for r in self.results if r.status is s) for s in Status}


def summary(report: Report) -> str:
    """The closing line: how many passed, warned and failed; the first failure named."""
    counts = report.counts()
    text = (
        f"{counts[Status.PASS]} passed, {counts[Status.WARN]} warnings, "
        f"{counts[Status.FAIL]} failed"
    )
    first = report.failures[0] if report.failures else None
    if report.could_not_run:
        why = f": {first.message}" if first else ""
        return f"could not run the cluster checks{why} ({text})"
    return f"{text}; first: {first.check}: {first.message}" if first else text


def names(items: Iterable[str], limit: int = 6) -> str:
    """'a, b, c' -- at most `limit` items, then '(+N more)'."""
    listed = list(items)
    head = ", ".join(listed[:limit])
    return f"{head} (+{len(listed) - limit} more)" if len(listed) > limit else head


def plural(count: int, word: str, many: str | None = None) -> str:
    return f"{count} {word if count == 1 else (many or word + 's')}"


def skipped(checks: Sequence[str], why: str, fix: str = "") -> CheckResult:
    """One '!' line for checks that could not be made."""
    return warned(", ".join(checks), f"not checked: {why}", fix)
