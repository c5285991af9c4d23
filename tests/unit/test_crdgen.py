"""The CRD files are generated from the models, complete and structural."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from localcluster import CRD_DIR
from nodewarden.api.crdgen import crd_for, generate
from nodewarden.api.kinds import ALL_KINDS


@pytest.mark.parametrize("directory", [CRD_DIR, CRD_DIR.parent / "helm" / "nodewarden" / "crds"])
def test_crds_directory_is_not_stale(directory: Path) -> None:
    stale = [
        p.name for p, text in generate(directory).items() if not p.exists() or p.read_text() != text
    ]
    assert not stale, f"crds/ is stale, run `make crds`: {stale}"


def _walk(schema: dict[str, Any], path: str) -> list[tuple[str, dict[str, Any]]]:
    out = [(path, schema)]
    for name, sub in schema.get("properties", {}).items():
        out.extend(_walk(sub, f"{path}.{name}"))
    if "items" in schema:
        out.extend(_walk(schema["items"], f"{path}[]"))
    if isinstance(schema.get("additionalProperties"), dict):
        out.extend(_walk(schema["additionalProperties"], f"{path}{{}}"))
    return out


@pytest.mark.parametrize("kind", ALL_KINDS, ids=[k.kind for k in ALL_KINDS])
def test_every_field_has_a_description_and_a_type(kind: Any) -> None:
    root = crd_for(kind)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for path, node in _walk(root, kind.kind):
        if path.endswith(".metadata"):
            continue
        assert node.get("type"), f"{path} has no type"
        assert node.get("description"), f"{path} has no description"
        for banned in ("anyOf", "oneOf", "allOf", "$ref", "not"):
            assert banned not in node, f"{path} uses {banned}: not structural"


@pytest.mark.parametrize("kind", ALL_KINDS, ids=[k.kind for k in ALL_KINDS])
def test_crd_basics(kind: Any) -> None:
    crd = crd_for(kind)
    spec = crd["spec"]
    assert spec["group"] == "nodewarden.io"
    assert spec["names"]["shortNames"]
    assert spec["names"]["categories"] == ["nodewarden"]
    version = spec["versions"][0]
    assert version["subresources"] == {"status": {}}
    assert version["additionalPrinterColumns"]
    assert yaml.safe_load(yaml.safe_dump(crd)) == crd


def test_cel_rules_present_where_promised() -> None:
    text = (CRD_DIR / "nodewarden.io_powerintents.yaml").read_text()
    assert "self == oldSelf" in text
    text = (CRD_DIR / "nodewarden.io_powerpolicies.yaml").read_text()
    assert "duration(self.minOn) <= duration(self.maxOn)" in text
