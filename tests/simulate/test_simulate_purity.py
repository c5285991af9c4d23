"""The simulator's core is pure: no clock, sleeps, threads or I/O outside cli.py and plot.py."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import nodewarden.simulate

PACKAGE = Path(nodewarden.simulate.__file__).parent
SHELL = {"cli.py", "plot.py"}
ALLOWED_THIRD_PARTY = {"pydantic", "pydantic_core"}
ALLOWED_OWN = (
    "nodewarden.simulate",
    "nodewarden.policy",
    "nodewarden.scheduling",
    "nodewarden.api",
    "nodewarden.units",
    "nodewarden.rules",
    "nodewarden.fleet.ports",
)
CALLS = (
    r"datetime\.now\(",
    r"time\.time\(",
    r"sleep\(",
    r"(?<![\w.])open\(",
    r"\.read_text\(",
    r"\.write_text\(",
)
FORBIDDEN_STDLIB = {
    "asyncio",
    "socket",
    "subprocess",
    "time",
    "os",
    "threading",
    "urllib",
    "http",
    "pathlib",
}


def imported(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_core_modules_import_nothing_impure() -> None:
    core = [p for p in sorted(PACKAGE.glob("*.py")) if p.name not in SHELL]
    assert len(core) >= 12
    for path in core:
        for name in imported(path) - {"__future__"}:
            top = name.split(".")[0]
            if top == "nodewarden":
                assert name.startswith(ALLOWED_OWN), f"{path.name} imports {name}"
            elif top in sys.stdlib_module_names:
                assert top not in FORBIDDEN_STDLIB, f"{path.name} imports {name}"
            else:
                assert top in ALLOWED_THIRD_PARTY, f"{path.name} imports third-party {name}"
        text = path.read_text()
        for call in CALLS:
            assert not re.search(call, text), f"{path.name} calls {call}"


def test_matplotlib_is_imported_lazily() -> None:
    for path in PACKAGE.glob("*.py"):
        assert "matplotlib" not in {n.split(".")[0] for n in imported(path)}, path.name
