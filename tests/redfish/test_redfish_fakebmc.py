"""The Redfish client and confirmation against the project fake BMC.

Only behaviours sushy-tools cannot produce are tested here: ActionInfo-only allowable
values, sessions (X-Auth-Token, expiry, re-login), 409, a reset accepted but never
applied, PoweringOn/Off, the early-Off quirk, slow answers, resets that fail or hang. Login faults are in test_redfish_sessions.py, body faults in
test_redfish_bodies.py, 202 task monitors in test_redfish_tasks.py.
"""

from __future__ import annotations

import socket
import time
from datetime import timedelta

import pytest
from pydantic import SecretStr
from redfish_peers import FAKE_PASSWORD, StartFakeBmc

from nodewarden.redfish import (
    ActionNotSupported,
    AuthFailed,
    ConfirmationDeadlineExceeded,
    ConfirmationSettings,
    Conflict409,
    RedfishClient,
    RedfishConnectionError,
    RedfishEndpointConfig,
    RedfishPowerState,
    RedfishTimeout,
    SystemDiscoveryError,
    request_and_confirm,
)

FAST = ConfirmationSettings(
    deadline=timedelta(seconds=10),
    poll_interval=timedelta(seconds=0.05),
    resend_after=None,
)


# -- discovery and reads ---------------------------------------------------------------


async def test_the_only_system_is_discovered_without_an_id(fake_bmc: StartFakeBmc) -> None:
    peer = await fake_bmc(system_ids=("blade-7",), initial_power="On")
    async with RedfishClient(peer.config()) as client:
        system = await client.discover_system()
        observation = await client.read_power_state()
    assert system.system_id == "blade-7"
    assert system.path == "/redfish/v1/Systems/blade-7"
    assert observation.state is RedfishPowerState.ON
    assert observation.source == f"redfish:{peer.bmc.url}"


async def test_no_system_is_a_discovery_error(fake_bmc: StartFakeBmc) -> None:
    peer = await fake_bmc(system_ids=())
    async with RedfishClient(peer.config()) as client:
        with pytest.raises(SystemDiscoveryError) as caught:
            await client.discover_system()
    assert caught.value.members == ()
    assert "found 0" in str(caught.value)


async def test_slow_bmc_hits_the_request_timeout(fake_bmc: StartFakeBmc) -> None:
    peer = await fake_bmc(response_delay=1.0)
    async with RedfishClient(peer.config(request_timeout=0.2)) as client:
        with pytest.raises(RedfishTimeout) as caught:
            await client.discover_system()
    assert caught.value.timeout_seconds == pytest.approx(0.2)
    assert isinstance(caught.value, TimeoutError)


async def test_closed_port_is_a_connection_error(ca_pem: str) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    config = RedfishEndpointConfig(
        endpoint=f"https://127.0.0.1:{port}",
        username="admin",
        password=SecretStr(FAKE_PASSWORD),
        ca_bundle_pem=ca_pem,
    )
    async with RedfishClient(config) as client:
        with pytest.raises(RedfishConnectionError) as caught:
            await client.read_power_state()
    assert "cannot connect" in str(caught.value)


# -- allowable reset types ---------------------------------------------------------------


async def test_allowable_values_only_in_action_info(fake_bmc: StartFakeBmc) -> None:
    peer = await fake_bmc(allowable_in="action_info", allowable=("On", "GracefulShutdown"))
    async with RedfishClient(peer.config()) as client:
        capabilities = await client.read_reset_capabilities()
        with pytest.raises(ActionNotSupported) as caught:
            await client.request_reset("ForceOff")
    assert capabilities.found_in == "action_info"
    assert capabilities.allowable == frozenset({"On", "GracefulShutdown"})
    assert capabilities.action_info_path == "/redfish/v1/Systems/1/ResetActionInfo"
    assert capabilities.allows("ForceOff") is False
    assert caught.value.allowable == ("GracefulShutdown", "On")
    assert peer.bmc.resets == []  # refused before anything was sent


async def test_unspecified_allowable_values_are_unknown_not_allowed(
    fake_bmc: StartFakeBmc,
) -> None:
    peer = await fake_bmc(allowable_in="nowhere")
    async with RedfishClient(peer.config()) as client:
        capabilities = await client.read_reset_capabilities()
    assert capabilities.found_in == "unspecified"
    assert capabilities.allowable is None
    assert capabilities.allows("On") is None


async def test_bmc_rejection_of_a_reset_type_is_action_not_supported(
    fake_bmc: StartFakeBmc,
) -> None:
    peer = await fake_bmc(allowable=("On",))
    async with RedfishClient(peer.config()) as client:
        with pytest.raises(ActionNotSupported) as caught:
            await client.request_reset("GracefulShutdown", check_allowable=False)
    assert caught.value.status == 400
    assert "Base.1.8.ActionParameterNotSupported" in caught.value.message_ids
    assert [r.outcome for r in peer.bmc.resets] == ["rejected"]


# -- 202 task monitors: test_redfish_tasks.py --------------------------------------------


# -- sessions ----------------------------------------------------------------------------


async def test_session_login_then_token_then_logout(fake_bmc: StartFakeBmc) -> None:
    peer = await fake_bmc()
    async with RedfishClient(peer.config()) as client:
        await client.read_power_state()
        await client.read_reset_capabilities()
        assert client.auth_mode == "session"
    assert peer.bmc.logins == 1
    authenticated = [r for r in peer.bmc.requests if r.path.startswith("/redfish/v1/Systems")]
    assert authenticated and {r.auth for r in authenticated} == {"session"}
    assert peer.bmc.requests[-1].method == "DELETE"
    assert peer.bmc.requests[-1].status == 204
    assert peer.bmc.requests[-1].live_sessions == 0
    assert peer.bmc.live_sessions == 0


async def test_expired_session_gets_one_relogin(fake_bmc: StartFakeBmc) -> None:
    peer = await fake_bmc(initial_power="On")
    async with RedfishClient(peer.config()) as client:
        await client.read_power_state()
        peer.bmc.expire_sessions()
        observation = await client.read_power_state()
        assert client.logins == 2
    assert observation.state is RedfishPowerState.ON
    assert peer.bmc.logins == 2
    statuses = [r.status for r in peer.bmc.requests if r.path == "/redfish/v1/Systems/1"]
    assert 401 in statuses and statuses[-1] == 200


async def test_tokens_expired_at_once_fall_back_to_basic(fake_bmc: StartFakeBmc) -> None:
    peer = await fake_bmc(session_ttl=0.0, initial_power="On")  # every token already expired
    async with RedfishClient(peer.config()) as client:
        assert (await client.read_power_state()).state.value == "On"
        await client.read_power_state()
        assert client.auth_mode == "basic"
    assert peer.bmc.logins == 2  # the first login and exactly one re-login, then Basic
    assert peer.bmc.failed_auth == 0


async def test_wrong_password_at_session_login_is_auth_failed(fake_bmc: StartFakeBmc) -> None:
    peer = await fake_bmc()
    config = peer.config(password=SecretStr("not-the-password"))
    async with RedfishClient(config) as client:
        with pytest.raises(AuthFailed) as caught:
            await client.read_power_state()
    assert caught.value.status == 401
    assert "session login" in str(caught.value)
    assert peer.bmc.failed_logins == 1
    assert not any(r.path.startswith("/redfish/v1/Systems/") for r in peer.bmc.requests)


async def test_relogin_with_a_changed_password_is_auth_failed(fake_bmc: StartFakeBmc) -> None:
    peer = await fake_bmc()
    async with RedfishClient(peer.config()) as client:
        await client.read_power_state()
        peer.bmc.options.password = "rotated-on-the-bmc"
        peer.bmc.expire_sessions()
        with pytest.raises(AuthFailed):
            await client.read_power_state()


async def test_bmc_without_sessions_gets_basic_auth(fake_bmc: StartFakeBmc) -> None:
    peer = await fake_bmc(sessions=False)
    async with RedfishClient(peer.config()) as client:
        await client.read_power_state()
        assert client.auth_mode == "basic"
    assert peer.bmc.logins == 0
    assert {r.auth for r in peer.bmc.requests if "Systems" in r.path} == {"basic"}


async def test_wrong_password_with_basic_auth_is_auth_failed(fake_bmc: StartFakeBmc) -> None:
    peer = await fake_bmc(sessions=False)
    config = peer.config(password=SecretStr("not-the-password"))
    async with RedfishClient(config) as client:
        with pytest.raises(AuthFailed):
            await client.read_power_state()


# -- conflicts, transitional states, confirmation --------------------------------------


async def test_reset_during_a_transition_is_conflict_409(fake_bmc: StartFakeBmc) -> None:
    peer = await fake_bmc(initial_power="Off", transition_seconds=30.0)
    async with RedfishClient(peer.config()) as client:
        await client.request_reset("On")
        assert (await client.read_power_state()).state is RedfishPowerState.POWERING_ON
        with pytest.raises(Conflict409) as caught:
            await client.request_reset("ForceOff")
    assert caught.value.status == 409
    assert [r.outcome for r in peer.bmc.resets] == ["scheduled", "conflict"]


async def test_poweringoff_counts_as_in_progress_until_off(fake_bmc: StartFakeBmc) -> None:
    peer = await fake_bmc(initial_power="On", transition_seconds=0.5)
    async with RedfishClient(peer.config()) as client:
        result = await request_and_confirm(client, "GracefulShutdown", FAST)
    assert result.states_seen == (
        RedfishPowerState.ON,
        RedfishPowerState.POWERING_OFF,
        RedfishPowerState.OFF,
    )
    assert len(result.requests) == 1


async def test_state_is_read_before_reset_so_no_409_while_poweringoff(
    fake_bmc: StartFakeBmc,
) -> None:
    peer = await fake_bmc(initial_power="On", transition_seconds=0.5)
    async with RedfishClient(peer.config()) as client:
        await client.request_reset("GracefulShutdown")
        result = await request_and_confirm(client, "On", FAST)
    assert result.states_seen[0] is RedfishPowerState.POWERING_OFF
    assert result.confirmation.state is RedfishPowerState.ON
    assert result.conflicts == 0
    assert [r.outcome for r in peer.bmc.resets] == ["scheduled", "scheduled"]


async def test_already_at_target_sends_nothing(fake_bmc: StartFakeBmc) -> None:
    peer = await fake_bmc(initial_power="Off")
    async with RedfishClient(peer.config()) as client:
        result = await request_and_confirm(client, "GracefulShutdown", FAST)
    assert result.already_at_target
    assert peer.bmc.resets == []


async def test_reset_accepted_but_never_applied_hits_the_confirmation_deadline(
    fake_bmc: StartFakeBmc,
) -> None:
    # DMTF's Redfish-Mockup-Server behaves so: every Reset 204, PowerState never changes
    peer = await fake_bmc(initial_power="Off", never_apply=True)
    settings = ConfirmationSettings(
        deadline=timedelta(seconds=1.5),
        poll_interval=timedelta(seconds=0.1),
        resend_after=timedelta(seconds=0.5),
        max_resends=1,
    )
    async with RedfishClient(peer.config()) as client:
        with pytest.raises(ConfirmationDeadlineExceeded) as caught:
            await request_and_confirm(client, "On", settings)
    error = caught.value
    assert error.target is RedfishPowerState.ON
    assert len(error.requests) == 2  # the request and one re-send, both accepted (204)
    assert all(r.http_status == 204 for r in error.requests)
    assert error.last_observation is not None
    assert error.last_observation.state is RedfishPowerState.OFF
    assert error.last_observation.observed_at >= error.deadline
    assert [r.outcome for r in peer.bmc.resets] == ["ignored", "ignored"]
    assert "On not observed" in str(error)


async def test_on_dropped_after_an_early_off_is_resent(fake_bmc: StartFakeBmc) -> None:
    peer = await fake_bmc(initial_power="On", early_off_drop_on_seconds=1.0)
    settings = ConfirmationSettings(
        deadline=timedelta(seconds=10),
        poll_interval=timedelta(seconds=0.05),
        resend_after=timedelta(seconds=1.2),
        max_resends=2,
    )
    async with RedfishClient(peer.config()) as client:
        off = await request_and_confirm(client, "GracefulShutdown", settings)
        on = await request_and_confirm(client, "On", settings)
    assert off.confirmation.state is RedfishPowerState.OFF
    assert len(on.requests) == 2
    assert on.confirmation.state is RedfishPowerState.ON
    assert [r.outcome for r in peer.bmc.resets] == ["scheduled", "dropped", "scheduled"]


async def test_dropped_on_without_resends_is_not_confirmed(fake_bmc: StartFakeBmc) -> None:
    peer = await fake_bmc(initial_power="On", early_off_drop_on_seconds=5.0)
    settings = ConfirmationSettings(
        deadline=timedelta(seconds=1.0),
        poll_interval=timedelta(seconds=0.05),
        resend_after=None,
    )
    async with RedfishClient(peer.config()) as client:
        await request_and_confirm(client, "GracefulShutdown", settings)
        with pytest.raises(ConfirmationDeadlineExceeded) as caught:
            await request_and_confirm(client, "On", settings)
    assert len(caught.value.requests) == 1
    assert [r.outcome for r in peer.bmc.resets] == ["scheduled", "dropped"]


async def test_409_on_a_resend_is_counted_and_confirmation_continues(
    fake_bmc: StartFakeBmc,
) -> None:
    # Like sushy, this BMC keeps reporting the old state while a change is pending.
    peer = await fake_bmc(initial_power="Off", transition_seconds=0.8, report_transitional=False)
    settings = ConfirmationSettings(
        deadline=timedelta(seconds=10),
        poll_interval=timedelta(seconds=0.05),
        resend_after=timedelta(seconds=0.3),
        max_resends=1,
    )
    async with RedfishClient(peer.config()) as client:
        result = await request_and_confirm(client, "On", settings)
    assert result.confirmation.state is RedfishPowerState.ON
    assert result.conflicts >= 1
    assert len(result.requests) == 1
    assert peer.bmc.resets[0].outcome == "scheduled"
    assert {r.outcome for r in peer.bmc.resets[1:]} == {"conflict"}
    # a 409 restarts the re-send clock: one attempt per 0.3 s while the change is pending
    # (at about 0.3 s and 0.6 s), not one per 0.05 s poll
    assert result.conflicts <= 2


async def test_unconfirmable_reset_type_is_refused(fake_bmc: StartFakeBmc) -> None:
    peer = await fake_bmc()
    async with RedfishClient(peer.config()) as client:
        with pytest.raises(ValueError, match="cannot confirm"):
            await request_and_confirm(client, "GracefulRestart", FAST)
    assert peer.bmc.resets == []


async def test_200_reply_is_an_accepted_request_without_a_task(fake_bmc: StartFakeBmc) -> None:
    peer = await fake_bmc(reset_reply=200, initial_power="Off")
    async with RedfishClient(peer.config()) as client:
        result = await client.request_reset("On")
        observed = await client.read_power_state()
    assert (result.http_status, result.task, result.reset_type) == (200, None, "On")
    assert result.source == f"redfish:{peer.bmc.url}"
    assert observed.state is RedfishPowerState.ON


async def test_busy_bmc_503_reads_are_tolerated_until_the_state_is_seen(
    fake_bmc: StartFakeBmc,
) -> None:
    peer = await fake_bmc(initial_power="Off", unavailable_reads=3)
    async with RedfishClient(peer.config()) as client:
        result = await request_and_confirm(client, "On", FAST)
    assert result.confirmation.state is RedfishPowerState.ON
    assert len(result.requests) == 1
    busy = [r for r in peer.bmc.requests if r.status == 503]
    assert len(busy) == 3


async def test_busy_bmc_until_the_deadline_reports_the_last_error(
    fake_bmc: StartFakeBmc,
) -> None:
    peer = await fake_bmc(initial_power="Off", unavailable_reads=10_000)
    settings = ConfirmationSettings(
        deadline=timedelta(seconds=0.5), poll_interval=timedelta(seconds=0.05)
    )
    async with RedfishClient(peer.config()) as client:
        with pytest.raises(ConfirmationDeadlineExceeded) as caught:
            await request_and_confirm(client, "On", settings)
    assert caught.value.last_observation is None
    assert caught.value.requests == ()
    assert caught.value.last_error is not None and "503" in caught.value.last_error
    assert peer.bmc.resets == []


# -- failed resets count against the budget; the deadline bounds a reset in flight -------


@pytest.mark.parametrize(
    ("resend_after", "max_resends", "posts"),
    [(0.3, 1, 2), (0.2, 2, 3), (None, 3, 1)],
)
async def test_failing_resets_count_against_max_resends(
    fake_bmc: StartFakeBmc, resend_after: float | None, max_resends: int, posts: int
) -> None:
    peer = await fake_bmc(initial_power="Off", failing_resets=10_000)
    settings = ConfirmationSettings(
        deadline=timedelta(seconds=1.5),
        poll_interval=timedelta(seconds=0.05),
        resend_after=None if resend_after is None else timedelta(seconds=resend_after),
        max_resends=max_resends,
    )
    async with RedfishClient(peer.config()) as client:
        with pytest.raises(ConfirmationDeadlineExceeded) as caught:
            await request_and_confirm(client, "On", settings)
    error = caught.value
    assert [r.outcome for r in peer.bmc.resets] == ["failed"] * posts
    assert error.requests == ()
    assert [f.http_status for f in error.failed_requests] == [500] * posts
    assert not any(f.in_flight_at_deadline for f in error.failed_requests)
    assert error.last_error is not None and "HTTP 500" in error.last_error
    assert f"{posts} failed" in str(error)


async def test_a_failed_reset_is_resent_and_then_confirmed(fake_bmc: StartFakeBmc) -> None:
    peer = await fake_bmc(initial_power="Off", failing_resets=1)
    settings = ConfirmationSettings(
        deadline=timedelta(seconds=10),
        poll_interval=timedelta(seconds=0.05),
        resend_after=timedelta(seconds=0.2),
        max_resends=1,
    )
    async with RedfishClient(peer.config()) as client:
        result = await request_and_confirm(client, "On", settings)
    assert result.confirmation.state is RedfishPowerState.ON
    assert [r.outcome for r in peer.bmc.resets] == ["failed", "scheduled"]
    assert len(result.requests) == 1 and len(result.failed_requests) == 1
    assert result.failed_requests[0].http_status == 500


async def test_reset_in_flight_at_the_deadline_does_not_delay_the_result(
    fake_bmc: StartFakeBmc,
) -> None:
    # The BMC holds the POST far longer than the confirmation deadline; the client's own
    # request timeout (10 s) must not decide when the confirmation ends.
    peer = await fake_bmc(initial_power="Off", reset_delay=60.0)
    settings = ConfirmationSettings(
        deadline=timedelta(seconds=1.0), poll_interval=timedelta(seconds=0.05)
    )
    started = time.monotonic()
    async with RedfishClient(peer.config(request_timeout=10.0)) as client:
        with pytest.raises(ConfirmationDeadlineExceeded) as caught:
            await request_and_confirm(client, "On", settings)
        finished = time.monotonic()
    error = caught.value
    assert finished - started < 6.0  # deadline + the final read, not + 10 s
    assert error.requests == ()
    assert len(error.failed_requests) == 1
    in_flight = error.failed_requests[0]
    assert in_flight.in_flight_at_deadline and in_flight.http_status is None
    assert in_flight.reset_type == "On"
    assert "in flight at the confirmation deadline" in str(error)
    assert error.last_observation is not None
    assert error.last_observation.state is RedfishPowerState.OFF
