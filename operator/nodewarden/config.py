"""Operator configuration: what one nodewarden process is (dispatcher id, namespace, endpoints).

Loaded from a YAML file (`nodewarden run --config FILE`, mounted from the Helm chart's
ConfigMap) with a few command-line overrides. Policy knobs do not live here; they live in
PowerPolicy objects so they can be changed by GitOps without a restart.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from nodewarden.api.base import DNS_LABEL_PATTERN, SecretKeyReference
from nodewarden.cliargs import yaml_mistake
from nodewarden.cloud.config import CloudConfig
from nodewarden.credentials.settings import CredentialsConfig
from nodewarden.kube.pacing import KubeApiSettings
from nodewarden.limits import OPEN_FILES
from nodewarden.listener import ListenerLimits
from nodewarden.rules.savings import EnergyClass
from nodewarden.scheduling.caps import Ceilings
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


class ShardingConfig(_Config):
    """WorkerNodes sharded across replicas by Leases (docs/sharding.md). `shards: 1`, the
    default, is today's operator exactly: no shard Leases, no labels, no shard fences."""

    shards: int = Field(
        default=1,
        ge=1,
        le=256,
        description="Shard count; above 1, power actions on a node are fenced by the Lease "
        "of the shard its nodewarden.io/shard label names.",
    )
    labeller_interval: float = Field(
        default=5.0,
        gt=0,
        description="Seconds between resharder passes (labelling unlabelled WorkerNodes, "
        "moving nodes after a shard-count change).",
    )
    cross_process_admission: bool = Field(
        default=False,
        description="A runner start reads its node's admission from the API server after its "
        "lock, and a shutdown request waits for admission Closed there and a quorum re-read "
        "finding no container on the node (docs/sharding.md section 2): needed once a replica "
        "other than the dispatcher's leader owns shards; costs one GET per start and a GET, a "
        "LIST and at most one patch per shutdown request.",
    )

    @property
    def enabled(self) -> bool:
        return self.shards > 1


class HttpConfig(_Config):
    host: str = Field(default="0.0.0.0", description="Listen address of the HTTP endpoint.")  # noqa: S104
    port: int = Field(default=8080, ge=0, le=65535, description="0 = pick a free port.")
    metrics_port: int | None = Field(
        default=None, ge=0, le=65535, description="/metrics and probes; unset = `port`."
    )
    probe_port: int | None = Field(
        default=None,
        ge=0,
        le=65535,
        description="/healthz and /readyz on a listener of their own (a flood of the "
        "metrics port cannot fail them); unset = with /metrics.",
    )
    header_timeout: float = Field(
        default=5.0,
        gt=0,
        le=60,
        description="Seconds a connection may take to send its request line and headers.",
    )
    request_timeout: float = Field(
        default=30.0,
        gt=0,
        le=600,
        description="Seconds a connection may stay open at all (one request per connection).",
    )
    max_connections: int = Field(
        default=512,
        ge=2,
        le=8192,
        description="Connections each listener holds at once (bounds its file descriptors); "
        "at the cap a new one takes the slot of the oldest one still waiting for its "
        "headers. Keep it above the clients you expect at once.",
    )
    metrics_auth: Literal["none", "token"] = Field(
        default="none",
        description="`token`: /metrics requires the status API's bearer token "
        "(management.token_secret_name).",
    )
    token_refresh: float = Field(
        default=30.0,
        ge=1,
        le=3600,
        description="Seconds after which the status token is read again from its Secret.",
    )

    @model_validator(mode="after")
    def _deadlines(self) -> HttpConfig:
        if self.header_timeout > self.request_timeout:
            raise ValueError("header_timeout must not exceed request_timeout")
        return self

    def limits(self) -> ListenerLimits:
        return ListenerLimits(
            header_timeout=self.header_timeout,
            request_timeout=self.request_timeout,
            max_connections=self.max_connections,
        )


class ManagementConfig(_Config):
    token_secret_name: str | None = Field(
        default=None, description="Secret (operator namespace) holding the status API token."
    )
    token_secret_key: str = Field(default="token", description="Key of the token in the Secret.")


class RequestersConfig(_Config):
    """Who asks for power transitions (docs/security.md, "The requester")."""

    operator_username: str | None = Field(
        default=None,
        max_length=256,
        description=(
            "The user name the API server knows this operator by: the requestedBy of the "
            "PowerIntents it makes (the admission policy admits source Policy only from it). "
            "Unset: read from the credentials it authenticates with (its ServiceAccount "
            "token, else its client certificate's common name)."
        ),
    )
    check_interval: float = Field(
        default=300.0,
        gt=0,
        description=(
            "Seconds between checks that the requester admission policy is in force (a "
            "dry-run PowerIntent naming another requester must be refused); overrides are "
            "refused while it is not."
        ),
    )


class CreateLimits(_Config):
    """The operator's hard caps on cloud capacity (`scheduling.caps`): ceilings above every
    PowerPolicy, applied to every instance create, planned or declared. Unset = no ceiling
    of that kind (the Helm chart sets all three; `nodewarden check` warns without them)."""

    max_nodes: int | None = Field(
        default=None, ge=1, le=100_000, description="Cloud instances of this dispatcher."
    )
    max_hourly_spend: float | None = Field(
        default=None,
        gt=0,
        le=1_000_000,
        description="Summed hourly price (catalogue prices) of this dispatcher's instances.",
    )
    max_per_instance_type: int | None = Field(
        default=None, ge=1, le=100_000, description="Instances of any one instance type."
    )
    instance_types: dict[str, Annotated[int, Field(ge=0, le=100_000)]] = Field(
        default_factory=dict,
        description="Instances of the named types (instance type -> at most; the smaller "
        "of this and max_per_instance_type applies).",
    )

    def ceilings(self) -> Ceilings:
        return Ceilings(
            max_nodes=self.max_nodes,
            max_hourly_spend=self.max_hourly_spend,
            max_per_type=self.max_per_instance_type,
            per_type=dict(self.instance_types),
        )


class DispatchSettings(_Config):
    """The dispatcher's loop timing and concurrency (Arvados defaults in brackets)."""

    enabled: bool = Field(default=True, description="Run the container dispatcher.")
    tick_interval: float = Field(
        default=1.0, gt=0, description="Seconds between planning rounds (also woken by events)."
    )
    sync_interval: float = Field(
        default=10.0,
        gt=0,
        description=(
            "Seconds between cloud instance listings while creates or destroys are "
            "outstanding or a takeover is pending."
        ),
    )
    sync_interval_at_rest: float = Field(
        default=60.0,
        gt=0,
        description=(
            "Seconds between cloud instance listings when nothing is outstanding [1 m]; "
            "never shorter than sync_interval (pool/syncpace.py)."
        ),
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
    scheduling_status_interval: float = Field(
        default=30.0,
        ge=0,
        description=(
            "Seconds between rewrites of a waiting container's changed scheduling status "
            "(a change of phase or spec is written at once)."
        ),
    )
    replan_backstop: float = Field(
        default=900.0,
        gt=0,
        description=(
            "Seconds after which the dispatcher plans again though nothing it reads changed "
            "(a safety net: it plans on a change of the queue, nodes, admission or policy, "
            "while starts or writes are under way, and at the times a plan named)."
        ),
    )
    max_concurrent_starts: int = Field(default=20, ge=1, description="Runner starts in flight.")
    max_concurrent_writes: int = Field(
        default=16, ge=1, description="Kubernetes status writes in flight."
    )
    max_new_nodes_per_round: int = Field(
        default=50, ge=1, description="Instances the dispatcher asks for per planning round."
    )
    probe_tag_interval: float | None = Field(
        default=None,
        gt=0,
        description=(
            "Seconds between refreshes of the last-probe tag on an instance (a heartbeat "
            "for takeover); unset: a quarter of the policy's takeoverAfter (pool/probetag.py)."
        ),
    )
    ssh_user: str = Field(default="root", description="Login user on cloud nodes.")
    ssh_private_key_secret: SecretKeyReference | None = Field(
        default=None,
        description="Secret key (operator namespace) holding the SSH private key for nodes.",
    )
    limits: CreateLimits = Field(
        default_factory=CreateLimits,
        description="The operator's hard caps on cloud instances (Helm values `limits.*`).",
    )


class EnergySettings(_Config):
    """How energy is read and shown (docs/energy.md)."""

    read_interval: float = Field(
        default=60.0,
        ge=5,
        le=3600,
        description="Seconds between two power readings of a side node while it is On (each "
        "is one more Redfish GET: the default, once a minute, is what the at-rest budget "
        "counts; below it only for tests and demos); an Off node is read once per Off "
        "period. Readings ride on the PowerState polls.",
    )
    status_interval: float = Field(
        default=900.0,
        ge=5,
        le=86400,
        description="A node's and a policy's energy figures are written to status with a "
        "power transition, else at most this often (never per reading: live values are in "
        "the metrics).",
    )
    idle_measure: float = Field(
        default=600.0,
        ge=0,
        le=86400,
        description="Seconds of integrated idle readings after which a node's idle draw counts "
        "as measured; until then its class's configured idle draw is used (Configured).",
    )
    classes: dict[str, EnergyClass] = Field(
        default_factory=dict,
        max_length=256,
        description="Per node class (WorkerNode spec.nodeClass; 'default' for side nodes "
        "without one): configured idle / off draw (W), boot and shutdown energy above idle "
        "(Wh) and the energy price per kWh in cloud.currency.",
    )

    @model_validator(mode="after")
    def _class_names(self) -> EnergySettings:
        bad = sorted(n for n in self.classes if not re.fullmatch(DNS_LABEL_PATTERN, n))
        if bad:
            raise ValueError(
                f"power.energy.classes: {', '.join(bad)}: a class name is a DNS label "
                "(lower-case letters, digits, '-'), as WorkerNode spec.nodeClass"
            )
        return self


class PowerSettings(_Config):
    """The power controller's timing (the policy knobs live in PowerPolicy objects)."""

    power_poll_interval: float = Field(
        default=15.0,
        gt=0,
        description="Seconds between BMC PowerState reads of a side node while it moves "
        "(a transition, a decision waiting for evidence; at most telemetryMaxAge/3, so the "
        "reading stays fresh).",
    )
    power_poll_interval_at_rest: float = Field(
        default=60.0,
        gt=0,
        description="Seconds between BMC PowerState reads of a side node at rest (no "
        "transition, its last decision waiting for nothing; at most telemetryMaxAge/2). "
        "Ironic's default power-state sync is 60 s.",
    )
    capability_interval: float = Field(
        default=600.0, gt=0, description="Seconds between re-discoveries of power control."
    )
    evaluate_interval: float = Field(
        default=30.0,
        gt=0,
        description="A node whose decision is DEFER is evaluated again at least this often.",
    )
    first_write_hold: float = Field(
        default=20.0,
        ge=0,
        description="Seconds a node's first status write at start-up waits at most for its "
        "verdict, the dispatcher's ledger and its first power reading, so one patch carries "
        "them (0: written as each arrives). Power requests are persisted at once regardless.",
    )
    request_timeout: float = Field(
        default=15.0, gt=0, le=600, description="Seconds one BMC request may take."
    )
    bmc_observation_concurrency: int = Field(
        default=64,
        ge=1,
        description="BMC observations (PowerState reads, capability discovery) in flight at "
        "once across the fleet; power requests never wait for them. Bounds the start-up "
        "burst of a large fleet (one TLS connection and login each).",
    )
    keep_finished_intents: int = Field(
        default=5, ge=0, description="Finished policy-made PowerIntents kept per node."
    )
    keep_intents_of_gone_nodes: float = Field(
        default=3600.0,
        ge=0,
        description="Seconds the finished policy-made PowerIntents of a deleted WorkerNode "
        "(e.g. a destroyed VM) are kept before they are deleted.",
    )
    delete_finished_manual_intents: bool = Field(
        default=False,
        description="Delete finished manual PowerIntents (a person's request, override or "
        "ForceOff: audit records) once finished_manual_intent_retention has passed. Off: "
        "they are kept until a person deletes them.",
    )
    finished_manual_intent_retention: float = Field(
        default=90 * 86400.0,
        ge=3600,
        description="Seconds a finished manual PowerIntent is kept when "
        "delete_finished_manual_intents is on (default 90 days).",
    )
    energy: EnergySettings = Field(
        default_factory=EnergySettings, description="Energy readings and figures."
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
    shutdown_grace: Duration = Field(
        default="10s",
        description=(
            "On SIGTERM, how long in-flight status writes, runner starts and power requests "
            "may finish before they are cancelled; keep it below the Pod's "
            "terminationGracePeriodSeconds."
        ),
    )
    log_format: Literal["json", "text"] = Field(default="json")
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(default="INFO")
    kubeconfig: Path | None = Field(
        default=None, description="Kubeconfig file; unset = in-cluster or $KUBECONFIG."
    )
    leader_election: LeaderElection = Field(default_factory=LeaderElection)
    sharding: ShardingConfig = Field(default_factory=ShardingConfig)
    http: HttpConfig = Field(default_factory=HttpConfig)
    management: ManagementConfig = Field(default_factory=ManagementConfig)
    cloud: CloudConfig | None = Field(
        default=None, description="Cloud driver, credentials refs and catalogue; unset = none."
    )
    ssh: ProbeSettings = Field(default_factory=ProbeSettings)
    credentials: CredentialsConfig = Field(default_factory=CredentialsConfig)
    power: PowerSettings = Field(default_factory=PowerSettings)
    dispatch: DispatchSettings = Field(default_factory=DispatchSettings)
    requesters: RequestersConfig = Field(default_factory=RequestersConfig)
    kube_api: KubeApiSettings = Field(default_factory=KubeApiSettings)
    open_files: int = Field(
        default=OPEN_FILES,
        ge=1024,
        description="The soft RLIMIT_NOFILE the operator raises itself to at start-up (at "
        "most the hard limit): one kept connection per node, and room for bursts.",
    )

    @model_validator(mode="after")
    def _metrics_token(self) -> OperatorConfig:
        if self.http.metrics_auth == "token" and not self.management.token_secret_name:
            raise ValueError(
                "http.metrics_auth: token needs management.token_secret_name (the token "
                "scrapers send)"
            )
        return self

    @property
    def lease_name(self) -> str:
        return self.leader_election.lease_name or f"nodewarden-{self.dispatcher_id}"

    @property
    def reserved_secrets(self) -> frozenset[str]:
        """Secrets the operator itself uses: never selectable by a WorkerNode."""
        names: set[str] = set()
        if self.dispatch.ssh_private_key_secret is not None:
            names.add(self.dispatch.ssh_private_key_secret.name)
        if self.management.token_secret_name:
            names.add(self.management.token_secret_name)
        if self.cloud is not None and self.cloud.credentials is not None:
            names.add(self.cloud.credentials.key_ref.name)
            if self.cloud.credentials.secret_ref is not None:
                names.add(self.cloud.credentials.secret_ref.name)
        return frozenset(names)


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
        except OSError as exc:
            raise ConfigError(f"cannot read config file {path}: {exc.strerror or exc}") from exc
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {path}: {yaml_mistake(exc)}") from exc
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
