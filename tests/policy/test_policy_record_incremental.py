"""Incremental Safety Records: a full record only when the decision changed.

`record_for_evaluation(..., previous=)` and `step(..., previous=)` return the node's
previous record with `evaluatedAt` set when the decision, its reasons, the states, the
transition and its request and every gate's verdict are unchanged; otherwise a full
record. Over random walks through the state machine (the walks of
test_policy_record_construction): whenever a record is reused, a full rebuild reaches the
same decision on the same verdicts, and where the evidence itself is unchanged the
rebuild differs from the reused record only in what the evaluation time moves (decidedAt,
ages, measured durations, recheck times); whenever the decision or any verdict changed,
the record is exactly the full one.
"""

from __future__ import annotations

import random
from datetime import datetime, timedelta
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from policy_builders import (
    NOW,
    block_lock,
    idle_facts,
    off_facts,
    off_state,
    on_state,
    policy,
    work,
)
from test_policy_record_construction import POLICIES, _event, _refresh, assert_complete

from nodewarden.policy.base import trusted
from nodewarden.policy.events import Evaluate, NewDemand
from nodewarden.policy.facts import DemandReading, InhibitorReading, NodeFacts
from nodewarden.policy.gates import evaluate_shutdown, evaluate_wake
from nodewarden.policy.machine import step
from nodewarden.policy.reasons import Decision
from nodewarden.policy.record import SafetyRecord
from nodewarden.policy.record_build import record_for_evaluation
from nodewarden.policy.state import NodePowerState
from nodewarden.policy.view import PolicyView

_MOVES_WITH_TIME = {"decidedAt", "evaluatedAt", "recheckAt"}


def _timeless(record: SafetyRecord) -> dict[str, Any]:
    """The record's JSON without what only the evaluation time moves."""
    data = {k: v for k, v in record.to_status().items() if k not in _MOVES_WITH_TIME}
    data["telemetry"] = {k: v for k, v in data["telemetry"].items() if k != "oldestAgeSeconds"}
    data["timing"] = [{k: v for k, v in t.items() if k != "measured"} for t in data["timing"]]
    gates = []
    for gate in data.get("gates", []):
        gate = {k: v for k, v in gate.items() if k != "recheck"}
        gate["evidence"] = [
            {k: v for k, v in e.items() if not (k == "value" and e["name"].endswith("Seconds"))}
            for e in gate["evidence"]
        ]
        gates.append(gate)
    data["gates"] = gates
    return data


def _but_time(record: SafetyRecord) -> dict[str, Any]:
    """Every field but `evaluated_at` (records are built by `trusted`: no model_copy)."""
    return {k: v for k, v in record.__dict__.items() if k != "evaluated_at"}


def _verdicts(record: SafetyRecord) -> tuple[Any, ...]:
    return (
        record.decision,
        record.reasons,
        record.state_before,
        record.state_after,
        tuple((g.gate, g.verdict) for g in record.gates),
        record.telemetry.stale,
        record.telemetry.missing,
    )


def _check_evaluation_pair(
    state: NodePowerState, facts: NodeFacts, now: datetime, later: datetime, pol: PolicyView
) -> tuple[int, int]:
    """Evaluate at `now` (full), again at `later` on the same evidence with the first
    record as `previous`; returns (reused, full) counts."""
    reused = full = 0
    for evaluate in (evaluate_shutdown, evaluate_wake):
        first = record_for_evaluation(evaluate(facts, now, pol, state), facts, now, pol, state)
        assert first.evaluated_at is None
        ev = evaluate(facts, later, pol, state)
        incremental = record_for_evaluation(ev, facts, later, pol, state, previous=first)
        rebuilt = record_for_evaluation(ev, facts, later, pol, state)
        if _verdicts(rebuilt) == _verdicts(first):
            # same decision, same verdicts, same evidence: the previous record + the time
            assert incremental.evaluated_at == later
            assert _but_time(incremental) == _but_time(first)
            assert _timeless(incremental) == _timeless(rebuilt)
            assert incremental.to_status()["evaluatedAt"] == later.isoformat().replace(
                "+00:00", "Z"
            )
            assert_complete(incremental)
            reused += 1
        else:
            assert incremental == rebuilt  # a full record, as documented
            full += 1
    return reused, full


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(min_value=0, max_value=2**32 - 1), start=st.sampled_from(["on", "off"]))
def test_incremental_records_equal_full_rebuilds_on_random_walks(seed: int, start: str) -> None:
    rng = random.Random(seed)
    pol = rng.choice(POLICIES)
    state, facts = (on_state(), idle_facts()) if start == "on" else (off_state(), off_facts())
    previous: SafetyRecord | None = None
    now = NOW
    for _ in range(15):
        now += timedelta(seconds=rng.choice([1, 5, 61, 301]))
        facts = _refresh(rng, facts, now)
        later = now + timedelta(seconds=rng.choice([1, 10, 45, 400]))
        _check_evaluation_pair(state, facts, now, later, pol)
        event = _event(rng, state, now)
        result = step(state, facts, event, now, pol, previous=previous)
        rebuilt = step(state, facts, event, now, pol)
        assert result.next == rebuilt.next and result.actions == rebuilt.actions
        assert result.record is not None and rebuilt.record is not None
        if result.record_reused:
            assert previous is not None
            assert _verdicts(rebuilt.record) == _verdicts(previous)
            assert _but_time(result.record) == _but_time(previous)
            assert result.record.evaluated_at == now
        else:
            assert result.record == rebuilt.record
            assert result.record.evaluated_at is None
        previous = result.record if not result.record_reused else previous
        state, facts = result.next, result.facts


def _idle_a_minute() -> NodeFacts:
    """An idle node before its idle threshold: DEFER, on a full gate evaluation."""
    return idle_facts().model_copy(update={"work": work(active=0, idle_for=60, when=NOW)})


def test_an_unchanged_waiting_node_reuses_its_record_and_a_change_rebuilds_it() -> None:
    pol = policy()
    state, facts = on_state(), _idle_a_minute()
    first = step(state, facts, Evaluate(), NOW, pol).record
    assert first is not None
    later = NOW + timedelta(seconds=30)
    again = step(state, facts, Evaluate(), later, pol, previous=first)
    assert again.record_reused and again.record is not None
    assert again.record.evaluated_at == later and again.record.decided_at == NOW
    assert again.record.gates and again.record.decision is Decision.DEFER

    # demand arrives: the decision changes -> a full record
    demand = DemandReading(source="queue", observed_at=later, queued=2)
    changed = step(state, facts, NewDemand(reading=demand), later, pol, previous=first)
    assert not changed.record_reused and changed.record is not None
    assert changed.record == step(state, facts, NewDemand(reading=demand), later, pol).record

    # an inhibitor appears: the inhibitor gate's verdict changes -> a full record
    locked = facts.model_copy(
        update={
            "inhibitors": InhibitorReading(
                source="logind", observed_at=later, inhibitors=(block_lock(),)
            )
        }
    )
    blocked = step(state, locked, Evaluate(), later, pol, previous=first)
    assert not blocked.record_reused and blocked.record is not None
    assert blocked.record.evaluated_at is None and blocked.record.decided_at == later
    assert blocked.record.decision is not first.decision or blocked.record.gates != first.gates


def test_a_policy_change_or_another_node_never_reuses_a_record() -> None:
    pol = policy()
    state, facts = on_state(), _idle_a_minute()
    first = step(state, facts, Evaluate(), NOW, pol).record
    assert first is not None and first.decision is Decision.DEFER
    assert step(state, facts, Evaluate(), NOW, pol, previous=first).record_reused
    later = NOW + timedelta(seconds=30)
    other = policy(idleThreshold="17m")
    assert not step(state, facts, Evaluate(), later, other, previous=first).record_reused
    renamed = trusted(SafetyRecord, {**first.__dict__, "node": "someone-else"})
    assert not step(state, facts, Evaluate(), later, pol, previous=renamed).record_reused
