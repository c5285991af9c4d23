"""Runner loss, in process: a runner that exits completes its container with the exit
code; one that vanishes without finishing (or whose node vanishes) is requeued and runs
again."""

from __future__ import annotations

from fakes import Rig


async def test_a_runner_that_exits_completes_the_container_with_its_exit_code() -> None:
    rig = Rig()
    uuid = await rig.running()
    rig.cloud.vms["vm-a"].exit(uuid, 3)
    await rig.rounds(2)
    status = rig.api.status("c1")
    assert status["phase"] == "Complete"
    assert status["exitCode"] == 3
    assert rig.starts() == ["c1"]


async def test_a_runner_that_vanishes_is_requeued_and_runs_again() -> None:
    rig = Rig(maxAttempts=3)
    uuid = await rig.running()
    rig.cloud.vms["vm-a"].lose(uuid)
    await rig.round()
    status = rig.api.status("c1")
    assert status["phase"] == "Queued"
    assert status["reason"] == "RunnerLost"
    assert status["attempts"] == 1
    await rig.rounds(2)
    assert rig.api.phase("c1") == "Running"
    assert rig.api.status("c1")["attempts"] == 2
    assert rig.starts() == ["c1", "c1"]


async def test_a_runner_whose_node_vanishes_is_requeued() -> None:
    rig = Rig(maxAttempts=3)
    await rig.running()
    del rig.cloud.vms["vm-a"]  # the instance left the cloud list
    await rig.round()
    status = rig.api.status("c1")
    assert status["phase"] == "Queued"
    assert status["reason"] == "NodeLost"
    assert "vm-a" not in rig.pool.workers


async def test_a_listing_older_than_the_start_is_not_taken_for_a_loss() -> None:
    rig = Rig()
    await rig.running()
    # the probe's runner list predates the start: nothing is lost yet
    worker = rig.pool.workers["vm-a"]
    worker.runners = {}
    started = rig.queue.by_name["c1"].status.started_at
    assert started is not None
    worker.runners_at = started
    await rig.dispatcher.step()
    await rig.settle()
    assert rig.api.phase("c1") == "Running"
