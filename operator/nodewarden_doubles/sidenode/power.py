"""Where a side node's power comes from: a fake BMC system, a sushy-tools system, or its own WoL state.

A `PowerSource` is read synchronously on every tick of the node (`reading()`), so a
thousand nodes cost a thousand cheap calls and no HTTP per tick:

- `FakeBmcPower` reads an in-process `nodewarden_doubles.fakebmc.FakeBmc` through its
  public `power_of()` and `resets` record (a restart that settles between two ticks is
  still seen as a power cycle). It never sends HTTP to the BMC, so the BMC's request
  and reset logs hold only what the operator sent.
- `SushyPower` polls one system of a sushy-tools emulator over HTTPS (loopback, verified
  TLS, Basic auth) every ``interval`` seconds in a background task and serves the last
  answer. sushy applies a reset after a random 1-11 s, and only when a GET reads it:
  this poll is what makes the emulated machine change state. A sushy restart shows
  only if a poll catches its intermediate Off (sushy may apply it within a second).
- `WolPower` is the node's own state: On by a magic packet, Off when the host powers
  itself off. There is no BMC to ask.

``switch_off()`` is what happens when the host powered itself off (``systemctl
poweroff``): the fake BMC's system is set Off directly (`FakeBmc.set_power`), sushy gets
a ``ForceOff`` through its reset API (the only way to change its state), a WoL node
just goes Off. ``set_power()`` is the admin's direct switch (tests, demos).
"""

from __future__ import annotations

import asyncio
import base64
import logging
import ssl
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import aiohttp
from pydantic import SecretStr

from nodewarden_doubles.fakebmc import FakeBmc
from nodewarden_doubles.sidenode.ticker import cancel, every

logger = logging.getLogger(__name__)

Power = Literal["On", "Off"]
POWER_VALUES: tuple[Power, ...] = ("On", "Off")

_RESTART_TYPES = frozenset({"GracefulRestart", "ForceRestart", "PowerCycle"})
# What a transitional PowerState means for the machine itself: PoweringOn = not yet
# powered, PoweringOff = still powered.
_PHYSICAL: dict[str, Power] = {
    "On": "On",
    "Off": "Off",
    "PoweringOn": "Off",
    "PoweringOff": "On",
}


@dataclass(frozen=True, slots=True)
class PowerReading:
    """The source's power now (None = not known yet) and how many power cycles
    (restarts) it has seen so far; a change of ``cycles`` means "power was cut and
    restored", even when two readings both say On."""

    power: Power | None
    cycles: int = 0


class PowerSource(Protocol):
    """What a `PoweredSideNode` needs from its power source."""

    kind: str

    def reading(self) -> PowerReading: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def switch_off(self) -> None:
        """The host powered itself off (after its OS shut down)."""

    async def set_power(self, state: Power) -> None:
        """Switch the power directly (admin: tests and demos)."""

    def describe(self) -> dict[str, Any]:
        """Where to reach the source (no secrets): for the state file and admin API."""


class FakeBmcPower:
    """One system of an in-process `FakeBmc` (the BMC may hold several systems)."""

    kind = "fakebmc"

    def __init__(self, bmc: FakeBmc, system_id: str = "1") -> None:
        if system_id not in bmc.options.system_ids:
            raise ValueError(
                f"the fake BMC has no system {system_id!r} (it has {list(bmc.options.system_ids)})"
            )
        self.bmc = bmc
        self.system_id = system_id
        self._resets_seen = 0
        self._cycles = 0

    def reading(self) -> PowerReading:
        resets = self.bmc.resets
        for record in resets[self._resets_seen :]:
            if (
                record.system_id == self.system_id
                and record.reset_type in _RESTART_TYPES
                and record.outcome == "scheduled"
            ):
                self._cycles += 1
        self._resets_seen = len(resets)
        reported = self.bmc.power_of(self.system_id)
        return PowerReading(_PHYSICAL.get(reported), self._cycles)

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    async def switch_off(self) -> None:
        self.bmc.set_power(self.system_id, "Off")

    async def set_power(self, state: Power) -> None:
        self.bmc.set_power(self.system_id, state)

    def describe(self) -> dict[str, Any]:
        return {
            "source": self.kind,
            "endpoint": self.bmc.url,
            "system_id": self.system_id,
            "username": self.bmc.options.username,
        }


class SushyPower:
    """One system of a sushy-tools emulator, polled over HTTPS in a background task."""

    kind = "sushy"

    def __init__(
        self,
        endpoint: str,
        system_id: str,
        *,
        username: str,
        password: SecretStr,
        ca_pem: str,
        interval: float = 0.25,
        session: aiohttp.ClientSession | None = None,
        request_timeout: float = 5.0,
    ) -> None:
        if interval <= 0:
            raise ValueError("interval must be > 0")
        self.endpoint = endpoint.rstrip("/")
        self.system_id = system_id
        self.username = username
        self._password = password
        self._ssl = ssl.create_default_context(cadata=ca_pem)
        self.interval = interval
        self._session = session
        self._own_session = session is None
        self._timeout = aiohttp.ClientTimeout(total=request_timeout)
        self._power: Power | None = None
        self._cycles = 0
        self._task: asyncio.Task[None] | None = None
        self.polls = 0
        self.poll_errors = 0
        self.resets_sent: list[str] = []

    @property
    def _path(self) -> str:
        return f"{self.endpoint}/redfish/v1/Systems/{self.system_id}"

    def _headers(self) -> dict[str, str]:
        raw = f"{self.username}:{self._password.get_secret_value()}".encode()
        return {"Authorization": "Basic " + base64.b64encode(raw).decode("ascii")}

    def reading(self) -> PowerReading:
        return PowerReading(self._power, self._cycles)

    async def start(self) -> None:
        if self._task is not None:
            return
        if self._session is None:
            self._session = aiohttp.ClientSession()
        self._task = every(self.interval, self.poll_once, f"sushy poll {self.system_id}")

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancel(task)
        if self._own_session and self._session is not None:
            await self._session.close()
            self._session = None

    async def poll_once(self) -> None:
        """One GET of the system (this GET is also what lets sushy apply a pending reset)."""
        assert self._session is not None, "start() first"
        self.polls += 1
        try:
            async with self._session.get(
                self._path, headers=self._headers(), ssl=self._ssl, timeout=self._timeout
            ) as response:
                if response.status != 200:
                    raise aiohttp.ClientResponseError(
                        response.request_info, (), status=response.status
                    )
                body = await response.json()
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            self.poll_errors += 1
            logger.debug(
                "sushy poll failed",
                extra={"sushy_system": self.system_id, "error": type(exc).__name__},
            )
            return
        state = _PHYSICAL.get(str(body.get("PowerState"))) if isinstance(body, dict) else None
        if state is not None:
            self._power = state

    async def _reset(self, reset_type: str) -> None:
        assert self._session is not None, "start() first"
        self.resets_sent.append(reset_type)
        async with self._session.post(
            f"{self._path}/Actions/ComputerSystem.Reset",
            json={"ResetType": reset_type},
            headers=self._headers(),
            ssl=self._ssl,
            timeout=self._timeout,
        ) as response:
            if response.status >= 300:
                raise RuntimeError(
                    f"sushy refused reset {reset_type} of {self.system_id}: HTTP {response.status}"
                )

    async def switch_off(self) -> None:
        await self._reset("ForceOff")

    async def set_power(self, state: Power) -> None:
        await self._reset("On" if state == "On" else "ForceOff")

    def describe(self) -> dict[str, Any]:
        return {
            "source": self.kind,
            "endpoint": self.endpoint,
            "system_id": self.system_id,
            "username": self.username,
        }


class WolPower:
    """A node without a BMC: its power is this object's state."""

    kind = "wol"

    def __init__(self, initial: Power = "Off") -> None:
        self.power: Power = initial

    def reading(self) -> PowerReading:
        return PowerReading(self.power)

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    async def switch_off(self) -> None:
        self.power = "Off"

    async def set_power(self, state: Power) -> None:
        self.power = state

    def describe(self) -> dict[str, Any]:
        return {"source": self.kind}
