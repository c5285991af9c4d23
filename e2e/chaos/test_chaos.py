"""The long chaos run (`make chaos`): 300+ containers under every fault, then the invariants."""

from __future__ import annotations

from pathlib import Path

import pytest

from chaos.scenario import ChaosSettings, run_chaos
from clusterkit import ClusterHandle

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def test_chaos_fleet(
    cluster: ClusterHandle, namespace: str, tmp_path: Path, chaos_settings: ChaosSettings
) -> None:
    run_chaos(cluster, namespace, tmp_path, chaos_settings)
