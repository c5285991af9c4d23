"""Shared pieces of the sharding tests on the real control plane (`test_shard_cluster`,
`test_resharding_cluster`): API clients (direct, or through a loopback proxy a test can
black-hole), shard electors with short Leases, the power control over the hollow BMCs,
and `Replica` -- an in-process composition that balances shard Leases, observes its
shards' WorkerNodes, acts on them continuously, and RELEASEs the nodes it is told to
drain (`shards.release`)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from kubernetes_asyncio import client, config

from calibration import scaled
from clusterkit import ClusterHandle
from nodewarden.api.kinds import WORKER_NODE
from nodewarden.credentials import CredentialResolver
from nodewarden.credentials.settings import CredentialsConfig
from nodewarden.fence import Leadership, Unfenced
from nodewarden.kube.client import Kube
from nodewarden.ownership import DISPATCHER_LABEL
from nodewarden.power.control import NodeRef, PowerControl, RequestErrored
from nodewarden.shards.elector import ShardElector
from nodewarden.shards.keys import SHARD_LABEL
from nodewarden.shards.release import run_releases
from nodewarden.shards.scope import ShardedPowerControl, ShardScope
from nodewarden_doubles.hollow import HollowBmcSecrets, HollowFleet, side_node_spec
from nodewarden_doubles.hollow.bmc import bmc_transports
from nodewarden_doubles.tcpproxy import TcpProxy

SHARDS = 4
DURATION = 6.0
MARGIN = 2.0
NODES = [f"node-{i:02d}" for i in range(20)]
DISPATCHER = "nw"


async def api_client(kubeconfig: Path, via: TcpProxy | None = None) -> client.ApiClient:
    cfg = client.Configuration()
    await config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)
    if via is not None:
        server = urlsplit(cfg.host)
        cfg.host = f"{server.scheme}://{via.listen_host}:{via.port}"
    return client.ApiClient(configuration=cfg)


def electors(
    api: client.ApiClient, namespace: str, replica: str, shards: int = SHARDS
) -> ShardElector:
    return ShardElector(
        api,
        namespace,
        DISPATCHER,
        replica,
        shards,
        lease_duration=DURATION,
        renew_interval=1.0,
        retry_interval=0.5,
        margin=MARGIN,
    )


def power_control(fleet: HollowFleet, replica: str, scope: ShardScope | None) -> PowerControl:
    resolver = CredentialResolver(
        HollowBmcSecrets(), "ns", CredentialsConfig(bmc_endpoints=["127.0.0.1:9"], secret_ttl="0s")
    )
    args = (resolver, None, None, lambda: datetime.now(tz=UTC))
    kwargs = {
        "user_agent": f"nodewarden/0.1.0 (power; dispatcher={DISPATCHER}; replica={replica})",
        "bmc_transport": bmc_transports(fleet),
    }
    if scope is None:
        return PowerControl(*args, fence=Unfenced(), **kwargs)  # type: ignore[arg-type]
    return ShardedPowerControl(scope, *args, **kwargs)


@dataclass
class Replica:
    name: str
    api: client.ApiClient
    namespace: str
    fleet: HollowFleet
    shards: int = SHARDS
    believed: set[int] = field(default_factory=set)
    """The shards this replica believes it holds (told by the elector); a partitioned
    replica keeps believing until its own Leadership tells it otherwise."""
    fenced_out: int = 0
    moves: int = 0
    """Shards acquired or released so far (a window with none is a stable ownership)."""
    deaf: bool = False
    """Set at the cut: the act path no longer hears the elector's releases (it has not
    yet seen them), so only the fence stops it -- the case the fence is for."""
    lagging: bool = False
    """Its node view stops updating (a watch that lags): it keeps acting on what it saw."""
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.kube = Kube(self.api, field_manager=f"shard-test-{self.name}")
        self.elector = electors(self.api, self.namespace, self.name, self.shards)
        self.elector.on_acquired = self._acquired
        self.elector.on_released = self._released
        self.scope = ShardScope(self.elector.leadership)
        self.control = power_control(self.fleet, self.name, self.scope)

    def _acquired(self, shard: int, _: Leadership) -> None:
        self.believed.add(shard)
        self.scope.acquired(shard)
        self.moves += 1

    def _released(self, shard: int, _: str) -> None:
        self.moves += 1
        if not self.deaf:
            self.believed.discard(shard)
            self.scope.released(shard)

    def start(self, stop: asyncio.Event) -> None:
        self.tasks = [
            asyncio.create_task(self.elector.run(stop)),
            asyncio.create_task(self._observe(stop)),
            asyncio.create_task(self._act(stop)),
            asyncio.create_task(
                run_releases(self.kube, self.namespace, self.scope, self.sharded, stop, 0.2)
            ),
        ]

    @property
    def sharded(self) -> ShardedPowerControl:
        assert isinstance(self.control, ShardedPowerControl)
        return self.control

    def owns(self, name: str) -> bool:
        """It would act on node `name` now: its view puts the node in a shard it believes
        it holds, and that shard's Leadership is valid."""
        shard = self.scope.shard_of(name)
        return shard is not None and shard in self.believed and shard in self.elector.held

    async def _observe(self, stop: asyncio.Event) -> None:
        """The replica's node view: its shards' nodes, by a label-selected list each."""
        while not stop.is_set():
            for shard in sorted(self.believed) if not self.lagging else ():
                with contextlib.suppress(Exception):
                    async with asyncio.timeout(1.0):
                        selector = f"{SHARD_LABEL}={shard}"
                        for body in await self.kube.list(
                            WORKER_NODE, self.namespace, label_selector=selector
                        ):
                            self.scope.observe(body)
            await asyncio.sleep(0.3)

    async def _act(self, stop: asyncio.Event) -> None:
        """Decide every node of every believed shard: one power request each turn."""
        turn = 0
        while not stop.is_set():
            turn += 1
            action = "GracefulShutdown" if turn % 2 else "On"
            for name in sorted(NODES):
                if self.scope.shard_of(name) not in self.believed:
                    continue
                ref = NodeRef(name, side_node_spec(name))
                outcome = await self.control.request(ref, f"{self.name}-{turn}", 1, action)
                if isinstance(outcome, RequestErrored) and outcome.source == "fence":
                    self.fenced_out += 1
            await asyncio.sleep(0.2)

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await self.control.close()


def side_node_body(name: str, **labels: str) -> dict[str, Any]:
    return {
        "apiVersion": "nodewarden.io/v1alpha1",
        "kind": "WorkerNode",
        "metadata": {"name": name, "labels": labels},
        "spec": side_node_spec(name).model_dump(mode="json", by_alias=True, exclude_none=True),
    }


def workernodes(cluster: ClusterHandle, namespace: str) -> None:
    items = [side_node_body(name, **{DISPATCHER_LABEL: DISPATCHER}) for name in NODES]
    body = {"apiVersion": "v1", "kind": "List", "items": items}
    cluster.kubectl("-n", namespace, "apply", "-f", "-", input=json.dumps(body))


@contextlib.asynccontextmanager
async def proxied(kubeconfig: Path) -> AsyncIterator[TcpProxy]:
    cfg = client.Configuration()
    await config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)
    server = urlsplit(cfg.host)
    assert server.hostname and server.port
    async with TcpProxy(server.hostname, server.port) as proxy:
        yield proxy


async def until(predicate: Callable[[], object], within: float, what: str) -> float:
    """Wait (on the loop: the predicates read the replicas' state) until `predicate`
    holds; the monotonic time it was first seen to. `within` is scaled."""
    deadline = time.monotonic() + scaled(within)
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {scaled(within):.1f}s waiting for {what}")
        await asyncio.sleep(0.05)
    return time.monotonic()


def lease_holders(cluster: ClusterHandle, namespace: str) -> dict[str, str]:
    leases = cluster.get_json(namespace, "lease", "-l", f"{DISPATCHER_LABEL}={DISPATCHER}")
    return {
        lease["metadata"]["name"]: lease["spec"].get("holderIdentity") or ""
        for lease in leases["items"]
    }
