"""Leader election against the real API server: who acts, when a replica says "standby",
and that two replicas whose wall clocks disagree never both act."""

from __future__ import annotations

import asyncio
import glob
import json
import shutil
import signal
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from clusterkit import ClusterHandle, OperatorProcess, start_operator, wait_for
from dispatchkit import apply_many, container
from nodewarden.kube.client import api_client_from
from nodewarden.kube.lease import LeaderElector
from nodewarden.ownership import DISPATCHER_LABEL
from powerkit import FAST_POWER_POLICY, PowerEnv, side_node_entry

pytestmark = pytest.mark.cluster


async def test_standby_is_reported_only_after_a_lease_attempt_sees_another_holder(
    cluster: ClusterHandle, namespace: str
) -> None:
    api_a = await api_client_from(cluster.kubeconfig)
    api_b = await api_client_from(cluster.kubeconfig)
    a = LeaderElector(api_a, namespace, "lease-roles", "a", lease_duration=15, retry_interval=0.2)
    b = LeaderElector(api_b, namespace, "lease-roles", "b", lease_duration=15, retry_interval=0.2)
    calls: dict[str, int] = {"a": 0, "b": 0}
    try:
        # a lone replica takes the free lease and is never told to stand by
        assert await a.acquire(on_standby=lambda: calls.__setitem__("a", calls["a"] + 1))
        assert calls["a"] == 0 and a.is_leader

        stop = asyncio.Event()
        waiting = asyncio.ensure_future(
            b.acquire(stop, on_standby=lambda: calls.__setitem__("b", calls["b"] + 1))
        )
        await asyncio.sleep(1.0)  # several attempts, all refused
        assert not waiting.done()
        assert calls["b"] == 1  # once, not once per attempt
        assert not b.is_leader

        # a clean stop of the holder hands the lease over at once
        await a.release()
        assert await asyncio.wait_for(waiting, timeout=5)
        assert b.is_leader and calls["b"] == 1
    finally:
        await b.release()
        await api_a.close()
        await api_b.close()


def test_a_status_write_with_a_lower_fencing_token_is_refused(
    cluster: ClusterHandle, namespace: str
) -> None:
    """The CRDs' CEL rule on `status.fence` (per Lease, never lowered, never dropped)."""
    node = {
        "apiVersion": "nodewarden.io/v1alpha1",
        "kind": "WorkerNode",
        "metadata": {"name": "fenced"},
        "spec": {"nodeType": "CloudVM", "instanceType": "m5.large"},
    }
    cluster.kubectl("-n", namespace, "apply", "-f", "-", input=json.dumps(node))

    def write(fence: dict[str, int | None]) -> subprocess.CompletedProcess[str]:
        patch = json.dumps({"status": {"state": "Idle", "fence": fence}})
        return cluster.kubectl(
            "-n", namespace, "patch", "wn", "fenced", "--subresource=status",
            "--type=merge", "-p", patch, check=False,
        )  # fmt: skip

    assert write({"nodewarden-a": 5}).returncode == 0
    stale = write({"nodewarden-a": 4})
    assert stale.returncode != 0 and "lower fencing token" in stale.stderr
    assert write({"nodewarden-a": 5}).returncode == 0  # the same leader again
    assert write({"nodewarden-b": 1}).returncode == 0  # another install's Lease: not compared
    assert write({"nodewarden-a": None}).returncode != 0  # a token cannot be dropped
    assert write({"nodewarden-a": 6}).returncode == 0
    fence = cluster.get_json(namespace, "wn", "fenced")["status"]["fence"]
    assert fence == {"nodewarden-a": 6, "nodewarden-b": 1}


# -- never two actors: skewed replicas, and two installs in one namespace ----------------

LIBFAKETIME = next(iter(sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))), None)
SKEW = "+90s"  # far more than the Lease duration: a wall-clock comparison would take over
LEASE = {"lease_duration": 8, "renew_interval": 2, "retry_interval": 0.5}
MARGIN = LEASE["lease_duration"] / 3
GPU_CONTAINERS = 4
FOREIGN = "zzzzz-dz642-000000000000801"
OWNERLESS = "zzzzz-dz642-000000000000802"
NO_GPU = {"capacity": {"vcpus": 16, "ram": "64Gi", "gpus": 0}}


def _readyz(op: OperatorProcess) -> dict[str, Any]:
    try:
        _status, body = op.get("/readyz")
        return dict(json.loads(body))
    except (OSError, ValueError):
        return {}


def _skewed() -> dict[str, str]:
    """libfaketime moves the wall clock only: the monotonic clock is left alone."""
    assert LIBFAKETIME is not None
    return {"LD_PRELOAD": LIBFAKETIME, "FAKETIME": SKEW, "DONT_FAKE_MONOTONIC": "1"}


class RoleLog:
    """Polls the replicas' /readyz in the background: when each was first seen leading."""

    def __init__(self) -> None:
        self.first_led: dict[int, float] = {}
        self.seen: dict[int, str] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def watch(self, ops: list[OperatorProcess]) -> None:
        def poll() -> None:
            while not self._stop.is_set():
                for op in ops:
                    role = _readyz(op).get("role")
                    if role is not None:
                        self.seen[id(op)] = str(role)
                    if role == "leader":
                        self.first_led.setdefault(id(op), time.monotonic())
                self._stop.wait(0.1)

        self._ops = ops
        self._thread = threading.Thread(target=poll, daemon=True)
        self._thread.start()

    def pair(self) -> tuple[OperatorProcess, OperatorProcess] | None:
        """(leader, standby) once one leads and the other stands by."""
        a, b = self._ops
        roles = (self.seen.get(id(a)), self.seen.get(id(b)))
        if set(roles) != {"leader", "standby"}:
            return None
        return (a, b) if roles[0] == "leader" else (b, a)

    def first(self, op: OperatorProcess) -> float | None:
        """When `op` was first seen leading (None: not yet)."""
        return self.first_led.get(id(op))

    def led(self, op: OperatorProcess) -> float:
        """When `op` was first seen leading (inf: never)."""
        return self.first_led.get(id(op), float("inf"))

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)


def _condition(status: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in status.get("conditions") or [] if c["type"] == kind), {})


def _metric(op: OperatorProcess, name: str) -> float | None:
    for line in op.get("/metrics")[1].splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


@pytest.mark.slow
@pytest.mark.skipif(LIBFAKETIME is None, reason="libfaketime not installed (faketime package)")
def test_never_two_actors_with_skewed_clocks_or_two_installs_in_one_namespace(
    cluster: ClusterHandle, namespace: str, tmp_path: Path
) -> None:
    """Install alpha runs two replicas, one with its wall clock 90 s ahead; install beta
    runs one, in the same namespace. Side nodes: a-gpu, a-idle and a-stray are alpha's,
    b-node is beta's, `shared` is unlabelled (claimed by one of them). On a-stray run a
    runner of beta's and one naming no owner (each holds the whole node for alpha's ledger:
    a-gpu, free, takes the work).

    - Whichever alpha replica leads, the other never takes over while it renews; once
      the leader is killed (no release) the other acts within Lease duration + margin
      (a standby whose clock is ahead must not take over early, one whose clock is
      behind must not wait for the skew). Evidence at the targets: a-gpu's run ledger
      (each start's fencing token), the BMCs' resets (User-Agent: dispatcher, replica).
    - Each install acts only on its own nodes (BMC User-Agents; only its Lease's token in
      `status.fence`) and kills no runner it does not own; the owner-less runner is
      reported (RunnersOwned, nodewarden_unowned_runners); the node they run on is never
      switched off."""
    owners = {"a-gpu": "alpha", "a-idle": "alpha", "b-node": "beta"}
    stray = "a-stray"
    env = PowerEnv.create(
        cluster,
        namespace,
        tmp_path,
        [side_node_entry(n) for n in ("a-gpu", "a-idle", stray, "b-node", "shared")],
        node_specs={
            "a-gpu": {"policyRef": {"name": "busy"}},
            "a-idle": NO_GPU,
            stray: NO_GPU,
            "b-node": NO_GPU,
            "shared": NO_GPU,
        },
        labels={
            node: {DISPATCHER_LABEL: owner} for node, owner in {**owners, stray: "alpha"}.items()
        },
        objects=[
            {
                "apiVersion": "nodewarden.io/v1alpha1",
                "kind": "PowerPolicy",
                "metadata": {"name": "busy"},
                "spec": {**FAST_POWER_POLICY, "idleThreshold": "1h"},
            }
        ],
    )
    roles = RoleLog()
    try:
        configs: dict[str, Path] = {}
        for install in ("alpha", "beta"):
            env.write_config({"dispatcher_id": install, "leader_election": LEASE})
            configs[install] = tmp_path / f"{install}.yaml"
            shutil.copy(env.config_path, configs[install])
        env.side.admin.start_run(stray, {"uuid": FOREIGN, "runtime": {}}, dispatcher_id="beta")
        env.side.admin.start_run(stray, {"uuid": OWNERLESS, "runtime": {}})
        replicas = [("alpha-0", "alpha", None), ("alpha-skewed", "alpha", _skewed())]
        with ThreadPoolExecutor(3) as pool:  # all at once: either alpha replica may lead
            started = list(
                pool.map(
                    lambda spec: start_operator(
                        cluster,
                        namespace,
                        tmp_path,
                        f"--config={configs[spec[1]]}",
                        name=spec[0],
                        env=spec[2],
                    ),
                    [*replicas, ("beta", "beta", None)],
                )
            )
        env.operators.extend(started)
        alphas = started[:2]
        roles.watch(alphas)
        lead, standby = wait_for(roles.pair, timeout=60, what="one alpha leader, one standby")
        lead_id, standby_id = _readyz(lead)["identity"], _readyz(standby)["identity"]
        apply_many(
            env,
            [
                container(f"g{i}", 900 + i, vcpus=8, gpus=1, duration=0.5)
                for i in range(GPU_CONTAINERS)
            ],
        )

        def alpha_runs() -> list[dict[str, Any]]:
            return [r for r in env.side.admin.runs("a-gpu") if r["dispatcherId"] == "alpha"]

        wait_for(alpha_runs, timeout=60, interval=0.1, what="alpha's leader runs work")
        lead.stop(signal.SIGKILL)
        killed = time.monotonic()
        took = wait_for(lambda: roles.first(standby), timeout=30, what="takeover") - killed
        assert took <= LEASE["lease_duration"] + MARGIN + 1.0, f"took over after {took:.1f}s"

        def done() -> bool:
            phases = [
                (c.get("status") or {}).get("phase")
                for c in cluster.get_json(namespace, "cd")["items"]
            ]
            return phases.count("Complete") == GPU_CONTAINERS

        wait_for(done, timeout=120, interval=1, what="every container Complete")
        owners["shared"] = wait_for(
            lambda: (env.node("shared")["metadata"].get("labels") or {}).get(DISPATCHER_LABEL),
            timeout=30,
            what="the shared side node claimed",
        )
        for node in ("a-idle", "b-node", "shared"):
            env.wait_state(node, "Off", timeout=60)
        wait_for(
            lambda: _condition(env.status(stray), "RunnersOwned").get("status") == "False",
            timeout=60,
            what=f"{stray}: RunnersOwned False",
        )
        unowned = _metric(standby, "nodewarden_unowned_runners")
        runs = env.side.admin.runs("a-gpu")
        stray_runs = env.side.admin.runs(stray)
        resets = {n: env.resets(n) for n in [*owners, stray]}
        statuses = {n: env.status(n) for n in [*owners, stray]}
        logs = {op.log_path.stem: op.logs() for op in started}
    finally:
        roles.stop()
        env.close()

    # the standby never led while the leader was alive (old code: a standby whose wall
    # clock is ahead took the Lease at once, one behind waited out the skew)
    assert roles.led(standby) > killed, "took the Lease from a live leader"
    assert roles.led(lead) < killed
    ours = [r for r in runs if r["dispatcherId"] == "alpha"]
    assert sorted(r["uuid"] for r in ours) == sorted(
        f"zzzzz-dz642-{900 + i:015d}" for i in range(GPU_CONTAINERS)
    ), "every container ran exactly once"
    tokens = sorted({r["fence"] for r in ours})
    assert len(tokens) == 2 and tokens[1] == tokens[0] + 1, tokens
    before = [r["startedAt"] for r in ours if r["fence"] == tokens[0]]
    after = [r["startedAt"] for r in ours if r["fence"] == tokens[1]]
    assert max(before) < min(after), "both alpha replicas started runners: two actors"
    assert min(after) - killed <= LEASE["lease_duration"] + MARGIN + 5.0, "acted late"
    # runners alpha does not own were neither killed nor adopted; one is reported
    others = {r["uuid"]: r for r in stray_runs}
    assert others[FOREIGN]["end"] is None and others[OWNERLESS]["end"] is None, others
    assert not any("killing runner" in text for text in logs.values())
    assert OWNERLESS in _condition(statuses[stray], "RunnersOwned")["message"]
    assert unowned == 1.0
    assert not resets[stray], "runners we do not own run there: never switched off"
    assert not [r for r in stray_runs if r["dispatcherId"] == "alpha"], "a full node got work"
    # every node was acted on by its owner only; alpha's replicas one after the other
    assert resets["a-idle"] and resets["b-node"] and resets["shared"]
    assert not resets["a-gpu"], "a-gpu runs work: never switched off"
    for node, owner in owners.items():
        agents = {r["user_agent"] for r in resets[node]}
        assert all(f"dispatcher={owner}" in ua for ua in agents), (node, agents)
        assert set(statuses[node].get("fence") or {}) == {f"nodewarden-{owner}"}, node
        if owner == "alpha":
            assert all(r["at"] < killed for r in resets[node] if lead_id in r["user_agent"])
            assert all(r["at"] > killed for r in resets[node] if standby_id in r["user_agent"])
    claims = [name for name, text in logs.items() if "claimed unlabelled side node shared" in text]
    assert len(claims) == 1 and claims[0].startswith(owners["shared"]), claims
