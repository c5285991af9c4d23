"""The shape of the product package, read from its import statements.

- `nodewarden` never reaches `nodewarden_doubles` (a static walk of every module's import
  statements, including imports inside functions, and a dynamic one: importing every
  `nodewarden` module in a fresh interpreter leaves no `nodewarden_doubles` module loaded).
- The rooms of issue 22, from a static walk of every module's imports (module-level and
  function-level, absolute and relative; importing ``a.b.c`` also imports the packages
  ``a.b`` and ``a``, except the importer's own packages, which Python has already started;
  ``from P import x`` imports P itself, also from inside P: the ``ssh`` <-> ``ssh.prober``
  shape):
  no module over 600 lines; no import cycle between files; no cycle between the top-level
  packages of `nodewarden`; no import between `dispatch/` and `power/`; `simulate/` imports
  no module of `dispatch/`, `power/` or `pool/`, and only its CLI and trace export import
  `kube/`; the pure `rules/` imports no shell package.

The walk itself is tested on tiny synthetic packages, so each rule is seen to catch a
planted violation.
"""

from __future__ import annotations

import ast
import functools
import subprocess
import sys
import textwrap
from collections import defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

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


# ------------------------------------------------------------------ the import graph

ROOT = "nodewarden"
MAX_LINES = 600
Graph = dict[str, set[str]]


def modules_of(package: Path, root: str = ROOT) -> dict[str, Path]:
    """Every module of the package under ``package`` (a directory named ``root``), by dotted name."""
    found: dict[str, Path] = {}
    for path in sorted(package.rglob("*.py")):
        parts = (root, *path.relative_to(package).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _ancestors(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _imported(name: str, path: Path, modules: Mapping[str, Path]) -> set[str]:
    """The modules of ``modules`` that importing ``name`` (at ``path``) imports directly."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    explicit: set[str] = set()
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            explicit.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*base_parts, *([node.module] if node.module else [])])
            else:
                base = node.module or ""
            # `from P import x` reads P's namespace: it imports P, even from inside P.
            explicit.add(base)
            explicit.update(f"{base}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "import_module":
            for arg in node.args[:1]:
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    explicit.add(arg.value)
    own = set(_ancestors(name))
    targets = {t for t in explicit if t in modules}
    implied = {a for t in targets for a in _ancestors(t) if a in modules and a not in own}
    return (targets | implied) - {name}


@functools.cache
def module_graph(package: Path, root: str = ROOT) -> tuple[Graph, dict[str, Path]]:
    modules = modules_of(package, root)
    return {name: _imported(name, path, modules) for name, path in modules.items()}, modules


def cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def top(name: str, root: str = ROOT) -> str:
    """The top-level room of a module: its first package below ``root`` (``root`` itself
    for the package's own ``__init__``)."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else root


def package_graph(graph: Mapping[str, Iterable[str]], root: str = ROOT) -> Graph:
    rooms: Graph = defaultdict(set)
    for name, targets in graph.items():
        rooms[top(name, root)]
        for target in targets:
            if top(target, root) != top(name, root):
                rooms[top(name, root)].add(top(target, root))
    return dict(rooms)


def _file(name: str, modules: Mapping[str, Path], package: Path) -> str:
    return str(modules[name].relative_to(package.parent))


def module_cycle_report(package: Path, root: str = ROOT) -> list[str]:
    graph, modules = module_graph(package, root)
    report = []
    for component in cycles(graph):
        members = set(component)
        edges = [
            f"{_file(a, modules, package)} imports {b}"
            for a in component
            for b in sorted(graph[a] & members)
        ]
        report.append("cycle: " + "; ".join(edges))
    return report


def package_cycle_report(package: Path, root: str = ROOT) -> list[str]:
    graph, modules = module_graph(package, root)
    report = []
    for component in cycles(package_graph(graph, root)):
        members = set(component)
        edges = [
            f"{_file(a, modules, package)} imports {b}"
            for a in sorted(graph)
            for b in sorted(graph[a])
            if top(a, root) in members and top(b, root) in members and top(a, root) != top(b, root)
        ]
        report.append(f"cycle between {', '.join(component)}: " + "; ".join(edges))
    return report


def long_module_report(package: Path, limit: int = MAX_LINES) -> list[str]:
    report = []
    for path in sorted(package.rglob("*.py")):
        lines = len(path.read_text().splitlines())
        if lines > limit:
            report.append(f"{path.relative_to(package.parent)}: {lines} lines (> {limit})")
    return report


def forbidden_imports(
    package: Path,
    source_rooms: Iterable[str],
    forbidden_rooms: Iterable[str],
    root: str = ROOT,
    allowed_files: Iterable[str] = (),
) -> list[str]:
    """Imports from a module of ``source_rooms`` of a module of ``forbidden_rooms``
    (``allowed_files``: paths relative to ``package`` exempt from this rule)."""
    graph, modules = module_graph(package, root)
    sources, forbidden, allowed = set(source_rooms), set(forbidden_rooms), set(allowed_files)
    return [
        f"{_file(a, modules, package)} imports {b}"
        for a in sorted(graph)
        if top(a, root) in sources and str(modules[a].relative_to(package)) not in allowed
        for b in sorted(graph[a])
        if top(b, root) in forbidden
    ]


def _show(report: list[str]) -> str:
    return "\n  " + "\n  ".join(report)


# ------------------------------------------------------------ the product's rooms

SHELL_ROOMS = (
    "dispatch",
    "power",
    "pool",
    "kube",
    "ssh",
    "redfish",
    "cloud",
    "handlers",
    "service",
    "compose",
)


def test_no_module_is_over_600_lines() -> None:
    report = long_module_report(PACKAGE)
    assert report == [], "split these modules:" + _show(report)


def test_no_import_cycle_between_files() -> None:
    report = module_cycle_report(PACKAGE)
    assert report == [], "import cycles between files:" + _show(report)


def test_no_import_cycle_between_packages() -> None:
    report = package_cycle_report(PACKAGE)
    assert report == [], "import cycles between the packages of nodewarden:" + _show(report)


def test_dispatch_and_power_do_not_import_each_other() -> None:
    report = forbidden_imports(PACKAGE, ["dispatch"], ["power"]) + forbidden_imports(
        PACKAGE, ["power"], ["dispatch"]
    )
    assert report == [], "dispatch/ and power/ meet only in fleet/ and compose:" + _show(report)


def test_simulate_imports_no_shell_controller() -> None:
    report = forbidden_imports(PACKAGE, ["simulate"], ["dispatch", "power", "pool"])
    assert report == [], "simulate/ calls rules/, not the shell:" + _show(report)


def test_only_the_simulator_cli_and_trace_export_touch_kube() -> None:
    report = forbidden_imports(
        PACKAGE,
        ["simulate"],
        ["kube"],
        allowed_files=["simulate/cli.py", "simulate/trace.py", "simulate/export.py"],
    )
    assert report == [], "simulate/ reaches the API server only from its CLI:" + _show(report)


def test_rules_import_no_shell_package() -> None:
    assert (PACKAGE / "rules").is_dir(), "rules/ (issue 22) is missing"
    report = forbidden_imports(PACKAGE, ["rules"], SHELL_ROOMS)
    assert report == [], "rules/ is pure:" + _show(report)


# ------------------------------------------------- the walk on synthetic packages


def _package(tmp_path: Path, files: Mapping[str, str]) -> Path:
    package = tmp_path / ROOT
    for relative, text in {"__init__.py": "", **files}.items():
        path = package / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        (path.parent / "__init__.py").touch()
        path.write_text(textwrap.dedent(text))
    return package


def test_walk_resolves_absolute_relative_late_and_implied_package_imports(tmp_path: Path) -> None:
    package = _package(
        tmp_path,
        {
            "a/__init__.py": "from .x import X\n",
            "a/x.py": "from ..b import thing\nX = 1\n",
            "a/y.py": "def late() -> None:\n    import nodewarden.c.deep\n",
            "a/w.py": "import nodewarden.a.x\n",
            "a/z.py": "from nodewarden.a import x\nfrom . import y\n",
            "b/__init__.py": "thing = 1\n",
            "c/__init__.py": "",
            "c/deep.py": "import importlib\nimportlib.import_module('nodewarden.b')\n",
        },
    )
    graph, _ = module_graph(package)
    assert graph["nodewarden.a"] == {"nodewarden.a.x"}
    assert graph["nodewarden.a.x"] == {"nodewarden.b"}
    assert graph["nodewarden.a.y"] == {"nodewarden.c", "nodewarden.c.deep"}  # c implied
    assert graph["nodewarden.a.z"] == {"nodewarden.a", "nodewarden.a.x", "nodewarden.a.y"}
    assert graph["nodewarden.a.w"] == {"nodewarden.a.x"}  # its own package is not implied
    assert graph["nodewarden.c.deep"] == {"nodewarden.b"}
    assert module_cycle_report(package) == []
    assert package_cycle_report(package) == []


def test_a_planted_file_cycle_is_caught(tmp_path: Path) -> None:
    package = _package(
        tmp_path,
        {
            "p/one.py": "from nodewarden.p.two import T\n",
            "p/two.py": "def late() -> None:\n    from .three import x\n",
            "p/three.py": "import nodewarden.p.one\n",
        },
    )
    report = module_cycle_report(package)
    assert len(report) == 1
    for path in ("nodewarden/p/one.py", "nodewarden/p/two.py", "nodewarden/p/three.py"):
        assert path in report[0]


def test_a_package_importing_a_name_its_own_init_re_exports_is_a_cycle(tmp_path: Path) -> None:
    # The ssh <-> ssh.prober shape: the package's __init__ imports prober, prober imports
    # a name from the package.
    package = _package(
        tmp_path,
        {
            "ssh/__init__.py": "from nodewarden.ssh.errors import E\nfrom nodewarden.ssh.prober import P\n",
            "ssh/errors.py": "E = 1\n",
            "ssh/prober.py": "from nodewarden.ssh import E\nP = 1\n",
        },
    )
    assert module_cycle_report(package) == [
        "cycle: nodewarden/ssh/__init__.py imports nodewarden.ssh.prober; "
        "nodewarden/ssh/prober.py imports nodewarden.ssh"
    ]


def test_a_planted_package_cycle_through_an_implied_package_is_caught(tmp_path: Path) -> None:
    # No file cycle: config.py -> credentials.admission, credentials/resolver.py -> config;
    # but importing credentials.admission runs credentials/__init__, which imports resolver.
    package = _package(
        tmp_path,
        {
            "config.py": "def late() -> None:\n    from nodewarden.credentials.admission import parse\n",
            "credentials/__init__.py": "from nodewarden.credentials.resolver import R\n",
            "credentials/admission.py": "def parse() -> None: ...\n",
            "credentials/resolver.py": "from nodewarden.config import late\nR = 1\n",
        },
    )
    report = package_cycle_report(package)
    assert len(report) == 1
    assert report[0].startswith("cycle between config, credentials:")
    assert "nodewarden/config.py imports nodewarden.credentials.admission" in report[0]
    assert "nodewarden/credentials/resolver.py imports nodewarden.config" in report[0]
    assert module_cycle_report(package) != []  # config -> credentials (implied) -> resolver


def test_a_planted_long_module_is_caught(tmp_path: Path) -> None:
    package = _package(
        tmp_path, {"big.py": "x = 1\n" * (MAX_LINES + 1), "fine.py": "x = 1\n" * MAX_LINES}
    )
    assert long_module_report(package) == [f"nodewarden/big.py: {MAX_LINES + 1} lines (> 600)"]


@pytest.mark.parametrize(
    ("importer", "statement", "caught"),
    [
        ("dispatch/loop.py", "from nodewarden.power.round import R", True),
        ("power/round.py", "def f() -> None:\n    from ..dispatch import loop\n", True),
        ("simulate/engine.py", "import nodewarden.pool.workers", True),
        ("simulate/engine.py", "from nodewarden.kube.client import Kube", True),
        ("simulate/cli.py", "from nodewarden.kube.client import Kube", False),
        ("rules/readings.py", "from nodewarden.ssh.facts import F", True),
        ("rules/readings.py", "from nodewarden.fleet.ports import S", False),
    ],
)
def test_the_room_rules_catch_a_planted_import(
    tmp_path: Path, importer: str, statement: str, caught: bool
) -> None:
    files = {
        f"{room}/{name}.py": "R = S = F = Kube = 1\n"
        for room, name in [
            ("power", "round"),
            ("dispatch", "loop"),
            ("pool", "workers"),
            ("kube", "client"),
            ("ssh", "facts"),
            ("fleet", "ports"),
        ]
    }
    files[importer] = statement + "\n"
    package = _package(tmp_path, files)
    report = (
        forbidden_imports(package, ["dispatch"], ["power"])
        + forbidden_imports(package, ["power"], ["dispatch"])
        + forbidden_imports(package, ["simulate"], ["dispatch", "power", "pool"])
        + forbidden_imports(package, ["simulate"], ["kube"], allowed_files=["simulate/cli.py"])
        + forbidden_imports(package, ["rules"], SHELL_ROOMS)
    )
    assert bool(report) is caught, report
    if caught:
        assert report[0].startswith(f"nodewarden/{importer} imports ")
