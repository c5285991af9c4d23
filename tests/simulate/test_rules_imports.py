"""`rules/` is pure and below every shell package; `simulate/` calls it and no shell room.

`rules/` imports only value modules (api, policy, scheduling, units, fleet.ports); `simulate/` imports no module of dispatch/, power/ or pool/, and only
its CLI and trace export touch kube/.
"""

from __future__ import annotations

import ast
from pathlib import Path

import nodewarden

ROOT = Path(nodewarden.__file__).parent
RULES_ALLOWED = (
    "nodewarden.api",
    "nodewarden.policy",
    "nodewarden.scheduling",
    "nodewarden.units",
    "nodewarden.rules",
    "nodewarden.fleet.ports",
)
SHELL_ROOMS = ("nodewarden.dispatch", "nodewarden.power", "nodewarden.pool")


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_rules_import_only_value_modules() -> None:
    modules = sorted((ROOT / "rules").glob("*.py"))
    assert len(modules) >= 4
    bad = {
        p.name: sorted(
            n for n in _imports(p) if n.startswith("nodewarden") and not n.startswith(RULES_ALLOWED)
        )
        for p in modules
    }
    assert {k: v for k, v in bad.items() if v} == {}
    for p in modules:
        assert {"asyncio", "kopf"}.isdisjoint(n.split(".")[0] for n in _imports(p)), p.name


def test_simulate_imports_no_shell_room_and_kube_only_in_cli_and_export() -> None:
    for p in sorted((ROOT / "simulate").glob("*.py")):
        names = _imports(p)
        assert not [n for n in names if n.startswith(SHELL_ROOMS)], p.name
        if p.name not in ("cli.py", "export.py"):
            assert not [n for n in names if n.startswith("nodewarden.kube")], p.name


def test_every_simulate_and_rules_module_is_at_most_550_lines() -> None:
    sizes = {
        f"{p.parent.name}/{p.name}": len(p.read_text().splitlines())
        for d in ("simulate", "rules")
        for p in (ROOT / d).glob("*.py")
    }
    assert {k: v for k, v in sizes.items() if v > 550} == {}
