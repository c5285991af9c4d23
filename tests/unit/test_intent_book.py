"""IntentBook: finished policy-made PowerIntents of a deleted WorkerNode (a destroyed VM)
are kept for `keep_intents_of_gone_nodes`, then deleted (a person's intents and those of
live nodes stay); the status writes of one intent land in the order they were asked for.
The fakes stand in for the API server, which runs the same book in tests/power and
tests/dispatch."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

from nodewarden.power.intents import IntentBook

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


class FakeIntentApi:
    def __init__(self) -> None:
        self.deleted: list[str] = []

    async def delete(self, kind: Any, namespace: str, name: str) -> bool:
        self.deleted.append(name)
        return True


def intent(name: str, node: str, source: str, phase: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "creationTimestamp": "2026-11-30T11:00:00Z"},
        "spec": {
            "nodeName": node,
            "action": "Shutdown",
            "source": source,
            "requestedBy": "nodewarden/x" if source == "Policy" else "alice",
            "reason": "r",
        },
        "status": {"phase": phase},
    }


def test_intents_of_a_gone_node_are_deleted_after_the_grace() -> None:
    async def scenario() -> None:
        api = FakeIntentApi()
        book = IntentBook(api, "ns", "x")  # type: ignore[arg-type]
        book.observe(intent("vm1-a", "vm1", "Policy", "Succeeded"))
        book.observe(intent("vm1-b", "vm1", "Policy", "InProgress"))
        book.observe(intent("vm1-manual", "vm1", "Manual", "Succeeded"))
        book.observe(intent("vm2-a", "vm2", "Policy", "Succeeded"))
        keep = timedelta(hours=1)
        assert await book.expire_gone({"vm2"}, T0, keep) == 0  # vm1 just went
        assert await book.expire_gone({"vm2"}, T0 + timedelta(minutes=59), keep) == 0
        assert await book.expire_gone({"vm2"}, T0 + timedelta(hours=1), keep) == 1
        assert api.deleted == ["vm1-a"]
        assert set(book.intents) == {"vm1-b", "vm1-manual", "vm2-a"}

    asyncio.run(scenario())


def test_a_node_that_comes_back_starts_the_grace_again() -> None:
    async def scenario() -> None:
        api = FakeIntentApi()
        book = IntentBook(api, "ns", "x")  # type: ignore[arg-type]
        book.observe(intent("n-a", "n", "Policy", "Succeeded"))
        keep = timedelta(minutes=10)
        await book.expire_gone(set(), T0, keep)
        await book.expire_gone({"n"}, T0 + timedelta(minutes=5), keep)  # back
        assert await book.expire_gone(set(), T0 + timedelta(minutes=12), keep) == 0
        assert await book.expire_gone(set(), T0 + timedelta(minutes=22), keep) == 1

    asyncio.run(scenario())


class SlowFirstStatusApi:
    """Fake status subresource whose first patch takes longer than the second (two
    requests in flight at once would land in the wrong order)."""

    def __init__(self) -> None:
        self.status: dict[str, Any] = {}
        self.calls = 0

    async def patch_status(
        self, kind: Any, namespace: str, name: str, status: dict[str, Any]
    ) -> dict[str, Any]:
        self.calls += 1
        await asyncio.sleep(0.05 if self.calls == 1 else 0.0)
        self.status.update(status)
        return {"status": self.status}


def test_writes_of_one_intent_land_in_the_order_they_were_asked_for() -> None:
    async def scenario() -> None:
        api = SlowFirstStatusApi()
        book = IntentBook(api, "ns", "x")  # type: ignore[arg-type]
        book.observe(intent("m", "n", "Manual", "Pending"))
        current = book.intents["m"]
        first = asyncio.ensure_future(book.write(current, {"phase": "Pending", "reasons": ["A"]}))
        second = asyncio.ensure_future(book.write(current, {"phase": "Blocked", "reasons": ["B"]}))
        await asyncio.gather(first, second)
        assert api.status == {"phase": "Blocked", "reasons": ["B"]}
        assert book.intents["m"].phase == "Blocked"

    asyncio.run(scenario())
