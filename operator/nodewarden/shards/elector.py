"""The shard elector: the shell around `balance.decide` that holds this replica's shard Leases.

    ShardElector(api, namespace, dispatcher_id, replica, shards, ...)
    await elector.round()      one balance round: renew membership, read the Leases,
                               decide, release (fenced handover), acquire
    await elector.run(stop)    rounds every `retry_interval` until `stop`
    await elector.watch(stop)  reads only (a standby): keeps when each record changed
    elector.held               {shard: Leadership} valid now on this replica
    elector.leadership(shard)  the shard's Leadership, None when not held
    elector.set_shards(n)      a new shard count: the next round balances over 0..n-1
                               (a held shard beyond it is released first)
    await elector.close()      release every shard and the membership Lease

**One Lease per shard, held through the machinery of the dispatcher Lease.** Each shard
this replica takes is a `kube.lease.LeaderElector` on `keys.lease_name(dispatcher, shard)`
with its own `fence.Leadership` (valid by this replica's monotonic clock, the token its
`leaseTransitions`), renewed by its own `keep` task and beaten by its own heartbeat; a
shard whose renewal fails, whose Lease shows another holder or whose loop stalled steps
down exactly as the dispatcher Lease does, and `on_released(shard, reason)` tells the
power path to stop acting on it. A replica keeps one more Lease, its membership Lease
(`keys.member_lease_name`), renewed every round: a replica holding no shard still counts
as live for the cap.

**The view is read, not guessed.** Every round lists the Leases labelled
`nodewarden.io/dispatcher=<id>` (every Lease this elector writes carries the label, so
`kubectl get lease -l nodewarden.io/dispatcher=<id>` shows the holders); one
`fence.LeaseWatch` per Lease name keeps when *this* replica saw each record change, and
`balance.decide` judges liveness by that, never by a holder's `renewTime`. The same
`LeaseWatch` is handed to the `LeaderElector` made to take a shard, so a Lease seen
expired by the view is free to it at once (it does not start counting again).

**A list per round, not a watch.** The view is a LIST of a dozen small objects every
`retry_interval` (2 s by default): with 4 shards and 2 replicas, six Leases, one request.
A watch would answer a release faster than a round; not needed at these counts.

**Release is the fenced handover** (`balance`): `on_released(shard, "rebalanced")` first
(the caller stops acting on the shard's nodes), `drain(shard)` (the actions already past
their fence check finish, within the Leadership's validity), then the renewal task stops and
`LeaderElector.release()` steps the Leadership down (`clean=True`) and writes the Lease
with no holder, so the taker need not wait for the duration. A taker's write carries the
resourceVersion it read: two replicas that both try a free shard get one 409.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from nodewarden.fence import Leadership, LeaseWatch, Monotonic
from nodewarden.kube.lease import UNREACHABLE, LeaderElector
from nodewarden.metrics import SHARD_HANDOVERS, SHARDS_HELD
from nodewarden.ownership import DISPATCHER_LABEL
from nodewarden.shards.balance import Decision, LeaseSeen, View, decide
from nodewarden.shards.keys import lease_name, member_lease_name

log = logging.getLogger(__name__)

Released = Callable[[int, str], None]
"""`on_released(shard, reason)`: stop acting on the shard's nodes now (synchronous: the
Lease is written free only after it returns)."""
Drain = Callable[[int], Awaitable[None]]
"""`drain(shard)`: wait until the actions on the shard's nodes already past their fence
check have finished (the Leadership stays valid and renewed meanwhile)."""
Acquired = Callable[[int, Leadership], None]
"""`on_acquired(shard, leadership)`: the shard is ours; act on its nodes under `leadership`."""


@dataclass
class _Held:
    elector: LeaderElector
    keeping: asyncio.Task[None]


class ShardElector:
    """This replica's shard Leases (see module)."""

    def __init__(
        self,
        api: client.ApiClient,
        namespace: str,
        dispatcher_id: str,
        replica: str,
        shards: int,
        *,
        lease_duration: float = 15.0,
        renew_interval: float = 5.0,
        retry_interval: float = 2.0,
        margin: float | None = None,
        monotonic: Monotonic = time.monotonic,
        on_acquired: Acquired | None = None,
        on_released: Released | None = None,
        drain: Drain | None = None,
    ) -> None:
        self.api = api
        self.leases = client.CoordinationV1Api(api)
        self.namespace = namespace
        self.dispatcher_id = dispatcher_id
        self.replica = replica
        self.shards = shards
        self.lease_duration = lease_duration
        self.renew_interval = renew_interval
        self.retry_interval = retry_interval
        self.margin = margin
        self.monotonic = monotonic
        self.on_acquired = on_acquired
        self.on_released = on_released
        self.drain = drain
        self._member_renewed_at: float | None = None
        self.labels = {DISPATCHER_LABEL: dispatcher_id}
        self._watches: dict[str, LeaseWatch] = {}
        self._held: dict[int, _Held] = {}
        self._member = self._elector(member_lease_name(dispatcher_id, replica))
        self.last: Decision | None = None
        """The last round's decision (for `nodewarden check` and tests)."""
        SHARDS_HELD.labels(dispatcher_id).set(0)

    # -- what the power path asks ---------------------------------------------------------

    @property
    def held(self) -> dict[int, Leadership]:
        """The shards whose Leadership is valid on this replica now."""
        return {
            shard: held.elector.leadership
            for shard, held in self._held.items()
            if held.elector.leadership.valid
        }

    def leadership(self, shard: int) -> Leadership | None:
        held = self._held.get(shard)
        return held.elector.leadership if held is not None else None

    def set_shards(self, shards: int) -> None:
        """Balance over `shards` from the next round on (a count change: the shard Leases
        new in it are taken by that round, before the resharder assigns a node to them;
        a held shard at or above it is released first, fenced, by the round)."""
        if shards < 1:
            raise ValueError(f"shard count {shards} below 1")
        self.shards = shards

    # -- the loop --------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Balance every `retry_interval` until `stop`, then release everything."""
        try:
            await self._every_round(stop, self.round, "shard balance round")
        finally:
            await self.close()

    async def watch(self, stop: asyncio.Event) -> None:
        """Read the Leases every `retry_interval` until `stop`, writing nothing: a standby
        (not yet allowed to hold shards) keeps when it saw each record change, so once it
        may act it judges a dead holder's Leases expired from then."""
        await self._every_round(stop, self._view, "shard Lease read")

    async def _every_round(
        self, stop: asyncio.Event, step: Callable[[], Awaitable[object]], what: str
    ) -> None:
        while not stop.is_set():
            try:
                # a few small requests; a hung API server must not stop the rounds (the
                # shards' own renewals have their own deadlines)
                async with asyncio.timeout(self.lease_duration):
                    await step()
            except TimeoutError:
                log.warning("%s took over %.0fs", what, self.lease_duration)
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug in one round (or a callback) must not end the rounds:
                # the shards held would then lapse unrenewed with no one told
                log.exception("%s failed; the next round runs as usual", what)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.retry_interval):
                    await stop.wait()

    async def round(self) -> Decision | None:
        """One balance round; None when the Leases could not be read (nothing changes)."""
        self._forget_lost()
        for shard in sorted(s for s in self._held if s >= self.shards):
            await self._release(shard, "retired")
        await self._renew_membership()
        view = await self._view()
        if view is None:
            return None
        decision = decide(view)
        self.last = decision
        for shard in decision.release:
            await self._release(shard, "rebalanced")
        for shard in decision.acquire:
            await self._acquire(shard)
        SHARDS_HELD.labels(self.dispatcher_id).set(len(self.held))
        return decision

    async def close(self) -> None:
        """Release every shard (fenced handover) and the membership Lease; bounded by
        `renew_interval` per Lease (`LeaderElector.release`)."""
        for shard in sorted(self._held):
            await self._release(shard, "stopping")
        self._member.is_leader = True  # renewed by rounds, never `acquire`d: release it
        await self._member.release()
        SHARDS_HELD.labels(self.dispatcher_id).set(0)

    # -- parts -----------------------------------------------------------------------------

    def _elector(self, name: str) -> LeaderElector:
        watch = self._watches.setdefault(name, LeaseWatch(clock=self.monotonic))
        return LeaderElector(
            self.api,
            self.namespace,
            name,
            self.replica,
            lease_duration=self.lease_duration,
            renew_interval=self.renew_interval,
            retry_interval=self.retry_interval,
            margin=self.margin,
            monotonic=self.monotonic,
            labels=self.labels,
            watch=watch,
        )

    async def _renew_membership(self) -> None:
        """Write the membership Lease every `renew_interval` (rounds come more often)."""
        now = self.monotonic()
        last = self._member_renewed_at
        if last is not None and now - last < self.renew_interval:
            return
        if await self._member.try_acquire_or_renew():
            self._member_renewed_at = now

    async def _view(self) -> View | None:
        try:
            listed = await self.leases.list_namespaced_lease(
                self.namespace, label_selector=f"{DISPATCHER_LABEL}={self.dispatcher_id}"
            )
        except ApiException as exc:
            log.warning("shard Leases could not be listed: HTTP %s", exc.status)
            return None
        except UNREACHABLE as exc:
            log.warning("shard Leases could not be listed: %s", type(exc).__name__)
            return None
        shard_names = {lease_name(self.dispatcher_id, s): s for s in range(self.shards)}
        member_prefix = member_lease_name(self.dispatcher_id, "")
        leases: dict[int, LeaseSeen] = {}
        members: dict[str, LeaseSeen] = {}
        now = self.monotonic()
        for lease in listed.items:
            name = lease.metadata.name
            seen = self._seen(name, lease)
            if name in shard_names:
                leases[shard_names[name]] = seen
            elif name.startswith(member_prefix):
                members[name.removeprefix(member_prefix)] = seen
        return View(
            me=self.replica,
            shards=self.shards,
            held=frozenset(self.held),
            leases=leases,
            members=members,
            now=now,
        )

    def _seen(self, name: str, lease: client.V1Lease) -> LeaseSeen:
        watch = self._watches.setdefault(name, LeaseWatch(clock=self.monotonic))
        watch.seen(lease.metadata.resource_version)
        spec = lease.spec or client.V1LeaseSpec()
        return LeaseSeen(
            holder=spec.holder_identity or None,
            changed_at=watch.changed_at,
            duration=float(spec.lease_duration_seconds or self.lease_duration),
        )

    def _forget_lost(self) -> None:
        """Drop shards whose Leadership ended by itself (expiry, stall, another holder);
        `on_released` was told by the renewal task."""
        for shard in [s for s, h in self._held.items() if h.elector.leadership.lost_reason]:
            held = self._held.pop(shard)
            if not held.keeping.done():
                held.keeping.cancel()

    async def _acquire(self, shard: int) -> None:
        stale = self._held.pop(shard, None)  # validity ran out, not yet noticed by its task
        if stale is not None:
            stale.keeping.cancel()
            stale.elector.leadership.step_down(f"shard {shard} not renewed in time")
            self._lost(shard, stale.elector.leadership)
        elector = self._elector(lease_name(self.dispatcher_id, shard))
        if not await elector.try_acquire_or_renew():
            return  # lost a race (409) or the record is not free by our clock yet
        elector.is_leader = True
        leadership = elector.leadership
        log.info(
            "acquired shard",
            extra={"shard": shard, "lease": elector.name, "fence": leadership.transitions},
        )
        SHARD_HANDOVERS.labels(self.dispatcher_id, "acquired").inc()
        # tell the power path before renewals begin: it acts only once it knows
        if self.on_acquired is not None:
            self.on_acquired(shard, leadership)
        keeping = asyncio.create_task(
            elector.keep(
                lambda: self._lost(shard, leadership),
                asyncio.create_task(elector.heartbeat(), name=f"shard-{shard}-heartbeat"),
            ),
            name=f"shard-{shard}-lease",
        )
        self._held[shard] = _Held(elector, keeping)

    def _lost(self, shard: int, leadership: Leadership) -> None:
        """A shard's renewal task ended by itself: its Leadership is over."""
        SHARD_HANDOVERS.labels(self.dispatcher_id, "lost").inc()
        if self.on_released is not None:
            self.on_released(shard, leadership.lost_reason or "lost")

    async def _release(self, shard: int, reason: str) -> None:
        held = self._held.pop(shard, None)
        if held is None:
            return
        # 1. stop acting (no new action; those past their fence check finish, while the
        # Leadership is still valid); 2. stop renewing; 3. step down and write it free.
        # Cut short (the round timed out, the task was cancelled): never left renewing a
        # shard nobody acts on -- the renewals stop and the Lease expires by itself.
        try:
            if self.on_released is not None:
                self.on_released(shard, reason)
            if self.drain is not None:
                budget = held.elector.leadership.remaining()
                try:
                    async with asyncio.timeout(budget):
                        await self.drain(shard)
                except TimeoutError:
                    log.warning("shard %s: actions still in flight at the end of its Lease", shard)
            held.keeping.cancel()
            await asyncio.wait([held.keeping])  # (an outer cancellation still propagates)
            if held.elector.leadership.lost_reason is None:
                await held.elector.release()
        finally:
            held.keeping.cancel()
            held.elector.leadership.step_down(f"shard {shard} released: {reason}", clean=True)
        SHARD_HANDOVERS.labels(self.dispatcher_id, reason).inc()
        log.info("released shard", extra={"shard": shard, "reason": reason})
