"""Leader election on a coordination.k8s.io Lease, so two replicas of one dispatcher never both act.

The replica holding the Lease runs the handlers; the others wait. The holder renews every
`renew_interval`; a Lease not renewed for `lease_duration` may be taken over. If the holder
fails to renew before its own lease expires it stops acting at once (the caller's
`on_lost` callback) rather than risk two actors.

The holder may publish annotations on its Lease (`annotations`, evaluated at every
write: the status endpoint of `nodewarden.endpoints`); keys under `nodewarden.io/status-`
belong to the current holder and are replaced or removed by each write, others are kept.
`holder()` tells the other replicas who holds the Lease now and what it published.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta

import aiohttp
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

log = logging.getLogger(__name__)

UNREACHABLE = (aiohttp.ClientError, OSError)
"""The API server could not be reached (connection refused or dropped, TLS or socket
error): a failed attempt like an error answer, never a reason for the process to end."""

OWN_ANNOTATION_PREFIX = "nodewarden.io/status-"


def _foreign(annotations: Mapping[str, str] | None) -> dict[str, str]:
    """The annotations that are not the holder's own."""
    return {k: v for k, v in (annotations or {}).items() if not k.startswith(OWN_ANNOTATION_PREFIX)}


def _now() -> datetime:
    return datetime.now(tz=UTC)


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
    ) -> None:
        self.api = api
        self.leases = client.CoordinationV1Api(api)
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.lease_duration = lease_duration
        self.renew_interval = renew_interval
        self.retry_interval = retry_interval
        self.is_leader = False
        self._last_renew: datetime | None = None
        self._annotations = annotations

    def _metadata(self, current: client.V1ObjectMeta | None) -> client.V1ObjectMeta:
        """Our metadata for a write: the holder's own annotations replaced, others kept."""
        meta = current or client.V1ObjectMeta(name=self.name, namespace=self.namespace)
        kept = _foreign(meta.annotations)
        published = dict(self._annotations()) if self._annotations is not None else {}
        meta.annotations = {**kept, **published}
        return meta

    def _expired(self, spec: client.V1LeaseSpec, now: datetime) -> bool:
        renew = spec.renew_time
        duration = spec.lease_duration_seconds or int(self.lease_duration)
        return bool(renew is None or renew + timedelta(seconds=duration) < now)

    def _spec(self, now: datetime, transitions: int, acquire: bool) -> client.V1LeaseSpec:
        return client.V1LeaseSpec(
            holder_identity=self.identity,
            lease_duration_seconds=int(self.lease_duration),
            acquire_time=now if acquire else None,
            renew_time=now,
            lease_transitions=transitions,
        )

    async def try_acquire_or_renew(self) -> bool:
        """One attempt; True if we hold the lease afterwards."""
        now = _now()
        try:
            lease = await self.leases.read_namespaced_lease(self.name, self.namespace)
        except UNREACHABLE as exc:
            log.warning("lease read failed: %s", type(exc).__name__)
            return False
        except ApiException as exc:
            if exc.status != 404:
                log.warning("lease read failed: HTTP %s", exc.status)
                return False
            body = client.V1Lease(
                metadata=self._metadata(None),
                spec=self._spec(now, 0, acquire=True),
            )
            try:
                await self.leases.create_namespaced_lease(self.namespace, body)
            except ApiException as create_exc:
                log.info("lease create lost a race: HTTP %s", create_exc.status)
                return False
            except UNREACHABLE as create_exc:
                log.warning("lease create failed: %s", type(create_exc).__name__)
                return False
            self._last_renew = now
            return True
        spec = lease.spec or client.V1LeaseSpec()
        holder = spec.holder_identity
        if holder not in (None, "", self.identity) and not self._expired(spec, now):
            return False
        transitions = (spec.lease_transitions or 0) + (0 if holder == self.identity else 1)
        lease.spec = self._spec(now, transitions, acquire=holder != self.identity)
        if holder == self.identity and spec.acquire_time is not None:
            lease.spec.acquire_time = spec.acquire_time
        lease.metadata = self._metadata(lease.metadata)
        try:
            # replace with the resourceVersion we read: a concurrent writer makes this 409
            await self.leases.replace_namespaced_lease(self.name, self.namespace, lease)
        except ApiException as exc:
            log.info("lease update rejected: HTTP %s", exc.status)
            return False
        except UNREACHABLE as exc:
            log.warning("lease update failed: %s", type(exc).__name__)
            return False
        self._last_renew = now
        return True

    async def holder(self) -> tuple[str | None, dict[str, str]]:
        """(identity of the live holder, or None if none or expired; the Lease's annotations)."""
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
        if not spec.holder_identity or self._expired(spec, _now()):
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
                log.info("acquired leadership", extra={"lease": self.name, "id": self.identity})
                return True
            if not announced:
                log.info("standing by: another replica holds lease %s", self.name)
                announced = True
                if on_standby is not None:
                    on_standby()
            await asyncio.sleep(self.retry_interval)
        return False

    async def keep(self, on_lost: Callable[[], None]) -> None:
        """Renew until cancelled; call `on_lost` if the lease cannot be kept.

        A renewal attempt may take until the renew deadline (2/3 of the lease duration
        after the last successful renewal): a busy API server answering slowly is not a
        reason to give up leadership, but we stop acting before the lease can expire.
        """
        deadline_after = timedelta(seconds=self.lease_duration * 2 / 3)
        while True:
            await asyncio.sleep(self.renew_interval)
            ok = False
            last = self._last_renew or _now()
            budget = (last + deadline_after - _now()).total_seconds()
            try:
                ok = await asyncio.wait_for(self.try_acquire_or_renew(), timeout=max(0.5, budget))
            except TimeoutError:
                log.warning("lease renewal timed out after %.1fs", max(0.5, budget))
                ok = False
            if ok:
                continue
            last = self._last_renew or _now()
            if _now() - last > deadline_after:
                self.is_leader = False
                log.error("lost leadership of lease %s; stopping", self.name)
                on_lost()
                return

    async def release(self) -> None:
        """Give the lease up on clean shutdown so a standby takes over at once."""
        if not self.is_leader:
            return
        try:
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
        self.is_leader = False
