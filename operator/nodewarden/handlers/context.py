"""What every handler may use: configuration, the Kubernetes adapter, credentials, the clock."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from nodewarden.clock import utc_now
from nodewarden.config import OperatorConfig
from nodewarden.credentials import CredentialResolver
from nodewarden.kube.client import Kube


@dataclass
class HandlerContext:
    config: OperatorConfig
    kube: Kube
    credentials: CredentialResolver
    clock: Callable[[], datetime] = field(default=utc_now)
