"""Issue 25's five levers in the live operator, in one cluster scenario (budget: 90 s).

The real operator process against the local API server, with the stub cloud (VMs are SSH
stub workers on 127.0.0.1) and the side-node process (fake BMCs, SSH stub workers), one
PowerPolicy with every lever On. Everything is read back from what the API server holds
(ContainerDispatch and WorkerNode status, PowerIntents, PowerPolicy status):

1. packing -- four 1-vCPU containers queued together get one new cpu8 VM, chosen for the
   queue as a whole (0.12/h for four beats a 0.09/h cpu2 for every two, the choice of
   one container at a time); later, with two VMs up, a fifth goes to the fuller one (best
   fit);
2. consolidation by drain -- once three of the four end, that VM runs one container
   (1/8 used, 0.96/h per used share) that fits beside the 6-vCPU container on the other
   VM: a Drain PowerIntent, CONSOLIDATION_DRAIN, with its Safety Record evidence; the
   container is not evicted: it completes where it ran, in one attempt;
3. GPU first -- the four wait for their VM although an idle, free, ready GPU side node
   with room is open; the GPU node then runs a CPU-only container that nothing without
   GPUs fits, its GPUs idle: status.admission GPUOnly, and a GPU container is still
   placed there;
4. warm window -- a window open now (the policy's nodeClasses/warmCapacity) wakes the Off
   side node of its class: a Wake intent with WARM_WINDOW, status.warmCapacity and
   status.inForce name the window;
5. forecast wake (On) -- its histogram, seeded in the PowerPolicy status where the
   operator persists it (`rules.forecast.to_status`; a restart restores it from there),
   forecasts arrivals within its class's boot time: the Off node of that class is woken
   ahead of demand (Wake intent with FORECAST_DEMAND), status.forecast Forecasting.

The warm and forecast classes' side nodes are priced far above any VM so that no
container ever goes there: what wakes them is the levers alone.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from calibration import load, scaled
from clusterkit import ClusterHandle, wait_for
from dispatchkit import GI, container
from nodewarden.api.warmcapacity import HOURS, WEEKDAYS
from nodewarden.scheduling.instancetypes import InstanceType
from nodewarden_doubles.stubcloud.process import StubCloudProcess
from nodewarden_doubles.stubcloud.serverconfig import StubServerConfig, StubServerCredentials
from powerkit import PowerEnv, side_node_entry

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

BUDGET = 90.0
"""Seconds the whole scenario may take on the reference machine (issue 25's acceptance)."""

# cpu8 is within the price factor (1.5) of cpu2, so a 1-vCPU container may share one
CATALOGUE = [
    InstanceType(name="cpu2", provider_type="c5.large", vcpus=2, ram=8 * GI, price=0.09),
    InstanceType(name="cpu8", provider_type="c5.2xlarge", vcpus=8, ram=32 * GI, price=0.12),
]
GPU, WARM, FORECAST = "gpu-0", "warm-0", "fc-0"
DEAR_SIDE = 10.0
"""Price per hour of the warm and forecast classes' side nodes: never worth a container."""
PACKED = ["p0", "p1", "p2", "kept"]
SHORT_SECONDS = 10.0
"""Run time of the other three: they end while "kept" runs."""
KEPT_SECONDS = 22.0
"""Run time of "kept": long enough to be drained while it runs."""


def _window_now() -> dict[str, Any]:
    """A warm window open from an hour ago to an hour from now (UTC; overnight windows
    close the next day), on the weekday it opened."""
    now = datetime.now(UTC)
    opens, closes = now - timedelta(hours=1), now + timedelta(hours=1)
    return {
        "name": "office",
        "nodeClass": "warm",
        "minWarm": 1,
        "days": [WEEKDAYS[opens.weekday()]],
        "start": f"{opens:%H:%M}",
        "end": f"{closes:%H:%M}",
        "timeZone": "UTC",
    }


POLICY: dict[str, Any] = {
    "idleThreshold": "4s",
    "dispatch": {"maxAttempts": 3, "lameAfter": "60s", "lameMinProbes": 3, "takeoverAfter": "60s"},
    "consolidation": {
        "mode": "On",
        "maxUtilisation": 0.3,
        "minPriceRatio": 1.5,
        "consolidateAfter": "3s",
        "recheckAfter": "4s",
        "maxConcurrent": 1,
    },
    "nodeClasses": [
        {"name": "warm", "nodeType": "SideNode", "namePrefix": "warm-", "bootTime": "30s"},
        {"name": "fc", "nodeType": "SideNode", "namePrefix": "fc-", "bootTime": "2m"},
    ],
    "forecastWake": {"mode": "On", "minDays": 1, "confidence": 0.8, "maxWarmNodes": 1},
}


def _seeded_forecast(now: datetime) -> dict[str, Any]:
    """A histogram as the operator persists it (`rules.forecast.to_status`): two days
    watched, 30 arrivals an hour of the "fc" class, each a whole node, at every hour."""
    watched = [1.0] * HOURS
    busy = {"arrivals": [30.0] * HOURS, "load": [30.0] * HOURS}
    return {
        "state": "Forecasting",
        "message": "seeded by the test: two days of arrivals",
        "timeZone": "UTC",
        "daysObserved": 2.0,
        "countedUntil": now.isoformat().replace("+00:00", "Z"),
        "observedHours": {"weekday": watched, "weekend": watched},
        "classes": [{"name": "fc", "weekday": busy, "weekend": busy}],
    }


@pytest.fixture
def started() -> float:
    """When the scenario began: before its stub cloud, side nodes and objects (the control
    plane is the session's, shared with the other cluster tests)."""
    return time.monotonic()


@pytest.fixture
def stub(started: float, tmp_path: Path) -> Iterator[StubCloudProcess]:
    cloud = StubCloudProcess(
        StubServerConfig(
            name=f"stub-levers-{tmp_path.name[-8:]}",
            credentials=StubServerCredentials(key="AKIASTUBTEST0025", secret="stub-secret-25"),
            instance_types=list(CATALOGUE),
            # a VM answers "booting" this long once up: the GPU node is open before it
            faults={"boot_delay": 2.0},
        ),
        workdir=tmp_path / "stub",
    )
    cloud.start()
    yield cloud
    cloud.stop()


@pytest.fixture
def env(
    cluster: ClusterHandle, namespace: str, tmp_path: Path, stub: StubCloudProcess
) -> Iterator[PowerEnv]:
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
    cloud = stub.cloud_config().model_dump(mode="json")
    cloud.update(
        {
            "credentials": {
                "key_ref": {"name": "nodewarden-cloud", "key": "key"},
                "secret_ref": {"name": "nodewarden-cloud", "key": "secret"},
            },
            "ops_per_second": 0,
            "max_concurrent_creates": 8,
        }
    )
    cheap_cpu = {"vcpus": 4, "ram": "16Gi"}
    e = PowerEnv.create(
        cluster,
        namespace,
        tmp_path / "env",
        [
            side_node_entry(GPU),
            side_node_entry(WARM, initial_power="Off", gpus=0),
            side_node_entry(FORECAST, initial_power="Off", gpus=0),
        ],
        policy={
            **POLICY,
            "warmCapacity": {"mode": "On", "windows": [_window_now()]},
        },
        node_specs={
            # free to run, pinned on: idle until work comes, never switched off
            GPU: {
                "power": "On",
                "capacity": {"vcpus": 32, "ram": "128Gi", "gpus": 1, "gpuModel": "a10"},
                "costPerHour": 0.0,
            },
            WARM: {"capacity": cheap_cpu, "costPerHour": DEAR_SIDE},
            FORECAST: {"capacity": cheap_cpu, "costPerHour": DEAR_SIDE},
        },
        config={
            "cloud": cloud,
            "dispatch": {"sync_interval": 2, "sync_interval_at_rest": 2, "probe_tag_interval": 2},
        },
        # queued before the operator starts: its first plan sees the four together
        objects=[secret, *_packed()],
    )
    try:
        yield e
    finally:
        e.close()


def _packed() -> list[dict[str, Any]]:
    """Four 1-vCPU containers: three end first, "kept" runs on."""
    return [
        *(
            container(n, 2501 + i, vcpus=1, ram="1Gi", duration=SHORT_SECONDS)
            for i, n in enumerate(PACKED[:3])
        ),
        container("kept", 2504, vcpus=1, ram="1Gi", duration=KEPT_SECONDS),
    ]


# -- reading ------------------------------------------------------------------------------


def _cds(env: PowerEnv) -> dict[str, dict[str, Any]]:
    items = env.cluster.get_json(env.namespace, "cd")["items"]
    return {c["metadata"]["name"]: c.get("status") or {} for c in items}


def _running(env: PowerEnv, names: list[str]) -> dict[str, dict[str, Any]] | None:
    got = _cds(env)
    done = all((got.get(n) or {}).get("phase") in ("Running", "Complete") for n in names)
    return {n: got[n] for n in names} if done else None


def _wait_running(env: PowerEnv, names: list[str], timeout: float = 30) -> dict[str, Any]:
    return wait_for(  # type: ignore[no-any-return]
        lambda: _running(env, names), timeout=timeout, interval=0.3, what=f"{names} running"
    )


def _status_until(
    env: PowerEnv, node: str, what: str, timeout: float, **want: str
) -> dict[str, Any]:
    """Wait for the WorkerNode's status fields to read `want`; the last status seen is in
    the failure."""
    seen: list[dict[str, Any]] = [{}]

    def reached() -> dict[str, Any] | None:
        seen[0] = env.status(node)
        return seen[0] if all(seen[0].get(k) == v for k, v in want.items()) else None

    try:
        return wait_for(reached, timeout=timeout, interval=0.3, what=what)  # type: ignore[no-any-return]
    except AssertionError as exc:
        keep = ("state", "admission", "readiness", "lastSafetyRecord", "eligibility")
        shown = {k: seen[0].get(k) for k in keep}
        raise AssertionError(f"{exc}; last status of {node}: {shown}") from None


def _intent(env: PowerEnv, node: str, action: str) -> dict[str, Any] | None:
    for i in env.intents(node):
        if i["spec"]["action"] == action and (i.get("status") or {}).get("reasons"):
            return i
    return None


def _reasons(intent: dict[str, Any]) -> list[str]:
    status = intent["status"]
    record = status.get("requestRecord") or status.get("safetyRecord") or {}
    return [*status.get("reasons", []), *record.get("reasons", [])]


def _when(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _class(status: dict[str, Any], key: str, name: str) -> dict[str, Any]:
    for c in (status.get(key) or {}).get("classes") or []:
        if c["name"] == name:
            return c  # type: ignore[no-any-return]
    raise AssertionError(f"no class {name} in status.{key}: {status.get(key)}")


# -- the scenario -------------------------------------------------------------------------


def test_packing_consolidation_gpu_first_warm_window_and_forecast_live(
    started: float, env: PowerEnv
) -> None:
    def lap(what: str) -> None:
        print(f"[{time.monotonic() - started:5.1f} s] {what}", flush=True)

    lap("stub cloud, side nodes and objects ready")

    ns = env.namespace
    # the forecast's memory, where the operator keeps it (restored on its first read)
    env.cluster.kubectl(
        "-n",
        ns,
        "patch",
        "powerpolicy",
        "default",
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": {"forecast": _seeded_forecast(datetime.now(UTC))}}),
    )
    env.start_operator()
    lap("operator up")

    # 4 + 5: the levers wake the Off side nodes of their classes (no container qualifies
    # for those: they are far dearer than a VM)
    warm_wake = wait_for(
        lambda: _intent(env, WARM, "Wake"), timeout=30, interval=0.3, what="warm window wake"
    )
    try:
        forecast_wake = wait_for(
            lambda: _intent(env, FORECAST, "Wake"), timeout=30, interval=0.3, what="forecast wake"
        )
    except AssertionError as exc:
        pp = env.cluster.get_json(ns, "pp", "default").get("status") or {}
        shown = {k: pp.get(k) for k in ("forecast", "warmCapacity", "inForce")}
        raise AssertionError(f"{exc}; policy status: {json.dumps(shown)}") from None
    lap("warm-window and forecast wakes requested")
    # 3: the GPU node comes up ready and open (room for all four) while they wait for
    # their VM to boot
    _status_until(env, GPU, "ready and open", 30, readiness="Ready", admission="Open")
    lap(f"{GPU} ready and open")

    # 1: four small containers queued together -> one new VM for the queue as a whole
    packed = _wait_running(env, PACKED)
    vm_a = packed["kept"]["node"]
    lap(f"packing: {PACKED} on {vm_a}")
    assert {s["node"] for s in packed.values()} == {vm_a}, packed
    assert {s.get("instanceType") for s in packed.values()} == {"cpu8"}, packed
    assert env.node(vm_a)["spec"]["nodeType"] == "CloudVM"
    # 3: not on the GPU node, although it was ready, open, free and had room for them
    # before any of them started (admission opens only once it is verified On and ready)
    gpu = env.status(GPU)
    opened = _when(gpu["powerState"]["admissionSince"])
    first_start = min(_when(s["startedAt"]) for s in packed.values())
    assert gpu["admission"] == "Open" and opened < first_start, (gpu["powerState"], packed)
    assert GPU not in {s["node"] for s in packed.values()}

    # a 6-vCPU container does not fit beside them: a second cpu8; a CPU-only container
    # that nothing without GPUs fits goes to the GPU node
    env.apply_all(
        [
            container("wide", 2505, vcpus=6, ram="4Gi", duration=KEPT_SECONDS + 10),
            container("big", 2506, vcpus=12, ram="8Gi", duration=60),
        ]
    )
    wide = _wait_running(env, ["wide"])["wide"]
    vm_b = wide["node"]
    assert vm_b not in (vm_a, GPU) and wide["instanceType"] == "cpu8", wide
    # 1 (best fit): both VMs have room for one more; the fuller one (6/8 vs 4/8) takes it
    env.apply(container("fits", 2507, vcpus=1, ram="1Gi", duration=2))
    fits = _wait_running(env, ["fits"])["fits"]
    lap(f"best fit: fits on {fits['node']} ({vm_b} 6/8 used, {vm_a} at most 4/8)")
    assert fits["node"] == vm_b, (fits, vm_a, vm_b)

    # 3: the GPU node runs CPU work only, its GPUs idle: it takes GPU work only ...
    assert _wait_running(env, ["big"])["big"]["node"] == GPU
    gpu_only = _status_until(env, GPU, "admission GPUOnly", 20, admission="GPUOnly")
    lap(f"{GPU}: admission GPUOnly, state {gpu_only.get('state')}")
    # ... and still admits it
    env.apply(container("gpu-job", 2508, vcpus=2, ram="4Gi", gpus=1, duration=2))
    assert _wait_running(env, ["gpu-job"])["gpu-job"]["node"] == GPU

    # 2: three of the four end; "kept" alone on vm_a fits beside "wide": drained
    def drain() -> dict[str, Any] | None:
        for i in env.intents(vm_a):
            status = i.get("status") or {}
            if i["spec"]["action"] == "Drain" and status.get("reasons"):
                return i
        return None

    intent = wait_for(drain, timeout=40, interval=0.5, what=f"a consolidation drain of {vm_a}")
    status = intent["status"]
    record = status["safetyRecord"]
    evidence = record["consolidation"]
    lap(f"consolidation: {vm_a} drained: {evidence}")
    assert intent["spec"]["source"] == "Policy"
    assert status["decision"] == "DRAIN" and status["reasons"] == ["CONSOLIDATION_DRAIN"]
    assert status["phase"] in ("InProgress", "Succeeded")
    # kept alone (1 of 8 vCPUs), or with one of the three whose end the ledger had not yet
    # seen (a probe later, on a loaded machine): both fit beside "wide" once "fits" ended
    assert evidence["utilisation"] in (0.125, 0.25) and evidence["hourlyPrice"] == 0.12
    assert evidence["pricePerUsed"] >= 1.5 * evidence["targetPricePerUsed"], evidence
    assert list(evidence["targets"].values()) == [vm_b], evidence
    assert "1 of maxConcurrent 1" in evidence["budget"]
    assert record["drain"]["admission"] in ("Closing", "Closed")
    drained_at = _when(status["startedAt"])
    ended = _cds(env)
    # after the other three ended (but one, if the ledger still counted it); while vm_a
    # was still open when "fits" went to vm_b
    later = [n for n in PACKED[:3] if _when(ended[n]["finishedAt"]) > drained_at]
    assert len(later) <= round(evidence["utilisation"] * 8) - 1, (ended, evidence)
    assert _when(ended["fits"]["startedAt"]) < drained_at, (ended["fits"], status)
    # nothing evicted: it completes where it ran, in one attempt
    kept = wait_for(
        lambda: (s := _cds(env)["kept"]).get("phase") == "Complete" and s,
        timeout=40,
        interval=0.5,
        what="kept complete",
    )
    lap("kept complete")
    assert kept["node"] == vm_a and kept["attempts"] == 1, kept
    assert _when(kept["finishedAt"]) > drained_at, (kept, status)  # it ran on, drained
    assert all(s["attempts"] == 1 for s in _cds(env).values())

    # 4 + 5: the levers' wakes, their nodes up and held, the policy's status naming them
    assert "WARM_WINDOW" in _reasons(warm_wake), warm_wake["status"]
    assert warm_wake["spec"]["source"] == "Policy"
    assert "FORECAST_DEMAND" in _reasons(forecast_wake), forecast_wake["status"]
    # idle far past idleThreshold (4 s), no container ever ran there: held on by the lever
    for node, reason in ((WARM, "WARM_WINDOW"), (FORECAST, "FORECAST_DEMAND")):
        held = env.status(node)
        shown = {k: held.get(k) for k in ("state", "idleSince", "lastSafetyRecord")}
        assert held.get("state") == "Idle", shown
        assert reason in (held.get("lastSafetyRecord") or {}).get("reasons", []), shown
        assert not [s for s in _cds(env).values() if s.get("node") == node]
    pp = env.cluster.get_json(ns, "pp", "default")["status"]
    warm = _class(pp, "warmCapacity", "warm")
    assert warm["target"] == 1 and warm["lever"] == "WarmWindow" and "office" in warm["why"]
    in_force = _class(pp, "inForce", "warm")
    assert "office" in (in_force.get("warmWindow") or ""), in_force
    assert in_force.get("minWarm") == 1, in_force
    # 5: the forecast, from the stored histogram, ahead of demand
    assert pp["forecast"]["state"] == "Forecasting", pp["forecast"]
    assert pp["forecast"]["daysObserved"] >= 2.0
    fc = _class(pp, "warmCapacity", "fc")
    assert fc["target"] == 1 and fc["lever"] == "Forecast", fc
    # ~30 arrivals/h of whole nodes: p80 of the 2-minute boot time's arrivals is 2 nodes,
    # capped at maxWarmNodes 1 (the rate moves a little once an hour boundary is passed)
    assert fc["why"].startswith("forecast: ") and " arrivals/h " in fc["why"], fc
    assert fc["expected"] > 0.9, fc
    elapsed = time.monotonic() - started
    print(f"levers scenario: {elapsed:.1f} s from its stub cloud's start ({load()})", flush=True)
    assert elapsed <= scaled(BUDGET), f"the scenario took {elapsed:.1f} s"
