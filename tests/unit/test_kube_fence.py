"""The Kubernetes writes' fence: every status write carries the writer's token and none
is sent without valid leadership; the API server refusing a lower token ends leadership.

The CEL rule itself is checked against the real API server in tests/cluster/test_crds.py.
"""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from fencekit import Clock, held
from nodewarden.api.kinds import WORKER_NODE
from nodewarden.dispatch.queue import ContainerQueue
from nodewarden.kube.client import FencedOut, Kube


class FakeCustom:
    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []

    async def patch_namespaced_custom_object_status(self, *args: Any, **kw: Any) -> dict[str, Any]:
        body = args[5]
        self.bodies.append(body)
        return {"metadata": {"name": args[4], "namespace": args[2], "resourceVersion": "9"}, **body}

    async def patch_namespaced_custom_object(self, *args: Any, **kw: Any) -> dict[str, Any]:
        self.bodies.append(args[5])
        return {"metadata": {"name": args[4]}}


def refusal() -> ApiException:
    exc = ApiException(status=422, reason="Invalid")
    exc.body = '{"message": "status.fence: a lower fencing token than the one recorded"}'
    return exc


@pytest.fixture
async def kube() -> Kube:
    k = Kube(client.ApiClient(client.Configuration()))
    k.custom = FakeCustom()  # type: ignore[assignment]
    return k


async def test_status_writes_carry_the_token_and_stop_with_leadership(kube: Kube) -> None:
    lead = held(12, Clock(), "nodewarden-d")
    kube.fence = lead
    await kube.patch_status(WORKER_NODE, "ns", "wn-1", {"state": "Idle"})
    custom: FakeCustom = kube.custom  # type: ignore[assignment]
    assert custom.bodies[-1] == {"status": {"state": "Idle", "fence": {"nodewarden-d": 12}}}
    lead.step_down("lost")
    sent = len(custom.bodies)
    with pytest.raises(FencedOut, match="not sent"):
        await kube.patch_status(WORKER_NODE, "ns", "wn-1", {"state": "Off"})
    with pytest.raises(FencedOut):
        await kube.patch(WORKER_NODE, "ns", "wn-1", {"metadata": {"labels": {"a": "b"}}})
    assert len(custom.bodies) == sent  # nothing was sent
    await kube.close()


async def test_a_refused_token_ends_leadership(kube: Kube) -> None:
    lead = held(3, Clock(), "nodewarden-d")
    kube.fence = lead

    async def refuse(*args: Any, **kw: Any) -> dict[str, Any]:
        raise refusal()

    kube.custom.patch_namespaced_custom_object_status = refuse  # type: ignore[method-assign]
    with pytest.raises(FencedOut, match="newer fencing token"):
        await kube.patch_status(WORKER_NODE, "ns", "wn-1", {"state": "Idle"})
    assert lead.lost_reason is not None and "newer fencing token" in lead.lost_reason
    await kube.close()


async def test_the_container_queue_writes_carry_the_token_too(kube: Kube) -> None:
    kube.fence = held(4, Clock(), "nodewarden-d")
    queue = ContainerQueue(kube=kube, namespace="ns", dispatcher_id="d")
    queue.observe(
        {
            "metadata": {"name": "c", "namespace": "ns", "resourceVersion": "3", "uid": "u-1"},
            "spec": {"uuid": "zzzzz-dz642-000000000000001"},
        }
    )
    container = queue.by_name["c"]
    assert container.uid == "u-1"
    assert await queue.write(container, {"phase": "Queued"})
    custom: FakeCustom = kube.custom  # type: ignore[assignment]
    assert custom.bodies[-1]["status"]["fence"] == {"nodewarden-d": 4}
    await kube.close()
