"""`nodewarden check` requesters: is the requester admission policy in force?

Without it a PowerIntent's requestedBy is a string the requester wrote, so the operator
refuses every override (REQUESTER_UNVERIFIED). The check is the operator's own
(`nodewarden.kube.requesters.check`): a dry-run PowerIntent naming another requester must
be refused at admission. Nothing is stored.
"""

from __future__ import annotations

from nodewarden.check.result import CheckResult, passed, warned
from nodewarden.kube.client import Kube
from nodewarden.kube.requesters import check

FIX = (
    "install the chart with requesters.admissionPolicy=true (Kubernetes >= 1.30: "
    "ValidatingAdmissionPolicy) and check that its binding matches namespace {namespace}; "
    "until then overrides (inhibitors, ForceOff) are refused"
)


async def check_requesters(kube: Kube, namespace: str) -> CheckResult:
    found = await check(kube, namespace, None)
    if found.enforced:
        return passed(
            "requesters",
            "PowerIntent requesters are verified at admission (the admission policy refused "
            "a dry-run intent naming another requester): overrides can be honoured",
        )
    return warned("requesters", found.detail, FIX.format(namespace=namespace))
