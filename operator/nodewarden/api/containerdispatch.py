"""ContainerDispatch (`cd`): one container to run, its requirements and its dispatch state."""

from __future__ import annotations

from datetime import datetime
from typing import ClassVar, Literal

from pydantic import Field

from nodewarden.api.base import (
    FENCE_RULE,
    ApiModel,
    Condition,
    FenceTokens,
    StatusModel,
    fence_field,
)
from nodewarden.units import Quantity

ContainerPhase = Literal["Queued", "Locked", "Running", "Complete", "Cancelled", "Failed"]
TERMINAL_PHASES: frozenset[str] = frozenset({"Complete", "Cancelled", "Failed"})

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
    environment: dict[str, str] = Field(
        default_factory=dict, description="Environment variables for the container."
    )
    cwd: str | None = Field(default=None, max_length=4096, description="Working directory.")
    duration_hint_seconds: float | None = Field(
        default=None,
        ge=0,
        description="Expected run time in seconds (used by the stub runner in demos).",
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
    command: list[str] = Field(
        default_factory=list, max_length=4096, description="Command and arguments."
    )
    runtime: RuntimeConfig = Field(
        default_factory=RuntimeConfig, description="Runtime configuration passed to the runner."
    )
    cancel: bool = Field(
        default=False,
        description="Set true to cancel: the runner is signalled and the container ends Cancelled.",
    )


class ContainerDispatchStatus(StatusModel):
    """Where the container is in its dispatch lifecycle."""

    cel_rules: ClassVar[list[dict[str, str]]] = [FENCE_RULE]

    fence: FenceTokens | None = fence_field()

    observed_generation: int | None = Field(
        default=None, description="metadata.generation last processed by the operator."
    )
    phase: ContainerPhase | None = Field(
        default=None, description="Queued, Locked, Running, Complete, Cancelled or Failed."
    )
    scheduling_status: str | None = Field(
        default=None,
        description="Human-readable scheduling status, e.g. 'waiting for a new m5.large to boot'.",
    )
    reason: str | None = Field(
        default=None, description="Machine-readable reason for the current phase."
    )
    node: str | None = Field(default=None, description="WorkerNode the container is assigned to.")
    instance_type: str | None = Field(
        default=None, description="Instance type chosen for the container."
    )
    locked_by: str | None = Field(default=None, description="Dispatcher id holding the lock.")
    attempts: int = Field(default=0, ge=0, description="Runs started so far.")
    lock_flaps: int = Field(default=0, ge=0, description="Times the lock was released unused.")
    runner_pid: int | None = Field(default=None, description="PID of the runner on the node.")
    exit_code: int | None = Field(default=None, description="Exit code of the container.")
    first_seen: datetime | None = Field(
        default=None, description="When the operator first saw the container."
    )
    locked_at: datetime | None = Field(default=None, description="When it was last locked.")
    started_at: datetime | None = Field(default=None, description="When the runner last started.")
    finished_at: datetime | None = Field(default=None, description="When it reached a final phase.")
    conditions: list[Condition] = Field(default_factory=list, description="Standard conditions.")
