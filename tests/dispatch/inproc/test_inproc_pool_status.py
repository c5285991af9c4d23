"""The pool's WorkerNode status fields (`NodeStore.contribute_statuses`) are handed to
the one status writer only when they or the server's status changed: a dispatcher
round over an unchanged fleet costs no comparison in the writer, and what a write or a
watch event brings is compared again (a field someone else overwrote is written back).

Counted, not timed: the calls the real `NodeStatusWriter` gets, and what it queues."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any, cast

from nodewarden.fleet.status import NodeStatusWriter
from nodewarden.kube.client import Kube
from nodewarden.pool.context import PoolContext
from nodewarden.pool.nodes import NodeStore
from nodewarden.pool.worker import Worker

T0 = datetime(2026, 1, 1, tzinfo=UTC)


class CountingWriter(NodeStatusWriter):
    def __init__(self) -> None:
        super().__init__(cast(Kube, None), "nw")
        self.calls: list[str] = []

    def contribute(self, name: str, fields: Mapping[str, Any]) -> bool:
        self.calls.append(name)
        return super().contribute(name, fields)

    def pending(self, name: str) -> dict[str, Any]:
        return dict(self._nodes[name].pending)


def _body(name: str, rv: int, status: dict[str, Any]) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "resourceVersion": str(rv)},
        "spec": {"nodeType": "SideNode"},
        "status": status,
    }


def _store(names: list[str]) -> tuple[NodeStore, CountingWriter]:
    writer = CountingWriter()
    workers = {}
    for name in names:
        w = Worker(name=name, instance_type=None, created_at=T0, side=True)
        w.body = _body(name, 1, {})
        workers[name] = w
        writer.observe(name, _body(name, 1, {}))
    ctx = SimpleNamespace(status=writer, workers=workers, dispatcher_id="disp-a", cloud=None)
    return NodeStore(cast(PoolContext, ctx), cast(Any, None), cast(Any, None)), writer


def test_unchanged_fields_against_an_unchanged_server_status_are_not_handed_over() -> None:
    store, writer = _store(["n1", "n2", "n3"])
    held = {"n1": ["c1"], "n2": ["c2", "c3"]}
    store.contribute_statuses(held)
    assert sorted(writer.calls) == ["n1", "n2", "n3"]
    assert writer.pending("n2")["runningContainers"] == 2
    writer.calls.clear()
    for _ in range(5):  # idle dispatcher rounds: nothing moved
        store.contribute_statuses(held)
    assert writer.calls == []
    # a container more on n1: only n1 is handed over, with the new count
    store.contribute_statuses({**held, "n1": ["c1", "c4"]})
    assert writer.calls == ["n1"]
    assert writer.pending("n1")["runningContainers"] == 2


def test_a_new_server_status_is_compared_again() -> None:
    store, writer = _store(["n1"])
    store.contribute_statuses({"n1": ["c1"]})
    sent = writer.pending("n1")
    # the write landed (the server now holds the fields): nothing is pending
    writer.observe("n1", _body("n1", 2, sent))
    assert writer.pending("n1") == {}
    writer.calls.clear()
    store.contribute_statuses({"n1": ["c1"]})
    assert writer.calls == ["n1"] and writer.pending("n1") == {}
    # someone else overwrote the count: the same fields are handed over and queued again
    writer.observe("n1", _body("n1", 3, {**sent, "runningContainers": 7}))
    writer.calls.clear()
    store.contribute_statuses({"n1": ["c1"]})
    assert writer.calls == ["n1"]
    assert writer.pending("n1") == {"runningContainers": 1}
