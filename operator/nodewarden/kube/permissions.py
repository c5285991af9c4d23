"""Every Kubernetes permission the operator uses: the one table RBAC, `check` and tests share.

The chart's Role is rendered to grant exactly these (a test compares them), the
audit-log test fails on any call the operator makes that is not listed here and on any
entry here it never uses, and `nodewarden check` asks the API server (access reviews)
whether the operator's identity holds each one.

`resource_names` narrows a rule to named objects where Kubernetes allows it (get /
update / patch / delete of one object; never list, watch or create). A placeholder in
angle brackets (``<lease>``, ``<status-token>``) is filled from the operator config.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Permission:
    """One RBAC rule: API group, resource (with /subresource), verbs, optional names."""

    group: str
    resource: str
    verbs: tuple[str, ...]
    resource_names: tuple[str, ...] = ()
    why: str = ""


NW = "nodewarden.io"

REQUIRED_PERMISSIONS: tuple[Permission, ...] = (
    Permission(
        NW,
        "workernodes",
        ("get", "list", "watch", "create", "patch", "delete"),
        why="watch nodes; create and delete the WorkerNodes of cloud VMs; finalizers",
    ),
    Permission(NW, "workernodes/status", ("patch",), why="observed state, power state, records"),
    Permission(
        NW,
        "containerdispatches",
        ("list", "watch", "patch"),
        why="watch the queue; remove the runner-cleanup finalizer of earlier releases",
    ),
    Permission(NW, "containerdispatches/status", ("patch",), why="phase, node, attempts"),
    Permission(
        NW,
        "powerintents",
        ("list", "watch", "create", "patch", "delete"),
        why="policy-made intents; expiry of finished ones",
    ),
    Permission(NW, "powerintents/status", ("patch",), why="progress and the Safety Record"),
    Permission(
        NW,
        "powerpolicies",
        ("list", "watch", "patch"),
        why="policy knobs (kopf keeps its handler state in annotations)",
    ),
    Permission(NW, "powerpolicies/status", ("patch",), why="content hash, node count, Valid"),
    Permission(
        "",
        "secrets",
        ("get",),
        why="designated credentials (the resolver checks the designation label)",
    ),
    Permission(
        "",
        "events",
        ("create", "patch"),
        why="Events for decisions and invalid objects (a repeat patches the count)",
    ),
    Permission("coordination.k8s.io", "leases", ("create",), why="leader election"),
    Permission(
        "coordination.k8s.io",
        "leases",
        ("get", "update"),
        ("<lease>",),
        why="leader election: only the operator's own Lease",
    ),
)

SHARDING_PERMISSIONS: tuple[Permission, ...] = (
    Permission(
        "coordination.k8s.io",
        "leases",
        ("list", "get", "update"),
        why="sharding (sharding.shards > 1): the balance view lists the dispatcher's Leases; "
        "the shard and membership Leases (named after replica identities) are renewed",
    ),
)
"""Added to the table when `sharding.shards` is above 1 (the chart grants them then)."""
