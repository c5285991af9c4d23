"""The four nodewarden kinds: names, short names, spec/status models and printer columns.

This table is the single source for the CRD files (`make crds`), the operator's
handler registrations and the Kubernetes adapter's resource paths.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from nodewarden.api.base import ApiModel, StatusModel
from nodewarden.api.containerdispatch import (
    OBJECT_CEL_RULES,
    ContainerDispatchSpec,
    ContainerDispatchStatus,
)
from nodewarden.api.powerintent import PowerIntentSpec, PowerIntentStatus
from nodewarden.api.powerpolicy import PowerPolicySpec, PowerPolicyStatus
from nodewarden.api.workernode import IDENTITY_FROZEN_RULE, WorkerNodeSpec, WorkerNodeStatus


@dataclass(frozen=True)
class PrinterColumn:
    name: str
    json_path: str
    type: str = "string"
    description: str = ""
    priority: int = 0
    format: str | None = None


@dataclass(frozen=True)
class Kind:
    kind: str
    plural: str
    singular: str
    short_names: tuple[str, ...]
    spec: type[ApiModel]
    status: type[StatusModel]
    description: str
    columns: tuple[PrinterColumn, ...] = field(default_factory=tuple)
    cel_rules: tuple[dict[str, str], ...] = ()
    """CEL rules on the whole object (rules of one field live on its model)."""

    @property
    def crd_name(self) -> str:
        return f"{self.plural}.nodewarden.io"


AGE = PrinterColumn("Age", ".metadata.creationTimestamp", "date", "Time since creation.")

WORKER_NODE = Kind(
    kind="WorkerNode",
    plural="workernodes",
    singular="workernode",
    short_names=("wn",),
    spec=WorkerNodeSpec,
    status=WorkerNodeStatus,
    description=(
        "One machine nodewarden manages: a cloud VM created through the cloud API or a side "
        "node powered through Redfish / Wake-on-LAN. spec is what we want, status what we observe."
    ),
    cel_rules=(IDENTITY_FROZEN_RULE,),
    columns=(
        PrinterColumn("State", ".status.state", description="Lifecycle / power state."),
        PrinterColumn("Type", ".spec.instanceType", description="Instance type."),
        PrinterColumn("Power", ".status.observedPower", description="Observed power."),
        PrinterColumn("Ready", ".status.readiness", description="Ready probe result."),
        PrinterColumn("Containers", ".status.runningContainers", "integer", "Running containers."),
        PrinterColumn("Price/h", ".status.hourlyPrice", "number", "Hourly price."),
        PrinterColumn("Idle-For", ".status.idleSince", "date", "Time since the node became idle."),
        AGE,
        PrinterColumn("Kind", ".spec.nodeType", description="CloudVM or SideNode.", priority=1),
        PrinterColumn("Control", ".spec.controlMethod", description="Power control.", priority=1),
        PrinterColumn(
            "Instance", ".status.instanceId", description="Cloud instance id.", priority=1
        ),
        PrinterColumn(
            "Admission", ".status.admission", description="Open: takes work.", priority=1
        ),
        PrinterColumn(
            "Decision",
            ".status.lastSafetyRecord.decision",
            description="Last power decision.",
            priority=1,
        ),
        PrinterColumn(
            "Reasons",
            ".status.lastSafetyRecord.reasons",
            description="Reason codes of the last power decision.",
            priority=1,
        ),
        PrinterColumn(
            "Eligible-At",
            ".status.eligibility.eligibleAt",
            description="When the node becomes eligible for its next power transition.",
            priority=1,
        ),
        PrinterColumn(
            "Held-By",
            ".status.eligibility.heldBy",
            description="What holds the node now (first blocking reason).",
            priority=1,
        ),
        PrinterColumn(
            "kWh-Saved",
            ".status.energy.savedKwh",
            "number",
            "Energy saved against never-off (status.energy).",
            priority=1,
        ),
    ),
)

CONTAINER_DISPATCH = Kind(
    kind="ContainerDispatch",
    plural="containerdispatches",
    singular="containerdispatch",
    short_names=("cd",),
    spec=ContainerDispatchSpec,
    status=ContainerDispatchStatus,
    description="One container to run: requirements, priority, and where it is in dispatch.",
    columns=(
        PrinterColumn("Phase", ".status.phase", description="Dispatch phase."),
        PrinterColumn("Priority", ".spec.priority", "integer", "Priority."),
        PrinterColumn("Node", ".status.node", description="Assigned WorkerNode."),
        PrinterColumn("Attempts", ".status.attempts", "integer", "Runs started."),
        PrinterColumn("Status", ".status.schedulingStatus", description="Scheduling status."),
        AGE,
        PrinterColumn("UUID", ".spec.uuid", description="Container UUID.", priority=1),
        PrinterColumn("Reason", ".status.reason", description="Reason code.", priority=1),
        PrinterColumn(
            "Held-CPUs",
            ".status.resources.vcpus",
            "integer",
            "vCPUs it holds on its node (the snapshot of its lock).",
            priority=1,
        ),
        PrinterColumn(
            "Held-RAM",
            ".status.resources.ram",
            description="RAM it holds on its node (the snapshot of its lock).",
            priority=1,
        ),
        PrinterColumn(
            "Held-GPUs",
            ".status.resources.gpus",
            "integer",
            "GPUs it holds on its node (the snapshot of its lock).",
            priority=1,
        ),
    ),
    cel_rules=OBJECT_CEL_RULES,
)

POWER_INTENT = Kind(
    kind="PowerIntent",
    plural="powerintents",
    singular="powerintent",
    short_names=("pi",),
    spec=PowerIntentSpec,
    status=PowerIntentStatus,
    description=(
        "One requested power transition (shutdown, wake, drain, restart) of one WorkerNode. "
        "Its status is the Safety Record and the transition's progress. The spec is immutable."
    ),
    columns=(
        PrinterColumn("Node", ".spec.nodeName", description="WorkerNode."),
        PrinterColumn("Action", ".spec.action", description="Requested action."),
        PrinterColumn("Source", ".spec.source", description="Policy or Manual."),
        PrinterColumn("Phase", ".status.phase", description="Progress."),
        PrinterColumn("Decision", ".status.decision", description="Last decision."),
        PrinterColumn("Reasons", ".status.reasons", description="Reason codes."),
        AGE,
    ),
)

POWER_POLICY = Kind(
    kind="PowerPolicy",
    plural="powerpolicies",
    singular="powerpolicy",
    short_names=("pp",),
    spec=PowerPolicySpec,
    status=PowerPolicyStatus,
    description="Knobs for idle, boot, min-on/off, cooldown, telemetry, billing, retries and limits.",
    columns=(
        PrinterColumn("Nodes", ".status.inForce.nodes.total", "integer", "WorkerNodes it governs."),
        PrinterColumn("On", ".status.inForce.nodes.on", "integer", "Its nodes on."),
        PrinterColumn("Off", ".status.inForce.nodes.off", "integer", "Its nodes off."),
        PrinterColumn(
            "Budget-Left",
            ".status.inForce.disruptionBudget.left",
            "integer",
            "Transitions the disruption budget still allows now.",
        ),
        PrinterColumn("Window", ".status.inForce.window", description="Warm windows open now."),
        PrinterColumn(
            "kWh-Saved-Today",
            ".status.energy.savedKwhToday",
            "number",
            "Energy its side nodes saved since local midnight, against never-off.",
        ),
        PrinterColumn(
            "Saved-Today",
            ".status.energy.moneySavedToday",
            "number",
            "Money saved since local midnight (status.energy.currency).",
        ),
        PrinterColumn(
            "Next-Change",
            ".status.inForce.nextChangeAt",
            description="When what is in force changes next by the clock.",
            priority=1,
        ),
        PrinterColumn("Idle", ".spec.idleThreshold", description="Idle threshold.", priority=1),
        PrinterColumn("Min-On", ".spec.minOn", description="Minimum on time.", priority=1),
        PrinterColumn("Min-Off", ".spec.minOff", description="Minimum off time.", priority=1),
        PrinterColumn("Cooldown", ".spec.cooldown", description="Cooldown.", priority=1),
        PrinterColumn("Max-Nodes", ".spec.maxNodes", "integer", "Maximum cloud nodes.", priority=1),
        PrinterColumn("Hash", ".status.contentHash", description="Content hash.", priority=1),
        AGE,
    ),
)

ALL_KINDS: tuple[Kind, ...] = (WORKER_NODE, CONTAINER_DISPATCH, POWER_INTENT, POWER_POLICY)
