"""The CI variant of the chaos suite (e2e/chaos): 120 containers under every fault kind.

Fault kinds that expose an open product bug (`chaos.schedule.KNOWN_BUGS`) are drawn but
not played here until the bug is fixed; `make chaos` plays everything. A fresh seed each run (printed with the schedule); replay one with
`NODEWARDEN_CHAOS_SEED=N .venv/bin/python -m pytest tests/chaos`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from chaos.scenario import SEED_ENV, ChaosSettings, run_chaos, seed_from
from chaos.schedule import KNOWN_BUGS
from clusterkit import ClusterHandle

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

CONTAINERS = 120
DEADLINE = 360.0


def test_chaos_ci(cluster: ClusterHandle, namespace: str, tmp_path: Path) -> None:
    seed = seed_from(None)
    settings = ChaosSettings(
        seed=seed,
        containers=CONTAINERS,
        deadline=DEADLINE,
        replay=f"{SEED_ENV}={seed} .venv/bin/python -m pytest -p no:cacheprovider tests/chaos",
        exclude=frozenset(KNOWN_BUGS),
    )
    run_chaos(cluster, namespace, tmp_path, settings)
