"""Finished policy-made PowerIntents beyond `power.keep_finished_intents` are deleted, on a
real API server (the Role's `powerintents` delete: the RBAC audit, tests/rbac, counts
this call). The cluster case the delete used to ride on (`test_power_resume`, with
`keep_finished_intents: 1`) is retired for `tests/power/inproc/test_inproc_races.py`, which
cannot show a real DELETE."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from clusterkit import ClusterHandle, wait_for
from powerkit import PowerEnv, side_node_entry

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


@pytest.fixture
def env(cluster: ClusterHandle, namespace: str, tmp_path: Path) -> Iterator[PowerEnv]:
    env = PowerEnv.create(
        cluster,
        namespace,
        tmp_path,
        [side_node_entry("gpu-a")],
        config={"power": {"keep_finished_intents": 0}},
    )
    try:
        yield env
    finally:
        env.close()


def test_a_finished_policy_made_intent_beyond_the_kept_number_is_deleted(env: PowerEnv) -> None:
    env.start_operator()
    opened = wait_for(
        lambda: env.intents("gpu-a") or None,
        timeout=90,
        interval=0.5,
        what="gpu-a's policy-made Shutdown intent created",
    )
    assert [i["spec"]["action"] for i in opened] == ["Shutdown"]
    env.wait_state("gpu-a", "Off", timeout=90)
    assert [r["reset_type"] for r in env.resets("gpu-a")] == ["GracefulShutdown"]
    wait_for(
        lambda: env.intents("gpu-a") == [],
        timeout=60,
        interval=0.5,
        what="gpu-a's finished Shutdown intent deleted (keep_finished_intents: 0)",
    )
