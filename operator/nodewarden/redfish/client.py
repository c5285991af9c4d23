"""Async Redfish client for one BMC: discover the system, read power, list and request resets.

`RedfishClient` is the adapter callers use. It reads facts (`PowerStateObservation`,
`ResetCapabilities`) and makes requests (`ResetRequestResult`), each stamped with its
source ("redfish:<endpoint>") and time. A request returns when the BMC answered: a 202's
task monitor is recorded, and `read_task` reads it once when a caller wants the BMC's
word on it. It never decides whether a power state is confirmed:
`nodewarden.redfish.confirmation` does, from PowerState.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime
from types import TracebackType
from typing import Any, Self

import aiohttp

from nodewarden.clock import utc_now
from nodewarden.redfish.auth import SERVICE_ROOT, AuthMode, RedfishAuth
from nodewarden.redfish.config import RedfishEndpointConfig
from nodewarden.redfish.errors import (
    ActionNotSupported,
    RedfishProtocolError,
    SystemDiscoveryError,
)
from nodewarden.redfish.facts import (
    PowerStateObservation,
    RedfishPowerState,
    ResetCapabilities,
    ResetRequestResult,
    SystemRef,
    TaskOutcome,
)
from nodewarden.redfish.transport import (
    BmcTransport,
    HttpReply,
    RedfishTransport,
    error_details,
    error_for_status,
)

logger = logging.getLogger(__name__)

Clock = Callable[[], datetime]
RESET_ACTION = "#ComputerSystem.Reset"
_RUNNING_TASK_STATES = frozenset(
    {
        "New",
        "Starting",
        "Running",
        "Suspended",
        "Interrupted",
        "Pending",
        "Stopping",
        "Service",
        "Cancelling",
    }
)
_FAILED_TASK_STATES = frozenset({"Exception", "Killed", "Cancelled"})
_UNSUPPORTED_MESSAGE_HINTS = (
    "ActionParameterNotSupported",
    "ActionNotSupported",
    "PropertyValueNotInList",
    "ActionParameterValueNotInList",
    "ActionParameterValueError",
)


class RedfishClient:
    """One BMC's Redfish service, over aiohttp (use `async with` or call `close()`)."""

    def __init__(
        self,
        config: RedfishEndpointConfig,
        *,
        session: aiohttp.ClientSession | None = None,
        clock: Clock = utc_now,
        user_agent: str | None = None,
        transport: BmcTransport | None = None,
    ) -> None:
        """`transport`: the wire to the BMC (default: HTTPS with `RedfishTransport`; a
        hollow BMC's in-process answers in benchmarks and tests)."""
        self.config = config
        self.source = config.source
        self._clock = clock
        self._transport: BmcTransport = transport or RedfishTransport(
            config.endpoint,
            ca_bundle_pem=config.ca_bundle_pem,
            connect_timeout=config.connect_timeout,
            request_timeout=config.request_timeout,
            secrets=lambda: self._auth.secret_values(),
            session=session,
            clock=clock,
            user_agent=user_agent,
        )
        self._auth = RedfishAuth(
            self._transport,
            username=config.username,
            password=config.password,
            use_sessions=config.use_sessions,
        )
        self._system: SystemRef | None = None

    def __repr__(self) -> str:
        return f"RedfishClient(endpoint={self.config.endpoint!r}, auth={self._auth.mode!r})"

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Delete the Redfish session (if any) and close the HTTP session we own."""
        try:
            await self._auth.logout()
        finally:
            await self._transport.close()

    @property
    def auth_mode(self) -> AuthMode | None:
        """'session' or 'basic' once the first authenticated request decided it."""
        return self._auth.mode

    @property
    def auth_fallback_reason(self) -> str | None:
        """Why Basic auth is used although sessions are configured (None: no fallback)."""
        return self._auth.fallback_reason

    @property
    def logins(self) -> int:
        """Number of session logins so far (re-logins after 401 included)."""
        return self._auth.logins

    # -- reading -----------------------------------------------------------------

    async def _get(self, path: str, what: str) -> dict[str, Any]:
        reply = await self._auth.request("GET", path)
        if reply.status >= 300:
            raise error_for_status(self.source_endpoint, reply, what)
        return reply.json_object(self.source_endpoint)

    @property
    def source_endpoint(self) -> str:
        return self.config.endpoint

    async def read_resource(self, path: str, what: str) -> dict[str, Any]:
        """GET one resource of this BMC as a JSON object (`what` names it in errors)."""
        return await self._get(path, what)

    def now(self) -> datetime:
        """The client's clock (readings are stamped with it)."""
        return self._clock()

    async def discover_system(self, *, refresh: bool = False) -> SystemRef:
        """The configured ComputerSystem, or the only member of /redfish/v1/Systems."""
        if self._system is not None and not refresh:
            return self._system
        root_reply = await self._transport.request("GET", SERVICE_ROOT)
        if root_reply.status == 401:  # the root should be open, but some BMCs want auth
            root_reply = await self._auth.request("GET", SERVICE_ROOT)
        if root_reply.status >= 300:
            raise error_for_status(self.source_endpoint, root_reply, "reading the service root")
        root = root_reply.json_object(self.source_endpoint)
        systems_path = _link(root.get("Systems"))
        if systems_path is None:
            raise SystemDiscoveryError(
                self.source_endpoint, "the service root links no Systems collection", ()
            )
        members: list[str] = []
        if self.config.system_id is not None:
            path = systems_path.rstrip("/") + "/" + self.config.system_id
        else:
            collection = await self._get(systems_path, "listing systems")
            raw_members = collection.get("Members")
            if not isinstance(raw_members, list):
                raise RedfishProtocolError(self.source_endpoint, "Systems has no Members list")
            members = [m for m in (_link(item) for item in raw_members) if m]
            if len(members) != 1:
                names = ", ".join(_last_segment(m) for m in members) or "none"
                raise SystemDiscoveryError(
                    self.source_endpoint,
                    f"found {len(members)} ComputerSystems ({names}); "
                    "set the BMC's systemId to choose one",
                    [_last_segment(m) for m in members],
                )
            path = members[0]
        system = await self._get(path, "reading the ComputerSystem")
        self._system = _system_ref(system, path)
        logger.debug(
            "redfish system discovered",
            extra={"redfish_endpoint": self.source_endpoint, "system_id": self._system.system_id},
        )
        return self._system

    async def read_power_state(self) -> PowerStateObservation:
        """PowerState of the system, read now (evidence of the actual state)."""
        system = await self.discover_system()
        body = await self._get(system.path, "reading PowerState")
        raw = body.get("PowerState")
        observation = PowerStateObservation(
            system_id=system.system_id,
            state=RedfishPowerState.parse(raw),
            raw=raw if isinstance(raw, str) else None,
            source=self.source,
            observed_at=self._clock(),
            system_uuid=_system_uuid(body.get("UUID")),
        )
        logger.debug(
            "redfish power state %s",
            observation.state.value,
            extra={"redfish_endpoint": self.source_endpoint, "power_state": observation.state},
        )
        return observation

    async def read_reset_capabilities(self) -> ResetCapabilities:
        """Allowable ResetType values: inline AllowableValues, else the ActionInfo resource."""
        system = await self.discover_system()
        body = await self._get(system.path, "reading the ComputerSystem")
        now = self._clock()
        actions = body.get("Actions")
        action = actions.get(RESET_ACTION) if isinstance(actions, dict) else None
        if not isinstance(action, dict):
            return ResetCapabilities(None, "no_reset_action", None, self.source, now)
        inline = action.get("ResetType@Redfish.AllowableValues")
        if isinstance(inline, list):
            values = frozenset(v for v in inline if isinstance(v, str))
            return ResetCapabilities(values, "inline", None, self.source, now)
        info_path = action.get("@Redfish.ActionInfo")
        if isinstance(info_path, str) and info_path:
            info = await self._get(info_path, "reading the reset ActionInfo")
            params = info.get("Parameters")
            if isinstance(params, list):
                for param in params:
                    if isinstance(param, dict) and param.get("Name") == "ResetType":
                        allowed = param.get("AllowableValues")
                        if isinstance(allowed, list):
                            values = frozenset(v for v in allowed if isinstance(v, str))
                            return ResetCapabilities(
                                values, "action_info", info_path, self.source, self._clock()
                            )
            return ResetCapabilities(None, "unspecified", info_path, self.source, self._clock())
        return ResetCapabilities(None, "unspecified", None, self.source, now)

    # -- acting ------------------------------------------------------------------

    async def request_reset(
        self,
        reset_type: str,
        *,
        check_allowable: bool = True,
    ) -> ResetRequestResult:
        """POST ComputerSystem.Reset; returns as soon as the BMC answered.

        A returned result proves only that the BMC accepted the request. A 202's task
        monitor is recorded in `result.task`, never waited for: the request stays
        accepted whatever its task does later, and the state it produces is read from
        PowerState (`nodewarden.redfish.confirmation`). A monitor on another origin is
        marked never to be followed. With `check_allowable`, a type the BMC says it does
        not accept is refused before anything is sent (ActionNotSupported). Raises
        Conflict409, ActionNotSupported, AuthFailed, … for refusals.
        """
        system = await self.discover_system()
        allowable: frozenset[str] | None = None
        if check_allowable:
            capabilities = await self.read_reset_capabilities()
            allowable = capabilities.allowable
            if capabilities.allows(reset_type) is False:
                offered = sorted(allowable) if allowable is not None else []
                raise ActionNotSupported(
                    self.source_endpoint,
                    f"reset type {reset_type!r} is not offered by system "
                    f"{system.system_id!r} (allowable: {', '.join(offered) or 'none'})",
                    0,
                    reset_type,
                    offered,
                )
        if system.reset_target is None:
            raise ActionNotSupported(
                self.source_endpoint,
                f"system {system.system_id!r} offers no ComputerSystem.Reset action",
                0,
                reset_type,
            )
        requested_at = self._clock()
        reply = await self._auth.request(
            "POST", system.reset_target, json_body={"ResetType": reset_type}
        )
        answered_at = self._clock()
        logger.info(
            "redfish reset %s requested: HTTP %s",
            reset_type,
            reply.status,
            extra={
                "redfish_endpoint": self.source_endpoint,
                "reset_type": reset_type,
                "http_status": reply.status,
            },
        )
        if reply.status >= 300:
            raise self._reset_error(reply, reset_type, allowable)
        task = self._accepted_task(reply) if reply.status == 202 else None
        return ResetRequestResult(
            system_id=system.system_id,
            reset_type=reset_type,
            http_status=reply.status,
            task=task,
            source=self.source,
            requested_at=requested_at,
            answered_at=answered_at,
        )

    def _accepted_task(self, reply: HttpReply) -> TaskOutcome:
        """The task a 202 announced, as its answer describes it (not read yet)."""
        monitor = reply.location or _link(reply.body) or ""
        state = _task_state(reply.body) or "Running"
        messages = _task_messages(reply.body)
        if not monitor:
            return TaskOutcome("", state, False, 0, messages, "the 202 named no task monitor")
        if not self._transport.same_origin(self._transport.url(monitor)):
            logger.info(
                "redfish task monitor on another origin; not followed",
                extra={"redfish_endpoint": self.source_endpoint},
            )
            return TaskOutcome(
                monitor,
                state,
                False,
                0,
                messages,
                "the task monitor points to another origin; not followed (credentials "
                "are only sent to the configured endpoint)",
            )
        return TaskOutcome(monitor, state, False, 0, messages)

    async def read_task(self, task: TaskOutcome) -> TaskOutcome:
        """Read a task monitor once: what the BMC says of the task now (evidence only).

        A task that ended badly comes back `failed`, never as an error: the request it
        belongs to was accepted and stays so. A monitor that must not be followed, or
        that already finished, is returned unchanged without a request. Raises the
        client's typed errors when the monitor cannot be read.
        """
        if not task.followable:
            return task
        reply = await self._auth.request("GET", task.monitor)
        polls = task.polls + 1
        messages = _task_messages(reply.body) or task.messages
        if reply.status == 404:
            # The monitor is removed once it has reported its end; we may have missed it.
            return replace(task, state="Gone", finished=True, polls=polls, messages=messages)
        if reply.status >= 300 and reply.status != 202:
            raise error_for_status(self.source_endpoint, reply, "reading the reset task")
        body_state = _task_state(reply.body)
        if reply.status == 202 or body_state in _RUNNING_TASK_STATES:
            return replace(task, state=body_state or "Running", polls=polls, messages=messages)
        state = body_state or "Completed"
        if _task_status(reply.body) == "Critical" and state not in _FAILED_TASK_STATES:
            state = "Exception"  # a "finished" task whose status says it went wrong
        outcome = replace(task, state=state, finished=True, polls=polls, messages=messages)
        if outcome.failed:
            logger.info(
                "redfish reset task ended %s: %s",
                state,
                "; ".join(messages) or "no message",
                extra={"redfish_endpoint": self.source_endpoint, "task_state": state},
            )
        return outcome

    def _reset_error(
        self, reply: HttpReply, reset_type: str, allowable: frozenset[str] | None
    ) -> Exception:
        message, ids = error_details(reply)
        unsupported_hint = any(hint in mid for mid in ids for hint in _UNSUPPORTED_MESSAGE_HINTS)
        if reply.status in (405, 501) or (reply.status == 400 and unsupported_hint):
            said = f": {message}" if message else ""
            return ActionNotSupported(
                self.source_endpoint,
                f"the BMC does not support reset type {reset_type!r} (HTTP {reply.status}){said}",
                reply.status,
                reset_type,
                sorted(allowable) if allowable is not None else None,
                ids,
            )
        return error_for_status(self.source_endpoint, reply, f"reset {reset_type}")


def _link(value: object) -> str | None:
    if isinstance(value, dict):
        target = value.get("@odata.id")
        if isinstance(target, str) and target:
            return target
    return None


def _last_segment(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[-1]


def _system_ref(body: dict[str, Any], path: str) -> SystemRef:
    actions = body.get("Actions")
    action = actions.get(RESET_ACTION) if isinstance(actions, dict) else None
    target = action.get("target") if isinstance(action, dict) else None
    system_id = body.get("Id")
    name = body.get("Name")
    uuid = body.get("UUID")
    return SystemRef(
        system_id=system_id if isinstance(system_id, str) else _last_segment(path),
        path=_link(body) or path,
        reset_target=target if isinstance(target, str) and target else None,
        name=name if isinstance(name, str) else None,
        uuid=uuid if isinstance(uuid, str) else None,
    )


def _task_state(body: object) -> str | None:
    if isinstance(body, dict) and isinstance(body.get("TaskState"), str):
        return str(body["TaskState"])
    return None


def _task_status(body: object) -> str | None:
    if isinstance(body, dict) and isinstance(body.get("TaskStatus"), str):
        return str(body["TaskStatus"])
    return None


def _task_messages(body: object) -> tuple[str, ...]:
    if not isinstance(body, dict) or not isinstance(body.get("Messages"), list):
        return ()
    return tuple(
        str(m["Message"])
        for m in body["Messages"]
        if isinstance(m, dict) and isinstance(m.get("Message"), str)
    )


_UUID = re.compile(r"^[0-9A-Fa-f]{8}-([0-9A-Fa-f]{4}-){3}[0-9A-Fa-f]{12}$")


def _system_uuid(value: object) -> str | None:
    """ComputerSystem.UUID in lower case (the host's DMI product UUID is compared with it)."""
    if isinstance(value, str) and _UUID.match(value.strip()):
        return value.strip().lower()
    return None
