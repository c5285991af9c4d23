"""NodeFacts: the evidence about one node that power decisions are made from, with provenance.

Each piece of evidence is a *reading*: a value plus `source` (which adapter or object
supplied it, e.g. "redfish:https://bmc-7/redfish/v1/Systems/1#PowerState") and
`observed_at` (when the source observed it, timezone-aware). A missing reading is
`None` and is never read as "all fine": decisive readings that are missing or older
than the policy's telemetryMaxAge make the gates DEFER.

The shell (kopf handlers, adapters) keeps the latest reading of each kind per node and
passes the whole `NodeFacts` to every call. Events that carry observations (power,
ready probe, demand, manual intent) are merged into the facts by `apply_event` in
`nodewarden.policy.events` before a step decides, so there is one source of truth.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import AwareDatetime, Field, model_validator

from nodewarden.api.powerintent import PowerAction
from nodewarden.api.powerpolicy import ResetAction
from nodewarden.api.workernode import ControlMethod, IdleBehavior, NodeType, ObservedPower
from nodewarden.policy.base import CoreModel

InhibitorMode = Literal["block", "delay", "block-weak"]
DesiredPowerSetting = Literal["On", "Off", "Auto"]
FactName = Literal[
    "demand",
    "work",
    "power",
    "ready",
    "inhibitors",
    "capability",
    "uptime",
    "identity",
    "desired",
    "fleet",
    "vm",
]


class Reading(CoreModel):
    """Provenance shared by every reading."""

    source: str = Field(min_length=1, max_length=512, description="Who supplied the value.")
    observed_at: AwareDatetime = Field(description="When the source observed it.")


class DemandReading(Reading):
    """Qualified queued demand for this node: queued containers that fit it."""

    queued: int = Field(ge=0, description="Number of queued containers that fit this node.")
    containers: tuple[str, ...] = Field(
        default=(), max_length=64, description="Some of their UUIDs, for the record."
    )


class GpuWork(CoreModel):
    """A GPU node's GPU evidence (`rules.gpuwork`): its GPUs, the containers holding
    them in the dispatcher's ledger, since when none has, and the GPU utilisation its
    last probe read (nvidia-smi), each with its source and time."""

    gpus: int = Field(ge=1, le=64, description="GPUs the node offers (its capacity).")
    gpu_jobs: int = Field(
        ge=0, description="Containers holding GPUs on it (a runner of unknown size counts)."
    )
    gpu_idle_since: AwareDatetime | None = Field(
        default=None, description="Since when no container has held a GPU (None while one does)."
    )
    source: str = Field(min_length=1, max_length=512)
    observed_at: AwareDatetime
    utilisation: tuple[float | None, ...] | None = Field(
        default=None,
        max_length=64,
        description="Percent busy per GPU from the last probe (None: no GPU tool answered).",
    )
    utilisation_source: str | None = Field(default=None, max_length=512)
    utilisation_at: AwareDatetime | None = None


class WorkReading(Reading):
    """Work running on the node (from the node probe's runner list)."""

    active_jobs: int = Field(ge=0, description="Containers/jobs running on the node.")
    idle_since: AwareDatetime | None = Field(
        default=None, description="Since when no job has run (None while busy or unknown)."
    )
    gpu: GpuWork | None = Field(
        default=None, description="A GPU node's GPU evidence (None: no GPUs, or not known)."
    )

    @model_validator(mode="after")
    def _consistent(self) -> WorkReading:
        if self.active_jobs > 0 and self.idle_since is not None:
            raise ValueError("idleSince must be unset while activeJobs > 0")
        if self.idle_since is not None and self.idle_since > self.observed_at:
            raise ValueError("idleSince must not be after observedAt")
        return self


class PowerReading(Reading):
    """Observed power from a trusted source (Redfish PowerState, cloud instance state).

    Adapters must not synthesise a PowerReading from indirect hints (an SSH timeout is
    not proof of Off); when they cannot tell, they report "Unknown".
    """

    power: ObservedPower


class ReadyReading(Reading):
    """Result of the runtime ready probe (the services the workload needs)."""

    passed: bool
    detail: str = Field(default="", max_length=1024)


class Inhibitor(CoreModel):
    """One systemd-logind inhibitor lock (ListInhibitors row)."""

    what: str = Field(min_length=1, max_length=256, description="e.g. 'shutdown:sleep'.")
    who: str = Field(default="", max_length=256)
    why: str = Field(default="", max_length=1024)
    mode: InhibitorMode
    uid: int | None = None
    pid: int | None = None

    @property
    def blocks_shutdown(self) -> bool:
        """A block (or block-weak) lock whose `what` includes shutdown forbids power-off."""
        return self.mode != "delay" and "shutdown" in self.what.split(":")


class InhibitorReading(Reading):
    """The inhibitor locks held on the node."""

    inhibitors: tuple[Inhibitor, ...] = Field(default=(), max_length=256)

    @property
    def blocking(self) -> tuple[Inhibitor, ...]:
        """The locks that forbid power-off (block/block-weak mode on 'shutdown')."""
        if not self.inhibitors:
            return ()
        return tuple([i for i in self.inhibitors if i.blocks_shutdown])


class CapabilityReading(Reading):
    """How the node's power is controlled and which actions its controller allows.

    `allowable` is what discovery found (Redfish ResetType@Redfish.AllowableValues or
    ActionInfo; 'WakeOnLan' if ethtool shows Wake-on g; 'SshPoweroff' if SSH works).
    None means discovery failed or was not done: treated as unavailable.
    """

    control_method: ControlMethod
    allowable: tuple[ResetAction, ...] | None = None
    refusal: str | None = Field(
        default=None,
        max_length=1024,
        description="Why discovery was not attempted: the credential resolver refused.",
    )


class IdentityReading(Reading):
    """Whether the BMC manages the host SSH reached: the BMC's ComputerSystem.UUID and the
    host's DMI product UUID (both lower case), each with its source and time, and when the
    two last matched (recorded at enrolment, re-verified whenever the host answers).
    `source`/`observed_at` are those of the newest part."""

    bmc_uuid: str | None = Field(default=None, max_length=64)
    bmc_source: str = Field(default="-", max_length=512)
    bmc_observed_at: AwareDatetime | None = None
    host_uuid: str | None = Field(default=None, max_length=64)
    host_problem: str | None = Field(
        default=None, max_length=512, description="Why the host's UUID could not be read."
    )
    host_source: str = Field(default="-", max_length=512)
    host_observed_at: AwareDatetime | None = None
    matched_at: AwareDatetime | None = Field(
        default=None, description="When the two UUIDs last matched (the recorded match)."
    )
    matched_uuid: str | None = Field(
        default=None, max_length=64, description="The UUID of that match."
    )


class UptimeReading(Reading):
    """When the node last came up (boot time from the node or the cloud's launch time)."""

    on_since: AwareDatetime

    @model_validator(mode="after")
    def _not_after_observation(self) -> UptimeReading:
        if self.on_since > self.observed_at:
            raise ValueError("onSince must not be after observedAt")
        return self


class DesiredReading(Reading):
    """What the WorkerNode spec asks for (desired power is never merged with observed)."""

    power: DesiredPowerSetting = "Auto"
    idle_behavior: IdleBehavior = "run"


class OverrideRequest(CoreModel):
    """The audited override a manual PowerIntent carries (spec.override)."""

    inhibitors: bool = False
    force_off: bool = False
    recorded_identity: bool = False
    justification: str = Field(min_length=10, max_length=2048)


class ManualIntent(Reading):
    """A PowerIntent made by a person for this node (source Manual)."""

    name: str = Field(min_length=1, max_length=253)
    action: PowerAction
    requested_by: str = Field(default="", max_length=256)
    requester_verified: bool = Field(
        default=False,
        description=(
            "requested_by is the user the API server authenticated: the requester admission "
            "policy (which also checks the powerintents/override permission) was in force. "
            "An override of an unverified requester is refused."
        ),
    )
    reason: str = Field(default="", max_length=2048)
    override: OverrideRequest | None = None


class VmReading(Reading):
    """What the node-manager rules read about a cloud VM: the cloud list, probe history and
    the WorkerNode (source e.g. 'cloud:ec2 + ssh probes')."""

    booted_at: AwareDatetime = Field(description="Launch time reported by the cloud.")
    found_at: AwareDatetime | None = Field(
        default=None,
        description=(
            "When this operator process first found the VM already running (a restart, a "
            "takeover, an adoption); None when it launched it. A new process has no probe "
            "history of a VM it found: its boot grace and lameAfter count from here."
        ),
    )
    paired: bool = Field(description="A probe of this node has succeeded at least once.")
    last_heartbeat: AwareDatetime | None = Field(
        default=None, description="When the last successful probe finished."
    )
    probe_attempts: int = Field(
        default=0, ge=0, description="Probe attempts since the last success (all, if never)."
    )
    broken: bool = Field(default=False, description="The runner reported the node broken.")
    deletion_requested: bool = Field(default=False, description="A person deleted the WorkerNode.")
    stopped: bool = Field(
        default=False,
        description=(
            "The cloud lists the instance stopped: nodewarden never stops VMs, so it stopped "
            "by itself (host failure, a spot stop) and cannot run work (matrix 'down')."
        ),
    )

    @property
    def grace_from(self) -> datetime:
        """Where the boot grace and lameAfter count from: the launch, or the moment this
        process found the VM when that is later."""
        found = self.found_at
        return self.booted_at if found is None or found <= self.booted_at else found


class FleetReading(Reading):
    """Fleet-wide counts the disruption budget and min-warm rule need."""

    transitions_in_progress: int = Field(
        ge=0, description="Nodes under this policy draining, shutting down or waking now."
    )
    warm_idle_nodes: int = Field(
        ge=0, description="Nodes under this policy that are on, ready, open and idle (incl. this)."
    )
    # -- warm capacity of the node's class (rules.warm; all 0 / None without a class) ---
    node_class: str | None = Field(
        default=None, max_length=63, description="The node's class (spec.nodeClasses)."
    )
    class_warm_idle: int = Field(
        default=0, ge=0, description="Nodes of the class on, idle and open (incl. this)."
    )
    class_coming: int = Field(
        default=0, ge=0, description="Nodes of the class waking or being verified after a boot."
    )
    warm_target: int = Field(
        default=0, ge=0, description="Warm nodes of the class the levers in force want now."
    )
    warm_lever: Literal["WarmWindow", "Forecast"] | None = Field(
        default=None, description="The lever behind warm_target."
    )
    warm_why: str | None = Field(
        default=None, max_length=1024, description="The window or forecast behind it."
    )
    shadow_target: int = Field(
        default=0, ge=0, description="Warm nodes a lever in Shadow would want (not enforced)."
    )
    shadow_why: str | None = Field(
        default=None, max_length=1024, description="The Shadow lever's window or forecast."
    )


class ConsolidationReading(Reading):
    """Consolidation by drain chose this node (`rules.consolidation`): it stops admitting
    new work, finishes what it runs, then goes the usual idle way. The evidence."""

    utilisation: float = Field(ge=0, le=1, description="Largest used share of vCPU/RAM/GPU.")
    hourly_price: float = Field(ge=0, description="The node's hourly price.")
    price_per_used: float | None = Field(
        default=None, ge=0, description="Hourly price divided by the used share."
    )
    target_price_per_used: float | None = Field(
        default=None,
        ge=0,
        description="The dearest price per used share among the nodes its work could go to.",
    )
    targets: dict[str, str] = Field(
        default_factory=dict, description="Container uuid -> the open node it could go to."
    )
    why: str = Field(default="", max_length=1024)
    budget: str = Field(default="", max_length=256, description="The consolidation budget.")


class NodeFacts(CoreModel):
    """Everything known about one node at one moment; each reading carries provenance."""

    node: str = Field(min_length=1, max_length=253)
    node_type: NodeType = "SideNode"
    demand: DemandReading | None = None
    work: WorkReading | None = None
    power: PowerReading | None = None
    ready: ReadyReading | None = None
    inhibitors: InhibitorReading | None = None
    capability: CapabilityReading | None = None
    uptime: UptimeReading | None = None
    identity: IdentityReading | None = None
    desired: DesiredReading | None = None
    intent: ManualIntent | None = None
    fleet: FleetReading | None = None
    vm: VmReading | None = None
    consolidation: ConsolidationReading | None = None
    """Set while consolidation drains the node (evidence only: not a decisive reading)."""

    def newest(self) -> datetime | None:
        """The latest observed_at of all readings (None if there are none)."""
        times = [r.observed_at for r in self.readings().values()]
        return max(times) if times else None

    def readings(self) -> dict[str, Reading]:
        """The readings present, by field name."""
        out: dict[str, Reading] = {}
        for name in _READING_FIELDS:
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        return out


_READING_FIELDS = (
    "demand",
    "work",
    "power",
    "ready",
    "inhibitors",
    "capability",
    "uptime",
    "identity",
    "desired",
    "intent",
    "fleet",
    "vm",
)
