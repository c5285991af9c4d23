"""Fault knobs of the stub cloud: every failure a real cloud (or a real VM) can show.

Rates are probabilities per call or per VM, drawn from one `random.Random(seed)` so a
test with a fixed seed and a fixed call order sees the same faults every run.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

RateLimitStyle = Literal["ec2-503", "http-429"]
HungSshMode = Literal["connect", "commands"]


class StubFaults(BaseModel):
    """What goes wrong in the stub cloud. All defaults: nothing."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    seed: int = Field(default=0, description="Seed of the fault dice.")

    # cloud API faults
    create_error_rate: float = Field(
        default=0.0, ge=0, le=1, description="Share of creates failing with 500 InternalError."
    )
    destroy_error_rate: float = Field(
        default=0.0, ge=0, le=1, description="Share of destroys failing with 500 InternalError."
    )
    rate_limit_rate: float = Field(
        default=0.0, ge=0, le=1, description="Share of API calls refused as rate limited."
    )
    rate_limit_style: RateLimitStyle = Field(
        default="ec2-503",
        description="'ec2-503': 503 RequestLimitExceeded; 'http-429': 429 Too Many Requests.",
    )
    rate_limit_retry_after: float | None = Field(
        default=2.0, ge=0, description="Retry-After seconds sent with rate limits (None: none)."
    )
    instance_quota: int | None = Field(
        default=None, ge=0, description="Max live instances (InstanceLimitExceeded beyond)."
    )
    vcpu_quota: dict[str, int] = Field(
        default_factory=dict,
        description="Max live vCPUs per quota group (VcpuLimitExceeded beyond).",
    )
    type_capacity: dict[str, int] = Field(
        default_factory=dict,
        description=(
            "Max live instances per provider type (InsufficientInstanceCapacity beyond); "
            "0 = that type is never available."
        ),
    )
    stale_tags_for: float = Field(
        default=0.0, ge=0, description="Seconds list calls keep showing tags as they were."
    )
    destroy_delay: float = Field(
        default=0.0, ge=0, description="Seconds a destroyed VM stays listed as stopping."
    )
    list_delay: float = Field(
        default=0.0,
        ge=0,
        description="Seconds every list call takes (a slow cloud list: a large account, a "
        "throttled API).",
    )

    # VM faults
    ssh_start_delay: float = Field(
        default=0.0, ge=0, description="Seconds from create until the VM's SSH server listens."
    )
    boot_delay: float = Field(
        default=0.0, ge=0, description="Seconds the ready command reports booting once up."
    )
    broken_rate: float = Field(
        default=0.0, ge=0, le=1, description="Share of VMs that never become ready."
    )
    runner_crash_rate: float = Field(
        default=0.0, ge=0, le=1, description="Share of runners that crash (per run)."
    )
    hung_ssh_rate: float = Field(
        default=0.0, ge=0, le=1, description="Share of VMs whose SSH server hangs."
    )
    hung_ssh_mode: HungSshMode = Field(
        default="connect",
        description=(
            "'connect': TCP accepted, SSH never spoken; 'commands': login works, commands "
            "never answer."
        ),
    )
