"""WorkerNode (`wn`): one machine, a cloud VM or a side node; spec = wanted, status = observed.

Desired power (spec.power), observed power (status.observedPower, from a trusted source)
and runtime readiness (status.readiness, from a ready probe) are separate fields and are
never merged.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field

from nodewarden.api.base import (
    FENCE_RULE,
    MAX_CONDITIONS,
    MAX_GENERATION,
    MAX_REASONS,
    MAX_STATUS_DOCUMENT_KEYS,
    ApiModel,
    Condition,
    FenceTokens,
    LocalObjectReference,
    ReasonCode,
    SecretKeyReference,
    StatusModel,
    fence_field,
)
from nodewarden.api.energy import NodeEnergyStatus
from nodewarden.units import MacAddress, Quantity

MAX_NODE_CONTAINERS = 4096
"""Containers one node's status lists (a node never runs more than it has vCPUs)."""
ContainerName = Annotated[str, Field(max_length=253)]

NodeType = Literal["CloudVM", "SideNode"]
IdleBehavior = Literal["run", "hold", "drain"]
ControlMethod = Literal["Cloud", "Redfish", "WakeOnLan", "None"]
ObservedPower = Literal["On", "Off", "PoweringOn", "PoweringOff", "Unknown"]
Readiness = Literal["Ready", "NotReady", "Unknown"]
Admission = Literal["Open", "GPUOnly", "Closed"]
NodeState = Literal[
    "Booting",
    "Idle",
    "Active",
    "Draining",
    "ShuttingDown",
    "Off",
    "Waking",
    "Unknown",
    "Blocked",
]


class BmcEndpoint(ApiModel):
    """How to reach the node's BMC over Redfish (HTTPS)."""

    endpoint: str = Field(
        description="Base URL of the Redfish service, e.g. https://10.0.0.21 (https only).",
        pattern=r"^https://[^\s/]+(:[0-9]+)?(/.*)?$",
        max_length=2048,
    )
    system_id: str | None = Field(
        default=None,
        max_length=256,
        description="ComputerSystem id; if unset the only member of /redfish/v1/Systems is used.",
    )
    username_secret_ref: SecretKeyReference = Field(
        description="Secret key holding the BMC user name."
    )
    password_secret_ref: SecretKeyReference = Field(
        description="Secret key holding the BMC password (never logged or stored in status)."
    )
    ca_bundle_secret_ref: SecretKeyReference | None = Field(
        default=None,
        description="Secret key holding a PEM CA bundle to verify the BMC's certificate.",
    )
    use_sessions: bool = Field(
        default=True,
        description=(
            "Log in through SessionService (X-Auth-Token); falls back to Basic auth when the "
            "login fails for another reason than rejected credentials (401/403 is an error, "
            "never retried as Basic)."
        ),
    )


class WakeOnLanTarget(ApiModel):
    """Where to send the Wake-on-LAN magic packet for this node."""

    mac: MacAddress = Field(description="MAC address of the NIC armed for Wake-on-LAN.")
    broadcast_address: str = Field(
        default="255.255.255.255",
        max_length=64,
        pattern=r"^[0-9]{1,3}(\.[0-9]{1,3}){3}$",
        description="IPv4 broadcast address of the node's segment.",
    )
    port: int = Field(default=9, ge=1, le=65535, description="UDP port (usually 9 or 7).")
    interface: str | None = Field(
        default=None,
        max_length=15,
        pattern=r"^[A-Za-z0-9_.:-]+$",
        description="Interface name on the node (for the ethtool Wake-on capability check).",
    )
    secure_on_secret_ref: SecretKeyReference | None = Field(
        default=None, description="Secret key holding a 6-byte SecureOn password (hex)."
    )


class SshEndpoint(ApiModel):
    """How nodewarden reaches the node over SSH for probes and runners."""

    address: str | None = Field(
        default=None,
        max_length=253,
        description="Host name or IP address; for cloud VMs the instance address is used.",
    )
    port: int = Field(default=22, ge=1, le=65535, description="SSH port.")
    user: str = Field(
        default="root",
        min_length=1,
        max_length=64,
        pattern=r"^[a-z_][a-z0-9_.-]*$",
        description="Login user.",
    )
    private_key_secret_ref: SecretKeyReference | None = Field(
        default=None, description="Secret key holding the SSH private key (PEM/OpenSSH)."
    )
    known_hosts_secret_ref: SecretKeyReference | None = Field(
        default=None,
        description=(
            "Secret key holding known_hosts lines for this node. If unset the host key is "
            "learned on first use only after the node proves its per-instance secret."
        ),
    )


class NodeCapacity(ApiModel):
    """Resources a side node offers to containers (cloud VMs take them from the catalogue)."""

    vcpus: int = Field(ge=1, le=4096, description="Number of virtual CPUs.")
    ram: Quantity = Field(description="Memory, e.g. '256Gi'.")
    scratch: Quantity = Field(default="0", description="Local scratch disk, e.g. '1Ti'.")
    gpus: int = Field(default=0, ge=0, le=64, description="Number of GPUs.")
    gpu_model: str | None = Field(
        default=None, max_length=128, description="GPU model, e.g. 'nvidia-a100'."
    )


class WorkerNodeSpec(ApiModel):
    """What we want from this machine."""

    cel_rules: ClassVar[list[dict[str, str]]] = [
        {
            "rule": "self.controlMethod != 'Redfish' || has(self.bmc)",
            "message": "controlMethod Redfish needs spec.bmc",
            "fieldPath": ".bmc",
        },
        {
            "rule": "self.controlMethod != 'WakeOnLan' || has(self.wakeOnLan)",
            "message": "controlMethod WakeOnLan needs spec.wakeOnLan",
            "fieldPath": ".wakeOnLan",
        },
        {
            "rule": "self.nodeType != 'CloudVM' || has(self.instanceType)",
            "message": "a CloudVM node needs spec.instanceType",
            "fieldPath": ".instanceType",
        },
        {
            "rule": "self.nodeType != 'CloudVM' || self.controlMethod == 'Cloud'",
            "message": "a CloudVM node is controlled through the cloud API (controlMethod Cloud)",
            "fieldPath": ".controlMethod",
        },
        {
            "rule": "self.nodeType != 'SideNode' || self.controlMethod != 'Cloud'",
            "message": "a SideNode cannot use controlMethod Cloud; use Redfish, WakeOnLan or None",
            "fieldPath": ".controlMethod",
        },
        {
            "rule": "self.nodeType != 'SideNode' || has(self.capacity)",
            "message": "a SideNode needs spec.capacity (vcpus, ram, ...)",
            "fieldPath": ".capacity",
        },
    ]

    node_type: NodeType = Field(
        description="CloudVM (created/destroyed through the cloud API) or SideNode (fixed hardware)."
    )
    power: Literal["On", "Off", "Auto"] = Field(
        default="Auto",
        description=(
            "Desired power. Auto lets the policy decide; On/Off pin it (still subject to the "
            "safety gates)."
        ),
    )
    idle_behavior: IdleBehavior = Field(
        default="run",
        description=(
            "run: accept work and shut down when idle per policy; hold: accept no new work, "
            "never shut down automatically; drain: accept no new work, shut down once idle."
        ),
    )
    instance_type: str | None = Field(
        default=None,
        min_length=1,
        max_length=128,
        description="Instance type name from the catalogue (CloudVM).",
    )
    control_method: ControlMethod = Field(
        default="Cloud",
        description="How power is controlled: Cloud API, Redfish BMC, Wake-on-LAN (+SSH poweroff), None.",
    )
    bmc: BmcEndpoint | None = Field(
        default=None, description="Redfish BMC (controlMethod Redfish)."
    )
    wake_on_lan: WakeOnLanTarget | None = Field(
        default=None, description="Wake-on-LAN target (controlMethod WakeOnLan)."
    )
    ssh: SshEndpoint = Field(
        default_factory=SshEndpoint, description="SSH access for probes and runners."
    )
    capacity: NodeCapacity | None = Field(
        default=None, description="Resources offered to containers (SideNode)."
    )
    policy_ref: LocalObjectReference | None = Field(
        default=None,
        description="PowerPolicy that governs this node; if unset the operator's default policy.",
    )
    node_class: str | None = Field(
        default=None,
        min_length=1,
        max_length=63,
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
        description=(
            "The class of machine this node is: its configured draws and energy price come "
            "from the operator config's power.energy.classes entry of this name (docs/"
            "energy.md). Unset: the instance type for a CloudVM, 'default' for a SideNode."
        ),
    )
    cost_per_hour: float | None = Field(
        default=None,
        ge=0,
        le=100000,
        description=(
            "SideNode: what running this machine costs per hour (owned hardware: 0 if unset, or "
            "what the site charges for its power). The scheduler wakes it instead of creating a "
            "cloud VM when it fits and is not dearer. CloudVM: taken from the catalogue."
        ),
    )


class ProbeStatus(StatusModel):
    """Outcome of the most recent SSH probe."""

    time: datetime | None = Field(default=None, description="When the probe finished.")
    result: Literal["Ready", "Booting", "Failed", "Unreachable", "HostKeyMismatch"] | None = Field(
        default=None, description="Outcome of the probe."
    )
    message: str | None = Field(
        default=None, max_length=32768, description="Detail of a failed probe."
    )
    last_success: datetime | None = Field(
        default=None, description="When the last successful probe finished."
    )
    attempts_since_success: int = Field(
        default=0, ge=0, le=2**31, description="Probe attempts since the last successful one."
    )


class SafetyRecordSummary(StatusModel):
    """The last Safety Record written for this node (full record in the PowerIntent)."""

    power_intent: str | None = Field(
        default=None, max_length=253, description="Name of the PowerIntent."
    )
    decision: str | None = Field(
        default=None, max_length=32, description="SHUTDOWN, START, DRAIN, DEFER, BLOCK or NONE."
    )
    reasons: list[ReasonCode] = Field(
        default_factory=list, max_length=MAX_REASONS, description="Reason codes of the decision."
    )
    summary: str | None = Field(
        default=None, max_length=32768, description="One-line summary of the record."
    )
    time: datetime | None = Field(default=None, description="When the decision was made.")


class NodeEligibility(StatusModel):
    """Why not yet: when the node becomes eligible for its next power transition, or what
    holds it (`policy.eligibility`; the same rule code as `nodewarden explain`)."""

    direction: Literal["Shutdown", "Wake"] | None = Field(
        default=None, description="The transition evaluated: Shutdown (node on) or Wake (off)."
    )
    decision: str | None = Field(
        default=None, max_length=32, description="The decision of the node's last step."
    )
    held_by: ReasonCode | None = Field(
        default=None,
        description=(
            "The first blocking reason (min-on, cooldown, idle threshold, window, budget, "
            "inhibitor, a drain in progress...); absent when nothing holds it."
        ),
    )
    held_until: datetime | None = Field(
        default=None, description="When a hold that ends by the clock ends."
    )
    eligible_at: datetime | None = Field(
        default=None,
        description=(
            "When every timing rule of the direction is met (idle threshold, min-on, "
            "cooldown, min-off, billing window); absent while busy or unknown."
        ),
    )
    idle_threshold: str | None = Field(
        default=None, max_length=32, description="The idle threshold in force for this node."
    )


class Enrolment(StatusModel):
    """The machine this node was enrolled as: what its BMC and its host reported. Once set,
    spec.bmc.endpoint, spec.bmc.systemId, spec.ssh.address and spec.ssh.port are frozen
    (re-enrol a machine by deleting the WorkerNode and creating it again; docs/security.md)."""

    bmc_endpoint: str | None = Field(
        default=None, max_length=2100, description="The BMC endpoint, normalised."
    )
    system_id: str | None = Field(
        default=None, max_length=256, description="The ComputerSystem id in spec."
    )
    bmc_uuid: str | None = Field(
        default=None, max_length=256, description="The BMC's ComputerSystem.UUID."
    )
    ssh_address: str | None = Field(
        default=None, max_length=253, description="spec.ssh.address at enrolment."
    )
    ssh_port: int | None = Field(
        default=None, ge=1, le=65535, description="spec.ssh.port at enrolment."
    )
    host_uuid: str | None = Field(
        default=None, max_length=256, description="The DMI product UUID the host reported over SSH."
    )
    enrolled_at: datetime | None = Field(
        default=None, description="When the BMC's UUID was first read (the fields froze)."
    )
    verified_at: datetime | None = Field(
        default=None,
        description=(
            "When the host's UUID first matched the BMC's (re-verified in memory whenever the "
            "host answers; a Safety Record shows the age of the match it relied on)."
        ),
    )


class WorkerNodeStatus(StatusModel):
    """What we observe about this machine."""

    cel_rules: ClassVar[list[dict[str, str]]] = [FENCE_RULE]

    fence: FenceTokens | None = fence_field()

    observed_generation: int | None = Field(
        default=None,
        ge=0,
        le=MAX_GENERATION,
        description="metadata.generation last processed by the operator.",
    )
    state: NodeState | None = Field(default=None, description="Lifecycle / power state.")
    observed_power: ObservedPower | None = Field(
        default=None,
        description="Power as seen by a trusted source (Redfish PowerState, cloud state).",
    )
    observed_power_source: str | None = Field(
        default=None, max_length=253, description="Which source reported observedPower."
    )
    observed_power_time: datetime | None = Field(
        default=None,
        description="When observedPower was read. A later read that finds the same power "
        "is not written on its own (it rides along with the next change); the running "
        "operator's `nodewarden explain workernode` shows the newest reading.",
    )
    readiness: Readiness | None = Field(
        default=None, description="Result of the runtime ready probe."
    )
    admission: Admission | None = Field(
        default=None,
        description=(
            "Whether new containers may be placed on the node (GPUOnly: only GPU work, and "
            "CPU-only work that nothing without GPUs fits: its GPUs are idle, its CPU work "
            "drains away; spec.placement.gpuIdle of its policy)."
        ),
    )
    instance_id: str | None = Field(
        default=None, max_length=253, description="Cloud instance id (CloudVM)."
    )
    address: str | None = Field(
        default=None, max_length=253, description="Address used to reach the node."
    )
    hourly_price: float | None = Field(
        default=None, ge=0, le=1_000_000, description="Price per hour of the node."
    )
    booted_at: datetime | None = Field(default=None, description="When the node last came up.")
    idle_since: datetime | None = Field(
        default=None, description="Since when the node has had no running containers."
    )
    running_containers: int | None = Field(
        default=None,
        ge=0,
        le=MAX_NODE_CONTAINERS,
        description="Number of containers running on the node.",
    )
    containers: list[ContainerName] = Field(
        default_factory=list,
        max_length=MAX_NODE_CONTAINERS,
        description="UUIDs of the containers running on the node.",
    )
    last_container: str | None = Field(
        default=None, max_length=253, description="UUID of the last container that ran on the node."
    )
    last_probe: ProbeStatus | None = Field(default=None, description="Most recent SSH probe.")
    ssh_host_key: str | None = Field(
        default=None,
        max_length=16384,
        description=(
            "Public SSH host key (known_hosts form, without host) learned on first use after "
            "the node proved its per-instance secret; pinned from then on."
        ),
    )
    dispatcher_id: str | None = Field(
        default=None, max_length=253, description="Dispatcher that manages this node's instance."
    )
    broken: bool | None = Field(
        default=None, description="The runner reported the node broken; it is being drained."
    )
    last_transition_time: datetime | None = Field(
        default=None, description="When the last power transition finished."
    )
    last_safety_record: SafetyRecordSummary | None = Field(
        default=None, description="Summary of the last Safety Record for this node."
    )
    eligibility: NodeEligibility | None = Field(
        default=None,
        description=(
            "Why not yet: when the node becomes eligible for its next power transition, or "
            "what holds it (written when it changes, never as a countdown)."
        ),
    )
    power_control: dict[str, Any] | None = Field(
        default=None,
        description=(
            "The power control discovered on the node (method, allowable actions, source, "
            "when): Redfish ResetType allowable values / ActionInfo, ethtool Wake-on. Kept so "
            "a node switched off can still be woken after a restart."
        ),
        max_length=MAX_STATUS_DOCUMENT_KEYS,
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )
    power_state: dict[str, Any] | None = Field(
        default=None,
        description=(
            "The power state machine's persisted state (state, admission, the transition in "
            "progress with its id, request, deadline and retries; docs/state-machine.md). "
            "Written only by nodewarden's power controller; a restarted or new leader resumes "
            "from it."
        ),
        max_length=MAX_STATUS_DOCUMENT_KEYS,
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )
    enrolment: Enrolment | None = Field(
        default=None,
        description=(
            "The machine identity observed for this node (BMC and host UUIDs); written by the "
            "power controller. Its presence freezes the node's BMC and SSH identity fields."
        ),
    )
    energy: NodeEnergyStatus | None = Field(
        default=None,
        description=(
            "Energy used and saved against never-off (docs/energy.md); written with a power "
            "transition or every power.energy.status_interval, never per reading."
        ),
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        max_length=MAX_CONDITIONS,
        description="Valid, Ready and other standard conditions.",
    )


def _field(obj: str, path: str, attribute: str) -> str:
    return f"(has({obj}.spec.{path}) && has({obj}.spec.{path}.{attribute}) ? {obj}.spec.{path}.{attribute} : '')"


IDENTITY_FROZEN_RULE: dict[str, str] = {
    "rule": (
        "!has(oldSelf.status) || !has(oldSelf.status.enrolment) || ("
        + " && ".join(
            f"{_field('self', p, a)} == {_field('oldSelf', p, a)}"
            for p, a in (("bmc", "endpoint"), ("bmc", "systemId"), ("ssh", "address"))
        )
        + " && self.spec.ssh.port == oldSelf.spec.ssh.port)"
    ),
    "message": (
        "spec.bmc.endpoint, spec.bmc.systemId, spec.ssh.address and spec.ssh.port of an enrolled "
        "WorkerNode (status.enrolment) cannot change: one machine, one BMC. To enrol another "
        "machine under this name, delete the WorkerNode and create it again (docs/security.md)"
    ),
}
"""A rule on the whole object (it needs the status): the identity fields freeze once the
power controller has enrolled the node."""
