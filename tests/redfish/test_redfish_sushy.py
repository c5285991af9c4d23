"""The Redfish client against the real sushy-tools emulator (fake driver, TLS, Basic auth)."""

from __future__ import annotations

import logging
from datetime import UTC, timedelta

import pytest
import trustme
from pydantic import SecretStr
from redfish_peers import SushyEmulator

from nodewarden.redfish import (
    ActionNotSupported,
    AuthFailed,
    ConfirmationSettings,
    NotFound,
    RedfishClient,
    RedfishPowerState,
    SystemDiscoveryError,
    TlsError,
    request_and_confirm,
)

logger = logging.getLogger(__name__)

# sushy applies a reset 1-11 s after accepting it (FIELD-NOTES); re-sending restarts
# that timer, so these confirmations never re-send and allow for the worst case.
SUSHY_CONFIRMATION = ConfirmationSettings(
    deadline=timedelta(seconds=30),
    poll_interval=timedelta(seconds=0.25),
    resend_after=None,
)


async def test_reads_power_state_of_the_configured_system(sushy: SushyEmulator) -> None:
    system_uuid = sushy.systems["node-read"]
    async with RedfishClient(sushy.config(system_id=system_uuid)) as client:
        system = await client.discover_system()
        observation = await client.read_power_state()
        assert client.auth_mode == "basic"  # sushy has no SessionService: Basic fallback
    assert system.system_id == system_uuid
    assert system.reset_target == f"/redfish/v1/Systems/{system_uuid}/Actions/ComputerSystem.Reset"
    assert observation.state is RedfishPowerState.ON
    assert observation.raw == "On"
    assert observation.system_id == system_uuid
    assert observation.source == f"redfish:{sushy.endpoint}"
    assert observation.observed_at.tzinfo is UTC


async def test_system_name_alias_redirect_is_followed_on_the_same_origin(
    sushy: SushyEmulator,
) -> None:
    async with RedfishClient(sushy.config(system_id="node-read")) as client:
        system = await client.discover_system()
    assert system.system_id == sushy.systems["node-read"]
    assert system.name == "node-read"


async def test_several_systems_without_an_id_is_a_discovery_error(sushy: SushyEmulator) -> None:
    async with RedfishClient(sushy.config()) as client:
        with pytest.raises(SystemDiscoveryError) as caught:
            await client.discover_system()
    assert set(caught.value.members) == set(sushy.systems.values())
    assert "systemId" in str(caught.value)


async def test_unknown_system_id_is_not_found(sushy: SushyEmulator) -> None:
    async with RedfishClient(sushy.config(system_id="no-such-system")) as client:
        with pytest.raises(NotFound):
            await client.discover_system()


async def test_wrong_password_is_auth_failed_without_the_password(sushy: SushyEmulator) -> None:
    wrong = "wrong-" + sushy.password
    config = sushy.config(system_id=sushy.systems["node-read"], password=SecretStr(wrong))
    async with RedfishClient(config) as client:
        with pytest.raises(AuthFailed) as caught:
            await client.read_power_state()
    assert caught.value.status == 401
    text = str(caught.value) + repr(caught.value) + repr(config)
    assert wrong not in text
    assert sushy.password not in text


async def test_certificate_from_an_unknown_ca_is_a_clear_tls_error(
    sushy: SushyEmulator, other_ca: trustme.CA
) -> None:
    config = sushy.config(
        system_id=sushy.systems["node-read"],
        ca_bundle_pem=other_ca.cert_pem.bytes().decode(),
    )
    async with RedfishClient(config) as client:
        with pytest.raises(TlsError) as caught:
            await client.read_power_state()
    assert caught.value.problem == "unknown_ca"
    assert "unknown CA" in str(caught.value)
    assert sushy.endpoint in str(caught.value)


async def test_without_a_ca_bundle_the_system_store_does_not_trust_a_private_ca(
    sushy: SushyEmulator,
) -> None:
    config = sushy.config(system_id=sushy.systems["node-read"], ca_bundle_pem=None)
    async with RedfishClient(config) as client:
        with pytest.raises(TlsError) as caught:
            await client.discover_system()
    assert caught.value.problem == "unknown_ca"


async def test_allowable_reset_types_come_inline(sushy: SushyEmulator) -> None:
    async with RedfishClient(sushy.config(system_id=sushy.systems["node-read"])) as client:
        capabilities = await client.read_reset_capabilities()
    assert capabilities.found_in == "inline"
    assert capabilities.allowable is not None
    assert {"On", "GracefulShutdown", "ForceOff"} <= capabilities.allowable
    assert capabilities.allows("PushPowerButton") is False
    assert capabilities.source == f"redfish:{sushy.endpoint}"


async def test_reset_type_outside_allowable_values_is_refused_before_sending(
    sushy: SushyEmulator,
) -> None:
    async with RedfishClient(sushy.config(system_id=sushy.systems["node-read"])) as client:
        with pytest.raises(ActionNotSupported) as caught:
            await client.request_reset("PushPowerButton")
    assert caught.value.status == 0  # never sent
    assert caught.value.allowable is not None and "On" in caught.value.allowable


async def test_listed_but_unimplemented_reset_type_is_action_not_supported(
    sushy: SushyEmulator,
) -> None:
    # sushy lists Nmi as allowable but its fake driver answers 501 for it.
    async with RedfishClient(sushy.config(system_id=sushy.systems["node-nmi"])) as client:
        with pytest.raises(ActionNotSupported) as caught:
            await client.request_reset("Nmi")
    assert caught.value.status == 501
    assert caught.value.reset_type == "Nmi"


async def test_graceful_shutdown_is_confirmed_by_observed_off(sushy: SushyEmulator) -> None:
    async with RedfishClient(sushy.config(system_id=sushy.systems["node-shutdown"])) as client:
        before = await client.read_power_state()
        assert before.state is RedfishPowerState.ON
        result = await request_and_confirm(client, "GracefulShutdown", SUSHY_CONFIRMATION)
    assert result.target is RedfishPowerState.OFF
    assert len(result.requests) == 1
    request = result.requests[0]
    assert request.http_status == 204 and request.task is None
    assert result.confirmation.state is RedfishPowerState.OFF
    assert result.confirmation.observed_at >= request.answered_at
    assert (
        result.states_seen[0] is RedfishPowerState.ON
        and result.states_seen[-1] is RedfishPowerState.OFF
    )
    logger.info(
        "sushy applied GracefulShutdown %.2fs after acceptance",
        (result.confirmation.observed_at - request.answered_at).total_seconds(),
    )


async def test_on_is_confirmed_by_observed_on(sushy: SushyEmulator) -> None:
    async with RedfishClient(sushy.config(system_id=sushy.systems["node-wake"])) as client:
        result = await request_and_confirm(client, "On", SUSHY_CONFIRMATION)
        again = await request_and_confirm(client, "On", SUSHY_CONFIRMATION)
    assert len(result.requests) == 1 and result.requests[0].http_status == 204
    assert result.states_seen[0] is RedfishPowerState.OFF
    assert result.confirmation.state is RedfishPowerState.ON
    # Already On: nothing is sent, the observation alone confirms.
    assert again.already_at_target and again.requests == ()
    assert again.confirmation.state is RedfishPowerState.ON
    logger.info(
        "sushy applied On %.2fs after acceptance",
        (result.confirmation.observed_at - result.requests[0].answered_at).total_seconds(),
    )
