"""The stub cloud as its own process: one `StubCloud` behind a small JSON HTTP API on loopback.

    python -m nodewarden_doubles.stubcloud.server --config FILE [--listen 127.0.0.1:0]
        [--ready-file F] [--log-level INFO] [--log-format json|text] [--exit-with-parent]

Binds 127.0.0.1 (any 127.0.0.0/8 address; nothing else is accepted), then writes one
JSON line ``{"url": ..., "adminToken": ..., "pid": ...}`` to stdout and, atomically with
mode 0600, to ``--ready-file``. Serves until SIGTERM / SIGINT (or, with
``--exit-with-parent``, until the process that started it is gone), then stops every
VM's SSH server and exits 0. State lives in memory: when the server stops its VMs are
gone, like a cloud that was switched off.

The API (``/v1/...``, see `nodewarden_doubles.stubcloud.wire`) is what the libcloud driver
(`nodewarden_doubles.stubcloud.remote.RemoteStubNodeDriver`) calls; every request must be signed
with the configured credentials (401 ``AuthFailure`` otherwise). Errors carry the
status, code and Retry-After of the in-process stub's errors, so
`nodewarden.cloud.errors.classify` sees the same thing either way.

Admin endpoints (``Authorization: Bearer <admin token>``), for tests and demos
(`nodewarden_doubles.stubcloud.process.StubCloudAdmin` wraps them):

| method | path                          | what |
|--------|-------------------------------|------|
| GET    | /admin/faults                 | the cloud's `StubFaults` |
| PATCH  | /admin/faults                 | change fault knobs (JSON object of fields) |
| POST   | /admin/rate-limit             | `{"calls": N, "retry_after": S or null}`: refuse the next N calls |
| GET    | /admin/vms                    | every VM with state, tags (current), SSH port, host key, faults |
| GET    | /admin/vms/{id}               | one VM plus its worker: faults, running containers, counters |
| PATCH  | /admin/vms/{id}/worker        | change the VM worker's faults (freeze, hang_commands, broken_ready, runner_crash_rate, ...) |
| POST   | /admin/vms/{id}/poweroff      | the VM powers itself off (SSH server gone, state stopped) |
| GET    | /admin/resolve?address=A      | `{"host": "127.0.0.1", "port": P}` or 404 |
| GET    | /admin/stats                  | API call counts, VMs, VMs with a listening SSH server |

``GET /healthz`` answers without authentication. Neither the credentials, the admin
token nor user data are ever logged (they are also registered with the log redactor).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import hmac
import ipaddress
import json
import logging
import os
import resource
import secrets
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web
from libcloud.common.exceptions import BaseHTTPError
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError

from nodewarden.logs import register_secret, setup_logging
from nodewarden_doubles.stubcloud import wire
from nodewarden_doubles.stubcloud.cloud import StubCloud, StubVMView
from nodewarden_doubles.stubcloud.serverconfig import StubServerConfig
from nodewarden_doubles.stubworker import StubWorker

# Named after the module even when run with `python -m` (where __name__ is "__main__").
log = logging.getLogger("nodewarden_doubles.stubcloud.server")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class _CreateBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=255)
    size: str = Field(min_length=1)
    image: str = Field(min_length=1)
    user_data: SecretStr | None = None
    tags: dict[str, str] = Field(default_factory=dict)
    spot: bool = False


class _TagsBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tags: dict[str, str]


class _RateLimitBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    calls: int = Field(ge=0)
    retry_after: float | None = Field(default=None, ge=0)


def _json(data: object, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        text=json.dumps(data, separators=(",", ":")),
        status=status,
        content_type="application/json",
        headers=headers,
    )


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return _json(wire.error_body(message), status, headers)


def _invalid(exc: ValidationError) -> web.Response:
    # Never echo the input: a create body carries the user data (SSH key, instance secret).
    details = "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}"
        for e in exc.errors(include_input=False, include_url=False)
    )
    return _error(400, f"InvalidParameterValue: {details}")


class StubCloudServer:
    """One `StubCloud` and the aiohttp application serving it (see the module docstring)."""

    def __init__(self, config: StubServerConfig, *, admin_token: SecretStr) -> None:
        self.config = config
        self._admin_token = admin_token
        self._credentials = config.credential_pair()
        self.cloud = StubCloud(
            f"server-{config.name}-{os.getpid()}",
            faults=config.faults,
            catalogue=list(config.instance_types),
        )
        self._runner: web.AppRunner | None = None
        self.url: str | None = None

    # ---- lifecycle -------------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._middleware], client_max_size=1 << 20)
        r = app.router
        r.add_get("/healthz", self._healthz)
        r.add_get(wire.INSTANCES, self._list)
        r.add_post(wire.INSTANCES, self._create)
        r.add_post(wire.INSTANCES + "/{id}/tags", self._create_tags)
        r.add_delete(wire.INSTANCES + "/{id}/tags", self._delete_tags)
        r.add_delete(wire.INSTANCES + "/{id}", self._destroy)
        r.add_get(wire.INSTANCE_TYPES, self._instance_types)
        r.add_get(wire.ENDPOINTS, self._endpoints)
        r.add_get("/admin/faults", self._get_faults)
        r.add_patch("/admin/faults", self._set_faults)
        r.add_post("/admin/rate-limit", self._rate_limit)
        r.add_get("/admin/vms", self._admin_vms)
        r.add_get("/admin/vms/{id}", self._admin_vm)
        r.add_patch("/admin/vms/{id}/worker", self._admin_worker_faults)
        r.add_post("/admin/vms/{id}/poweroff", self._admin_poweroff)
        r.add_get("/admin/resolve", self._admin_resolve)
        r.add_get("/admin/stats", self._admin_stats)
        r.add_get("/admin/runs", self._admin_runs)
        return app

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Start the cloud and listen on host:port (loopback only); returns the base URL."""
        if not ipaddress.ip_address(host).is_loopback or ":" in host:
            raise ValueError(f"the stub cloud listens on 127.0.0.0/8 only, not {host!r}")
        self.cloud.start()
        runner = web.AppRunner(self.app(), access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, host, port, backlog=1024)
        await site.start()
        self._runner = runner
        bound_port = int(runner.addresses[0][1])
        self.url = f"http://{host}:{bound_port}"
        log.info(
            "stub cloud server listening",
            extra={
                "stub_cloud": self.config.name,
                "url": self.url,
                "credentials_checked": self._credentials is not None,
                "instance_types": len(self.config.instance_types),
            },
        )
        return self.url

    async def stop(self) -> None:
        """Stop serving, then stop every VM's SSH server and the cloud's loop."""
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()
        vms = len(self.cloud.vms())
        await asyncio.to_thread(self.cloud.close)
        log.info("stub cloud server stopped", extra={"stub_cloud": self.config.name, "vms": vms})

    # ---- middleware: authentication, error shapes, request log ----------------------------

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        started = time.perf_counter()
        path = request.path
        try:
            if path.startswith("/admin/"):
                denied = self._check_admin(request)
            elif path.startswith("/v1/"):
                denied = await self._check_signature(request)
            else:
                denied = None
            response = denied or await handler(request)
        except BaseHTTPError as exc:  # the stub cloud's own API errors
            retry_after = (exc.headers or {}).get("retry-after")
            headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
            response = _error(int(exc.code), str(exc.message), headers)
        except web.HTTPException as exc:
            response = _error(exc.status, f"InvalidAction: {exc.reason}")
        except ValidationError as exc:
            response = _invalid(exc)
        except ValueError as exc:
            response = _error(400, f"InvalidParameterValue: {exc}")
        except Exception:
            log.exception("stub cloud server error", extra={"http_path": path})
            response = _error(500, "InternalError: the stub cloud server failed")
        log.debug(
            "stub cloud request",
            extra={
                "http_method": request.method,
                "http_path": path,
                "http_status": response.status,
                "duration_ms": round((time.perf_counter() - started) * 1000, 2),
            },
        )
        return response

    def _check_admin(self, request: web.Request) -> web.Response | None:
        header = request.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        expected = self._admin_token.get_secret_value().encode()
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), expected):
            return _error(401, "AuthFailure: admin token missing or wrong")
        return None

    async def _check_signature(self, request: web.Request) -> web.Response | None:
        if self._credentials is None:
            return None
        body = await request.read()
        ok = wire.verify(
            wire.parse_authorization(request.headers.get("Authorization")),
            self._credentials,
            method=request.method,
            path=request.path,
            query=list(request.query.items()),
            body=body,
            now=time.time(),
        )
        if ok:
            return None
        log.info("stub cloud request refused: bad credentials", extra={"http_path": request.path})
        return _error(401, f"{wire.AUTH_FAILURE_CODE}: {wire.AUTH_FAILURE_MESSAGE}")

    # ---- API -----------------------------------------------------------------------------

    async def _healthz(self, request: web.Request) -> web.Response:
        return _json({"ok": True})

    async def _list(self, request: web.Request) -> web.Response:
        filters: dict[str, str | list[str]] = {}
        for key in request.query:
            values = request.query.getall(key)
            filters[key] = values[0] if len(values) == 1 else list(values)
        delay = self.cloud.faults.list_delay
        if delay > 0:
            await asyncio.sleep(delay)
        vms = self.cloud.api_list(filters)
        return _json({"instances": [wire.vm_to_json(vm) for vm in vms]})

    async def _create(self, request: web.Request) -> web.Response:
        body = _CreateBody.model_validate(await self._body(request))
        vm = self.cloud.api_create(
            name=body.name,
            size=body.size,
            image=body.image,
            user_data=body.user_data.get_secret_value() if body.user_data else None,
            tags=body.tags,
            spot=body.spot,
        )
        return _json({"instance": wire.vm_to_json(vm)}, status=201)

    async def _create_tags(self, request: web.Request) -> web.Response:
        body = _TagsBody.model_validate(await self._body(request))
        self.cloud.api_create_tags(request.match_info["id"], body.tags)
        return _json({})

    async def _delete_tags(self, request: web.Request) -> web.Response:
        self.cloud.api_delete_tags(request.match_info["id"], list(request.query.getall("key", [])))
        return _json({})

    async def _destroy(self, request: web.Request) -> web.Response:
        self.cloud.api_destroy(request.match_info["id"])
        return _json({})

    async def _instance_types(self, request: web.Request) -> web.Response:
        types = [t.model_dump(mode="json") for t in self.cloud.catalogue()]
        return _json({"instance_types": types})

    async def _endpoints(self, request: web.Request) -> web.Response:
        return _json({"endpoints": self.cloud.endpoints()})

    @staticmethod
    async def _body(request: web.Request) -> object:
        try:
            return await request.json()
        except ValueError:
            raise ValueError("the request body is not JSON") from None

    # ---- admin ---------------------------------------------------------------------------

    async def _get_faults(self, request: web.Request) -> web.Response:
        return _json(self.cloud.faults.model_dump(mode="json"))

    async def _set_faults(self, request: web.Request) -> web.Response:
        changes = await self._body(request)
        if not isinstance(changes, dict):
            raise ValueError("expected a JSON object of fault fields")
        self.cloud.set_faults(**changes)
        log.info("stub cloud faults changed", extra={"fields": sorted(changes)})
        return _json(self.cloud.faults.model_dump(mode="json"))

    async def _rate_limit(self, request: web.Request) -> web.Response:
        body = _RateLimitBody.model_validate(await self._body(request))
        self.cloud.force_rate_limit(body.calls, body.retry_after)
        return _json({})

    async def _admin_vms(self, request: web.Request) -> web.Response:
        return _json({"vms": [self._admin_view(vm) for vm in self.cloud.vms()]})

    async def _admin_vm(self, request: web.Request) -> web.Response:
        vm = self.cloud.vm(request.match_info["id"])
        if vm is None:
            return _error(404, "InvalidInstanceID.NotFound: no such VM")
        view = self._admin_view(vm)
        worker = self.cloud.worker(vm.id)
        if isinstance(worker, StubWorker):
            view["worker"] = await asyncio.wrap_future(
                self.cloud.submit(lambda: _worker_state(worker))
            )
        return _json(view)

    async def _admin_worker_faults(self, request: web.Request) -> web.Response:
        worker = self._stub_worker(request.match_info["id"])
        changes = await self._body(request)
        if not isinstance(changes, dict):
            raise ValueError("expected a JSON object of worker fault fields")
        known = {f.name for f in dataclasses.fields(worker.faults)}
        unknown = sorted(set(changes) - known)
        if unknown:
            raise ValueError(f"unknown worker fault fields: {', '.join(unknown)}")

        try:
            faults = dataclasses.replace(worker.faults, **changes)
        except TypeError as exc:
            raise ValueError(f"invalid worker fault values: {exc}") from None

        async def apply() -> dict[str, Any]:
            worker.config.faults = faults
            return dataclasses.asdict(faults)

        applied = await asyncio.wrap_future(self.cloud.submit(apply))
        log.info(
            "stub VM worker faults changed",
            extra={"instance_id": request.match_info["id"], "fields": sorted(changes)},
        )
        return _json(applied)

    async def _admin_poweroff(self, request: web.Request) -> web.Response:
        worker = self._stub_worker(request.match_info["id"])
        await asyncio.wrap_future(self.cloud.submit(worker.power_off))
        return _json({})

    async def _admin_resolve(self, request: web.Request) -> web.Response:
        address = request.query.get("address", "")
        endpoint = self.cloud.endpoint(address)
        if endpoint is None:
            return _error(404, f"NotFound: no listening stub VM has the address {address!r}")
        return _json({"host": endpoint.host, "port": endpoint.port})

    async def _admin_runs(self, request: web.Request) -> web.Response:
        return _json({"runs": self.cloud.runs()})

    async def _admin_stats(self, request: web.Request) -> web.Response:
        vms = self.cloud.vms()
        return _json(
            {
                "api_calls": dict(self.cloud.api_calls),
                "vms": len(vms),
                "listening": sum(1 for vm in vms if vm.port is not None),
                "pid": os.getpid(),
                "rss_bytes": _rss_bytes(),
            }
        )

    def _stub_worker(self, instance_id: str) -> StubWorker:
        if self.cloud.vm(instance_id) is None:
            raise web.HTTPNotFound(reason="no such VM")
        worker = self.cloud.worker(instance_id)
        if not isinstance(worker, StubWorker):
            raise web.HTTPConflict(reason="the VM's SSH server is not up (yet)")
        return worker

    def _admin_view(self, vm: StubVMView) -> dict[str, Any]:
        worker = self.cloud.worker(vm.id)
        view = wire.vm_to_json(vm)
        view.update(
            port=vm.port,
            broken=vm.broken,
            hung=vm.hung,
            host_public_key=worker.host_public_key if isinstance(worker, StubWorker) else None,
        )
        return view


async def _worker_state(worker: StubWorker) -> dict[str, Any]:
    """Runs on the stub loop, next to the worker."""
    return {
        "faults": dataclasses.asdict(worker.faults),
        "booted": worker.booted,
        "powered_off": worker.powered_off,
        "running": [
            {"uuid": c.uuid, "pid": c.pid, "state": "running"} for c in worker.runner.running()
        ],
        "runners_started": worker.runner.started,
        "connections_accepted": worker.connections_accepted,
        "auth_attempts": worker.auth_attempts,
        "commands": len(worker.commands),
    }


def _rss_bytes() -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


# ---- command line ---------------------------------------------------------------------------


def parse_listen(value: str) -> tuple[str, int]:
    """'127.0.0.1:PORT' -> (host, port); ValueError for anything not on 127.0.0.0/8."""
    host, sep, port_text = value.rpartition(":")
    if not sep:
        host, port_text = value, "0"
    host = host or "127.0.0.1"
    try:
        address = ipaddress.ip_address(host)
        port = int(port_text)
    except ValueError:
        raise ValueError(f"--listen must be 127.0.0.1:PORT, got {value!r}") from None
    if address.version != 4 or not address.is_loopback:
        raise ValueError(f"the stub cloud listens on 127.0.0.0/8 only, not {host!r}")
    if not 0 <= port <= 65535:
        raise ValueError(f"port out of range: {port}")
    return host, port


def _write_ready_file(path: Path, line: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(line + "\n")
    os.replace(tmp, path)


def _raise_open_file_limit() -> None:
    """Each VM holds a listening socket (and its SSH connections): allow thousands."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 65536 if hard == resource.RLIM_INFINITY else min(hard, 65536)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


async def serve(
    config: StubServerConfig,
    host: str,
    port: int,
    *,
    ready_file: Path | None = None,
    exit_with_parent: bool = False,
) -> int:
    _raise_open_file_limit()
    token = config.admin_token or SecretStr(secrets.token_hex(24))
    register_secret(token.get_secret_value())
    for value in config.credential_pair() or ():
        register_secret(value)
    server = StubCloudServer(config, admin_token=token)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    url = await server.start(host, port)
    try:
        line = json.dumps({"url": url, "adminToken": token.get_secret_value(), "pid": os.getpid()})
        if ready_file is not None:
            _write_ready_file(ready_file, line)
        sys.stdout.write(line + "\n")
        sys.stdout.flush()
        parent = os.getppid()
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=0.5)
            if exit_with_parent and os.getppid() != parent:
                log.info("stub cloud server: parent process gone, stopping")
                break
    finally:
        await server.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m nodewarden_doubles.stubcloud.server",
        description="Run the nodewarden stub cloud as its own process on loopback HTTP.",
    )
    parser.add_argument("--config", type=Path, required=True, help="YAML/JSON config file")
    parser.add_argument("--listen", default="127.0.0.1:0", help="127.0.0.1:PORT (0 = free)")
    parser.add_argument("--ready-file", type=Path, help="also write the ready line here")
    parser.add_argument("--log-level", default="INFO")
    parser.add_argument("--log-format", choices=("text", "json"), default="json")
    parser.add_argument(
        "--exit-with-parent",
        action="store_true",
        help="stop when the process that started the server is gone",
    )
    args = parser.parse_args(argv)
    setup_logging(args.log_format, args.log_level.upper())
    try:
        host, port = parse_listen(args.listen)
        config = StubServerConfig.from_file(args.config)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}"
            for e in exc.errors(include_input=False, include_url=False)
        )
        parser.error(f"{args.config}: {problems}")  # never echo values: they may be secrets
    except (ValueError, OSError, yaml.YAMLError) as exc:
        parser.error(str(exc))
    return asyncio.run(
        serve(
            config, host, port, ready_file=args.ready_file, exit_with_parent=args.exit_with_parent
        )
    )


if __name__ == "__main__":
    sys.exit(main())
