"""Fuzzing in process with objects drawn from the CRD schemas (`e2e/crdfuzz`): thousands of
hostile specs through the models, the validation, the policy book, the power round and
the resync. Nothing may raise, every object is judged, and the known-good objects mixed
in keep being served (an operator that marked everything invalid would fail here).

NODEWARDEN_FUZZ_EXAMPLES scales every test's examples (default 1 = the CI amount).
"""

from __future__ import annotations

import asyncio
import os
import time
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_per_object_catch import controller

from crdfuzz.schema import body, spec_strategy
from memkube import MemoryKube
from nodewarden.api.containerdispatch import ContainerDispatchSpec
from nodewarden.api.kinds import POWER_INTENT, POWER_POLICY, WORKER_NODE
from nodewarden.api.powerintent import PowerIntentSpec
from nodewarden.api.powerpolicy import PowerPolicySpec
from nodewarden.api.workernode import WorkerNodeSpec
from nodewarden.config import OperatorConfig
from nodewarden.fleet.policies import PolicyBook
from nodewarden.handlers.context import HandlerContext
from nodewarden.handlers.validation import resync_once
from nodewarden.ownership import DISPATCHER_LABEL
from nodewarden.policy.view import PolicyView
from nodewarden.power.controller import PowerController
from nodewarden.validation import (
    Verdict,
    parse_spec,
    validate_containerdispatch,
    validate_powerintent,
    validate_powerpolicy,
    validate_workernode,
)

NS = "ns"
T0 = datetime(2026, 12, 1, tzinfo=UTC)
SCALE = float(os.environ.get("NODEWARDEN_FUZZ_EXAMPLES", "1"))


def examples(n: int) -> Any:
    return settings(
        max_examples=max(1, int(n * SCALE)),
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )


def judge(kind: str, spec: Any) -> Verdict:
    """What the operator does with one spec of `kind` before acting on it."""
    if kind == "WorkerNode":
        parsed = parse_spec(WorkerNodeSpec, spec)
        if isinstance(parsed, Verdict):
            return parsed
        return validate_workernode(
            parsed, namespace=NS, policies={"default"}, default_policy="default"
        )
    if kind == "PowerPolicy":
        policy = parse_spec(PowerPolicySpec, spec)
        if isinstance(policy, Verdict):
            return policy
        PolicyView.from_spec(policy, name="p", generation=1)
        return validate_powerpolicy(policy)
    if kind == "PowerIntent":
        intent = parse_spec(PowerIntentSpec, spec)
        if isinstance(intent, Verdict):
            return intent
        return validate_powerintent(intent, namespace=NS, nodes={"n1"})
    container = parse_spec(ContainerDispatchSpec, spec)
    if isinstance(container, Verdict):
        return container
    return validate_containerdispatch(container)


COUNTS: dict[str, int] = {}


@pytest.mark.parametrize("kind", ["WorkerNode", "PowerPolicy", "PowerIntent", "ContainerDispatch"])
@pytest.mark.parametrize("hostile", [False, True], ids=["admitted", "hostile"])
def test_models_and_validation_judge_any_spec_without_raising(kind: str, hostile: bool) -> None:
    verdicts: list[Verdict] = []
    started = time.perf_counter()

    @examples(300)
    @given(spec_strategy(kind, hostile=hostile))
    def one(spec: Any) -> None:
        verdict = judge(kind, spec)
        assert isinstance(verdict, Verdict)
        assert verdict.valid or verdict.message  # an invalid object is told why
        verdicts.append(verdict)

    one()
    took = time.perf_counter() - started
    print(f"{kind} {'hostile' if hostile else 'admitted'}: {len(verdicts)} in {took:.1f}s")
    assert verdicts


def good_node(name: str = "good") -> dict[str, Any]:
    return body(WORKER_NODE.kind, name, {"nodeType": "CloudVM", "instanceType": "small"}, NS)


async def settle(ctrl: PowerController) -> None:
    for _ in range(20):
        if not ctrl._tasks:
            return
        await asyncio.gather(*list(ctrl._tasks), return_exceptions=True)


@examples(200)
@given(
    st.lists(spec_strategy("PowerPolicy", hostile=True), max_size=3),
    st.lists(spec_strategy("PowerPolicy", hostile=False), max_size=2),
)
def test_the_policy_book_takes_any_policy_and_keeps_the_default(
    hostile: list[Any], admitted: list[Any]
) -> None:
    book = PolicyBook(namespace=NS, default_name="default")
    book.observe(body(POWER_POLICY.kind, "default", {"maxNodes": 5}, NS))
    for i, spec in enumerate([*hostile, *admitted]):
        book.observe(body(POWER_POLICY.kind, f"p{i}", spec, NS))
    assert book.default_problem is None
    limits, stopped = book.create_limits()
    assert stopped is None and limits is not None and limits.max_nodes == 5
    for i in range(len(hostile) + len(admitted)):
        assert book.for_node(f"p{i}").view is not None


@examples(100)
@given(
    st.lists(spec_strategy("WorkerNode", hostile=True), min_size=1, max_size=3),
    spec_strategy("PowerPolicy", hostile=True),
)
def test_the_power_round_steps_any_node_and_serves_the_good_one(
    nodes: list[Any], policy: Any
) -> None:
    async def run() -> None:
        kube = MemoryKube()
        book = PolicyBook(namespace=NS, default_name="default")
        book.observe(body(POWER_POLICY.kind, "default", {}, NS))
        book.observe(body(POWER_POLICY.kind, "hostile", policy, NS))
        ctrl = controller(kube, book, ssh_endpoints=(), clock_at=T0)
        ctrl.observe_policy(body(POWER_POLICY.kind, "hostile", policy, NS))
        ctrl.observe_node(kube.put(WORKER_NODE, NS, good_node()))
        for i, spec in enumerate(nodes):
            if isinstance(spec, dict) and i % 2:
                spec = {**spec, "policyRef": {"name": "hostile"}}
            node = body(WORKER_NODE.kind, f"n{i}", spec, NS)
            # this install's node (an unlabelled side node is claimed first: test_ownership)
            node["metadata"]["labels"] = {DISPATCHER_LABEL: "d"}
            ctrl.observe_node(kube.put(WORKER_NODE, NS, node))
        await settle(ctrl)
        await ctrl.round()
        await settle(ctrl)
        await ctrl.round()
        await settle(ctrl)
        valid = kube.condition(WORKER_NODE, NS, "good", "Valid")
        assert valid.get("status") == "True", kube.status(WORKER_NODE, NS, "good")
        for i in range(len(nodes)):  # every node is judged, none left without a verdict
            assert kube.condition(WORKER_NODE, NS, f"n{i}", "Valid"), i
        await ctrl.stop()

    asyncio.run(run())


@examples(100)
@given(
    st.lists(spec_strategy("PowerPolicy", hostile=True), max_size=3),
    st.lists(spec_strategy("PowerIntent", hostile=True), max_size=3),
)
def test_resync_judges_every_object_and_serves_the_good_ones(
    policies: list[Any], intents: list[Any]
) -> None:
    class Fleet:
        def node_names(self) -> set[str]:
            return {"good"}

        def policy_users(self) -> dict[str, int]:
            return {"default": 1}

        async def synced(self) -> None:
            return None

        async def node_exists(self, name: str) -> bool:
            return name == "good"

    async def run() -> None:
        kube = MemoryKube()
        ctx = HandlerContext(
            config=OperatorConfig(),
            kube=kube,  # type: ignore[arg-type]
            credentials=None,  # type: ignore[arg-type]
            clock=lambda: T0,
        )
        kube.put(POWER_POLICY, NS, body(POWER_POLICY.kind, "default", {"maxNodes": 3}, NS))
        for i, spec in enumerate(policies):
            kube.put(POWER_POLICY, NS, body(POWER_POLICY.kind, f"p{i}", spec, NS))
        good = {"nodeName": "good", "action": "Shutdown", "source": "Manual"}
        kube.put(POWER_INTENT, NS, body(POWER_INTENT.kind, "good-intent", good, NS))
        for i, spec in enumerate(intents):
            kube.put(POWER_INTENT, NS, body(POWER_INTENT.kind, f"i{i}", spec, NS))
        await resync_once(ctx, NS, Fleet())
        assert kube.condition(POWER_POLICY, NS, "default", "Valid")["status"] == "True"
        assert kube.condition(POWER_INTENT, NS, "good-intent", "Valid")["status"] == "True"
        for i in range(len(policies)):
            assert kube.condition(POWER_POLICY, NS, f"p{i}", "Valid")
        for i in range(len(intents)):
            assert kube.condition(POWER_INTENT, NS, f"i{i}", "Valid")

    asyncio.run(run())
