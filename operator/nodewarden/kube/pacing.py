"""Client-side pacing of the operator's API requests: writes go out at the API server's
pace, not in one burst.

    TokenBucket(qps, burst)      a request may go at once while tokens last, else waits
    throttle_delay(...)          how long to wait after a 429 (Retry-After, else backoff)
    pace(api, settings)          installs both in front of every request of one ApiClient

client-go's defaults (5 requests/s, burst 10) would take half an hour for the 10,000
status writes a 10,000-node start-up makes, so the operator's defaults are sized to its
first-decision target (`KubeApiSettings`). A 429 (API Priority and Fairness, or a
max-inflight limit) is retried after the server's Retry-After (APF sends one), else after
an exponential backoff, a bounded number of times; then the caller sees the error.

Lease requests (coordination.k8s.io) skip the bucket: a renewal must never queue behind
a burst of status writes (APF gives leader election its own priority level for the same
reason). The feed's watches run on their own client and are not paced.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException
from pydantic import BaseModel, ConfigDict, Field

from nodewarden.metrics import KUBE_THROTTLED

log = logging.getLogger(__name__)

UNPACED_PATHS = ("/apis/coordination.k8s.io/",)
"""Requests whose URL contains one of these go at once (the Lease)."""

MAX_RETRY_AFTER = 30.0
"""A Retry-After longer than this is waited this long (a misbehaving proxy)."""


class KubeApiSettings(BaseModel):
    """The operator's client-side pacing (config `kube_api`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    qps: float = Field(
        default=200.0,
        gt=0,
        description="Requests per second the operator sends at most (after the burst). "
        "Sized to the first-decision target: 10,000 first status writes in under a minute.",
    )
    burst: int = Field(
        default=400, ge=1, description="Requests that may go at once before the qps applies."
    )
    retries_on_429: int = Field(
        default=5, ge=0, description="Retries of a request refused with 429 Too Many Requests."
    )


class TokenBucket:
    """`qps` tokens a second, at most `burst` saved. `reserve` takes one and says how long
    to wait for it (0 while tokens last); waits are reserved in order, so a queue of
    requests goes out at exactly `qps`."""

    def __init__(self, qps: float, burst: int, clock: Callable[[], float] = time.monotonic):
        self.qps = qps
        self.burst = float(burst)
        self._clock = clock
        self._tokens = float(burst)
        self._at = clock()

    def reserve(self) -> float:
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.qps)
        self._at = now
        self._tokens -= 1.0
        return 0.0 if self._tokens >= 0 else -self._tokens / self.qps


def throttle_delay(headers: Mapping[str, str] | None, attempt: int, rand: float) -> float:
    """Seconds to wait before retry `attempt` (1, 2, ...) of a request refused with 429:
    the server's Retry-After when it sends one, else 0.5 s doubling (jittered by `rand`
    in [0, 1)), never more than `MAX_RETRY_AFTER`."""
    value = (headers or {}).get("Retry-After") or (headers or {}).get("retry-after")
    if value is not None:
        try:
            seconds: float = float(value)
            return min(MAX_RETRY_AFTER, max(0.0, seconds))
        except ValueError:
            pass  # an HTTP date: fall back to the backoff
    base = min(MAX_RETRY_AFTER, 0.5 * 2.0 ** (attempt - 1))
    return base * (0.5 + 0.5 * rand)


Request = Callable[..., Awaitable[Any]]


def paced(
    request: Request,
    settings: KubeApiSettings,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> Request:
    """`request` (RESTClientObject.request's signature) behind a token bucket, with 429s
    retried (module docstring)."""
    bucket = TokenBucket(settings.qps, settings.burst, clock)

    async def send(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        unpaced = any(p in url for p in UNPACED_PATHS)
        attempt = 0
        while True:
            if not unpaced:
                wait = bucket.reserve()
                if wait > 0:
                    await sleep(wait)
            try:
                return await request(method, url, *args, **kwargs)
            except ApiException as exc:
                if exc.status != 429 or attempt >= settings.retries_on_429:
                    raise
                attempt += 1
                KUBE_THROTTLED.inc()
                delay = throttle_delay(exc.headers, attempt, random.random())
                log.info(
                    "API server asked to slow down (429) for %s; retry %d in %.1f s",
                    method,
                    attempt,
                    delay,
                )
                await sleep(delay)

    return send


def pace(api: client.ApiClient, settings: KubeApiSettings) -> None:
    """Put every request of `api` behind the pacing of `settings`."""
    rest = api.rest_client
    setattr(rest, "request", paced(rest.request, settings))  # noqa: B010 - wraps the method
