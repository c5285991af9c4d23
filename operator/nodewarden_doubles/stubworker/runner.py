"""The stub node's runner: fake containers kept in memory, evaluated lazily against a clock.

No task per container: a container's state is computed from its start time, duration
(``runtime.durationHintSeconds``; none = runs until killed), exit code
(``runtime.exitCodeHint``) and, if the crash fault hit it, its crash time. That keeps
thousands of containers on thousands of stub workers cheap.

The runner contract's owner and fencing (`nodewarden.ssh.protocol`): a run records the
dispatcher id, object uid and token it was started with; per dispatcher id the highest
token seen is kept (across reboots, as a real runner keeps it on disk) and a lower one
is refused (`RunnerRefused` with exit status `RUNNER_FENCED`).

`history` is the node's run ledger, test evidence that outlives reboots: every real
start with its owner, and its end as the node saw it (`FakeContainer.end`: exited,
killed, lost, or power loss), in the machine-readable form of `FakeContainer.record`.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nodewarden.ssh.protocol import CONTAINER_UUID, RUNNER_FENCED, SIGNALS

_FIRST_PID = 2000
_DEFAULT_CRASH_WINDOW = 10.0


class RunnerRefused(Exception):
    """``run --detach`` refused the request; ``exit_status`` is what the command exits with."""

    def __init__(self, message: str, exit_status: int = 1) -> None:
        super().__init__(message)
        self.exit_status = exit_status


@dataclass(slots=True)
class FakeContainer:
    uuid: str
    pid: int
    started_at: float
    duration: float | None
    exit_code: int
    crash_at: float | None = None
    killed_at: float | None = None
    kill_signal: str | None = None
    power_lost_at: float | None = None
    """When the node lost power (or rebooted) while this container ran."""
    dispatcher_id: str | None = None
    uid: str | None = None
    fence: int | None = None

    def end(self, now: float) -> tuple[float, str] | None:
        """(when, how) this run ended by `now` -- exited, killed, lost (crash) or
        powerLoss -- or None while it runs."""
        ends: list[tuple[float, str]] = []
        if self.duration is not None:
            ends.append((self.started_at + self.duration, "exited"))
        if self.crash_at is not None:
            ends.append((self.crash_at, "lost"))
        if self.killed_at is not None:
            ends.append((self.killed_at, "killed"))
        if self.power_lost_at is not None:
            ends.append((self.power_lost_at, "powerLoss"))
        if not ends:
            return None
        first = min(ends)
        return first if first[0] <= now else None

    def state(self, now: float) -> str:
        if self.kill_signal is not None:
            return "killed"
        end = self.end(now)
        if end is None:
            return "running"
        return "exited" if end[1] == "exited" else "lost"

    def owner(self) -> dict[str, Any]:
        return {"dispatcherId": self.dispatcher_id, "uid": self.uid, "fence": self.fence}

    def status(self, now: float) -> dict[str, Any]:
        state = self.state(now)
        return {
            "uuid": self.uuid,
            "state": state,
            "pid": self.pid,
            "exitCode": self.exit_code if state == "exited" else None,
            "signal": self.kill_signal if state == "killed" else None,
            **self.owner(),
        }

    def list_line(self) -> str:
        """This run's ``--list`` line (owner fields only when recorded)."""
        fields = [str(self.pid), self.uuid]
        if self.dispatcher_id is not None:
            fields.append(f"dispatcher={self.dispatcher_id}")
        if self.uid is not None:
            fields.append(f"uid={self.uid}")
        if self.fence is not None:
            fields.append(f"fence={self.fence}")
        return " ".join(fields)

    def record(self, now: float) -> dict[str, Any]:
        """The run ledger entry: start and (once over) end on the node's clock, how it
        ended, and its owner."""
        end = self.end(now)
        return {
            "uuid": self.uuid,
            "pid": self.pid,
            "startedAt": self.started_at,
            "endedAt": end[0] if end is not None else None,
            "end": end[1] if end is not None else None,
            "exitCode": self.exit_code if end is not None and end[1] == "exited" else None,
            "signal": self.kill_signal,
            **self.owner(),
        }


class FakeRunner:
    """run --detach / --list / --kill / --status over in-memory containers."""

    def __init__(
        self,
        rng: random.Random,
        clock: Callable[[], float],
        crash_rate: Callable[[], float],
        start_failure_rate: Callable[[], float],
    ) -> None:
        self._rng = rng
        self._clock = clock
        self._crash_rate = crash_rate
        self._start_failure_rate = start_failure_rate
        self._containers: dict[str, FakeContainer] = {}
        self._next_pid = _FIRST_PID
        self.started = 0
        self.history: list[FakeContainer] = []
        """Every real start, kept across reboots (the run ledger; see the module)."""
        self.highest_fence: dict[str, int] = {}
        """Per dispatcher id, the highest fencing token seen (survives reboots)."""
        self.refused = 0
        """Commands refused for a fencing token below the highest seen."""

    def _fenced(self, dispatcher_id: str | None, fence: int | None) -> None:
        """Refuse a token below the highest seen for that dispatcher; remember a higher one."""
        if dispatcher_id is None or fence is None:
            return
        highest = self.highest_fence.get(dispatcher_id)
        if highest is not None and fence < highest:
            self.refused += 1
            raise RunnerRefused(
                f"fenced: token {fence} is lower than {highest}, the highest this node has "
                f"seen from dispatcher {dispatcher_id}",
                RUNNER_FENCED,
            )
        self.highest_fence[dispatcher_id] = fence

    def start(
        self,
        config_text: str,
        *,
        dispatcher_id: str | None = None,
        uid: str | None = None,
        fence: int | None = None,
    ) -> int:
        try:
            config = json.loads(config_text)
        except json.JSONDecodeError as exc:
            raise RunnerRefused(f"container config on stdin is not JSON: {exc.msg}", 2) from None
        if not isinstance(config, dict):
            raise RunnerRefused("container config must be a JSON object", 2)
        uuid = config.get("uuid")
        if not isinstance(uuid, str) or not CONTAINER_UUID.match(uuid):
            raise RunnerRefused("container config has no valid 'uuid'", 2)
        self._fenced(dispatcher_id, fence)
        now = self._clock()
        existing = self._containers.get(uuid)
        if existing is not None and existing.state(now) == "running":
            return existing.pid
        runtime = config.get("runtime") or {}
        if not isinstance(runtime, dict):
            raise RunnerRefused("'runtime' must be an object", 2)
        duration = _number(runtime.get("durationHintSeconds"))
        exit_code = runtime.get("exitCodeHint")
        if not isinstance(exit_code, int) or isinstance(exit_code, bool):
            exit_code = 0
        if self._rng.random() < self._start_failure_rate():
            raise RunnerRefused("runner failed to start (injected fault)", 1)
        crash_at = None
        if self._rng.random() < self._crash_rate():
            window = duration if duration is not None else _DEFAULT_CRASH_WINDOW
            crash_at = now + self._rng.random() * window
        pid = self._next_pid
        self._next_pid += 1
        container = FakeContainer(
            uuid=uuid,
            pid=pid,
            started_at=now,
            duration=duration,
            exit_code=exit_code,
            crash_at=crash_at,
            dispatcher_id=dispatcher_id,
            uid=uid,
            fence=fence,
        )
        self._containers[uuid] = container
        self.started += 1
        self.history.append(container)
        return pid

    def ledger(self) -> list[dict[str, Any]]:
        """Every run's `FakeContainer.record` now, in start order."""
        now = self._clock()
        return [c.record(now) for c in self.history]

    def next_end(self) -> float | None:
        """The earliest time (runner's clock) a running container will end by itself."""
        now = self._clock()
        ends = [e[0] for c in self._containers.values() if (e := c.end(float("inf"))) is not None]
        due = [t for t in ends if t > now]
        return min(due) if due else None

    def running(self) -> list[FakeContainer]:
        now = self._clock()
        return [c for c in self._containers.values() if c.state(now) == "running"]

    def kill(
        self,
        uuid: str,
        signal: str,
        *,
        dispatcher_id: str | None = None,
        fence: int | None = None,
    ) -> None:
        if signal not in SIGNALS:
            raise RunnerRefused(f"unsupported signal {signal}", 2)
        self._fenced(dispatcher_id, fence)
        container = self._containers.get(uuid)
        now = self._clock()
        if container is not None and container.state(now) == "running":
            container.kill_signal = signal
            container.killed_at = now

    def status(self, uuid: str) -> dict[str, Any]:
        container = self._containers.get(uuid)
        if container is None:
            return {
                "uuid": uuid,
                "state": "unknown",
                "pid": None,
                "exitCode": None,
                "signal": None,
                "dispatcherId": None,
                "uid": None,
                "fence": None,
            }
        return container.status(self._clock())

    def get(self, uuid: str) -> FakeContainer | None:
        return self._containers.get(uuid)

    def reboot(self) -> None:
        """A power cycle: every container and its record is gone (the ledger keeps the
        runs, ended by the power loss; the fencing tokens are kept, as on disk)."""
        now = self._clock()
        for container in self._containers.values():
            if container.state(now) == "running":
                container.power_lost_at = now
        self._containers.clear()


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return max(0.0, float(value))
