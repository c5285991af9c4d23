"""`--live`: the running operator's own view, from its HTTP endpoint.

Reached at ``--operator-url`` (e.g. ``kubectl -n NS port-forward deploy/nodewarden 8080``
then ``--operator-url http://127.0.0.1:8080``): /readyz gives its role (leader, standby,
starting) and what it waits for; /api/v1/status (with the token from the Secret the
operator config names) gives what the leader knows now -- recovered or not, instances,
containers, the newest probe; the reply's Date header gives the operator's clock. Only
the token is sent, and only to the URL the user gave. `live_results` is pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

import aiohttp
from pydantic import SecretStr

from nodewarden.check.kubeapi import SKEW_FAIL_SECONDS
from nodewarden.check.lease import parse_time
from nodewarden.check.result import CheckResult, failed, passed, warned
from nodewarden.config import OperatorConfig
from nodewarden.kube.client import Kube, KubeError

PORT_FORWARD = (
    "kubectl -n NAMESPACE port-forward deploy/nodewarden 8080 & "
    "nodewarden check --live --operator-url http://127.0.0.1:8080"
)


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    body: Any
    date: datetime | None


@dataclass(frozen=True, slots=True)
class LiveView:
    """What the operator's endpoint said (None: that request was not made or failed)."""

    url: str
    readyz: Answer | None
    status: Answer | None
    error: str | None = None
    status_note: str | None = None


def _age(value: object, now: datetime) -> float | None:
    when = parse_time(value)
    return (now - when).total_seconds() if when is not None else None


def live_results(view: LiveView, server_now: datetime) -> list[CheckResult]:
    if view.error is not None or view.readyz is None:
        return [
            failed(
                "live",
                f"the operator at {view.url} does not answer: {view.error}",
                "is the URL right (port-forward running)? " + PORT_FORWARD,
            )
        ]
    body = view.readyz.body if isinstance(view.readyz.body, Mapping) else {}
    role = body.get("role", "?")
    waiting = body.get("waitingFor")
    identity = body.get("identity", "?")
    out: list[CheckResult] = []
    if view.readyz.status == 200:
        out.append(passed("live", f"{view.url}: replica {identity} is ready, role {role}"))
    else:
        why = f", waiting for {waiting}" if waiting else ""
        out.append(
            failed(
                "live",
                f"{view.url}: replica {identity} is not ready (role {role}{why})",
                "the operator's log says why (kubectl -n NAMESPACE logs deploy/nodewarden)",
            )
        )
    if view.readyz.date is not None:
        skew = (view.readyz.date - server_now).total_seconds()
        if abs(skew) > SKEW_FAIL_SECONDS + 1.5:
            out.append(
                failed(
                    "live",
                    f"the operator's clock is {abs(skew):.0f}s "
                    f"{'ahead of' if skew > 0 else 'behind'} the API server's",
                    "synchronise the node's clock (chrony or systemd-timesyncd)",
                )
            )
    if view.status is None:
        out.append(warned("live", f"status API not read: {view.status_note}"))
        return out
    if view.status.status != 200:
        error = view.status.body.get("error") if isinstance(view.status.body, Mapping) else None
        out.append(warned("live", f"status API answered HTTP {view.status.status}: {error or '-'}"))
        return out
    snap = view.status.body if isinstance(view.status.body, Mapping) else {}
    instances = list(snap.get("instances") or [])
    containers = list(snap.get("containers") or [])
    ages = [a for a in (_age(i.get("lastProbe"), server_now) for i in instances) if a is not None]
    newest = f", newest probe {min(ages):.0f}s ago" if ages else ""
    line = (
        f"dispatcher {snap.get('dispatcherId', '?')}: "
        f"{'recovered' if snap.get('recovered') else 'still recovering'}, "
        f"{len(instances)} nodes, {len(containers)} containers{newest}"
    )
    out.append(passed("live", line) if snap.get("recovered") else warned("live", line))
    return out


async def _get(session: aiohttp.ClientSession, url: str, token: SecretStr | None = None) -> Answer:
    headers = {"Authorization": f"Bearer {token.get_secret_value()}"} if token else {}
    async with session.get(url, headers=headers, allow_redirects=False) as response:
        try:
            body: Any = await response.json(content_type=None)
        except ValueError:
            body = None
        date = None
        if response.headers.get("Date"):
            try:
                date = parsedate_to_datetime(response.headers["Date"]).astimezone(UTC)
            except (TypeError, ValueError):
                date = None
        return Answer(response.status, body, date)


async def read_live(
    url: str, kube: Kube, namespace: str, config: OperatorConfig, contact_timeout: float
) -> LiveView:
    base = url.rstrip("/")
    token: SecretStr | None = None
    note: str | None = None
    secret = config.management.token_secret_name
    if not secret:
        note = "management.token_secret_name is unset (the status API is disabled)"
    else:
        try:
            token = await kube.read_secret(namespace, secret, config.management.token_secret_key)
        except KubeError as exc:
            note = f"cannot read the status token: {exc}"
    try:
        async with aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=contact_timeout)
        ) as session:
            readyz = await _get(session, f"{base}/readyz")
            status = await _get(session, f"{base}/api/v1/status", token) if token else None
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        return LiveView(base, None, None, error=str(exc) or type(exc).__name__)
    return LiveView(base, readyz, status, status_note=note)
