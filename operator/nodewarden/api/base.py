"""Shared building blocks of the nodewarden API: the model base class, conditions, references.

Every CRD schema in `crds/` is generated from pydantic models derived from `ApiModel`
(see `nodewarden.api.crdgen`). Field names are snake_case in Python and camelCase on the
wire; every field must carry a description, which becomes the `kubectl explain` text.
"""

from __future__ import annotations

from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, GetJsonSchemaHandler
from pydantic.alias_generators import to_camel
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema

GROUP = "nodewarden.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
CATEGORY = "nodewarden"

DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"

MAX_GENERATION = 2**53
"""Bound of a metadata.generation copy: the largest integer JSON numbers hold exactly (the
API server reads a schema's maximum as a float64; 2^63-1 would not be an integer there)."""
MAX_CONDITIONS = 32
"""Conditions an object's status may hold (nodewarden writes at most a handful)."""
MAX_REASONS = 64
"""Reason codes one decision may carry."""
ReasonCode = Annotated[str, Field(max_length=128)]
"""A machine-readable reason code (docs/reason-codes.md)."""
MAX_STATUS_DOCUMENT_KEYS = 256
"""Top-level keys of a free-form status document (a Safety Record, the persisted power
state): written only by the operator through the status subresource."""


class ApiModel(BaseModel):
    """Base of every spec/status model: camelCase on the wire, unknown fields rejected."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        use_enum_values=False,
        validate_default=True,
    )

    # CEL rules (x-kubernetes-validations) attached to this object's schema.
    cel_rules: ClassVar[list[dict[str, str]]] = []

    @classmethod
    def __get_pydantic_json_schema__(
        cls, core_schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        schema = handler(core_schema)
        if cls.cel_rules:
            target = handler.resolve_ref_schema(schema)
            target["x-kubernetes-validations"] = [dict(rule) for rule in cls.cel_rules]
        return schema

    def to_wire(self) -> dict[str, Any]:
        """Serialise for the Kubernetes API (camelCase, enums as strings, no unset Nones)."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


class StatusModel(ApiModel):
    """Base of status models: tolerant of fields written by newer operator versions."""

    model_config = ConfigDict(extra="ignore")


class ConditionStatus(StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class Condition(StatusModel):
    """A standard Kubernetes condition (same shape as metav1.Condition)."""

    type: str = Field(
        description="Kind of condition in CamelCase, e.g. Valid, Ready, Admitted.",
        max_length=316,
    )
    status: ConditionStatus = Field(description="True, False or Unknown.")
    reason: str = Field(
        description="Machine-readable CamelCase reason for the last transition.",
        max_length=1024,
    )
    message: str = Field(
        default="",
        description="Human-readable detail about the last transition.",
        max_length=32768,
    )
    last_transition_time: datetime = Field(
        description="When the condition last changed status (RFC 3339).",
    )
    observed_generation: int | None = Field(
        default=None,
        ge=0,
        le=MAX_GENERATION,
        description="metadata.generation of the object this condition was computed from.",
    )


def now_utc() -> datetime:
    return datetime.now(tz=UTC)


def set_condition(
    conditions: list[Condition],
    type_: str,
    status: ConditionStatus | bool,
    reason: str,
    message: str,
    observed_generation: int | None,
    now: datetime,
) -> list[Condition]:
    """Return `conditions` with condition `type_` set; the transition time moves only on change."""
    if isinstance(status, bool):
        status = ConditionStatus.TRUE if status else ConditionStatus.FALSE
    out: list[Condition] = []
    found = False
    for cond in conditions:
        if cond.type != type_:
            out.append(cond)
            continue
        found = True
        changed = cond.status != status
        out.append(
            Condition(
                type=type_,
                status=status,
                reason=reason,
                message=message,
                last_transition_time=now if changed else cond.last_transition_time,
                observed_generation=observed_generation,
            )
        )
    if not found:
        out.append(
            Condition(
                type=type_,
                status=status,
                reason=reason,
                message=message,
                last_transition_time=now,
                observed_generation=observed_generation,
            )
        )
    return out


class LocalObjectReference(ApiModel):
    """Reference to another object in the same namespace."""

    name: str = Field(
        description="Name of the object in the same namespace.",
        min_length=1,
        max_length=253,
        pattern=DNS_SUBDOMAIN_PATTERN,
    )


class SecretKeyReference(ApiModel):
    """Reference to one key of a Secret in the operator's namespace."""

    name: str = Field(
        description="Name of the Secret (in the same namespace as the referring object).",
        min_length=1,
        max_length=253,
        pattern=DNS_SUBDOMAIN_PATTERN,
    )
    key: str = Field(
        description="Key inside the Secret's data whose value is used.",
        min_length=1,
        max_length=253,
        pattern=r"^[-._a-zA-Z0-9]+$",
    )


PowerSetting = Literal["On", "Off", "Auto"]


MAX_FENCE_SCOPES = 16

FENCE_DESCRIPTION = (
    "Fencing tokens of the writers of this status: Lease name -> that Lease's "
    "leaseTransitions when the write was made. A write carrying a lower token than the "
    "status already holds for the same Lease is refused (a replica that lost its "
    "leadership cannot overwrite its successor's writes)."
)

FENCE_RULE: dict[str, str] = {
    "rule": "!has(oldSelf.fence) || (has(self.fence) && oldSelf.fence.all(k, k in self.fence "
    "&& self.fence[k] >= oldSelf.fence[k]))",
    "message": "status.fence: a lower fencing token than the one recorded; this write comes "
    "from a replica that is no longer the leader of its Lease",
    "fieldPath": ".fence",
}
"""The CEL transition rule every status model with a `fence` field carries."""

FenceTokens = dict[str, Annotated[int, Field(ge=0, le=2**31 - 1)]]


def fence_field() -> Any:
    """The `status.fence` field (with `FENCE_RULE` in the model's `cel_rules`)."""
    return Field(default=None, max_length=MAX_FENCE_SCOPES, description=FENCE_DESCRIPTION)
