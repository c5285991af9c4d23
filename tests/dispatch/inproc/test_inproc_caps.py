"""The hard caps in the plan, in process: the operator's ceiling bounds planned creates
whatever the default policy allows, and no create is planned while the default policy is
missing -- the waiting containers say why."""

from __future__ import annotations

from fakes import NS, SMALL, Rig, container

from nodewarden.config import CreateLimits, DispatchSettings


async def test_the_operator_ceiling_bounds_planned_creates() -> None:
    rig = Rig([SMALL], maxNodes=50)
    rig.dispatcher.settings = DispatchSettings(
        term_interval=5, term_timeout=30, sync_interval=1, limits=CreateLimits(max_nodes=3)
    )
    await rig.start()
    for i in range(8):
        rig.api.create(container(f"c{i}", vcpus=2))
    await rig.rounds(6)
    assert rig.cloud.created == ["small"] * 3
    waiting = [rig.api.status(f"c{i}").get("schedulingStatus") or "" for i in range(8)]
    assert sum("max nodes (3)" in w for w in waiting) >= 4


async def test_no_create_while_the_default_policy_is_missing() -> None:
    rig = Rig([SMALL])
    rig.policies.observe({"metadata": {"name": "default", "namespace": NS}}, deleted=True)
    await rig.start()
    rig.api.create(container("c1", vcpus=2))
    await rig.rounds(4)
    assert rig.cloud.created == []
    status = rig.api.status("c1").get("schedulingStatus") or ""
    assert "default PowerPolicy 'default' does not exist" in status
    # the policy comes back: the container gets its node
    rig.policies.observe(
        {"metadata": {"name": "default", "namespace": NS, "generation": 2}, "spec": {}}
    )
    await rig.rounds(4)
    assert rig.cloud.created == ["small"]
