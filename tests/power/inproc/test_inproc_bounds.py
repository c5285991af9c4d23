"""Bounds, in process: every transition has a deadline, a retry budget and a back-off; at
the deadline nothing is invented (never OFF without an observed Off, never work on a
node whose ready probe never passed); refused and failed requests are bounded too."""

from __future__ import annotations

import itertools
from datetime import timedelta

from harness import POLICY, PowerHarness
from powerfakes import BMC_SPEC

from nodewarden.api.kinds import WORKER_NODE


def seen(h: PowerHarness, node: str) -> set[str]:
    return {code for _, codes in h.history(node) for code in codes}


async def test_a_bmc_that_never_applies_the_reset_gets_bounded_resends_then_block() -> None:
    async with PowerHarness() as h:
        h.side_node("n1", applies=False)
        await h.start()
        await h.run_until(lambda: h.decision("n1") == "BLOCK", within=600, tick=2.0)
        sent = h.control.sent("n1", "GracefulShutdown")
        assert 2 <= len(sent) <= 1 + POLICY["retry"]["budget"], sent
        assert [r.attempt for r in sent] == list(range(1, len(sent) + 1))
        gaps = [b.at - a.at for a, b in itertools.pairwise(sent)]
        assert all(gap >= timedelta(seconds=5) for gap in gaps), gaps  # back-off
        assert {"DEADLINE_EXCEEDED", "RETRY_BUDGET_EXHAUSTED"} & set(h.reasons("n1"))
        assert h.state("n1") != "Off"
        await h.run_for(120, tick=4.0)
        assert len(h.control.sent("n1", "GracefulShutdown")) == len(sent)  # no more


async def test_a_rejected_request_is_not_retried_as_if_it_might_work() -> None:
    async with PowerHarness() as h:
        h.side_node("n1")
        h.control.answers["GracefulShutdown"] = ["rejected"] * 10
        await h.start()
        await h.run_until(lambda: bool(h.control.requests), within=200)
        await h.run_for(200, tick=2.0)
        assert "REQUEST_REJECTED" in seen(h, "n1"), h.history("n1")
        assert len(h.control.sent("n1")) <= 1 + POLICY["retry"]["budget"]
        assert h.state("n1") != "Off"


async def test_an_errored_request_is_retried_after_the_backoff() -> None:
    async with PowerHarness() as h:
        h.side_node("n1")
        h.control.answers["GracefulShutdown"] = ["errored"]
        await h.start()
        await h.run_until(lambda: h.state("n1") == "Off", within=400)
        first, second = h.control.sent("n1", "GracefulShutdown")
        assert (first.attempt, second.attempt) == (1, 2)
        assert first.transition_id == second.transition_id
        assert second.at - first.at >= timedelta(seconds=5)
        assert "REQUEST_ERRORED" in seen(h, "n1")


async def test_a_woken_node_whose_ready_probe_never_passes_gets_no_work_and_blocks() -> None:
    async with PowerHarness() as h:
        h.side_node("n1", power="Off", ready=False)
        await h.start()
        await h.run_until(lambda: h.state("n1") == "Off", within=60)
        h.queue("gpu-job", gpus=1, wake="n1")
        opened: list[str] = []

        def blocked() -> bool:
            if h.status("n1").get("admission") == "Open":
                opened.append(str(h.clock()))
            return h.decision("n1") == "BLOCK"

        await h.run_until(blocked, within=600, tick=2.0, what="BLOCK after the ready deadline")
        assert not opened
        assert h.hosts["n1"].power == "On"
        assert "DEADLINE_EXCEEDED" in h.reasons("n1") or "READY_PROBE_FAILED" in h.reasons("n1")
        assert h.status("n1")["readiness"] != "Ready"


async def test_a_wake_that_is_never_observed_keeps_waking_within_its_deadline_then_blocks() -> None:
    async with PowerHarness() as h:
        h.side_node("n1", power="Off", applies=False)
        await h.start()
        await h.run_until(lambda: h.state("n1") == "Off", within=60)
        h.queue("gpu-job", gpus=1, wake="n1")
        await h.run_until(lambda: bool(h.control.requests), within=60)
        await h.run_for(30)
        assert h.state("n1") == "Waking"  # within the deadline: still waking, not invented
        await h.run_until(lambda: h.decision("n1") == "BLOCK", within=600, tick=2.0)
        assert len(h.control.sent("n1", "On")) <= 1 + POLICY["retry"]["budget"]
        assert h.status("n1").get("admission") != "Open"


async def test_a_node_whose_bmc_secret_is_missing_is_marked_and_the_others_served() -> None:
    async with PowerHarness() as h:
        h.side_node("good")
        missing = {"name": "no-such-secret", "key": "username"}
        h.side_node(
            "bad", spec={"bmc": {**BMC_SPEC, "systemId": "bad", "usernameSecretRef": missing}}
        )
        h.hosts["bad"].allowable = None  # the real adapter refuses: nothing to discover
        await h.start()
        await h.run_until(lambda: h.state("good") == "Off", within=300)
        valid = h.kube.condition(WORKER_NODE, "ns", "bad", "Valid")
        assert valid["status"] == "False" and "no-such-secret" in valid["message"]
        assert any(e["name"] == "bad" and "no-such-secret" in e["message"] for e in h.events())
        assert not h.control.sent("bad")
