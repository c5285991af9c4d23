"""Cloud VMs created ahead of demand, in process: the warm targets the power controller
puts on the board create instances of a cloud node class until its idle and booting
nodes reach the target -- through the pool's create, once -- and a Shadow lever only
counts what it would create (`dispatch.warming`, `rules.warm.vm_creates`)."""

from __future__ import annotations

from fakes import NS, SMALL, Rig, container

from nodewarden.fleet.board import WarmWant
from nodewarden.metrics import REGISTRY

CLASSES = {"nodeClasses": [{"name": "small", "nodeType": "CloudVM", "instanceType": "small"}]}


def _policy(rig: Rig) -> None:
    rig.policies.observe(
        {"metadata": {"name": "default", "namespace": NS, "generation": 2}, "spec": CLASSES}
    )


def _shadow_creates() -> float:
    labels = {"policy": "default", "node_class": "small", "mode": "Shadow"}
    return REGISTRY.get_sample_value("nodewarden_warm_creates_total", labels) or 0.0


async def test_warm_targets_create_vms_once_and_again_when_one_is_taken() -> None:
    rig = Rig([SMALL])
    _policy(rig)
    await rig.start()
    await rig.rounds(2)
    assert rig.cloud.created == []
    rig.board.set_warm({"small": WarmWant(2, 0, "window office")})
    await rig.rounds(3)
    assert rig.cloud.created == ["small", "small"]
    await rig.rounds(3)  # booting: they count, nothing more is created
    assert rig.cloud.created == ["small", "small"]
    for vm in rig.cloud.vms.values():
        vm.ready = True  # booted: idle and ready, they still count
    await rig.rounds(3)
    assert rig.cloud.created == ["small", "small"]
    # a container takes one of the warm nodes: the class is short by one again
    rig.api.create(container("c1", vcpus=2))
    await rig.rounds(4)
    assert len(rig.runners()) == 1
    assert rig.cloud.created == ["small"] * 3
    # the levers want nothing: nothing more, and nothing is destroyed here (the power
    # controller's idle path does that)
    rig.board.set_warm({})
    await rig.rounds(3)
    assert rig.cloud.created == ["small"] * 3


async def test_a_shadow_lever_counts_the_creates_it_would_make_and_makes_none() -> None:
    rig = Rig([SMALL])
    _policy(rig)
    await rig.start()
    before = _shadow_creates()
    rig.board.set_warm({"small": WarmWant(0, 3, "forecast (Shadow)")})
    await rig.rounds(4)
    assert rig.cloud.created == []
    assert _shadow_creates() - before == 3


async def test_no_warm_create_without_a_class_for_the_type() -> None:
    rig = Rig([SMALL])  # the default policy has no node classes
    await rig.start()
    rig.board.set_warm({"small": WarmWant(2)})
    await rig.rounds(3)
    assert rig.cloud.created == []


async def test_a_create_the_choke_point_refuses_is_not_retried_in_the_same_round() -> None:
    """Warm creates go through `pool.create`, the create choke point (the hard caps and
    the cloud's back-off: tests/unit/test_create_choke_point.py); a refusal (None) stops
    that class's creates for the round and counts nothing."""
    rig = Rig([SMALL])
    _policy(rig)
    asked: list[str] = []
    create = rig.pool.create

    def capped(itype: object) -> object:
        asked.append(getattr(itype, "name", "?"))
        return create(itype) if len(rig.cloud.created) < 1 else None  # type: ignore[arg-type]

    rig.pool.create = capped  # type: ignore[method-assign]
    await rig.start()
    labels = {"policy": "default", "node_class": "small", "mode": "On"}
    before = REGISTRY.get_sample_value("nodewarden_warm_creates_total", labels) or 0.0
    rig.board.set_warm({"small": WarmWant(3, 0, "window office")})
    await rig.round()
    assert rig.cloud.created == ["small"] and asked == ["small", "small"]
    after = REGISTRY.get_sample_value("nodewarden_warm_creates_total", labels) or 0.0
    assert after - before == 1
