"""Authentication to one BMC: a Redfish session (X-Auth-Token) or HTTP Basic as fallback.

`RedfishAuth.request` sends an authenticated request. In session mode a 401 triggers
exactly one fresh login (shared by concurrent callers) and one retry; a second 401 is
AuthFailed. A BMC without a usable SessionService (no link, 404/405/501 on login) gets
Basic auth. Credentials rejected at login are AuthFailed, never silently retried as
Basic. The token and password live in SecretStr and are put into headers only at send
time; the session is deleted on close.
"""

from __future__ import annotations

import asyncio
import base64
import logging
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import SecretStr

from nodewarden.redfish.errors import AuthFailed, RedfishError
from nodewarden.redfish.transport import HttpReply, RedfishTransport, error_for_status

logger = logging.getLogger(__name__)

SERVICE_ROOT = "/redfish/v1/"
AuthMode = Literal["session", "basic"]
_NO_SESSION_SERVICE = frozenset({404, 405, 501})


class RedfishAuth:
    """Holds the credentials and the current session of one BMC."""

    def __init__(
        self,
        transport: RedfishTransport,
        *,
        username: str,
        password: SecretStr,
        use_sessions: bool,
    ) -> None:
        self._transport = transport
        self._username = username
        self._password = password
        self._use_sessions = use_sessions
        self._mode: AuthMode | None = None
        self._token: SecretStr | None = None
        self._session_path: str | None = None
        self._generation = 0
        self._lock = asyncio.Lock()
        self.logins = 0

    def __repr__(self) -> str:
        return f"RedfishAuth(endpoint={self._transport.endpoint!r}, mode={self._mode!r})"

    @property
    def mode(self) -> AuthMode | None:
        """'session' or 'basic' once decided, None before the first request."""
        return self._mode

    def secret_values(self) -> list[str]:
        """Values that must never appear in any text the adapter produces."""
        values = [self._password.get_secret_value()]
        if self._token is not None:
            values.append(self._token.get_secret_value())
        return values

    def _headers(self) -> dict[str, str]:
        if self._mode == "session" and self._token is not None:
            return {"X-Auth-Token": self._token.get_secret_value()}
        raw = f"{self._username}:{self._password.get_secret_value()}".encode()
        return {"Authorization": "Basic " + base64.b64encode(raw).decode("ascii")}

    async def request(
        self,
        method: str,
        path: str,
        *,
        json_body: Mapping[str, Any] | None = None,
        time_limit: float | None = None,
    ) -> HttpReply:
        """An authenticated request; 401 in session mode → one re-login and one retry."""
        if self._mode is None:
            await self._establish(self._generation)
        generation = self._generation
        reply = await self._transport.request(
            method, path, headers=self._headers(), json_body=json_body, time_limit=time_limit
        )
        if reply.status == 401 and self._mode == "session":
            logger.info(
                "redfish session rejected (expired?); logging in again",
                extra={"redfish_endpoint": self._transport.endpoint},
            )
            await self._establish(generation)
            reply = await self._transport.request(
                method, path, headers=self._headers(), json_body=json_body, time_limit=time_limit
            )
        if reply.status in (401, 403):
            raise error_for_status(self._transport.endpoint, reply, f"{method} {path}")
        return reply

    async def _establish(self, seen_generation: int) -> None:
        async with self._lock:
            if self._generation != seen_generation:
                return  # another caller logged in meanwhile
            await self._login()
            self._generation += 1

    async def _login(self) -> None:
        endpoint = self._transport.endpoint
        if not self._use_sessions:
            self._mode = "basic"
            return
        sessions_path = await self._sessions_path()
        if sessions_path is None:
            logger.info(
                "redfish service offers no SessionService; using Basic auth",
                extra={"redfish_endpoint": endpoint},
            )
            self._mode = "basic"
            return
        reply = await self._transport.request(
            "POST",
            sessions_path,
            json_body={
                "UserName": self._username,
                "Password": self._password.get_secret_value(),
            },
        )
        if reply.status in _NO_SESSION_SERVICE:
            logger.info(
                "redfish session login not supported (HTTP %s); using Basic auth",
                reply.status,
                extra={"redfish_endpoint": endpoint},
            )
            self._mode = "basic"
            return
        if reply.status in (401, 403):
            raise AuthFailed(
                endpoint,
                f"session login as {self._username!r} rejected (HTTP {reply.status}); "
                "check the BMC user name and password Secret",
                reply.status,
            )
        if reply.status not in (200, 201) or reply.auth_token is None:
            if reply.status >= 400:
                raise error_for_status(endpoint, reply, "session login")
            raise RedfishError(
                endpoint, f"session login answered HTTP {reply.status} without X-Auth-Token"
            )
        self._mode = "session"
        self._token = reply.auth_token
        self._session_path = reply.location or _odata_id(reply.body)
        self.logins += 1
        logger.info(
            "redfish session established",
            extra={"redfish_endpoint": endpoint, "redfish_logins": self.logins},
        )

    async def _sessions_path(self) -> str | None:
        reply = await self._transport.request("GET", SERVICE_ROOT)
        if reply.status >= 400:
            raise error_for_status(self._transport.endpoint, reply, "reading the service root")
        root = reply.json_object(self._transport.endpoint)
        links = root.get("Links")
        if isinstance(links, dict):
            path = _odata_id(links.get("Sessions"))
            if path:
                return path
        if _odata_id(root.get("SessionService")):
            return SERVICE_ROOT + "SessionService/Sessions"
        return None

    async def logout(self) -> None:
        """Delete the session, if any (best effort: errors are logged, not raised)."""
        if self._mode != "session" or self._token is None or self._session_path is None:
            return
        try:
            reply = await self._transport.request(
                "DELETE", self._session_path, headers=self._headers(), time_limit=5.0
            )
            logger.debug("redfish session deleted (HTTP %s)", reply.status)
        except RedfishError as exc:
            logger.info("redfish session logout failed: %s", exc.detail)
        finally:
            self._token = None
            self._session_path = None
            self._mode = None


def _odata_id(value: object) -> str | None:
    if isinstance(value, dict):
        target = value.get("@odata.id")
        if isinstance(target, str) and target:
            return target
    return None
