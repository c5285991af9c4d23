"""The observations the power controller schedules itself: each node's BMC power reads
(polls, spread over the interval) and its power-control capability discovery (again after
a spec change, a failure with backoff, a first SSH login, a credential repaired).

`Sensing` runs the reads through `power.control`; what they find goes into the node's
facts and events (`Observations` for a new identity, `Recorder` for the conditions and the
capability written to status); a read also takes the node's power reading when it is due
(`Energy.polled`).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from nodewarden.credentials import Refusal
from nodewarden.policy.events import Evaluate, PowerObserved
from nodewarden.policy.facts import CapabilityReading, PowerReading
from nodewarden.power.agenda import Timer
from nodewarden.power.context import PowerContext
from nodewarden.power.control import NodeRef
from nodewarden.power.energy import Energy
from nodewarden.power.observations import Observations
from nodewarden.power.recording import Recorder
from nodewarden.power.runtime import NodeRuntime, poll_phase

# a capability discovery that failed or was refused credentials is retried this soon (s),
# doubling up to the capability interval
_REDISCOVER_AFTER_FAILURE = 30.0
REFUSED_POLL_INTERVAL = 60.0
"""Seconds between power reads of a node whose BMC credentials are refused."""


class Sensing:
    """See the module docstring."""

    def __init__(
        self, ctx: PowerContext, observations: Observations, recorder: Recorder, energy: Energy
    ) -> None:
        self.ctx = ctx
        self.observations = observations
        self.recorder = recorder
        self.energy = energy
        self.quiet = 0
        """BMC reads that only confirmed a node at rest (folded in without a step)."""

    def schedule(self, now: datetime) -> None:
        """Start the reads and discoveries that are due (every round; the agenda's heaps
        name them, no scan of the fleet)."""
        ctx = self.ctx
        agenda = ctx.agenda
        nodes = ctx.nodes
        for name in agenda.due(Timer.DISCOVER, now, _current(nodes, "next_discovery")):
            rt = nodes[name]
            ref = rt.ref()
            if ref is None:
                continue  # no spec: a spec that parses sets the discovery again
            rt.next_discovery = now + timedelta(seconds=ctx.settings.capability_interval)
            ctx.spawn(self._discover(rt, ref))
        for name in agenda.due(Timer.POLL, now, _current(nodes, "next_poll")):
            rt = nodes[name]
            ref = rt.ref()
            if ref is None or not rt.has_bmc_side:
                continue  # no BMC: an edit that adds one sets the poll again
            interval = self._poll_interval(rt)
            if not rt.polled:
                rt.polled = True
                interval *= poll_phase(rt.name)
            rt.next_poll = now + timedelta(seconds=interval)
            self.poll(rt, ref)

    def _poll_interval(self, rt: NodeRuntime) -> float:
        """Fast while the node moves (a transition, a step waiting for evidence), slow at
        rest; never so slow that the power reading turns stale between two reads."""
        capability = rt.facts.capability
        if capability is not None and capability.refusal is not None:
            # nothing may be sent: the read only notices a repaired designation
            return REFUSED_POLL_INTERVAL
        settings = self.ctx.settings
        max_age = self.ctx.policy(rt).view.telemetry_max_age.total_seconds()
        if rt.at_rest():
            return max(1.0, min(settings.power_poll_interval_at_rest, max_age / 2))
        return max(1.0, min(settings.power_poll_interval, max_age / 3))

    def poll(self, rt: NodeRuntime, ref: NodeRef) -> None:
        """Read the node's power from its BMC (one read under way per node)."""
        if "poll" in rt.busy:
            return
        rt.busy.add("poll")
        ctx = self.ctx

        async def poll() -> None:
            try:
                reading = await ctx.control.read_power(ref)
            finally:
                rt.busy.discard("poll")
            if not isinstance(reading, PowerReading) and rt.name in ctx.first_writes.waiting():
                # refused or failed: a starting node's first write waits no longer for it
                ctx.first_writes.unobservable(rt.name)
                ctx.wake.set()
            if isinstance(reading, Refusal):
                return  # the capability discovery records the refusal
            known = rt.facts.capability
            if known is not None and known.refusal is not None:
                # the credentials resolve now (an administrator designated the Secret or
                # admitted the endpoint): what the node allows is worth a look at once
                rt.next_discovery = ctx.clock()
            bmc_uuid = ctx.control.system_uuids.get(rt.name)
            if bmc_uuid is not None:
                news = rt.identity.observe_bmc(bmc_uuid.uuid, bmc_uuid.source, bmc_uuid.observed_at)
                if news:
                    self.observations.identity_observed(rt)
                else:
                    rt.facts = rt.facts.model_copy(update={"identity": rt.identity.reading()})
            self.recorder.announce_power_source_error(rt)
            self.recorder.contribute_conditions(rt)
            if reading is None:
                return
            self.energy.polled(rt, ref, reading)  # the power reading, when it is due
            if _confirms(rt, reading):
                # the same power, read again at rest: fresher evidence, the same decision
                rt.facts = rt.facts.model_copy(update={"power": reading})
                ctx.confirmed(rt)
                self.quiet += 1
                return
            rt.events.append(PowerObserved(reading=reading))
            ctx.wake.set()

        ctx.spawn(poll())

    async def _discover(self, rt: NodeRuntime, ref: NodeRef) -> None:
        ctx = self.ctx
        if "discover" in rt.busy:
            # one is under way, perhaps with the spec or credentials of before: look again
            # once it is done rather than a whole capability interval later
            rt.next_discovery = ctx.clock() + timedelta(seconds=1)
            return
        rt.busy.add("discover")
        try:
            ready = rt.facts.ready
            capability = await ctx.control.discover(ref, ssh_works=ready is not None)
        finally:
            rt.busy.discard("discover")
        if capability.allowable is None:
            # failed, or refused credentials (which an administrator may designate at any
            # time without the WorkerNode changing): look again soon, then less often (a
            # fleet of refused nodes costs little); the node turning valid, or a BMC read
            # that succeeds, looks again at once
            rt.next_discovery = ctx.clock() + timedelta(
                seconds=rediscovery_delay(rt.discovery_retries, ctx.settings.capability_interval)
            )
            rt.discovery_retries += 1
        else:
            rt.discovery_retries = 0
            if ready is None and rt.facts.ready is not None:
                rt.next_discovery = ctx.clock()  # SSH logged in meanwhile: look again
        previous = rt.facts.capability
        kept = previous is not None and previous.allowable is not None
        if kept and capability.allowable is None and capability.refusal is None:
            return  # keep the last known capability when rediscovery merely failed
        rt.facts = rt.facts.model_copy(update={"capability": capability})
        self.recorder.announce_power_source_error(rt)
        fields: dict[str, Any] = {"conditions": self.recorder.conditions(rt)}
        same = _same_capability(previous, capability)
        if not same:
            # only a new finding is written: a rediscovery that finds the same (a refused
            # node every 30 s, every node every capability_interval) would otherwise write
            # its time alone, 9,000 refused nodes some 300 writes a second
            fields["powerControl"] = capability.model_dump(mode="json", by_alias=True)
        ctx.status.contribute(rt.name, fields)
        if not same:
            rt.events.append(Evaluate())
            ctx.wake.set()


def _current(nodes: dict[str, NodeRuntime], attribute: str) -> Callable[[str], datetime | None]:
    def current(name: str) -> datetime | None:
        rt = nodes.get(name)
        return None if rt is None else getattr(rt, attribute)

    return current


def _confirms(rt: NodeRuntime, reading: PowerReading) -> bool:
    """A read of node `rt` at rest that finds what it holds (the same power, source)."""
    held = rt.facts.power
    return (
        rt.at_rest()
        and held is not None
        and held.power == reading.power
        and held.source == reading.source
        and reading.observed_at >= held.observed_at
    )


def rediscovery_delay(retries: int, capability_interval: float) -> float:
    """Seconds until a failed or refused capability discovery is tried again: 30 s after
    the first, doubling with each further one, never longer than the capability interval."""
    return min(capability_interval, _REDISCOVER_AFTER_FAILURE * float(2 ** min(retries, 16)))


def _same_capability(old: CapabilityReading | None, new: CapabilityReading) -> bool:
    """The same finding, observed again (only the observation time differs)."""
    return old is not None and old.model_copy(update={"observed_at": new.observed_at}) == new
