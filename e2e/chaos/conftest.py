"""`make chaos`: options of the long chaos run, and the cluster fixtures of tests/conftest.py.

    pytest e2e/chaos --chaos-seed 1234 --chaos-containers 320 --report chaos-report.json

The cluster fixtures are loaded from tests/conftest.py (not redefined), so the chaos run
gets the same local control plane as every other cluster test; `make test` runs the CI
variant from tests/chaos with tests/conftest.py's own fixtures.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from chaos.scenario import ChaosSettings, add_report_option, seed_from

_spec = importlib.util.spec_from_file_location(
    "nodewarden_tests_conftest", Path(__file__).resolve().parents[2] / "tests" / "conftest.py"
)
assert _spec is not None and _spec.loader is not None
_shared = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_shared)
cluster = _shared.cluster
namespace = _shared.namespace


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("chaos")
    group.addoption("--chaos-seed", default=None, help="replay the run with this seed")
    group.addoption("--chaos-containers", type=int, default=320, help="containers in the run")
    group.addoption("--chaos-deadline", type=float, default=900, help="seconds until drained")
    group.addoption(
        "--chaos-skew",
        default="+30s",
        help="FAKETIME of every second replica (wall clock only; 'none': no skew)",
    )
    group.addoption(
        "--chaos-one-install", action="store_true", help="no second install in the namespace"
    )
    add_report_option(parser)


@pytest.fixture
def chaos_settings(request: pytest.FixtureRequest) -> ChaosSettings:
    seed = seed_from(request.config.getoption("--chaos-seed"))
    containers = int(request.config.getoption("--chaos-containers"))
    skew = str(request.config.getoption("--chaos-skew"))
    return ChaosSettings(
        seed=seed,
        containers=containers,
        deadline=float(request.config.getoption("--chaos-deadline")),
        replay=f"make chaos CHAOS_ARGS='--chaos-seed {seed} --chaos-containers {containers}'",
        skew=None if skew.lower() == "none" else skew,
        second_install=not request.config.getoption("--chaos-one-install"),
        report=request.config.getoption("--report"),
    )
