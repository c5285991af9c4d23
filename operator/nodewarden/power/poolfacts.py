"""Facts in, from the work side: the worker pool's observations (probe reports, the cloud
list, an instance gone, its holds; `fleet.ports.WorkerObserver`) and the dispatcher's plan
(the work its ledger places on each node, queued demand, overcommit; the live re-read of
the queue a step may ask for), turned into each node's runtime facts and events.

`PoolFacts` calls `Observations` (a new host identity) and the `Recorder` (conditions);
the round asks it for the re-reads its steps wanted.
"""

from __future__ import annotations

import logging
from collections.abc import Container, Mapping
from datetime import datetime
from typing import Any

from nodewarden.api.kinds import CONTAINER_DISPATCH
from nodewarden.cloud.model import CloudInstance
from nodewarden.fleet.ports import WorkerSnapshot
from nodewarden.kube.client import KubeError
from nodewarden.policy.events import DemandReread, Evaluate, PowerObserved, ReadyProbeResult
from nodewarden.policy.facts import CapabilityReading, WorkReading
from nodewarden.policy.state import NON_TERMINAL_STATES, PowerState
from nodewarden.power.context import PowerContext
from nodewarden.power.observations import Observations
from nodewarden.power.readings import (
    cloud_power,
    cloud_uptime,
    inhibitor_reading,
    ready_reading,
    ssh_power,
    uptime_reading,
)
from nodewarden.power.recording import Recorder
from nodewarden.power.runtime import NodeRuntime
from nodewarden.rules.demand import (
    demand_event,
    placed_counts,
    planned_demand,
    queued_from_bodies,
    reread_demands,
    side_capacities,
)
from nodewarden.rules.freshness import only_time_moved
from nodewarden.rules.gpuwork import gpu_counts, gpu_work, node_gpus, with_gpu, with_utilisation
from nodewarden.rules.readings import cloud_capability, cloud_gone, work_reading
from nodewarden.rules.vm import vm_reading
from nodewarden.scheduling.caps import Admission
from nodewarden.scheduling.views import ContainerView, Plan
from nodewarden.ssh.errors import SshError
from nodewarden.ssh.facts import ProbeReport, RunnersFact

log = logging.getLogger(__name__)


class PoolFacts:
    """See the module docstring."""

    def __init__(self, ctx: PowerContext, observations: Observations, recorder: Recorder) -> None:
        self.ctx = ctx
        self.observations = observations
        self.recorder = recorder
        self._plan: tuple[list[ContainerView], Plan, datetime] | None = None
        self._placed: dict[str, int] = {}
        """Per node: containers holding it in the dispatcher's last ledger."""
        self._gpu_placed: dict[str, int] = {}
        """Per node: those of them holding GPUs (`rules.gpuwork.gpu_counts`)."""
        self._runners_seen: dict[str, RunnersFact] = {}
        """Per node: the runner list it reported last (its work once the ledger lets go
        of a container, `_update_released`)."""
        self._held_at: dict[str, datetime] = {}
        """Per node: the plan that last added a container to it (a runner list observed
        before that says nothing of that container's runner)."""
        self._overcommitted: set[str] = set()
        """Nodes the dispatcher's last plan found running more than they hold."""
        self._ledger_since: datetime | None = None
        """The dispatcher's first plan of this process: GPU evidence is dated no earlier
        (`rules.gpuwork.with_gpu`)."""
        self._reread_wanted: set[str] = set()
        self.quiet = 0
        """Probes and listings that only confirmed a node at rest (no step)."""
        self.ledger_known = True
        """False from `await_ledger` until the dispatcher's first plan: the work on each
        node is unknown (its runners listed are kept in `_runners_unplanned`)."""
        self._runners_unplanned: dict[str, RunnersFact] = {}

    # -- the worker pool's observations (WorkerObserver) -------------------------------

    def probed(
        self, worker: WorkerSnapshot, report: ProbeReport | None, error: SshError | None
    ) -> None:
        ctx = self.ctx
        rt = ctx.nodes.get(worker.name)
        if rt is None:
            return
        held = rt.facts
        if rt.node_type == "CloudVM":
            self._update_vm(rt, worker)
        if report is None:
            if rt.node_type == "CloudVM":
                rt.events.append(Evaluate())
                ctx.wake.set()
            return
        facts = rt.facts
        updates: dict[str, Any] = {}
        runners = report.runners
        if runners is not None:
            self._runners_seen[worker.name] = runners
            # who owns each runner is in the list itself, not in the ledger: known at once,
            # so a starting node's first write carries its RunnersOwned condition
            unowned = tuple(sorted(r.uuid for r in runners.unowned))
            if unowned != rt.unowned_runners:
                rt.unowned_runners = unowned
                self.recorder.contribute_conditions(rt)
        if runners is not None and not self.ledger_known:
            self._runners_unplanned[worker.name] = runners  # judged once the ledger is known
        elif runners is not None:
            updates["work"] = self._work(rt, runners)
        telemetry = report.telemetry
        work = updates.get("work", facts.work)
        if telemetry is not None and work is not None and work.gpu is not None:
            util = (
                tuple(g.utilisation for g in telemetry.gpus) if telemetry.gpus is not None else None
            )
            gpu = with_utilisation(work.gpu, util, telemetry.source, telemetry.observed_at)
            updates["work"] = work.model_copy(update={"gpu": gpu})
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
            rt.next_discovery = ctx.clock()
        ready = ready_reading(report.ready)
        if updates:
            rt.facts = facts.model_copy(update=updates)
        if news:
            self.observations.identity_observed(rt)  # the host's UUID: enrolment, BMC claim
        elif (
            rt.at_rest() and held.ready is not None and ready.observed_at >= held.ready.observed_at
        ):
            confirmed = rt.facts.model_copy(update={"ready": ready})
            if only_time_moved(held, confirmed):
                # the same probe again at rest: fresher evidence, the same decision
                rt.facts = confirmed
                ctx.confirmed(rt)
                self.quiet += 1
                return
        rt.events.append(ReadyProbeResult(reading=ready))
        ctx.wake.set()

    def _work(self, rt: NodeRuntime, runners: RunnersFact) -> WorkReading:
        """The node's work: its runners listed, or the containers the ledger holds on it."""
        active = max(len(runners.runners), self._placed.get(rt.name, 0))
        reading = work_reading(
            active, runners.source, runners.observed_at, rt.idle_since if active == 0 else None
        )
        rt.idle_since = reading.idle_since
        return self._gpu(rt, reading)

    def _gpu(self, rt: NodeRuntime, reading: WorkReading) -> WorkReading:
        """`reading` with the node's GPU evidence (a node with GPUs: `rules.gpuwork`)."""
        gpus = node_gpus(rt.spec, self.ctx.catalogue)
        if gpus <= 0:
            return reading
        placed = self._gpu_placed.get(rt.name, 0)
        return with_gpu(reading, gpus, placed, rt.facts.work, self._ledger_since)

    def await_ledger(self) -> None:
        """Until the dispatcher's first plan, no node's work is known (`ledger_known`)."""
        self.ledger_known = False

    def listed(self, instances: Mapping[str, CloudInstance], at: datetime) -> None:
        ctx = self.ctx
        self._unobserved_vms(instances)  # declared, no instance yet: no reading to wait for
        stepped = False
        for name, inst in instances.items():
            rt = ctx.nodes.get(name)
            if rt is None or rt.node_type != "CloudVM":
                continue
            reading = cloud_power(inst)
            previous = rt.facts.power
            updates: dict[str, Any] = {"power": reading}
            uptime = cloud_uptime(inst)
            if uptime is not None:
                updates["uptime"] = uptime
            rt.facts = rt.facts.model_copy(update=updates)
            snapshot = ctx.pool.snapshot(name) if ctx.pool is not None else None
            if snapshot is not None:
                self._update_vm(rt, snapshot)
            waiting = rt.state.state in NON_TERMINAL_STATES
            if previous is None or previous.power != reading.power or waiting:
                rt.events.append(PowerObserved(reading=reading))
            elif (
                rt.state.state is PowerState.OFF and rt.facts.vm is not None and rt.facts.vm.stopped
            ):
                rt.events.append(Evaluate())  # a stopped VM is destroyed (rule 'down')
            else:  # the list confirms what the node holds: fresher evidence, no step
                ctx.confirmed(rt)
                self.quiet += 1
                continue
            stepped = True
        if stepped:
            ctx.wake.set()

    def list_failed(self, at: datetime) -> None:
        """The cloud list failed: a starting cloud VM's power is not observed now (like a
        failing BMC's), so its first write -- its Valid -- waits no longer for it."""
        if self._unobserved_vms(()):
            self.ctx.wake.set()

    def _unobserved_vms(self, listed: Container[str]) -> bool:
        """Release the starting cloud VMs not in `listed` from the first-write hold
        (`power.firstwrites`); whether there were any."""
        ctx = self.ctx
        first = ctx.first_writes
        released = False
        for name in [n for n in first.waiting() if n not in listed]:
            rt = ctx.nodes.get(name)
            if rt is not None and rt.node_type == "CloudVM":
                first.unobservable(name)
                released = True
        return released

    def gone(self, worker: WorkerSnapshot, at: datetime) -> NodeRuntime | None:
        """The instance left the cloud list: its Off is observed (the node to step now)."""
        ctx = self.ctx
        self._runners_seen.pop(worker.name, None)
        rt = ctx.nodes.get(worker.name)
        if rt is None:
            return None
        source = ctx.pool.cloud_source if ctx.pool is not None else "cloud"
        rt.events.append(
            PowerObserved(reading=cloud_gone(f"cloud:{source}", worker.instance_id, at))
        )
        return rt

    def held(self, name: str, refusal: Admission | None) -> None:
        """The pool holds (or no longer holds) declared WorkerNode `name` for a cap: its
        `Launched` condition says so (`Recorder.conditions` reads the pool's holds)."""
        rt = self.ctx.nodes.get(name)
        if rt is not None:
            self.recorder.contribute_conditions(rt)
            self.ctx.wake.set()

    def should_probe(self, name: str) -> bool:
        """Probe a side node unless its trusted power source says it is Off."""
        rt = self.ctx.nodes.get(name)
        if rt is None:
            return False
        power = rt.facts.power
        if rt.spec is not None and rt.spec.bmc is None:
            return True  # SSH is the only evidence a BMC-less node gives
        return power is None or power.power != "Off" or rt.state.state is PowerState.WAKING

    def _update_vm(self, rt: NodeRuntime, worker: WorkerSnapshot) -> None:
        reading = vm_reading(worker, self.ctx.clock())
        observed = reading.observed_at
        if rt.facts.vm != reading:
            capability = rt.facts.capability
            updates: dict[str, Any] = {"vm": reading}
            if capability is None or capability.control_method != "Cloud":
                updates["capability"] = control_capability_cloud(observed)
            rt.facts = rt.facts.model_copy(update=updates)

    # -- the dispatcher's plan ---------------------------------------------------------

    def planned(self, containers: list[ContainerView], plan: Plan, now: datetime) -> None:
        """The dispatcher's round: its capacity ledger (each node's work) and queued
        demand for every node, by the plan's fit rules."""
        self._plan = (containers, plan, now)
        if self._ledger_since is None:
            self._ledger_since = now
        self._update_demand(now)
        previous, self._placed = self._placed, placed_counts(containers)
        gpu_before, self._gpu_placed = self._gpu_placed, gpu_counts(containers)
        for name, count in self._placed.items():
            if count > previous.get(name, 0):
                self._held_at[name] = now
        if not self.ledger_known:
            self._ledger_known()
        self._update_placed(now)
        self._update_released(previous)
        self._update_gpu(gpu_before, now)
        self._update_overcommit(plan.over_capacity)
        self.ctx.wake.set()

    def _ledger_known(self) -> None:
        """The first plan: the runners each node listed meanwhile become its work."""
        self.ledger_known = True
        for name, runners in self._runners_unplanned.items():
            rt = self.ctx.nodes.get(name)
            if rt is None:
                continue
            rt.facts = rt.facts.model_copy(update={"work": self._work(rt, runners)})
            rt.events.append(Evaluate())
        self._runners_unplanned.clear()

    def plan_unchanged(self, now: datetime) -> None:
        """The dispatcher skipped a plan (nothing it reads changed): the demand of the last
        plan holds at `now` (`PowerContext.demand_confirmed_at`; O(1), no node touched:
        each node's expiry reads the confirmation when it comes due)."""
        if self._plan is not None:
            self.ctx.demand_confirmed_at = now

    def _update_overcommit(self, over: Mapping[str, str]) -> None:
        """The condition Overcommitted of a node the dispatcher found running more than it
        holds (set while it does, cleared once it fits; never set on other nodes)."""
        for name in over.keys() | self._overcommitted:
            rt = self.ctx.nodes.get(name)
            if rt is None or rt.overcommit == over.get(name):
                continue
            rt.overcommit = over.get(name)
            self.recorder.contribute_conditions(rt)
        self._overcommitted = set(over)

    def _update_placed(self, at: datetime) -> None:
        """Work in the dispatcher's ledger is work on the node from the moment a container
        is chosen for it until its runner is seen gone: a node is never taken for idle
        while a start is in flight, a lock is held or a cancelled runner still runs."""
        for name, count in self._placed.items():
            rt = self.ctx.nodes.get(name)
            if rt is None:
                continue
            work = rt.facts.work
            if work is not None and (work.active_jobs >= count or work.observed_at > at):
                continue
            reading = work_reading(count, "dispatcher (containers holding the node)", at, None)
            rt.facts = rt.facts.model_copy(update={"work": self._gpu(rt, reading)})
            rt.idle_since = None
            rt.events.append(Evaluate())

    def _update_released(self, previous: Mapping[str, int]) -> None:
        """A node the ledger holds fewer containers on than in the last plan: its work is
        its last runner list again (the stream reported the runner gone while the ledger
        still held the container, so that report changed nothing), stepped now rather
        than at the node's next probe or heartbeat. Only a list observed after the
        ledger last added a container counts: an older one never saw that runner, so
        the node waits for its next reading (idle since a reading, never before it)."""
        for name, count in previous.items():
            placed = self._placed.get(name, 0)
            if placed >= count:
                continue
            held_at = self._held_at.get(name)
            if placed == 0:
                self._held_at.pop(name, None)
            rt = self.ctx.nodes.get(name)
            runners = self._runners_seen.get(name)
            if rt is None:
                self._runners_seen.pop(name, None)
                continue
            if runners is None or rt.facts.work is None:
                continue
            if held_at is not None and runners.observed_at <= held_at:
                continue
            reading = self._work(rt, runners)
            if reading.active_jobs != rt.facts.work.active_jobs:
                rt.facts = rt.facts.model_copy(update={"work": reading})
                rt.events.append(Evaluate())

    def _update_gpu(self, before: Mapping[str, int], at: datetime) -> None:
        """A node whose containers holding GPUs changed in the ledger: its GPU evidence
        (and so its GPU idle-since, `rules.gpuwork`) as of this plan, stepped now."""
        for name in before.keys() | self._gpu_placed.keys():
            count = self._gpu_placed.get(name, 0)
            if before.get(name, 0) == count:
                continue
            rt = self.ctx.nodes.get(name)
            work = rt.facts.work if rt is not None else None
            if rt is None or work is None or work.gpu is None or work.gpu.gpu_jobs == count:
                continue
            gpu = gpu_work(
                work.gpu.gpus, count, "dispatcher (containers holding GPUs)", at, work.gpu
            )
            rt.facts = rt.facts.model_copy(update={"work": work.model_copy(update={"gpu": gpu})})
            rt.events.append(Evaluate())

    def _update_demand(self, now: datetime) -> None:
        assert self._plan is not None
        ctx = self.ctx
        containers, plan, at = self._plan
        nodes = ((rt.name, rt.spec, rt.state.state) for rt in ctx.nodes.values())
        readings = planned_demand(
            nodes, containers, plan, at, ctx.catalogue, ctx.type_policy, ctx.placement()
        )
        for name, reading in readings.items():
            rt = ctx.nodes[name]
            previous = rt.facts.demand
            rt.facts = rt.facts.model_copy(update={"demand": reading})
            event = demand_event(previous, reading)
            if event is not None:
                rt.events.append(event)

    def want_reread(self, name: str) -> None:
        """A step asked for a live re-read of the queue (`RereadDemand`)."""
        self._reread_wanted.add(name)

    def reread_wanted(self) -> None:
        """Start the one live re-read for every node that asked since the last round."""
        if self._reread_wanted:
            self.ctx.spawn(self._reread_demand(set(self._reread_wanted)))
            self._reread_wanted.clear()

    async def _reread_demand(self, nodes: set[str]) -> None:
        """RereadDemand: a live LIST of the queue (not the cache), one for all nodes asking."""
        ctx = self.ctx
        try:
            bodies = await ctx.kube.list(CONTAINER_DISPATCH, ctx.namespace)
        except KubeError as exc:
            log.warning("live re-read of the queue failed (%s); retrying next round", exc)
            self._reread_wanted |= nodes
            return
        read_at = ctx.clock()
        queued = queued_from_bodies(bodies, read_at)
        asking = [rt for rt in map(ctx.nodes.get, sorted(nodes)) if rt is not None]
        readings = reread_demands(
            ((rt.name, rt.spec) for rt in asking),
            queued,
            read_at,
            ctx.catalogue,
            ctx.type_policy,
            ctx.placement(),
            side_capacities(rt.spec for rt in ctx.nodes.values()),
        )
        for rt in asking:
            rt.events.append(DemandReread(reading=readings[rt.name]))
        ctx.wake.set()


def control_capability_cloud(at: datetime) -> CapabilityReading:
    return cloud_capability("cloud", at)


def _ssh_may_add_actions(rt: NodeRuntime) -> bool:
    """A side node whose known capability was discovered without a working SSH login."""
    capability = rt.facts.capability
    if rt.node_type != "SideNode" or capability is None or capability.refusal is not None:
        return False
    return "SshPoweroff" not in (capability.allowable or ())
