"""The product package imports no test double: `nodewarden` never reaches `nodewarden_doubles`.

Two checks: a static walk of every module's import statements (including imports inside
functions), and a dynamic one: importing every `nodewarden` module in a fresh
interpreter leaves no `nodewarden_doubles` module loaded.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "operator" / "nodewarden"
DOUBLES = "nodewarden_doubles"


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "import_module":
            for arg in node.args:
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    names.add(arg.value)
    return names


def test_no_module_of_the_product_imports_a_test_double() -> None:
    modules = sorted(PACKAGE.rglob("*.py"))
    assert len(modules) > 50, "the walk found too few modules; is PACKAGE right?"
    offenders = {
        str(path.relative_to(PACKAGE)): sorted(n for n in _imports(path) if n.startswith(DOUBLES))
        for path in modules
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_importing_every_product_module_loads_no_test_double() -> None:
    names = [
        "nodewarden." + ".".join(p.relative_to(PACKAGE).with_suffix("").parts)
        for p in sorted(PACKAGE.rglob("*.py"))
    ]
    names = [n.removesuffix(".__init__") for n in names if not n.endswith("__main__")]
    script = (
        "import importlib, sys\n"
        f"for name in {names!r}:\n"
        "    importlib.import_module(name)\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] == {DOUBLES!r}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "[]", out.stdout
