"""The cloud back-off state: which creates and calls must wait, and why (pure, clock passed in).

`CloudBackoff` is fed every classified outcome of a cloud call (`record_error`,
`record_success`) and answers the dispatcher's questions:

- `may_create(instance_type, now)` -> `CreatePermission`: may I create this type now? If
  not, the reason, the error kind that caused the block and when it ends;
- `call_allowed_at(now, operation)`: the earliest time a call of that operation may be
  made (rate limit);
- `blocked_types(catalogue, now)`: the catalogue names currently blocked, to pass as
  `at_capacity` to `nodewarden.scheduling.instancetypes.choose_instance_type`.

Rules (Arvados defaults, all configurable through `BackoffSettings`):

- quota error (`InstanceLimitExceeded`): every create blocked for `quota_block` (1 m);
- capacity error: creates of that provider type (and preemptible flag) blocked for
  `capacity_block` (1 m);
- quota-group error (`VcpuLimitExceeded`): creates of every type in the same
  `quota_group` blocked for `quota_group_block` (1 m); types without a group: all creates;
- rate limit: calls wait `delay`, where delay = previous delay x `rate_limit_factor`
  + `rate_limit_step`, clamped to [`rate_limit_min`, `rate_limit_max`] (1 s..1 m), and at
  least until the provider's Retry-After; a successful call resets the delay. Which calls
  wait depends on the call that drew the rate limit (`CallPriority`): the budget goes to
  creates and destroys first, then the instance list, then tag writes. A rate limit on a
  call holds back calls of its own priority and of every lower one, never a higher one:
  a refused tag write pauses tag writes only, a refused list pauses lists and tag
  writes, a refused create or destroy pauses everything. Each priority has its own
  delay, reset by a success at that priority;
- auth error: every create blocked for `auth_block` (1 m);
- permanent error on create: that type blocked for `permanent_block` (1 m), so a bad
  image or type is not retried on every sync but a configuration fix is picked up;
- transient and not-found errors: no block.

No I/O, no clock reads: deterministic given the inputs. Not thread-safe; use it from the
event loop that owns the cloud adapter.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import IntEnum

from pydantic import BaseModel, ConfigDict, Field

from nodewarden.cloud.errors import CloudError, CloudErrorKind
from nodewarden.scheduling.instancetypes import InstanceType


class BackoffSettings(BaseModel):
    """Durations (seconds) and factors of the cloud back-off."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    quota_block: float = Field(default=60.0, ge=0, description="Creates wait after a quota error.")
    capacity_block: float = Field(
        default=60.0, ge=0, description="Creates of a type wait after a capacity error."
    )
    quota_group_block: float = Field(
        default=60.0, ge=0, description="Creates of a quota group wait after a group error."
    )
    auth_block: float = Field(
        default=60.0, ge=0, description="Creates wait after the credentials were refused."
    )
    permanent_block: float = Field(
        default=60.0, ge=0, description="Creates of a type wait after a permanent error."
    )
    rate_limit_min: float = Field(default=1.0, ge=0, description="Shortest rate-limit wait.")
    rate_limit_max: float = Field(default=60.0, ge=0, description="Longest rate-limit wait.")
    rate_limit_factor: float = Field(default=1.5, ge=1.0, description="Growth per rate limit.")
    rate_limit_step: float = Field(default=1.0, ge=0, description="Seconds added per rate limit.")


class CallPriority(IntEnum):
    """Who gets the provider's rate-limit budget first (lower value first)."""

    MUTATE = 0
    """create, destroy: what the demand and the fleet's cost need."""
    LIST = 1
    """the instance list (sync)."""
    TAG = 2
    """tag writes: probe-time refreshes, idle behaviour, claims of a takeover."""


_PRIORITY_OF = {
    "create": CallPriority.MUTATE,
    "destroy": CallPriority.MUTATE,
    "list": CallPriority.LIST,
    "set_tags": CallPriority.TAG,
}


def call_priority(operation: str) -> CallPriority:
    """The priority of a cloud operation; an unknown one counts as a create (the most
    careful choice: its rate limit pauses everything)."""
    return _PRIORITY_OF.get(operation, CallPriority.MUTATE)


@dataclass
class _RateLimit:
    """The rate-limit state of one priority."""

    until: datetime | None = None
    delay: float = 0.0
    reason: str = ""


@dataclass(frozen=True)
class CreatePermission:
    """Answer to "may I create this type now?"."""

    allowed: bool
    reason: str
    blocked_by: CloudErrorKind | None = None
    retry_at: datetime | None = None


@dataclass
class _Block:
    until: datetime
    kind: CloudErrorKind
    reason: str


class CloudBackoff:
    """Back-off state of one cloud account; see the module docstring for the rules."""

    def __init__(self, settings: BackoffSettings | None = None) -> None:
        self.settings = settings or BackoffSettings()
        self._all_creates: _Block | None = None
        self._by_type: dict[tuple[str, bool], _Block] = {}
        self._by_group: dict[str, _Block] = {}
        self._rate_limits = {p: _RateLimit() for p in CallPriority}

    # ---- feeding outcomes -------------------------------------------------------------

    def record_error(
        self, error: CloudError, now: datetime, instance_type: InstanceType | None = None
    ) -> None:
        """Account for a classified error; `instance_type` is the type a create asked for."""
        s = self.settings
        if error.locally_throttled:
            return
        why = f"{error.kind.value} error at {now.isoformat()}: {error.message}"
        if error.kind is CloudErrorKind.RATE_LIMIT:
            limit = self._rate_limits[call_priority(error.operation)]
            delay = limit.delay * s.rate_limit_factor + s.rate_limit_step
            delay = min(max(delay, s.rate_limit_min), s.rate_limit_max)
            limit.delay = delay
            until = now + timedelta(seconds=delay)
            if error.retry_at is not None and error.retry_at > until:
                until = error.retry_at
            if limit.until is None or until > limit.until:
                limit.until = until
            limit.reason = f"{why} (answer to a {error.operation})"
            return
        if error.kind is CloudErrorKind.QUOTA:
            self._block_all(now, s.quota_block, error.kind, why)
        elif error.kind is CloudErrorKind.AUTH:
            self._block_all(now, s.auth_block, error.kind, why)
        elif error.kind is CloudErrorKind.QUOTA_GROUP:
            group = error.quota_group or (instance_type.quota_group if instance_type else None)
            if group is None:
                self._block_all(now, s.quota_group_block, error.kind, why)
            else:
                self._by_group[group] = _Block(
                    now + timedelta(seconds=s.quota_group_block), error.kind, why
                )
        elif error.kind in (CloudErrorKind.CAPACITY, CloudErrorKind.PERMANENT):
            if instance_type is None:
                return
            seconds = (
                s.capacity_block if error.kind is CloudErrorKind.CAPACITY else s.permanent_block
            )
            key = (instance_type.provider_type, instance_type.preemptible)
            self._by_type[key] = _Block(now + timedelta(seconds=seconds), error.kind, why)

    def record_success(self, now: datetime, operation: str = "create") -> None:
        """A cloud call succeeded: the rate-limit delay of its priority starts over."""
        limit = self._rate_limits[call_priority(operation)]
        limit.delay = 0.0
        if limit.until is not None and limit.until <= now:
            limit.until = None

    def _block_all(self, now: datetime, seconds: float, kind: CloudErrorKind, why: str) -> None:
        self._all_creates = _Block(now + timedelta(seconds=seconds), kind, why)

    # ---- questions --------------------------------------------------------------------

    def _holding(self, priority: CallPriority, now: datetime) -> _RateLimit | None:
        """The rate limit that holds back calls of `priority` longest now (None: none):
        those drawn at its own priority or a higher one."""
        active = [
            limit
            for p, limit in self._rate_limits.items()
            if p <= priority and limit.until is not None and limit.until > now
        ]
        return max(active, key=lambda limit: limit.until or now) if active else None

    def _until(self, priority: CallPriority, now: datetime) -> datetime | None:
        limit = self._holding(priority, now)
        return limit.until if limit is not None else None

    def call_allowed_at(self, now: datetime, operation: str = "create") -> datetime | None:
        """When the next call of `operation` may be made, or None if it may be made now."""
        return self._until(call_priority(operation), now)

    def rate_limit_delay_of(self, operation: str) -> float:
        """The current rate-limit delay in seconds of `operation`'s priority (0: none)."""
        return self._rate_limits[call_priority(operation)].delay

    @property
    def rate_limit_delay(self) -> float:
        """The longest current rate-limit delay in seconds (0 when not rate limited)."""
        return max(limit.delay for limit in self._rate_limits.values())

    def may_create(self, instance_type: InstanceType, now: datetime) -> CreatePermission:
        """May an instance of `instance_type` be created now? If not: why and until when."""
        blocks: list[_Block] = []
        if self._all_creates is not None and self._all_creates.until > now:
            blocks.append(self._all_creates)
        if instance_type.quota_group is not None:
            group_block = self._by_group.get(instance_type.quota_group)
            if group_block is not None and group_block.until > now:
                blocks.append(group_block)
        type_block = self._by_type.get((instance_type.provider_type, instance_type.preemptible))
        if type_block is not None and type_block.until > now:
            blocks.append(type_block)
        limit = self._holding(CallPriority.MUTATE, now)
        if limit is not None and limit.until is not None:
            blocks.append(_Block(limit.until, CloudErrorKind.RATE_LIMIT, limit.reason))
        if not blocks:
            return CreatePermission(allowed=True, reason=f"{instance_type.name} may be created")
        last = max(blocks, key=lambda b: b.until)
        return CreatePermission(
            allowed=False,
            reason=(
                f"creates of {instance_type.name} wait until {last.until.isoformat()} "
                f"after a {last.reason}"
            ),
            blocked_by=last.kind,
            retry_at=last.until,
        )

    def blocked_types(self, catalogue: Iterable[InstanceType], now: datetime) -> set[str]:
        """Catalogue names whose creates are blocked now (pass as `at_capacity`)."""
        return {t.name for t in catalogue if not self.may_create(t, now).allowed}

    def snapshot(self, now: datetime) -> dict[str, object]:
        """A JSON-friendly view for the management status endpoint and debugging."""
        out: dict[str, object] = {
            "rateLimitDelaySeconds": self.rate_limit_delay,
            "callsBlockedUntil": _iso(self.call_allowed_at(now)),
            "callsBlockedUntilByPriority": {
                p.name.lower(): _iso(self._until(p, now)) for p in CallPriority
            },
        }
        if self._all_creates is not None and self._all_creates.until > now:
            out["allCreatesBlockedUntil"] = _iso(self._all_creates.until)
            out["allCreatesBlockedBy"] = self._all_creates.kind.value
        out["typesBlocked"] = {
            f"{ptype}{' (preemptible)' if pre else ''}": _iso(b.until)
            for (ptype, pre), b in self._by_type.items()
            if b.until > now
        }
        out["quotaGroupsBlocked"] = {
            group: _iso(b.until) for group, b in self._by_group.items() if b.until > now
        }
        return out


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None
