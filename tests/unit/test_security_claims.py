"""docs/security.md names, for each claim, the tests that show it: every one exists."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "security.md"


def claims_section() -> str:
    text = DOC.read_text()
    return text.split("## Claims and the tests that show them", 1)[1].split("\n## ", 1)[0]


def named_tests() -> list[tuple[str, str]]:
    table = claims_section()
    found = re.findall(r"`(tests/[\w/]+\.py)::(test_\w+)`", table)
    assert len(found) >= 20, "the claims table names too few tests"
    return found


def test_every_test_the_security_page_names_exists() -> None:
    missing = []
    for path, name in named_tests():
        file = ROOT / path
        if not file.exists():
            missing.append(f"{path} (no such file)")
            continue
        tree = ast.parse(file.read_text())
        functions = {
            node.name
            for node in tree.body
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        }
        if name not in functions:
            missing.append(f"{path}::{name}")
    assert missing == [], missing


def test_every_claims_row_names_a_test() -> None:
    table = claims_section()
    rows = [r for r in table.splitlines() if r.startswith("| ") and not r.startswith("| claim")]
    rows = [r for r in rows if not set(r) <= {"|", "-", " "}]
    assert rows and all("::test_" in r for r in rows), [r for r in rows if "::test_" not in r]
