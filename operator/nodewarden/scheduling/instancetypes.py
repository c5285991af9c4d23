"""The instance-type catalogue and the pure choice of the cheapest type that fits a container.

The catalogue comes from configuration (`nodewarden.cloud.config.CloudConfig.instance_types`):
one `InstanceType` per type nodewarden may create, with its size and hourly price.

`choose_instance_type(requirements, catalogue, policy, at_capacity=...)` is pure. It
follows the Arvados dispatcher's rules:

1. A type *fits* when, for the container's `ContainerResources`:
   - vCPUs: ``type.vcpus >= requirements.vcpus``;
   - RAM: ``type.ram >= (requirements.ram + policy.ram_overhead) * 100 / (100 -
     policy.ram_discount_percent)`` -- the overhead is what the runner and the node's
     own services use, the discount accounts for the difference between a type's
     nominal RAM and what the kernel leaves to processes;
   - scratch: ``type.scratch >= requirements.scratch``;
   - GPUs: ``type.gpus >= requirements.gpus`` and, when the container names a GPU
     model, ``type.gpu_model`` equals it;
   - preemptible: ``type.preemptible == requirements.preemptible`` (exact match).
2. Fitting types are ordered by price, then more RAM first, then more vCPUs first, then
   name (so the result is deterministic).
3. The cheapest fitting type is chosen. When it is at capacity (the caller passes the
   names of the types the cloud reported as at capacity, or that hit a per-type limit),
   the next type in order is chosen, provided its price is at most
   ``policy.price_factor`` times the cheapest fitting price.
4. When nothing fits, or every type within the price factor is at capacity, the result
   carries no type and a human-readable reason; it never raises.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Sequence
from enum import StrEnum
from fractions import Fraction
from typing import Annotated, Self

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from nodewarden.api.containerdispatch import ContainerResources
from nodewarden.units import parse_quantity

ByteCount = Annotated[int, BeforeValidator(parse_quantity), Field(ge=0)]
"""A byte count written either as an integer or as a Kubernetes quantity ("16Gi")."""

_GIB = 2**30


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class InstanceType(_Frozen):
    """One instance type of the catalogue: what nodewarden may create and what it costs."""

    name: str = Field(
        min_length=1,
        max_length=128,
        description="Catalogue name, used in tags, status and policy limits.",
    )
    provider_type: str = Field(
        min_length=1,
        max_length=128,
        description="The provider's own size id (e.g. 'm5.large'); may differ from name.",
    )
    vcpus: int = Field(ge=1, le=4096, description="Virtual CPUs.")
    ram: ByteCount = Field(description="Memory in bytes (quantity accepted, e.g. '8Gi').")
    scratch: ByteCount = Field(default=0, description="Local scratch space in bytes.")
    gpus: int = Field(default=0, ge=0, le=64, description="Number of GPUs.")
    gpu_model: str | None = Field(default=None, max_length=128, description="GPU model.")
    price: float = Field(ge=0, description="Hourly price in the billing currency.")
    preemptible: bool = Field(default=False, description="Spot / preemptible type.")
    quota_group: str | None = Field(
        default=None,
        max_length=64,
        description=(
            "Provider quota group (e.g. EC2 vCPU quota family 'standard', 'g', 'p'). A "
            "quota-group error blocks creates of every type in the same group; unset = "
            "the error blocks every type."
        ),
    )


class InstanceTypePolicy(_Frozen):
    """The knobs of the instance-type choice (Arvados names in brackets)."""

    ram_overhead: ByteCount = Field(
        default=550 * 2**20,
        description="RAM added to each container's request [ReserveExtraRAM], bytes.",
    )
    ram_discount_percent: float = Field(
        default=5.0,
        ge=0,
        lt=100,
        description="Share of a type's nominal RAM assumed unusable by containers, percent.",
    )
    price_factor: float = Field(
        default=1.5,
        ge=1.0,
        le=100.0,
        description=(
            "When the cheapest fitting type is at capacity, a type up to this many times "
            "its price may be used instead [MaximumPriceFactor]."
        ),
    )


class ChoiceOutcome(StrEnum):
    """How `choose_instance_type` ended; stable strings for status and events."""

    CHEAPEST = "Cheapest"
    """The cheapest fitting type was chosen."""
    DEARER_AT_CAPACITY = "DearerBecauseAtCapacity"
    """A dearer type within the price factor was chosen; cheaper ones are at capacity."""
    ALL_AT_CAPACITY = "AllAtCapacity"
    """Types fit, but every one within the price factor is at capacity: wait."""
    NO_FIT = "NoInstanceTypeFits"
    """No catalogue type fits the requirements: the container cannot run here."""


class InstanceTypeChoice(_Frozen):
    """The result of choosing a type: the type (or None) and why."""

    outcome: ChoiceOutcome
    instance_type: InstanceType | None = None
    candidates: tuple[InstanceType, ...] = Field(
        default=(),
        description="Every fitting type within the price factor, in preference order.",
    )
    reason: str = Field(description="One human-readable sentence explaining the outcome.")

    @property
    def ok(self) -> bool:
        return self.instance_type is not None


class Requirements(_Frozen):
    """A container's needs in plain numbers (bytes), RAM overhead and discount applied."""

    vcpus: int
    ram: int
    scratch: int
    gpus: int
    gpu_model: str | None
    preemptible: bool


def effective_requirements(
    resources: ContainerResources, policy: InstanceTypePolicy
) -> Requirements:
    """Turn a container's resources into the numbers a type must meet."""
    ram_needed = parse_quantity(resources.ram) + policy.ram_overhead
    usable_share = Fraction(100) - Fraction(policy.ram_discount_percent)
    # Round up: a type with exactly the scaled RAM fits; one byte less does not.
    ram_scaled = math.ceil(Fraction(ram_needed * 100) / usable_share)
    return Requirements(
        vcpus=resources.vcpus,
        ram=ram_scaled,
        scratch=parse_quantity(resources.scratch),
        gpus=resources.gpus,
        gpu_model=resources.gpu_model,
        preemptible=resources.preemptible,
    )


def misfit(instance_type: InstanceType, need: Requirements) -> str | None:
    """Why `instance_type` does not fit `need`, or None when it fits."""
    if instance_type.preemptible != need.preemptible:
        wanted = "preemptible" if need.preemptible else "non-preemptible"
        return f"not {wanted}"
    if instance_type.vcpus < need.vcpus:
        return f"{instance_type.vcpus} vCPUs < {need.vcpus}"
    if instance_type.ram < need.ram:
        return f"RAM {_gib(instance_type.ram)} < {_gib(need.ram)}"
    if instance_type.scratch < need.scratch:
        return f"scratch {_gib(instance_type.scratch)} < {_gib(need.scratch)}"
    if instance_type.gpus < need.gpus:
        return f"{instance_type.gpus} GPUs < {need.gpus}"
    if need.gpus > 0 and need.gpu_model and instance_type.gpu_model != need.gpu_model:
        return f"GPU model {instance_type.gpu_model or 'none'} != {need.gpu_model}"
    return None


def gpu_last(
    types: Sequence[InstanceType], need: Requirements
) -> tuple[Sequence[InstanceType], bool]:
    """GPU work first on GPU capacity: for a container that asks for no GPU, the types
    without GPUs when one of them fits it, else every type; and whether one without GPUs
    fits."""
    without = tuple(t for t in types if t.gpus == 0)
    if any(misfit(t, need) is None for t in without):
        return without, True
    return types, False


def preference_key(instance_type: InstanceType) -> tuple[float, int, int, str]:
    """Sort key: cheaper first, then more RAM, then more vCPUs, then name."""
    return (instance_type.price, -instance_type.ram, -instance_type.vcpus, instance_type.name)


def choose_instance_type(
    requirements: ContainerResources,
    catalogue: Iterable[InstanceType],
    policy: InstanceTypePolicy,
    at_capacity: Collection[str] = frozenset(),
) -> InstanceTypeChoice:
    """Choose the cheapest catalogue type that fits; see the module docstring for the rules.

    `at_capacity` holds catalogue names (`InstanceType.name`) the caller knows cannot be
    created right now (cloud capacity errors, per-type limits).
    """
    need = effective_requirements(requirements, policy)
    types = list(catalogue)
    fitting = sorted((t for t in types if misfit(t, need) is None), key=preference_key)
    if not fitting:
        return InstanceTypeChoice(outcome=ChoiceOutcome.NO_FIT, reason=_no_fit_reason(need, types))
    ceiling = fitting[0].price * policy.price_factor
    within = tuple(t for t in fitting if t.price <= ceiling)
    available = [t for t in within if t.name not in at_capacity]
    if not available:
        names = ", ".join(t.name for t in within)
        return InstanceTypeChoice(
            outcome=ChoiceOutcome.ALL_AT_CAPACITY,
            candidates=within,
            reason=(
                f"every fitting type within {policy.price_factor:g}x the cheapest price is at "
                f"capacity ({names}); waiting"
            ),
        )
    chosen = available[0]
    if chosen is fitting[0]:
        return InstanceTypeChoice(
            outcome=ChoiceOutcome.CHEAPEST,
            instance_type=chosen,
            candidates=within,
            reason=f"{chosen.name} is the cheapest type that fits ({_describe_need(need)})",
        )
    skipped = ", ".join(t.name for t in within if t.name in at_capacity)
    return InstanceTypeChoice(
        outcome=ChoiceOutcome.DEARER_AT_CAPACITY,
        instance_type=chosen,
        candidates=within,
        reason=(
            f"{chosen.name} chosen at {chosen.price:g}/h because cheaper fitting types are at "
            f"capacity ({skipped}); within {policy.price_factor:g}x of {fitting[0].price:g}/h"
        ),
    )


def _describe_need(need: Requirements) -> str:
    parts = [f"{need.vcpus} vCPUs", f"RAM {_gib(need.ram)} incl. overhead"]
    if need.scratch:
        parts.append(f"scratch {_gib(need.scratch)}")
    if need.gpus:
        parts.append(f"{need.gpus} GPUs" + (f" {need.gpu_model}" if need.gpu_model else ""))
    if need.preemptible:
        parts.append("preemptible")
    return ", ".join(parts)


def _no_fit_reason(need: Requirements, types: Sequence[InstanceType]) -> str:
    if not types:
        return "the instance-type catalogue is empty"
    # Report the dimension that rules out the most types, with the largest offer.
    misfits = [(t, misfit(t, need)) for t in types]
    same_market = [t for t in types if t.preemptible == need.preemptible]
    if not same_market:
        kind = "preemptible" if need.preemptible else "non-preemptible"
        return f"no {kind} instance type in the catalogue ({_describe_need(need)} needed)"
    checks: list[tuple[str, int, int]] = [
        ("vCPUs", need.vcpus, max(t.vcpus for t in same_market)),
        ("RAM", need.ram, max(t.ram for t in same_market)),
        ("scratch", need.scratch, max(t.scratch for t in same_market)),
        ("GPUs", need.gpus, max(t.gpus for t in same_market)),
    ]
    for label, wanted, largest in checks:
        if wanted > largest:
            if label in ("RAM", "scratch"):
                return (
                    f"needs {_gib(wanted)} {label}"
                    f"{' after overhead' if label == 'RAM' else ''}; the largest type offers "
                    f"{_gib(largest)}"
                )
            return f"needs {wanted} {label}; the largest type offers {largest}"
    details = "; ".join(f"{t.name}: {why}" for t, why in misfits if why)
    return f"no single type meets every requirement ({_describe_need(need)}): {details}"


def _gib(value: int) -> str:
    return f"{value / _GIB:.2f}Gi".replace(".00Gi", "Gi")


class Catalogue(_Frozen):
    """The configured instance types, names unique."""

    types: tuple[InstanceType, ...] = ()

    @model_validator(mode="after")
    def _unique_names(self) -> Self:
        seen: set[str] = set()
        for instance_type in self.types:
            if instance_type.name in seen:
                raise ValueError(f"instance type {instance_type.name!r} is listed twice")
            seen.add(instance_type.name)
        return self

    def by_name(self, name: str) -> InstanceType | None:
        for instance_type in self.types:
            if instance_type.name == name:
                return instance_type
        return None

    def by_provider_type(self, provider_type: str) -> list[InstanceType]:
        return [t for t in self.types if t.provider_type == provider_type]
