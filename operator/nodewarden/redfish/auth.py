"""Authentication to one BMC: a Redfish session (X-Auth-Token), else HTTP Basic.

`RedfishAuth.request` sends an authenticated request. The rules:
- Session login succeeds on any 2xx that carries an X-Auth-Token and names the new
  session (Location header, else the body's @odata.id): 200, 201 and 204 alike. The
  client only runs on a session it can delete.
- Credentials rejected at login (401/403) are AuthFailed and are never retried as
  Basic: the same wrong password sent twice would count twice towards the BMC's
  lockout.
- Any other failed login falls back to Basic auth, as `spec.bmc.useSessions` promises:
  no SessionService link, any other HTTP error (404, 405, 5xx…), a 2xx without a token,
  or a session nothing names. A session the BMC created anyway is deleted at once (with
  Basic auth when no token came back); one that nothing names cannot be, and is
  reported. Basic reached this way is kept for the client's life; if the BMC refuses it
  (401), the AuthFailed names the failed login and the next request tries a session
  login again.
- A login that does not complete (timeout, connection lost, TLS) raises the
  transport's error and the next request tries again; if the session was created and
  only the reply body broke off (stalled → RedfishTimeout, cut), it is deleted first.
- In session mode a 401 triggers exactly one fresh login (shared by concurrent callers)
  and one retry. The session the 401 ended is deleted once the new login succeeded. If
  the token the BMC has just issued is refused as well, that session is deleted too and
  the request is retried once with Basic auth (kept for the client's life).
- No lockout: a login the BMC refuses (401/403 to the session login; 401 to Basic auth
  the node is configured for, or after the BMC refused its own fresh token) stops every
  further login to that BMC with those credentials (`RefusedLogins`, process-wide): each
  later request fails at once with an AuthFailed that says so, sending nothing, until
  the credentials change (a new Secret value gives a new client) or the operator
  restarts. So a rotated password costs one failed login, not one per read.
- Every session created is deleted: at close (`logout`), after a re-login, when its
  token is refused, after a half-failed login. A session is deleted with its own token,
  else -- when the BMC refuses that token and a login with the password has just
  succeeded -- with Basic auth; never with a password the BMC refused.

The token and password live in SecretStr and are put into headers only at send time.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import SecretStr

from nodewarden.redfish.errors import AuthFailed, RedfishError
from nodewarden.redfish.transport import BmcTransport, HttpReply, error_for_status

logger = logging.getLogger(__name__)

SERVICE_ROOT = "/redfish/v1/"
STANDARD_SESSIONS_PATH = SERVICE_ROOT + "SessionService/Sessions"
"""The Sessions collection URI the Redfish specification fixes for every service."""
SESSION_DELETE_TIMEOUT = 5.0
AuthMode = Literal["session", "basic"]


@dataclass(frozen=True, slots=True)
class _Refusal:
    fingerprint: bytes
    why: str
    at: str


class RefusedLogins:
    """BMCs that refused a login, per endpoint, with a keyed hash of the credentials they
    refused (never the credentials). Shared by every client of the process."""

    def __init__(self) -> None:
        self._key = os.urandom(32)
        self._refused: dict[str, _Refusal] = {}

    def fingerprint(self, username: str, password: SecretStr) -> bytes:
        raw = f"{username}\0{password.get_secret_value()}".encode()
        return hashlib.blake2b(raw, key=self._key, digest_size=16).digest()

    def refuse(self, endpoint: str, fingerprint: bytes, why: str) -> None:
        at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self._refused[endpoint] = _Refusal(fingerprint, why, at)

    def refused(self, endpoint: str, fingerprint: bytes) -> _Refusal | None:
        """The refusal that still holds for these credentials (None: may log in)."""
        entry = self._refused.get(endpoint)
        if entry is None:
            return None
        if entry.fingerprint != fingerprint:
            del self._refused[endpoint]  # other credentials now: they may try once
            return None
        return entry


REFUSED_LOGINS = RefusedLogins()


class RedfishAuth:
    """Holds the credentials and the current session of one BMC."""

    def __init__(
        self,
        transport: BmcTransport,
        *,
        username: str,
        password: SecretStr,
        use_sessions: bool,
        refused_logins: RefusedLogins = REFUSED_LOGINS,
    ) -> None:
        self._transport = transport
        self._username = username
        self._password = password
        self._use_sessions = use_sessions
        self._refused_logins = refused_logins
        self._fingerprint = refused_logins.fingerprint(username, password)
        self._basic_only = False
        self._password_accepted = False
        """A login with this password succeeded: Basic auth may delete a session."""
        self._mode: AuthMode | None = None
        self._token: SecretStr | None = None
        self._session_path: str | None = None
        self._fallback_reason: str | None = None
        self._deleting_token: SecretStr | None = None
        self._generation = 0
        self._lock = asyncio.Lock()
        self.logins = 0

    def __repr__(self) -> str:
        return f"RedfishAuth(endpoint={self._transport.endpoint!r}, mode={self._mode!r})"

    @property
    def mode(self) -> AuthMode | None:
        """'session' or 'basic' once decided, None before the first request."""
        return self._mode

    @property
    def fallback_reason(self) -> str | None:
        """Why sessions were configured but Basic auth is used (None: no fallback)."""
        return self._fallback_reason

    def secret_values(self) -> list[str]:
        """Values that must never appear in any text the adapter produces."""
        values = [self._password.get_secret_value()]
        for token in (self._token, self._deleting_token):
            if token is not None:
                values.append(token.get_secret_value())
        return values

    def _basic_header(self) -> dict[str, str]:
        raw = f"{self._username}:{self._password.get_secret_value()}".encode()
        return {"Authorization": "Basic " + base64.b64encode(raw).decode("ascii")}

    def _headers(self) -> dict[str, str]:
        if self._mode == "session" and self._token is not None:
            return {"X-Auth-Token": self._token.get_secret_value()}
        return self._basic_header()

    async def request(
        self,
        method: str,
        path: str,
        *,
        json_body: Mapping[str, Any] | None = None,
        time_limit: float | None = None,
    ) -> HttpReply:
        """An authenticated request; 401 in session mode → one re-login and one retry."""
        self._check_not_refused()
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
            if reply.status == 401 and self._mode == "session":
                await self._token_refused()
                reply = await self._transport.request(
                    method,
                    path,
                    headers=self._headers(),
                    json_body=json_body,
                    time_limit=time_limit,
                )
                if reply.status == 401:
                    self._refuse("the BMC refused its own new session token and Basic auth")
                    raise self._refused_error(method, path)
        if reply.status == 401 and self._mode == "basic" and self._basic_only:
            # Basic is the only way in (configured, or the BMC offers no sessions): the
            # credentials are refused, and sending them again counts towards a lockout
            self._refuse("the BMC refused Basic auth (HTTP 401)")
            raise self._refused_error(method, path)
        if reply.status == 401 and self._mode == "basic" and self._fallback_reason is not None:
            # Basic after a session login that failed for another reason (it may recover)
            reason = self._fallback_reason
            self._mode = None  # the next request tries a session login again
            self._fallback_reason = None
            raise AuthFailed(
                self._transport.endpoint,
                f"{method} {path}: the BMC refused Basic auth (HTTP 401), used because "
                f"{reason}; check the BMC user name and password Secret, and that the "
                "BMC offers sessions or Basic auth",
                401,
            )
        if reply.status in (401, 403):
            raise error_for_status(self._transport.endpoint, reply, f"{method} {path}")
        return reply

    # -- refused logins -----------------------------------------------------------------

    def _check_not_refused(self) -> None:
        entry = self._refused_logins.refused(self._transport.endpoint, self._fingerprint)
        if entry is not None:
            raise AuthFailed(
                self._transport.endpoint,
                f"logins to this BMC are stopped: {entry.why} at {entry.at}; nodewarden "
                "sends no further login with these credentials (no lockout) until the "
                "BMC credentials Secret changes or the operator restarts",
                401,
            )

    def _refuse(self, why: str) -> None:
        self._refused_logins.refuse(self._transport.endpoint, self._fingerprint, why)
        self._mode = None
        logger.warning(
            "redfish %s; no further login to this BMC until its credentials change",
            why,
            extra={"redfish_endpoint": self._transport.endpoint},
        )

    def _refused_error(self, method: str, path: str) -> AuthFailed:
        entry = self._refused_logins.refused(self._transport.endpoint, self._fingerprint)
        why = entry.why if entry is not None else "the BMC refused the credentials"
        return AuthFailed(
            self._transport.endpoint,
            f"{method} {path}: {why}; check the BMC user name and password Secret. "
            "nodewarden sends no further login to this BMC until the Secret changes",
            401,
        )

    async def _token_refused(self) -> None:
        """The token of a session created a moment ago is refused too: delete that session
        (Basic auth if its own token is refused) and use Basic auth from now on."""
        path, token = self._session_path, self._token
        if path is not None and token is not None:
            await self._delete_session(path, token)
        self._use_basic("the BMC refused the session token it had just issued", only=True)

    async def _establish(self, seen_generation: int) -> None:
        async with self._lock:
            if self._generation != seen_generation:
                return  # another caller logged in meanwhile
            self._check_not_refused()  # ... or had its login refused meanwhile
            old_path, old_token = self._session_path, self._token
            await self._login()
            self._generation += 1
            if old_path is not None and old_path != self._session_path:
                # the session the 401 ended: usually gone already, else it would stay
                # until the BMC's session timeout (BMCs hold only a few sessions)
                await self._delete_session(old_path, old_token)

    def _use_basic(self, reason: str | None, only: bool = False) -> None:
        """Basic auth from now on; `only`: no session login can help (configured, or no
        SessionService), so a 401 means the credentials are refused."""
        self._basic_only = only or reason is None
        self._mode = "basic"
        self._token = None
        self._session_path = None
        self._fallback_reason = reason
        if reason is not None:
            logger.info(
                "redfish %s; using Basic auth",
                reason,
                extra={"redfish_endpoint": self._transport.endpoint},
            )

    async def _login(self) -> None:
        endpoint = self._transport.endpoint
        if not self._use_sessions:
            self._use_basic(None)
            return
        sessions_path = await self._sessions_path()
        if sessions_path is None:
            self._use_basic("the service root links no SessionService", only=True)
            return
        reply = await self._transport.request(
            "POST",
            sessions_path,
            json_body={
                "UserName": self._username,
                "Password": self._password.get_secret_value(),
            },
            keep_broken_body=True,
        )
        if reply.status in (401, 403):
            self._refuse(f"the session login was rejected (HTTP {reply.status})")
            raise AuthFailed(
                endpoint,
                f"session login rejected (HTTP {reply.status}); check the BMC user name "
                "and password Secret. nodewarden sends no further login to this BMC until "
                "the Secret changes",
                reply.status,
            )
        if not 200 <= reply.status < 300:
            self._use_basic(f"session login failed (HTTP {reply.status})")
            return
        token = reply.auth_token
        session_path = reply.location or _odata_id(reply.body)
        if reply.body_error is not None:
            # The BMC created the session, then the reply broke off: do not keep it.
            if token is not None and session_path is not None:
                await self._delete_session(session_path, token)
            raise reply.body_error
        if token is None:
            if session_path is not None:
                await self._delete_session(session_path, None)
            self._use_basic(f"session login answered HTTP {reply.status} without X-Auth-Token")
            return
        if session_path is None:
            logger.warning(
                "redfish session login answered without Location or session @odata.id: "
                "the session cannot be deleted and stays until the BMC's session timeout",
                extra={"redfish_endpoint": endpoint},
            )
            self._use_basic("session login named no session (no Location)")
            return
        self._mode = "session"
        self._token = token
        self._session_path = session_path
        self._fallback_reason = None
        self._password_accepted = True
        self.logins += 1
        logger.info(
            "redfish session established",
            extra={"redfish_endpoint": endpoint, "redfish_logins": self.logins},
        )

    async def _sessions_path(self) -> str | None:
        """The Sessions collection: linked from the service root, else the standard URI.

        None when the root is readable and links no SessionService at all.
        """
        reply = await self._transport.request("GET", SERVICE_ROOT)
        if reply.status >= 400 or not isinstance(reply.body, dict):
            return STANDARD_SESSIONS_PATH  # a root behind auth: try the fixed URI
        root = reply.body
        links = root.get("Links")
        if isinstance(links, dict):
            path = _odata_id(links.get("Sessions"))
            if path:
                return path
        if _odata_id(root.get("SessionService")):
            return STANDARD_SESSIONS_PATH
        return None

    async def _delete_session(self, path: str, token: SecretStr | None) -> bool:
        """DELETE one session with its own token, else Basic auth; best effort.

        Failures are logged, not raised. A 401 to the session's own token means it is
        gone (expired) -- or that the BMC refuses tokens: then, if a login with the
        password succeeded (never with a password the BMC refused), the DELETE is sent
        again with Basic auth. 404 means the session is already gone.
        """
        endpoint = self._transport.endpoint
        headers = (
            self._basic_header() if token is None else {"X-Auth-Token": token.get_secret_value()}
        )
        self._deleting_token = token
        try:
            reply = await self._transport.request(
                "DELETE", path, headers=headers, time_limit=SESSION_DELETE_TIMEOUT
            )
            status = reply.status
            if status == 401 and token is not None and self._basic_may_delete():
                basic = await self._transport.request(
                    "DELETE", path, headers=self._basic_header(), time_limit=SESSION_DELETE_TIMEOUT
                )
                if basic.status != 401:
                    status = basic.status
        except RedfishError as exc:
            logger.warning(
                "redfish session could not be deleted: %s",
                exc.detail,
                extra={"redfish_endpoint": endpoint},
            )
            return False
        finally:
            self._deleting_token = None
        gone = status == 404 or (status == 401 and token is not None)
        if status >= 300 and not gone:
            logger.warning(
                "redfish session could not be deleted (HTTP %s)",
                status,
                extra={"redfish_endpoint": endpoint, "http_status": status},
            )
            return False
        logger.debug("redfish session deleted (HTTP %s)", status)
        return True

    def _basic_may_delete(self) -> bool:
        """Basic auth may be used to delete a session: the password was accepted at a login
        and no login with it has been refused since."""
        refused = self._refused_logins.refused(self._transport.endpoint, self._fingerprint)
        return self._password_accepted and refused is None

    async def logout(self) -> None:
        """Delete the session, if any (best effort: errors are logged, not raised)."""
        if self._mode != "session" or self._token is None or self._session_path is None:
            return
        try:
            await self._delete_session(self._session_path, self._token)
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
