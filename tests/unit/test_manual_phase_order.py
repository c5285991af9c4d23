"""A manual intent's finishing phase is final from the moment it is decided, not from the
moment its write lands (in process, an in-memory API whose PowerIntent status writes are
slowed: a fake delay, what a loaded API server does).

Seen in CI (`test_demo`): the example's manual Shutdown of a node that cannot be reached
was decided Blocked, then -- its write still in flight, so the intent not yet finished --
a later step decided Pending; the writes landed in that order and the intent stayed
Pending for good (no step reflects a finished intent again)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from test_per_object_catch import NS, T0, controller, settle, side_node

from memkube import MemoryKube
from nodewarden.api.kinds import POWER_INTENT, WORKER_NODE
from nodewarden.policy.machine import Step
from nodewarden.power import recording as power_recording
from nodewarden.power import round as power


class SlowIntentWrites(MemoryKube):
    """PowerIntent status writes take a while to land (a fake delay)."""

    async def patch_status(self, kind: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        if kind is POWER_INTENT:
            await asyncio.sleep(0.05)
        return await super().patch_status(kind, *args, **kwargs)


async def test_a_finishing_phase_decided_is_never_replaced_by_a_later_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    decided = iter(["Blocked", "Pending", "Pending"])
    monkeypatch.setattr(power_recording, "manual_phase", lambda *_: next(decided))
    steps: list[Step] = []
    original = power.step

    def recording(*args: Any, **kwargs: Any) -> Step:
        steps.append(original(*args, **kwargs))
        return steps[-1]

    monkeypatch.setattr(power, "step", recording)
    kube = SlowIntentWrites()
    ctrl = controller(kube)
    intent = {
        "metadata": {"name": "off", "namespace": NS, "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {
            "nodeName": "n1",
            "action": "Shutdown",
            "source": "Manual",
            "requestedBy": "oncall@example.org",
            "reason": "maintenance",
        },
    }
    ctrl.observe_intent(kube.put(POWER_INTENT, NS, intent))
    ctrl.observe_node(kube.put(WORKER_NODE, NS, side_node("n1")))
    await ctrl.round()  # the first step decided with the intent: Blocked, write in flight
    rt = ctrl.nodes["n1"]
    assert rt.facts.intent is not None and rt.facts.intent.name == "off"
    ctrl._round.recorder.reflect_manual(rt, steps[-1], None, T0)  # a later step: Pending
    await settle(ctrl)
    assert kube.status(POWER_INTENT, NS, "off")["phase"] == "Blocked"
