"""Reply bodies that arrive in several TCP writes, chunked, stalled or too large (fake BMC).

sushy-tools answers every body in one write, so these need the fake.
"""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from redfish_peers import StartFakeBmc

from nodewarden.redfish import (
    ConfirmationSettings,
    RedfishClient,
    RedfishPowerState,
    RedfishProtocolError,
    RedfishTimeout,
    request_and_confirm,
    transport,
)

FAST = ConfirmationSettings(
    deadline=timedelta(seconds=10), poll_interval=timedelta(seconds=0.05), resend_after=None
)


@pytest.mark.parametrize("delivery", ["pieces", "chunked"])
async def test_body_in_several_writes_is_read_whole(fake_bmc: StartFakeBmc, delivery: str) -> None:
    peer = await fake_bmc(
        body_delivery=delivery,
        body_piece_gap=0.01,
        allowable_in="action_info",
        reset_reply=202,
        task_retry_after=0,
    )
    async with RedfishClient(peer.config()) as client:
        capabilities = await client.read_reset_capabilities()
        result = await request_and_confirm(client, "On", FAST)
        task = result.requests[0].task
        assert task is not None
        for _ in range(3):  # the task monitor's bodies come in pieces too
            task = await client.read_task(task)
        assert client.auth_mode == "session"
    assert capabilities.found_in == "action_info" and capabilities.allows("On")
    assert result.confirmation.state is RedfishPowerState.ON
    assert task.finished and task.state == "Completed"
    assert peer.bmc.live_sessions == 0


@pytest.mark.parametrize("delivery", ["pieces", "chunked"])
async def test_body_stalled_half_way_is_the_request_timeout(
    fake_bmc: StartFakeBmc, delivery: str
) -> None:
    peer = await fake_bmc(body_delivery=delivery, body_stall_seconds=30.0, sessions=False)
    started = time.monotonic()
    async with RedfishClient(peer.config(request_timeout=0.5)) as client:
        with pytest.raises(RedfishTimeout) as caught:
            await client.discover_system()
    assert caught.value.timeout_seconds == pytest.approx(0.5)
    assert "timed out" in str(caught.value)
    assert time.monotonic() - started < 10  # the timeout, not the stall, ended it


async def test_body_over_the_size_cap_is_a_clear_protocol_error(
    fake_bmc: StartFakeBmc, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(transport, "MAX_BODY_BYTES", 64)
    peer = await fake_bmc(body_delivery="chunked", sessions=False)
    async with RedfishClient(peer.config()) as client:
        with pytest.raises(RedfishProtocolError) as caught:
            await client.discover_system()
    assert "larger than 64 bytes" in str(caught.value)
