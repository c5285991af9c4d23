"""The decision core stays pure: it imports only the stdlib, pydantic and nodewarden's models."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import nodewarden.policy

PACKAGE = Path(nodewarden.policy.__file__).parent
ALLOWED_THIRD_PARTY = {"pydantic", "pydantic_core"}
ALLOWED_OWN = ("nodewarden.policy", "nodewarden.api", "nodewarden.units")
FORBIDDEN_STDLIB = {
    "asyncio",
    "socket",
    "subprocess",
    "time",
    "random",
    "os",
    "threading",
    "urllib",
    "http",
}


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_policy_modules_import_nothing_impure() -> None:
    files = sorted(PACKAGE.glob("*.py"))
    assert len(files) >= 10
    for path in files:
        for name in imported_modules(path):
            top = name.split(".")[0]
            if name == "__future__":
                continue
            if top == "nodewarden":
                assert name.startswith(ALLOWED_OWN), f"{path.name} imports {name}"
            elif top in sys.stdlib_module_names:
                assert top not in FORBIDDEN_STDLIB, (
                    f"{path.name} imports {name} (I/O, clock or randomness)"
                )
            else:
                assert top in ALLOWED_THIRD_PARTY, f"{path.name} imports third-party {name}"


def test_no_wall_clock_reads_in_the_core() -> None:
    for path in PACKAGE.glob("*.py"):
        text = path.read_text()
        for call in ("datetime.now(", "datetime.utcnow(", "time.time(", "now_utc("):
            assert call not in text, f"{path.name} reads the clock via {call}"
