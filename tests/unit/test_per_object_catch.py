"""One object never stops the others (in process, an in-memory API): an error nobody foresaw
while handling one object -- here injected where a real bug would sit -- marks that object
with a condition, and the policy book, the power round, the WorkerNode validation and the
resync go on with every other object (the power round's status flush included)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import pytest

from memkube import MemoryKube
from nodewarden.api.kinds import POWER_INTENT, POWER_POLICY, WORKER_NODE
from nodewarden.config import OperatorConfig
from nodewarden.credentials import CredentialResolver
from nodewarden.credentials.settings import CredentialsConfig
from nodewarden.fleet import policies as policy_book
from nodewarden.fleet.board import PowerBoard
from nodewarden.fleet.policies import PolicyBook
from nodewarden.fleet.status import NodeStatusWriter
from nodewarden.handlers import validation as handlers
from nodewarden.handlers.context import HandlerContext
from nodewarden.ownership import DISPATCHER_LABEL
from nodewarden.power import round as power
from nodewarden.power import validation as power_validation
from nodewarden.power.control import PowerControl
from nodewarden.power.controller import PowerController
from nodewarden.power.runtime import ControllerSettings

NS = "ns"
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _bomb(original: Any, marker: str) -> Any:
    """`original`, raising for the object whose name or spec mentions `marker`."""

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        if marker in repr(args) + repr(kwargs):
            raise OverflowError("date value out of range")
        return original(*args, **kwargs)

    return wrapped


def _policy(name: str, **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": NS, "generation": 1}, "spec": spec}


def side_node(name: str) -> dict[str, Any]:
    return {
        # this install's node (an unlabelled side node is claimed first: test_ownership)
        "metadata": {"name": name, "namespace": NS, "labels": {DISPATCHER_LABEL: "d"}},
        "spec": {
            "nodeType": "SideNode",
            "controlMethod": "None",
            "ssh": {"address": "127.0.0.1"},
            "capacity": {"vcpus": 2, "ram": "4Gi"},
        },
    }


def test_the_policy_book_survives_a_bug_on_one_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        policy_book, "validate_powerpolicy", _bomb(policy_book.validate_powerpolicy, "'9h'")
    )
    book = PolicyBook(namespace=NS, default_name="default")
    book.observe(_policy("bad", idleThreshold="9h"))
    book.observe(_policy("default", idleThreshold="1h"))
    assert "OverflowError" in book.policies["bad"].view.problems[0]
    assert book.policies["default"].view.problems == ()
    assert book.default_problem is None


def controller(
    kube: MemoryKube,
    book: PolicyBook | None = None,
    ssh_endpoints: tuple[str, ...] = ("127.0.0.1",),
    clock_at: datetime = T0,
) -> PowerController:
    """A power controller on the in-memory API with a fixed clock (`book`: a default
    policy only, unless given)."""
    credentials = CredentialResolver(
        kube,  # type: ignore[arg-type]
        NS,
        CredentialsConfig(ssh_endpoints=list(ssh_endpoints)),
    )
    if book is None:
        book = PolicyBook(namespace=NS, default_name="default")
        book.observe(_policy("default"))
    return PowerController(
        kube=kube,  # type: ignore[arg-type]
        namespace=NS,
        dispatcher_id="d",
        default_policy="default",
        credentials=credentials,
        policies=book,
        pool=None,
        board=PowerBoard(),
        status=NodeStatusWriter(kube, NS),  # type: ignore[arg-type]
        control=PowerControl(credentials, None, None, lambda: clock_at),
        settings=ControllerSettings(),
        clock=lambda: clock_at,
        acknowledge_admission=True,
    )


async def settle(ctrl: PowerController) -> None:
    while ctrl._tasks:
        await asyncio.gather(*list(ctrl._tasks), return_exceptions=True)


async def test_a_power_step_that_raises_marks_its_node_and_the_round_goes_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    original = power.step
    monkeypatch.setattr(power, "step", _bomb(original, "node='bad'"))
    kube = MemoryKube()
    ctrl = controller(kube)
    for name in ("bad", "good"):
        ctrl.observe_node(kube.put(WORKER_NODE, NS, side_node(name)))
    await settle(ctrl)
    await ctrl.round()  # must not raise
    await settle(ctrl)
    failed = kube.condition(WORKER_NODE, NS, "bad", "Reconciled")
    assert failed["status"] == "False" and failed["reason"] == "ProcessingFailed"
    assert "OverflowError: date value out of range" in failed["message"]
    good = kube.status(WORKER_NODE, NS, "good")
    assert good.get("state")  # the good node's status was flushed in the same round
    assert not kube.condition(WORKER_NODE, NS, "good", "Reconciled")
    # the bug is fixed: the node is stepped normally again and says so
    monkeypatch.setattr(power, "step", original)
    ctrl.nodes["bad"].due_at = T0
    await ctrl.round()
    await settle(ctrl)
    assert kube.condition(WORKER_NODE, NS, "bad", "Reconciled")["status"] == "True"


async def test_workernode_validation_that_raises_marks_that_node(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(
        power_validation,
        "validate_workernode",
        _bomb(power_validation.validate_workernode, "'127.0.0.9'"),
    )
    kube = MemoryKube()
    ctrl = controller(kube)
    bad = side_node("bad")
    bad["spec"]["ssh"]["address"] = "127.0.0.9"
    ctrl.observe_node(kube.put(WORKER_NODE, NS, bad))
    ctrl.observe_node(kube.put(WORKER_NODE, NS, side_node("good")))
    await settle(ctrl)
    await ctrl.round()
    await settle(ctrl)
    valid = kube.condition(WORKER_NODE, NS, "bad", "Valid")
    assert valid["status"] == "False" and valid["reason"] == "ProcessingFailed"
    good = kube.condition(WORKER_NODE, NS, "good", "Valid")
    assert good and good["reason"] != "ProcessingFailed"  # judged on its own merits


class Fleet:
    def node_names(self) -> set[str]:
        return {"n1"}

    def policy_users(self) -> dict[str, int]:
        return {}

    async def synced(self) -> None:
        return None

    async def node_exists(self, name: str) -> bool:
        return name == "n1"


async def test_resync_marks_the_object_that_raises_and_judges_the_others(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(
        handlers, "validate_powerpolicy", _bomb(handlers.validate_powerpolicy, "'7h'")
    )
    kube = MemoryKube()
    ctx = HandlerContext(
        config=OperatorConfig(),
        kube=kube,  # type: ignore[arg-type]
        credentials=None,  # type: ignore[arg-type]
        clock=lambda: T0,
    )
    kube.put(POWER_POLICY, NS, _policy("a-bad", idleThreshold="7h"))
    kube.put(POWER_POLICY, NS, _policy("b-good"))
    intent = {
        "metadata": {"name": "i1", "namespace": NS},
        "spec": {"nodeName": "n1", "action": "Shutdown"},
    }
    kube.put(POWER_INTENT, NS, intent)
    await handlers.resync_once(ctx, NS, Fleet())
    bad = kube.condition(POWER_POLICY, NS, "a-bad", "Valid")
    assert bad["status"] == "False" and bad["reason"] == "ProcessingFailed"
    assert kube.condition(POWER_POLICY, NS, "b-good", "Valid")["status"] == "True"
    assert kube.condition(POWER_INTENT, NS, "i1", "Valid")["status"] == "True"
    # the kopf handler's path marks it the same way and returns normally
    body = await kube.get(POWER_POLICY, NS, "a-bad")
    assert body is not None
    work = handlers.reconcile_powerpolicy(ctx, body, 0)
    verdict = await handlers.guarded(ctx, POWER_POLICY, body, work)
    assert verdict.reason == "ProcessingFailed"
