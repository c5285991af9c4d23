"""The side-node process: N side nodes, their BMCs and one WoL listener, with an admin API on loopback.

    python -m nodewarden_doubles.sidenode --config FILE --state-dir DIR
        [--admin-listen 127.0.0.1:0] [--log-level INFO] [--log-format json|text]
        [--exit-with-parent]

Starts, all on 127.0.0.1: a throwaway CA and server certificate (``DIR/tls``) used by
every BMC; one project fake BMC per ``fakebmc`` node; one sushy-tools emulator
(subprocess, ``DIR/sushy``) holding a system per ``sushy`` node; the Wake-on-LAN
listener; every node's SSH server while its power is On (host keys kept in
``DIR/hostkeys`` so a restarted process presents the same keys); the admin API.

Then writes ``DIR/admin-token`` (mode 0600) and, last and atomically, ``DIR/state.json``
(no secrets: ports, BMC endpoints and CA certificate, BMC user name, host keys and
known_hosts lines, MACs, WoL port, admin URL), and prints one JSON line
``{"state_file", "admin_url", "pid"}``. Serves until SIGTERM / SIGINT (or, with
``--exit-with-parent``, until its parent is gone).

Admin API (``Authorization: Bearer <admin token>``; `SideNodeAdmin` wraps it):

| method | path                               | what |
|--------|------------------------------------|------|
| GET    | /healthz                           | no auth: ``{"ok": true}`` |
| GET    | /admin/state                       | the state file's content |
| GET    | /admin/nodes                       | every node's live state (power, os, ssh, ready, uptime, faults, containers) |
| GET    | /admin/nodes/{name}                | one node's live state |
| POST   | /admin/nodes/{name}/power          | ``{"state": "On"|"Off"}``: switch the power source directly |
| PATCH  | /admin/nodes/{name}/faults         | `SideNodeFaults` fields |
| PATCH  | /admin/nodes/{name}/worker-faults  | the stub worker's `StubFaults` fields |
| PATCH  | /admin/nodes/{name}/bmc            | the fake BMC's `FakeBmcOptions` fields (not credentials) |
| GET    | /admin/nodes/{name}/bmc-log        | fake BMC request and reset records (409 for other nodes) |
| GET    | /admin/nodes/{name}/events         | the node's power / SSH event log |
| GET    | /admin/nodes/{name}/runs           | the node's run ledger, reboots included: uuid, pid, start and end (`startedAt`, `endedAt`, `end`: exited/killed/lost/powerLoss, null while running), owner (`dispatcherId`, `uid`, `fence`) |
| POST   | /admin/nodes/{name}/runs           | start a run directly, as another install or an older operator would (`{"config": {...}, "dispatcherId"?, "uid"?, "fence"?}`) |
| GET    | /admin/wol/packets                 | every datagram the WoL listener received |

Input mistakes get 400 with the field named (values never echoed); unknown nodes 404.
The BMC password, SecureOn passwords and the admin token are registered with the log
redactor and never written anywhere but the 0600 token file (the token) and the
0600 config file the caller wrote.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import hmac
import json
import logging
import os
import secrets
import signal
import sys
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import asyncssh
import yaml
from aiohttp import web
from pydantic import SecretStr, ValidationError

from nodewarden.logs import register_secret, setup_logging
from nodewarden_doubles.fakebmc import FakeBmc, write_loopback_certificate
from nodewarden_doubles.sidenode.config import NodeFileConfig, SideNodeFileConfig
from nodewarden_doubles.sidenode.group import SideNodeGroup
from nodewarden_doubles.sidenode.node import (
    PoweredSideNode,
    SideNodeSettings,
    validation_problems,
)
from nodewarden_doubles.sidenode.power import (
    POWER_VALUES,
    FakeBmcPower,
    PowerSource,
    SushyPower,
    WolPower,
)
from nodewarden_doubles.sidenode.sushy import SushyEmulator, SushySystem
from nodewarden_doubles.stubworker import RunnerRefused, StubWorkerConfig

log = logging.getLogger("nodewarden_doubles.sidenode.server")

STATE_FILE = "state.json"
TOKEN_FILE = "admin-token"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _json(data: object, status: int = 200) -> web.Response:
    return web.Response(
        text=json.dumps(data, separators=(",", ":")), status=status, content_type="application/json"
    )


def _error(status: int, message: str) -> web.Response:
    return _json({"error": message}, status)


def _write_private(path: Path, text: str, mode: int = 0o600) -> None:
    """Write atomically with ``mode`` (readers never see a half-written file)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as out:
        out.write(text)
    os.replace(tmp, path)


def _host_key(directory: Path, name: str) -> asyncssh.SSHKey:
    """The node's host key, kept across process restarts in the state directory."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    if path.exists():
        return asyncssh.read_private_key(path)
    key = asyncssh.generate_private_key("ssh-ed25519")
    _write_private(path, key.export_private_key("openssh").decode())
    return key


class SideNodeServer:
    """Everything the process runs (see the module docstring)."""

    def __init__(
        self, config: SideNodeFileConfig, state_dir: Path, *, admin_token: SecretStr
    ) -> None:
        self.config = config
        self.state_dir = state_dir
        self._admin_token = admin_token
        self.bmcs: dict[str, FakeBmc] = {}
        self.sushy: SushyEmulator | None = None
        self._session: aiohttp.ClientSession | None = None
        self.group: SideNodeGroup | None = None
        self._runner: web.AppRunner | None = None
        self.admin_url = ""
        self.ca_pem = ""
        self.ca_file = state_dir / "tls" / "ca.pem"

    # ---- lifecycle -------------------------------------------------------------------

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> dict[str, Any]:
        """Start everything; returns the state (also written to ``state.json``)."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        try:
            nodes = await self._build_nodes()
            self.group = SideNodeGroup(
                nodes, wol_port=self.config.wol_port, tick_interval=self.config.tick_interval
            )
            await self.group.start()
            await self._serve_admin(host, port)
        except BaseException:
            await self.stop()
            raise
        state = self.state()
        _write_private(self.state_dir / TOKEN_FILE, self._admin_token.get_secret_value() + "\n")
        _write_private(self.state_dir / STATE_FILE, json.dumps(state, indent=2) + "\n", 0o644)
        log.info(
            "side nodes up",
            extra={
                "side_nodes": len(nodes),
                "admin_url": self.admin_url,
                "wol_port": self.group.wol.port,
            },
        )
        return state

    async def stop(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()
        group, self.group = self.group, None
        if group is not None:
            await group.stop()
        for bmc in self.bmcs.values():
            await bmc.stop()
        self.bmcs.clear()
        if self._session is not None:
            await self._session.close()
            self._session = None
        sushy, self.sushy = self.sushy, None
        if sushy is not None:
            await sushy.stop()

    async def _build_nodes(self) -> list[PoweredSideNode]:
        config = self.config
        extra = [config.advertise_address] if config.advertise_address else []
        context, self.ca_pem = write_loopback_certificate(self.state_dir / "tls", extra)
        sushy_ids = {n.name: str(uuid.uuid4()) for n in config.nodes if n.power == "sushy"}
        if sushy_ids:
            await self._start_sushy(sushy_ids)
        nodes: list[PoweredSideNode] = []
        for node in config.nodes:
            source: PowerSource
            # the host's DMI product UUID is its BMC system's UUID (a machine without a
            # BMC still has one, from its name)
            product_uuid = str(uuid.uuid5(uuid.NAMESPACE_URL, f"nodewarden-sidenode:{node.name}"))
            if node.power in ("fakebmc", "wol+bmc"):
                assert config.bmc is not None
                bmc = FakeBmc(node.bmc_options(config.bmc), ssl_context=context)
                await bmc.start()
                self.bmcs[node.name] = bmc
                source = FakeBmcPower(bmc, node.system_id)
                product_uuid = bmc.system_uuid(node.system_id)
            elif node.power == "sushy":
                product_uuid = sushy_ids[node.name]
                assert config.bmc is not None and self.sushy is not None
                source = SushyPower(
                    self.sushy.endpoint,
                    sushy_ids[node.name],
                    username=config.bmc.username,
                    password=config.bmc.password,
                    ca_pem=self.ca_pem,
                    interval=config.sushy_poll_interval,
                    session=self._session,
                )
            else:
                source = WolPower(node.initial_power)
            nodes.append(PoweredSideNode(self._settings(node, product_uuid), source))
        return nodes

    async def _start_sushy(self, ids: dict[str, str]) -> None:
        config = self.config
        assert config.bmc is not None
        systems = [
            SushySystem(ids[n.name], n.name, n.initial_power, n.mac or "52:54:00:00:00:01")
            for n in config.nodes
            if n.name in ids
        ]
        tls = self.state_dir / "tls"
        self.sushy = SushyEmulator(
            self.state_dir / "sushy",
            systems,
            username=config.bmc.username,
            password=config.bmc.password,
            cert_file=tls / "server.pem",
            key_file=tls / "server.key",
            ca_pem=self.ca_pem,
            command=config.sushy_command,
        )
        await self.sushy.start()
        self._session = aiohttp.ClientSession()

    def _settings(self, node: NodeFileConfig, product_uuid: str) -> SideNodeSettings:
        worker = StubWorkerConfig(
            authorized_keys=tuple(self.config.authorized_keys),
            name=node.name,
            product_uuid=product_uuid,
            host_key=_host_key(self.state_dir / "hostkeys", node.name),
            interface=node.interface,
            wol_supported=node.wol_supported,
            wol_enabled=node.wol_enabled,
            gpu_utilisation=(0.0,) * node.gpus if node.gpus else None,
            faults=node.worker_faults,
        )
        return SideNodeSettings(
            worker=worker,
            boot_delay=node.boot_delay,
            ready_delay=node.ready_delay,
            shutdown_delay=node.shutdown_delay,
            ssh_port=node.ssh_port,
            mac=node.mac,
            secure_on=node.secure_on_bytes,
            initial_uptime=node.initial_uptime,
            faults=node.faults,
        )

    # ---- views -----------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """What a demo or test needs to reach everything (no secrets)."""
        assert self.group is not None
        host = self.config.advertise_address or "127.0.0.1"
        nodes: dict[str, Any] = {}
        for node in self.group.nodes.values():
            power = node.source.describe()
            if "endpoint" in power:
                power["endpoint"] = self._advertised(power["endpoint"])
            nodes[node.name] = {
                "ssh": {"host": host, "port": node.port},
                "host_public_key": node.host_public_key,
                "known_hosts_line": node.known_hosts_line(host),
                "mac": node.mac,
                "secure_on": node.settings.secure_on is not None,
                "power": power,
                "product_uuid": node.settings.worker.product_uuid,
            }
        return {
            "name": self.config.name,
            "pid": os.getpid(),
            "admin_url": self.admin_url,
            "bmc_ca_pem": self.ca_pem,
            "bmc_ca_file": str(self.ca_file),
            "bmc_username": self.config.bmc.username if self.config.bmc else None,
            "wol": {"host": self.group.wol.host, "port": self.group.wol.port},
            "sushy": (
                {"endpoint": self._advertised(self.sushy.endpoint), "pid": self.sushy.pid}
                if self.sushy
                else None
            ),
            "nodes": nodes,
        }

    def _advertised(self, url: str) -> str:
        """A loopback URL of ours as callers reach it (`advertise_address`, if set)."""
        address = self.config.advertise_address
        if address is None:
            return url
        host = f"[{address}]" if ":" in address else address
        return url.replace("://127.0.0.1:", f"://{host}:", 1)

    # ---- admin API -------------------------------------------------------------------

    async def _serve_admin(self, host: str, port: int) -> None:
        app = web.Application(middlewares=[self._middleware], client_max_size=1 << 16)
        r = app.router
        r.add_get("/healthz", self._healthz)
        r.add_get("/admin/state", self._get_state)
        r.add_get("/admin/nodes", self._get_nodes)
        r.add_get("/admin/nodes/{name}", self._get_node)
        r.add_post("/admin/nodes/{name}/power", self._set_power)
        r.add_patch(
            "/admin/nodes/{name}/faults", self._patch("faults", lambda n, c: n.set_faults(**c))
        )
        r.add_patch(
            "/admin/nodes/{name}/worker-faults",
            self._patch("worker faults", lambda n, c: n.set_worker_faults(**c)),
        )
        r.add_patch(
            "/admin/nodes/{name}/bmc",
            self._patch("BMC options", lambda n, c: n.set_bmc_options(**c)),
        )
        r.add_get("/admin/nodes/{name}/bmc-log", self._bmc_log)
        r.add_get("/admin/nodes/{name}/events", self._events)
        r.add_get("/admin/nodes/{name}/runs", self._runs)
        r.add_post("/admin/nodes/{name}/runs", self._start_run)
        r.add_get("/admin/wol/packets", self._wol_packets)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, host, port)
        await site.start()
        self._runner = runner
        self.admin_url = f"http://{host}:{int(runner.addresses[0][1])}"

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path.startswith("/admin/"):
            scheme, _, token = request.headers.get("Authorization", "").partition(" ")
            expected = self._admin_token.get_secret_value().encode()
            if scheme.lower() != "bearer" or not hmac.compare_digest(
                token.strip().encode(), expected
            ):
                return _error(401, "admin token missing or wrong")
        try:
            return await handler(request)
        except web.HTTPException:
            raise
        except KeyError as exc:
            return _error(404, str(exc.args[0]) if exc.args else "not found")
        except ValidationError as exc:
            return _error(400, validation_problems(exc))
        except ValueError as exc:
            return _error(400, str(exc))
        except Exception:
            log.exception("side-node admin error", extra={"http_path": request.path})
            return _error(500, "the side-node admin API failed; see its log")

    def _node(self, request: web.Request) -> PoweredSideNode:
        assert self.group is not None
        return self.group.node(request.match_info["name"])

    @staticmethod
    async def _object(request: web.Request) -> dict[str, Any]:
        try:
            body = await request.json()
        except ValueError:
            raise ValueError("the request body is not JSON") from None
        if not isinstance(body, dict):
            raise ValueError("expected a JSON object")
        return body

    async def _healthz(self, request: web.Request) -> web.Response:
        return _json({"ok": True})

    async def _get_state(self, request: web.Request) -> web.Response:
        return _json(self.state())

    async def _get_nodes(self, request: web.Request) -> web.Response:
        assert self.group is not None
        return _json({"nodes": [node.state() for node in self.group.nodes.values()]})

    async def _get_node(self, request: web.Request) -> web.Response:
        return _json(self._node(request).state())

    async def _set_power(self, request: web.Request) -> web.Response:
        node = self._node(request)
        body = await self._object(request)
        state = body.get("state")
        if state not in POWER_VALUES or set(body) != {"state"}:
            raise ValueError('expected {"state": "On"} or {"state": "Off"}')
        await node.set_power(state)
        log.info("side node power set by admin", extra={"side_node": node.name, "power": state})
        return _json(node.state())

    def _patch(self, what: str, apply: Callable[[PoweredSideNode, dict[str, Any]], Any]) -> Handler:
        """A PATCH handler applying a JSON object of changes to one node."""

        async def handler(request: web.Request) -> web.Response:
            node = self._node(request)
            changes = await self._object(request)
            result = apply(node, changes)
            log.info(
                "side node %s changed",
                what,
                extra={"side_node": node.name, "fields": sorted(changes)},
            )
            return _json(result if isinstance(result, dict) else _asdict(result))

        return handler

    async def _bmc_log(self, request: web.Request) -> web.Response:
        node = self._node(request)
        bmc = self.bmcs.get(node.name)
        if bmc is None:
            return _error(409, f"side node {node.name!r} has no fake BMC ({node.source.kind})")
        return _json(
            {
                "requests": [_asdict(r) for r in bmc.requests],
                "resets": [_asdict(r) for r in bmc.resets],
                "logins": bmc.logins,
                "failed_logins": bmc.failed_logins,
            }
        )

    async def _events(self, request: web.Request) -> web.Response:
        return _json({"events": [e.as_json() for e in self._node(request).events]})

    async def _runs(self, request: web.Request) -> web.Response:
        # `monotonic` (the start) is kept for readers of the first form of this ledger
        runs = self._node(request).worker.runner.ledger()
        return _json({"runs": [{**run, "monotonic": run["startedAt"]} for run in runs]})

    async def _start_run(self, request: web.Request) -> web.Response:
        """Start a runner on the node as someone else would (another install, an older
        operator: ``dispatcherId`` absent = no owner recorded)."""
        node = self._node(request)
        body = await self._object(request)
        config = body.get("config")
        if not isinstance(config, dict) or set(body) - {"config", "dispatcherId", "uid", "fence"}:
            raise ValueError('expected {"config": {...}, "dispatcherId"?, "uid"?, "fence"?}')
        try:
            pid = node.worker.runner.start(
                json.dumps(config),
                dispatcher_id=body.get("dispatcherId"),
                uid=body.get("uid"),
                fence=body.get("fence"),
            )
        except RunnerRefused as exc:
            raise ValueError(str(exc)) from None
        return _json({"pid": pid})

    async def _wol_packets(self, request: web.Request) -> web.Response:
        assert self.group is not None
        return _json({"packets": [p.as_json() for p in self.group.wol.packets]})


def _asdict(value: Any) -> dict[str, Any]:
    return dataclasses.asdict(value)


def _yaml_problem(path: Path, exc: yaml.YAMLError) -> str:
    """Where the YAML is broken, without the snippet of the line (it may hold a secret)."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or "invalid YAML"
    if mark is None:
        return f"{path}: {problem}"
    return f"{path}: line {mark.line + 1}, column {mark.column + 1}: {problem}"


# ---- command line ---------------------------------------------------------------------


def _parse_listen(value: str) -> tuple[str, int]:
    host, _, port_text = value.rpartition(":")
    if host != "127.0.0.1" or not port_text.isdigit() or int(port_text) > 65535:
        raise ValueError(f"--admin-listen must be 127.0.0.1:PORT, got {value!r}")
    return host, int(port_text)


async def serve(
    config: SideNodeFileConfig,
    state_dir: Path,
    host: str,
    port: int,
    *,
    exit_with_parent: bool = False,
) -> int:
    token = config.admin_token or SecretStr(secrets.token_hex(24))
    register_secret(token.get_secret_value())
    if config.bmc is not None:
        register_secret(config.bmc.password.get_secret_value())
    for node in config.nodes:
        if node.secure_on is not None:
            register_secret(node.secure_on.get_secret_value())
    server = SideNodeServer(config, state_dir, admin_token=token)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    parent = os.getppid()
    await server.start(host, port)
    try:
        line = {
            "state_file": str(state_dir / STATE_FILE),
            "admin_url": server.admin_url,
            "pid": os.getpid(),
        }
        sys.stdout.write(json.dumps(line) + "\n")
        sys.stdout.flush()
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=0.5)
            if exit_with_parent and os.getppid() != parent:
                log.info("side-node process: parent gone, stopping")
                break
    finally:
        await server.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m nodewarden_doubles.sidenode",
        description="Run powered side nodes (stub SSH workers behind fake BMCs, sushy-tools "
        "or Wake-on-LAN) on 127.0.0.1, with an admin API.",
    )
    parser.add_argument("--config", type=Path, required=True, help="YAML/JSON config file")
    parser.add_argument(
        "--state-dir", type=Path, required=True, help="where state.json, TLS and keys go"
    )
    parser.add_argument("--admin-listen", default="127.0.0.1:0", help="127.0.0.1:PORT")
    parser.add_argument("--log-level", default="INFO")
    parser.add_argument("--log-format", choices=("text", "json"), default="json")
    parser.add_argument(
        "--exit-with-parent", action="store_true", help="stop when the parent process is gone"
    )
    args = parser.parse_args(argv)
    setup_logging(args.log_format, args.log_level.upper())
    try:
        host, port = _parse_listen(args.admin_listen)
        config = SideNodeFileConfig.from_file(args.config)
    except ValidationError as exc:
        parser.error(f"{args.config}: {validation_problems(exc)}")  # never echo values
    except yaml.YAMLError as exc:
        parser.error(_yaml_problem(args.config, exc))
    except (ValueError, OSError) as exc:
        parser.error(str(exc))
    return asyncio.run(
        serve(config, args.state_dir, host, port, exit_with_parent=args.exit_with_parent)
    )
