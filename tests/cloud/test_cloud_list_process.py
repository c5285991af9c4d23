"""The cloud list through a worker process (cloud/listproc.py) against a stub cloud
server: the operator gets the whole list with fresh list times, only changes cross from
the process, a missed reply makes the next one full, an in-memory cloud, a process
that cannot start and one still starting list in the thread."""

from __future__ import annotations

import functools
from concurrent.futures import Future
from datetime import timedelta

from cloud.cloud_peers import (
    MutableClock,
    OperatorKey,
    StubCloudFactory,
    create,
    remote_facade,
    stub_facade,
)
from nodewarden.cloud.facade import CloudFacade
from nodewarden.cloud.libcloudset import LibcloudInstanceSet
from nodewarden.cloud.listproc import ProcessListLayer
from nodewarden.cloud.tags import TagKeys
from nodewarden.scheduling.instancetypes import InstanceType
from nodewarden_doubles.stubcloud.process import StubCloudProcess


def _process_layer(facade: CloudFacade) -> ProcessListLayer | None:
    layer = facade._managed
    while not isinstance(layer, ProcessListLayer | LibcloudInstanceSet):
        layer = layer.inner  # type: ignore[attr-defined]
    return layer if isinstance(layer, ProcessListLayer) else None


async def test_only_changes_cross_from_the_process_and_every_instance_comes_back(
    stub_server: StubCloudProcess, operator_key: OperatorKey
) -> None:
    clock = MutableClock()
    facade = remote_facade(stub_server, dispatcher="disp-proc", clock=clock)
    layer = _process_layer(facade)
    assert layer is not None and layer.in_process
    try:
        assert await layer.started()
        made = [(await create(facade, "small", operator_key, name=f"wn-p{i}"))[0] for i in range(3)]
        first = await facade.list_managed_instances()
        assert layer.last_reply == (True, len(first), 0)  # the first reply: the whole list
        ours = {i.id for i in first if i.tags.get(facade.tag_keys.dispatcher) == "disp-proc"}
        assert ours == {m.id for m in made}
        clock.advance(30)
        again = await facade.list_managed_instances()
        assert layer.last_reply == (False, 0, 0)  # nothing changed: nothing crossed
        assert {i.id for i in again} == {i.id for i in first}
        # stamped with this list's time (when the process read it, on the operator's clock)
        assert all(clock() - timedelta(seconds=5) <= i.observed_at <= clock() for i in again)
        await facade.set_tags(made[0], {facade.tag_keys.node: "wn-p0", "team": "x"})
        await facade.destroy(made[1])
        changed = await facade.list_managed_instances()
        assert layer.last_reply == (False, 1, 1)
        by_id = {i.id: i for i in changed}
        assert by_id[made[0].id].tags["team"] == "x" and made[1].id not in by_id
        layer._generation = -7  # a reply the operator never applied
        await facade.list_managed_instances()
        assert layer.last_reply is not None and layer.last_reply[0]  # full again
        await facade.destroy(made[0])
        await facade.destroy(made[2])
    finally:
        await facade.close()


async def test_an_in_memory_stub_cloud_lists_in_the_thread(
    stub_cloud_factory: StubCloudFactory, catalogue: list[InstanceType]
) -> None:
    facade = stub_facade(stub_cloud_factory(), catalogue)
    assert _process_layer(facade) is None
    await facade.close()


def _no_driver() -> object:
    raise RuntimeError("no driver in this process")


async def test_a_process_that_cannot_start_falls_back_to_the_thread(
    stub_server: StubCloudProcess,
) -> None:
    facade = remote_facade(stub_server, dispatcher="disp-fallback")
    layer = _process_layer(facade)
    assert layer is not None
    broken = ProcessListLayer(
        layer.inner,
        functools.partial(_no_driver),
        {"image": "x", "catalogue": [], "tag_keys": TagKeys()},
    )
    try:
        assert not await broken.started()
        listed = {i.id for i in await broken.list_instances()}
        assert listed == {i.id for i in await layer.inner.list_instances()}
        assert not broken.in_process
    finally:
        await broken.close()
        await facade.close()


async def test_lists_go_through_the_thread_until_the_process_has_started(
    stub_server: StubCloudProcess, operator_key: OperatorKey
) -> None:
    """The dispatcher's start-up recovery waits for the first list: it must not wait for
    the worker process's spawn (seconds on a loaded machine)."""
    facade = remote_facade(stub_server, dispatcher="disp-early")
    layer = _process_layer(facade)
    assert layer is not None
    try:
        made, _ = await create(facade, "small", operator_key, name="wn-early")
        starting: Future[bool] = Future()  # the process has not answered yet
        layer._ready = starting
        early = await facade.list_managed_instances()
        assert made.id in {i.id for i in early}
        assert layer.last_reply is None  # nothing came from the process
        starting.set_result(True)
        assert await layer.started()
        await facade.list_managed_instances()
        assert layer.last_reply is not None and layer.last_reply[0]  # its first: full
        assert layer.in_process
        await facade.destroy(made)
    finally:
        await facade.close()
