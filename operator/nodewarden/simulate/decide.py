"""The one seam through which every node decision of the simulator goes.

    decide_node(MachineQuery(state, facts, event), now, policy) -> machine.Step
    decide_node(VmQuery(...), now, policy)                      -> VmVerdict

The simulator never decides anything itself: it builds the facts from the simulated
world and asks here, and here calls the operator's own pure code.

* Side nodes take the **machine** path: `nodewarden.policy.machine.step`, the gates and
  state machine the power controller runs, event by event.
* Cloud VMs take the **dispatcher** path for now: `nodewarden.policy.nodemanager.decide_for`
  (the node-manager matrix) with the dispatcher's handling around it in
  `Dispatcher._lifecycle` (lame nodes first, kept-warm idle nodes skipped, a drain of an
  idle node destroys it at once). That handling lives inside an async method of the
  dispatcher, so it is restated in `_dispatcher_path` below, line for line; the matrix
  itself is the shared function.

`PATHS` says which path each node type takes. When the power controller moves cloud-VM
decisions into `machine.step` (`NodeFacts(node_type="CloudVM")`, the rules of
`policy/cloudvm.py` inside `evaluate_shutdown`), set `PATHS["CloudVM"] = "machine"`: the
simulator then builds CloudVM nodes as `MachineNode`s with the cloud power backend
(`nodewarden.simulate.nodes`) and `_dispatcher_path` can go. The engine reads the path
through `path_for` only, and the machine path for VMs is exercised by a test today
(`SimOptions.paths`), so that switch is a one-line change.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal, overload

from nodewarden.api.workernode import IdleBehavior, NodeType
from nodewarden.policy.events import Event
from nodewarden.policy.facts import NodeFacts
from nodewarden.policy.machine import Step, step
from nodewarden.policy.nodemanager import (
    BillingWindowState,
    BootGrace,
    CloudWorkerFacts,
    IdleGrace,
    MatrixInputs,
    NodeManagerAction,
    WorkerState,
    decide_for,
    next_billing_window_open,
)
from nodewarden.policy.state import NodePowerState
from nodewarden.simulate.policies import SimPolicy
from nodewarden.units import parse_duration

DecisionPath = Literal["machine", "dispatcher"]

PATHS: Mapping[NodeType, DecisionPath] = {"SideNode": "machine", "CloudVM": "dispatcher"}
"""Which path each node type's decisions take (see the module docstring)."""


def path_for(
    node_type: NodeType, paths: Mapping[NodeType, DecisionPath] | None = None
) -> DecisionPath:
    return (paths or PATHS)[node_type]


@dataclass(frozen=True, slots=True)
class MachineQuery:
    """One event for one node on the machine path."""

    state: NodePowerState
    facts: NodeFacts
    event: Event


@dataclass(frozen=True, slots=True)
class VmQuery:
    """What the dispatcher knows about one cloud VM when it decides its fate."""

    facts: CloudWorkerFacts
    busy: bool
    draining: bool
    idle_behavior: IdleBehavior
    kept_warm: bool
    probe_attempts: int


VmAction = Literal["drain", "destroy"]


@dataclass(frozen=True, slots=True)
class VmVerdict:
    """The dispatcher path's outcome for one VM."""

    action: VmAction | None
    decision: str
    reasons: tuple[str, ...]
    inputs: MatrixInputs | None
    recheck_at: datetime | None
    """When the outcome may change without anything happening to the VM (None = only on
    a change of its facts)."""


@overload
def decide_node(query: MachineQuery, now: datetime, policy: SimPolicy) -> Step: ...


@overload
def decide_node(query: VmQuery, now: datetime, policy: SimPolicy) -> VmVerdict: ...


def decide_node(
    query: MachineQuery | VmQuery, now: datetime, policy: SimPolicy
) -> Step | VmVerdict:
    """Decide for one node with the operator's pure code (see the module docstring)."""
    if isinstance(query, MachineQuery):
        return step(query.state, query.facts, query.event, now, policy.view, with_record=False)
    return _dispatcher_path(query, now, policy)


def _dispatcher_path(q: VmQuery, now: datetime, policy: SimPolicy) -> VmVerdict:
    """`Dispatcher._lifecycle` for one VM that has an instance and no destroy pending."""
    spec = policy.spec
    if policy.never_off or spec.paused:
        return VmVerdict(
            None, "NONE", ("NEVER_OFF",) if policy.never_off else ("POLICY_PAUSED",), None, None
        )
    facts = q.facts
    lame_after = parse_duration(spec.dispatch.lame_after)
    if (
        facts.last_heartbeat is None
        and now - facts.booted_at >= lame_after
        and q.probe_attempts >= spec.dispatch.lame_min_probes
    ):
        return VmVerdict("destroy", "SHUTDOWN", ("LAME_NODE",), None, None)
    drain_mode = q.draining or q.idle_behavior == "drain"
    if q.idle_behavior == "hold":
        scheduler_state = "maint"
    elif drain_mode:
        scheduler_state = "drng" if q.busy else "drain"
    else:
        scheduler_state = "alloc" if q.busy else "idle"
    matrix_facts = CloudWorkerFacts(
        paired=facts.paired,
        scheduler_state=scheduler_state,
        last_heartbeat=facts.last_heartbeat,
        booted_at=facts.booted_at,
        idle_since=facts.idle_since if not q.busy else None,
    )
    decision = decide_for(matrix_facts, policy.view, now)
    inputs = decision.inputs
    if decision.action is NodeManagerAction.START_DRAIN:
        if q.kept_warm and q.idle_behavior == "run" and not q.draining:
            return VmVerdict(None, "DEFER", ("MIN_WARM_NODES",), inputs, None)
        return VmVerdict(
            "destroy" if not q.busy else "drain",
            "DRAIN",
            ("IDLE_EXCEEDED", "BILLING_WINDOW_OPEN"),
            inputs,
            None,
        )
    if decision.action is NodeManagerAction.START_SHUTDOWN:
        reasons = {"down": ("WORKER_DOWN",), "unpaired": ("BOOT_GRACE_EXCEEDED",)}.get(
            inputs.worker_state.value, ("NODE_MANAGER",)
        )
        return VmVerdict("destroy", "SHUTDOWN", reasons, inputs, None)
    return _hold(inputs, matrix_facts, now, policy, lame_after, q.probe_attempts)


def _hold(
    inputs: MatrixInputs,
    facts: CloudWorkerFacts,
    now: datetime,
    policy: SimPolicy,
    lame_after: timedelta,
    probe_attempts: int,
) -> VmVerdict:
    """No action: why, and when that may change by itself."""
    view = policy.view
    if inputs.worker_state is WorkerState.BUSY:
        return VmVerdict(None, "NONE", ("ACTIVE_WORK",), inputs, None)
    if inputs.worker_state is WorkerState.UNPAIRED:
        assert inputs.boot_grace is BootGrace.WAIT
        recheck = facts.booted_at + view.boot_grace
        if probe_attempts >= policy.spec.dispatch.lame_min_probes:
            recheck = min(recheck, facts.booted_at + lame_after)
        return VmVerdict(None, "DEFER", ("BOOTING",), inputs, recheck)
    # idle: the idle grace or the billing window holds it back
    if inputs.idle_grace is IdleGrace.NOT_IDLE:
        return VmVerdict(None, "NONE", ("NOT_IDLE",), inputs, None)
    if inputs.idle_grace is IdleGrace.WAIT:
        assert facts.idle_since is not None
        return VmVerdict(
            None, "DEFER", ("IDLE_WINDOW_NOT_MET",), inputs, facts.idle_since + view.idle_threshold
        )
    assert inputs.billing_window is BillingWindowState.CLOSED
    opens = next_billing_window_open(
        booted_at=facts.booted_at,
        period=view.billing_period,
        window_start=view.billing_window_start,
        window_end=view.billing_window_end,
        now=now,
    )
    return VmVerdict(None, "DEFER", ("BILLING_WINDOW_CLOSED",), inputs, opens)
