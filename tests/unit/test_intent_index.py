"""IntentBook's index by node: a node step examines only that node's PowerIntents, however
many the book holds (issue 19, item 6); finished manual intents are deleted only when
that is switched on, after their retention.

The book is fed PowerIntent bodies as the watch delivers them; `CountingIntents` is
instrumentation (it counts every entry of the book's intent map that is looked at), the
fake API stands in for the API server (tests/power run the same book against a real one).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

from nodewarden.power.intents import Intent, IntentBook, ManualRetention

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
NODES = 2_000
PER_NODE = 10  # 20,000 PowerIntents in all


class FakeIntentApi:
    def __init__(self) -> None:
        self.deleted: list[str] = []
        self.patched: list[str] = []

    async def delete(self, kind: Any, namespace: str, name: str) -> bool:
        self.deleted.append(name)
        return True

    async def patch_status(
        self, kind: Any, namespace: str, name: str, status: dict[str, Any]
    ) -> dict[str, Any]:
        self.patched.append(name)
        return {"status": status}


class CountingIntents(dict[str, Intent]):
    """The book's name -> intent map, counting the entries looked at."""

    looked_at = 0

    def __getitem__(self, key: str) -> Intent:
        CountingIntents.looked_at += 1
        return super().__getitem__(key)

    def get(self, key: str, default: Any = None) -> Any:
        CountingIntents.looked_at += 1
        return super().get(key, default)

    def __iter__(self) -> Iterator[str]:
        CountingIntents.looked_at += len(self)
        return super().__iter__()

    def values(self) -> Any:
        CountingIntents.looked_at += len(self)
        return super().values()

    def items(self) -> Any:
        CountingIntents.looked_at += len(self)
        return super().items()

    def keys(self) -> Any:
        CountingIntents.looked_at += len(self)
        return super().keys()


def body(
    name: str,
    node: str,
    *,
    source: str = "Manual",
    action: str = "Shutdown",
    phase: str | None = None,
    created: datetime = T0,
    finished: datetime | None = None,
) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase} if phase else {}
    if finished is not None:
        status["finishedAt"] = finished.isoformat().replace("+00:00", "Z")
    return {
        "metadata": {
            "name": name,
            "creationTimestamp": created.isoformat().replace("+00:00", "Z"),
        },
        "spec": {
            "nodeName": node,
            "action": action,
            "source": source,
            "requestedBy": "nodewarden/x" if source == "Policy" else "alice",
            "reason": "r",
        },
        "status": status,
    }


def fleet_book(api: FakeIntentApi, retention: ManualRetention | None = None) -> IntentBook:
    """2,000 nodes with 10 PowerIntents each: 6 finished manual ones (audit records),
    3 finished policy-made ones, and on every node one live manual Shutdown."""
    book = IntentBook(api, "ns", "x", keep_finished=100, manual_retention=retention)  # type: ignore[arg-type]
    for n in range(NODES):
        node = f"node-{n}"
        for k in range(6):
            at = T0 - timedelta(days=100 - k)
            book.observe(body(f"{node}-audit-{k}", node, phase="Succeeded", finished=at))
        for k in range(3):
            book.observe(body(f"{node}-policy-{k}", node, source="Policy", phase="Succeeded"))
        book.observe(body(f"{node}-live", node, created=T0 + timedelta(minutes=1)))
    return book


def node_step(book: IntentBook, node: str) -> tuple[Intent | None, list[Intent]]:
    """What a node step of the controller asks the book (`_sync_intent`,
    `_reflect_manual`, `_blocked_without_transition`)."""
    return book.active(node), book.waiting(node)


def test_a_node_step_examines_only_that_nodes_intents() -> None:
    book = fleet_book(FakeIntentApi())
    assert len(book.intents) == NODES * PER_NODE
    book.intents = CountingIntents(book.intents)
    CountingIntents.looked_at = 0
    active, waiting = node_step(book, "node-7")
    assert active is not None and active.name == "node-7-live" and waiting == []
    assert CountingIntents.looked_at <= PER_NODE
    # a new manual intent arriving for the node costs the same, and queues behind
    CountingIntents.looked_at = 0
    book.observe(body("node-7-later", "node-7", created=T0 + timedelta(minutes=2)))
    active, waiting = node_step(book, "node-7")
    assert active is not None and active.name == "node-7-live"
    assert [i.name for i in waiting] == ["node-7-later"]
    assert CountingIntents.looked_at <= PER_NODE + 1


def test_the_index_follows_phases_deletes_and_drains() -> None:
    async def scenario() -> None:
        api = FakeIntentApi()
        book = IntentBook(api, "ns", "x")  # type: ignore[arg-type]
        book.observe(body("a", "n", created=T0))
        book.observe(body("b", "n", created=T0 + timedelta(seconds=1)))
        book.observe(body("c", "n", action="Drain", created=T0 + timedelta(seconds=2)))
        book.observe(body("p", "n", source="Policy"))
        assert [i.name for i in book.manual_for("n")] == ["a", "b", "c"]
        assert [i.name for i in book.waiting("n")] == ["b", "c"]
        await book.write(book.intents["a"], {"phase": "Succeeded"})  # our own write
        active = book.active("n")
        assert active is not None and active.name == "b"
        book.observe(body("b", "n", phase="Aborted", created=T0 + timedelta(seconds=1)))
        await book.write(book.intents["c"], {"phase": "Succeeded"})
        active = book.active("n")
        assert active is not None and active.name == "c"  # a drained Drain still holds
        assert book.waiting("n") == []
        book.observe(body("c", "n"), deleted=True)
        assert book.active("n") is None and book.manual_for("n") == []
        assert book.manual_for("other") == []

    asyncio.run(scenario())


def test_finished_manual_intents_are_kept_unless_deletion_is_switched_on() -> None:
    async def scenario() -> None:
        api = FakeIntentApi()
        book = IntentBook(api, "ns", "x")  # type: ignore[arg-type]
        long_ago = T0 - timedelta(days=400)
        book.observe(body("old", "n", phase="Succeeded", finished=long_ago))
        assert await book.expire_manual(T0) == 0
        assert api.deleted == [] and "old" in book.intents

    asyncio.run(scenario())


def test_finished_manual_intents_are_deleted_after_the_retention_when_switched_on() -> None:
    async def scenario() -> None:
        api = FakeIntentApi()
        retention = ManualRetention(delete=True, after=timedelta(days=90))
        book = IntentBook(api, "ns", "x", manual_retention=retention)  # type: ignore[arg-type]
        book.observe(body("old", "n", phase="Succeeded", finished=T0 - timedelta(days=91)))
        book.observe(body("recent", "n", phase="Blocked", finished=T0 - timedelta(days=10)))
        book.observe(
            body(
                "drained", "n", action="Drain", phase="Succeeded", created=T0 - timedelta(days=200)
            )
        )
        book.observe(body("live", "n", created=T0 - timedelta(days=300)))
        book.observe(body("pol", "n", source="Policy", phase="Succeeded"))
        assert await book.expire_manual(T0) == 1
        assert api.deleted == ["old"]
        assert set(book.intents) == {"recent", "drained", "live", "pol"}
        # a live one that finishes is filed then, and its retention counts from then
        await book.write(
            book.intents["live"], {"phase": "Succeeded", "finishedAt": "2026-12-01T12:00:00Z"}
        )
        assert await book.expire_manual(T0 + timedelta(days=80)) == 1  # "recent"
        assert await book.expire_manual(T0 + timedelta(days=90)) == 1  # "live"
        assert api.deleted == ["old", "recent", "live"]
        assert await book.expire_manual(T0 + timedelta(days=999)) == 0  # drain, policy stay

    asyncio.run(scenario())
