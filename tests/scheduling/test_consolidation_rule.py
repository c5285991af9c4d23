"""The consolidation rule (`rules.consolidation`): each verdict in its order, the evidence
it carries, the budget, and the annotation read from an object's metadata."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

from nodewarden.api.consolidation import Consolidation
from nodewarden.api.containerdispatch import ContainerResources
from nodewarden.rules.consolidation import (
    DEMAND_WAITING,
    DRAIN,
    NO_ROOM,
    NOT_CANDIDATE,
    NOT_DEAR,
    PROTECTED,
    Assessment,
    assess,
    demand_lets_go,
    only_here,
    protected,
    within_budget,
)
from nodewarden.scheduling.instancetypes import Catalogue, InstanceType, InstanceTypePolicy
from nodewarden.scheduling.views import Capacity, ContainerView, NodeState, NodeView, Phase
from nodewarden.units import parse_quantity

T0 = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)
GI = 2**30
EIGHT = InstanceType(name="eight", provider_type="c8", vcpus=8, ram=32 * GI, price=0.40)
CATALOGUE = Catalogue(types=(EIGHT,))
POLICY = InstanceTypePolicy(ram_overhead=0, ram_discount_percent=0)
SETTINGS = Consolidation(mode="On")


def vm(name: str, price: float = 0.40) -> NodeView:
    return NodeView(name, NodeState.ACTIVE, Capacity.of(EIGHT), "eight", price, True, True)


def running(uuid: str, node: str, vcpus: int) -> ContainerView:
    resources = ContainerResources(vcpus=vcpus, ram=f"{vcpus}Gi")
    return ContainerView(uuid, Phase.RUNNING, 500, T0, resources, node)


def _assess(
    held: list[ContainerView],
    nodes: list[NodeView],
    *,
    node_protected: bool = False,
    queued: int = 0,
) -> Assessment:
    view = next(n for n in nodes if n.name == "light")
    return assess(view, node_protected, held, nodes, SETTINGS, CATALOGUE, POLICY, T0, queued=queued)


def test_a_lightly_used_dear_node_whose_work_fits_elsewhere_is_drained_with_evidence() -> None:
    held = [running("a", "light", 1), running("x", "busy", 4)]
    nodes = [vm("light", price=0.80), vm("busy")]
    answer = _assess(held, nodes)
    assert answer.code == DRAIN and answer.drain
    assert answer.utilisation == 0.125 and answer.hourly_price == 0.80
    assert answer.price_per_used == 6.4
    assert answer.targets == {"a": "busy"}
    # "busy" after the move: 5 of 8 vCPUs at 0.40/h
    assert answer.target_price_per_used == 0.40 / (5 / 8)


def test_each_verdict_in_its_order() -> None:
    held = [running("a", "light", 1), running("x", "busy", 4)]
    nodes = [vm("light", price=0.80), vm("busy")]
    assert _assess(held, nodes, node_protected=True).code == PROTECTED
    kept = [replace(held[0], do_not_consolidate=True), held[1]]
    assert _assess(kept, nodes).code == PROTECTED
    heavy = [running("a", "light", 5), running("x", "busy", 1)]
    assert _assess(heavy, nodes).code == NOT_CANDIDATE
    assert _assess([held[1]], nodes).code == NOT_CANDIDATE
    assert _assess(held, nodes, queued=1).code == DEMAND_WAITING
    full = [running("a", "light", 1), running("x", "busy", 8)]
    assert _assess(full, nodes).code == NO_ROOM
    # as cheap per used share as where its work would go: not dear
    cheap = [vm("light", price=0.05), vm("busy")]
    assert _assess(held, cheap).code == NOT_DEAR


def test_the_budget_and_the_annotation() -> None:
    assert within_budget(set(), SETTINGS) and not within_budget({"a"}, SETTINGS)
    assert within_budget({"a"}, Consolidation(max_concurrent=2))
    assert not within_budget(set(), Consolidation(max_concurrent=0))
    assert protected({"nodewarden.io/do-not-consolidate": "true"})
    assert not protected({"nodewarden.io/do-not-consolidate": "false"})
    assert not protected(None) and not protected({"other": "true"})
    assert Consolidation().mode == "Shadow"  # existing installs start in Shadow


def test_only_work_nothing_else_could_ever_run_lets_a_closed_node_go() -> None:
    small = InstanceType(name="s", provider_type="s", vcpus=4, ram="16Gi", price=0.2)
    catalogue = Catalogue(types=(small,))
    fits_type = ContainerResources(vcpus=2, ram="4Gi")
    fits_side = ContainerResources(vcpus=12, ram="32Gi")
    only = ContainerResources(vcpus=24, ram="64Gi")
    side = (Capacity(vcpus=16, ram=parse_quantity("64Gi"), scratch=0, gpus=0),)
    waiting = [fits_type, fits_side, only, only]
    assert only_here(waiting, side, catalogue, InstanceTypePolicy()) == 2
    assert demand_lets_go(0) is None
    assert demand_lets_go(2) == "2 queued container(s) only this node can run wait"
