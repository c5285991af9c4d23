"""Client-side pacing (`kube.pacing`): the bucket lets a burst through and then holds the
rate; a 429 waits the server's Retry-After (else a backoff) and is retried a bounded
number of times; Lease requests never wait behind the writes. Fake clock, counted."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from kubernetes_asyncio.client.exceptions import ApiException

from nodewarden.kube.pacing import KubeApiSettings, TokenBucket, paced, throttle_delay
from nodewarden.limits import raise_open_files


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_a_burst_goes_at_once_then_the_rate_holds() -> None:
    clock = Clock()
    bucket = TokenBucket(qps=10.0, burst=5, clock=clock)
    waits = [bucket.reserve() for _ in range(25)]
    assert waits[:5] == [0.0] * 5
    # the 20 after the burst are reserved 0.1 s apart: all 25 sent within 2 s
    assert waits[5:] == pytest.approx([0.1 * i for i in range(1, 21)])
    clock.now = 10.0  # a quiet spell refills the bucket, never beyond the burst
    assert [bucket.reserve() for _ in range(5)] == [0.0] * 5
    assert bucket.reserve() > 0


def test_throttle_delay_prefers_retry_after_and_caps_it() -> None:
    assert throttle_delay({"Retry-After": "3"}, 1, 0.0) == 3.0
    assert throttle_delay({"Retry-After": "3600"}, 1, 0.0) == 30.0
    assert throttle_delay(None, 1, 1.0) == pytest.approx(0.5)
    assert throttle_delay(None, 4, 1.0) == pytest.approx(4.0)
    assert throttle_delay({"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"}, 2, 1.0) == 1.0


def _refusal(retry_after: str | None) -> ApiException:
    exc = ApiException(status=429, reason="Too Many Requests")
    exc.headers = {"Retry-After": retry_after} if retry_after is not None else {}
    return exc


def test_a_429_is_retried_after_retry_after_then_given_up() -> None:
    clock = Clock()
    calls: list[tuple[str, float]] = []
    refusals = [2]  # refused twice, then served

    async def request(method: str, url: str, *args: Any, **kwargs: Any) -> str:
        calls.append((url, clock.now))
        if refusals[0] > 0:
            refusals[0] -= 1
            raise _refusal("2")
        return "ok"

    send = paced(request, KubeApiSettings(qps=100, burst=10), sleep=clock.sleep, clock=clock)
    assert asyncio.run(send("PATCH", "/apis/nodewarden.io/v1alpha1/x")) == "ok"
    assert [t for _, t in calls] == pytest.approx([0.0, 2.0, 4.0])

    always: list[float] = []

    async def refuses(method: str, url: str, *args: Any, **kwargs: Any) -> str:
        always.append(clock.now)
        raise _refusal(None)

    settings = KubeApiSettings(qps=100, burst=10, retries_on_429=3)
    send = paced(refuses, settings, sleep=clock.sleep, clock=clock)
    with pytest.raises(ApiException):
        asyncio.run(send("PATCH", "/apis/nodewarden.io/v1alpha1/x"))
    assert len(always) == 4  # the first try and three retries


def test_lease_requests_skip_the_queue_of_writes() -> None:
    clock = Clock()
    sent: list[tuple[str, float]] = []

    async def request(method: str, url: str, *args: Any, **kwargs: Any) -> None:
        sent.append((url, clock.now))

    send = paced(request, KubeApiSettings(qps=1, burst=1), sleep=clock.sleep, clock=clock)

    async def main() -> None:
        for _ in range(3):
            await send("PATCH", "/apis/nodewarden.io/v1alpha1/namespaces/n/workernodes/a")
        before = clock.now
        await send("PUT", "/apis/coordination.k8s.io/v1/namespaces/n/leases/l")
        assert sent[-1][1] == before  # no wait for the lease

    asyncio.run(main())
    assert [t for _, t in sent[:3]] == pytest.approx([0.0, 1.0, 2.0])


def test_the_open_files_limit_is_raised_within_the_hard_limit() -> None:
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(1024, hard), hard))
        result = raise_open_files(4096)
        assert result is not None
        after = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        want = 4096 if hard == resource.RLIM_INFINITY else min(4096, hard)
        assert after == want and result == (min(1024, hard), want)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
