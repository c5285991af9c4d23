"""A 202 reset with a task monitor: the request happens once and is judged by the state it
produces, whatever its task does (issue 19, item 4).

Against the project fake BMC over HTTPS (sushy-tools answers no reset with 202): a task
monitor that never finishes, one that ends in Exception, one on another origin. Both the
library path (`request_and_confirm`) and the operator's request path
(`nodewarden.power.control.PowerControl.request`, with a real `RedfishClient`) are used.
Counts come from the fake's own request log, stamped with its clock on arrival.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from redfish_peers import FakeBmcRunning, StartFakeBmc

from nodewarden.api.workernode import WorkerNodeSpec
from nodewarden.policy.events import RequestAccepted
from nodewarden.power.control import NodeRef, PowerControl
from nodewarden.redfish import (
    ConfirmationSettings,
    RedfishClient,
    RedfishPowerState,
    request_and_confirm,
)
from nodewarden_doubles.fakebmc import (
    ROOT,
    task_monitor_elsewhere,
    task_monitor_never_finishing,
)

POLL = timedelta(seconds=0.1)
SETTINGS = ConfirmationSettings(
    deadline=timedelta(seconds=30), poll_interval=POLL, resend_after=timedelta(seconds=20)
)
"""A long deadline: a confirmation that waited for the task would only end there."""


def system_reads_since(peer: FakeBmcRunning, since: float) -> int:
    return sum(
        1
        for r in peer.bmc.requests
        if r.method == "GET" and r.path == f"{ROOT}/Systems/1" and r.at >= since
    )


async def test_a_202_is_accepted_at_once_and_its_task_recorded_not_awaited(
    fake_bmc: StartFakeBmc,
) -> None:
    peer = await fake_bmc(task_monitor_never_finishing(), initial_power="Off")
    async with RedfishClient(peer.config()) as client:
        result = await client.request_reset("On")
    assert result.http_status == 202 and result.accepted
    assert result.task is not None
    assert result.task.monitor.startswith(f"{ROOT}/TaskService/TaskMonitors/")
    assert (result.task.state, result.task.finished, result.task.polls) == ("Running", False, 0)
    assert result.task.followable
    assert peer.bmc.task_monitor_reads() == []


async def test_a_task_that_ends_in_exception_is_read_as_evidence_not_raised(
    fake_bmc: StartFakeBmc,
) -> None:
    peer = await fake_bmc(
        reset_reply=202, task_polls=1, task_retry_after=0, task_end_state="Exception"
    )
    async with RedfishClient(peer.config()) as client:
        result = await client.request_reset("On")
        assert result.task is not None
        running = await client.read_task(result.task)
        ended = await client.read_task(running)
        again = await client.read_task(ended)  # finished: nothing more is read
    assert (running.state, running.polls, running.failed) == ("Running", 1, False)
    assert (ended.state, ended.finished, ended.failed, ended.polls) == ("Exception", True, True, 2)
    assert any("failed" in m for m in ended.messages)
    assert again == ended
    assert len(peer.bmc.task_monitor_reads()) == 2


async def test_never_finishing_task_off_confirmed_within_one_poll_of_the_observed_off(
    fake_bmc: StartFakeBmc,
) -> None:
    peer = await fake_bmc(
        task_monitor_never_finishing(), initial_power="On", transition_seconds=0.5
    )
    async with RedfishClient(peer.config()) as client:
        result = await request_and_confirm(client, "GracefulShutdown", SETTINGS)
    off_at = peer.bmc.settled_at("1")
    assert off_at is not None
    assert result.confirmation.state is RedfishPowerState.OFF
    # the request is recorded as accepted (not "already at the target")
    assert not result.already_at_target and len(result.requests) == 1
    assert result.failed_requests == ()
    assert [r.outcome for r in peer.bmc.resets] == ["scheduled"]
    # within one poll: the first PowerState read after the BMC went Off confirmed it,
    # and the task monitor was read at most once in that time (in the background)
    assert system_reads_since(peer, off_at) == 1
    assert sum(1 for r in peer.bmc.task_monitor_reads() if r.at >= off_at) <= 1
    # the task was read as evidence while the state changed, and is still Running
    task = result.requests[0].task
    assert task is not None and task.state == "Running" and not task.finished
    assert RedfishPowerState.POWERING_OFF in result.states_seen


async def test_task_monitor_on_another_origin_is_never_read_and_the_reset_stays_accepted(
    fake_bmc: StartFakeBmc,
) -> None:
    elsewhere = await fake_bmc()  # the other host: it must see no request at all
    peer = await fake_bmc(
        task_monitor_elsewhere(elsewhere.bmc.url), initial_power="Off", transition_seconds=0.3
    )
    settings = ConfirmationSettings(
        deadline=timedelta(seconds=30), poll_interval=POLL, resend_after=timedelta(seconds=0.2)
    )
    async with RedfishClient(peer.config()) as client:
        result = await request_and_confirm(client, "On", settings)
    assert result.confirmation.state is RedfishPowerState.ON
    assert [r.outcome for r in peer.bmc.resets] == ["scheduled"]  # exactly one Reset
    assert len(result.requests) == 1 and not result.already_at_target
    task = result.requests[0].task
    assert task is not None and task.monitor.startswith(elsewhere.bmc.url)
    assert task.not_followed is not None and "another origin" in task.not_followed
    assert elsewhere.bmc.requests == []
    assert peer.bmc.task_monitor_reads() == []


# -- the operator's request path ----------------------------------------------------------

SPEC = WorkerNodeSpec.model_validate(
    {
        "nodeType": "SideNode",
        "controlMethod": "Redfish",
        "capacity": {"vcpus": 4, "ram": "8Gi"},
        "bmc": {
            "endpoint": "https://127.0.0.1:1",  # the client below is what is used
            "usernameSecretRef": {"name": "bmc", "key": "username"},
            "passwordSecretRef": {"name": "bmc", "key": "password"},
        },
    }
)


def operator_control(client: RedfishClient) -> PowerControl:
    """The operator's PowerControl with its credential lookup replaced by a real client
    for the fake (the resolver's own tests cover that lookup)."""
    control = PowerControl(
        credentials=None,  # type: ignore[arg-type]  # _redfish is replaced below
        prober=None,
        nodes=None,
        clock=lambda: datetime.now(UTC),
    )

    async def redfish(node: NodeRef) -> RedfishClient:
        return client

    control._redfish = redfish  # type: ignore[assignment,method-assign]
    return control


async def test_operator_request_returns_at_acceptance_of_a_never_finishing_task(
    fake_bmc: StartFakeBmc,
) -> None:
    peer = await fake_bmc(task_monitor_never_finishing(), initial_power="On")
    async with RedfishClient(peer.config()) as client:
        outcome = await operator_control(client).request(
            NodeRef("side-1", SPEC), "t-1", 1, "GracefulShutdown"
        )
    assert isinstance(outcome, RequestAccepted), outcome
    assert "HTTP 202" in outcome.detail
    # bounded by the answer, not by the task: not one task poll on the request path
    assert peer.bmc.task_monitor_reads() == []
    assert [r.outcome for r in peer.bmc.resets] == ["scheduled"]


async def test_operator_request_with_a_task_monitor_elsewhere_is_accepted_not_errored(
    fake_bmc: StartFakeBmc,
) -> None:
    elsewhere = await fake_bmc()
    peer = await fake_bmc(task_monitor_elsewhere(elsewhere.bmc.url), initial_power="Off")
    async with RedfishClient(peer.config()) as client:
        outcome = await operator_control(client).request(NodeRef("side-1", SPEC), "t-1", 1, "On")
    # an errored request would be retried by the state machine: a second Reset
    assert isinstance(outcome, RequestAccepted), outcome
    assert [r.outcome for r in peer.bmc.resets] == ["scheduled"]
    assert elsewhere.bmc.requests == []
