"""A project fake Redfish BMC (aiohttp.web) for what the sushy-tools emulator cannot do.

THIS IS A FAKE, not a real peer. Tests use the real sushy-tools emulator wherever it can
show a behaviour; this server exists only for BMC behaviours sushy-tools 2.2 lacks:
202 + Location/Retry-After task monitors (also one that never finishes and one on
another origin: `task_monitor_never_finishing`, `task_monitor_elsewhere`), reset types published only through an
ActionInfo resource, SessionService logins (X-Auth-Token) with expiry → 401, logins
that succeed oddly (204 without a body) or half-fail (no token, no Location, a broken
body after the session was created, an error status), 409 on a reset that conflicts
with a pending transition, a reset that is accepted but never applied, resets answered
with an error or only after a long delay, PoweringOn/PoweringOff transitional states,
the "reports Off early, drops an On sent in that window" quirk, and reply bodies sent
in several TCP writes, chunked, or stalling half-way. `make demo` also uses it as a BMC
for side nodes.

It is also the only peer here with **power readings** (sushy-tools 2.2 serves no `Power`,
`PowerSubsystem` or `EnvironmentMetrics` resource, only `Thermal`): `power_reading`
chooses the variant, modelled on the DMTF schema and the gaps real BMCs have --
"watts" (legacy `Chassis/<id>/Power` `PowerControl[0].PowerConsumedWatts`, with a null
`PowerSupplies[].LastPowerOutputWatts` and no kWh, as Dell), "environment" (the newer
`EnvironmentMetrics.PowerWatts`, with a `PowerSubsystem` link), "cumulative" (the same
plus `EnergykWh`), "null_watts" (`PowerConsumedWatts` null), "none" (no resource, the
default). The draw is `on_watts` while the host is On (or set by `set_draw`) and
`off_watts` while it is Off (BMCs report standby draw), integrated exactly on the fake's
clock into the `EnergykWh` counter; `reading_stops` makes the reading resource answer
503 from one time of the fake's clock to another (a reading that stops).

It listens on 127.0.0.1 only. Every request is recorded (method, path, auth kind,
status, live sessions after it) and every reset with what the fake did with it, so
tests can assert on what was sent. `live_sessions` counts the sessions a client could
still use (created, not deleted, not expired): a client that cleans up leaves 0.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import binascii
import contextlib
import hmac
import json
import logging
import secrets
import socket
import ssl
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Self

from aiohttp import web

logger = logging.getLogger(__name__)

ROOT = "/redfish/v1"
SESSIONS = f"{ROOT}/SessionService/Sessions"
TASK_MONITORS = f"{ROOT}/TaskService/TaskMonitors"
DEFAULT_ALLOWABLE = ("On", "ForceOff", "GracefulShutdown", "GracefulRestart", "ForceRestart")
_ON_TYPES = frozenset({"On", "ForceOn"})
_OFF_TYPES = frozenset({"GracefulShutdown", "ForceOff"})
_RESTART_TYPES = frozenset({"GracefulRestart", "ForceRestart", "PowerCycle"})

AuthKind = Literal["session", "basic", "none"]
ResetOutcome = Literal[
    "scheduled", "no_change", "dropped", "ignored", "conflict", "rejected", "failed"
]
LoginFault = Literal[
    "none",
    "no_token",
    "no_location",
    "anonymous",
    "malformed_body",
    "truncated_body",
    "stalled_body",
]
"""How a login that creates a session goes wrong:
- no_token: 2xx with Location, no X-Auth-Token;
- no_location: token, no Location header (the body still names the session);
- anonymous: token, no Location, a body that is not JSON (nothing names the session);
- malformed_body: token and Location, a body that is not JSON;
- truncated_body: token and Location, the connection closes half-way through the body;
- stalled_body: token and Location, the body stops half-way until `body_stall_seconds`."""
BodyDelivery = Literal["whole", "pieces", "chunked"]
PowerReadingVariant = Literal["none", "watts", "environment", "cumulative", "null_watts"]
CHASSIS = f"{ROOT}/Chassis"


@dataclass
class FakeBmcOptions:
    """How the fake behaves. Defaults: one system "1", Off, sessions and Basic, 204 resets."""

    username: str = "admin"
    password: str = field(default="", repr=False)
    system_ids: tuple[str, ...] = ("1",)
    initial_power: Literal["On", "Off"] = "Off"
    sessions: bool = True
    basic_auth: bool = True
    session_ttl: float | None = None
    login_status: Literal[200, 201, 204] = 201
    """Status of a successful login (204: no body, only X-Auth-Token and Location)."""
    login_error: int | None = None
    """Answer every login with this HTTP status and create no session (e.g. 405, 500)."""
    login_fault: LoginFault = "none"
    allowable: tuple[str, ...] = DEFAULT_ALLOWABLE
    allowable_in: Literal["inline", "action_info", "nowhere"] = "inline"
    reset_reply: Literal[200, 204, 202] = 204
    task_polls: int | None = 1
    """202 replies of the task monitor before it reports the end state (None: a task
    monitor that never finishes, as some BMCs have)."""
    task_retry_after: int | None = 1
    task_end_state: Literal["Completed", "Exception", "Killed"] = "Completed"
    task_location_origin: str = ""
    """Prefix for the task monitor Location, e.g. another origin (a misbehaving BMC whose
    monitor points at another host; see `task_monitor_elsewhere`)."""
    transition_seconds: float = 0.0
    """Time from an accepted reset to the new state (0: immediate)."""
    report_transitional: bool = True
    """Report PoweringOn/PoweringOff during a transition (else the old state, like sushy)."""
    never_apply: bool = False
    """Accept every reset and never change the power state."""
    conflict_during_transition: bool = True
    """Answer 409 to a reset that arrives while a transition is pending."""
    early_off_drop_on_seconds: float = 0.0
    """After reaching Off by a shutdown, drop (accept but ignore) any On for this long."""
    response_delay: float = 0.0
    """Delay every answer (for client timeouts)."""
    garbage_reads: bool = False
    """Answer every GET of a system with 200 and an HTML page (a BMC's web UI or a proxy's
    error page where Redfish JSON should be)."""
    unavailable_reads: int = 0
    """Answer this many GETs of a system with 503 + Retry-After (a BMC busy or rebooting)."""
    failing_resets: int = 0
    """Answer this many resets with `reset_error_status` and apply nothing."""
    reset_error_status: int = 500
    reset_delay: float = 0.0
    """Hold every reset this long before handling it (a POST still in flight); ends at stop."""
    body_delivery: BodyDelivery = "whole"
    """How JSON bodies are sent: in one write, in `body_pieces` writes with a
    Content-Length, or as `body_pieces` chunks (Transfer-Encoding: chunked)."""
    body_pieces: int = 3
    body_piece_gap: float = 0.05
    """Pause between two pieces, so that each arrives in its own TCP segment."""
    body_stall_seconds: float = 0.0
    """With pieces or chunks: stop after the first piece for this long (ends at stop)."""
    power_reading: PowerReadingVariant = "none"
    """Which power-reading resource the chassis offers (module docstring)."""
    on_watts: float = 180.0
    """The draw while the host is On (unless `set_draw` changed it)."""
    off_watts: float = 8.0
    """The standby draw the BMC reports while the host is Off."""
    reading_stops: tuple[float, float] | None = None
    """(from, until) on the fake's clock: the reading resource answers 503 meanwhile."""


@dataclass(frozen=True)
class RequestRecord:
    method: str
    path: str
    auth: AuthKind
    status: int
    live_sessions: int
    """Sessions still live on the fake after this request."""
    at: float = 0.0
    """The fake's clock when the request arrived (time.monotonic by default)."""


@dataclass(frozen=True)
class ResetRecord:
    system_id: str
    reset_type: str
    at: float
    outcome: ResetOutcome
    user_agent: str | None = None
    """Who sent it, as the BMC's audit log would show (the operator names its replica)."""


@dataclass
class _System:
    system_id: str
    power: str
    pending: str | None = None
    settle_at: float = 0.0
    drop_on_until: float = float("-inf")
    draw: float | None = None
    """The draw while On set by a test (None: the options' on_watts)."""
    energy_joules: float = 0.0
    energy_at: float | None = None

    def watts(self, options: FakeBmcOptions) -> float:
        if self.power == "Off":
            return options.off_watts
        return self.draw if self.draw is not None else options.on_watts

    def meter(self, now: float, options: FakeBmcOptions) -> None:
        """Integrate the draw up to `now` (exact: the draw is constant between changes)."""
        if self.energy_at is not None and now > self.energy_at:
            self.energy_joules += self.watts(options) * (now - self.energy_at)
        self.energy_at = now

    def settle(self, now: float, options: FakeBmcOptions) -> None:
        if self.pending is not None and now >= self.settle_at:
            self.meter(self.settle_at, options)
            was_off_transition = self.pending == "Off"
            self.power = self.pending
            self.pending = None
            if was_off_transition and options.early_off_drop_on_seconds > 0:
                self.drop_on_until = self.settle_at + options.early_off_drop_on_seconds

    def reported(self, options: FakeBmcOptions) -> str:
        if self.pending is not None and options.report_transitional:
            return "PoweringOn" if self.pending == "On" else "PoweringOff"
        return self.power


@dataclass
class _Session:
    session_id: str
    token: str = field(repr=False)
    expires_at: float | None
    expired: bool = False

    def live(self, now: float) -> bool:
        return not self.expired and (self.expires_at is None or now < self.expires_at)


@dataclass
class _Task:
    task_id: str
    reset_type: str
    polls: int = 0
    done: bool = False


class FakeBmc:
    """The fake BMC server. Use `async with FakeBmc(options, ssl_context=ctx) as bmc`."""

    def __init__(
        self,
        options: FakeBmcOptions | None = None,
        *,
        ssl_context: ssl.SSLContext | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.options = options or FakeBmcOptions()
        self._ssl = ssl_context
        self._clock = clock
        self.systems: dict[str, _System] = {
            sid: _System(sid, self.options.initial_power) for sid in self.options.system_ids
        }
        for system in self.systems.values():
            system.meter(self._clock(), self.options)
        self._sessions: dict[str, _Session] = {}
        self._session_counter = 0
        self._tasks: dict[str, _Task] = {}
        self.requests: list[RequestRecord] = []
        self.resets: list[ResetRecord] = []
        self.logins = 0
        self.failed_logins = 0
        self.failed_basic = 0
        """Requests whose Basic credentials were wrong (a BMC counts them towards lockout)."""
        self._tokens_refused = False
        self.issued_tokens: list[str] = []
        self._runner: web.AppRunner | None = None
        self._stopping = asyncio.Event()
        self.port = 0

    # -- lifecycle -----------------------------------------------------------------

    @property
    def url(self) -> str:
        scheme = "https" if self._ssl is not None else "http"
        return f"{scheme}://127.0.0.1:{self.port}"

    async def start(self) -> None:
        self._stopping.clear()
        app = web.Application(middlewares=[self._middleware])
        app.router.add_get(ROOT, self._root)
        app.router.add_get(ROOT + "/", self._root)
        app.router.add_get(ROOT + "/Systems", self._systems)
        app.router.add_get(ROOT + "/Systems/{sid}", self._system)
        app.router.add_get(ROOT + "/Systems/{sid}/ResetActionInfo", self._action_info)
        app.router.add_post(ROOT + "/Systems/{sid}/Actions/ComputerSystem.Reset", self._reset)
        app.router.add_get(ROOT + "/SessionService", self._session_service)
        app.router.add_get(CHASSIS + "/{sid}", self._chassis)
        app.router.add_get(CHASSIS + "/{sid}/Power", self._power)
        app.router.add_get(CHASSIS + "/{sid}/EnvironmentMetrics", self._environment)
        app.router.add_post(SESSIONS, self._login)
        app.router.add_delete(SESSIONS + "/{session}", self._logout)
        app.router.add_get(TASK_MONITORS + "/{task}", self._task_monitor)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", self.port))
        self.port = sock.getsockname()[1]
        site = web.SockSite(self._runner, sock, ssl_context=self._ssl)
        await site.start()
        logger.info("fake BMC listening on %s", self.url)

    async def stop(self) -> None:
        self._stopping.set()  # ends stalled bodies and held resets
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    # -- test controls -------------------------------------------------------------

    def expire_sessions(self) -> None:
        """Make every issued X-Auth-Token invalid (the next use gets 401)."""
        for session in self._sessions.values():
            session.expired = True

    # -- session variants ------------------------------------------------------------

    def refuse_session_tokens(self, refuse: bool = True) -> None:
        """Keep issuing session tokens but refuse every one of them (401), while the
        sessions stay live: a BMC whose new token is refused as well. Only Basic auth
        (with the right password) still works, also to delete such a session."""
        self._tokens_refused = refuse

    def change_password(self, password: str) -> None:
        """The BMC's password changes (an administrator rotated it on the BMC) and every
        session ends: the client's token is refused and its re-login too."""
        self.options.password = password
        self.expire_sessions()

    @property
    def failed_auth(self) -> int:
        """Every refused credential: failed session logins and wrong Basic credentials."""
        return self.failed_logins + self.failed_basic

    @property
    def live_sessions(self) -> int:
        """Sessions created and neither deleted nor expired (0 when every client cleaned up)."""
        now = self._clock()
        return sum(1 for session in self._sessions.values() if session.live(now))

    def system_uuid(self, system_id: str) -> str:
        """The system's ComputerSystem.UUID: unique per fake BMC (by port) and system; the
        side-node double's host reports the same as its DMI product UUID."""
        index = self.options.system_ids.index(system_id)
        return f"00000000-0000-4000-8{index:03x}-{int(self.port):012d}"

    def set_power(self, system_id: str, power: Literal["On", "Off"]) -> None:
        """Set a system's state directly, cancelling any pending transition."""
        system = self.systems[system_id]
        system.meter(self._clock(), self.options)
        system.power, system.pending = power, None

    def set_draw(self, system_id: str, watts: float | None) -> None:
        """The system's draw while On from now (None: the options' on_watts)."""
        system = self.systems[system_id]
        system.settle(self._clock(), self.options)
        system.meter(self._clock(), self.options)
        system.draw = watts

    def energy_kwh(self, system_id: str) -> float:
        """The exact energy the system has drawn so far on the fake's clock (kWh)."""
        system = self.systems[system_id]
        system.settle(self._clock(), self.options)
        system.meter(self._clock(), self.options)
        return system.energy_joules / 3_600_000

    def settled_at(self, system_id: str) -> float | None:
        """The fake's clock when the system's last accepted reset takes effect (None:
        none accepted). With `report_transitional` off, reads show the old state until
        then."""
        for record in reversed(self.resets):
            if record.system_id == system_id and record.outcome == "scheduled":
                return record.at + self.options.transition_seconds
        return None

    def task_monitor_reads(self) -> list[RequestRecord]:
        """The GETs of task monitors so far (on this fake's own origin)."""
        return [r for r in self.requests if r.path.startswith(TASK_MONITORS + "/")]

    def power_of(self, system_id: str) -> str:
        """What the fake would report for the system now."""
        system = self.systems[system_id]
        system.settle(self._clock(), self.options)
        return system.reported(self.options)

    # -- plumbing ------------------------------------------------------------------

    @web.middleware
    async def _middleware(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        arrived = self._clock()
        if self.options.response_delay > 0:
            await asyncio.sleep(self.options.response_delay)
        open_paths = {ROOT, ROOT + "/"}
        if request.method == "POST" and request.path == SESSIONS:
            open_paths.add(SESSIONS)
        auth = self._authenticate(request)
        if auth is None and request.path not in open_paths:
            response: web.StreamResponse = _error(401, "Base.1.8.NoValidSession", "Unauthorized")
            if self.options.basic_auth:
                response.headers["WWW-Authenticate"] = 'Basic realm="fakebmc"'
        else:
            response = await handler(request)
        if (
            self.options.body_delivery != "whole"
            and isinstance(response, web.Response)
            and not response.prepared
            and response.body
        ):
            response = await self._send_in_pieces(
                request,
                response,
                stall=self.options.body_stall_seconds > 0,
                chunked=self.options.body_delivery == "chunked",
            )
        self.requests.append(
            RequestRecord(
                request.method,
                request.path,
                auth or "none",
                response.status,
                self.live_sessions,
                arrived,
            )
        )
        return response

    async def _hold(self, seconds: float) -> None:
        """Wait `seconds`, or less if the fake is stopped meanwhile."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), seconds)

    async def _send_in_pieces(
        self,
        request: web.Request,
        response: web.Response,
        *,
        stall: bool,
        chunked: bool,
        truncate: bool = False,
    ) -> web.StreamResponse:
        """Send the body of `response` in several writes (chunked or with Content-Length).

        `stall`: hold after the first piece for `body_stall_seconds`; `truncate`: close
        the connection after the first piece, short of the announced Content-Length.
        """
        body = response.body
        if not isinstance(body, bytes):
            return response
        count = max(2, self.options.body_pieces)
        size = -(-len(body) // count)
        pieces = [body[i : i + size] for i in range(0, len(body), size)]
        stream = web.StreamResponse(status=response.status)
        for name, value in response.headers.items():
            if name.lower() not in ("content-length", "transfer-encoding"):
                stream.headers[name] = value
        if chunked:
            stream.enable_chunked_encoding()
        else:
            stream.content_length = len(body)
        await stream.prepare(request)
        try:
            for index, piece in enumerate(pieces):
                if index == 1:
                    if truncate:
                        if request.transport is not None:
                            request.transport.close()
                        return stream
                    if stall:
                        await self._hold(self.options.body_stall_seconds)
                if index:
                    await asyncio.sleep(self.options.body_piece_gap)
                await stream.write(piece)
            await stream.write_eof()
        except ConnectionError:
            pass  # the client gave up meanwhile
        return stream

    def _authenticate(self, request: web.Request) -> AuthKind | None:
        now = self._clock()
        token = request.headers.get("X-Auth-Token")
        if token is not None and self.options.sessions:
            for session in self._sessions.values():
                if hmac.compare_digest(session.token, token):
                    if (
                        self._tokens_refused
                        or session.expired
                        or (session.expires_at is not None and now >= session.expires_at)
                    ):
                        return None
                    return "session"
            return None
        header = request.headers.get("Authorization", "")
        if self.options.basic_auth and header.startswith("Basic "):
            try:
                user, _, password = base64.b64decode(header[6:]).decode().partition(":")
            except (binascii.Error, UnicodeDecodeError):
                return None
            if self._credentials_match(user, password):
                return "basic"
            self.failed_basic += 1
        return None

    def _credentials_match(self, user: str, password: str) -> bool:
        return hmac.compare_digest(user, self.options.username) and hmac.compare_digest(
            password, self.options.password
        )

    def _system_or_404(self, request: web.Request) -> _System | web.Response:
        system = self.systems.get(request.match_info["sid"])
        if system is None:
            return _error(404, "Base.1.8.ResourceNotFound", "no such system")
        system.settle(self._clock(), self.options)
        return system

    # -- resources -----------------------------------------------------------------

    async def _root(self, request: web.Request) -> web.Response:
        body: dict[str, Any] = {
            "@odata.id": ROOT + "/",
            "@odata.type": "#ServiceRoot.v1_15_0.ServiceRoot",
            "Id": "RootService",
            "Name": "nodewarden fake BMC",
            "RedfishVersion": "1.15.0",
            "Systems": {"@odata.id": ROOT + "/Systems"},
        }
        if self.options.sessions:
            body["SessionService"] = {"@odata.id": ROOT + "/SessionService"}
            body["Links"] = {"Sessions": {"@odata.id": SESSIONS}}
        return web.json_response(body)

    async def _systems(self, request: web.Request) -> web.Response:
        members = [{"@odata.id": f"{ROOT}/Systems/{sid}"} for sid in self.systems]
        return web.json_response(
            {
                "@odata.id": ROOT + "/Systems",
                "Name": "Computer System Collection",
                "Members@odata.count": len(members),
                "Members": members,
            }
        )

    async def _system(self, request: web.Request) -> web.Response:
        if self.options.garbage_reads:
            return web.Response(
                status=200,
                text="<html><body>BMC maintenance</body></html>",
                content_type="text/html",
            )
        if self.options.unavailable_reads > 0:
            self.options.unavailable_reads -= 1
            response = _error(503, "Base.1.8.ServiceTemporarilyUnavailable", "BMC busy")
            response.headers["Retry-After"] = "1"
            return response
        system = self._system_or_404(request)
        if isinstance(system, web.Response):
            return system
        path = f"{ROOT}/Systems/{system.system_id}"
        action: dict[str, Any] = {"target": path + "/Actions/ComputerSystem.Reset"}
        if self.options.allowable_in == "inline":
            action["ResetType@Redfish.AllowableValues"] = list(self.options.allowable)
        elif self.options.allowable_in == "action_info":
            action["@Redfish.ActionInfo"] = path + "/ResetActionInfo"
        return web.json_response(
            {
                "@odata.id": path,
                "@odata.type": "#ComputerSystem.v1_20_0.ComputerSystem",
                "Id": system.system_id,
                "Name": f"fake system {system.system_id}",
                "UUID": self.system_uuid(system.system_id),
                "PowerState": system.reported(self.options),
                "Actions": {"#ComputerSystem.Reset": action},
                "Links": {"Chassis": [{"@odata.id": f"{CHASSIS}/{system.system_id}"}]},
            }
        )

    # -- power readings (the chassis of system <sid> is Chassis/<sid>) ------------------

    def _reading_system(self, request: web.Request) -> _System | web.Response:
        system = self._system_or_404(request)
        if isinstance(system, web.Response):
            return system
        stops = self.options.reading_stops
        if stops is not None and stops[0] <= self._clock() < stops[1]:
            response = _error(503, "Base.1.8.ServiceTemporarilyUnavailable", "sensor not ready")
            response.headers["Retry-After"] = "1"
            return response
        system.meter(self._clock(), self.options)
        return system

    async def _chassis(self, request: web.Request) -> web.Response:
        system = self._system_or_404(request)
        if isinstance(system, web.Response):
            return system
        path = f"{CHASSIS}/{system.system_id}"
        body: dict[str, Any] = {
            "@odata.id": path,
            "@odata.type": "#Chassis.v1_25_0.Chassis",
            "Id": system.system_id,
            "Name": f"fake chassis {system.system_id}",
            "Thermal": {"@odata.id": path + "/Thermal"},
        }
        variant = self.options.power_reading
        if variant in ("watts", "null_watts"):
            body["Power"] = {"@odata.id": path + "/Power"}
        elif variant in ("environment", "cumulative"):
            body["EnvironmentMetrics"] = {"@odata.id": path + "/EnvironmentMetrics"}
            body["PowerSubsystem"] = {"@odata.id": path + "/PowerSubsystem"}
        return web.json_response(body)

    async def _power(self, request: web.Request) -> web.Response:
        if self.options.power_reading not in ("watts", "null_watts"):
            return _error(404, "Base.1.8.ResourceNotFound", "no Power resource")
        system = self._reading_system(request)
        if isinstance(system, web.Response):
            return system
        watts = None if self.options.power_reading == "null_watts" else system.watts(self.options)
        return web.json_response(
            {
                "@odata.id": request.path,
                "@odata.type": "#Power.v1_7_1.Power",
                "Id": "Power",
                "PowerControl": [
                    {
                        "@odata.id": request.path + "#/PowerControl/0",
                        "MemberId": "0",
                        "PowerConsumedWatts": watts,
                    }
                ],
                "PowerSupplies": [
                    {"@odata.id": request.path + "#/PowerSupplies/0", "LastPowerOutputWatts": None}
                ],
            }
        )

    async def _environment(self, request: web.Request) -> web.Response:
        if self.options.power_reading not in ("environment", "cumulative"):
            return _error(404, "Base.1.8.ResourceNotFound", "no EnvironmentMetrics resource")
        system = self._reading_system(request)
        if isinstance(system, web.Response):
            return system
        body: dict[str, Any] = {
            "@odata.id": request.path,
            "@odata.type": "#EnvironmentMetrics.v1_3_0.EnvironmentMetrics",
            "Id": "EnvironmentMetrics",
            "PowerWatts": {"Reading": system.watts(self.options)},
        }
        if self.options.power_reading == "cumulative":
            body["EnergykWh"] = {"Reading": system.energy_joules / 3_600_000}
        return web.json_response(body)

    async def _action_info(self, request: web.Request) -> web.Response:
        system = self._system_or_404(request)
        if isinstance(system, web.Response):
            return system
        if self.options.allowable_in != "action_info":
            return _error(404, "Base.1.8.ResourceNotFound", "no ActionInfo")
        return web.json_response(
            {
                "@odata.id": request.path,
                "@odata.type": "#ActionInfo.v1_3_0.ActionInfo",
                "Id": "ResetActionInfo",
                "Parameters": [
                    {
                        "Name": "ResetType",
                        "Required": True,
                        "DataType": "String",
                        "AllowableValues": list(self.options.allowable),
                    }
                ],
            }
        )

    async def _session_service(self, request: web.Request) -> web.Response:
        if not self.options.sessions:
            return _error(404, "Base.1.8.ResourceNotFound", "no SessionService")
        return web.json_response(
            {"@odata.id": ROOT + "/SessionService", "Sessions": {"@odata.id": SESSIONS}}
        )

    async def _login(self, request: web.Request) -> web.StreamResponse:
        if not self.options.sessions:
            return _error(404, "Base.1.8.ResourceNotFound", "no SessionService")
        try:
            body = await request.json()
        except ValueError:
            return _error(400, "Base.1.8.MalformedJSON", "malformed JSON")
        user = body.get("UserName") if isinstance(body, dict) else None
        password = body.get("Password") if isinstance(body, dict) else None
        if not (
            isinstance(user, str)
            and isinstance(password, str)
            and self._credentials_match(user, password)
        ):
            self.failed_logins += 1
            return _error(401, "Base.1.8.NoValidSession", "invalid user name or password")
        if self.options.login_error is not None:
            return _error(self.options.login_error, "Base.1.8.InternalError", "login failed")
        self._session_counter += 1
        session_id = str(self._session_counter)
        token = secrets.token_urlsafe(24)
        ttl = self.options.session_ttl
        self._sessions[session_id] = _Session(
            session_id, token, None if ttl is None else self._clock() + ttl
        )
        self.issued_tokens.append(token)
        self.logins += 1
        location = f"{SESSIONS}/{session_id}"
        fault = self.options.login_fault
        headers = {"X-Auth-Token": token, "Location": location}
        if fault == "no_token":
            del headers["X-Auth-Token"]
        elif fault in ("no_location", "anonymous"):
            del headers["Location"]
        status = self.options.login_status
        if status == 204:
            return web.Response(status=204, headers=headers)
        if fault in ("anonymous", "malformed_body"):
            return web.Response(
                status=status,
                text="<html>session created",
                content_type="text/html",
                headers=headers,
            )
        response = web.json_response(
            {"@odata.id": location, "Id": session_id, "UserName": user},
            status=status,
            headers=headers,
        )
        if fault in ("truncated_body", "stalled_body"):
            return await self._send_in_pieces(
                request,
                response,
                stall=fault == "stalled_body",
                chunked=False,
                truncate=fault == "truncated_body",
            )
        return response

    async def _logout(self, request: web.Request) -> web.Response:
        if self._sessions.pop(request.match_info["session"], None) is None:
            return _error(404, "Base.1.8.ResourceNotFound", "no such session")
        return web.Response(status=204)

    async def _reset(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except ValueError:
            return _error(400, "Base.1.8.MalformedJSON", "malformed JSON")
        if self.options.reset_delay > 0:
            await self._hold(self.options.reset_delay)
        system = self._system_or_404(request)
        if isinstance(system, web.Response):
            return system
        reset_type = body.get("ResetType") if isinstance(body, dict) else None
        now = self._clock()
        agent = request.headers.get("User-Agent")
        if self.options.failing_resets > 0:
            self.options.failing_resets -= 1
            self.resets.append(ResetRecord(system.system_id, str(reset_type), now, "failed", agent))
            return _error(self.options.reset_error_status, "Base.1.8.InternalError", "reset failed")
        if not isinstance(reset_type, str) or reset_type not in self.options.allowable:
            self.resets.append(
                ResetRecord(system.system_id, str(reset_type), now, "rejected", agent)
            )
            return _error(
                400,
                "Base.1.8.ActionParameterNotSupported",
                f"ResetType {reset_type!r} is not supported",
            )
        if system.pending is not None and self.options.conflict_during_transition:
            self.resets.append(ResetRecord(system.system_id, reset_type, now, "conflict", agent))
            return _error(409, "Base.1.8.ResourceInUse", "a power transition is in progress")
        outcome = self._apply(system, reset_type, now)
        self.resets.append(ResetRecord(system.system_id, reset_type, now, outcome, agent))
        if self.options.reset_reply == 204:
            return web.Response(status=204)
        if self.options.reset_reply == 200:
            return web.json_response(
                {"error": None, "@Message.ExtendedInfo": [{"MessageId": "Base.1.8.Success"}]}
            )
        task_id = secrets.token_hex(4)
        self._tasks[task_id] = _Task(task_id, reset_type)
        headers = {"Location": f"{self.options.task_location_origin}{TASK_MONITORS}/{task_id}"}
        if self.options.task_retry_after is not None:
            headers["Retry-After"] = str(self.options.task_retry_after)
        return web.json_response(
            _task_body(task_id, "Running", reset_type), status=202, headers=headers
        )

    def _apply(self, system: _System, reset_type: str, now: float) -> ResetOutcome:
        system.meter(now, self.options)
        if self.options.never_apply:
            return "ignored"
        if reset_type in _ON_TYPES:
            if now < system.drop_on_until:
                return "dropped"
            target = "On"
        elif reset_type in _OFF_TYPES:
            target = "Off"
        elif reset_type in _RESTART_TYPES:
            system.power = "Off"
            target = "On"
        else:
            return "ignored"
        if system.power == target and system.pending is None:
            return "no_change"
        system.pending = target
        system.settle_at = now + self.options.transition_seconds
        system.settle(now, self.options)
        return "scheduled"

    async def _task_monitor(self, request: web.Request) -> web.Response:
        task = self._tasks.get(request.match_info["task"])
        if task is None or task.done:
            return _error(404, "Base.1.8.ResourceNotFound", "no such task monitor")
        task.polls += 1
        if self.options.task_polls is None or task.polls <= self.options.task_polls:
            headers = {}
            if self.options.task_retry_after is not None:
                headers["Retry-After"] = str(self.options.task_retry_after)
            return web.json_response(
                _task_body(task.task_id, "Running", task.reset_type), status=202, headers=headers
            )
        task.done = True
        return web.json_response(
            _task_body(task.task_id, self.options.task_end_state, task.reset_type)
        )


def task_monitor_never_finishing(**options: Any) -> FakeBmcOptions:
    """A BMC that answers every reset 202 with a task monitor that stays Running for
    ever (Retry-After 1), while the reset itself takes effect as usual."""
    return FakeBmcOptions(**{"reset_reply": 202, "task_polls": None, **options})


def task_monitor_elsewhere(origin: str, **options: Any) -> FakeBmcOptions:
    """A BMC that answers every reset 202 with a task monitor on another origin
    (`origin`, e.g. "https://127.0.0.1:<a port nothing serves>"); the reset itself takes
    effect as usual. A client must not send its credentials there."""
    return FakeBmcOptions(
        **{"reset_reply": 202, "task_location_origin": origin, "task_retry_after": 0, **options}
    )


def _task_body(task_id: str, state: str, reset_type: str) -> dict[str, Any]:
    failed = state in ("Exception", "Killed")
    return {
        "@odata.id": f"{ROOT}/TaskService/Tasks/{task_id}",
        "@odata.type": "#Task.v1_7_0.Task",
        "Id": task_id,
        "TaskState": state,
        "TaskStatus": "Critical" if failed else "OK",
        "Messages": [
            {
                "MessageId": "Base.1.8.InternalError" if failed else "Base.1.8.Success",
                "Message": f"reset {reset_type} failed on the fake BMC"
                if failed
                else f"reset {reset_type} {state.lower()}",
            }
        ],
    }


def _error(status: int, message_id: str, message: str) -> web.Response:
    return web.json_response(
        {
            "error": {
                "code": message_id,
                "message": message,
                "@Message.ExtendedInfo": [{"MessageId": message_id, "Message": message}],
            }
        },
        status=status,
    )


def write_loopback_certificate(
    directory: Path, extra_addresses: Sequence[str] = ()
) -> tuple[ssl.SSLContext, str]:
    """A throwaway CA and a 127.0.0.1 server certificate for the fake (demo use).

    Writes ca.pem, server.pem and server.key into `directory`; returns the server
    context and the CA PEM a client must trust. `extra_addresses` are IP addresses the
    certificate names as well (an address a test maps onto this loopback with a DNAT
    rule in a network namespace it created); the server still listens on 127.0.0.1 only.
    """
    import datetime as dt
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "nodewarden fake BMC CA")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=30))
        .add_extension(
            x509.SubjectAlternativeName(
                [
                    x509.IPAddress(ipaddress.ip_address(address))
                    for address in ("127.0.0.1", *extra_addresses)
                ]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    directory.mkdir(parents=True, exist_ok=True)
    ca_pem = ca_cert.public_bytes(serialization.Encoding.PEM).decode()
    (directory / "ca.pem").write_text(ca_pem)
    (directory / "server.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path = directory / "server.key"
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    key_path.chmod(0o600)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(directory / "server.pem", key_path)
    return context, ca_pem


async def _serve(options: FakeBmcOptions, port: int, state_dir: Path) -> None:
    context, _ca = write_loopback_certificate(state_dir)
    bmc = FakeBmc(options, ssl_context=context)
    bmc.port = port
    async with bmc:
        print(
            json.dumps({"endpoint": bmc.url, "caBundle": str(state_dir / "ca.pem")}),
            flush=True,
        )
        await asyncio.Event().wait()


def main(argv: Sequence[str] | None = None) -> None:
    """Run the fake BMC on 127.0.0.1 (for `make demo`); prints its endpoint and CA path."""
    parser = argparse.ArgumentParser(description="nodewarden fake Redfish BMC (loopback only)")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--state-dir", type=Path, required=True, help="where ca.pem is written")
    parser.add_argument("--system-id", action="append", dest="system_ids")
    parser.add_argument("--power", choices=["On", "Off"], default="Off")
    parser.add_argument("--username", default="admin")
    parser.add_argument(
        "--password-file", type=Path, required=True, help="file holding the BMC password"
    )
    parser.add_argument("--transition-seconds", type=float, default=3.0)
    parser.add_argument("--reset-reply", type=int, choices=[200, 202, 204], default=204)
    args = parser.parse_args(argv)
    options = FakeBmcOptions(
        username=args.username,
        password=args.password_file.read_text().strip(),
        system_ids=tuple(args.system_ids or ["1"]),
        initial_power=args.power,
        transition_seconds=args.transition_seconds,
        reset_reply=args.reset_reply,
    )
    logging.basicConfig(level=logging.INFO)
    asyncio.run(_serve(options, args.port, args.state_dir))


if __name__ == "__main__":
    main()
