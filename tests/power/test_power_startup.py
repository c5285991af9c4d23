"""Start-up in parallel, safely (issue 23): the power controller decides while the
dispatcher is still recovering behind a slow cloud list, and no node whose work is not yet
known is switched off before the pool has recovered. On the real API server, with the
real side-node process (fake BMC, SSH stub worker) and the stub cloud answering every list
call 15 s late."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from calibration import scaled
from clusterkit import ClusterHandle, wait_for
from dispatchkit import CATALOGUE
from nodewarden_doubles.stubcloud.process import StubCloudProcess
from nodewarden_doubles.stubcloud.serverconfig import StubServerConfig, StubServerCredentials
from powerkit import PowerEnv, side_node_entry

pytestmark = pytest.mark.cluster

LIST_DELAY = 15.0
"""Seconds each cloud list takes: the dispatcher's recovery waits for one."""


@pytest.fixture
def stub(tmp_path: Path) -> Iterator[StubCloudProcess]:
    cloud = StubCloudProcess(
        StubServerConfig(
            name=f"stub-startup-{tmp_path.name[-8:]}",
            credentials=StubServerCredentials(key="AKIASTUBTEST0002", secret="stub-secret-value-2"),
            instance_types=list(CATALOGUE),
            faults={"list_delay": LIST_DELAY},
        ),
        workdir=tmp_path / "stub",
    )
    cloud.start()
    yield cloud
    cloud.stop()


def _cloud_config(stub: StubCloudProcess) -> dict[str, Any]:
    base = stub.cloud_config().model_dump(mode="json")
    base.update(
        {
            "credentials": {
                "key_ref": {"name": "nodewarden-cloud", "key": "key"},
                "secret_ref": {"name": "nodewarden-cloud", "key": "secret"},
            },
            "ops_per_second": 0,
        }
    )
    return base


def test_decisions_start_before_the_slow_recovery_and_no_node_is_idle_until_it_ends(
    cluster: ClusterHandle, namespace: str, tmp_path: Path, stub: StubCloudProcess
) -> None:
    creds = stub.cloud_credentials()
    assert creds is not None and creds.secret is not None
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "nodewarden-cloud"},
        "stringData": {
            "key": creds.key.get_secret_value(),
            "secret": creds.secret.get_secret_value(),
        },
    }
    env = PowerEnv.create(
        cluster,
        namespace,
        tmp_path / "env",
        [side_node_entry("idle-a")],
        config={"cloud": _cloud_config(stub), "dispatch": {"sync_interval": 2}},
        objects=[secret],
    )
    try:
        started = time.monotonic()
        op = env.start_operator()

        def first_decision() -> dict[str, Any] | None:
            record = env.status("idle-a").get("lastSafetyRecord") or {}
            return record or None

        record = wait_for(first_decision, timeout=60, what="the first decision of idle-a")
        decided_after = time.monotonic() - started
        # decided while the dispatcher was still waiting for its first cloud list
        assert "dispatcher recovered" not in op.logs(), (
            f"the first decision waited for the recovery ({decided_after:.1f} s)"
        )
        # a streamed ready state can make that first decision a confirmed START; what
        # matters is that it came before the recovery and neither drains nor shuts down
        assert record.get("decision") not in ("DRAIN", "SHUTDOWN"), record
        # the node is idle (no runner, no container) with a 2 s idle threshold; until the
        # pool recovers its work is unknown: deferred for missing telemetry, never drained
        seen: set[str] = set()
        states: set[str] = set()
        while "dispatcher recovered" not in op.logs():
            status = env.status("idle-a")
            states.add(str(status.get("state")))
            seen.update((status.get("lastSafetyRecord") or {}).get("reasons", []))
            assert time.monotonic() - started < scaled(LIST_DELAY * 4), "no recovery"
            time.sleep(0.2)
        assert "TELEMETRY_MISSING" in seen, seen
        assert not states & {"Draining", "ShuttingDown", "Off"}, states
        assert env.resets("idle-a") == [], "a reset was sent before the pool recovered"
        assert not _shutdown_before_recovery(op.logs())
        # and once it has: the idle node is switched off (the test can see a shutdown)
        env.wait_state("idle-a", "Off", timeout=60.0)
    finally:
        env.close()


def _shutdown_before_recovery(logs: str) -> bool:
    """A shutdown decision logged before the line "dispatcher recovered"."""
    head = logs.split("dispatcher recovered", 1)[0]
    return re.search(r"idle-a: \S+ -> (DRAINING|SHUTTING_DOWN)", head) is not None
