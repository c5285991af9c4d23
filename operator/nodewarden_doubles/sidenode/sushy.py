"""`SushyEmulator`: the real sushy-tools Redfish emulator (fake driver) as a subprocess on 127.0.0.1.

It serves the given systems over HTTPS with the caller's certificate, Basic auth from a
bcrypt htpasswd file (only the hash is written; the password stays in memory), and its
own fresh state directory (sushy keeps state in sqlite there). The emulator is a real
peer: resets are always accepted (204) and applied after a random 1-11 s, visible only
when a GET reads the system.

    sushy = SushyEmulator(workdir, [SushySystem(uuid, "gpu-01", "On")], username="admin",
                          password=SecretStr("..."), cert_file=..., key_file=..., ca_pem=...)
    endpoint = await sushy.start()     # https://127.0.0.1:PORT, answering
    ...
    await sushy.stop()

The child gets SIGTERM when the process that started it dies (Linux parent-death
signal), so a killed side-node process does not leave an emulator behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from pydantic import SecretStr

from nodewarden_doubles.ports import unused_loopback_port
from nodewarden_doubles.sidenode.power import Power

_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True, slots=True)
class SushySystem:
    """One emulated ComputerSystem."""

    uuid: str
    name: str
    power: Power
    mac: str = "52:54:00:00:00:01"


def default_command() -> str:
    """The sushy-emulator script installed beside this Python."""
    return str(Path(sys.executable).with_name("sushy-emulator"))


def _die_with_parent() -> None:  # runs in the child between fork and exec
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class SushyEmulator:
    """A sushy-emulator subprocess (see the module docstring)."""

    def __init__(
        self,
        workdir: Path,
        systems: Sequence[SushySystem],
        *,
        username: str,
        password: SecretStr,
        cert_file: Path,
        key_file: Path,
        ca_pem: str,
        command: str | None = None,
        startup_timeout: float = 60.0,
    ) -> None:
        if not systems:
            raise ValueError("sushy needs at least one system")
        self.workdir = workdir
        self.systems = tuple(systems)
        self.username = username
        self._password = password
        self.cert_file = cert_file
        self.key_file = key_file
        self.ca_pem = ca_pem
        self.command = command or default_command()
        self.startup_timeout = startup_timeout
        self.endpoint = ""
        self.process: asyncio.subprocess.Process | None = None

    @property
    def log_path(self) -> Path:
        return self.workdir / "sushy.log"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def _write_htpasswd(self) -> Path:
        import bcrypt  # test dependency, as sushy-tools itself

        digest = bcrypt.hashpw(
            self._password.get_secret_value().encode(), bcrypt.gensalt(rounds=4)
        ).decode()
        path = self.workdir / "htpasswd"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(f"{self.username}:{digest}\n")
        return path

    def _write_config(self, port: int, htpasswd: Path) -> Path:
        state_dir = self.workdir / f"state-{port}"
        state_dir.mkdir(parents=True, exist_ok=True)
        fake_systems = [
            {
                "uuid": s.uuid,
                "name": s.name,
                "power_state": s.power,
                "nics": [{"mac": s.mac, "ip": "127.0.0.1"}],
            }
            for s in self.systems
        ]
        lines = [
            "SUSHY_EMULATOR_LISTEN_IP = '127.0.0.1'",
            f"SUSHY_EMULATOR_LISTEN_PORT = {port}",
            "SUSHY_EMULATOR_FAKE_DRIVER = True",
            f"SUSHY_EMULATOR_FAKE_SYSTEMS = {fake_systems!r}",
            f"SUSHY_EMULATOR_STATE_DIR = {str(state_dir)!r}",
            f"SUSHY_EMULATOR_AUTH_FILE = {str(htpasswd)!r}",
            f"SUSHY_EMULATOR_SSL_CERT = {str(self.cert_file)!r}",
            f"SUSHY_EMULATOR_SSL_KEY = {str(self.key_file)!r}",
            "",
        ]
        config = self.workdir / "sushy.conf"
        config.write_text("\n".join(lines))
        return config

    async def start(self) -> str:
        """Start the emulator and wait until its service root answers; returns the endpoint."""
        if self.process is not None:
            return self.endpoint
        self.workdir.mkdir(parents=True, exist_ok=True)
        htpasswd = self._write_htpasswd()
        for _attempt in range(3):  # the free port may be taken between probe and bind
            port = unused_loopback_port()
            config = self._write_config(port, htpasswd)
            with self.log_path.open("ab") as log:
                process = await asyncio.create_subprocess_exec(
                    self.command,
                    "--config",
                    str(config),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    cwd=self.workdir,
                    preexec_fn=_die_with_parent,
                )
            self.process = process
            endpoint = f"https://127.0.0.1:{port}"
            try:
                answered = await self._wait_answering(process, endpoint)
            except BaseException:
                await self.stop()
                raise
            if answered:
                self.endpoint = endpoint
                return endpoint
            self.process = None
        raise RuntimeError(f"sushy-emulator did not start; its log:\n{self._log_tail()}")

    async def _wait_answering(self, process: asyncio.subprocess.Process, endpoint: str) -> bool:
        context = ssl.create_default_context(cadata=self.ca_pem)
        deadline = time.monotonic() + self.startup_timeout
        timeout = aiohttp.ClientTimeout(total=2)
        async with aiohttp.ClientSession() as session:
            while time.monotonic() < deadline:
                if process.returncode is not None:
                    return False
                try:
                    async with session.get(
                        endpoint + "/redfish/v1/", ssl=context, timeout=timeout
                    ) as response:
                        if response.status == 200:
                            return True
                except (aiohttp.ClientError, TimeoutError):
                    pass
                await asyncio.sleep(0.05)  # readiness poll, bounded by the deadline
        raise TimeoutError(
            f"sushy-emulator did not answer on {endpoint} within {self.startup_timeout:g} s; "
            f"its log:\n{self._log_tail()}"
        )

    def _log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-2000:]
        except OSError:
            return ""

    async def stop(self) -> None:
        process, self.process = self.process, None
        if process is None or process.returncode is not None:
            return
        process.terminate()
        try:
            await asyncio.wait_for(process.wait(), 10)
        except TimeoutError:
            process.kill()
            await process.wait()
