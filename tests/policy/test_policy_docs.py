"""The documentation of the power core matches the code (reason codes, states, record, scenarios)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from nodewarden.policy.events import EVENT_ADAPTER
from nodewarden.policy.reasons import REASON_DOCS, ReasonCode
from nodewarden.policy.record import SafetyRecord
from nodewarden.policy.scenario import Scenario
from nodewarden.policy.state import PowerState

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_every_reason_code_is_documented_in_code() -> None:
    assert set(REASON_DOCS) == set(ReasonCode)
    for code, doc in REASON_DOCS.items():
        assert doc.meaning.strip() and doc.operator_action.strip(), code


def test_reason_codes_page_lists_every_code_with_its_class_and_nothing_else() -> None:
    text = (DOCS / "reason-codes.md").read_text()
    rows = dict(re.findall(r"^\| `([A-Z_]+)` \| ([a-z]+) \|", text, flags=re.M))
    assert set(rows) == {c.value for c in ReasonCode}
    for code in ReasonCode:
        assert rows[code.value] == REASON_DOCS[code].decision_class.value, code


def test_state_machine_page_describes_every_state() -> None:
    text = (DOCS / "state-machine.md").read_text()
    states_table = text.split("## States", 1)[1].split("##", 1)[0]
    for state in PowerState:
        assert f"| `{state.value}` |" in states_table, state


def test_safety_record_page_documents_every_field() -> None:
    text = (DOCS / "safety-record.md").read_text()
    fields_table = text.split("## Fields", 1)[1].split("## Example", 1)[0]
    for name, info in SafetyRecord.model_fields.items():
        alias = info.alias or name
        assert f"`{alias}`" in fields_table, alias


def test_scenarios_page_documents_the_format() -> None:
    text = (DOCS / "scenarios.md").read_text()
    for name, info in Scenario.model_fields.items():
        assert f"{info.alias or name}:" in text or f"`{info.alias or name}`" in text, name
    schema = EVENT_ADAPTER.json_schema()
    event_types = {
        d["properties"]["type"]["const"]
        for d in schema["$defs"].values()
        if "type" in d.get("properties", {})
    }
    assert len(event_types) == 12
    for event_type in event_types:
        assert f"`{event_type}`" in text, event_type


@pytest.mark.parametrize(
    "page", ["reason-codes.md", "state-machine.md", "safety-record.md", "scenarios.md"]
)
def test_codes_named_in_docs_exist(page: str) -> None:
    text = (DOCS / page).read_text()
    known = {c.value for c in ReasonCode}
    named = set(re.findall(r"`([A-Z]+(?:_[A-Z]+)+)`", text))
    states = {s.value for s in PowerState}
    unknown = named - known - states
    assert not unknown, unknown
