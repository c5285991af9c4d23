"""Decision precedence: which decision the failing gates' reason codes make, and in what
order the codes are reported.

    decide(gates, success, rank, applied) -> (Decision, reason codes)
    latest_recheck(gates) -> when to look again

Each code's strength is its class's position (`reasons.decision_class`): NONE (the node
is needed / nothing to do) > BLOCK (needs a person) > DEFER (wait for time or fresh
evidence) > DRAIN (only our own drain steps remain). `RANK` is the ordinary table;
`FORCED_SHUTDOWN_RANK` the one for manual or pinned shutdowns, which wait for queued
demand (DEFER) instead of dropping it.
"""

from __future__ import annotations

from datetime import datetime

from nodewarden.policy.evaluation import GateResult, Verdict
from nodewarden.policy.reasons import Decision, DecisionClass, R, ReasonCode, decision_class

_FAIL = Verdict.FAIL
_DEFER = Decision.DEFER


_BY_STRENGTH: tuple[tuple[DecisionClass, Decision], ...] = (
    (DecisionClass.NONE, Decision.NONE),
    (DecisionClass.BLOCK, Decision.BLOCK),
    (DecisionClass.DEFER, Decision.DEFER),
    (DecisionClass.DRAIN, Decision.DRAIN),
)
_NOT_DECISIVE = len(_BY_STRENGTH)
"""Rank of codes whose class decides nothing (PROGRESS)."""


def _ranks(classes: dict[ReasonCode, DecisionClass]) -> dict[ReasonCode, int]:
    """Each code's strength: its class's position in _BY_STRENGTH (0 = strongest)."""
    position = {cls: i for i, (cls, _) in enumerate(_BY_STRENGTH)}
    return {code: position.get(cls, _NOT_DECISIVE) for code, cls in classes.items()}


_CLASS_OF: dict[ReasonCode, DecisionClass] = {code: decision_class(code) for code in ReasonCode}
RANK: dict[ReasonCode, int] = _ranks(_CLASS_OF)
FORCED_SHUTDOWN_RANK: dict[ReasonCode, int] = _ranks(
    {**_CLASS_OF, R.DEMAND_PRESENT: DecisionClass.DEFER}
)
"""A manual or pinned shutdown waits for queued demand (DEFER) instead of dropping it."""
_GATES_PASSED = (R.GATES_PASSED,)
_GATES_PASSED_WITH_OVERRIDE = (R.GATES_PASSED, R.OVERRIDE_APPLIED)


def decide(
    gates: tuple[GateResult, ...],
    success: Decision,
    rank: dict[ReasonCode, int],
    applied: tuple[str, ...],
) -> tuple[Decision, tuple[ReasonCode, ...]]:
    """Pick the decision from the failing gates' codes (strongest class first, `rank`
    says each code's class strength) and order the codes with the decisive class first,
    the others after, each in gate order."""
    # One pass collects the failing codes (first occurrence, gate order), each code's
    # rank and the strongest rank.
    failing: list[ReasonCode] = []
    ranks: list[int] = []
    strongest = _NOT_DECISIVE
    for g in gates:
        if g.verdict is _FAIL:
            for code in g.reasons:
                if code not in failing:
                    failing.append(code)
                    code_rank = rank[code]
                    ranks.append(code_rank)
                    if code_rank < strongest:
                        strongest = code_rank
    if not failing:
        return success, _GATES_PASSED_WITH_OVERRIDE if applied else _GATES_PASSED
    if strongest == _NOT_DECISIVE:
        return _DEFER, tuple(failing)
    if len(failing) == 1:
        return _BY_STRENGTH[strongest][1], (failing[0],)
    first: list[ReasonCode] = []
    rest: list[ReasonCode] = []
    for code, code_rank in zip(failing, ranks, strict=True):
        (first if code_rank == strongest else rest).append(code)
    return _BY_STRENGTH[strongest][1], (*first, *rest)


def latest_recheck(gates: tuple[GateResult, ...]) -> datetime | None:
    """The latest recheck time any gate asks for (None if none does)."""
    latest: datetime | None = None
    for g in gates:
        at = g.recheck
        if at is not None and (latest is None or at > latest):
            latest = at
    return latest
