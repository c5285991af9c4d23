"""`rules.effects`: what each action of a step means, as the typed effects both shells
carry out -- each action's effect; the RefreshFacts names mapped once and de-duplicated;
the recheck clamp (never sooner than now + MIN_RECHECK) and its hold_write; one Recheck
(the earliest) however many are asked; ReEvaluate only for a DEFER without a recheck;
the actions' order kept; the module pure (only `nodewarden.policy` and the stdlib)."""

from __future__ import annotations

import ast
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import get_args

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nodewarden.policy.actions import (
    Action,
    CancelPendingShutdown,
    CloseAdmission,
    CloseTransition,
    OpenAdmission,
    OpenTransition,
    PollObservedPower,
    RefreshFacts,
    RequestPower,
    RereadDemand,
    RunReadyProbe,
    ScheduleRecheck,
)
from nodewarden.policy.facts import FactName
from nodewarden.policy.reasons import Decision
from nodewarden.policy.state import TransitionKind
from nodewarden.rules import effects as effects_module
from nodewarden.rules.effects import (
    MIN_RECHECK,
    AllowAdmission,
    Effect,
    Observation,
    Observe,
    Recheck,
    ReEvaluate,
    SendPowerRequest,
    ShutdownCancelled,
    StopAdmission,
    TransitionClosed,
    TransitionOpened,
    effects,
)

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
TID = "shutdown-20260301-120000-abcdef12"
OPEN = OpenTransition(
    transition_id=TID,
    kind=TransitionKind.SHUTDOWN,
    origin="Policy",
    deadline=NOW + timedelta(minutes=5),
)
CLOSE = CloseTransition(transition_id=TID, kind=TransitionKind.WAKE, outcome="Aborted")
REQUEST = RequestPower(transition_id=TID, action="GracefulShutdown", attempt=1)

PROBED: tuple[FactName, ...] = ("work", "inhibitors", "uptime", "ready", "identity")
NOTHING: tuple[FactName, ...] = ("desired", "fleet", "power")
"""RefreshFacts names no observation brings (see the module docstring)."""


def one(action: Action, decision: Decision = Decision.DRAIN) -> Effect:
    (effect,) = effects((action,), NOW, decision)
    return effect


@pytest.mark.parametrize(
    ("action", "effect"),
    [
        (RereadDemand(transition_id=TID), Observe(what=Observation.DEMAND)),
        (PollObservedPower(), Observe(what=Observation.POWER)),
        (RunReadyProbe(), Observe(what=Observation.READY_PROBE)),
        *((RefreshFacts(facts=(n,)), Observe(what=Observation.PROBE)) for n in PROBED),
        (RefreshFacts(facts=("capability",)), Observe(what=Observation.CAPABILITY)),
        (RefreshFacts(facts=("vm",)), Observe(what=Observation.VM_LIST)),
        (RefreshFacts(facts=("demand",)), Observe(what=Observation.DEMAND)),
        (CloseAdmission(transition_id=TID), StopAdmission(transition_id=TID)),
        (OpenAdmission(), AllowAdmission(transition_id=None)),
        (REQUEST, SendPowerRequest(request=REQUEST)),
        (OPEN, TransitionOpened(transition=OPEN)),
        (CLOSE, TransitionClosed(transition=CLOSE)),
        (CancelPendingShutdown(transition_id=TID), ShutdownCancelled(transition_id=TID)),
        (
            ScheduleRecheck(at=NOW + timedelta(minutes=1)),
            Recheck(
                at=NOW + timedelta(minutes=1), asked=NOW + timedelta(minutes=1), hold_write=False
            ),
        ),
    ],
    ids=lambda v: type(v).__name__,
)
def test_each_action_has_its_effect(action: Action, effect: Effect) -> None:
    assert one(action) == effect


def test_the_transition_effects_name_kind_and_outcome() -> None:
    opened = one(OPEN)
    closed = one(CLOSE)
    assert isinstance(opened, TransitionOpened) and opened.kind is TransitionKind.SHUTDOWN
    assert isinstance(closed, TransitionClosed)
    assert (closed.kind, closed.outcome) == (TransitionKind.WAKE, "Aborted")


@pytest.mark.parametrize("name", NOTHING)
def test_a_reading_no_observation_brings_means_nothing(name: FactName) -> None:
    assert effects((RefreshFacts(facts=(name,)),), NOW, Decision.DRAIN) == ()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(get_args(FactName)), min_size=1, max_size=12))
def test_refresh_names_are_mapped_once_in_the_order_named(names: list[FactName]) -> None:
    got = effects((RefreshFacts(facts=tuple(names)),), NOW, Decision.DRAIN)
    expected: list[Observation] = []
    for name in names:
        what = effects_module.REFRESHED_BY.get(name)
        if what is not None and what not in expected:
            expected.append(what)
    assert got == tuple(Observe(what=w) for w in expected)


def test_an_observation_asked_twice_is_one_effect_where_it_was_first_asked() -> None:
    actions: tuple[Action, ...] = (
        RefreshFacts(facts=("work", "vm")),
        CloseAdmission(transition_id=TID),
        RereadDemand(transition_id=TID),
        RefreshFacts(facts=("inhibitors", "demand", "ready")),
        RunReadyProbe(),
        RereadDemand(transition_id=None),
    )
    assert effects(actions, NOW, Decision.DRAIN) == (
        Observe(what=Observation.PROBE),
        Observe(what=Observation.VM_LIST),
        StopAdmission(transition_id=TID),
        Observe(what=Observation.DEMAND),
        Observe(what=Observation.READY_PROBE),
    )


def test_other_effects_keep_every_action_in_order() -> None:
    second = CloseAdmission(transition_id="other")
    actions: tuple[Action, ...] = (OPEN, REQUEST, CloseAdmission(transition_id=TID), second)
    assert effects(actions, NOW, Decision.SHUTDOWN) == (
        TransitionOpened(transition=OPEN),
        SendPowerRequest(request=REQUEST),
        StopAdmission(transition_id=TID),
        StopAdmission(transition_id="other"),
    )


offsets = st.integers(min_value=-3_600_000_000, max_value=3_600_000_000).map(
    lambda us: timedelta(microseconds=us)
)


@settings(max_examples=300, deadline=None)
@given(offsets)
def test_a_recheck_is_never_sooner_than_min_recheck_and_holds_the_write_when_passed(
    offset: timedelta,
) -> None:
    asked = NOW + offset
    recheck = one(ScheduleRecheck(at=asked))
    assert isinstance(recheck, Recheck)
    assert recheck.asked == asked
    assert recheck.at == max(asked, NOW + MIN_RECHECK)
    assert recheck.at >= NOW + MIN_RECHECK
    assert recheck.hold_write is (asked <= NOW)


def test_the_clamp_at_its_edges() -> None:
    assert timedelta(seconds=0.25) == MIN_RECHECK
    for asked, at, hold in (
        (NOW - timedelta(hours=1), NOW + MIN_RECHECK, True),
        (NOW, NOW + MIN_RECHECK, True),
        (NOW + timedelta(microseconds=1), NOW + MIN_RECHECK, False),
        (NOW + MIN_RECHECK, NOW + MIN_RECHECK, False),
        (NOW + timedelta(seconds=1), NOW + timedelta(seconds=1), False),
    ):
        assert one(ScheduleRecheck(at=asked)) == Recheck(at=at, asked=asked, hold_write=hold)


@settings(max_examples=200, deadline=None)
@given(st.lists(offsets, min_size=2, max_size=5))
def test_several_rechecks_are_one_the_earliest_where_the_first_was(
    asked: list[timedelta],
) -> None:
    actions: tuple[Action, ...] = (
        RunReadyProbe(),
        *(ScheduleRecheck(at=NOW + a) for a in asked),
        PollObservedPower(),
    )
    got = effects(actions, NOW, Decision.DEFER)
    earliest = NOW + min(asked)
    assert got == (
        Observe(what=Observation.READY_PROBE),
        Recheck(at=max(earliest, NOW + MIN_RECHECK), asked=earliest, hold_write=earliest <= NOW),
        Observe(what=Observation.POWER),
    )


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(list(Decision)), st.booleans(), st.booleans())
def test_re_evaluate_only_for_a_defer_without_a_recheck(
    decision: Decision, recheck: bool, probe: bool
) -> None:
    actions: list[Action] = [RunReadyProbe()] if probe else []
    if recheck:
        actions.append(ScheduleRecheck(at=NOW + timedelta(seconds=30)))
    got = effects(actions, NOW, decision)
    reevaluations = [e for e in got if isinstance(e, ReEvaluate)]
    if decision is Decision.DEFER and not recheck:
        assert reevaluations == [ReEvaluate()]
        assert got[-1] == ReEvaluate()  # after everything else the step asked for
    else:
        assert reevaluations == []


def test_effects_are_frozen_values() -> None:
    effect = Observe(what=Observation.PROBE)
    with pytest.raises(AttributeError):
        effect.what = Observation.POWER  # type: ignore[misc]
    assert not hasattr(effect, "__dict__")  # slotted
    assert hash(effect) == hash(Observe(what=Observation.PROBE))


def test_the_module_imports_only_the_policy_and_the_stdlib() -> None:
    path = Path(effects_module.__file__)
    tree = ast.parse(path.read_text())
    imported: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module)
    outside = {
        m
        for m in imported
        if not m.startswith("nodewarden.policy.") and m.split(".")[0] not in sys.stdlib_module_names
    }
    assert outside == set()
    assert "asyncio" not in imported
