"""The side-node process (fake BMC, sushy-tools and WoL nodes) driven through its state file and admin API."""

from __future__ import annotations

import asyncio
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from pydantic import SecretStr
from sidenode_helpers import probe_state

from nodewarden.redfish import RedfishClient
from nodewarden.ssh import KnownHostKeys, SshClientKey, SshProber, SshTarget
from nodewarden.wol import WakeOnLanSender
from nodewarden_doubles.sidenode.process import SideNodeAdmin, SideNodeProcess, SideNodeProcessError

pytestmark = pytest.mark.slow

BMC_PASSWORD = "sidenode-process-bmc-pw-3f5a"
SECURE_ON = "0c:1d:2e:3f:40:51"
ADMIN_TOKEN = "sidenode-process-admin-token-77e2"


@pytest.fixture(scope="module")
def process_key() -> SshClientKey:
    return SshClientKey.generate()


@pytest.fixture(scope="module")
def side(
    tmp_path_factory: pytest.TempPathFactory, process_key: SshClientKey
) -> Iterator[SideNodeProcess]:
    config = {
        "name": "test-side",
        "authorized_keys": [process_key.public_key],
        "bmc": {"username": "admin", "password": BMC_PASSWORD},
        "admin_token": ADMIN_TOKEN,
        "nodes": [
            {"name": "bmc-on", "power": "fakebmc", "initial_power": "On"},
            {"name": "bmc-off", "power": "fakebmc", "boot_delay": 0.2, "ready_delay": 0.2},
            {
                "name": "sushy-on",
                "power": "sushy",
                "initial_power": "On",
                "mac": "52:54:00:cc:00:03",
            },
            {
                "name": "wol-off",
                "power": "wol",
                "mac": "52:54:00:cc:00:04",
                "secure_on": SECURE_ON,
                "boot_delay": 0.2,
                "ready_delay": 0.2,
                "gpus": 2,
            },
        ],
    }
    process = SideNodeProcess(config, workdir=tmp_path_factory.mktemp("sidenode-process"))
    started = time.monotonic()
    with process:
        print(f"side-node process with 4 nodes up in {time.monotonic() - started:.2f} s")
        yield process


def target(side: SideNodeProcess, name: str, key: SshClientKey) -> SshTarget:
    endpoint = side.endpoint(name)
    return SshTarget(
        node=name,
        host=endpoint.host,
        port=endpoint.port,
        client_key=key,
        trust=KnownHostKeys(side.known_hosts_line(name)),
    )


def test_state_file_has_what_a_demo_needs_and_no_secret(side: SideNodeProcess) -> None:
    state_file = side.state_dir / "state.json"
    text = state_file.read_text()
    assert side.state["nodes"].keys() == {"bmc-on", "bmc-off", "sushy-on", "wol-off"}
    assert side.state["bmc_ca_pem"].startswith("-----BEGIN CERTIFICATE-----")
    assert side.state["bmc_username"] == "admin"
    assert side.state["wol"] == {"host": "127.0.0.1", "port": side.wol_port}
    assert side.state["sushy"]["endpoint"].startswith("https://127.0.0.1:")
    powers = {n: i["power"]["source"] for n, i in side.state["nodes"].items()}
    assert powers == {
        "bmc-on": "fakebmc",
        "bmc-off": "fakebmc",
        "sushy-on": "sushy",
        "wol-off": "wol",
    }
    wol = side.node_info("wol-off")
    assert (wol["mac"], wol["secure_on"]) == ("52:54:00:cc:00:04", True)
    for name, info in side.state["nodes"].items():
        KnownHostKeys(info["known_hosts_line"])  # parses
        assert (
            info["known_hosts_line"]
            == f"[127.0.0.1]:{info['ssh']['port']} {info['host_public_key']}"
        )
        assert side.node_info(name)["ssh"]["port"] > 0
    secure_on_hex = SECURE_ON.replace(":", "")
    for where in (text, side.log_text(), (side.workdir / "sidenode.out").read_text()):
        assert BMC_PASSWORD not in where and ADMIN_TOKEN not in where
        assert SECURE_ON not in where and secure_on_hex not in where
    assert stat.S_IMODE((side.state_dir / "admin-token").stat().st_mode) == 0o600
    assert stat.S_IMODE((side.workdir / "sidenode.yaml").stat().st_mode) == 0o600
    assert side.admin.state() == side.state


async def test_bmc_nodes_answer_redfish_and_ssh(
    side: SideNodeProcess, prober: SshProber, process_key: SshClientKey
) -> None:
    for name in ("bmc-on", "sushy-on"):
        async with RedfishClient(side.redfish_config(name)) as client:
            assert (await client.read_power_state()).state == "On"
        assert await probe_state(prober, target(side, name, process_key)) == "Ready"
    async with RedfishClient(side.redfish_config("bmc-off")) as client:
        assert (await client.read_power_state()).state == "Off"
    assert await probe_state(prober, target(side, "bmc-off", process_key)) == "Unreachable"


async def test_admin_switches_power_and_faults(
    side: SideNodeProcess, prober: SshProber, process_key: SshClientKey
) -> None:
    admin = side.admin
    node = target(side, "bmc-off", process_key)
    admin.set_power("bmc-off", "On")
    await asyncio.to_thread(admin.wait_for, "bmc-off", lambda n: n["ready"], 10)
    assert await probe_state(prober, node) == "Ready"

    admin.set_faults("bmc-off", shutdown_inhibitor=True)
    assert len((await prober.inhibitors(node)).shutdown_blockers) == 1

    assert admin.set_bmc("bmc-off", never_apply=True)["never_apply"] is True
    async with RedfishClient(side.redfish_config("bmc-off")) as client:
        await client.request_reset("GracefulShutdown")
    log = admin.bmc_log("bmc-off")
    assert [(r["reset_type"], r["outcome"]) for r in log["resets"]] == [
        ("GracefulShutdown", "ignored")
    ]
    assert any(r["method"] == "POST" for r in log["requests"])
    assert admin.node("bmc-off")["power"] == "On"
    assert await probe_state(prober, node) == "Ready"

    admin.set_bmc("bmc-off", never_apply=False)
    admin.set_power("bmc-off", "Off")
    state = await asyncio.to_thread(admin.wait_for, "bmc-off", lambda n: n["os"] == "off", 10)
    assert state["ssh"]["listening"] is False
    kinds = [e["kind"] for e in admin.events("bmc-off")]
    assert kinds[:2] == ["admin_set_power", "power_on"] and kinds[-1] in (
        "power_off",
        "ssh_stopped",
    )


async def test_wol_node_through_the_listener(
    side: SideNodeProcess, prober: SshProber, process_key: SshClientKey
) -> None:
    admin = side.admin
    node = target(side, "wol-off", process_key)
    await WakeOnLanSender().send(
        "52:54:00:cc:00:04",
        destination="127.0.0.1",
        port=side.wol_port,
        secure_on=side.secure_on("wol-off"),
    )
    await asyncio.to_thread(admin.wait_for, "wol-off", lambda n: n["ready"], 10)
    report = await prober.probe(node, telemetry=True)
    assert report.ready.state == "Ready"
    assert report.telemetry is not None and len(report.telemetry.gpus) == 2
    packets = admin.wol_packets()
    assert [(p["node"], p["length"], p["secure_on_matched"], p["outcome"]) for p in packets] == [
        ("wol-off", 108, True, "woke")
    ]
    await prober.poweroff(node)
    state = await asyncio.to_thread(
        admin.wait_for, "wol-off", lambda n: (n["power"], n["os"]) == ("Off", "off"), 10
    )
    assert state["ssh"]["listening"] is False


def test_admin_refuses_bad_input_by_name(side: SideNodeProcess) -> None:
    admin = side.admin
    with pytest.raises(
        SideNodeProcessError, match=r"HTTP 400.*unknown side-node fault field.*bogus"
    ):
        admin.set_faults("bmc-on", bogus=True)
    with pytest.raises(SideNodeProcessError, match=r"HTTP 400.*ssh_unreachable"):
        admin.set_faults("bmc-on", ssh_unreachable=True)
    with pytest.raises(SideNodeProcessError, match="HTTP 400"):
        admin.set_power("bmc-on", "Maybe")
    with pytest.raises(SideNodeProcessError, match=r"HTTP 400.*cannot be changed: password"):
        admin.set_bmc("bmc-on", password="guess")
    with pytest.raises(SideNodeProcessError, match=r"HTTP 404.*nope"):
        admin.node("nope")
    with pytest.raises(SideNodeProcessError, match="HTTP 409"):
        admin.bmc_log("wol-off")
    wrong = SideNodeAdmin(side.state["admin_url"], SecretStr("not-the-token"))
    with pytest.raises(SideNodeProcessError, match="HTTP 401"):
        wrong.nodes()
    assert requests.get(side.state["admin_url"] + "/healthz", timeout=5).ok
    assert admin.node("bmc-on")["faults"]["ssh_unreachable"] == "no"


def _run_cli(config: Path, state_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "nodewarden_doubles.sidenode",
            "--config",
            str(config),
            "--state-dir",
            str(state_dir),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_a_bad_config_file_is_reported_by_field_without_its_values(tmp_path: Path) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text(
        "authorized_keys: [ssh-ed25519 AAAA]\n"
        f"bmc: {{username: admin, password: {BMC_PASSWORD}}}\n"
        "nodes:\n"
        "  - {name: a, power: wol, mac: 'zz:00', secure_on: '0102'}\n"
        "  - {name: b, power: fakebmc, fakebmc: {transition_seconds: soon}}\n"
    )
    result = _run_cli(config, tmp_path / "state")
    assert result.returncode == 2
    assert "nodes.0.mac" in result.stderr and "nodes.1" in result.stderr
    assert "transition_seconds" in result.stderr and "Traceback" not in result.stderr
    assert BMC_PASSWORD not in result.stderr + result.stdout
    config.write_text(f"bmc: {{password: {BMC_PASSWORD}\n")
    result = _run_cli(config, tmp_path / "state")
    assert result.returncode == 2 and "line" in result.stderr
    assert BMC_PASSWORD not in result.stderr and "Traceback" not in result.stderr
