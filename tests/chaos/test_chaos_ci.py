"""The CI variant of the chaos suite (e2e/chaos): 120 containers under every fault kind,
leader SIGKILLs with a side node's SSH commands slowed included.

A fresh seed each run (printed with the schedule); replay one with
`NODEWARDEN_CHAOS_SEED=N .venv/bin/python -m pytest tests/chaos`. The run's report
(`--report FILE.json`, else report.json in the test's tmp_path) is recounted by
`python3 e2e/chaos/recheck.py FILE.json`. Fault kinds that expose an open product bug
(`chaos.schedule.KNOWN_BUGS`, empty today) are drawn but not played here; `make chaos`
plays everything, with a clock-skewed standby and a second install besides.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from calibration import scaled
from chaos.scenario import SEED_ENV, ChaosSettings, run_chaos, seed_from
from chaos.schedule import KNOWN_BUGS
from clusterkit import ClusterHandle

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

CONTAINERS = 120
DEADLINE = 360.0
"""Seconds from the first burst until drained, on the reference machine (`scaled`)."""


def test_chaos_ci(
    cluster: ClusterHandle, namespace: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    seed = seed_from(None)
    settings = ChaosSettings(
        seed=seed,
        containers=CONTAINERS,
        deadline=scaled(DEADLINE),
        replay=f"{SEED_ENV}={seed} .venv/bin/python -m pytest -p no:cacheprovider tests/chaos",
        exclude=frozenset(KNOWN_BUGS),
        report=request.config.getoption("--report", default=None),
    )
    run_chaos(cluster, namespace, tmp_path, settings)
