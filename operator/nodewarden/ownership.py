"""Which install owns a WorkerNode: the `nodewarden.io/dispatcher` label, and the claim.

Several installs (different dispatcher ids) may share a namespace. Each acts only on the
WorkerNodes labelled with its own id -- the worker pool (probes, runners, placement) and
the power controller (every power decision) alike -- and on the runners that name its id
(`nodewarden.ssh.protocol`):

- a CloudVM WorkerNode is labelled by the install that created or adopted its instance
  (a declared one, unlabelled, is taken by the first install whose preconditioned label
  write lands: `WorkerPool.adopt_declared`);
- an **unlabelled side node is claimed** the same way: the power controller of each
  install that sees it writes the label with the resourceVersion it read, so exactly one
  write succeeds (the others get a conflict, then see the label and leave the node
  alone). A single install therefore keeps serving unlabelled side nodes as before; with
  several, label each side node with the install that should serve it. A side node is
  never taken over from another install: relabel it by hand if that install is gone.

Pure except `claim`, which is the one write.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from enum import StrEnum
from typing import Any

from nodewarden.api.kinds import WORKER_NODE
from nodewarden.kube.client import Conflict, Kube, KubeError, NotFound

log = logging.getLogger(__name__)

DISPATCHER_LABEL = "nodewarden.io/dispatcher"


class Ownership(StrEnum):
    OURS = "ours"
    FOREIGN = "foreign"
    CLAIMABLE = "claimable"
    """An unlabelled side node: claim it before serving it."""
    DECLARED = "declared"
    """An unlabelled CloudVM WorkerNode a person declared: validated by every install,
    labelled by the one whose adoption write lands."""


def owner_of(body: Mapping[str, Any]) -> str | None:
    """The dispatcher id a WorkerNode is labelled with (None: unlabelled)."""
    labels = (body.get("metadata") or {}).get("labels") or {}
    owner = labels.get(DISPATCHER_LABEL)
    return str(owner) if owner else None


def ownership(body: Mapping[str, Any], dispatcher_id: str) -> Ownership:
    owner = owner_of(body)
    if owner == dispatcher_id:
        return Ownership.OURS
    if owner is not None:
        return Ownership.FOREIGN
    if (body.get("spec") or {}).get("nodeType") == "SideNode":
        return Ownership.CLAIMABLE
    return Ownership.DECLARED


async def claim(
    kube: Kube, namespace: str, body: Mapping[str, Any], dispatcher_id: str
) -> dict[str, Any] | None:
    """Label an unlabelled WorkerNode with our id, only if it is still the version we read;
    the labelled object, or None when someone else changed it first (or it is gone)."""
    meta = body.get("metadata") or {}
    name = str(meta.get("name"))
    try:
        patched = await kube.patch(
            WORKER_NODE,
            namespace,
            name,
            {
                "metadata": {
                    "labels": {DISPATCHER_LABEL: dispatcher_id},
                    "resourceVersion": meta.get("resourceVersion"),
                }
            },
        )
    except (Conflict, NotFound) as exc:
        log.info("WorkerNode %s not claimed: %s", name, exc)
        return None
    except KubeError as exc:
        log.warning("WorkerNode %s not claimed: %s", name, exc)
        return None
    log.info(
        "claimed unlabelled side node %s for dispatcher %s",
        name,
        dispatcher_id,
        extra={"node": name, "dispatcher_id": dispatcher_id},
    )
    return patched
