"""Parity with a real peer: the prober against Debian's OpenSSH sshd on a loopback port.

sshd is started with its own config (absolute HostKey/PidFile/AuthorizedKeysFile, UsePAM
no, StrictModes no). As root it needs /run/sshd (its privilege-separation directory);
unprivileged it can only log in as the user running it, which is the user we log in as.
Only harmless commands are run: everything runs for real on this machine.
"""

from __future__ import annotations

import asyncio
import getpass
import json
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import asyncssh
import pytest
from pydantic import SecretStr
from ssh_helpers import eventually, fast_settings

from nodewarden.ssh import (
    CommandTimeout,
    HostKeyMismatch,
    InstanceSecretTrust,
    KnownHostKeys,
    ProbeThrottle,
    SshClientKey,
    SshProber,
    SshTarget,
)
from nodewarden.ssh.facts import Inhibitor
from nodewarden_doubles.ports import unused_loopback_port
from nodewarden_doubles.stubworker import render

SSHD = "/usr/sbin/sshd"
pytestmark = pytest.mark.skipif(not os.path.exists(SSHD), reason="OpenSSH sshd not installed")

RUNNER_SCRIPT = """\
#!/bin/sh
# A minimal runner meeting the node contract, for the parity test.
state="$(dirname "$0")"
case "$1" in
  run) cat > "$state/config.json"; echo 4242 ;;
  --list) [ -f "$state/config.json" ] && echo "4242 zzzzz-dz642-000000000000001" ;;
  --status) printf '{"uuid":"%s","state":"running","pid":4242,"exitCode":null,"signal":null}\\n' "$2" ;;
  --kill) rm -f "$state/config.json" ;;
  *) echo "usage" >&2; exit 2 ;;
esac
exit 0
"""


@dataclass
class Sshd:
    port: int
    user: str
    host_public_key: str
    client_key: SshClientKey
    log: Path
    workdir: Path

    def accepted_logins(self) -> int:
        return self.log.read_text(errors="replace").count("Accepted publickey")

    def target(self, trust: KnownHostKeys | InstanceSecretTrust | None = None) -> SshTarget:
        known = KnownHostKeys.for_key("127.0.0.1", self.port, self.host_public_key)
        return SshTarget(
            node="openssh",
            host="127.0.0.1",
            port=self.port,
            user=self.user,
            client_key=self.client_key,
            trust=trust or known,
        )


def _wait_for_banner(port: int, proc: subprocess.Popen[bytes], deadline_s: float = 15) -> None:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"sshd exited with status {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as conn:
                if conn.recv(8).startswith(b"SSH-2.0"):
                    return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("sshd did not answer before the deadline")


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    work = tmp_path_factory.mktemp("sshd")
    if os.geteuid() == 0:
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
    host_key = asyncssh.generate_private_key("ssh-ed25519")
    host_key_path = work / "ssh_host_ed25519_key"
    host_key_path.write_bytes(host_key.export_private_key("openssh"))
    host_key_path.chmod(0o600)
    client_key = SshClientKey.generate()
    authorized = work / "authorized_keys"
    authorized.write_text(client_key.public_key + "\n")
    authorized.chmod(0o600)
    port = unused_loopback_port()
    log = work / "sshd.log"
    config = work / "sshd_config"
    config.write_text(
        f"""\
Port {port}
ListenAddress 127.0.0.1
HostKey {host_key_path}
PidFile {work / "sshd.pid"}
AuthorizedKeysFile {authorized}
UsePAM no
StrictModes no
PasswordAuthentication no
KbdInteractiveAuthentication no
PubkeyAuthentication yes
PermitRootLogin prohibit-password
MaxSessions 10
LogLevel VERBOSE
"""
    )
    check = subprocess.run([SSHD, "-t", "-f", str(config)], capture_output=True, check=False)
    if check.returncode != 0:
        pytest.fail(f"sshd rejects the test config: {check.stderr.decode(errors='replace')}")
    proc = subprocess.Popen([SSHD, "-D", "-f", str(config), "-E", str(log)])
    try:
        _wait_for_banner(port, proc)
        runner = work / "runner" / "nw-runner"
        runner.parent.mkdir()
        runner.write_text(RUNNER_SCRIPT)
        runner.chmod(0o755)
        yield Sshd(
            port=port,
            user=getpass.getuser() if os.geteuid() else "root",
            host_public_key=host_key.export_public_key("openssh").decode().strip(),
            client_key=client_key,
            log=log,
            workdir=work,
        )
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def test_ready_runners_and_telemetry_over_openssh(sshd: Sshd) -> None:
    runner = sshd.workdir / "runner" / "nw-runner"
    settings = fast_settings(ready_command="echo running", runner_command=str(runner))
    prober = SshProber(settings, throttle=ProbeThrottle(0))
    try:
        report = await prober.probe(sshd.target(), telemetry=True)
        assert report.ready.ready and report.ready.detail == "running"
        assert report.runners is not None and report.runners.runners == ()
        assert report.telemetry is not None
        assert report.telemetry.load1 >= 0 and report.telemetry.load15 >= 0
        if shutil.which("nvidia-smi") is None:
            assert report.telemetry.gpus is None

        config = {"uuid": "zzzzz-dz642-000000000000001", "command": ["echo", "hi there"]}
        started = await prober.start_runner(sshd.target(), config)
        assert started.pid == 4242
        delivered = json.loads((runner.parent / "config.json").read_text())
        assert delivered == config  # stdin reached the runner intact
        listed = await prober.list_runners(sshd.target())
        assert [(r.pid, r.uuid) for r in listed.runners] == [(4242, config["uuid"])]
        assert (await prober.runner_status(sshd.target(), config["uuid"])).state == "running"
        await prober.kill_runner(sshd.target(), config["uuid"], "TERM")
        assert (await prober.list_runners(sshd.target())).runners == ()

        prober.settings = fast_settings(ready_command="false")
        booting = await prober.check_ready(sshd.target())
        assert booting.state == "Booting" and booting.exit_status == 1
        assert prober.stats.connects == 1  # everything above used one kept-alive connection
    finally:
        await prober.aclose()


async def test_inhibitor_fallback_and_ethtool_parsing_over_openssh(sshd: Sshd) -> None:
    locks = [
        Inhibitor(("shutdown", "sleep"), "backup job", "pg_basebackup running", "block", 0, 77),
        Inhibitor(("sleep",), "NetworkManager", "turn off networks", "delay", 0, 612),
    ]
    listing = sshd.workdir / "inhibitors.txt"
    listing.write_text(render.systemd_inhibit_list(locks))
    ethtool = sshd.workdir / "ethtool-eno1.txt"
    ethtool.write_text(render.ethtool("eno1", "pumbg", "g", permission_denied=False))
    # Real busctl, pointed at a bus that does not exist, so the fallback is always taken.
    no_bus = f"unix:path={sshd.workdir}/no-such-bus"
    settings = fast_settings(
        inhibitors_command=(
            f"busctl --json=short --address={no_bus} call org.freedesktop.login1 "
            "/org/freedesktop/login1 org.freedesktop.login1.Manager ListInhibitors"
        ),
        inhibitors_fallback_command=f"cat {listing}",
        ethtool_command=f"cat {sshd.workdir}/ethtool-{{iface}}.txt",
    )
    prober = SshProber(settings, throttle=ProbeThrottle(0))
    try:
        fact = await prober.inhibitors(sshd.target())
        assert fact.via == "systemd-inhibit"
        assert fact.inhibitors == tuple(locks)
        assert [i.who for i in fact.shutdown_blockers] == ["backup job"]
        wol = await prober.wake_on_lan(sshd.target(), "eno1")
        assert wol.supports_magic_packet and wol.magic_packet_enabled
    finally:
        await prober.aclose()


async def test_host_key_mismatch_is_refused_by_the_prober_against_openssh(sshd: Sshd) -> None:
    prober = SshProber(fast_settings(ready_command="true"), throttle=ProbeThrottle(0))
    try:
        before = sshd.accepted_logins()
        assert (await prober.check_ready(sshd.target())).ready
        await eventually(lambda: sshd.accepted_logins() == before + 1)

        impostor_key = asyncssh.generate_private_key("ssh-ed25519")
        wrong = KnownHostKeys.for_key(
            "127.0.0.1", sshd.port, impostor_key.export_public_key("openssh").decode()
        )
        with pytest.raises(HostKeyMismatch) as info:
            await prober.check_ready(sshd.target(trust=wrong))
        assert impostor_key.get_fingerprint() in str(info.value)  # the key we expected
        # We never authenticated, so nothing could have run: the next genuine login is
        # only the second one sshd accepted in this test.
        await prober.disconnect("openssh")
        assert (await prober.check_ready(sshd.target())).ready
        await eventually(lambda: sshd.accepted_logins() >= before + 2)
        assert sshd.accepted_logins() == before + 2
    finally:
        await prober.aclose()


async def test_first_use_trust_after_secret_proof_against_openssh(sshd: Sshd) -> None:
    secret_file = sshd.workdir / "instance-secret"
    secret_file.write_text("openssh-instance-secret-1234567\n")
    secret_file.chmod(0o600)
    trust = InstanceSecretTrust(
        SecretStr("openssh-instance-secret-1234567"), proof_command=f"cat {secret_file}"
    )
    settings = fast_settings(ready_command="true", runner_command="true")
    prober = SshProber(settings, throttle=ProbeThrottle(0))
    try:
        report = await prober.probe(sshd.target(trust=trust))
        assert report.learned_host_key is not None
        assert report.learned_host_key.public_key == sshd.host_public_key
    finally:
        await prober.aclose()


async def test_command_timeout_and_recovery_against_openssh(sshd: Sshd) -> None:
    prober = SshProber(
        fast_settings(ready_command="sleep 5", command_timeout=0.5), throttle=ProbeThrottle(0)
    )
    try:
        with pytest.raises(CommandTimeout):
            await prober.check_ready(sshd.target())
        # Generous timeout from here on: sshd forks a shell per command and this host is busy.
        prober.settings = fast_settings(ready_command="true", command_timeout=60)
        assert (await prober.check_ready(sshd.target())).ready
        # More concurrent commands than sshd's MaxSessions: the per-connection cap queues them.
        results = await asyncio.gather(*(prober.check_ready(sshd.target()) for _ in range(25)))
        assert all(r.ready for r in results)
    finally:
        await prober.aclose()
