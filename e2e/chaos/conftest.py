"""`make chaos`: options of the long chaos run, and the cluster fixtures of tests/conftest.py.

    pytest e2e/chaos --chaos-seed 1234 --chaos-containers 320

The cluster fixtures are loaded from tests/conftest.py (not redefined), so the chaos run
gets the same local control plane as every other cluster test; `make test` runs the CI
variant from tests/chaos with tests/conftest.py's own fixtures.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from chaos.scenario import ChaosSettings, seed_from

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


@pytest.fixture
def chaos_settings(request: pytest.FixtureRequest) -> ChaosSettings:
    seed = seed_from(request.config.getoption("--chaos-seed"))
    containers = int(request.config.getoption("--chaos-containers"))
    return ChaosSettings(
        seed=seed,
        containers=containers,
        deadline=float(request.config.getoption("--chaos-deadline")),
        replay=f"make chaos CHAOS_ARGS='--chaos-seed {seed} --chaos-containers {containers}'",
    )
