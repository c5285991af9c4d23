"""The hard caps (`scheduling.caps`): the operator's ceilings above every PowerPolicy, the
one check every create passes, and what `nodewarden check` reports of a fleet above them."""

from __future__ import annotations

from nodewarden.scheduling.caps import (
    Cap,
    Ceilings,
    Fleet,
    PolicyLimits,
    above_ceilings,
    admit_create,
    effective_limits,
)

UNLIMITED = PolicyLimits("default")


def test_no_policy_means_no_create_never_unlimited() -> None:
    verdict = admit_create("gpu", 3.0, Fleet(), None, Ceilings(), stopped="no default policy")
    assert not verdict.allowed
    assert verdict.cap is Cap.STOPPED
    assert "no default policy" in verdict.message


def test_the_operator_ceiling_wins_over_a_policy_that_allows_more() -> None:
    fleet = Fleet.of([("gpu", 3.0)] * 5)
    policy = PolicyLimits("default", max_nodes=100, max_hourly_spend=1000.0)
    verdict = admit_create("gpu", 3.0, fleet, policy, Ceilings(max_nodes=5))
    assert not verdict.allowed and verdict.cap is Cap.MAX_NODES
    assert "limits.maxNodes (5)" in verdict.message
    assert "no PowerPolicy can" in verdict.message
    assert admit_create("gpu", 3.0, fleet, policy, Ceilings(max_nodes=6)).allowed


def test_a_policy_may_only_lower_the_ceiling() -> None:
    fleet = Fleet.of([("small", 0.02)] * 2)
    policy = PolicyLimits("default", max_nodes=2)
    verdict = admit_create("small", 0.02, fleet, policy, Ceilings(max_nodes=10))
    assert not verdict.allowed
    assert "PowerPolicy 'default' maxNodes (2)" in verdict.message
    assert "spec.maxNodes" in verdict.message


def test_spend_counts_the_new_instance_price() -> None:
    fleet = Fleet.of([("gpu", 3.26)] * 3)  # 9.78/h
    verdict = admit_create("gpu", 3.26, fleet, UNLIMITED, Ceilings(max_hourly_spend=10.0))
    assert not verdict.allowed and verdict.cap is Cap.MAX_HOURLY_SPEND
    assert "limits.maxHourlySpend (10)" in verdict.message
    assert admit_create("small", 0.2, fleet, UNLIMITED, Ceilings(max_hourly_spend=10.0)).allowed


def test_per_type_ceiling_any_type_and_named_type() -> None:
    fleet = Fleet.of([("gpu", 1.0)] * 2 + [("small", 0.02)] * 4)
    ceilings = Ceilings(max_per_type=4, per_type={"gpu": 2})
    gpu = admit_create("gpu", 1.0, fleet, UNLIMITED, ceilings)
    assert not gpu.allowed and "limits.instanceTypes.gpu (2)" in gpu.message
    small = admit_create("small", 0.02, fleet, UNLIMITED, ceilings)
    assert not small.allowed and "limits.maxPerInstanceType (4)" in small.message
    assert admit_create("medium", 0.1, fleet, UNLIMITED, ceilings).allowed


def test_back_off_refuses_with_its_reason() -> None:
    verdict = admit_create("gpu", 1.0, Fleet(), UNLIMITED, Ceilings(), backoff="quota exceeded")
    assert not verdict.allowed and verdict.cap is Cap.BACKOFF
    assert "quota exceeded" in verdict.message


def test_effective_limits_are_the_smaller_of_each() -> None:
    policy = PolicyLimits(
        "default", max_nodes=50, max_hourly_spend=5.0, per_type={"gpu": 8}, min_warm_nodes=1
    )
    ceilings = Ceilings(max_nodes=10, max_hourly_spend=20.0, max_per_type=3, per_type={"x": 1})
    limits = effective_limits(policy, ceilings, ["gpu", "small"])
    assert limits.max_nodes == 10
    assert limits.max_hourly_spend == 5.0
    assert dict(limits.per_type_max) == {"gpu": 3, "small": 3, "x": 1}
    assert limits.min_warm_nodes == 1
    open_limits = effective_limits(UNLIMITED, Ceilings(), ["gpu"])
    assert open_limits.max_nodes is None and dict(open_limits.per_type_max) == {}


def test_a_fleet_above_new_ceilings_is_reported_never_destroyed() -> None:
    fleet = Fleet.of([("gpu", 3.26)] * 22)
    excess = above_ceilings(fleet, Ceilings(max_nodes=20, max_hourly_spend=25.0, max_per_type=10))
    assert [(e.setting, e.ceiling, e.current) for e in excess] == [
        ("maxNodes", 20, 22),
        ("maxHourlySpend", 25.0, 71.72),
        ("maxPerInstanceType (gpu)", 10, 22),
    ]
    assert above_ceilings(Fleet.of([("gpu", 1.0)]), Ceilings(max_nodes=20)) == []
