"""What the power controller writes into a WorkerNode's status, and what it shows the
dispatcher (the board): state, admission, readiness, observed power, the last Safety
Record's summary, and the `Valid`, `Ready`, `PowerSource`, `Overcommitted` and `Reconciled`
(a step that raised) conditions. Pure: built from a node's runtime and what the caller read."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from nodewarden.api.base import Condition, ConditionStatus, set_condition
from nodewarden.api.workernode import NodeState as ApiNodeState
from nodewarden.fleet.board import NodePowerView
from nodewarden.policy.gpuidle import gpu_only
from nodewarden.policy.record import SafetyRecord
from nodewarden.policy.state import ON_STATES, PowerState, api_admission, api_state
from nodewarden.policy.view import PolicyView
from nodewarden.power.runtime import NodeRuntime, iso, persist_worthy
from nodewarden.rules.nodeview import admits, can_wake, is_ready, wake_not_before, waking_since
from nodewarden.scheduling.caps import Admission, Cap

_HOLD_REASONS = {Cap.STOPPED: "CreatesStopped", Cap.BACKOFF: "CloudBackoff"}


def gpu_only_now(rt: NodeRuntime, policy: PolicyView, now: datetime) -> bool:
    """Admission is open and narrowed to GPU work at `now` (`policy.gpuidle`)."""
    work = rt.facts.work
    if work is None or work.gpu is None or not admits(rt.state.admission):
        return False
    return gpu_only(work, policy.idle_threshold, policy.telemetry_max_age, now, policy.gpu_only)


def board_view(
    rt: NodeRuntime,
    policy_valid: bool,
    policy: PolicyView | None = None,
    now: datetime | None = None,
) -> NodePowerView:
    """What the dispatcher may know of the node: admission (GPU work only, at `now`),
    state, readiness, wakeability, when a wake began or may begin under `policy`'s wake
    timing (the rules: `rules.nodeview`)."""
    now = now or rt.facts.newest() or datetime.min.replace(tzinfo=UTC)
    state = rt.state.state
    return NodePowerView(
        state=state,
        admission_open=admits(rt.state.admission),
        gpu_only=policy is not None and gpu_only_now(rt, policy, now),
        ready=is_ready(state, rt.facts.ready),
        wakeable=can_wake(rt.node_type, state, rt.facts.capability, policy_valid),
        waking_since=waking_since(rt.state),
        wake_after=(
            wake_not_before(rt.state, policy.min_off, policy.cooldown)
            if policy is not None
            else None
        ),
    )


def api_state_of(rt: NodeRuntime) -> ApiNodeState:
    """`status.state`: the machine's state, or Booting for a VM not yet paired."""
    vm = rt.facts.vm
    unpaired = vm is None or not vm.paired
    if rt.node_type == "CloudVM" and rt.state.state is PowerState.UNKNOWN and unpaired:
        return "Booting"
    return api_state(rt.state.state)


def power_status(
    rt: NodeRuntime,
    record: SafetyRecord | None,
    conditions: list[dict[str, Any]],
    gpu_only: bool = False,
) -> dict[str, Any]:
    """The status fields the controller owns (`gpu_only`: admission Open shows as
    GPUOnly). `powerState` is included only when it changed in something a restart
    needs (compared with `rt.persisted`)."""
    state = rt.state
    power = rt.facts.power
    ready = rt.facts.ready
    on = power is not None and power.power == "On"
    out: dict[str, Any] = {
        "state": api_state_of(rt),
        "admission": api_admission(state.admission, gpu_only),
        "readiness": (
            "Ready"
            if ready is not None and ready.passed and on
            else "NotReady"
            if ready is not None and on
            else "Unknown"
        ),
        "idleSince": iso(rt.idle_since) if state.state in ON_STATES else None,
        "lastTransitionTime": iso(state.last_transition_at),
        "conditions": conditions,
    }
    if persist_worthy(rt.persisted, state):
        # nulls included: a merge patch deletes what the state no longer has
        out["powerState"] = state.model_dump(mode="json", by_alias=True)
    if power is not None:
        out["observedPower"] = power.power
        out["observedPowerSource"] = power.source
        out["observedPowerTime"] = iso(power.observed_at)
    if rt.node_type == "SideNode" and rt.spec is not None:
        out["hourlyPrice"] = rt.spec.cost_per_hour or 0.0
    if record is not None:
        out["lastSafetyRecord"] = {
            "powerIntent": record.power_intent,
            "decision": record.decision.value,
            "reasons": [r.value for r in record.reasons],
            "summary": record.summary()[:1024],
            "time": iso(record.decided_at),
        }
    return out


def conditions(
    rt: NodeRuntime,
    current: Sequence[Mapping[str, Any]],
    bmc_error: str | None,
    now: datetime,
    hold: Admission | None = None,
) -> list[dict[str, Any]]:
    """`current` (the server's conditions) with Valid, Ready and PowerSource set from the
    node's verdict, readiness and power control (last BMC error or credential refusal),
    and Launched from `hold` (why a declared CloudVM waits for its instance: a cap)."""
    conds = [Condition.model_validate(c) for c in current if "lastTransitionTime" in c]
    gen = rt.generation
    verdict = rt.verdict
    if verdict is not None:
        # the verdict's own generation: a write between a spec edit and its validation
        # must not present the old verdict as the new generation's
        judged = rt.validated_generation if rt.validated_generation is not None else gen
        conds = set_condition(
            conds, "Valid", verdict.valid, verdict.reason, verdict.message, judged, now
        )
    ready = rt.facts.ready
    power = rt.facts.power
    if ready is not None:
        on = power is not None and power.power == "On" and ready.passed
        conds = set_condition(
            conds,
            "Ready",
            on,
            "ProbePassed" if on else ("ProbeFailed" if not ready.passed else "NotOn"),
            "the ready probe passes" if on else (ready.detail or "power not observed On"),
            gen,
            now,
        )
    if rt.overcommit is not None:
        conds = set_condition(
            conds, "Overcommitted", ConditionStatus.TRUE, "RunsMoreThanItHolds",
            f"{rt.overcommit}; it takes no new work until it fits (nothing is killed)",
            gen, now,
        )  # fmt: skip
    elif any(c.type == "Overcommitted" for c in conds):
        conds = set_condition(
            conds, "Overcommitted", ConditionStatus.FALSE, "WithinCapacity",
            "what the node runs fits its capacity", gen, now,
        )  # fmt: skip
    if hold is not None:
        reason = _HOLD_REASONS.get(hold.cap, "CapReached") if hold.cap else "CapReached"
        conds = set_condition(conds, "Launched", False, reason, hold.message, gen, now)
    elif any(c.type == "Launched" and c.status != ConditionStatus.TRUE for c in conds):
        conds = set_condition(
            conds, "Launched", True, "InstanceRequested", "the caps allow its instance", gen, now
        )
    if rt.failure is not None:
        conds = set_condition(
            conds,
            "Reconciled",
            ConditionStatus.FALSE,
            "ProcessingFailed",
            f"nodewarden could not step this node's power decisions ({rt.failure}); every "
            "other node is still served, and this one is stepped again at its next event",
            gen,
            now,
        )
    elif any(c.type == "Reconciled" and c.status != ConditionStatus.TRUE for c in conds):
        conds = set_condition(
            conds, "Reconciled", True, "Processed", "stepped normally again", gen, now
        )
    capability = rt.facts.capability
    if bmc_error is not None:
        conds = set_condition(
            conds, "PowerSource", ConditionStatus.FALSE, "BmcError", bmc_error, gen, now
        )
    elif capability is not None and capability.refusal is not None:
        conds = set_condition(
            conds,
            "PowerSource",
            ConditionStatus.FALSE,
            "CredentialsRefused",
            capability.refusal,
            gen,
            now,
        )
    elif capability is not None and capability.allowable is not None:
        conds = set_condition(
            conds,
            "PowerSource",
            ConditionStatus.TRUE,
            "Answering",
            f"{capability.control_method}: {', '.join(capability.allowable) or 'no actions'}",
            gen,
            now,
        )
    if rt.unowned_runners is not None:
        conds = set_condition(conds, *runners_owned(rt.unowned_runners), gen, now)
    return [c.to_wire() for c in conds]


def runners_owned(unowned: Sequence[str]) -> tuple[str, bool, str, str]:
    """The `RunnersOwned` condition: False while the node runs runners that name no owner
    (never killed by nodewarden: stop them on the node, or let them finish)."""
    if not unowned:
        return "RunnersOwned", True, "AllOwned", "every runner on the node names its dispatcher"
    shown = ", ".join(unowned[:10]) + (
        f" and {len(unowned) - 10} more" if len(unowned) > 10 else ""
    )
    return (
        "RunnersOwned",
        False,
        "UnownedRunners",
        f"{len(unowned)} runner(s) name no owner (started by an older operator or listed by "
        f"an older runner program); nodewarden never kills them: {shown}",
    )
