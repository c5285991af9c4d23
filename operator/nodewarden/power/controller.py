"""The power controller: every power decision for every WorkerNode, through one path.

Side nodes and cloud VMs alike: facts in (probes, BMC, cloud list, queue, spec, intents),
`policy.machine.step` decides, the actions it returns are carried out by adapters
(`power.control`), and every decision leaves a Safety Record -- in the transition's
PowerIntent, summarised on the WorkerNode, and as an Event when the decision changes.

The loop (`run`), each round:

1. take the dispatcher's admission acknowledgements (AdmissionClosed events);
2. step every node that has events or whose recheck time has come, in event order:
   a step that is the same decision as before costs no record and no write;
3. for a step whose actions include a power request, persist the new power state
   (resourceVersion precondition) *before* sending it: a replica that resumes from
   status never sends a request the state machine did not ask for;
4. write the WorkerNode statuses that changed (one patch each) and the metrics; a node
   that asked to be stepped again at once (a recheck due now, e.g. the wake evaluation
   that follows an observed Off) writes one round later, both steps in one patch (never
   held two rounds in a row);
5. sleep until an event arrives or the next recheck time.

Observations arrive as they happen: probe results (`probed`), the cloud list (`listed`,
`gone`), BMC reads and request outcomes (adapter tasks), the dispatcher's plan (demand),
PowerIntent and PowerPolicy events. The controller also owns the WorkerNode `Valid`,
`Ready` and `PowerSource` conditions.

Shadow mode (`PowerPolicy.spec.mode: Shadow`): every decision is made and recorded; a
step that would begin a power transition is recorded as a PowerIntent in phase Shadow
with its Safety Record and an Event, and is not applied: nothing is requested, admission
is not closed. Observing (BMC reads, probes) continues.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime, timedelta
from typing import Any

from pydantic import ValidationError

from nodewarden.api.base import GROUP, VERSION
from nodewarden.api.kinds import CONTAINER_DISPATCH, WORKER_NODE
from nodewarden.api.powerintent import PowerAction
from nodewarden.api.workernode import WorkerNodeSpec
from nodewarden.cloud.model import CloudInstance
from nodewarden.credentials import CredentialResolver, Refusal
from nodewarden.drain import drain
from nodewarden.fleet.board import PowerBoard
from nodewarden.fleet.policies import Policy, PolicyBook
from nodewarden.fleet.ports import PoolPort, WorkerSnapshot
from nodewarden.fleet.status import NodeStatusWriter, PowerStateConflict
from nodewarden.kube.client import Kube, KubeError
from nodewarden.kube.requesters import RequesterAdmission
from nodewarden.metrics import BMC_CLAIMED_TWICE, POWER_DECISIONS, POWER_REQUESTS
from nodewarden.ownership import Ownership, claim, ownership
from nodewarden.policy.actions import (
    Action,
    CloseAdmission,
    CloseTransition,
    OpenTransition,
    PollObservedPower,
    RefreshFacts,
    RequestPower,
    RereadDemand,
    RunReadyProbe,
    ScheduleRecheck,
)
from nodewarden.policy.events import (
    AdmissionClosed,
    DeadlineReached,
    DemandReread,
    Evaluate,
    Event,
    ManualOverride,
    PolicyChanged,
    PowerObserved,
    ReadyProbeResult,
)
from nodewarden.policy.facts import (
    CapabilityReading,
    DesiredReading,
    FleetReading,
    ManualIntent,
    NodeFacts,
)
from nodewarden.policy.machine import Step, step
from nodewarden.policy.reasons import Decision, DecisionClass, ReasonCode, decision_class
from nodewarden.policy.record import SafetyRecord, event_summary
from nodewarden.policy.state import (
    NON_TERMINAL_STATES,
    NodePowerState,
    PowerState,
    TransitionKind,
    rebased,
)
from nodewarden.policy.view import PolicyView
from nodewarden.power import gauges
from nodewarden.power.control import NodeRef, PowerControl
from nodewarden.power.enrolment import IdentityState
from nodewarden.power.explain import explain_node
from nodewarden.power.intents import (
    IntentBook,
    ManualRetention,
    policy_intent_name,
    record_fields,
)
from nodewarden.power.nodestatus import board_view, conditions, power_status
from nodewarden.power.phases import manual_phase, phase_message
from nodewarden.power.readings import (
    cloud_power,
    cloud_uptime,
    inhibitor_reading,
    ready_reading,
    ssh_power,
    uptime_reading,
)
from nodewarden.power.runtime import ControllerSettings, NodeRuntime, iso, poll_phase
from nodewarden.rules.demand import (
    demand_event,
    placed_counts,
    planned_demand,
    queued_from_bodies,
    reread_demand,
)
from nodewarden.rules.fleet import fleet_readings
from nodewarden.rules.readings import cloud_capability, cloud_gone, work_reading
from nodewarden.rules.vm import vm_reading
from nodewarden.scheduling.caps import Admission
from nodewarden.scheduling.instancetypes import Catalogue, InstanceTypePolicy
from nodewarden.scheduling.scheduler import ContainerView, Plan
from nodewarden.ssh.errors import SshError
from nodewarden.ssh.facts import ProbeReport
from nodewarden.validation import Verdict, failure_verdict, validate_workernode

log = logging.getLogger(__name__)
R = ReasonCode

_SKIP_IN_SHADOW = (RequestPower, CloseAdmission)
_MIN_RECHECK = timedelta(seconds=0.25)
# a capability discovery that failed or was refused credentials is retried this soon (s),
# doubling up to the capability interval
_REDISCOVER_AFTER_FAILURE = 30.0
MAX_PAUSE = 1.0
"""Longest pause between two rounds (see `run`)."""
REFUSED_POLL_INTERVAL = 60.0
"""Seconds between power reads of a node whose BMC credentials are refused."""


class PowerController:
    """See the module docstring."""

    def __init__(
        self,
        *,
        kube: Kube,
        namespace: str,
        dispatcher_id: str,
        default_policy: str,
        credentials: CredentialResolver,
        policies: PolicyBook,
        pool: PoolPort | None,
        board: PowerBoard,
        status: NodeStatusWriter,
        control: PowerControl,
        settings: ControllerSettings,
        clock: Callable[[], datetime],
        catalogue: Catalogue | None = None,
        type_policy: InstanceTypePolicy | None = None,
        acknowledge_admission: bool = False,
    ) -> None:
        self.kube = kube
        self.namespace = namespace
        self.dispatcher_id = dispatcher_id
        self.default_policy = default_policy
        self.credentials = credentials
        self.policies = policies
        self.pool = pool
        self.board = board
        self.status = status
        self.control = control
        self.settings = settings
        self.clock = clock
        self.catalogue = catalogue or Catalogue()
        self.type_policy = type_policy or InstanceTypePolicy()
        self.acknowledge_admission = acknowledge_admission
        """No dispatcher places work: closing admission is acknowledged at once."""
        self.intents = IntentBook(
            kube,
            namespace,
            dispatcher_id,
            settings.keep_finished_intents,
            ManualRetention(
                settings.delete_finished_manual_intents,
                timedelta(seconds=settings.finished_manual_intent_retention),
            ),
        )
        self.nodes: dict[str, NodeRuntime] = {}
        self.wake = asyncio.Event()
        self._stop = asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closed = False
        self._plan: tuple[list[ContainerView], Plan, datetime] | None = None
        self._placed: dict[str, int] = {}
        """Per node: containers holding it in the dispatcher's last ledger."""
        self._overcommitted: set[str] = set()
        """Nodes the dispatcher's last plan found running more than they hold."""
        self._reread_wanted: set[str] = set()
        self._policy_generations: dict[str | None, int | None] = {}
        self._next_resync: datetime | None = None
        self._hold_writes: set[str] = set()
        """Nodes whose status write waits for the next round (see `run`, step 4)."""
        self._held: set[str] = set()
        """Nodes whose write waited in the last round (they are not held again)."""
        self._claims = asyncio.Semaphore(16)
        self._claiming: dict[str, str] = {}
        """Unlabelled side nodes: the resourceVersion a claim was sent for."""
        self.fold: Callable[[Mapping[str, Any]], bool] | None = None
        """Where a WorkerNode this controller labelled goes (the WorkerNode informer)."""
        self.steps = 0
        self.started = False
        self._synced = asyncio.Event()

    # ------------------------------------------------------------------ inputs

    def observe_node(
        self, body: Mapping[str, Any], deleted: bool = False, spec: WorkerNodeSpec | None = None
    ) -> None:
        """A WorkerNode from the feed (its informer's compact body, shared: read-only), with
        its spec as the feed parsed it (None: parsed here)."""
        meta = dict(body.get("metadata") or {})
        name = meta.get("name")
        if not name or (meta.get("namespace") or self.namespace) != self.namespace:
            return
        if deleted:
            self._forget(name)
            return
        owned = ownership(body, self.dispatcher_id)
        if owned in (Ownership.FOREIGN, Ownership.CLAIMABLE):
            # another install's node is none of ours; an unlabelled side node is claimed
            # first (a preconditioned label write: `nodewarden.ownership`)
            if name in self.nodes:
                self._forget(name)
            if owned is Ownership.CLAIMABLE:
                self._claim_node(name, body)
            return
        self.status.observe(name, body)
        now = self.clock()
        rt = self.nodes.get(name)
        if rt is None:
            rt = self._new_runtime(
                name, spec if spec is not None else _spec(body), meta, body.get("status") or {}, now
            )
            self.nodes[name] = rt
            rt.events.append(Evaluate())
        else:
            changed = rt.generation != meta.get("generation")
            deleting = bool(meta.get("deletionTimestamp")) != bool(rt.meta.get("deletionTimestamp"))
            rt.meta = meta
            if changed:
                rt.spec = spec if spec is not None else _spec(body)
                rt.spec_seen_at = now
                rt.next_discovery = now
                self.control.last_error.pop(name, None)
            if changed or deleting:
                rt.events.append(Evaluate())
        self._claim_bmc(rt)
        if rt.validated_generation != rt.generation:
            self._spawn(self._validate(rt))
        self.wake.set()

    def _claim_bmc(self, rt: NodeRuntime) -> None:
        """Record the node's claim on its BMC (one machine, one BMC): every node whose
        ownership may have changed is validated again and looks at its BMC again."""
        claim = rt.identity.claim(rt.name, rt.spec, str(rt.meta.get("creationTimestamp") or ""))
        self._rejudge(self.credentials.bmc_claims.put(claim, rt.name), rt.name)

    def _rejudge(self, touched: set[str], current: str | None = None) -> None:
        if not touched:
            return
        BMC_CLAIMED_TWICE.set(self.credentials.bmc_claims.refused())
        now = self.clock()
        for name in touched:
            other = self.nodes.get(name)
            if other is None:
                continue
            other.next_discovery = now
            other.next_poll = now
            if name != current or other.validated_generation == other.generation:
                self._spawn(self._validate(other))

    def _identity_observed(self, rt: NodeRuntime) -> None:
        """A BMC or host UUID arrived: the gates' evidence, the enrolment, the claim."""
        rt.facts = rt.facts.model_copy(update={"identity": rt.identity.reading()})
        if rt.spec is not None:
            enrolment = rt.identity.enrolment(rt.spec)
            if enrolment is not None and enrolment != rt.identity.enrolled:
                rt.identity.enrolled = enrolment
                self.status.contribute(rt.name, {"enrolment": enrolment})
        self._claim_bmc(rt)
        rt.events.append(Evaluate())
        self.wake.set()

    def _new_runtime(
        self,
        name: str,
        spec: WorkerNodeSpec | None,
        meta: dict[str, Any],
        status: Mapping[str, Any],
        now: datetime,
    ) -> NodeRuntime:
        state = NodePowerState.initial(name)
        stored = status.get("powerState")
        if isinstance(stored, Mapping):
            try:
                state = self._restored(name, NodePowerState.model_validate(stored), now)
            except ValidationError as exc:
                log.warning(
                    "WorkerNode %s: stored power state unreadable (%s); verifying", name, exc
                )
        node_type = spec.node_type if spec is not None else "SideNode"
        facts = NodeFacts(node=name, node_type=node_type)
        control = status.get("powerControl")
        if isinstance(control, Mapping):
            with contextlib.suppress(ValidationError):
                facts = facts.model_copy(
                    update={"capability": CapabilityReading.model_validate(control)}
                )
        rt = NodeRuntime(name, spec, meta, state, facts, spec_seen_at=now)
        rt.identity = IdentityState.from_status(status.get("enrolment"))
        rt.facts = rt.facts.model_copy(update={"identity": rt.identity.reading()})
        rt.next_discovery = now
        rt.next_poll = now
        t = state.transition
        if t is not None and t.kind is not TransitionKind.VERIFY:
            # a manual intent's name, or the policy-made one named after the transition
            rt.transition_intent = t.intent or policy_intent_name(name, t.id)
        return rt

    def _claim_node(self, name: str, body: Mapping[str, Any]) -> None:
        """Claim an unlabelled side node for this install (`nodewarden.ownership`)."""
        version = str((body.get("metadata") or {}).get("resourceVersion") or "")
        if self._claiming.get(name) == version:
            return  # a claim of this version is under way or was lost: wait for news
        self._claiming[name] = version

        async def run() -> None:
            async with self._claims:  # a fleet of unlabelled nodes is claimed in steps
                claimed = await claim(self.kube, self.namespace, body, self.dispatcher_id)
            if claimed is not None and self.fold is not None:
                self.fold(claimed)

        self._spawn(run())

    def _forget(self, name: str) -> None:
        rt = self.nodes.pop(name, None)
        self._rejudge(self.credentials.bmc_claims.put(None, name))
        self.board.forget(name)
        self.status.observe(name, None)
        if rt is not None:
            self._spawn(self.control.forget(name))

    def observe_intent(self, body: Mapping[str, Any], deleted: bool = False) -> None:
        """A PowerIntent event (manual or policy-made)."""
        node = self.intents.observe(body, deleted)
        if node is not None and node in self.nodes:
            self._sync_intent(self.nodes[node])
            self.wake.set()

    def observe_policy(self, body: Mapping[str, Any], deleted: bool = False) -> None:
        """A PowerPolicy event: the book is updated by its owner; every node under it
        re-evaluates with the new version (records carry it from now on)."""
        meta = body.get("metadata") or {}
        name = meta.get("name")
        generation = None if deleted else meta.get("generation")
        if name in self._policy_generations and self._policy_generations[name] == generation:
            return  # a status write (content hash, node count): not a change of the knobs
        self._policy_generations[name] = generation
        for rt in self.nodes.values():
            if rt.policy_name == name or (
                rt.spec is not None and rt.spec.policy_ref is None and name == self.default_policy
            ):
                rt.events.append(PolicyChanged())
        self.wake.set()

    def planned(self, containers: list[ContainerView], plan: Plan, now: datetime) -> None:
        """The dispatcher's round: its capacity ledger (each node's work) and queued
        demand for every node, by the plan's fit rules."""
        self._plan = (containers, plan, now)
        self._update_demand(now)
        self._placed = placed_counts(containers)
        self._update_placed(now)
        self._update_overcommit(plan.over_capacity)
        self.wake.set()

    def _update_overcommit(self, over: Mapping[str, str]) -> None:
        """The condition Overcommitted of a node the dispatcher found running more than it
        holds (set while it does, cleared once it fits; never set on other nodes)."""
        for name in over.keys() | self._overcommitted:
            rt = self.nodes.get(name)
            if rt is None or rt.overcommit == over.get(name):
                continue
            rt.overcommit = over.get(name)
            self.status.contribute(rt.name, {"conditions": self._conditions(rt)})
        self._overcommitted = set(over)

    def _update_placed(self, at: datetime) -> None:
        """Work in the dispatcher's ledger is work on the node from the moment a container
        is chosen for it until its runner is seen gone: a node is never taken for idle
        while a start is in flight, a lock is held or a cancelled runner still runs."""
        for name, count in self._placed.items():
            rt = self.nodes.get(name)
            if rt is None:
                continue
            work = rt.facts.work
            if work is not None and (work.active_jobs >= count or work.observed_at > at):
                continue
            reading = work_reading(count, "dispatcher (containers holding the node)", at, None)
            rt.facts = rt.facts.model_copy(update={"work": reading})
            rt.idle_since = None
            rt.events.append(Evaluate())

    # -- what validation asks (handlers.validation.NodeIndex) ---------------------------

    def node_names(self) -> set[str]:
        return set(self.nodes)

    def policy_users(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for rt in self.nodes.values():
            name = rt.policy_name
            if name is not None:
                out[name] = out.get(name, 0) + 1
        return out

    async def start(self) -> None:
        """Called once the feed's WorkerNode informer has its first LIST (every node is
        here through `observe_node`), so fleet counts (disruption budget, min warm) see
        the whole fleet from the first round."""
        self._synced.set()
        log.info("power controller started", extra={"nodes": len(self.nodes)})

    def explain(self, name: str) -> dict[str, Any] | None:
        """The live explain document of WorkerNode `name` (None: not known here)."""
        rt = self.nodes.get(name)
        if rt is None:
            return None
        return explain_node(rt, self._policy(rt).view, self.clock())

    async def synced(self) -> None:
        """Return once the controller holds the whole fleet (after `start`)."""
        await self._synced.wait()

    async def node_exists(self, name: str) -> bool:
        """Whether WorkerNode `name` exists: known here, or (a node created a moment ago
        whose event has not arrived yet) found by a live GET."""
        await self._synced.wait()
        if name in self.nodes:
            return True
        return await self.kube.get(WORKER_NODE, self.namespace, name) is not None

    # -- the worker pool's observations (WorkerObserver) -------------------------------

    def probed(
        self, worker: WorkerSnapshot, report: ProbeReport | None, error: SshError | None
    ) -> None:
        rt = self.nodes.get(worker.name)
        if rt is None:
            return
        if rt.node_type == "CloudVM":
            self._update_vm(rt, worker)
        if report is None:
            if rt.node_type == "CloudVM":
                rt.events.append(Evaluate())
                self.wake.set()
            return
        facts = rt.facts
        updates: dict[str, Any] = {}
        runners = report.runners
        if runners is not None:
            active = max(len(runners.runners), self._placed.get(worker.name, 0))
            reading = work_reading(
                active, runners.source, runners.observed_at, rt.idle_since if active == 0 else None
            )
            rt.idle_since = reading.idle_since
            updates["work"] = reading
            unowned = tuple(sorted(r.uuid for r in runners.unowned))
            if unowned != rt.unowned_runners:
                rt.unowned_runners = unowned
                self.status.contribute(rt.name, {"conditions": self._conditions(rt)})
        if report.inhibitors is not None:
            updates["inhibitors"] = inhibitor_reading(report.inhibitors)
        if report.uptime is not None:
            updates["uptime"] = uptime_reading(report.uptime)
        news = report.host_uuid is not None and rt.identity.observe_host(report.host_uuid)
        if report.host_uuid is not None:
            updates["identity"] = rt.identity.reading()
        if rt.spec is not None and rt.spec.bmc is None and rt.node_type == "SideNode":
            updates["power"] = ssh_power(report.ready)  # the login itself is the evidence
        if facts.ready is None and _ssh_may_add_actions(rt):
            # the first SSH login: what the node allows may now include SshPoweroff (and
            # ethtool's Wake-on), which the discovery made before the login could not know
            rt.next_discovery = self.clock()
        if updates:
            rt.facts = facts.model_copy(update=updates)
        if news:
            self._identity_observed(rt)  # the host's UUID is news: enrolment, BMC claim
        rt.events.append(ReadyProbeResult(reading=ready_reading(report.ready)))
        self.wake.set()

    def listed(self, instances: Mapping[str, CloudInstance], at: datetime) -> None:
        for name, inst in instances.items():
            rt = self.nodes.get(name)
            if rt is None or rt.node_type != "CloudVM":
                continue
            reading = cloud_power(inst)
            previous = rt.facts.power
            updates: dict[str, Any] = {"power": reading}
            uptime = cloud_uptime(inst)
            if uptime is not None:
                updates["uptime"] = uptime
            rt.facts = rt.facts.model_copy(update=updates)
            snapshot = self.pool.snapshot(name) if self.pool is not None else None
            if snapshot is not None:
                self._update_vm(rt, snapshot)
            waiting = rt.state.state in NON_TERMINAL_STATES
            if previous is None or previous.power != reading.power or waiting:
                rt.events.append(PowerObserved(reading=reading))
            elif (
                rt.state.state is PowerState.OFF and rt.facts.vm is not None and rt.facts.vm.stopped
            ):
                rt.events.append(Evaluate())  # a stopped VM is destroyed (rule 'down')
        self.wake.set()

    async def gone(self, worker: WorkerSnapshot, at: datetime) -> None:
        """The instance left the cloud list: its Off is observed now, before the WorkerNode
        goes, so the transition's record is closed with the confirmation."""
        rt = self.nodes.get(worker.name)
        if rt is None:
            return
        source = self.pool.cloud_source if self.pool is not None else "cloud"
        rt.events.append(
            PowerObserved(reading=cloud_gone(f"cloud:{source}", worker.instance_id, at))
        )
        await self._process(rt, self.clock())
        await self.status.flush()

    def held(self, name: str, refusal: Admission | None) -> None:
        """The pool holds (or no longer holds) declared WorkerNode `name` for a cap: its
        `Launched` condition says so (`_conditions` reads the pool's holds)."""
        rt = self.nodes.get(name)
        if rt is not None:
            self.status.contribute(name, {"conditions": self._conditions(rt)})
            self.wake.set()

    def should_probe(self, name: str) -> bool:
        """Probe a side node unless its trusted power source says it is Off."""
        rt = self.nodes.get(name)
        if rt is None:
            return False
        power = rt.facts.power
        if rt.spec is not None and rt.spec.bmc is None:
            return True  # SSH is the only evidence a BMC-less node gives
        return power is None or power.power != "Off" or rt.state.state is PowerState.WAKING

    # ------------------------------------------------------------------ loop

    async def run(self) -> None:
        """Rounds until `stop()`; see the module docstring."""
        self.started = True
        loop = asyncio.get_running_loop()
        while not self._stop.is_set():
            self.wake.clear()
            started = loop.time()
            try:
                await self.round()
            except asyncio.CancelledError:
                if self._stop.is_set() or _cancelling():
                    raise
                # an awaited future was cancelled under us, not this task: a bug to report
                log.exception("power controller round was cancelled from inside; retrying")
            except Exception:
                log.exception("power controller round failed; retrying in a second")
                await asyncio.sleep(1.0)  # not in a tight loop while, say, the API is away
            # a round scans the whole fleet: after one that took T, the next waits T (at
            # most a second), so a stream of observations cannot hold the event loop
            await asyncio.sleep(min(loop.time() - started, MAX_PAUSE))
            timeout = self._sleep_for(self.clock())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), timeout=timeout)

    def halt(self) -> None:
        """Start no more rounds (the one under way ends normally; see `stop`)."""
        self._stop.set()
        self.wake.set()

    async def stop(self, grace: float = 0.0) -> None:
        """Halt, let the power requests, intent and status writes under way finish for up
        to `grace` seconds (`nodewarden.drain`) and write what they contributed, cancel the
        rest, close the power adapters."""
        self.halt()
        if self._closed:
            return
        self._closed = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        drained = await drain(self._tasks, grace)
        left = deadline - loop.time()
        if left > 0:
            try:
                await asyncio.wait_for(self.status.flush(), timeout=left)
            except TimeoutError:
                log.warning("power controller stopped before its last status writes ended")
        if drained.finished or drained.cancelled:
            log.info(
                "power controller stopped: %d tasks under way finished, %d cancelled",
                drained.finished,
                drained.cancelled,
            )
        await self.control.close()

    async def round(self) -> None:
        now = self.clock()
        for name, at in self.board.take_acknowledgements().items():
            rt = self.nodes.get(name)
            if rt is not None:
                rt.events.append(AdmissionClosed(at=at, source="dispatcher"))
        if self._next_resync is None or now >= self._next_resync:
            self._next_resync = now + timedelta(seconds=self.settings.resync_interval)
            for rt in self.nodes.values():
                self._spawn(self._validate(rt))
            if self._synced.is_set():
                keep = timedelta(seconds=self.settings.keep_intents_of_gone_nodes)
                self._spawn(self.intents.expire_gone(set(self.nodes), now, keep))
                self._spawn(self.intents.expire_manual(now))
        if self._synced.is_set():
            for intent in self.intents.abandoned(self._transition_intent):
                self._spawn(self.intents.abandon(intent, now))
        self._schedule_observations(now)
        fleet: dict[str | None, FleetReading] | None = None  # counted once a node steps
        for rt in list(self.nodes.values()):
            due = rt.due_at is not None and now >= rt.due_at
            if not rt.events and not due:
                continue
            if due:
                rt.due_at = None
            if fleet is None:
                fleet = fleet_readings(
                    ((n.policy_name, n.node_type, n.state) for n in self.nodes.values()), now
                )
            rt.facts = rt.facts.model_copy(update={"fleet": fleet.get(rt.policy_name)})
            try:
                await self._process(rt, now, due=due)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # one node's bug: mark it, the round goes on
                self._failed(rt, exc)
            else:
                if rt.failure is not None:
                    rt.failure = None
                    self.status.contribute(rt.name, {"conditions": self._conditions(rt)})
        if self._reread_wanted:
            self._spawn(self._reread_demand(set(self._reread_wanted)))
            self._reread_wanted.clear()
        held, self._hold_writes = self._hold_writes, set()
        await self.status.flush(hold=held)
        self._held = held
        gauges.publish(self.nodes.values(), now)

    def _transition_intent(self, node: str) -> str | bool | None:
        """The intent of `node`'s current transition (None: none; False: not our node)."""
        rt = self.nodes.get(node)
        return False if rt is None else rt.transition_intent

    def _sleep_for(self, now: datetime) -> float:
        soonest = 5.0
        for rt in self.nodes.values():
            if rt.events:
                return 0.0
            for at in (rt.due_at, rt.next_poll, rt.next_discovery):
                if at is not None:
                    soonest = min(soonest, (at - now).total_seconds())
        return max(0.05, soonest)

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ------------------------------------------------------------------ one node

    def _failed(self, rt: NodeRuntime, exc: Exception) -> None:
        """A step of `rt` raised: log it, mark the node (`Reconciled=False`), go on; the
        node is stepped again at its next event or at the next evaluation."""
        log.error("power step of WorkerNode %s failed", rt.name, exc_info=exc)
        rt.failure = f"{type(exc).__name__}: {exc}"[:1000]
        rt.events.clear()
        rt.due_at = self.clock() + timedelta(seconds=self.settings.evaluate_interval)
        self.status.contribute(rt.name, {"conditions": self._conditions(rt)})

    def _policy(self, rt: NodeRuntime) -> Policy:
        return self.policies.for_node(rt.policy_name)

    async def _process(self, rt: NodeRuntime, now: datetime, due: bool = False) -> None:
        if rt.spec is None:
            rt.events.clear()
            return
        policy = self._policy(rt)
        view = policy.view
        self._static_facts(rt, now)
        events: list[Event] = list(rt.events)
        rt.events.clear()
        if not events:
            t = rt.state.transition
            events = [DeadlineReached(transition_id=t.id) if t is not None else Evaluate()]
        for event in events:
            # the last record written is the previous one: a step that reaches the same
            # decision gets it back re-evaluated (no full record is built)
            result = step(rt.state, rt.facts, event, now, view, previous=rt.record)
            self.steps += 1
            if view.shadow and self._acts(result):
                rt.facts = result.facts  # observations count; the decision is not carried out
                await self._shadow(rt, result, event, view, now)
                continue
            headline = (result.decision, result.reasons, result.next.state, result.next.admission)
            opens_or_closes = any(
                isinstance(a, (OpenTransition, CloseTransition, RequestPower))
                for a in result.actions
            )
            record: SafetyRecord | None = None
            if headline != rt.headline or opens_or_closes:
                record = result.record
            before = rt.state
            rt.state, rt.facts = result.next, result.facts
            if not await self._apply(rt, before, result, record, headline, view, now):
                return

    def _acts(self, result: Step) -> bool:
        """Would this step act on the node (begin a power transition)?"""
        for a in result.actions:
            if isinstance(a, OpenTransition) and a.kind is not TransitionKind.VERIFY:
                return True
            if isinstance(a, _SKIP_IN_SHADOW):
                return True
        return False

    async def _shadow(
        self, rt: NodeRuntime, result: Step, event: Event, view: PolicyView, now: datetime
    ) -> None:
        """Record what would have happened (PowerIntent phase Shadow), do nothing."""
        key = (result.decision, result.reasons)
        rt.due_at = now + timedelta(seconds=self.settings.evaluate_interval)
        if key == rt.shadow_key:
            return
        rt.shadow_key = key
        record = step(rt.state, rt.facts, event, now, view).record
        assert record is not None
        opened = next((a for a in result.actions if isinstance(a, OpenTransition)), None)
        action: PowerAction = (
            "Wake" if opened is not None and opened.kind is TransitionKind.WAKE else "Shutdown"
        )
        tid = opened.transition_id if opened is not None else f"shadow-{now:%Y%m%d-%H%M%S}"
        intent = await self.intents.create_policy_intent(
            rt.name, f"shadow-{tid}", action, "shadow mode: not acted on", now
        )
        fields = record_fields(record)
        fields["reasons"] = [*fields["reasons"], R.SHADOW_MODE.value]
        fields.update(
            phase="Shadow",
            message="shadow mode: decided and recorded, not acted on",
            startedAt=iso(now),
            finishedAt=iso(now),
        )
        await self.intents.write(intent, fields)
        self._event(rt, record, extra=" (shadow mode: not acted on)")

    async def _apply(
        self,
        rt: NodeRuntime,
        before: NodePowerState,
        result: Step,
        record: SafetyRecord | None,
        headline: tuple[Any, ...],
        view: PolicyView,
        now: datetime,
    ) -> bool:
        """Carry out one step. Returns False when the node must reload its state."""
        state = rt.state
        gauges.observe_step(before, state)
        self.board.set(rt.name, board_view(rt, self._policy(rt).view.valid))
        self.status.contribute(rt.name, self._power_status(rt, record))
        requests = [a for a in result.actions if isinstance(a, RequestPower)]
        if requests:
            self.status.contribute(
                rt.name, {"powerState": state.model_dump(mode="json", by_alias=True)}
            )
            rt.persisted = state
            try:
                await self.status.persist(rt.name)
            except (PowerStateConflict, KubeError) as exc:
                log.warning(
                    "WorkerNode %s: power state not persisted (%s); no request sent, reloading",
                    rt.name,
                    exc,
                )
                self._reload(rt)
                return False
        for action in result.actions:
            if isinstance(action, OpenTransition):
                await self._open(rt, action, now)
            elif isinstance(action, CloseTransition):
                await self._close(rt, action, record, now)
        if record is not None:
            closed = any(isinstance(a, CloseTransition) for a in result.actions)
            await self._record(rt, record, headline, now, closed, requested=bool(requests))
        self._reflect_manual(rt, result, record, now)
        for action in result.actions:
            self._execute(rt, action, now)
        if result.decision is Decision.DEFER and not any(
            isinstance(a, ScheduleRecheck) for a in result.actions
        ):
            rt.due_at = now + timedelta(seconds=self.settings.evaluate_interval)
        if state.state is not before.state:
            log.info(
                "WorkerNode %s: %s -> %s (%s %s)",
                rt.name,
                before.state.value,
                state.state.value,
                result.decision.value,
                ",".join(r.value for r in result.reasons),
            )
        return True

    def _reload(self, rt: NodeRuntime) -> None:
        stored = self.status.server_status(rt.name).get("powerState")
        if isinstance(stored, Mapping):
            with contextlib.suppress(ValidationError):
                rt.state = self._restored(
                    rt.name, NodePowerState.model_validate(stored), self.clock()
                )
        rt.events.append(Evaluate())

    def _restored(self, name: str, state: NodePowerState, now: datetime) -> NodePowerState:
        """A stored power state on this replica's clock (`state.rebased`)."""
        state, lead = rebased(state, now)
        if lead:
            log.warning(
                "WorkerNode %s: the stored power state was written by a clock %.1fs ahead "
                "of this replica's; its times are moved back by that much",
                name,
                lead.total_seconds(),
            )
        return state

    # -- facts that come from the spec, intents, policy, demand -------------------------

    def _static_facts(self, rt: NodeRuntime, now: datetime) -> None:
        spec = rt.spec
        assert spec is not None
        desired = DesiredReading(
            source=f"WorkerNode/{rt.name} spec (generation {rt.generation})",
            observed_at=rt.spec_seen_at,
            power=spec.power,
            idle_behavior=spec.idle_behavior,
        )
        updates: dict[str, Any] = {}
        if rt.facts.desired != desired:
            updates["desired"] = desired
        if rt.facts.node_type != spec.node_type:
            updates["node_type"] = spec.node_type
        if updates:
            rt.facts = rt.facts.model_copy(update=updates)
        self._sync_intent(rt)

    def _sync_intent(self, rt: NodeRuntime) -> None:
        active = self.intents.active(rt.name)
        manual: ManualIntent | None = (
            self.intents.manual_fact(active) if active is not None else None
        )
        if rt.facts.intent != manual:  # another intent, or its requester verified now
            rt.events.append(ManualOverride(intent=manual))

    def requester_admission(self, admission: RequesterAdmission) -> None:
        """The last check of the requester admission policy (`kube.requesters`): overrides
        are honoured only while it is in force. A change re-judges the active intents."""
        previous = self.intents.admission
        self.intents.admission = admission
        if previous.enforced == admission.enforced and previous.checked:
            return
        level = logging.INFO if admission.enforced else logging.WARNING
        log.log(level, "requester admission: %s", admission.detail)
        for rt in self.nodes.values():
            self._sync_intent(rt)
        self.wake.set()

    def _update_vm(self, rt: NodeRuntime, worker: WorkerSnapshot) -> None:
        reading = vm_reading(worker, self.clock())
        observed = reading.observed_at
        if rt.facts.vm != reading:
            capability = rt.facts.capability
            updates: dict[str, Any] = {"vm": reading}
            if capability is None or capability.control_method != "Cloud":
                updates["capability"] = self.control_capability_cloud(observed)
            rt.facts = rt.facts.model_copy(update=updates)

    def control_capability_cloud(self, at: datetime) -> CapabilityReading:
        return cloud_capability("cloud", at)

    def _update_demand(self, now: datetime) -> None:
        assert self._plan is not None
        containers, plan, at = self._plan
        nodes = ((rt.name, rt.spec, rt.state.state) for rt in self.nodes.values())
        readings = planned_demand(nodes, containers, plan, at, self.catalogue, self.type_policy)
        for name, reading in readings.items():
            rt = self.nodes[name]
            previous = rt.facts.demand
            rt.facts = rt.facts.model_copy(update={"demand": reading})
            event = demand_event(previous, reading)
            if event is not None:
                rt.events.append(event)

    async def _reread_demand(self, nodes: set[str]) -> None:
        """RereadDemand: a live LIST of the queue (not the cache), one for all nodes asking."""
        try:
            bodies = await self.kube.list(CONTAINER_DISPATCH, self.namespace)
        except KubeError as exc:
            log.warning("live re-read of the queue failed (%s); retrying next round", exc)
            self._reread_wanted |= nodes
            return
        read_at = self.clock()
        queued = queued_from_bodies(bodies, read_at)
        for name in nodes:
            rt = self.nodes.get(name)
            if rt is None:
                continue
            reading = reread_demand(
                rt.name, rt.spec, queued, read_at, self.catalogue, self.type_policy
            )
            rt.events.append(DemandReread(reading=reading))
        self.wake.set()

    # -- observations the controller schedules itself ------------------------------------

    def _schedule_observations(self, now: datetime) -> None:
        for rt in self.nodes.values():  # every round, over the whole fleet: keep it cheap
            discover = rt.next_discovery is not None and now >= rt.next_discovery
            poll = rt.next_poll is not None and now >= rt.next_poll and rt.has_bmc_side
            ref = rt.ref() if discover or poll else None
            if ref is None:
                continue
            if discover:
                rt.next_discovery = now + timedelta(seconds=self.settings.capability_interval)
                self._spawn(self._discover(rt, ref))
            if poll:
                interval = self._poll_interval(rt)
                if not rt.polled:
                    rt.polled = True
                    interval *= poll_phase(rt.name)
                rt.next_poll = now + timedelta(seconds=interval)
                self._poll(rt, ref)

    def _poll_interval(self, rt: NodeRuntime) -> float:
        capability = rt.facts.capability
        if capability is not None and capability.refusal is not None:
            # nothing may be sent: the read only notices a repaired designation
            return REFUSED_POLL_INTERVAL
        max_age = self._policy(rt).view.telemetry_max_age.total_seconds()
        return max(1.0, min(self.settings.power_poll_interval, max_age / 3))

    def _poll(self, rt: NodeRuntime, ref: NodeRef) -> None:
        if "poll" in rt.busy:
            return
        rt.busy.add("poll")

        async def poll() -> None:
            try:
                reading = await self.control.read_power(ref)
            finally:
                rt.busy.discard("poll")
            if isinstance(reading, Refusal):
                return  # the capability discovery records the refusal
            known = rt.facts.capability
            if known is not None and known.refusal is not None:
                # the credentials resolve now (an administrator designated the Secret or
                # admitted the endpoint): what the node allows is worth a look at once
                rt.next_discovery = self.clock()
            bmc_uuid = self.control.system_uuids.get(rt.name)
            if bmc_uuid is not None:
                news = rt.identity.observe_bmc(bmc_uuid.uuid, bmc_uuid.source, bmc_uuid.observed_at)
                if news:
                    self._identity_observed(rt)
                else:
                    rt.facts = rt.facts.model_copy(update={"identity": rt.identity.reading()})
            if reading is not None:
                rt.events.append(PowerObserved(reading=reading))
            self._announce_power_source_error(rt)
            self.status.contribute(rt.name, {"conditions": self._conditions(rt)})
            self.wake.set()

        self._spawn(poll())

    async def _discover(self, rt: NodeRuntime, ref: NodeRef) -> None:
        if "discover" in rt.busy:
            # one is under way, perhaps with the spec or credentials of before: look again
            # once it is done rather than a whole capability interval later
            rt.next_discovery = self.clock() + timedelta(seconds=1)
            return
        rt.busy.add("discover")
        try:
            ready = rt.facts.ready
            capability = await self.control.discover(ref, ssh_works=ready is not None)
        finally:
            rt.busy.discard("discover")
        if capability.allowable is None:
            # failed, or refused credentials (which an administrator may designate at any
            # time without the WorkerNode changing): look again soon, then less often (a
            # fleet of refused nodes costs little); the node turning valid, or a BMC read
            # that succeeds, looks again at once
            rt.next_discovery = self.clock() + timedelta(
                seconds=rediscovery_delay(rt.discovery_retries, self.settings.capability_interval)
            )
            rt.discovery_retries += 1
        else:
            rt.discovery_retries = 0
            if ready is None and rt.facts.ready is not None:
                rt.next_discovery = self.clock()  # SSH logged in meanwhile: look again
        previous = rt.facts.capability
        kept = previous is not None and previous.allowable is not None
        if kept and capability.allowable is None and capability.refusal is None:
            return  # keep the last known capability when rediscovery merely failed
        rt.facts = rt.facts.model_copy(update={"capability": capability})
        self._announce_power_source_error(rt)
        fields: dict[str, Any] = {"conditions": self._conditions(rt)}
        same = _same_capability(previous, capability)
        if not same:
            # only a new finding is written: a rediscovery that finds the same (a refused
            # node every 30 s, every node every capability_interval) would otherwise write
            # its time alone, 9,000 refused nodes some 300 writes a second
            fields["powerControl"] = capability.model_dump(mode="json", by_alias=True)
        self.status.contribute(rt.name, fields)
        if not same:
            rt.events.append(Evaluate())
            self.wake.set()

    # -- actions --------------------------------------------------------------------------

    def _execute(self, rt: NodeRuntime, action: Action, now: datetime) -> None:
        ref = rt.ref()
        if isinstance(action, CloseAdmission):
            self.board.close(rt.name, now)
            if self.acknowledge_admission or self.pool is None:
                self.board.acknowledge(rt.name, now)
            self.wake.set()
        elif isinstance(action, RereadDemand):
            self._reread_wanted.add(rt.name)
        elif isinstance(action, RequestPower) and ref is not None:
            self._spawn(self._request(rt, ref, action))
        elif isinstance(action, PollObservedPower) and ref is not None:
            if rt.has_bmc_side:
                self._poll(rt, ref)
            else:
                self._spawn(self.control.read_power(ref))
        elif isinstance(action, RunReadyProbe):
            if self.pool is not None:
                self.pool.request_probe(rt.name)
        elif isinstance(action, RefreshFacts) and ref is not None:
            names = set(action.facts)
            probed = {"work", "inhibitors", "uptime", "ready", "identity"}
            if names & probed and self.pool is not None:
                self.pool.request_probe(rt.name)
            if "capability" in names:
                rt.next_discovery = now
            if "vm" in names and self.pool is not None:
                self.pool.request_sync()
            if "demand" in names:
                self._reread_wanted.add(rt.name)
        elif isinstance(action, ScheduleRecheck):
            # never sooner than a moment from now: a recheck due "now" while the evidence
            # it waits for is still on its way would otherwise step the node in a loop
            at = max(action.at, now + _MIN_RECHECK)
            rt.due_at = at if rt.due_at is None else min(rt.due_at, at)
            if action.at <= now and rt.name not in self._held:
                self._hold_writes.add(rt.name)  # the next step's write carries this one's

    async def _request(self, rt: NodeRuntime, ref: NodeRef, action: RequestPower) -> None:
        outcome = await self.control.request(
            ref, action.transition_id, action.attempt, action.action
        )
        result = {
            "RequestAccepted": "accepted",
            "RequestRejected": "rejected",
            "RequestErrored": "errored",
        }[outcome.type]
        POWER_REQUESTS.labels(action.action, result, str(action.attempt > 1).lower()).inc()
        log.info(
            "WorkerNode %s: %s #%d %s: %s",
            rt.name,
            action.action,
            action.attempt,
            result,
            outcome.detail,
        )
        rt.events.append(outcome)
        if rt.has_bmc_side:
            rt.next_poll = self.clock()  # look at the BMC soon
        self.wake.set()

    # -- intents and records ------------------------------------------------------------------

    async def _open(self, rt: NodeRuntime, action: OpenTransition, now: datetime) -> None:
        if action.kind is TransitionKind.VERIFY:
            return
        if action.intent is not None:
            rt.transition_intent = action.intent
            intent = self.intents.intents.get(action.intent)
            if intent is not None:
                intent.started_at = now
            return
        kind: PowerAction = "Wake" if action.kind is TransitionKind.WAKE else "Shutdown"
        reasons = ",".join(r.value for r in rt.state.last_reasons) or "policy"
        intent_obj = await self.intents.create_policy_intent(
            rt.name, action.transition_id, kind, f"policy decision: {reasons}", now
        )
        rt.transition_intent = intent_obj.name

    async def _close(
        self, rt: NodeRuntime, action: CloseTransition, record: SafetyRecord | None, now: datetime
    ) -> None:
        name = rt.transition_intent
        rt.transition_intent = None
        intent = self.intents.intents.get(name or "")
        if intent is None:
            return
        phase: str = action.outcome
        manual = rt.facts.intent
        if action.outcome == "Aborted" and manual is not None and manual.name != intent.name:
            phase = "Superseded"
        fields: dict[str, Any] = {
            "phase": phase,
            "finishedAt": iso(now),
            "message": phase_message(phase, action.reasons),
        }
        if record is not None:
            fields.update(record_fields(record))
        await self.intents.write(intent, fields)

    async def _record(
        self,
        rt: NodeRuntime,
        record: SafetyRecord,
        headline: tuple[Any, ...],
        now: datetime,
        closed: bool = False,
        requested: bool = False,
    ) -> None:
        changed = headline != rt.headline
        rt.headline = headline
        rt.record = record
        if changed and record.decision is Decision.BLOCK and not closed:
            await self._blocked_without_transition(rt, record, now)
        if rt.transition_intent is not None:
            intent = self.intents.intents.get(rt.transition_intent)
            if intent is not None and not intent.finished:
                fields = record_fields(record)
                fields.update(
                    phase="InProgress",
                    startedAt=iso(intent.started_at or now),
                    message=phase_message("InProgress", record.reasons),
                )
                if requested:
                    # kept when later records (the confirmation) replace safetyRecord
                    fields["requestRecord"] = fields["safetyRecord"]
                await self.intents.write(intent, fields)
        if changed:
            rt.history.append(
                {
                    "time": iso(record.decided_at),
                    "decision": record.decision.value,
                    "reasons": [r.value for r in record.reasons],
                    "stateBefore": record.state_before.value,
                    "stateAfter": record.state_after.value,
                    "event": record.event,
                    "powerIntent": record.power_intent,
                }
            )
            POWER_DECISIONS.labels(
                record.decision.value, record.reasons[0].value if record.reasons else ""
            ).inc()
            self._event(rt, record)

    async def _blocked_without_transition(
        self, rt: NodeRuntime, record: SafetyRecord, now: datetime
    ) -> None:
        """A BLOCK decision outside a transition (a gate forbids what the policy wants,
        e.g. an inhibitor on an idle node) is a power decision too: it gets a policy-made
        PowerIntent in phase Blocked carrying the record, once per episode."""
        if rt.transition_intent is not None or self.intents.active(rt.name) is not None:
            return
        if rt.state.state is PowerState.BLOCKED:
            return  # the transition that ended BLOCKED already closed its intent
        if any(decision_class(r) is DecisionClass.DEFER for r in record.reasons):
            return  # not due yet (time or evidence missing): the block is not what holds it
        action: PowerAction = "Wake" if rt.state.state is PowerState.OFF else "Shutdown"
        intent = await self.intents.create_policy_intent(
            rt.name, f"blocked-{now:%Y%m%d-%H%M%S}", action, "policy decision blocked", now
        )
        fields = record_fields(record)
        fields.update(
            phase="Blocked",
            message=phase_message("Blocked", record.reasons),
            startedAt=iso(now),
            finishedAt=iso(now),
        )
        await self.intents.write(intent, fields)

    def _reflect_manual(
        self, rt: NodeRuntime, result: Step, record: SafetyRecord | None, now: datetime
    ) -> None:
        """The active manual intent's phase from this step; later ones wait behind it.

        Only onto the intent the step was decided with (`rt.facts.intent`): one that became
        active during this step's awaits (its predecessor finished, its event queued) is
        reflected by the next step, which knows of it -- never with a decision made without
        it (an override the step never saw, the gates of the intent before)."""
        active = self.intents.active(rt.name)
        if active is None:
            return
        decided_for = rt.facts.intent.name if rt.facts.intent is not None else None
        if active.name != decided_for:
            return
        for waiting in self.intents.waiting(rt.name):
            self._spawn(
                self.intents.write(
                    waiting,
                    {"phase": "Pending", "message": f"waiting behind PowerIntent {active.name}"},
                )
            )
        if active.settled and active.action != "Drain":
            return
        phase = manual_phase(active, result, rt.facts.work)
        if phase is None:
            return
        active.asked_phase = phase
        fields: dict[str, Any] = {"phase": phase, "message": phase_message(phase, result.reasons)}
        if record is not None or rt.record is not None:
            fields.update(record_fields(record or rt.record))  # type: ignore[arg-type]
        if phase in ("Succeeded", "Blocked", "Failed") and active.action != "Drain":
            fields["finishedAt"] = iso(now)
        self._spawn(self.intents.write(active, fields))

    def _announce_power_source_error(self, rt: NodeRuntime) -> None:
        """A Warning Event when the node's power source starts failing or fails
        differently (the PowerSource condition carries the same text); none while the
        same error repeats."""
        error = self.control.last_error.get(rt.name)
        if error == rt.reported_error:
            return
        rt.reported_error = error
        if error is None:
            return
        self._spawn(
            self.kube.emit_event(
                self._event_object(rt),
                reason="PowerSourceError",
                message=error[:1024],
                type_="Warning",
                action="Observe",
            )
        )

    def _event_object(self, rt: NodeRuntime) -> dict[str, Any]:
        return {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "WorkerNode",
            "metadata": {**rt.meta, "namespace": self.namespace},
        }

    def _event(self, rt: NodeRuntime, record: SafetyRecord, extra: str = "") -> None:
        summary = event_summary(record)
        codes = ",".join(r.value for r in summary.reasons)
        message = f"{summary.decision.value} [{codes}]{extra}: {summary.message}"
        self._spawn(
            self.kube.emit_event(
                self._event_object(rt),
                reason=summary.reason,
                message=message[:1024],
                type_=summary.type,
                action=summary.decision.value.capitalize(),
            )
        )

    # -- status ----------------------------------------------------------------------------

    def _conditions(self, rt: NodeRuntime) -> list[dict[str, Any]]:
        current = self.status.server_status(rt.name).get("conditions") or []
        return conditions(
            rt,
            [c for c in current if isinstance(c, Mapping)],
            self.control.last_error.get(rt.name),
            self.clock(),
            self.pool.holds.get(rt.name) if self.pool is not None else None,
        )

    def _power_status(self, rt: NodeRuntime, record: SafetyRecord | None) -> dict[str, Any]:
        out = power_status(rt, record, self._conditions(rt))
        if "powerState" in out:
            rt.persisted = rt.state
        return out

    async def _validate(self, rt: NodeRuntime) -> None:
        body_spec = rt.spec
        generation = rt.generation
        if body_spec is None:
            verdict = Verdict(False, "InvalidSpec", "spec does not parse")
        else:
            try:
                verdict = await self._judge(rt.name, body_spec)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # one node's bug: it is marked, the others go on
                log.error("validation of WorkerNode %s failed", rt.name, exc_info=exc)
                verdict = failure_verdict(exc)
        if rt.name not in self.nodes or rt.generation != generation:
            return  # gone, or edited meanwhile: the new generation's validation is on its way
        previous = rt.verdict
        rt.verdict = verdict
        rt.validated_generation = generation
        if verdict.valid and previous is not None and not previous.valid:
            # an administrator designated the Secret or admitted the endpoint
            rt.next_discovery = self.clock()
            rt.discovery_retries = 0
        self.status.contribute(
            rt.name, {"conditions": self._conditions(rt), "observedGeneration": generation}
        )
        if not verdict.valid and (previous is None or previous.message != verdict.message):
            log.warning("WorkerNode %s is invalid: %s", rt.name, verdict.message)
            await self.kube.emit_event(
                self._event_object(rt),
                reason=verdict.reason,
                message=verdict.message,
                type_="Warning",
                action="Validate",
            )
        self.wake.set()

    async def _judge(self, name: str, spec: WorkerNodeSpec) -> Verdict:
        refusals = await self.credentials.check(name, spec)
        instance_types = [t.name for t in self.catalogue.types] if self.catalogue.types else None
        return validate_workernode(
            spec,
            namespace=self.namespace,
            policies=self.policies.policies.keys(),
            default_policy=self.default_policy,
            credential_problems=[(r.reason, r.message) for r in refusals],
            instance_types=instance_types,
        )


def rediscovery_delay(retries: int, capability_interval: float) -> float:
    """Seconds until a failed or refused capability discovery is tried again: 30 s after
    the first, doubling with each further one, never longer than the capability interval."""
    return min(capability_interval, _REDISCOVER_AFTER_FAILURE * float(2 ** min(retries, 16)))


def _ssh_may_add_actions(rt: NodeRuntime) -> bool:
    """A side node whose known capability was discovered without a working SSH login."""
    capability = rt.facts.capability
    if rt.node_type != "SideNode" or capability is None or capability.refusal is not None:
        return False
    return "SshPoweroff" not in (capability.allowable or ())


def _same_capability(old: CapabilityReading | None, new: CapabilityReading) -> bool:
    """The same finding, observed again (only the observation time differs)."""
    return old is not None and old.model_copy(update={"observed_at": new.observed_at}) == new


def _spec(body: Mapping[str, Any]) -> WorkerNodeSpec | None:
    try:
        return WorkerNodeSpec.model_validate(body.get("spec") or {})
    except ValidationError:
        return None


def _cancelling() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
