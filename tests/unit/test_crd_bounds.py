"""Every string, list, map and number of every CRD carries a bound (issue: hostile users).

The walk reads the generated files in `crds/` and the chart's copy, so a field added to a
model without a bound fails here. A string is bounded by maxLength or an enum, a list by
maxItems, a map by maxProperties, a number by maximum. The only free-form
documents allowed are the status ones the operator alone writes (Safety Records, the
persisted power state, the energy meter and VM hours), each with a bound on its keys and
named below with the reason.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from localcluster import REPO

FREE_FORM_STATUS = {
    # written through the status subresource by the power controller only; their shape is
    # the Safety Record's (docs/safety-record.md) and the state machine's, checked by
    # pydantic before every write; the API server bounds the whole object (1.5 MiB)
    "nodewarden.io_powerintents.yaml": {"status.safetyRecord", "status.requestRecord"},
    "nodewarden.io_workernodes.yaml": {
        "status.powerControl",
        "status.powerState",
        "status.energy.meter",  # the energy meter (rules.energy.EnergyMeter), pydantic-checked
    },
    # the VM hours per instance type (rules.savings.VmHours), at most one per catalogue type
    "nodewarden.io_powerpolicies.yaml": {"status.energy.vms"},
}


def _schemas() -> Iterator[Any]:
    for directory in (REPO / "crds", REPO / "helm" / "nodewarden" / "crds"):
        for path in sorted(directory.glob("*.yaml")):
            crd = yaml.safe_load(path.read_text())
            root = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
            yield pytest.param(path.name, root, id=str(path.relative_to(REPO)))


def unbounded(schema: dict[str, Any], path: str) -> Iterator[str]:
    """Every node under `schema` without a bound, as 'path: what is missing'."""
    kind = schema.get("type")
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        if "maxProperties" not in schema:
            yield f"{path}: free-form object without maxProperties"
        else:
            yield f"{path}: free-form object"
        return
    if kind == "string" and "maxLength" not in schema and "enum" not in schema:
        yield f"{path}: string without maxLength"
    if kind in ("integer", "number") and "enum" not in schema and "maximum" not in schema:
        yield f"{path}: number without maximum"
    if kind == "integer" and abs(schema.get("maximum", 0)) > 2**53:
        # the API server reads a schema's bounds as float64: larger is not an integer there
        # and every write of the field is refused (422)
        yield f"{path}: integer maximum above 2^53"
    if kind == "array":
        if "maxItems" not in schema:
            yield f"{path}: list without maxItems"
        yield from unbounded(schema["items"], path + "[]")
    if kind == "object":
        for name, sub in (schema.get("properties") or {}).items():
            yield from unbounded(sub, f"{path}.{name}")
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            if "maxProperties" not in schema:
                yield f"{path}: map without maxProperties"
            yield from unbounded(extra, path + "{}")


def findings(file: str, root: dict[str, Any]) -> list[str]:
    allowed = FREE_FORM_STATUS.get(file, set())
    out = []
    for part in ("spec", "status"):
        for problem in unbounded(root["properties"][part], part):
            where, what = problem.split(": ", 1)
            if what == "free-form object" and where in allowed:
                continue
            out.append(problem)
    return out


@pytest.mark.parametrize(("file", "root"), list(_schemas()))
def test_every_field_of_every_crd_is_bounded(file: str, root: dict[str, Any]) -> None:
    assert findings(file, root) == []


def test_the_walk_finds_an_unbounded_field() -> None:
    """The walk itself can fail: each kind of missing bound is found."""
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "items": {"type": "array", "items": {"type": "string", "maxLength": 3}},
            "env": {"type": "object", "additionalProperties": {"type": "string"}},
            "count": {"type": "integer", "minimum": 0},
            "gen": {"type": "integer", "maximum": 2**63 - 1},
            "doc": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
        },
    }
    root = {"properties": {"spec": schema, "status": {"type": "object"}}}
    assert findings("x.yaml", root) == [
        "spec.name: string without maxLength",
        "spec.items: list without maxItems",
        "spec.env: map without maxProperties",
        "spec.env{}: string without maxLength",
        "spec.count: number without maximum",
        "spec.gen: integer maximum above 2^53",
        "spec.doc: free-form object without maxProperties",
    ]


def test_free_form_documents_exist_only_in_status() -> None:
    for file, paths in FREE_FORM_STATUS.items():
        assert all(p.startswith("status.") for p in paths), file
        assert (Path(REPO / "crds" / file)).exists()
