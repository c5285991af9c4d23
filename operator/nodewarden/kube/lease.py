"""Leader election on a coordination.k8s.io Lease, so two replicas of one dispatcher never both act.

The replica holding the Lease runs the handlers; the others wait. Every decision about
time is made on this replica's own monotonic clock (`nodewarden.fence`), never by
comparing a wall-clock `renewTime` written by another machine with our own wall clock:

- the holder renews every `renew_interval`; each successful write makes its leadership
  (`self.leadership`, a `fence.Leadership`) valid until the monotonic time taken
  *before* the write was sent plus `lease_duration - margin`. Renewal attempts may take
  until then; once validity runs out (or a renewal shows another holder, or the event
  loop stalled for longer than the margin) the holder steps down at once: the caller's
  `on_lost` callback. Every irreversible action asks the same `Leadership` first;
- a standby takes the Lease only once the record has not changed for its
  `leaseDurationSeconds`, counted from when *this* replica saw it change
  (`fence.LeaseWatch`), or at once when the holder released it.

The margin defaults to a third of the duration (client-go's 15 s / 10 s renew deadline).
`leaseTransitions` is the fencing token; a Lease this process creates starts it at the
seconds since 2025-01-01 (wall clock) rather than 0, so a Lease deleted by hand and
created again still issues tokens above every one the old Lease issued.

Labels given to the elector (`labels`) are written on the Lease with every write, so
`kubectl get lease -l nodewarden.io/dispatcher=<id>` lists a dispatcher's Leases (its own,
its shards', its replicas' membership Leases) and their holders.

The holder may publish annotations on its Lease (`annotations`, evaluated at every
write: the status endpoint of `nodewarden.endpoints`); keys under `nodewarden.io/status-`
belong to the current holder and are replaced or removed by each write, others are kept.
`holder()` tells the other replicas who holds the Lease now and what it published.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime

import aiohttp
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from nodewarden.clock import utc_now
from nodewarden.fence import Leadership, LeaseWatch, Monotonic

log = logging.getLogger(__name__)

UNREACHABLE = (aiohttp.ClientError, OSError)
"""The API server could not be reached (connection refused or dropped, TLS or socket
error): a failed attempt like an error answer, never a reason for the process to end."""

OWN_ANNOTATION_PREFIX = "nodewarden.io/status-"


def _foreign(annotations: Mapping[str, str] | None) -> dict[str, str]:
    """The annotations that are not the holder's own."""
    return {k: v for k, v in (annotations or {}).items() if not k.startswith(OWN_ANNOTATION_PREFIX)}


TOKEN_EPOCH = datetime(2025, 1, 1, tzinfo=UTC)
"""`leaseTransitions` of a Lease created here: seconds since this moment (see above)."""


def initial_transitions(now: datetime) -> int:
    """The first token of a new Lease: seconds since `TOKEN_EPOCH` (int32-safe until 2093)."""
    return max(0, int((now - TOKEN_EPOCH).total_seconds()))


class LeaderElector:
    def __init__(
        self,
        api: client.ApiClient,
        namespace: str,
        name: str,
        identity: str,
        lease_duration: float = 15.0,
        renew_interval: float = 5.0,
        retry_interval: float = 2.0,
        annotations: Callable[[], Mapping[str, str]] | None = None,
        *,
        margin: float | None = None,
        monotonic: Monotonic = time.monotonic,
        wall_clock: Callable[[], datetime] = utc_now,
        labels: Mapping[str, str] | None = None,
        watch: LeaseWatch | None = None,
    ) -> None:
        self.api = api
        self.leases = client.CoordinationV1Api(api)
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.lease_duration = lease_duration
        self.renew_interval = renew_interval
        self.retry_interval = retry_interval
        self.monotonic = monotonic
        self.wall_clock = wall_clock
        self.leadership = Leadership(
            name,
            lease_duration,
            lease_duration / 3 if margin is None else margin,
            clock=monotonic,
        )
        """Whether we hold the Lease now (by our monotonic clock); every fenced action
        asks it (`nodewarden.fence`)."""
        self.watch = watch if watch is not None else LeaseWatch(clock=monotonic)
        """When we last saw the Lease record change (a standby's expiry count); passed
        in when something else watches the record too (the shard elector's view), so an
        elector made to take a Lease counts from when the record was first seen change."""
        self.labels = dict(labels or {})
        """Set on the Lease at every write (`nodewarden.io/dispatcher=<id>`: `kubectl get
        lease -l` lists a dispatcher's Leases); other labels are kept."""
        self.is_leader = False
        self._annotations = annotations

    @property
    def margin(self) -> float:
        return self.leadership.margin

    def _metadata(self, current: client.V1ObjectMeta | None) -> client.V1ObjectMeta:
        """Our metadata for a write: the holder's own annotations replaced, others kept."""
        meta = current or client.V1ObjectMeta(name=self.name, namespace=self.namespace)
        kept = _foreign(meta.annotations)
        published = dict(self._annotations()) if self._annotations is not None else {}
        meta.annotations = {**kept, **published}
        if self.labels:
            meta.labels = {**(meta.labels or {}), **self.labels}
        return meta

    def _free(self, lease: client.V1Lease) -> bool:
        """Whether someone else's Lease may be taken: released (no holder), or unchanged
        for its duration since this replica saw it change (never its renewTime)."""
        spec = lease.spec or client.V1LeaseSpec()
        self.watch.seen(lease.metadata.resource_version if lease.metadata else None)
        if not spec.holder_identity:
            return True
        duration = spec.lease_duration_seconds or self.lease_duration
        return self.watch.expired(float(duration))

    def _spec(self, now: datetime, transitions: int, acquire: bool) -> client.V1LeaseSpec:
        return client.V1LeaseSpec(
            holder_identity=self.identity,
            lease_duration_seconds=int(self.lease_duration),
            acquire_time=now if acquire else None,
            renew_time=now,
            lease_transitions=transitions,
        )

    async def try_acquire_or_renew(self) -> bool:
        """One attempt; True if we hold the lease afterwards (and `leadership` is renewed
        from the moment the write was sent)."""
        try:
            lease = await self.leases.read_namespaced_lease(self.name, self.namespace)
        except UNREACHABLE as exc:
            log.warning("lease read failed: %s", type(exc).__name__)
            return False
        except ApiException as exc:
            if exc.status != 404:
                log.warning("lease read failed: HTTP %s", exc.status)
                return False
            return await self._create()
        spec = lease.spec or client.V1LeaseSpec()
        holder = spec.holder_identity
        ours = holder == self.identity
        if not ours:
            if self.is_leader:
                # someone else holds it now: whatever our clock says, we stop
                self.leadership.step_down(f"lease {self.name} is held by {holder!r}")
                return False
            if not self._free(lease):
                return False
        transitions = (spec.lease_transitions or 0) + (0 if ours else 1)
        now = self.wall_clock()
        lease.spec = self._spec(now, transitions, acquire=not ours)
        if ours and spec.acquire_time is not None:
            lease.spec.acquire_time = spec.acquire_time
        lease.metadata = self._metadata(lease.metadata)
        # replace with the resourceVersion we read: a concurrent writer makes this 409
        return await self._written(
            "update",
            self.leases.replace_namespaced_lease(self.name, self.namespace, lease),
            transitions,
        )

    async def _create(self) -> bool:
        now = self.wall_clock()
        transitions = initial_transitions(now)
        body = client.V1Lease(
            metadata=self._metadata(None),
            spec=self._spec(now, transitions, acquire=True),
        )
        return await self._written(
            "create", self.leases.create_namespaced_lease(self.namespace, body), transitions
        )

    async def _written(self, what: str, write: Awaitable[object], transitions: int) -> bool:
        """Send one write of the Lease; on success leadership is valid from the moment
        it was sent (taken here, before the request leaves)."""
        sent_at = self.monotonic()
        try:
            await write
        except ApiException as exc:
            log.info("lease %s refused (lost a race?): HTTP %s", what, exc.status)
            return False
        except UNREACHABLE as exc:
            log.warning("lease %s failed: %s", what, type(exc).__name__)
            return False
        self.leadership.renewed(sent_at, transitions)
        return True

    async def holder(self) -> tuple[str | None, dict[str, str]]:
        """(identity of the live holder, or None if none or expired as this replica
        sees it; the Lease's annotations)."""
        try:
            lease = await self.leases.read_namespaced_lease(self.name, self.namespace)
        except ApiException as exc:
            log.info("lease read failed: HTTP %s", exc.status)
            return None, {}
        except UNREACHABLE as exc:
            log.info("lease read failed: %s", type(exc).__name__)
            return None, {}
        spec = lease.spec or client.V1LeaseSpec()
        annotations = dict((lease.metadata.annotations if lease.metadata else None) or {})
        if spec.holder_identity == self.identity and self.leadership.valid:
            return self.identity, annotations
        if self._free(lease) or not spec.holder_identity:
            return None, annotations
        return str(spec.holder_identity), annotations

    async def acquire(
        self, stop: asyncio.Event | None = None, on_standby: Callable[[], None] | None = None
    ) -> bool:
        """Wait until we hold the lease (True) or `stop` is set (False).

        `on_standby` is called once, after the first attempt that does not win the lease
        (another replica holds it, or the API refused the read or write); not before:
        until then this replica does not know its role.
        """
        announced = False
        while stop is None or not stop.is_set():
            if await self.try_acquire_or_renew():
                self.is_leader = True
                log.info(
                    "acquired leadership",
                    extra={
                        "lease": self.name,
                        "id": self.identity,
                        "fence": self.leadership.transitions,
                    },
                )
                return True
            if not announced:
                log.info("standing by: another replica holds lease %s", self.name)
                announced = True
                if on_standby is not None:
                    on_standby()
            await asyncio.sleep(self.retry_interval)
        return False

    async def keep(
        self, on_lost: Callable[[], None], beating: asyncio.Task[None] | None = None
    ) -> None:
        """Renew until cancelled; call `on_lost` once leadership ends.

        A renewal attempt may take until our leadership's validity runs out (a busy API
        server answering slowly is not a reason to give up), but not longer: then, or when
        the Lease shows another holder, or when the event loop stalled for longer than
        the margin (`heartbeat`: `beating` when the caller began it, else begun here),
        leadership ends and `on_lost` is called at once. The caller begins it before kopf
        starts: a stopping kopf waits 5 s for every task begun after it started.
        """
        ended = asyncio.Event()
        self.leadership.on_lost(lambda _reason: ended.set())
        if beating is None:
            beating = asyncio.create_task(self.heartbeat())
        pause = self.renew_interval
        try:
            while not ended.is_set():
                # `asyncio.timeout`, not `wait_for`: no task of its own, so a stopping kopf
                # (which waits 5 s for every task begun after it started) never waits on it
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(pause):
                        await ended.wait()
                if ended.is_set():
                    break
                budget = self.leadership.remaining()
                if budget <= 0:
                    self.leadership.step_down(f"lease {self.name} not renewed in time")
                    break
                try:
                    async with asyncio.timeout(budget):
                        ok = await self.try_acquire_or_renew()
                except TimeoutError:
                    log.warning("lease renewal timed out after %.1fs", budget)
                    ok = False
                if not ok and not self.leadership.valid:
                    self.leadership.step_down(f"lease {self.name} could not be renewed in time")
                # a failed renewal is retried sooner (client-go's retry period)
                pause = self.renew_interval if ok else min(self.retry_interval, self.renew_interval)
        finally:
            beating.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beating
        self.is_leader = False
        log.error(
            "lost leadership of lease %s (%s); stopping", self.name, self.leadership.lost_reason
        )
        on_lost()

    async def heartbeat(self) -> None:
        """Beat the leadership several times per margin, so a stall of the event loop
        longer than the margin is seen (and ends leadership) before anything else acts."""
        interval = max(0.05, self.margin / 5)
        while self.leadership.lost_reason is None:
            self.leadership.beat()
            await asyncio.sleep(interval)

    async def release(self) -> None:
        """Give the lease up on clean shutdown so a standby takes over at once. Bounded
        by `renew_interval`: an API server that does not answer (hung, overloaded) must
        not hold a stopping process -- the Lease then simply expires, as after a crash."""
        if not self.is_leader:
            return
        self.is_leader = False
        self.leadership.step_down("released", clean=True)
        try:
            async with asyncio.timeout(self.renew_interval):
                lease = await self.leases.read_namespaced_lease(self.name, self.namespace)
                if lease.spec and lease.spec.holder_identity == self.identity:
                    lease.spec = client.V1LeaseSpec(
                        lease_duration_seconds=1, lease_transitions=lease.spec.lease_transitions
                    )
                    if lease.metadata is not None:
                        lease.metadata.annotations = _foreign(lease.metadata.annotations)
                    await self.leases.replace_namespaced_lease(self.name, self.namespace, lease)
        except ApiException as exc:
            log.warning("lease release failed: HTTP %s", exc.status)
        except UNREACHABLE as exc:
            log.warning("lease release failed: %s", type(exc).__name__)
        except TimeoutError:
            log.warning(
                "lease release gave up after %.1fs (the API server did not answer); the "
                "Lease expires by itself",
                self.renew_interval,
            )
