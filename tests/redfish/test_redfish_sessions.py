"""Session login against the project fake BMC: odd successes, Basic fallback, no leaked session.

sushy-tools has no SessionService, so every case here needs the fake. Each test ends
with the fake's count of live sessions: a client that cleans up leaves none.
"""

from __future__ import annotations

import asyncio
import logging

import pytest
from pydantic import SecretStr
from redfish_peers import FakeBmcRunning, StartFakeBmc

from nodewarden.redfish import (
    AuthFailed,
    RedfishClient,
    RedfishConnectionError,
    RedfishPowerState,
    RedfishTimeout,
)

SESSIONS = "/redfish/v1/SessionService/Sessions"


def logins(peer: FakeBmcRunning) -> list[int]:
    return [r.status for r in peer.bmc.requests if r.method == "POST" and r.path == SESSIONS]


def system_auth(peer: FakeBmcRunning) -> set[str]:
    return {r.auth for r in peer.bmc.requests if r.path.startswith("/redfish/v1/Systems")}


def deletes(peer: FakeBmcRunning) -> list[tuple[str, int]]:
    return [(r.auth, r.status) for r in peer.bmc.requests if r.method == "DELETE"]


async def test_login_answered_204_with_a_token_is_a_session(fake_bmc: StartFakeBmc) -> None:
    peer = await fake_bmc(login_status=204, initial_power="On")
    async with RedfishClient(peer.config()) as client:
        observation = await client.read_power_state()
        assert client.auth_mode == "session"
        assert peer.bmc.live_sessions == 1
    assert observation.state is RedfishPowerState.ON
    assert logins(peer) == [204]
    assert system_auth(peer) == {"session"}
    assert deletes(peer) == [("session", 204)]
    assert peer.bmc.live_sessions == 0
    assert peer.bmc.requests[-1].live_sessions == 0


async def test_session_is_deleted_on_close_also_after_a_relogin(fake_bmc: StartFakeBmc) -> None:
    peer = await fake_bmc()
    async with RedfishClient(peer.config()) as client:
        await client.read_power_state()
        peer.bmc.expire_sessions()
        await client.read_power_state()
        assert peer.bmc.live_sessions == 1  # the expired one is gone, the new one is live
    assert peer.bmc.logins == 2
    # the expired session: its token is refused, so (the password having just been
    # accepted) it is deleted with Basic auth; the new one at close with its token
    assert deletes(peer) == [("none", 401), ("basic", 204), ("session", 204)]
    assert peer.bmc.live_sessions == 0


@pytest.mark.parametrize("status", [404, 405, 500, 503])
async def test_login_failing_for_another_reason_than_credentials_falls_back_to_basic(
    fake_bmc: StartFakeBmc, status: int
) -> None:
    peer = await fake_bmc(login_error=status, initial_power="On")
    async with RedfishClient(peer.config()) as client:
        first = await client.read_power_state()
        second = await client.read_power_state()
        assert client.auth_mode == "basic"
    assert first.state is second.state is RedfishPowerState.ON
    assert logins(peer) == [status]  # one login attempt, then Basic for the client's life
    assert system_auth(peer) == {"basic"}
    assert peer.bmc.live_sessions == 0


async def test_wrong_password_at_login_is_not_retried_as_basic(fake_bmc: StartFakeBmc) -> None:
    peer = await fake_bmc()
    async with RedfishClient(peer.config(password=SecretStr("not-the-password"))) as client:
        with pytest.raises(AuthFailed) as caught:
            await client.read_power_state()
    assert caught.value.status == 401
    assert peer.bmc.failed_logins == 1
    # one wrong attempt at the BMC, not two: no Basic request with the same password
    assert [(r.method, r.path) for r in peer.bmc.requests if r.path != "/redfish/v1/"] == [
        ("POST", SESSIONS)
    ]


async def test_basic_refused_after_a_failed_login_names_the_login_and_retries_it(
    fake_bmc: StartFakeBmc,
) -> None:
    peer = await fake_bmc(login_error=500, basic_auth=False)
    async with RedfishClient(peer.config()) as client:
        with pytest.raises(AuthFailed) as caught:
            await client.read_power_state()
        peer.bmc.options.login_error = None  # the SessionService recovers
        observation = await client.read_power_state()
        assert client.auth_mode == "session"
    assert "session login failed (HTTP 500)" in str(caught.value)
    assert caught.value.status == 401
    assert observation.state is RedfishPowerState.OFF
    assert logins(peer) == [500, 201]
    assert peer.bmc.live_sessions == 0


async def test_login_without_a_token_falls_back_to_basic_and_deletes_the_session(
    fake_bmc: StartFakeBmc,
) -> None:
    peer = await fake_bmc(login_fault="no_token")
    async with RedfishClient(peer.config()) as client:
        await client.read_power_state()
        assert client.auth_mode == "basic"
        assert peer.bmc.live_sessions == 0  # deleted at once, not only on close
    assert logins(peer) == [201]
    assert deletes(peer) == [("basic", 204)]
    assert system_auth(peer) == {"basic"}


@pytest.mark.parametrize(
    "fault",
    [
        "no_location",  # the body's @odata.id names the session
        "malformed_body",  # the Location names it; the body is not needed
    ],
)
async def test_login_with_one_name_for_the_session_is_used_and_deleted(
    fake_bmc: StartFakeBmc, fault: str
) -> None:
    peer = await fake_bmc(login_fault=fault)
    async with RedfishClient(peer.config()) as client:
        await client.read_power_state()
        assert client.auth_mode == "session"
    assert deletes(peer) == [("session", 204)]
    assert peer.bmc.live_sessions == 0


async def test_session_that_nothing_names_is_not_used(
    fake_bmc: StartFakeBmc, caplog: pytest.LogCaptureFixture
) -> None:
    # No Location and no session id in the body: the client could never delete it, so
    # it does not run on it. The BMC keeps it until its own SessionTimeout (a BMC fault
    # the client can only report).
    caplog.set_level(logging.WARNING, logger="nodewarden.redfish")
    peer = await fake_bmc(login_fault="anonymous")
    async with RedfishClient(peer.config()) as client:
        await client.read_power_state()
        assert client.auth_mode == "basic"
    assert system_auth(peer) == {"basic"}
    assert logins(peer) == [201]
    assert peer.bmc.live_sessions == 1
    assert any("cannot be deleted" in r.getMessage() for r in caplog.records)


async def test_login_reply_cut_after_the_session_was_created_leaks_nothing(
    fake_bmc: StartFakeBmc,
) -> None:
    peer = await fake_bmc(login_fault="truncated_body")
    async with RedfishClient(peer.config()) as client:
        with pytest.raises(RedfishConnectionError):
            await client.read_power_state()
        assert peer.bmc.live_sessions == 0
    assert deletes(peer) == [("session", 204)]
    assert not any(r.path.startswith("/redfish/v1/Systems/") for r in peer.bmc.requests)


async def test_login_reply_stalled_after_the_session_was_created_leaks_nothing(
    fake_bmc: StartFakeBmc,
) -> None:
    peer = await fake_bmc(login_fault="stalled_body", body_stall_seconds=30.0)
    async with RedfishClient(peer.config(request_timeout=0.5)) as client:
        with pytest.raises(RedfishTimeout) as caught:
            await client.read_power_state()
        assert peer.bmc.live_sessions == 0
    assert caught.value.timeout_seconds == pytest.approx(0.5)
    assert deletes(peer) == [("session", 204)]


# -- issue 20, item 5: no BMC lockout, no leaked sessions ----------------------------------


async def test_a_refused_relogin_stops_logins_until_the_credentials_change(
    fake_bmc: StartFakeBmc,
) -> None:
    """The password is rotated on the BMC: one failed login, then nothing is sent."""
    peer = await fake_bmc(initial_power="On")
    async with RedfishClient(peer.config()) as client:
        await client.read_power_state()
        peer.bmc.change_password("rotated-on-the-bmc-7")
        errors = []
        for _ in range(3):
            with pytest.raises(AuthFailed) as caught:
                await client.read_power_state()
            errors.append(str(caught.value))
        sent = len(peer.bmc.requests)
        with pytest.raises(AuthFailed):
            await client.read_power_state()
        assert len(peer.bmc.requests) == sent  # a stopped BMC is sent nothing at all
    assert peer.bmc.failed_auth == 1  # one refused login towards the lockout, not one per read
    assert logins(peer) == [201, 401]
    assert all("until the" in e and "Secret changes" in e for e in errors[1:]), errors
    assert peer.bmc.live_sessions == 0
    # the Secret changes (a new client with the new password): logins resume
    async with RedfishClient(peer.config(password=SecretStr("rotated-on-the-bmc-7"))) as client:
        assert (await client.read_power_state()).state is RedfishPowerState.ON
    assert peer.bmc.failed_auth == 1 and peer.bmc.live_sessions == 0


async def test_a_bmc_that_refuses_its_new_token_keeps_no_session(fake_bmc: StartFakeBmc) -> None:
    """Before: each re-login left a session on the BMC (3 after 3 reads) and the read failed."""
    peer = await fake_bmc(initial_power="On")
    peer.bmc.refuse_session_tokens()
    for _ in range(3):  # three reads, each by its own client as after a restart
        async with RedfishClient(peer.config()) as client:
            assert (await client.read_power_state()).state is RedfishPowerState.ON
            await client.read_power_state()
            assert client.auth_mode == "basic"
        assert peer.bmc.live_sessions == 0
    assert peer.bmc.failed_auth == 0
    assert peer.bmc.logins == 6  # a login and one re-login per client, each session deleted
    assert all(status == 204 for auth, status in deletes(peer) if auth == "basic")


async def test_wrong_basic_credentials_are_sent_once(fake_bmc: StartFakeBmc) -> None:
    peer = await fake_bmc(sessions=False)
    async with RedfishClient(peer.config(password=SecretStr("not-the-password"))) as client:
        for _ in range(3):
            with pytest.raises(AuthFailed):
                await client.read_power_state()
        assert client.auth_mode is None
    assert peer.bmc.failed_basic == 1


async def test_concurrent_requests_of_a_refused_password_cost_one_failed_login(
    fake_bmc: StartFakeBmc,
) -> None:
    """Two reads in flight meet the 401 together: the second must not log in again."""
    peer = await fake_bmc(initial_power="On")
    async with RedfishClient(peer.config()) as client:
        await client.read_power_state()
        peer.bmc.change_password("rotated-on-the-bmc-8")
        results = await asyncio.gather(
            *(client.read_power_state() for _ in range(4)), return_exceptions=True
        )
        assert all(isinstance(r, AuthFailed) for r in results), results
    assert peer.bmc.failed_auth == 1
