"""ContainerDispatch (`cd`): one container to run, its requirements and its dispatch state."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, ClassVar, Literal

from pydantic import Field

from nodewarden.api.base import (
    FENCE_RULE,
    MAX_CONDITIONS,
    MAX_GENERATION,
    ApiModel,
    Condition,
    FenceTokens,
    StatusModel,
    fence_field,
)
from nodewarden.units import Quantity

ContainerPhase = Literal["Queued", "Locked", "Running", "Complete", "Cancelled", "Failed"]
TERMINAL_PHASES: frozenset[str] = frozenset({"Complete", "Cancelled", "Failed"})

ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
EnvName = Annotated[str, Field(pattern=ENV_NAME_PATTERN, max_length=256)]
"""An environment variable name (a C identifier, as a POSIX shell accepts it)."""
EnvValue = Annotated[str, Field(max_length=32768)]
Argument = Annotated[str, Field(max_length=32768)]

UUID_PATTERN = r"^[a-z0-9]{5}-[a-z0-9]{5}-[a-z0-9]{15}$|^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"


class ContainerResources(ApiModel):
    """What the container needs from a node."""

    vcpus: int = Field(default=1, ge=1, le=4096, description="Virtual CPUs.")
    ram: Quantity = Field(default="1Gi", description="Memory, e.g. '4Gi'.")
    scratch: Quantity = Field(default="0", description="Local scratch space, e.g. '100Gi'.")
    gpus: int = Field(default=0, ge=0, le=64, description="Number of GPUs.")
    gpu_model: str | None = Field(
        default=None, max_length=128, description="Required GPU model; unset = any."
    )
    preemptible: bool = Field(
        default=False,
        description="Run on a preemptible (spot) instance type; matched exactly.",
    )


class RuntimeConfig(ApiModel):
    """How the runner starts the container on the node."""

    image: str = Field(default="", max_length=1024, description="Container image reference.")
    environment: dict[EnvName, EnvValue] = Field(
        default_factory=dict,
        max_length=256,
        description="Environment variables for the container (names: letters, digits and "
        "underscores, not starting with a digit).",
    )
    cwd: str | None = Field(default=None, max_length=4096, description="Working directory.")
    duration_hint_seconds: float | None = Field(
        default=None,
        ge=0,
        le=31_536_000,
        description="Expected run time in seconds, at most a year (used by the stub runner "
        "in demos).",
    )
    exit_code_hint: int | None = Field(
        default=None,
        ge=0,
        le=255,
        description="Exit code the stub runner reports (demos and tests only).",
    )


class ContainerDispatchSpec(ApiModel):
    """One container to run."""

    cel_rules: ClassVar[list[dict[str, str]]] = [
        {
            "rule": "self.uuid == oldSelf.uuid",
            "message": "spec.uuid is immutable",
            "fieldPath": ".uuid",
        },
        {
            "rule": "!has(oldSelf.cancel) || !oldSelf.cancel || self.cancel",
            "message": "a cancelled container cannot be un-cancelled; create a new one",
            "fieldPath": ".cancel",
        },
    ]

    uuid: str = Field(
        description="Container UUID (Arvados form zzzzz-dz642-xxxxxxxxxxxxxxx or an RFC 4122 UUID).",
        pattern=UUID_PATTERN,
        max_length=36,
    )
    priority: int = Field(
        default=500,
        ge=0,
        le=1000,
        description="Higher runs first. 0 = do not start (held).",
    )
    resources: ContainerResources = Field(
        default_factory=ContainerResources, description="What the container needs."
    )
    command: list[Argument] = Field(
        default_factory=list, max_length=4096, description="Command and arguments."
    )
    runtime: RuntimeConfig = Field(
        default_factory=RuntimeConfig, description="Runtime configuration passed to the runner."
    )
    cancel: bool = Field(
        default=False,
        description="Set true to cancel: the runner is signalled and the container ends Cancelled.",
    )


OBJECT_CEL_RULES: tuple[dict[str, str], ...] = (
    {
        "rule": (
            "!has(oldSelf.status) || !has(oldSelf.status.phase) || "
            "!(oldSelf.status.phase in ['Locked', 'Running']) || "
            "self.spec.resources == oldSelf.spec.resources"
        ),
        "message": (
            "spec.resources cannot change while the container is Locked or Running: its node "
            "holds what it was locked with (status.resources); cancel it and create a new one"
        ),
        "fieldPath": ".spec.resources",
    },
)
"""CEL rules on the whole object (they read the status as well as the spec). A spec edit
never touches the status, so the rule sees the phase the container is in."""


class ContainerDispatchStatus(StatusModel):
    """Where the container is in its dispatch lifecycle."""

    cel_rules: ClassVar[list[dict[str, str]]] = [FENCE_RULE]

    fence: FenceTokens | None = fence_field()

    observed_generation: int | None = Field(
        default=None,
        ge=0,
        le=MAX_GENERATION,
        description="metadata.generation last processed by the operator.",
    )
    phase: ContainerPhase | None = Field(
        default=None, description="Queued, Locked, Running, Complete, Cancelled or Failed."
    )
    scheduling_status: str | None = Field(
        default=None,
        max_length=32768,
        description="Human-readable scheduling status, e.g. 'waiting for a new m5.large to boot'.",
    )
    reason: str | None = Field(
        default=None, max_length=1024, description="Machine-readable reason for the current phase."
    )
    node: str | None = Field(
        default=None, max_length=253, description="WorkerNode the container is assigned to."
    )
    instance_type: str | None = Field(
        default=None, max_length=128, description="Instance type chosen for the container."
    )
    locked_by: str | None = Field(
        default=None, max_length=253, description="Dispatcher id holding the lock."
    )
    attempts: int = Field(default=0, ge=0, le=1_000_000, description="Runs started so far.")
    lock_flaps: int = Field(
        default=0, ge=0, le=1_000_000, description="Times the lock was released unused."
    )
    runner_pid: int | None = Field(
        default=None, ge=0, le=2**31, description="PID of the runner on the node."
    )
    exit_code: int | None = Field(
        default=None, ge=-(2**31), le=2**31, description="Exit code of the container."
    )
    resources: ContainerResources | None = Field(
        default=None,
        description=(
            "What the container holds on its node: spec.resources as they were when it was "
            "locked. The node's capacity is counted from this, not from the spec; cleared "
            "when the container is requeued."
        ),
    )
    first_seen: datetime | None = Field(
        default=None, description="When the operator first saw the container."
    )
    locked_at: datetime | None = Field(default=None, description="When it was last locked.")
    started_at: datetime | None = Field(default=None, description="When the runner last started.")
    finished_at: datetime | None = Field(default=None, description="When it reached a final phase.")
    conditions: list[Condition] = Field(
        default_factory=list, max_length=MAX_CONDITIONS, description="Standard conditions."
    )
