"""The nodewarden API (group nodewarden.io, version v1alpha1): pydantic models of the four kinds.

These models are the single source of truth for the CRD schemas in `crds/` and are
shared by the pure core and the adapters.
"""

from nodewarden.api.base import API_VERSION, GROUP, VERSION, Condition, ConditionStatus
from nodewarden.api.containerdispatch import ContainerDispatchSpec, ContainerDispatchStatus
from nodewarden.api.kinds import (
    ALL_KINDS,
    CONTAINER_DISPATCH,
    POWER_INTENT,
    POWER_POLICY,
    WORKER_NODE,
    Kind,
)
from nodewarden.api.powerintent import PowerIntentSpec, PowerIntentStatus
from nodewarden.api.powerpolicy import PowerPolicySpec, PowerPolicyStatus
from nodewarden.api.workernode import WorkerNodeSpec, WorkerNodeStatus

__all__ = [
    "ALL_KINDS",
    "API_VERSION",
    "CONTAINER_DISPATCH",
    "GROUP",
    "POWER_INTENT",
    "POWER_POLICY",
    "VERSION",
    "WORKER_NODE",
    "Condition",
    "ConditionStatus",
    "ContainerDispatchSpec",
    "ContainerDispatchStatus",
    "Kind",
    "PowerIntentSpec",
    "PowerIntentStatus",
    "PowerPolicySpec",
    "PowerPolicyStatus",
    "WorkerNodeSpec",
    "WorkerNodeStatus",
]
