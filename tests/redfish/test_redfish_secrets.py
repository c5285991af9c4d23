"""No BMC secret (password, Basic header, X-Auth-Token) shows up in logs, errors or reprs.

All logs of the process are captured at DEBUG (aiohttp and asyncio included) while
the adapter logs in, re-logs in after expiry, resets through a 202 task, fails a
confirmation, meets wrong passwords, falls back to Basic auth after a failed login
and deletes sessions (on close, and at once after a half-failed login), against the
fake BMC and sushy-tools.
"""

from __future__ import annotations

import base64
import logging
from datetime import timedelta

import pytest
from pydantic import SecretStr
from redfish_peers import FAKE_PASSWORD, StartFakeBmc, SushyEmulator

from nodewarden.redfish import (
    AuthFailed,
    ConfirmationDeadlineExceeded,
    ConfirmationSettings,
    RedfishClient,
    RedfishConnectionError,
    RedfishError,
    request_and_confirm,
)

WRONG_PASSWORD = "wrong-" + FAKE_PASSWORD


async def test_no_secret_in_logs_errors_or_reprs(
    caplog: pytest.LogCaptureFixture, fake_bmc: StartFakeBmc, sushy: SushyEmulator
) -> None:
    caplog.set_level(logging.DEBUG)
    for name in ("aiohttp", "aiohttp.client", "aiohttp.access", "aiohttp.server", "asyncio"):
        logging.getLogger(name).setLevel(logging.DEBUG)
    texts: list[str] = []
    settings = ConfirmationSettings(
        deadline=timedelta(seconds=0.6),
        poll_interval=timedelta(seconds=0.05),
        resend_after=timedelta(seconds=0.2),
    )

    session_bmc = await fake_bmc(reset_reply=202, task_polls=1, task_retry_after=0)
    config = session_bmc.config()
    async with RedfishClient(config) as client:
        texts += [repr(config), str(config), config.model_dump_json(), repr(client)]
        texts.append(repr(await client.read_power_state()))
        session_bmc.bmc.expire_sessions()
        texts.append(repr(await request_and_confirm(client, "On", settings)))
        texts.append(repr(client))
    assert session_bmc.bmc.logins == 2 and len(session_bmc.bmc.issued_tokens) == 2

    stuck_bmc = await fake_bmc(never_apply=True, sessions=False)
    async with RedfishClient(stuck_bmc.config()) as client:
        with pytest.raises(ConfirmationDeadlineExceeded) as deadline:
            await request_and_confirm(client, "On", settings)
        texts += [str(deadline.value), repr(deadline.value), repr(deadline.value.requests)]

    for peer_config in (
        session_bmc.config(password=SecretStr(WRONG_PASSWORD)),
        stuck_bmc.config(password=SecretStr(WRONG_PASSWORD)),
        sushy.config(system_id=sushy.systems["node-read"], password=SecretStr(WRONG_PASSWORD)),
    ):
        async with RedfishClient(peer_config) as client:
            with pytest.raises(AuthFailed) as failed:
                await client.read_power_state()
            texts += [str(failed.value), repr(failed.value), repr(failed.value.__dict__)]

    async with RedfishClient(sushy.config(system_id=sushy.systems["node-read"])) as client:
        texts.append(repr(await client.read_reset_capabilities()))

    # Basic fallback: a login without a token (its session deleted with Basic auth), a
    # login answered 500 with Basic refused, and a login cut after the session existed
    # (deleted with its token before the error is raised).
    no_token_bmc = await fake_bmc(login_fault="no_token")
    refused_bmc = await fake_bmc(login_error=500, basic_auth=False)
    cut_bmc = await fake_bmc(login_fault="truncated_body")
    async with RedfishClient(no_token_bmc.config()) as client:
        texts += [repr(await client.read_power_state()), repr(client)]
        texts.append(str(client.auth_fallback_reason))
    async with RedfishClient(refused_bmc.config()) as client:
        with pytest.raises(AuthFailed) as refused:
            await client.read_power_state()
        texts += [str(refused.value), repr(refused.value), repr(refused.value.__dict__)]
    async with RedfishClient(cut_bmc.config()) as client:
        with pytest.raises(RedfishConnectionError) as cut:
            await client.read_power_state()
        texts += [str(cut.value), repr(cut.value), repr(cut.value.__dict__)]
    deleted_with = {
        (peer.bmc.options.login_fault, r.auth)
        for peer in (session_bmc, no_token_bmc, cut_bmc)
        for r in peer.bmc.requests
        if r.method == "DELETE" and r.status == 204
    }
    assert deleted_with == {
        ("none", "session"),
        ("none", "basic"),  # the session ended by expiry, deleted after the re-login
        ("no_token", "basic"),
        ("truncated_body", "session"),
    }
    assert all(p.bmc.live_sessions == 0 for p in (session_bmc, no_token_bmc, cut_bmc))

    texts.append(caplog.text)
    for record in caplog.records:
        texts.append(repr(record.__dict__))
        if record.exc_info and isinstance(record.exc_info[1], RedfishError):
            texts.append(repr(record.exc_info[1]))

    def basic(user: str, password: str) -> str:
        return base64.b64encode(f"{user}:{password}".encode()).decode()

    secrets = [
        FAKE_PASSWORD,
        WRONG_PASSWORD,
        sushy.password,
        basic(session_bmc.bmc.options.username, FAKE_PASSWORD),
        basic(sushy.username, sushy.password),
        basic(sushy.username, WRONG_PASSWORD),
        *session_bmc.bmc.issued_tokens,
        *no_token_bmc.bmc.issued_tokens,
        *cut_bmc.bmc.issued_tokens,
    ]
    haystack = "\n".join(texts)
    assert len(caplog.records) > 20  # the run really logged
    for secret in secrets:
        assert secret not in haystack
