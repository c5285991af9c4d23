"""Operator configuration: what one nodewarden process is (dispatcher id, namespace, endpoints).

Loaded from a YAML file (`nodewarden run --config FILE`, mounted from the Helm chart's
ConfigMap) with a few command-line overrides. Policy knobs do not live here; they live in
PowerPolicy objects so they can be changed by GitOps without a restart.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from nodewarden.api.base import DNS_LABEL_PATTERN, SecretKeyReference
from nodewarden.cloud.config import CloudConfig
from nodewarden.ssh.settings import ProbeSettings
from nodewarden.units import Duration


class ConfigError(Exception):
    """The operator configuration is invalid; the message names the field and the fix."""


class _Config(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class LeaderElection(_Config):
    enabled: bool = Field(default=True, description="Hold a Lease before acting.")
    lease_name: str | None = Field(
        default=None, description="Lease name; default nodewarden-<dispatcherId>."
    )
    lease_duration: float = Field(default=15.0, gt=1, description="Seconds a lease is valid.")
    renew_interval: float = Field(default=5.0, gt=0, description="Seconds between renewals.")
    retry_interval: float = Field(
        default=2.0, gt=0, description="Seconds between tries to acquire."
    )


class HttpConfig(_Config):
    host: str = Field(default="0.0.0.0", description="Listen address of the HTTP endpoint.")  # noqa: S104
    port: int = Field(default=8080, ge=0, le=65535, description="0 = pick a free port.")
    metrics_port: int | None = Field(
        default=None, ge=0, le=65535, description="/metrics and probes; unset = `port`."
    )


class ManagementConfig(_Config):
    token_secret_name: str | None = Field(
        default=None, description="Secret (operator namespace) holding the status API token."
    )
    token_secret_key: str = Field(default="token", description="Key of the token in the Secret.")


class DispatchSettings(_Config):
    """The dispatcher's loop timing and concurrency (Arvados defaults in brackets)."""

    enabled: bool = Field(default=True, description="Run the container dispatcher.")
    tick_interval: float = Field(
        default=1.0, gt=0, description="Seconds between planning rounds (also woken by events)."
    )
    sync_interval: float = Field(
        default=10.0, gt=0, description="Seconds between cloud instance listings [1 m]."
    )
    probe_interval: float = Field(
        default=10.0, gt=0, description="Seconds between probes of a ready node [10 s]."
    )
    boot_probe_interval: float = Field(
        default=2.0, gt=0, description="Seconds between probes of a booting node."
    )
    max_probes_per_second: float = Field(
        default=50.0, ge=0, description="Probe throttle (0 = unthrottled) [10/s]."
    )
    term_interval: float = Field(
        default=10.0, gt=0, description="Seconds between TERM signals to a cancelled runner."
    )
    term_timeout: float = Field(
        default=120.0, gt=0, description="Seconds of TERM before KILL [2 m]."
    )
    max_concurrent_starts: int = Field(default=20, ge=1, description="Runner starts in flight.")
    max_concurrent_writes: int = Field(
        default=16, ge=1, description="Kubernetes status writes in flight."
    )
    max_new_nodes_per_round: int = Field(
        default=50, ge=1, description="Instances the dispatcher asks for per planning round."
    )
    probe_tag_interval: float = Field(
        default=60.0,
        gt=0,
        description="Seconds between refreshes of the last-probe tag on an instance.",
    )
    ssh_user: str = Field(default="root", description="Login user on cloud nodes.")
    ssh_private_key_secret: SecretKeyReference | None = Field(
        default=None,
        description="Secret key (operator namespace) holding the SSH private key for nodes.",
    )


class OperatorConfig(_Config):
    """Configuration of one operator process."""

    dispatcher_id: str = Field(
        default="nodewarden",
        min_length=1,
        max_length=40,
        pattern=DNS_LABEL_PATTERN,
        description="Identity written into cloud tags and leases; unique per dispatcher.",
    )
    namespace: str | None = Field(
        default=None, description="Namespace to watch; unset = the kubeconfig's namespace."
    )
    all_namespaces: bool = Field(default=False, description="Watch every namespace.")
    default_policy: str = Field(
        default="default",
        description="PowerPolicy used by WorkerNodes without spec.policyRef.",
    )
    resync_interval: Duration = Field(
        default="30s", description="How often objects are re-validated without a change."
    )
    log_format: Literal["json", "text"] = Field(default="json")
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(default="INFO")
    kubeconfig: Path | None = Field(
        default=None, description="Kubeconfig file; unset = in-cluster or $KUBECONFIG."
    )
    leader_election: LeaderElection = Field(default_factory=LeaderElection)
    http: HttpConfig = Field(default_factory=HttpConfig)
    management: ManagementConfig = Field(default_factory=ManagementConfig)
    cloud: CloudConfig | None = Field(
        default=None, description="Cloud driver, credentials refs and catalogue; unset = none."
    )
    ssh: ProbeSettings = Field(default_factory=ProbeSettings)
    dispatch: DispatchSettings = Field(default_factory=DispatchSettings)

    @property
    def lease_name(self) -> str:
        return self.leader_election.lease_name or f"nodewarden-{self.dispatcher_id}"


def _describe(err: ValidationError) -> str:
    parts = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "(top level)"
        parts.append(f"{loc}: {e['msg']}")
    return "; ".join(parts)


def load_config(path: Path | None, overrides: dict[str, object] | None = None) -> OperatorConfig:
    """Read the YAML config (if any), apply overrides, validate; ConfigError names the field."""
    data: dict[str, object] = {}
    if path is not None:
        try:
            loaded = yaml.safe_load(path.read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"cannot read config file {path}: {exc}") from exc
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {path}: expected a mapping at the top level")
        data.update({str(k): v for k, v in loaded.items()})
    for key, value in (overrides or {}).items():
        if value is not None:
            data[key] = value
    try:
        return OperatorConfig.model_validate(data)
    except ValidationError as exc:
        where = f"config file {path}" if path else "configuration"
        raise ConfigError(f"{where}: {_describe(exc)}") from exc
