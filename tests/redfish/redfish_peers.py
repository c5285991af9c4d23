"""Peers of the Redfish adapter tests: the sushy-tools emulator process and the fake BMC.

sushy-tools is the real peer: it runs as a subprocess on 127.0.0.1 with its fake
driver, its own state directory, a bcrypt htpasswd file and a certificate from a CA
the test session generates. The project fake BMC (nodewarden_doubles.fakebmc) covers
only what sushy-tools cannot do.
"""

from __future__ import annotations

import ssl
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import bcrypt
import trustme
from pydantic import SecretStr

from nodewarden.redfish import RedfishEndpointConfig
from nodewarden_doubles.fakebmc import FakeBmc
from nodewarden_doubles.ports import unused_loopback_port

SUSHY_BIN = Path(sys.executable).with_name("sushy-emulator")
SUSHY_USER = "sushy-admin"
# Distinct, recognisable secrets: tests assert they never appear in logs or errors.
SUSHY_PASSWORD = "sushy-pw-" + uuid.uuid4().hex
FAKE_PASSWORD = "fakebmc-pw-" + uuid.uuid4().hex

# name -> initial power state. Each power-changing test owns one system.
SUSHY_SYSTEMS = {
    "node-read": "On",
    "node-shutdown": "On",
    "node-wake": "Off",
    "node-nmi": "On",
}


@dataclass
class SushyEmulator:
    """A running sushy-emulator subprocess and how to reach it."""

    endpoint: str
    ca_pem: str
    username: str
    password: str = field(repr=False)
    systems: dict[str, str]  # name -> uuid
    log_path: Path
    process: subprocess.Popen[bytes] = field(repr=False)

    def config(self, **overrides: Any) -> RedfishEndpointConfig:
        values: dict[str, Any] = {
            "endpoint": self.endpoint,
            "username": self.username,
            "password": SecretStr(self.password),
            "ca_bundle_pem": self.ca_pem,
            "request_timeout": 10.0,
        }
        values.update(overrides)
        return RedfishEndpointConfig(**values)

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def _answers(proc: subprocess.Popen[bytes], url: str, ca_pem: str) -> bool:
    """Poll the service root until it answers (True) or the process exits (False)."""
    context = ssl.create_default_context(cadata=ca_pem)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(url + "/redfish/v1/", context=context, timeout=2) as r:
                if r.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(0.1)  # readiness poll, bounded by the deadline
    raise TimeoutError(f"sushy-emulator did not answer on {url} within 60 s")


def start_sushy(base: Path, ca: trustme.CA) -> SushyEmulator:
    """Start sushy-emulator (fake driver, TLS from `ca`, bcrypt htpasswd) on 127.0.0.1."""
    ca_pem = ca.cert_pem.bytes().decode()
    cert = ca.issue_cert("127.0.0.1")
    cert_path, key_path = base / "server.pem", base / "server.key"
    cert.cert_chain_pems[0].write_to_path(str(cert_path))
    cert.private_key_pem.write_to_path(str(key_path))
    htpasswd = base / "htpasswd"
    digest = bcrypt.hashpw(SUSHY_PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()
    htpasswd.write_text(f"{SUSHY_USER}:{digest}\n")
    systems = {name: str(uuid.uuid4()) for name in SUSHY_SYSTEMS}
    fake_systems = [
        {
            "uuid": systems[name],
            "name": name,
            "power_state": power,
            "nics": [{"mac": f"52:54:00:00:00:{i:02x}", "ip": "127.0.0.1"}],
        }
        for i, (name, power) in enumerate(SUSHY_SYSTEMS.items(), start=1)
    ]
    log_path = base / "sushy.log"
    for _attempt in range(3):  # the free port may be taken between probe and bind
        port = unused_loopback_port()
        state_dir = base / f"state-{port}"
        state_dir.mkdir()
        config = base / "sushy.conf"
        config.write_text(
            "\n".join(
                [
                    "SUSHY_EMULATOR_LISTEN_IP = '127.0.0.1'",
                    f"SUSHY_EMULATOR_LISTEN_PORT = {port}",
                    "SUSHY_EMULATOR_FAKE_DRIVER = True",
                    f"SUSHY_EMULATOR_FAKE_SYSTEMS = {fake_systems!r}",
                    f"SUSHY_EMULATOR_STATE_DIR = {str(state_dir)!r}",
                    f"SUSHY_EMULATOR_AUTH_FILE = {str(htpasswd)!r}",
                    f"SUSHY_EMULATOR_SSL_CERT = {str(cert_path)!r}",
                    f"SUSHY_EMULATOR_SSL_KEY = {str(key_path)!r}",
                    "",
                ]
            )
        )
        with log_path.open("ab") as log:
            proc = subprocess.Popen(
                [str(SUSHY_BIN), "--config", str(config)],
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=base,
            )
        endpoint = f"https://127.0.0.1:{port}"
        try:
            ready = _answers(proc, endpoint, ca_pem)
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        if ready:
            return SushyEmulator(
                endpoint, ca_pem, SUSHY_USER, SUSHY_PASSWORD, systems, log_path, proc
            )
        proc.wait()
    raise RuntimeError(f"sushy-emulator did not start:\n{log_path.read_text()[-2000:]}")


@dataclass
class FakeBmcRunning:
    """A started project fake BMC and a client config for it."""

    bmc: FakeBmc
    ca_pem: str

    def config(self, **overrides: Any) -> RedfishEndpointConfig:
        values: dict[str, Any] = {
            "endpoint": self.bmc.url,
            "username": self.bmc.options.username,
            "password": SecretStr(self.bmc.options.password),
            "ca_bundle_pem": self.ca_pem,
            "request_timeout": 5.0,
        }
        values.update(overrides)
        return RedfishEndpointConfig(**values)


StartFakeBmc = Callable[..., Awaitable[FakeBmcRunning]]
"""The `fake_bmc` fixture: start a fake BMC with the given FakeBmcOptions fields."""
