"""Redfish adapter: read and change a side node's power through its BMC, with typed facts.

- `RedfishClient` (client.py): discovery, PowerState, allowable reset types, reset requests
  and task monitors, over aiohttp (transport.py) with verified TLS.
- auth.py: session login (X-Auth-Token) with fallback to Basic auth, session deletion.
- `request_and_confirm` (confirmation.py): reset only if needed, then poll PowerState to
  the target within a deadline and a budget of attempts; `decide_confirmation_step` is
  its pure rule.
- facts.py: what the adapter returns; errors.py: what it raises.
- the fake BMC for faults sushy-tools cannot produce lives beside the product, in
  the test doubles' fake BMC module (tests, demo).
"""

from __future__ import annotations

from nodewarden.redfish.client import RedfishClient
from nodewarden.redfish.config import RedfishEndpointConfig
from nodewarden.redfish.confirmation import (
    RESET_TARGETS,
    ConfirmationSettings,
    ConfirmationStep,
    PowerControl,
    PowerTransitionResult,
    StepKind,
    decide_confirmation_step,
    request_and_confirm,
)
from nodewarden.redfish.errors import (
    ActionNotSupported,
    AuthFailed,
    ConfirmationDeadlineExceeded,
    Conflict409,
    NotFound,
    RedfishConnectionError,
    RedfishError,
    RedfishHttpError,
    RedfishProtocolError,
    RedfishTimeout,
    SystemDiscoveryError,
    TlsError,
)
from nodewarden.redfish.facts import (
    FailedResetRequest,
    PowerStateObservation,
    RedfishPowerState,
    ResetCapabilities,
    ResetRequestResult,
    SystemRef,
    TaskOutcome,
)

__all__ = [
    "RESET_TARGETS",
    "ActionNotSupported",
    "AuthFailed",
    "ConfirmationDeadlineExceeded",
    "ConfirmationSettings",
    "ConfirmationStep",
    "Conflict409",
    "FailedResetRequest",
    "NotFound",
    "PowerControl",
    "PowerStateObservation",
    "PowerTransitionResult",
    "RedfishClient",
    "RedfishConnectionError",
    "RedfishEndpointConfig",
    "RedfishError",
    "RedfishHttpError",
    "RedfishPowerState",
    "RedfishProtocolError",
    "RedfishTimeout",
    "ResetCapabilities",
    "ResetRequestResult",
    "StepKind",
    "SystemDiscoveryError",
    "SystemRef",
    "TaskOutcome",
    "TlsError",
    "decide_confirmation_step",
    "request_and_confirm",
]
