"""The informer against the real API server: paged list, ordered events, stale events, bookmarks,
connection cuts, silent connections, 410 Gone + relist diff, errors with back-off, User-Agent.

Faults the API server cannot produce on demand (a cut, refused or silent connection) come
from the loopback proxy in `nodewarden_doubles.tcpproxy`, placed between the informer and
the API server: the client keeps verifying TLS, since the server certificate is issued for
127.0.0.1 and the proxy listens on 127.0.0.1 too. A real 410 comes from the API server
itself: after a CRD's spec changes, the API server rebuilds that resource's storage and
watch cache, and a watch resumed from a resourceVersion older than the new cache is
answered "too old resource version" (the same happens after an API server restart). That
test uses a CRD of its own so the shared nodewarden CRDs are never touched.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from kubernetes_asyncio import client, config

from clusterkit import ClusterHandle
from nodewarden.api.base import GROUP, VERSION
from nodewarden.api.kinds import WORKER_NODE, Kind
from nodewarden.kube.client import Kube
from nodewarden.kube.informer import Informer, InformerSettings
from nodewarden.metrics import REGISTRY
from nodewarden_doubles.tcpproxy import TcpProxy

pytestmark = pytest.mark.cluster

SPEC = {"nodeType": "CloudVM", "controlMethod": "Cloud", "instanceType": "m5.large"}
FAST = InformerSettings(backoff_initial=0.2, backoff_max=2.0)


# --- the compact model and a recorder of handler calls ------------------------------------


@dataclass(frozen=True, slots=True)
class Node:
    namespace: str
    name: str
    step: str | None


def to_node(raw: Mapping[str, Any]) -> Node:
    meta = raw["metadata"]
    return Node(meta["namespace"], meta["name"], (meta.get("labels") or {}).get("step"))


class Seen:
    """Handler that records (type, name, old step, new step) for each call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, str | None, str | None]] = []

    def __call__(self, etype: str, old: Node | None, new: Node | None) -> None:
        node = new or old
        assert node is not None
        self.calls.append((etype, node.name, old and old.step, new and new.step))

    def since(self, mark: int) -> list[tuple[str, str, str | None, str | None]]:
        return self.calls[mark:]


# --- clients: direct, or through the fault proxy -------------------------------------------


async def _configuration(kubeconfig: Path) -> client.Configuration:
    cfg = client.Configuration()
    await config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)
    return cfg


async def api_client(kubeconfig: Path, via: TcpProxy | None = None) -> client.ApiClient:
    """An ApiClient from the kubeconfig; with `via`, every request goes through the proxy.

    TLS stays verified against the cluster CA: the certificate names 127.0.0.1, and the
    proxy only changes the port."""
    cfg = await _configuration(kubeconfig)
    assert cfg.verify_ssl and cfg.ssl_ca_cert, "the test cluster's kubeconfig must verify TLS"
    if via is not None:
        server = urlsplit(cfg.host)
        assert server.hostname == via.target[0] and server.port == via.target[1]
        cfg.host = f"{server.scheme}://{via.listen_host}:{via.port}"
    return client.ApiClient(configuration=cfg)


@pytest.fixture
async def direct(cluster: ClusterHandle) -> AsyncIterator[Kube]:
    api = await api_client(cluster.kubeconfig)
    yield Kube(api, field_manager="informer-test")
    await api.close()


@pytest.fixture
async def proxy(cluster: ClusterHandle) -> AsyncIterator[TcpProxy]:
    server = urlsplit((await _configuration(cluster.kubeconfig)).host)
    assert server.hostname and server.port
    async with TcpProxy(server.hostname, server.port) as p:
        yield p


@asynccontextmanager
async def running(
    kubeconfig: Path,
    namespace: str,
    *,
    via: TcpProxy | None = None,
    kind: Kind = WORKER_NODE,
    settings: InformerSettings = FAST,
) -> AsyncIterator[tuple[Informer[Node], Seen]]:
    api = await api_client(kubeconfig, via)
    informer = Informer(api, kind, to_node, namespace=namespace, settings=settings)
    seen = Seen()
    informer.add_handler(seen)
    informer.start()
    try:
        async with asyncio.timeout(60):
            await informer.wait_synced()
        yield informer, seen
    finally:
        await informer.stop()
        await api.close()


# --- helpers ------------------------------------------------------------------------------


async def until(predicate: Callable[[], Any], what: str, within: float = 30.0) -> Any:
    """Poll `predicate` on the event loop until truthy; fail with `what` after `within` s."""
    deadline = time.monotonic() + within
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within}s waiting for {what}: {value!r}")
        await asyncio.sleep(0.05)


def metric(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def counters(kind: str) -> dict[str, float]:
    """The informer's counters for `kind`, to compare before and after."""
    names = {
        "relist_initial": ("nodewarden_informer_relists_total", {"cause": "initial"}),
        "relist_expired": ("nodewarden_informer_relists_total", {"cause": "expired"}),
        "restart_closed": ("nodewarden_informer_watch_restarts_total", {"cause": "closed"}),
        "restart_error": ("nodewarden_informer_watch_restarts_total", {"cause": "error"}),
        "restart_read_timeout": (
            "nodewarden_informer_watch_restarts_total",
            {"cause": "read_timeout"},
        ),
        "restart_expired": ("nodewarden_informer_watch_restarts_total", {"cause": "expired"}),
        "bookmarks": ("nodewarden_informer_events_total", {"type": "BOOKMARK"}),
        "pages": ("nodewarden_informer_list_pages_total", {}),
        "lag_count": ("nodewarden_informer_lag_seconds_count", {}),
    }
    return {key: metric(name, kind=kind, **extra) for key, (name, extra) in names.items()}


def delta(before: Mapping[str, float], kind: str = "WorkerNode") -> dict[str, float]:
    after = counters(kind)
    return {k: after[k] - before[k] for k in after if after[k] != before[k]}


def rv_of(obj: Mapping[str, Any]) -> int:
    return int(obj["metadata"]["resourceVersion"])


async def create(kube: Kube, ns: str, name: str, step: str = "0", kind: Kind = WORKER_NODE) -> Any:
    body: dict[str, Any] = {"metadata": {"name": name, "labels": {"step": step}}, "spec": SPEC}
    return await kube.create(kind, ns, body)


async def step(kube: Kube, ns: str, name: str, value: str, kind: Kind = WORKER_NODE) -> Any:
    return await kube.patch(kind, ns, name, {"metadata": {"labels": {"step": value}}})


async def gather_limited(jobs: list[Awaitable[Any]], limit: int = 16) -> list[Any]:
    gate = asyncio.Semaphore(limit)

    async def one(job: Awaitable[Any]) -> Any:
        async with gate:
            return await job

    return await asyncio.gather(*(one(j) for j in jobs))


# --- tests --------------------------------------------------------------------------------


async def test_initial_list_is_read_in_pages_and_holds_every_object(
    cluster: ClusterHandle, namespace: str, direct: Kube
) -> None:
    await gather_limited([create(direct, namespace, f"n{i:03}", str(i)) for i in range(120)])
    before = counters("WorkerNode")
    settings = dataclasses.replace(FAST, page_size=25)
    async with running(cluster.kubeconfig, namespace, settings=settings) as (informer, seen):
        assert len(informer.store) == 120
        assert informer.store.get(namespace, "n042") == Node(namespace, "n042", "42")
        assert sorted(c[1] for c in seen.calls) == [f"n{i:03}" for i in range(120)]
        assert {c[0] for c in seen.calls} == {"ADDED"}
        changes = delta(before)
        assert (changes["pages"], changes["relist_initial"]) == (5, 1)
        assert metric("nodewarden_informer_store_objects", kind="WorkerNode") == 120


async def test_adds_changes_and_deletes_arrive_in_order_and_unseen_fields_stay_quiet(
    cluster: ClusterHandle, namespace: str, direct: Kube
) -> None:
    async with running(cluster.kubeconfig, namespace) as (informer, seen):
        before = counters("WorkerNode")
        await create(direct, namespace, "a", "1")
        await step(direct, namespace, "a", "2")
        # a change to a field the model does not keep: the store moves on, no handler call
        await direct.patch(WORKER_NODE, namespace, "a", {"metadata": {"annotations": {"x": "y"}}})
        await create(direct, namespace, "b", "1")
        await direct.delete(WORKER_NODE, namespace, "a")
        last = await step(direct, namespace, "b", "2")
        await until(lambda: informer.resource_version == str(rv_of(last)), "the last event")
        assert seen.calls == [
            ("ADDED", "a", None, "1"),
            ("MODIFIED", "a", "1", "2"),
            ("ADDED", "b", None, "1"),
            ("DELETED", "a", "2", None),
            ("MODIFIED", "b", "1", "2"),
        ]
        assert [k.name for k in informer.store] == ["b"]
        assert informer.store.resource_version(namespace, "b") == str(rv_of(last))
        # lag is observed for every ADDED/MODIFIED the watch delivered (annotation included)
        assert delta(before)["lag_count"] == 5


async def test_a_stale_watch_event_never_overwrites_a_newer_folded_write(
    cluster: ClusterHandle, namespace: str, direct: Kube, proxy: TcpProxy
) -> None:
    await create(direct, namespace, "x", "0")
    async with running(cluster.kubeconfig, namespace, via=proxy) as (informer, seen):
        mark = len(seen.calls)
        proxy.stall()  # the watch delivers nothing until released
        await step(direct, namespace, "x", "1")
        second = await step(direct, namespace, "x", "2")
        assert informer.fold(second)  # what a status write hands back
        assert informer.store.get(namespace, "x") == Node(namespace, "x", "2")
        proxy.unstall()
        # both watch events (step 1, older; step 2, the same version) now arrive
        await until(
            lambda: int(informer.resource_version or 0) >= rv_of(second), "the watch catching up"
        )
        assert informer.store.get(namespace, "x") == Node(namespace, "x", "2")
        assert seen.since(mark) == [("MODIFIED", "x", "0", "2")]
        # a fold of something the watch already saw deleted does not bring it back
        await direct.delete(WORKER_NODE, namespace, "x")
        await until(lambda: len(informer.store) == 0, "the delete")
        assert not informer.fold(second)
        assert len(informer.store) == 0


async def test_bookmarks_advance_the_resource_version_and_watches_resume_without_relist(
    cluster: ClusterHandle, namespace: str, direct: Kube
) -> None:
    other = f"t-{uuid.uuid4().hex[:10]}"
    cluster.kubectl("create", "namespace", other)
    try:
        short = dataclasses.replace(FAST, watch_timeout=3)  # a bookmark 2 s before each end
        async with running(cluster.kubeconfig, namespace, settings=short) as (informer, seen):
            before = counters("WorkerNode")
            # a write the namespaced watch never delivers; only a bookmark can carry its version
            elsewhere = await create(direct, other, "far")
            await until(
                lambda: int(informer.resource_version or 0) >= rv_of(elsewhere),
                "a bookmark past the other namespace's write",
            )
            await until(lambda: delta(before).get("restart_closed", 0) >= 1, "a watch restart")
            near = await create(direct, namespace, "near", "1")
            await until(lambda: informer.store.get(namespace, "near"), "the resumed watch")
            changes = delta(before)
            assert changes["bookmarks"] >= 1
            assert not [k for k in changes if k.startswith("relist")]
            assert seen.calls == [("ADDED", "near", None, "1")]
            assert int(informer.resource_version or 0) >= rv_of(near)
    finally:
        cluster.kubectl("delete", "namespace", other, "--wait=false", check=False)


async def test_a_cut_connection_resumes_without_loss_duplicates_or_relist(
    cluster: ClusterHandle, namespace: str, direct: Kube, proxy: TcpProxy
) -> None:
    for name in ("o1", "o2", "o3"):
        await create(direct, namespace, name, "1")
    async with running(cluster.kubeconfig, namespace, via=proxy) as (informer, seen):
        mark = len(seen.calls)
        before = counters("WorkerNode")
        await proxy.refuse()
        assert proxy.drop_all() >= 1  # the informer's watch connection
        await create(direct, namespace, "o4", "1")
        await step(direct, namespace, "o1", "2")
        await direct.delete(WORKER_NODE, namespace, "o2")
        last = await step(direct, namespace, "o3", "2")
        await until(lambda: delta(before).get("restart_error", 0) >= 2, "refused reconnects")
        await proxy.accept()
        await until(lambda: int(informer.resource_version or 0) >= rv_of(last), "the resumed watch")
        assert seen.since(mark) == [
            ("ADDED", "o4", None, "1"),
            ("MODIFIED", "o1", "1", "2"),
            ("DELETED", "o2", "1", None),
            ("MODIFIED", "o3", "1", "2"),
        ]
        assert sorted(k.name for k in informer.store) == ["o1", "o3", "o4"]
        assert not [k for k in delta(before) if k.startswith("relist")]


async def test_a_silent_connection_is_noticed_by_the_read_timeout(
    cluster: ClusterHandle, namespace: str, direct: Kube, proxy: TcpProxy
) -> None:
    quick = dataclasses.replace(FAST, watch_timeout=120, read_timeout=2, connect_timeout=2)
    async with running(cluster.kubeconfig, namespace, via=proxy, settings=quick) as (
        informer,
        seen,
    ):
        await create(direct, namespace, "before", "1")
        await until(lambda: informer.store.get(namespace, "before"), "the watch streaming")
        before = counters("WorkerNode")
        proxy.stall()  # the connection stays open and says nothing, like a dead peer
        await until(lambda: delta(before).get("restart_read_timeout", 0) >= 1, "a read timeout")
        proxy.unstall()
        proxy.drop_all()  # connections opened during the stall are stuck mid-handshake
        await create(direct, namespace, "after", "1")
        await until(lambda: informer.store.get(namespace, "after"), "the event after recovery")
        assert not [k for k in delta(before) if k.startswith("relist")]
        assert seen.calls == [("ADDED", "before", None, "1"), ("ADDED", "after", None, "1")]


# --- 410 Gone, for real -------------------------------------------------------------------

PROBE = dataclasses.replace(
    WORKER_NODE, kind="InformerProbe", plural="informerprobes", singular="informerprobe"
)


def _probe_crd(description: str) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PROBE.plural}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {"plural": PROBE.plural, "singular": PROBE.singular, "kind": PROBE.kind},
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": description,
                            "x-kubernetes-preserve-unknown-fields": True,
                        }
                    },
                }
            ],
        },
    }


@pytest.fixture(scope="module")
def probe_crd(cluster: ClusterHandle) -> Iterator[Callable[[], None]]:
    """A CRD of this module's own; calling the fixture's value changes its spec, which makes
    the API server rebuild the resource's storage and watch cache."""

    def apply(description: str) -> None:
        cluster.kubectl("apply", "-f", "-", input=json.dumps(_probe_crd(description)))

    apply("informer test probe")
    cluster.kubectl(
        "wait", "--for=condition=Established", "--timeout=60s", f"crd/{PROBE.plural}.{GROUP}"
    )
    yield lambda: apply(f"informer test probe {uuid.uuid4().hex}")
    cluster.kubectl("delete", "crd", f"{PROBE.plural}.{GROUP}", "--wait=false", check=False)


async def _watch_answer(kube: Kube, namespace: str, rv: str) -> int:
    """The HTTP status, or the ERROR event's code, of a watch resumed from `rv` (0: events)."""
    resp = await kube.custom.list_namespaced_custom_object(
        GROUP,
        VERSION,
        namespace,
        PROBE.plural,
        watch=True,
        resource_version=rv,
        timeout_seconds=1,
        _preload_content=False,
    )
    try:
        if resp.status != 200:
            return int(resp.status)
        first = await resp.content.readline()
        event = json.loads(first) if first.strip() else {}
        return int(event.get("object", {}).get("code", 0)) if event.get("type") == "ERROR" else 0
    finally:
        resp.close()


async def test_410_gone_relists_and_reconciles_the_store_by_diff(
    cluster: ClusterHandle,
    namespace: str,
    direct: Kube,
    proxy: TcpProxy,
    probe_crd: Callable[[], None],
) -> None:
    for name in ("p1", "p2", "p3"):
        await create(direct, namespace, name, "1", kind=PROBE)
    async with running(cluster.kubeconfig, namespace, via=proxy, kind=PROBE) as (informer, seen):
        mark = len(seen.calls)
        before = counters(PROBE.kind)
        await proxy.refuse()
        proxy.drop_all()
        resume_from = informer.resource_version
        assert resume_from is not None
        await direct.delete(PROBE, namespace, "p1")
        await step(direct, namespace, "p2", "2", kind=PROBE)
        await direct.patch(PROBE, namespace, "p3", {"metadata": {"annotations": {"x": "y"}}})
        await create(direct, namespace, "p4", "1", kind=PROBE)
        await asyncio.to_thread(probe_crd)
        # the API server now answers 410 for the informer's resourceVersion (429 while the
        # rebuilt watch cache initialises)
        await until_async(lambda: _watch_answer(direct, namespace, resume_from), 410)
        await proxy.accept()
        await until(lambda: delta(before, PROBE.kind).get("relist_expired"), "the relist")
        assert sorted(seen.since(mark)) == [
            ("ADDED", "p4", None, "1"),
            ("DELETED", "p1", "1", None),
            ("MODIFIED", "p2", "1", "2"),
        ]  # p3 changed only in a field the model does not keep: no event
        assert sorted(k.name for k in informer.store) == ["p2", "p3", "p4"]
        assert delta(before, PROBE.kind)["restart_expired"] == 1
        # and the watch goes on from the new list
        await step(direct, namespace, "p3", "2", kind=PROBE)
        await until(lambda: informer.store.get(namespace, "p3") == Node(namespace, "p3", "2"), "p3")


async def until_async(probe: Callable[[], Awaitable[int]], want: int, within: float = 30) -> None:
    deadline = time.monotonic() + within
    answers: list[int] = []
    while time.monotonic() < deadline:
        answers.append(await probe())
        if answers[-1] == want:
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"the API server never answered {want}; answers: {answers}")


# --- errors and identity ------------------------------------------------------------------


async def test_api_errors_back_off_and_never_stop_the_loop(
    cluster: ClusterHandle, namespace: str
) -> None:
    missing = dataclasses.replace(WORKER_NODE, kind="NoSuchKind", plural="nosuchkinds")
    api = await api_client(cluster.kubeconfig)
    informer = Informer(api, missing, to_node, namespace=namespace, settings=FAST)

    def failures() -> float:
        return metric(
            "nodewarden_informer_errors_total",
            kind="NoSuchKind",
            operation="list",
            **{"class": "http_404"},
        )

    start, base = time.monotonic(), failures()
    task = informer.start()
    try:
        await until(lambda: failures() - base >= 3, "three failed LISTs")
        elapsed = time.monotonic() - start
        # two pauses in between: at least half of 0.2 s and half of 0.4 s (downward jitter)
        assert elapsed >= 0.3, f"3 attempts in {elapsed:.2f}s: no back-off"
        assert not task.done() and not informer.synced.is_set()
    finally:
        await informer.stop()
        await api.close()
    assert task.cancelled()


async def test_requests_carry_nodewardens_user_agent(
    cluster: ClusterHandle, namespace: str
) -> None:
    api = await api_client(cluster.kubeconfig)
    try:
        Informer(api, WORKER_NODE, to_node, namespace=namespace)  # sets the header on `api`
        # the API server names a write's field manager after the User-Agent when none is given
        created = await client.CustomObjectsApi(api).create_namespaced_custom_object(
            GROUP,
            VERSION,
            namespace,
            WORKER_NODE.plural,
            {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "WorkerNode",
                "metadata": {"name": "ua"},
                "spec": SPEC,
            },
        )
        managers = {m["manager"] for m in created["metadata"]["managedFields"]}
        assert managers == {"nodewarden"}, managers
    finally:
        await api.close()
