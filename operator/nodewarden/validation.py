"""Semantic checks of nodewarden objects that a CRD schema cannot express (pure, no I/O).

The CRD schema rejects malformed objects at admission. What it cannot know — whether a
referenced PowerPolicy or WorkerNode exists, whether an instance type is in the
catalogue, what the credential resolver refused — is checked here from facts the caller
fetched. The result becomes the
object's `Valid` condition: reason + a message naming the field and the fix.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import ValidationError

from nodewarden.api.containerdispatch import ContainerDispatchSpec
from nodewarden.api.powerintent import PowerIntentSpec
from nodewarden.api.powerpolicy import PowerPolicySpec
from nodewarden.api.warmcapacity import warm_problems
from nodewarden.api.workernode import WorkerNodeSpec
from nodewarden.units import parse_duration


@dataclass(frozen=True)
class Verdict:
    """Outcome of validating one object: becomes its `Valid` condition."""

    valid: bool
    reason: str
    message: str


VALID = Verdict(True, "Valid", "spec is valid")
PROCESSING_FAILED = "ProcessingFailed"


def failure_verdict(exc: BaseException) -> Verdict:
    """The verdict on an object whose processing raised `exc`: an error nobody foresaw
    (a bug), named so the object's author and the administrator see it."""
    detail = f"{type(exc).__name__}: {exc}"[:1000]
    return Verdict(
        False,
        PROCESSING_FAILED,
        f"nodewarden could not process this object ({detail}); every other object is still "
        "served, and this one is judged again at the next resync",
    )


def _pydantic_message(prefix: str, err: ValidationError) -> str:
    problems = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"])
        problems.append(f"{prefix}.{loc}: {e['msg']}" if loc else f"{prefix}: {e['msg']}")
    return "; ".join(problems)


T = TypeVar("T", WorkerNodeSpec, PowerPolicySpec, PowerIntentSpec, ContainerDispatchSpec)


def parse_spec(model: type[T], spec: Any) -> T | Verdict:
    """Parse a spec dict with its model; a Verdict (invalid) if it does not parse (or is
    not an object at all: a stored object may predate the schema)."""
    if spec is not None and not isinstance(spec, Mapping):
        return Verdict(False, "InvalidSpec", f"spec: must be an object, not {type(spec).__name__}")
    try:
        return model.model_validate(dict(spec or {}))
    except ValidationError as exc:
        return Verdict(False, "InvalidSpec", _pydantic_message("spec", exc))


def validate_workernode(
    spec: WorkerNodeSpec,
    *,
    namespace: str,
    policies: Collection[str],
    default_policy: str,
    credential_problems: Sequence[tuple[str, str]] = (),
    instance_types: Collection[str] | None = None,
) -> Verdict:
    """Check a WorkerNode's references: policy, instance type, and the credential problems
    (condition reason, message) the credential resolver found for its Secrets/endpoints."""
    problems: list[str] = []
    reason = "Valid"
    if spec.policy_ref is not None and spec.policy_ref.name not in policies:
        reason = "PolicyNotFound"
        problems.append(
            f"spec.policyRef.name: PowerPolicy {spec.policy_ref.name!r} not found in namespace "
            f"{namespace!r}; create it or point spec.policyRef at an existing PowerPolicy"
        )
    for cred_reason, message in credential_problems:
        reason = cred_reason if reason == "Valid" else reason
        problems.append(message)
    if (
        instance_types is not None
        and spec.node_type == "CloudVM"
        and spec.instance_type is not None
        and spec.instance_type not in instance_types
    ):
        reason = "UnknownInstanceType" if reason == "Valid" else reason
        known = ", ".join(sorted(instance_types)[:10]) or "none configured"
        problems.append(
            f"spec.instanceType: {spec.instance_type!r} is not in the operator's instance-type "
            f"catalogue (known: {known}); use a catalogue name"
        )
    if problems:
        return Verdict(False, reason, "; ".join(problems))
    if spec.policy_ref is None and default_policy not in policies:
        return Verdict(
            True,
            "BuiltinPolicy",
            f"no spec.policyRef and no PowerPolicy {default_policy!r}: built-in defaults apply",
        )
    return VALID


def validate_powerintent(
    spec: PowerIntentSpec, *, namespace: str, nodes: Collection[str]
) -> Verdict:
    if spec.node_name not in nodes:
        return Verdict(
            False,
            "NodeNotFound",
            f"spec.nodeName: WorkerNode {spec.node_name!r} not found in namespace {namespace!r}; "
            "PowerIntent specs are immutable, so delete this intent and create one for an "
            "existing node",
        )
    return VALID


def validate_powerpolicy(spec: PowerPolicySpec) -> Verdict:
    """Relations between knobs that CEL does not cover (warnings become invalid here)."""
    problems = []
    if spec.seconds("idle_threshold") == 0 and spec.min_warm_nodes == 0 and not spec.paused:
        problems.append(
            "spec.idleThreshold: 0s switches nodes off the moment they go idle; "
            "set at least a few minutes"
        )
    deadlines = spec.deadlines
    for name in ("shutdown", "wake", "ready"):
        if parse_duration(getattr(deadlines, name)).total_seconds() < 1:
            problems.append(f"spec.deadlines.{name}: must be at least 1s")
    problems.extend(
        f"spec.{p}"
        for p in warm_problems(spec.node_classes, spec.warm_capacity, spec.forecast_wake)
    )
    if problems:
        return Verdict(False, "InvalidSpec", "; ".join(problems))
    return VALID


def validate_containerdispatch(
    spec: ContainerDispatchSpec, *, instance_types_fit: bool | None = None
) -> Verdict:
    if instance_types_fit is False:
        return Verdict(
            False,
            "Unsatisfiable",
            "spec.resources: no instance type in the catalogue and no side node fits these "
            "requirements; lower them or add a fitting instance type",
        )
    return VALID
