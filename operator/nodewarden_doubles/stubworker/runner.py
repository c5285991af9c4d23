"""The stub node's runner: fake containers kept in memory, evaluated lazily against a clock.

No task per container: a container's state is computed from its start time, duration
(``runtime.durationHintSeconds``; none = runs until killed), exit code
(``runtime.exitCodeHint``) and, if the crash fault hit it, its crash time. That keeps
thousands of containers on thousands of stub workers cheap.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nodewarden.ssh.protocol import CONTAINER_UUID, SIGNALS

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

    def state(self, now: float) -> str:
        if self.kill_signal is not None:
            return "killed"
        if (
            self.crash_at is not None
            and now >= self.crash_at
            and (self.duration is None or self.crash_at < self.started_at + self.duration)
        ):
            return "lost"
        if self.duration is not None and now >= self.started_at + self.duration:
            return "exited"
        return "running"

    def status(self, now: float) -> dict[str, Any]:
        state = self.state(now)
        return {
            "uuid": self.uuid,
            "state": state,
            "pid": self.pid,
            "exitCode": self.exit_code if state == "exited" else None,
            "signal": self.kill_signal if state == "killed" else None,
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
        self.history: list[tuple[str, int, float]] = []
        """Every real start (uuid, pid, clock time), kept across reboots: test evidence."""

    def start(self, config_text: str) -> int:
        try:
            config = json.loads(config_text)
        except json.JSONDecodeError as exc:
            raise RunnerRefused(f"container config on stdin is not JSON: {exc.msg}", 2) from None
        if not isinstance(config, dict):
            raise RunnerRefused("container config must be a JSON object", 2)
        uuid = config.get("uuid")
        if not isinstance(uuid, str) or not CONTAINER_UUID.match(uuid):
            raise RunnerRefused("container config has no valid 'uuid'", 2)
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
        self._containers[uuid] = FakeContainer(
            uuid=uuid,
            pid=pid,
            started_at=now,
            duration=duration,
            exit_code=exit_code,
            crash_at=crash_at,
        )
        self.started += 1
        self.history.append((uuid, pid, now))
        return pid

    def running(self) -> list[FakeContainer]:
        now = self._clock()
        return [c for c in self._containers.values() if c.state(now) == "running"]

    def kill(self, uuid: str, signal: str) -> None:
        if signal not in SIGNALS:
            raise RunnerRefused(f"unsupported signal {signal}", 2)
        container = self._containers.get(uuid)
        now = self._clock()
        if container is not None and container.state(now) == "running":
            container.kill_signal = signal
            container.killed_at = now

    def status(self, uuid: str) -> dict[str, Any]:
        container = self._containers.get(uuid)
        if container is None:
            return {"uuid": uuid, "state": "unknown", "pid": None, "exitCode": None, "signal": None}
        return container.status(self._clock())

    def get(self, uuid: str) -> FakeContainer | None:
        return self._containers.get(uuid)

    def reboot(self) -> None:
        """A power cycle: every container and its record is gone."""
        self._containers.clear()


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return max(0.0, float(value))
