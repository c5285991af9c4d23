"""Energy figures survive a failover and a restart (issue 26), on the real API server with
the real side-node process: two side nodes behind the project's fake BMC -- the only peer
with power readings (sushy-tools serves none) -- one kept On (`idleBehavior: hold`, a
cumulative kWh counter), one switched off by the policy (watts only). The leader is
killed (SIGKILL) and the standby takes over; later that one is stopped and a third
replica starts: each time the figures go on from where they were -- `since` kept, kWh
never reset, time off continued, the one shutdown not counted twice, the measured idle
draw kept -- and the policy's sums with them."""

from __future__ import annotations

import signal
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from calibration import scaled
from clusterkit import ClusterHandle, OperatorProcess, wait_for
from powerkit import PowerEnv, side_node_entry

pytestmark = pytest.mark.cluster

ENERGY = {
    "read_interval": 5,  # (once a minute by default: this test has no minutes to spare)
    "status_interval": 5,
    "idle_measure": 5,
    "classes": {
        "default": {
            "idle_watts": 300,
            "off_watts": 10,
            "boot_energy_wh": 2,
            "shutdown_energy_wh": 1,
            "price_per_kwh": 0.5,
        }
    },
}


def _energy(env: PowerEnv, node: str) -> dict[str, Any]:
    return dict(env.status(node).get("energy") or {})


def _policy(env: PowerEnv) -> dict[str, Any]:
    body = env.cluster.get_json(env.namespace, "pp", "default")
    return dict((body.get("status") or {}).get("energy") or {})


def _written_after(env: PowerEnv, node: str, after: datetime) -> dict[str, Any] | None:
    figures = _energy(env, node)
    at = figures.get("updatedAt")
    if at and datetime.fromisoformat(at.replace("Z", "+00:00")) > after:
        return figures
    return None


def _goes_on(before: dict[str, Any], after: dict[str, Any], off: bool) -> None:
    assert after["since"] == before["since"], (before, after)
    assert after["usedKwh"] >= before["usedKwh"], (before, after)
    assert after["shutdowns"] == before["shutdowns"] and after["boots"] == before["boots"]
    if off:
        assert after["offSeconds"] > before["offSeconds"], (before, after)
        assert after["savedKwh"] > before["savedKwh"]
    assert after["idleWattsBasis"] == before["idleWattsBasis"]


def test_the_figures_survive_a_failover_and_a_restart(
    cluster: ClusterHandle, namespace: str, tmp_path: Path
) -> None:
    nodes = [
        side_node_entry("kept-on", fakebmc={"power_reading": "cumulative", "on_watts": 260.0}),
        side_node_entry(
            "goes-off", fakebmc={"power_reading": "watts", "on_watts": 240.0, "off_watts": 9.0}
        ),
    ]
    env = PowerEnv.create(
        cluster,
        namespace,
        tmp_path / "env",
        nodes,
        node_specs={"kept-on": {"idleBehavior": "hold"}},
        config={"power": {"energy": ENERGY}},
    )
    try:
        t0 = time.monotonic()
        pair = [env.start_operator("a"), env.start_operator("b")]  # side by side: one leads
        env.wait_state("goes-off", "Off", timeout=scaled(60))

        def leading() -> list[OperatorProcess] | None:
            lead = [
                op
                for op in pair
                if 'nodewarden_leader{dispatcher_id="power"} 1.0' in op.get("/metrics")[1]
            ]
            return lead if len(lead) == 1 else None

        (leader,) = wait_for(leading, timeout=scaled(30), what="the one leader")
        standby = next(op for op in pair if op is not leader)
        phases = {"off": time.monotonic() - t0}

        def counted() -> dict[str, dict[str, Any]] | None:
            on, off = _energy(env, "kept-on"), _energy(env, "goes-off")
            done = on.get("usedKwh", 0) > 0 and on.get("idleWattsBasis") == "Measured"
            done = done and off.get("offSeconds", 0) > 0 and off.get("offWattsBasis") == "Measured"
            return {"kept-on": on, "goes-off": off} if done else None

        first = wait_for(counted, timeout=scaled(60), interval=1, what="the first figures")
        assert first["kept-on"]["method"] == "Cumulative"
        assert first["goes-off"]["method"] == "Integrated"
        assert first["goes-off"]["shutdowns"] == 1

        def saved() -> dict[str, Any] | None:
            sums = _policy(env)
            return sums if sums.get("savedKwh", 0) > 0 else None

        policy = wait_for(saved, timeout=scaled(30), interval=1, what="the policy's sums")
        assert policy["currency"] == "USD"
        assert policy["nodesMeasured"] + policy["nodesConfigured"] == 2

        phases["figures"] = time.monotonic() - t0
        killed = datetime.now().astimezone()
        leader.stop(signal.SIGKILL)  # no goodbye: the standby takes over at the lease's end
        second: dict[str, dict[str, Any]] = {}
        for node in ("kept-on", "goes-off"):
            second[node] = wait_for(
                lambda n=node: _written_after(env, n, killed),  # type: ignore[misc]
                timeout=scaled(60),
                interval=1,
                what=f"{node}'s figures from the new leader",
            )
        for node, off in (("kept-on", False), ("goes-off", True)):
            _goes_on(first[node], second[node], off)
        assert "power controller started" in standby.logs()
        phases["failover"] = time.monotonic() - t0

        standby.stop()  # a clean stop, then a restart
        restarted = datetime.now().astimezone()
        time.sleep(1)
        env.start_operator("restarted")
        for node, off in (("kept-on", False), ("goes-off", True)):
            third = wait_for(
                lambda n=node: _written_after(env, n, restarted),  # type: ignore[misc]
                timeout=scaled(60),
                interval=1,
                what=f"{node}'s figures after the restart",
            )
            _goes_on(second[node], third, off)

        def policy_on() -> dict[str, Any] | None:
            sums = _policy(env)
            at = sums.get("updatedAt", "")
            fresh = at and datetime.fromisoformat(at.replace("Z", "+00:00")) > restarted
            return sums if fresh else None

        phases["restart"] = time.monotonic() - t0
        later = wait_for(policy_on, timeout=scaled(60), interval=1, what="policy sums again")
        print("energy cluster test, seconds since the first start:", phases)
        assert later["savedKwh"] >= policy["savedKwh"]
        assert env.resets("kept-on") == []  # held on throughout
    finally:
        env.close()
