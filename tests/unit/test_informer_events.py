"""How the informer applies watch lines, without a server: transform, handlers, errors, metrics.

The stream itself (list, watch, resume, relist) is tested against the real API server in
tests/cluster/test_informer.py; here each watch line is handed to the informer directly.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import pytest
from kubernetes_asyncio import client

from nodewarden import __version__
from nodewarden.api.kinds import WORKER_NODE
from nodewarden.kube.informer import ApiStatusError, Expired, Informer, InformerSettings
from nodewarden.kube.useragent import user_agent
from nodewarden.metrics import REGISTRY


@dataclass(frozen=True, slots=True)
class Node:
    name: str
    power: str


def to_node(raw: Mapping[str, Any]) -> Node | None:
    spec = raw.get("spec") or {}
    if spec.get("power") == "Broken":
        raise KeyError("power")
    if spec.get("power") == "Ignore":
        return None
    return Node(raw["metadata"]["name"], spec.get("power", "Auto"))


def obj(name: str, rv: int, power: str = "Auto", written: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "ns", "resourceVersion": str(rv)}
    if written:
        meta["managedFields"] = [{"manager": "m", "time": written}]
    return {"metadata": meta, "spec": {"power": power}}


def line(etype: str, body: Mapping[str, Any]) -> bytes:
    return json.dumps({"type": etype, "object": body}).encode() + b"\n"


@pytest.fixture
async def informer() -> AsyncIterator[Informer[Node]]:
    api = client.ApiClient()
    inf = Informer(api, WORKER_NODE, to_node, namespace="ns", settings=InformerSettings())
    yield inf
    await api.close()


def seen(inf: Informer[Node]) -> list[tuple[str, Node | None, Node | None]]:
    calls: list[tuple[str, Node | None, Node | None]] = []
    inf.add_handler(lambda t, old, new: calls.append((t, old, new)))
    return calls


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, {"kind": "WorkerNode", **labels}) or 0.0


async def test_events_update_the_store_then_call_handlers_in_order(
    informer: Informer[Node],
) -> None:
    calls = seen(informer)
    order: list[int] = []
    informer.add_handler(lambda t, old, new: order.append(len(informer.store)))
    informer._on_line(line("ADDED", obj("a", 5)))
    informer._on_line(line("MODIFIED", obj("a", 6, "On")))
    informer._on_line(line("MODIFIED", obj("a", 7, "On")))  # same model: no handler call
    informer._on_line(line("DELETED", obj("a", 8, "On")))
    assert calls == [
        ("ADDED", None, Node("a", "Auto")),
        ("MODIFIED", Node("a", "Auto"), Node("a", "On")),
        ("DELETED", Node("a", "On"), None),
    ]
    assert order == [1, 1, 0]  # the store already held the change when handlers ran
    assert informer.resource_version == "8"


async def test_a_bookmark_advances_the_resource_version_only(informer: Informer[Node]) -> None:
    calls = seen(informer)
    before = sample("nodewarden_informer_events_total", type="BOOKMARK")
    informer._on_line(line("BOOKMARK", {"metadata": {"resourceVersion": "99"}}))
    assert informer.resource_version == "99" and calls == [] and len(informer.store) == 0
    assert sample("nodewarden_informer_events_total", type="BOOKMARK") == before + 1


async def test_error_events_raise_expired_for_410_and_a_status_error_otherwise(
    informer: Informer[Node],
) -> None:
    gone = {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"}
    with pytest.raises(Expired, match="too old") as expired:
        informer._on_line(line("ERROR", gone))
    assert expired.value.cause == "expired"
    with pytest.raises(ApiStatusError) as other:
        informer._on_line(line("ERROR", {"code": 500, "message": "etcd down"}))
    assert other.value.status == 500


async def test_a_failing_transform_keeps_the_last_good_state(informer: Informer[Node]) -> None:
    calls = seen(informer)
    before = sample("nodewarden_informer_handler_errors_total", stage="transform")
    informer._on_line(line("ADDED", obj("a", 5, "On")))
    informer._on_line(line("MODIFIED", obj("a", 6, "Broken")))
    assert informer.store.get("ns", "a") == Node("a", "On")
    assert informer.resource_version == "6"
    assert len(calls) == 1
    assert sample("nodewarden_informer_handler_errors_total", stage="transform") == before + 1


async def test_a_transform_that_drops_an_object_deletes_it(informer: Informer[Node]) -> None:
    calls = seen(informer)
    informer._on_line(line("ADDED", obj("a", 5)))
    informer._on_line(line("MODIFIED", obj("a", 6, "Ignore")))
    assert calls[-1] == ("DELETED", Node("a", "Auto"), None)
    assert len(informer.store) == 0


async def test_a_failing_handler_does_not_stop_the_others(informer: Informer[Node]) -> None:
    def boom(*_: object) -> None:
        raise RuntimeError("consumer bug")

    informer.add_handler(boom)
    calls = seen(informer)
    informer._on_line(line("ADDED", obj("a", 5)))
    assert len(calls) == 1


async def test_fold_ignores_other_namespaces_and_older_versions(informer: Informer[Node]) -> None:
    calls = seen(informer)
    assert informer.fold(obj("a", 5, "On"))
    assert not informer.fold(obj("a", 4, "Off"))
    other = obj("b", 9)
    other["metadata"]["namespace"] = "elsewhere"
    assert not informer.fold(other)
    assert [c[0] for c in calls] == ["ADDED"]


async def test_lag_is_measured_from_the_last_managed_fields_time() -> None:
    api = client.ApiClient()
    try:
        now = 1_900_000_010.0
        inf = Informer(api, WORKER_NODE, to_node, namespace="ns", clock=lambda: now)
        count = sample("nodewarden_informer_lag_seconds_count")
        total = sample("nodewarden_informer_lag_seconds_sum")
        inf._on_line(line("ADDED", obj("a", 5, written="2030-03-17T17:46:47Z")))
        assert sample("nodewarden_informer_lag_seconds_count") == count + 1
        # 2030-03-17T17:46:47Z is 1_900_000_007 seconds after the epoch
        assert sample("nodewarden_informer_lag_seconds_sum") - total == pytest.approx(3.0)
    finally:
        await api.close()


async def test_the_api_client_is_identified_as_nodewarden(informer: Informer[Node]) -> None:
    headers = informer._custom.api_client.default_headers
    assert headers["User-Agent"] == user_agent() == f"nodewarden/{__version__}"


def test_settings_refuse_nonsense_with_the_field_name() -> None:
    with pytest.raises(ValueError, match="watch_timeout"):
        InformerSettings(watch_timeout=0)
    with pytest.raises(ValueError, match="backoff_initial"):
        InformerSettings(backoff_initial=60, backoff_max=30)
