"""Tests of the instance-type catalogue and `choose_instance_type` (pure; examples + properties)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from nodewarden.api.containerdispatch import ContainerResources
from nodewarden.scheduling.instancetypes import (
    Catalogue,
    ChoiceOutcome,
    InstanceType,
    InstanceTypePolicy,
    choose_instance_type,
    effective_requirements,
    misfit,
    preference_key,
)

GI = 2**30
MI = 2**20

NO_OVERHEAD = InstanceTypePolicy(ram_overhead=0, ram_discount_percent=0, price_factor=1.5)


def it(
    name: str,
    vcpus: int,
    ram_gi: float,
    price: float,
    *,
    scratch_gi: int = 0,
    gpus: int = 0,
    gpu_model: str | None = None,
    preemptible: bool = False,
) -> InstanceType:
    return InstanceType(
        name=name,
        provider_type=name,
        vcpus=vcpus,
        ram=int(ram_gi * GI),
        scratch=scratch_gi * GI,
        gpus=gpus,
        gpu_model=gpu_model,
        price=price,
        preemptible=preemptible,
    )


CATALOGUE = [
    it("small", 2, 4, 0.10, scratch_gi=50),
    it("medium", 4, 16, 0.20, scratch_gi=100),
    it("medium-spot", 4, 16, 0.07, scratch_gi=100, preemptible=True),
    it("medium-hiram", 4, 32, 0.28, scratch_gi=100),
    it("large", 8, 32, 0.40, scratch_gi=200),
    it("gpu-t4", 8, 32, 0.90, scratch_gi=200, gpus=1, gpu_model="nvidia-t4"),
    it("gpu-a100", 16, 128, 3.00, scratch_gi=500, gpus=4, gpu_model="nvidia-a100"),
]


def need(**kwargs: object) -> ContainerResources:
    return ContainerResources.model_validate(kwargs)


def test_quantities_accepted_in_catalogue() -> None:
    t = InstanceType(name="x", provider_type="x.1", vcpus=1, ram="8Gi", scratch="1Ti", price=0.1)
    assert t.ram == 8 * GI
    assert t.scratch == 2**40
    with pytest.raises(ValidationError):
        InstanceType(name="x", provider_type="x", vcpus=1, ram="8 GB", price=0.1)


def test_catalogue_rejects_duplicate_names() -> None:
    with pytest.raises(ValidationError, match="listed twice"):
        Catalogue(types=(CATALOGUE[0], CATALOGUE[0]))
    cat = Catalogue(types=tuple(CATALOGUE))
    assert cat.by_name("large") == CATALOGUE[4]
    assert cat.by_name("nope") is None


def test_cheapest_fitting_type_is_chosen() -> None:
    choice = choose_instance_type(need(vcpus=2, ram="3Gi"), CATALOGUE, NO_OVERHEAD)
    assert choice.outcome is ChoiceOutcome.CHEAPEST
    assert choice.instance_type is not None and choice.instance_type.name == "small"


def test_ram_overhead_and_discount_push_to_the_next_type() -> None:
    # 3.5Gi fits "small" (4Gi) without overhead ...
    plain = choose_instance_type(need(vcpus=1, ram="3584Mi"), CATALOGUE, NO_OVERHEAD)
    assert plain.instance_type is not None and plain.instance_type.name == "small"
    # ... but not with 550Mi overhead: (3584+550)Mi > 4Gi.
    default = InstanceTypePolicy()
    chosen = choose_instance_type(need(vcpus=1, ram="3584Mi"), CATALOGUE, default)
    assert chosen.instance_type is not None and chosen.instance_type.name == "medium"
    # The 5% discount alone: 3.9Gi / 0.95 > 4Gi.
    discount_only = InstanceTypePolicy(ram_overhead=0, ram_discount_percent=5)
    req = effective_requirements(need(ram=str(int(3.9 * GI))), discount_only)
    assert req.ram > 4 * GI
    choice = choose_instance_type(need(ram=str(int(3.9 * GI))), CATALOGUE, discount_only)
    assert choice.instance_type is not None and choice.instance_type.name == "medium"


def test_exact_ram_boundary_fits() -> None:
    # ram + overhead exactly equal to the type's RAM (no discount) fits; one byte more does not.
    policy = InstanceTypePolicy(ram_overhead=512 * MI, ram_discount_percent=0)
    exact = need(ram=str(4 * GI - 512 * MI))
    over = need(ram=str(4 * GI - 512 * MI + 1))
    assert choose_instance_type(exact, CATALOGUE, policy).instance_type == CATALOGUE[0]
    assert choose_instance_type(over, CATALOGUE, policy).instance_type == CATALOGUE[1]


def test_scratch_and_gpus() -> None:
    choice = choose_instance_type(need(scratch="150Gi"), CATALOGUE, NO_OVERHEAD)
    assert choice.instance_type is not None and choice.instance_type.name == "large"
    choice = choose_instance_type(need(gpus=1), CATALOGUE, NO_OVERHEAD)
    assert choice.instance_type is not None and choice.instance_type.name == "gpu-t4"
    choice = choose_instance_type(need(gpus=1, gpu_model="nvidia-a100"), CATALOGUE, NO_OVERHEAD)
    assert choice.instance_type is not None and choice.instance_type.name == "gpu-a100"
    choice = choose_instance_type(need(gpus=2), CATALOGUE, NO_OVERHEAD)
    assert choice.instance_type is not None and choice.instance_type.name == "gpu-a100"


def test_preemptible_is_an_exact_match() -> None:
    spot = choose_instance_type(need(vcpus=2, preemptible=True), CATALOGUE, NO_OVERHEAD)
    assert spot.instance_type is not None and spot.instance_type.name == "medium-spot"
    # The spot type is cheaper than "small" but a non-preemptible container never gets it.
    regular = choose_instance_type(need(vcpus=2), CATALOGUE, NO_OVERHEAD)
    assert regular.instance_type is not None and regular.instance_type.name == "small"
    none = choose_instance_type(need(vcpus=8, preemptible=True), CATALOGUE, NO_OVERHEAD)
    assert none.outcome is ChoiceOutcome.NO_FIT
    assert "vCPUs" in none.reason


def test_ties_prefer_more_ram_then_more_vcpus() -> None:
    cat = [
        it("a-4c-8g", 4, 8, 0.2),
        it("b-2c-16g", 2, 16, 0.2),
        it("c-8c-16g", 8, 16, 0.2),
        it("d-8c-16g", 8, 16, 0.2),
    ]
    choice = choose_instance_type(need(vcpus=2, ram="1Gi"), cat, NO_OVERHEAD)
    assert choice.instance_type is not None
    assert choice.instance_type.name == "c-8c-16g"  # more RAM, then more vCPUs, then name
    assert [t.name for t in choice.candidates] == ["c-8c-16g", "d-8c-16g", "b-2c-16g", "a-4c-8g"]


def test_price_factor_allows_dearer_type_when_cheapest_at_capacity() -> None:
    req = need(vcpus=4, ram="8Gi")
    # Fitting: medium 0.20, medium-hiram 0.28 (<= 0.30), large 0.40 (> 0.30).
    first = choose_instance_type(req, CATALOGUE, NO_OVERHEAD)
    assert first.instance_type is not None and first.instance_type.name == "medium"
    assert [t.name for t in first.candidates] == ["medium", "medium-hiram"]
    dearer = choose_instance_type(req, CATALOGUE, NO_OVERHEAD, at_capacity={"medium"})
    assert dearer.outcome is ChoiceOutcome.DEARER_AT_CAPACITY
    assert dearer.instance_type is not None and dearer.instance_type.name == "medium-hiram"
    assert "medium" in dearer.reason
    waiting = choose_instance_type(
        req, CATALOGUE, NO_OVERHEAD, at_capacity={"medium", "medium-hiram"}
    )
    assert waiting.outcome is ChoiceOutcome.ALL_AT_CAPACITY
    assert waiting.instance_type is None
    assert "capacity" in waiting.reason
    # A larger factor lets "large" in.
    wide = InstanceTypePolicy(ram_overhead=0, ram_discount_percent=0, price_factor=2.0)
    wider = choose_instance_type(req, CATALOGUE, wide, at_capacity={"medium", "medium-hiram"})
    assert wider.instance_type is not None and wider.instance_type.name == "large"


def test_unfittable_gives_a_clear_reason() -> None:
    ram = choose_instance_type(need(ram="600Gi"), CATALOGUE, NO_OVERHEAD)
    assert ram.outcome is ChoiceOutcome.NO_FIT and not ram.ok
    assert "RAM" in ram.reason and "128Gi" in ram.reason
    gpus = choose_instance_type(need(gpus=8), CATALOGUE, NO_OVERHEAD)
    assert "8 GPUs" in gpus.reason and "offers 4" in gpus.reason
    model = choose_instance_type(need(gpus=1, gpu_model="amd-mi300"), CATALOGUE, NO_OVERHEAD)
    assert model.outcome is ChoiceOutcome.NO_FIT
    assert "amd-mi300" in model.reason
    empty = choose_instance_type(need(), [], NO_OVERHEAD)
    assert "empty" in empty.reason


def test_misfit_names_the_dimension() -> None:
    req = effective_requirements(need(vcpus=3), NO_OVERHEAD)
    assert misfit(CATALOGUE[0], req) == "2 vCPUs < 3"
    assert misfit(CATALOGUE[1], req) is None


# ---- properties -------------------------------------------------------------------------

instance_types = st.builds(
    InstanceType,
    name=st.text(alphabet="abcdefghij", min_size=1, max_size=6),
    provider_type=st.just("p"),
    vcpus=st.integers(1, 64),
    ram=st.integers(1, 512).map(lambda g: g * GI),
    scratch=st.integers(0, 1000).map(lambda g: g * GI),
    gpus=st.integers(0, 4),
    gpu_model=st.sampled_from([None, "t4", "a100"]),
    price=st.integers(1, 500).map(lambda c: c / 100),
    preemptible=st.booleans(),
)
catalogues = st.lists(instance_types, max_size=12, unique_by=lambda t: t.name)
resources = st.builds(
    ContainerResources,
    vcpus=st.integers(1, 64),
    ram=st.integers(1, 512 * 1024).map(lambda m: f"{m}Mi"),
    scratch=st.integers(0, 1000).map(lambda g: f"{g}Gi"),
    gpus=st.integers(0, 4),
    gpu_model=st.sampled_from([None, "t4", "a100"]),
    preemptible=st.booleans(),
)
policies = st.builds(
    InstanceTypePolicy,
    ram_overhead=st.integers(0, 2048).map(lambda m: m * MI),
    ram_discount_percent=st.sampled_from([0.0, 5.0, 10.0]),
    price_factor=st.sampled_from([1.0, 1.2, 1.5, 3.0]),
)


@settings(max_examples=400, deadline=None)
@given(req=resources, cat=catalogues, policy=policies, data=st.data())
def test_property_choice_is_sound(
    req: ContainerResources,
    cat: list[InstanceType],
    policy: InstanceTypePolicy,
    data: st.DataObject,
) -> None:
    names = [t.name for t in cat]
    at_capacity = set(data.draw(st.lists(st.sampled_from(names)) if names else st.just([])))
    choice = choose_instance_type(req, cat, policy, at_capacity=at_capacity)
    need_ = effective_requirements(req, policy)
    fitting = [t for t in cat if misfit(t, need_) is None]
    if choice.instance_type is None:
        assert choice.reason
        if choice.outcome is ChoiceOutcome.NO_FIT:
            assert not fitting
        else:
            assert choice.outcome is ChoiceOutcome.ALL_AT_CAPACITY
            assert all(t.name in at_capacity for t in choice.candidates)
        return
    chosen = choice.instance_type
    # The chosen type always fits (including the exact preemptible match) ...
    assert misfit(chosen, need_) is None
    assert chosen.preemptible == req.preemptible
    assert chosen.name not in at_capacity
    cheapest_price = min(t.price for t in fitting)
    # ... is within the price factor of the cheapest fitting type ...
    assert chosen.price <= cheapest_price * policy.price_factor
    # ... and no fitting type not at capacity is preferable to it.
    for other in fitting:
        if other.name not in at_capacity:
            assert preference_key(chosen) <= preference_key(other)
    # With nothing at capacity, the choice is the cheapest (ties broken by more RAM, vCPUs).
    if not at_capacity:
        assert chosen.price == cheapest_price
        assert choice.outcome is ChoiceOutcome.CHEAPEST


@settings(max_examples=200, deadline=None)
@given(req=resources, cat=catalogues, policy=policies)
def test_property_more_need_never_gets_a_cheaper_type(
    req: ContainerResources, cat: list[InstanceType], policy: InstanceTypePolicy
) -> None:
    bigger = req.model_copy(update={"vcpus": req.vcpus + 1})
    small = choose_instance_type(req, cat, policy)
    large = choose_instance_type(bigger, cat, policy)
    if large.instance_type is not None:
        assert small.instance_type is not None
        assert small.instance_type.price <= large.instance_type.price
