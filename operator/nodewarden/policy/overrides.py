"""The gates an audited override may waive, and the override rules themselves.

    no_inhibitor(c) -> GateResult   (adds "inhibitors" to c.applied when waived)
    same_machine(c) -> GateResult   (adds "identity" to c.applied when waived)
    force_off_permitted(facts, policy) -> bool   (ForceOff after a failed GracefulShutdown)

An override is only ever applied for a Manual Shutdown intent whose requester the API
server authenticated and which the policy permits; the gate is then WAIVED with
OVERRIDE_APPLIED, and the evaluation lists the override as applied.
"""

from __future__ import annotations

from nodewarden.policy.base import CLOCK_SKEW_TOLERANCE
from nodewarden.policy.evaluation import (
    Evidence,
    GateInputs,
    GateName,
    GateResult,
    Verdict,
    evidence_of,
    gate_result,
)
from nodewarden.policy.facts import (
    ManualIntent,
    NodeFacts,
)
from nodewarden.policy.reasons import R, ReasonCode
from nodewarden.policy.view import PolicyView

_PASS, _SKIPPED = Verdict.PASS, Verdict.SKIPPED
_G_INHIBITORS = GateName.INHIBITORS


def override_allowed(intent: ManualIntent | None, policy: PolicyView) -> bool:
    if intent is None or intent.override is None or not intent.override.inhibitors:
        return False
    if not policy.override_permitted or not intent.requester_verified:
        return False
    return not policy.override_requesters or intent.requested_by in policy.override_requesters


def override_refusal(intent: ManualIntent) -> ReasonCode:
    """Why an override is refused: the requester is not who the API server says, or the
    policy does not permit it."""
    return R.OVERRIDE_NOT_PERMITTED if intent.requester_verified else R.REQUESTER_UNVERIFIED


def force_off_permitted(facts: NodeFacts, policy: PolicyView) -> bool:
    """Whether ForceOff may follow a failed GracefulShutdown: only with a Manual Shutdown
    intent carrying override.forceOff, a policy with permitForceOff (requester allowed),
    ForceOff listed in allowedActions and allowable on the node."""
    intent = facts.intent
    if intent is None or intent.action != "Shutdown" or intent.override is None:
        return False
    if not intent.override.force_off or not policy.permit_force_off:
        return False
    if not intent.requester_verified:
        return False
    if policy.override_requesters and intent.requested_by not in policy.override_requesters:
        return False
    if "ForceOff" not in policy.allowed_actions:
        return False
    cap = facts.capability
    return cap is not None and cap.allowable is not None and "ForceOff" in cap.allowable


def no_inhibitor(c: GateInputs) -> GateResult:
    """No block-mode systemd inhibitor on shutdown, unless an audited override permitted
    by the policy is present (then "inhibitors" is added to `c.applied`)."""
    inhibitors, intent = c.facts.inhibitors, c.intent
    if inhibitors is None:
        return gate_result(
            _G_INHIBITORS, [R.TELEMETRY_MISSING], (Evidence("inhibitors", "missing", "-", None),)
        )
    held = inhibitors.inhibitors
    blocking = inhibitors.blocking if held else ()
    if not blocking:
        return GateResult(
            _G_INHIBITORS,
            _PASS,
            (),
            (
                Evidence(
                    "blocking", f"0 of {len(held)} held", inhibitors.source, inhibitors.observed_at
                ),
            ),
        )
    i_ev = tuple(
        evidence_of("inhibitor", f"{i.what} by {i.who or '?'} ({i.mode}): {i.why}", inhibitors)
        for i in blocking
    )
    wants_override = (
        intent is not None
        and intent.action == "Shutdown"
        and intent.override is not None
        and intent.override.inhibitors
    )
    if wants_override and override_allowed(intent, c.policy):
        assert intent is not None
        i_ev = (
            *i_ev,
            evidence_of(
                "override",
                f"{intent.name} by {intent.requested_by} (authenticated at admission)",
                intent,
            ),
        )
        c.applied = (*c.applied, "inhibitors")
        return gate_result(
            _G_INHIBITORS, [R.INHIBITOR_ACTIVE, R.OVERRIDE_APPLIED], i_ev, waived=True
        )
    if wants_override:
        assert intent is not None
        return gate_result(_G_INHIBITORS, [R.INHIBITOR_ACTIVE, override_refusal(intent)], i_ev)
    return gate_result(_G_INHIBITORS, [R.INHIBITOR_ACTIVE], i_ev)


_G_IDENTITY = GateName.IDENTITY
_IDENTITY_NOT_NEEDED = GateResult(
    _G_IDENTITY,
    _SKIPPED,
    (),
    (Evidence("identity", "power-off does not go through a BMC", "-", None),),
)
_IDENTITY_UNKNOWN = GateResult(
    _G_IDENTITY,
    Verdict.FAIL,
    (R.IDENTITY_UNVERIFIED,),
    (Evidence("bmcUuid", "unknown", "-", None),),
)
"""The identity gate without a BMC UUID: depends on no input, so built once and shared."""


def same_machine(c: GateInputs) -> GateResult:
    """Does the BMC that would switch the node off manage the host whose work, inhibitors
    and uptime were read? (docs/security.md, "One machine, one BMC"). When an audited
    override lets the recorded match stand in, "identity" is added to `c.applied`."""
    facts = c.facts
    cap = facts.capability
    if cap is None or cap.control_method != "Redfish":
        return _IDENTITY_NOT_NEEDED
    identity, intent, now, refresh = facts.identity, c.intent, c.now, c.refresh
    max_age = c.policy.telemetry_max_age
    if identity is None or identity.bmc_uuid is None:
        refresh.append("identity")
        return _IDENTITY_UNKNOWN
    bmc = identity.bmc_uuid
    evidence_list = [Evidence("bmcUuid", bmc, identity.bmc_source, identity.bmc_observed_at)]
    host, host_at = identity.host_uuid, identity.host_observed_at
    evidence_list.append(
        Evidence(
            "hostUuid",
            host if host is not None else f"unreadable: {identity.host_problem or 'not read'}",
            identity.host_source,
            host_at,
        )
    )
    if host is not None and host != bmc:
        return gate_result(_G_IDENTITY, [R.IDENTITY_MISMATCH], tuple(evidence_list))
    fresh = (
        host_at is not None and host_at <= now + CLOCK_SKEW_TOLERANCE and now - host_at <= max_age
    )
    if host is not None and fresh:
        evidence_list.append(Evidence("match", True, identity.host_source, host_at))
        return GateResult(_G_IDENTITY, _PASS, (), tuple(evidence_list))
    refresh.append("identity")
    # unreadable (the command failed) needs a person; not read yet, or read too long ago,
    # waits for the next probe like any other telemetry
    if host is None and identity.host_problem is not None:
        code = R.IDENTITY_UNVERIFIED
    else:
        code = R.TELEMETRY_MISSING if host_at is None else R.TELEMETRY_STALE
    recorded = identity.matched_at
    if recorded is not None and identity.matched_uuid == bmc:
        age = (now - recorded).total_seconds()
        evidence_list.append(
            Evidence(
                "recordedMatch",
                f"{identity.matched_uuid}, {age:.0f} s old",
                "status.enrolment",
                recorded,
            )
        )
    overridden = (
        intent is not None
        and intent.action == "Shutdown"
        and intent.override is not None
        and intent.override.recorded_identity
        and intent.requester_verified
        and recorded is not None
        and identity.matched_uuid == bmc
    )
    if overridden:
        assert intent is not None
        evidence_list.append(
            evidence_of(
                "override", f"{intent.name} by {intent.requested_by} (recorded match)", intent
            )
        )
        c.applied = (*c.applied, "identity")
        return gate_result(
            _G_IDENTITY, [code, R.OVERRIDE_APPLIED], tuple(evidence_list), waived=True
        )
    return gate_result(_G_IDENTITY, [code], tuple(evidence_list))
