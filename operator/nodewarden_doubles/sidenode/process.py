"""Run the side-node process as a subprocess, and talk to its admin API (tests, demos).

    with SideNodeProcess(config, workdir=tmp_path) as side:
        side.known_hosts_line("gpu-a100-01")      # for the known_hosts Secret
        side.redfish_config("gpu-a100-01")        # RedfishEndpointConfig (password from config)
        side.admin.set_faults("gpu-a100-01", shutdown_inhibitor=True)
        side.admin.wait_for("gpu-a100-01", lambda n: n["ready"], timeout=10)

`start()` writes the config (mode 0600) to ``<workdir>/sidenode.yaml``, starts
``python -m nodewarden_doubles.sidenode --config ... --state-dir <workdir>/state
--exit-with-parent`` with its log in ``<workdir>/sidenode.log``, and polls (deadline,
no fixed sleep) until ``state.json`` appears or the process exits. `stop()` sends
SIGTERM (SIGKILL after a timeout); it is also registered with `atexit`, and the child
exits by itself when its parent is gone.

`SideNodeAdmin` is a small synchronous client of the admin API; from async code call
it through `asyncio.to_thread`.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import requests
import yaml
from pydantic import SecretBytes, SecretStr

from nodewarden.redfish import RedfishEndpointConfig
from nodewarden.ssh.addressing import Endpoint
from nodewarden_doubles.sidenode.config import SideNodeFileConfig
from nodewarden_doubles.sidenode.server import STATE_FILE, TOKEN_FILE

MODULE = "nodewarden_doubles.sidenode"


class SideNodeProcessError(RuntimeError):
    """The side-node process did not start, or an admin call failed."""


class SideNodeAdmin:
    """Synchronous client of the side-node admin API (see `nodewarden_doubles.sidenode.server`)."""

    def __init__(self, url: str, token: SecretStr, *, timeout: float = 10.0) -> None:
        if not url.startswith("http://127.0.0.1:"):
            raise ValueError(f"the side-node admin API is on 127.0.0.1 only, not {url!r}")
        self.url = url.rstrip("/")
        self._token = token
        self._timeout = timeout
        self._session = requests.Session()

    def __repr__(self) -> str:
        return f"SideNodeAdmin({self.url!r})"

    def close(self) -> None:
        self._session.close()

    def _call(self, method: str, path: str, body: Mapping[str, Any] | None = None) -> Any:
        response = self._session.request(
            method,
            self.url + path,
            json=body,
            headers={"Authorization": f"Bearer {self._token.get_secret_value()}"},
            timeout=self._timeout,
        )
        if response.status_code >= 300:
            raise SideNodeProcessError(
                f"side-node admin {method} {path}: HTTP {response.status_code} {response.text[:300]}"
            )
        return response.json()

    def health(self) -> bool:
        try:
            return self._session.get(self.url + "/healthz", timeout=self._timeout).ok
        except requests.RequestException:
            return False

    def state(self) -> dict[str, Any]:
        """The state file's content."""
        result: dict[str, Any] = self._call("GET", "/admin/state")
        return result

    def nodes(self) -> list[dict[str, Any]]:
        return list(self._call("GET", "/admin/nodes")["nodes"])

    def node(self, name: str) -> dict[str, Any]:
        """Live state: power, os (off/booting/up/halted), ssh, ready, uptime, faults, ..."""
        result: dict[str, Any] = self._call("GET", f"/admin/nodes/{name}")
        return result

    def set_power(self, name: str, state: str) -> dict[str, Any]:
        """Switch the node's power source directly ("On" / "Off")."""
        result: dict[str, Any] = self._call("POST", f"/admin/nodes/{name}/power", {"state": state})
        return result

    def set_faults(self, name: str, **changes: object) -> dict[str, Any]:
        """`SideNodeFaults` fields: ready_fails_after_wake, shutdown_inhibitor,
        ssh_unreachable ("no" / "refused" / "partitioned"), ignore_wake."""
        result: dict[str, Any] = self._call("PATCH", f"/admin/nodes/{name}/faults", changes)
        return result

    def set_worker_faults(self, name: str, **changes: object) -> dict[str, Any]:
        """The stub worker's `StubFaults` fields (freeze, hang_commands, command_delay, ...)."""
        result: dict[str, Any] = self._call("PATCH", f"/admin/nodes/{name}/worker-faults", changes)
        return result

    def set_bmc(self, name: str, **changes: object) -> dict[str, Any]:
        """The fake BMC's `FakeBmcOptions` fields (never_apply, unavailable_reads, ...)."""
        result: dict[str, Any] = self._call("PATCH", f"/admin/nodes/{name}/bmc", changes)
        return result

    def bmc_log(self, name: str) -> dict[str, Any]:
        """The fake BMC's request and reset records (fake-BMC nodes only)."""
        result: dict[str, Any] = self._call("GET", f"/admin/nodes/{name}/bmc-log")
        return result

    def events(self, name: str) -> list[dict[str, Any]]:
        return list(self._call("GET", f"/admin/nodes/{name}/events")["events"])

    def runs(self, name: str) -> list[dict[str, Any]]:
        """The node's run ledger (start, end, owner of every run, reboots included)."""
        return list(self._call("GET", f"/admin/nodes/{name}/runs")["runs"])

    def start_run(
        self,
        name: str,
        config: dict[str, Any],
        dispatcher_id: str | None = None,
        uid: str | None = None,
    ) -> int:
        """Start a run on the node directly (as another install, or an older operator
        without an owner, would); its pid."""
        body: dict[str, Any] = {"config": config}
        if dispatcher_id is not None:
            body["dispatcherId"] = dispatcher_id
        if uid is not None:
            body["uid"] = uid
        return int(self._call("POST", f"/admin/nodes/{name}/runs", body)["pid"])

    def wol_packets(self) -> list[dict[str, Any]]:
        return list(self._call("GET", "/admin/wol/packets")["packets"])

    def wait_for(
        self,
        name: str,
        predicate: Callable[[dict[str, Any]], bool],
        timeout: float,
        interval: float = 0.05,
    ) -> dict[str, Any]:
        """Poll the node's state until ``predicate`` holds; SideNodeProcessError at the deadline."""
        deadline = time.monotonic() + timeout
        while True:
            state = self.node(name)
            if predicate(state):
                return state
            if time.monotonic() >= deadline:
                raise SideNodeProcessError(
                    f"side node {name!r}: condition not met within {timeout:g} s; last state: "
                    f"power={state['power']} os={state['os']} ready={state['ready']}"
                )
            time.sleep(interval)


class SideNodeProcess:
    """The side-node process on loopback (see the module docstring)."""

    def __init__(
        self,
        config: SideNodeFileConfig | Mapping[str, Any],
        *,
        workdir: Path | None = None,
        log_level: str = "INFO",
        startup_timeout: float = 60.0,
        python: str = sys.executable,
        env: Mapping[str, str] | None = None,
        new_session: bool = False,
    ) -> None:
        """``new_session``: run the child in a session of its own, so that a terminal's
        Ctrl-C reaches only the caller, which then stops it in its own order (the demo)."""
        if not isinstance(config, SideNodeFileConfig):
            config = SideNodeFileConfig.model_validate(config)
        self.config = config
        self._workdir = workdir
        self._log_level = log_level
        self._startup_timeout = startup_timeout
        self._python = python
        self._env = dict(env) if env is not None else None
        self._new_session = new_session
        self.workdir: Path | None = None
        self.process: subprocess.Popen[bytes] | None = None
        self.state: dict[str, Any] = {}
        self._admin: SideNodeAdmin | None = None
        self._token: SecretStr | None = None

    def __repr__(self) -> str:
        pid = self.process.pid if self.process is not None else None
        return f"SideNodeProcess(pid={pid}, admin={self.state.get('admin_url')!r})"

    # ---- lifecycle ----------------------------------------------------------------------

    def start(self) -> SideNodeProcess:
        if self.process is not None:
            raise SideNodeProcessError("already started")
        workdir = self._workdir or Path(tempfile.mkdtemp(prefix="nodewarden-sidenodes-"))
        workdir.mkdir(parents=True, exist_ok=True)
        self.workdir = workdir
        config_path = workdir / "sidenode.yaml"
        fd = os.open(config_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            yaml.safe_dump(self.config.file_data(), out, sort_keys=False)
        (self.state_dir / STATE_FILE).unlink(missing_ok=True)
        command = [
            self._python,
            "-m",
            MODULE,
            "--config",
            str(config_path),
            "--state-dir",
            str(self.state_dir),
            "--log-level",
            self._log_level,
            "--exit-with-parent",
        ]
        with open(self.log_path, "ab") as log, open(workdir / "sidenode.out", "ab") as out_file:
            self.process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=out_file,
                stderr=log,
                env=self._env,
                cwd=workdir,
                start_new_session=self._new_session,
            )
        atexit.register(self._kill_at_exit)
        try:
            self._wait_ready()
        except BaseException:
            self.stop(timeout=10)
            raise
        return self

    def _wait_ready(self) -> None:
        assert self.process is not None
        state_file = self.state_dir / STATE_FILE
        deadline = time.monotonic() + self._startup_timeout
        while not state_file.exists():
            if self.process.poll() is not None:
                raise SideNodeProcessError(
                    f"the side-node process exited with {self.process.returncode} before it "
                    f"was up; its log:\n{self.log_text()[-3000:]}"
                )
            if time.monotonic() >= deadline:
                raise SideNodeProcessError(
                    f"the side-node process was not up within {self._startup_timeout:g} s; "
                    f"its log:\n{self.log_text()[-3000:]}"
                )
            time.sleep(0.02)  # readiness poll, bounded by the deadline
        self.state = json.loads(state_file.read_text())
        self._token = SecretStr((self.state_dir / TOKEN_FILE).read_text().strip())

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM, wait up to ``timeout``, then SIGKILL; returns the exit code."""
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
        atexit.unregister(self._kill_at_exit)
        if self._admin is not None:
            self._admin.close()
            self._admin = None
        return process.returncode

    def _kill_at_exit(self) -> None:
        process = self.process
        if process is not None and process.poll() is None:
            process.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(5)

    def __enter__(self) -> SideNodeProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- what callers need --------------------------------------------------------------

    @property
    def state_dir(self) -> Path:
        assert self.workdir is not None, "not started"
        return self.workdir / "state"

    @property
    def log_path(self) -> Path:
        assert self.workdir is not None, "not started"
        return self.workdir / "sidenode.log"

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    @property
    def admin(self) -> SideNodeAdmin:
        if self._token is None:
            raise SideNodeProcessError("not started")
        if self._admin is None:
            self._admin = SideNodeAdmin(str(self.state["admin_url"]), self._token)
        return self._admin

    def node_info(self, name: str) -> dict[str, Any]:
        """The node's entry of the state file (ssh, host key, mac, power source)."""
        try:
            info: dict[str, Any] = self.state["nodes"][name]
        except KeyError:
            raise KeyError(f"no side node named {name!r}") from None
        return info

    def endpoint(self, name: str) -> Endpoint:
        ssh = self.node_info(name)["ssh"]
        return Endpoint(str(ssh["host"]), int(ssh["port"]))

    def known_hosts_line(self, name: str) -> str:
        return str(self.node_info(name)["known_hosts_line"])

    @property
    def wol_port(self) -> int:
        return int(self.state["wol"]["port"])

    def secure_on(self, name: str) -> SecretBytes | None:
        """The node's SecureOn password, from the config held in memory (never the state file)."""
        for node in self.config.nodes:
            if node.name == name:
                return node.secure_on_bytes
        raise KeyError(f"no side node named {name!r}")

    def redfish_config(self, name: str, **overrides: Any) -> RedfishEndpointConfig:
        """How the operator would reach the node's BMC (credentials from the config)."""
        power = self.node_info(name)["power"]
        if power["source"] not in ("fakebmc", "sushy") or self.config.bmc is None:
            raise SideNodeProcessError(f"side node {name!r} has no BMC ({power['source']})")
        values: dict[str, Any] = {
            "endpoint": power["endpoint"],
            "username": self.config.bmc.username,
            "password": self.config.bmc.password,
            "system_id": power["system_id"],
            "ca_bundle_pem": self.state["bmc_ca_pem"],
            "request_timeout": 10.0,
        }
        values.update(overrides)
        return RedfishEndpointConfig(**values)
