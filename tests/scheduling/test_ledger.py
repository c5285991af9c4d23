"""The capacity ledger rule (`scheduling.ledger`) and how the scheduler places from it:
what holds a node in every phase, relocks placed like any placement, overflow, unknown
runners, and nodes found running more than they hold."""

from __future__ import annotations

from datetime import UTC, datetime

from nodewarden.api.containerdispatch import ContainerResources
from nodewarden.scheduling.instancetypes import Catalogue, InstanceType, InstanceTypePolicy
from nodewarden.scheduling.ledger import Claim, Ledger, Placement, account, with_starts
from nodewarden.scheduling.scheduler import plan
from nodewarden.scheduling.views import (
    Capacity,
    CloudState,
    ContainerView,
    Limits,
    NodeState,
    NodeView,
    Phase,
    Plan,
)

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
GI = 2**30
SMALL = InstanceType(name="small", provider_type="s", vcpus=2, ram=8 * GI, price=0.10)
POLICY = InstanceTypePolicy(ram_overhead=0, ram_discount_percent=0)


def res(vcpus: int = 1) -> ContainerResources:
    return ContainerResources(vcpus=vcpus, ram="1Gi")


def cv(
    uuid: str, phase: Phase = Phase.QUEUED, node: str | None = None, vcpus: int = 1, prio: int = 1
) -> ContainerView:
    return ContainerView(uuid, phase, prio, T0, res(vcpus), node)


def node(name: str = "n1", admission: bool = True, state: NodeState = NodeState.IDLE) -> NodeView:
    return NodeView(name, state, Capacity.of(SMALL), "small", 0.1, admission, ready=True)


def run(ledger: Ledger, *nodes: NodeView) -> Plan:
    return plan(
        ledger.views,
        nodes or [node()],
        Catalogue(types=(SMALL,)),
        POLICY,
        Limits(max_nodes=len(nodes or [1])),
        CloudState(),
        T0,
    )


def held(ledger: Ledger) -> dict[str, tuple[str, str | None, bool]]:
    """uuid -> (phase, node, runner_absent) of every view."""
    return {v.uuid: (v.phase.value, v.node, v.runner_absent) for v in ledger.views}


def nothing(uuid: str) -> ContainerResources | None:
    return None


def test_every_phase_holds_its_node_until_its_runner_is_seen_gone() -> None:
    ledger = account(
        [
            Placement(cv("chosen"), claim=Claim("n1", res())),  # Locked write under way
            Placement(cv("locked", Phase.LOCKED, "n1")),  # not yet known not to run
            Placement(cv("running", Phase.RUNNING, "n1")),
            Placement(cv("cancelled", Phase.RUNNING, "n1"), cancelling=True),
            Placement(cv("cancelled-lock", Phase.LOCKED, "n1"), cancelling=True, checked=True),
        ],
        [],
        {},
        nothing,
    )
    assert held(ledger) == {
        "chosen": ("Locked", "n1", False),
        "locked": ("Locked", "n1", False),
        "running": ("Running", "n1", False),
        "cancelled": ("Running", "n1", False),
        "cancelled-lock": ("Locked", "n1", False),
    }
    assert set(ledger.held) == set(held(ledger))


def test_a_lock_known_to_be_without_a_runner_is_a_candidate_not_a_holding() -> None:
    ledger = account(
        [Placement(cv("l", Phase.LOCKED, "n1"), checked=True)], [], {"n1": []}, nothing
    )
    assert held(ledger) == {"l": ("Locked", "n1", True)}
    assert ledger.held == {}


def test_a_listed_runner_holds_its_node_whatever_its_container_says() -> None:
    resources = {"requeued": res(2), "deleted": res(1)}
    ledger = account(
        [Placement(cv("lock-listed", Phase.LOCKED, "n1"), checked=True)],
        [cv("requeued")],  # Queued again, its runner still listed: it is not placed again
        {"n1": ["lock-listed", "requeued", "deleted"]},
        resources.get,
    )
    assert held(ledger) == {
        "lock-listed": ("Running", "n1", False),  # it runs: adopted, never relocked
        "requeued": ("Running", "n1", False),
        "deleted": ("Running", "n1", False),
    }
    assert ledger.held["requeued"] == res(2)
    assert ledger.unknown == {}


def test_a_runner_of_no_known_container_holds_the_whole_node() -> None:
    ledger = account([], [cv("q")], {"n1": ["stranger"]}, nothing)
    assert ledger.unknown == {"n1": ["stranger"]}
    result = run(ledger)
    assert result.starts == [] and result.over_capacity == {}


def test_a_claim_on_the_node_of_its_own_lock_is_counted_once() -> None:
    placement = Placement(cv("r", Phase.LOCKED, "n1"), claim=Claim("n1", res()), checked=True)
    ledger = account([placement], [], {"n1": []}, nothing)
    assert held(ledger) == {"r": ("Locked", "n1", False)}
    assert len(ledger.views) == 1


def test_with_starts_makes_chosen_containers_hold_their_node() -> None:
    views = [cv("q"), cv("r", Phase.LOCKED, "n1"), cv("x")]
    after = with_starts(views, {"q": "n1"})
    assert [(v.uuid, v.phase, v.node) for v in after] == [
        ("q", Phase.LOCKED, "n1"),
        ("r", Phase.LOCKED, "n1"),
        ("x", Phase.QUEUED, None),
    ]
    assert with_starts(views, {}) is views


def test_relocks_start_what_fits_in_priority_order_and_the_rest_is_overflow() -> None:
    ledger = account(
        [
            Placement(cv("run", Phase.RUNNING, "n1")),
            Placement(cv("hi", Phase.LOCKED, "n1", prio=9), checked=True),
            Placement(cv("lo", Phase.LOCKED, "n1", prio=1), checked=True),
        ],
        [cv("q")],
        {"n1": ["run"]},
        nothing,
    )
    result = run(ledger)
    assert [(s.uuid, s.relock) for s in result.starts] == [("hi", True)]
    assert set(result.unlocks) == {"lo"} and result.overflow == {"lo"}
    assert "no room on n1" in result.unlocks["lo"]
    assert "q" not in {s.uuid for s in result.starts}
    assert result.over_capacity == {}


def test_a_relock_needs_the_node_open_for_work() -> None:
    ledger = account([Placement(cv("l", Phase.LOCKED, "n1"), checked=True)], [], {}, nothing)
    result = run(ledger, node(admission=False))
    assert result.starts == []
    assert "admission closed" in result.unlocks["l"]
    assert result.overflow == set()


def test_a_node_running_more_than_it_holds_is_reported_and_takes_nothing() -> None:
    ledger = account(
        [Placement(cv(f"r{i}", Phase.RUNNING, "n1", vcpus=1)) for i in range(3)],
        [cv("q")],
        {},
        nothing,
    )
    result = run(ledger, node(), node("n2", state=NodeState.ACTIVE))
    assert set(result.over_capacity) == {"n1"}
    assert "runs 3 containers using 3 vCPUs" in result.over_capacity["n1"]
    assert [(s.uuid, s.node) for s in result.starts] == [("q", "n2")]


def test_unverified_holds_do_not_make_a_node_overcommitted() -> None:
    # three locks of an old leader on a one-slot node, none known to run yet
    ledger = account(
        [Placement(cv(f"l{i}", Phase.LOCKED, "n1", vcpus=2)) for i in range(3)], [], {}, nothing
    )
    result = run(ledger)
    assert result.over_capacity == {}
    assert result.starts == [] and result.unlocks == {}
