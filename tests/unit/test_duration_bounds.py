"""Durations are bounded in the CRD (digits in the pattern, a CEL maximum) and in the model.

The hostile policies of the issue: `cooldown: "99999999999h"` passed the API server and
raised OverflowError in `timedelta` (not a ValueError, so pydantic let it escape and the
operator exited at its next start); `idleThreshold: "100000000h"` parsed and overflowed a
date later inside a power round. Both are now validation errors, and nothing the pattern
admits can overflow Go's time.Duration (the API server's CEL `duration()`) or Python's
timedelta.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from nodewarden.api.powerpolicy import PowerPolicySpec
from nodewarden.fleet.policies import PolicyBook
from nodewarden.units import DURATION_PATTERN, MAX_DURATION, parse_duration

GO_MAX_DURATION = timedelta(microseconds=(2**63 - 1) // 1000)
"""Go's time.Duration holds at most 2^63-1 ns (about 292 years)."""


def _policy(**spec: object) -> dict[str, object]:
    return {"metadata": {"name": "default", "namespace": "ns", "generation": 1}, "spec": spec}


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("cooldown", "99999999999h"),
        ("idleThreshold", "100000000h"),
        ("minOff", "8761h"),
        ("cooldown", "1h" * 7),
        ("bootGrace", "9" * 64 + "s"),
    ],
)
def test_hostile_durations_are_validation_errors(field: str, value: str) -> None:
    with pytest.raises(ValidationError) as raised:
        PowerPolicySpec.model_validate({field: value})
    assert field in str(raised.value)


def test_the_policy_book_marks_a_hostile_policy_invalid_and_keeps_going() -> None:
    book = PolicyBook(namespace="ns", default_name="default")
    book.observe(_policy(cooldown="99999999999h"))
    book.observe({**_policy(idleThreshold="10m"), "metadata": {"name": "other"}})
    assert book.policies["default"].view.problems
    assert "cooldown" in book.policies["default"].view.problems[0]
    assert not book.policies["other"].view.problems
    assert book.default_problem is not None and "invalid" in book.default_problem


def test_the_maximum_is_accepted_and_the_cel_rule_states_it() -> None:
    spec = PowerPolicySpec.model_validate({"cooldown": MAX_DURATION, "maxOn": "8760h"})
    assert spec.duration("cooldown") == timedelta(hours=8760)
    schema = PowerPolicySpec.model_json_schema(by_alias=True)["properties"]["cooldown"]
    rule = schema["x-kubernetes-validations"][0]["rule"]
    assert rule.endswith("|| (duration(self) <= duration('8760h'))")
    assert rule.startswith("!self.matches(r'^")  # converts only what the pattern admits


def test_the_largest_duration_the_pattern_admits_fits_go_and_python() -> None:
    """Six groups of the longest digits each unit allows."""
    groups = {"h": 5, "m": 7, "s": 9, "ms": 12, "us": 15, "ns": 18}
    worst = max(
        parse_duration("9" * digits + ".999999999" + unit) for unit, digits in groups.items()
    )
    assert worst * 6 < GO_MAX_DURATION
    assert datetime(2026, 1, 1, tzinfo=UTC) + worst * 6 < datetime.max.replace(tzinfo=UTC)


@settings(max_examples=120, deadline=None)
@given(st.from_regex(DURATION_PATTERN, fullmatch=True))
def test_whatever_the_pattern_admits_parses_without_overflow(text: str) -> None:
    value = parse_duration(text)
    assert timedelta(0) <= value < GO_MAX_DURATION / 1.5


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="0123456789.hmsuµn", max_size=80))
def test_parse_duration_raises_only_value_errors(text: str) -> None:
    try:
        parse_duration(text)
    except ValueError:
        return
    assert re.fullmatch(DURATION_PATTERN, text)
