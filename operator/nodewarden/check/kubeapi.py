"""Checks of the connection: kubeconfig, the API server answers, its version, clock skew.

`version_result` and `skew_result` are pure; `connect` and `server_facts` are the I/O.
The supported Kubernetes versions are `SUPPORTED` (the README lists the same range). The
clock skew compares this machine's clock with the API server's `Date` header (one-second
resolution; the request's round trip is counted as uncertainty). For tests, the
environment variable NODEWARDEN_CHECK_CLOCK_OFFSET (seconds, may be negative) is added
to the local clock, to fake a skewed machine.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from pathlib import Path

import aiohttp
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from nodewarden.check.result import CheckResult, failed, passed, warned
from nodewarden.kube.client import api_client_from
from nodewarden.kube.kubeconfig import KubeconfigError, default_kubeconfig, one_line

SUPPORTED: tuple[tuple[int, int], tuple[int, int]] = ((1, 35), (1, 37))
"""Oldest and newest Kubernetes minor versions nodewarden supports (README)."""
SKEW_WARN_SECONDS = 2.0
SKEW_FAIL_SECONDS = 5.0
CLOCK_OFFSET_ENV = "NODEWARDEN_CHECK_CLOCK_OFFSET"
_VERSION = re.compile(r"^v?(\d+)\.(\d+)(?:\.(\d+))?")


def supported_text() -> str:
    (lo_major, lo_minor), (hi_major, hi_minor) = SUPPORTED
    return f"{lo_major}.{lo_minor}-{hi_major}.{hi_minor}"


def clock_offset() -> float:
    """Seconds added to the local clock (test aid: NODEWARDEN_CHECK_CLOCK_OFFSET)."""
    raw = os.environ.get(CLOCK_OFFSET_ENV, "").strip()
    if not raw:
        return 0.0
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"{CLOCK_OFFSET_ENV}: {raw!r} is not a number of seconds") from None


def version_result(git_version: str) -> CheckResult:
    """The server's version against the supported range."""
    match = _VERSION.match(git_version.strip())
    if match is None:
        return warned(
            "version",
            f"Kubernetes reports version {git_version!r}, which nodewarden cannot read; "
            f"supported: {supported_text()}",
        )
    found = (int(match.group(1)), int(match.group(2)))
    low, high = SUPPORTED
    if found < low:
        return failed(
            "version",
            f"Kubernetes {git_version} is older than nodewarden supports ({supported_text()}); "
            "its CRD validation (CEL rules) may be rejected or ignored",
            f"upgrade the cluster to {low[0]}.{low[1]} or later",
        )
    if found > high:
        return warned(
            "version",
            f"Kubernetes {git_version} is newer than nodewarden was tested with "
            f"({supported_text()})",
            "check the release notes of a newer nodewarden",
        )
    return passed("version", f"Kubernetes {git_version} (supported: {supported_text()})")


def skew_result(skew: float, uncertainty: float) -> CheckResult:
    """`skew` seconds local-minus-server, known to +-`uncertainty` seconds."""
    size = abs(skew) - uncertainty
    direction = "ahead of" if skew > 0 else "behind"
    text = f"this machine's clock is {abs(skew):.1f}s {direction} the API server's (+-{uncertainty:.1f}s)"
    fix = (
        "synchronise the clocks (chrony or systemd-timesyncd) of the machine that runs "
        "nodewarden and of the API server: lease ages, timeouts and Safety Record times "
        "depend on them"
    )
    if size > SKEW_FAIL_SECONDS:
        return failed("clock", f"{text}; more than {SKEW_FAIL_SECONDS:g}s", fix)
    if size > SKEW_WARN_SECONDS:
        return warned("clock", text, fix)
    return passed("clock", f"in step with the API server ({skew:+.1f}s, +-{uncertainty:.1f}s)")


async def connect(kubeconfig: Path | None) -> tuple[client.ApiClient | None, CheckResult]:
    """An ApiClient (or None) and the `kubeconfig` line."""
    try:
        api = await api_client_from(kubeconfig)
    except KubeconfigError as exc:
        return None, failed("kubeconfig", str(exc))
    if kubeconfig is not None:
        source = str(kubeconfig)
    elif os.environ.get("KUBERNETES_SERVICE_HOST"):
        source = "the in-cluster service account"
    else:
        source = str(default_kubeconfig() or "$KUBECONFIG")
    return api, passed("kubeconfig", f"{source} is usable (server {api.configuration.host})")


@dataclass(frozen=True, slots=True)
class ServerFacts:
    """What one GET /version told: the version and the server's clock."""

    server: str
    git_version: str
    skew: float | None
    uncertainty: float
    server_time: float
    """The API server's time (epoch seconds) estimated for the moment of the request."""


async def server_facts(
    api: client.ApiClient, clock: Callable[[], float] = time.time
) -> ServerFacts | CheckResult:
    """GET /version: the version and the Date header, or the failed `api-server` line."""
    server = str(api.configuration.host)
    started = clock()
    try:
        info, _status, headers = await client.VersionApi(api).get_code_with_http_info(
            _request_timeout=15
        )
    except ApiException as exc:
        return failed(
            "api-server",
            f"{server} answered GET /version with HTTP {exc.status} {exc.reason}",
            "check the kubeconfig's credentials (kubectl version)",
        )
    except (OSError, TimeoutError, aiohttp.ClientError) as exc:
        return failed(
            "api-server",
            f"{server} does not answer: {one_line(str(exc)) or type(exc).__name__}",
            "is the API server running and reachable from here? (kubectl cluster-info)",
        )
    ended = clock()
    local = (started + ended) / 2
    skew: float | None = None
    server_time = local
    date = headers.get("Date") if headers else None
    if date:
        try:
            # Date is truncated to the second: the server's time was within [date, date+1)
            server_time = parsedate_to_datetime(date).timestamp() + 0.5
            skew = local - server_time
        except (TypeError, ValueError):
            skew = None
    return ServerFacts(
        server=server,
        git_version=str(info.git_version or ""),
        skew=skew,
        uncertainty=0.5 + (ended - started) / 2,
        server_time=server_time,
    )
