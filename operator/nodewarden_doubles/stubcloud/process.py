"""Run a stub cloud server as a subprocess, and talk to its admin API (for tests and demos).

    with StubCloudProcess(StubServerConfig(instance_types=types), workdir=tmp_path) as stub:
        facade = build_cloud(stub.cloud_config(), stub.cloud_credentials(), "disp-a")
        ...
        stub.admin.set_faults(instance_quota=5)
        vms = stub.admin.vms()

`StubCloudProcess.start()` writes the config (mode 0600) into a work directory, starts
``python -m nodewarden_doubles.stubcloud.server --listen 127.0.0.1:0 --exit-with-parent`` with
its stderr (the server's log) in ``<workdir>/stub-cloud.log``, and waits for the ready
line. `stop()` sends SIGTERM (then SIGKILL after a timeout) and reaps the process; it is
also registered with `atexit`, and the server itself exits when its parent is gone, so
no server outlives the test run that started it.

`StubCloudAdmin` is a small synchronous client of the admin endpoints (see
`nodewarden_doubles.stubcloud.server`); from async code call it through `asyncio.to_thread`.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests
import yaml
from pydantic import SecretStr

from nodewarden.cloud.config import CloudConfig, CloudCredentials
from nodewarden.ssh.addressing import Endpoint
from nodewarden_doubles.stubcloud.cloud import StubVMView
from nodewarden_doubles.stubcloud.faults import StubFaults
from nodewarden_doubles.stubcloud.serverconfig import StubServerConfig
from nodewarden_doubles.stubcloud.wire import loopback_base_url, vm_from_json

SERVER_MODULE = "nodewarden_doubles.stubcloud.server"


class StubCloudProcessError(RuntimeError):
    """The stub cloud server did not start, or an admin call failed."""


@dataclass(frozen=True)
class AdminVM(StubVMView):
    """A VM as the admin API lists it (current tags, not the possibly stale API view):
    the API view plus its SSH server's port (None until it listens, or after power-off)."""

    host_public_key: str | None = None
    """The VM's genuine SSH host public key ('ssh-ed25519 AAAA...'), once it listens."""
    worker: dict[str, Any] | None = field(default=None, compare=False)
    """`vm()` only: the worker's faults, running containers and counters."""

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> AdminVM:
        view = dataclasses.asdict(vm_from_json(data))
        view.update(
            port=int(data["port"]) if data.get("port") is not None else None,
            broken=bool(data.get("broken")),
            hung=bool(data.get("hung")),
        )
        return cls(**view, host_public_key=data.get("host_public_key"), worker=data.get("worker"))

    @property
    def endpoint(self) -> Endpoint | None:
        return Endpoint("127.0.0.1", self.port) if self.port is not None else None

    @property
    def running_containers(self) -> list[str]:
        """uuids of the containers running on the VM (from `vm()`; [] from `vms()`)."""
        running = (self.worker or {}).get("running") or []
        return [str(c["uuid"]) for c in running]


class StubCloudAdmin:
    """Synchronous client of a stub cloud server's admin endpoints."""

    def __init__(self, url: str, token: SecretStr | str, *, timeout: float = 10.0) -> None:
        loopback_base_url(url)
        self.url = url.rstrip("/")
        self._token = token if isinstance(token, SecretStr) else SecretStr(token)
        self._timeout = timeout
        self._session = requests.Session()

    def __repr__(self) -> str:
        return f"StubCloudAdmin({self.url!r})"

    def close(self) -> None:
        self._session.close()

    def _call(
        self,
        method: str,
        path: str,
        *,
        body: dict[str, Any] | None = None,
        params: Mapping[str, str] | None = None,
        allow_404: bool = False,
    ) -> Any:
        response = self._session.request(
            method,
            self.url + path,
            json=body,
            params=params,
            headers={"Authorization": f"Bearer {self._token.get_secret_value()}"},
            timeout=self._timeout,
        )
        if allow_404 and response.status_code == 404:
            return None
        if response.status_code >= 300:
            raise StubCloudProcessError(
                f"stub cloud admin {method} {path}: HTTP {response.status_code} {response.text[:300]}"
            )
        return response.json()

    def health(self) -> bool:
        try:
            response = self._session.get(self.url + "/healthz", timeout=self._timeout)
        except requests.RequestException:
            return False
        return response.status_code == 200

    def faults(self) -> StubFaults:
        return StubFaults.model_validate(self._call("GET", "/admin/faults"))

    def set_faults(self, **changes: object) -> StubFaults:
        """Change the cloud's fault knobs (`StubFaults` field names)."""
        return StubFaults.model_validate(self._call("PATCH", "/admin/faults", body=changes))

    def force_rate_limit(self, calls: int, retry_after: float | None = None) -> None:
        """Refuse the next `calls` API calls as rate limited (with this Retry-After)."""
        self._call("POST", "/admin/rate-limit", body={"calls": calls, "retry_after": retry_after})

    def vms(self) -> list[AdminVM]:
        return [AdminVM.from_json(vm) for vm in self._call("GET", "/admin/vms")["vms"]]

    def vm(self, instance_id: str) -> AdminVM | None:
        """One VM with its worker's state (faults, running containers, counters)."""
        data = self._call("GET", f"/admin/vms/{instance_id}", allow_404=True)
        return AdminVM.from_json(data) if data is not None else None

    def set_worker_faults(self, instance_id: str, **changes: object) -> dict[str, Any]:
        """Change one VM's worker faults (`nodewarden_doubles.stubworker.StubFaults` field names:
        freeze, hang_connect, hang_commands, command_delay, refuse_auth, wrong_host_key,
        broken_ready, runner_crash_rate, runner_start_failure_rate, ...)."""
        result: dict[str, Any] = self._call(
            "PATCH", f"/admin/vms/{instance_id}/worker", body=changes
        )
        return result

    def poweroff(self, instance_id: str) -> None:
        """The VM powers itself off: its SSH server goes away, the cloud lists it stopped."""
        self._call("POST", f"/admin/vms/{instance_id}/poweroff")

    def resolve(self, address: str) -> Endpoint | None:
        data = self._call("GET", "/admin/resolve", params={"address": address}, allow_404=True)
        return Endpoint(str(data["host"]), int(data["port"])) if data is not None else None

    def runs(self) -> list[dict[str, Any]]:
        """Every runner start on every VM, destroyed VMs included: instanceId, uuid, pid."""
        data: dict[str, Any] = self._call("GET", "/admin/runs")
        return list(data["runs"])

    def stats(self) -> dict[str, Any]:
        """API call counts, VM count, VMs with a listening SSH server, server pid and RSS."""
        result: dict[str, Any] = self._call("GET", "/admin/stats")
        return result

    def wait_for_workers(self, count: int, timeout: float, interval: float = 0.05) -> int:
        """Poll until `count` VMs have a listening SSH server (or timeout); how many do."""
        deadline = time.monotonic() + timeout
        while True:
            listening = int(self.stats()["listening"])
            if listening >= count or time.monotonic() >= deadline:
                return listening
            time.sleep(interval)


class StubCloudProcess:
    """A stub cloud server subprocess on a free loopback port (see the module docstring)."""

    def __init__(
        self,
        config: StubServerConfig | Mapping[str, Any] | None = None,
        *,
        workdir: Path | None = None,
        log_level: str = "INFO",
        startup_timeout: float = 30.0,
        python: str = sys.executable,
        env: Mapping[str, str] | None = None,
        new_session: bool = False,
    ) -> None:
        """``new_session``: run the child in a session of its own, so that a terminal's
        Ctrl-C reaches only the caller, which then stops it in its own order (the demo)."""
        if config is None:
            config = StubServerConfig()
        elif not isinstance(config, StubServerConfig):
            config = StubServerConfig.model_validate(config)
        self.config = config
        self._given_workdir = workdir
        self._log_level = log_level
        self._startup_timeout = startup_timeout
        self._python = python
        self._env = dict(env) if env is not None else None
        self._new_session = new_session
        self.workdir: Path | None = None
        self.process: subprocess.Popen[bytes] | None = None
        self.url: str = ""
        self.pid: int | None = None
        self._token: SecretStr | None = None
        self._admin: StubCloudAdmin | None = None
        self._final_log: str | None = None

    def __repr__(self) -> str:
        return f"StubCloudProcess(url={self.url!r}, pid={self.pid})"

    # ---- lifecycle -------------------------------------------------------------------------

    def start(self) -> StubCloudProcess:
        if self.process is not None:
            raise StubCloudProcessError("already started")
        workdir = self._given_workdir or Path(tempfile.mkdtemp(prefix="nodewarden-stub-cloud-"))
        workdir.mkdir(parents=True, exist_ok=True)
        self.workdir = workdir
        config_path = workdir / "stub-cloud.yaml"
        fd = os.open(config_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            yaml.safe_dump(self.config.file_data(), out, sort_keys=False)
        ready = workdir / "stub-cloud.ready"
        ready.unlink(missing_ok=True)
        command = [
            self._python,
            "-m",
            SERVER_MODULE,
            "--config",
            str(config_path),
            "--listen",
            "127.0.0.1:0",
            "--ready-file",
            str(ready),
            "--log-level",
            self._log_level,
            "--exit-with-parent",
        ]
        with (
            open(self.log_path, "ab") as log_file,
            open(workdir / "stub-cloud.out", "ab") as out_file,
        ):
            self.process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=out_file,
                stderr=log_file,
                env=self._env,
                cwd=workdir,
                start_new_session=self._new_session,
            )
        self.pid = self.process.pid
        atexit.register(self._kill_at_exit)
        try:
            info = self._wait_ready(ready)
        except BaseException:
            self.stop(timeout=5)
            raise
        self.url = str(info["url"])
        self._token = SecretStr(str(info["adminToken"]))
        return self

    def _wait_ready(self, ready: Path) -> dict[str, Any]:
        assert self.process is not None
        deadline = time.monotonic() + self._startup_timeout
        while time.monotonic() < deadline:
            if ready.exists():
                text = ready.read_text().strip()
                if text:
                    info: dict[str, Any] = json.loads(text)
                    return info
            if self.process.poll() is not None:
                raise StubCloudProcessError(
                    f"the stub cloud server exited with {self.process.returncode} before it "
                    f"was ready; its log:\n{self.log_text()[-2000:]}"
                )
            time.sleep(0.02)
        raise StubCloudProcessError(
            f"the stub cloud server was not ready within {self._startup_timeout} s; its log:\n"
            f"{self.log_text()[-2000:]}"
        )

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM, wait up to `timeout`, then SIGKILL; returns the exit code."""
        process = self.process
        if process is None:
            return None
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
        return self._finish()

    def kill(self) -> int | None:
        """SIGKILL (a crashed cloud: its SSH servers die with it)."""
        process = self.process
        if process is None:
            return None
        if process.poll() is None:
            process.kill()
            process.wait(10)
        return self._finish()

    def _finish(self) -> int | None:
        process = self.process
        code = process.returncode if process is not None else None
        atexit.unregister(self._kill_at_exit)
        if self._admin is not None:
            self._admin.close()
            self._admin = None
        if self._given_workdir is None and self.workdir is not None:
            self._final_log = self.log_text()
            shutil.rmtree(self.workdir, ignore_errors=True)
        return code

    def _kill_at_exit(self) -> None:
        process = self.process
        if process is not None and process.poll() is None:
            process.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(5)

    def __enter__(self) -> StubCloudProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    # ---- what callers need -----------------------------------------------------------------

    @property
    def log_path(self) -> Path:
        """The server's stderr (its log)."""
        assert self.workdir is not None, "not started"
        return self.workdir / "stub-cloud.log"

    def log_text(self) -> str:
        if self._final_log is not None:
            return self._final_log
        try:
            return self.log_path.read_text(errors="replace")
        except (OSError, AssertionError):
            return ""

    @property
    def admin_token(self) -> SecretStr:
        if self._token is None:
            raise StubCloudProcessError("not started")
        return self._token

    @property
    def admin(self) -> StubCloudAdmin:
        if self._admin is None:
            self._admin = StubCloudAdmin(self.url, self.admin_token)
        return self._admin

    def cloud_credentials(self) -> CloudCredentials | None:
        """The credentials the server accepts, as the operator would hold them."""
        creds = self.config.credentials
        if creds is None:
            return None
        return CloudCredentials(key=creds.key, secret=creds.secret)

    def cloud_config(self, **changes: Any) -> CloudConfig:
        """A `CloudConfig` for this server (its catalogue, image "stub-image"); `changes`
        override fields (e.g. ops_per_second=0, max_concurrent_creates=0)."""
        settings: dict[str, Any] = {
            "driver": "nodewarden-stub",
            "driver_plugin": "nodewarden_doubles.stubcloud:plugin",
            "driver_params": {"cloud": self.url},
            "image": "stub-image",
            "instance_types": list(self.config.instance_types),
        }
        settings.update(changes)
        return CloudConfig(**settings)
