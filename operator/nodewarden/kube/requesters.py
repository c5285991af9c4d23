"""Is the requester admission policy in force? (docs/security.md, "The requester")

A PowerIntent's `spec.requestedBy` names the person only because the chart's
ValidatingAdmissionPolicy makes it the user the API server authenticated, and an override
is honoured only because that policy asked RBAC about `powerintents/override`. Without the
policy (a cluster older than 1.30, the policy switched off, its binding not matching the
namespace) both are free strings the requester wrote, so the power controller refuses
every override while the policy is not shown to be in force.

`check(...)` shows it the only way that proves enforcement in this namespace: a dry-run
create (admission runs, nothing is stored) of a PowerIntent naming another requester than
the operator itself, which the policy must refuse. It runs at start-up and every
`requesters.check_interval`; `nodewarden check` runs the same check.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from nodewarden.api.kinds import POWER_INTENT
from nodewarden.clock import utc_now
from nodewarden.kube.client import Kube, KubeError

PROBE_NODE = "nodewarden-admission-probe"
"""nodeName of the dry-run PowerIntent (no such node is needed: nothing is stored)."""
REFUSAL_MARK = "spec.requestedBy must be"
"""The start of the policy's message: tells its refusal from any other."""


@dataclass(frozen=True, slots=True)
class RequesterAdmission:
    """What the last check found: whether requestedBy is verified at admission, and why."""

    enforced: bool
    detail: str
    checked_at: datetime | None = None

    @property
    def checked(self) -> bool:
        return self.checked_at is not None


NOT_CHECKED = RequesterAdmission(False, "the requester admission policy has not been checked yet")


async def check(
    kube: Kube, namespace: str, username: str | None, clock: Callable[[], datetime] = utc_now
) -> RequesterAdmission:
    """Dry-run a PowerIntent that names another requester; in force if it is refused."""
    forged = f"not-{username}" if username else "nodewarden-admission-probe"
    body = {
        "metadata": {"generateName": "nodewarden-admission-probe-"},
        "spec": {
            "nodeName": PROBE_NODE,
            "action": "Drain",
            "source": "Manual",
            "requestedBy": forged[:256],
            "reason": "nodewarden checks that the requester admission policy is in force "
            "(dry run: nothing is stored)",
        },
    }
    at = clock()
    try:
        await kube.create(POWER_INTENT, namespace, body, dry_run=True)
    except KubeError as exc:
        if REFUSAL_MARK in exc.server_message:
            return RequesterAdmission(True, "PowerIntent requesters are verified at admission", at)
        return RequesterAdmission(
            False,
            f"the requester admission policy could not be checked ({exc}); overrides are "
            "refused until it can",
            at,
        )
    return RequesterAdmission(
        False,
        f"a PowerIntent naming another requester was admitted in namespace {namespace}: the "
        "ValidatingAdmissionPolicy that verifies spec.requestedBy is not in force (it needs "
        "Kubernetes >= 1.30 and the chart's requesters.admissionPolicy); every override is "
        "refused until it is",
        at,
    )


async def keep_checking(
    kube: Kube,
    namespace: str,
    username: str | None,
    report: Callable[[RequesterAdmission], None],
    interval: float,
) -> None:
    """`check` every `interval` seconds (the first after one interval: the start-up check
    is the caller's), handing each result to `report`, until cancelled."""
    while True:
        await asyncio.sleep(interval)
        report(await check(kube, namespace, username))
