"""The live answer to "why is this node (not) off?": what the power controller holds for
one node right now -- every fact with its source and age, the state and transition, the
decision the core makes on those facts now (with its gate table), the last Safety Record
and the recent decisions. Pure: built from the node's runtime, its policy and the time.

Served by the status API (`GET /api/v1/explain/workernode/NAME`) and printed by
`nodewarden explain workernode NAME`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from nodewarden.policy.eligibility import eligibility, to_status
from nodewarden.policy.events import Evaluate
from nodewarden.policy.machine import step
from nodewarden.policy.view import PolicyView
from nodewarden.power.nodestatus import api_state_of
from nodewarden.power.runtime import NodeRuntime, iso

FACT_NAMES = (
    "power",
    "ready",
    "work",
    "inhibitors",
    "uptime",
    "capability",
    "demand",
    "desired",
    "fleet",
    "vm",
    "intent",
)


def _fact(reading: Any, now: datetime) -> dict[str, Any]:
    data: dict[str, Any] = reading.model_dump(mode="json", by_alias=True, exclude_none=True)
    at = getattr(reading, "observed_at", None)
    if at is not None:
        data["ageSeconds"] = round((now - at).total_seconds(), 3)
    return data


def explain_node(rt: NodeRuntime, view: PolicyView, now: datetime) -> dict[str, Any]:
    """The explain document of one node (JSON-ready)."""
    facts = {
        name: _fact(reading, now)
        for name in FACT_NAMES
        if (reading := getattr(rt.facts, name, None)) is not None
    }
    doc: dict[str, Any] = {
        "node": rt.name,
        "nodeType": rt.node_type,
        "now": iso(now),
        "state": api_state_of(rt),
        "powerState": rt.state.model_dump(mode="json", by_alias=True, exclude_none=True),
        "policy": {
            "name": view.version.name,
            "generation": view.version.generation,
            "contentHash": view.version.content_hash,
            "valid": view.valid,
            "problems": list(view.problems),
            "shadow": view.shadow,
        },
        "facts": facts,
        "history": list(rt.history),
        "lastRecord": rt.record.to_status() if rt.record is not None else None,
    }
    if rt.spec is None:
        doc["evaluation"] = None
        doc["note"] = "the WorkerNode spec does not parse: no decision is made (see Valid)"
        return doc
    result = step(rt.state, rt.facts, Evaluate(), now, view)
    record = result.record
    assert record is not None
    data = record.to_status()
    doc["evaluation"] = {
        "decision": result.decision.value,
        "reasons": [r.value for r in result.reasons],
        "stateAfter": result.next.state.value,
        "gates": data.get("gates", []),
        "timing": data.get("timing", []),
        "telemetry": data.get("telemetry"),
        "recheckAt": data.get("recheckAt"),
        "summary": record.summary(),
    }
    # the same rule code as status.eligibility (`policy.eligibility`)
    doc["eligibility"] = to_status(eligibility(result, view))
    return doc
