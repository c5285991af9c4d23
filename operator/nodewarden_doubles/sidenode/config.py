"""The configuration file of the side-node process (`python -m nodewarden_doubles.sidenode`).

YAML or JSON, snake_case keys::

    name: demo                       # label in logs (default "sidenodes")
    authorized_keys:                 # client public keys every node accepts (the operator's)
      - ssh-ed25519 AAAA... nodewarden
    bmc:                             # the credentials every BMC accepts (fake BMCs and sushy);
      username: admin                #   required when a node is BMC-powered; the password is
      password: change-me            #   never logged nor written to the state file
    admin_token: null                # bearer token of the admin API; null = generated
    wol_port: 0                      # UDP port of the Wake-on-LAN listener (0 = free)
    tick_interval: 0.05              # how often every node follows its power source
    sushy_poll_interval: 0.25        # how often each sushy system is read over HTTPS
    advertise_address: null          # see below
    nodes:
      - name: gpu-a100-01
        power: fakebmc               # fakebmc | sushy | wol
        initial_power: On            # On | Off (default Off)
        ssh_port: 0                  # fixed SSH port on 127.0.0.1 (0 = free, chosen once)
        boot_delay: 1.0              # power On -> SSH listening
        ready_delay: 1.0             # SSH listening -> ready command passes
        shutdown_delay: 0.2          # `systemctl poweroff` -> power source Off
        initial_uptime: 3600         # uptime of a node On at start
        mac: 52:54:00:aa:00:01       # required for wol nodes
        secure_on: 01:02:03:04:05:06 # wol nodes only: SecureOn password (a secret)
        system_id: "1"               # fakebmc: the system's id (sushy: a fresh uuid)
        fakebmc: {transition_seconds: 2, reset_reply: 202}   # FakeBmcOptions fields
        gpus: 1                      # nvidia-smi lines (utilisation 0 %)
        interface: eth0              # ethtool interface; wol_supported / wol_enabled letters
        faults: {ready_fails_after_wake: true}              # SideNodeFaults fields
        worker_faults: {command_delay: 0.5}                 # StubFaults fields

``advertise_address`` (an IP address, default none): where callers reach the nodes when
a DNAT rule in a network namespace the caller created maps ``<address>:<port>`` onto
this process's 127.0.0.1 (`make e2e`: operator Pods reach the side nodes by routing).
Everything still listens on 127.0.0.1 only; the BMC certificate names the address too,
and the state file's SSH hosts, known_hosts lines and BMC endpoints use it (the
Wake-on-LAN listener stays on 127.0.0.1: UDP is not mapped).

A mistake is reported by field path (``nodes.1.mac: ...``), never with the value.
"""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretBytes,
    SecretStr,
    field_validator,
    model_validator,
)

from nodewarden.wol import format_mac, parse_mac, parse_secure_on
from nodewarden_doubles.fakebmc import FakeBmcOptions
from nodewarden_doubles.sidenode.node import SideNodeFaults, validated_replace
from nodewarden_doubles.stubworker import StubFaults

_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,61}[a-z0-9])?$")
_FIXED_BMC_FIELDS = frozenset({"username", "password", "system_ids", "initial_power"})


class BmcCredentials(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    username: str = Field(min_length=1, max_length=128)
    password: SecretStr = Field(description="Never logged, never in the state file.")

    @model_validator(mode="after")
    def _not_empty(self) -> BmcCredentials:
        if len(self.password.get_secret_value()) < 4:
            raise ValueError("bmc.password must be at least 4 characters")
        if ":" in self.username:
            raise ValueError("bmc.username must not contain ':'")
        return self


class NodeFileConfig(BaseModel):
    """One side node in the file (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="Node name (lower-case DNS label).")
    power: Literal["fakebmc", "sushy", "wol", "wol+bmc"]
    """wol+bmc: woken by Wake-on-LAN and switched off over SSH like `wol`, with a fake BMC
    that reports its PowerState (a trusted source to observe Off; its resets work too)."""
    initial_power: Literal["On", "Off"] = "Off"
    ssh_port: int = Field(default=0, ge=0, le=65535)
    boot_delay: float = Field(default=1.0, ge=0, le=3600)
    ready_delay: float = Field(default=1.0, ge=0, le=3600)
    shutdown_delay: float = Field(default=0.2, ge=0, le=3600)
    initial_uptime: float = Field(default=3600.0, ge=0)
    mac: str | None = None
    secure_on: SecretStr | None = None
    system_id: str = Field(default="1", min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")
    fakebmc: dict[str, Any] = Field(default_factory=dict)
    gpus: int = Field(default=0, ge=0, le=16)
    interface: str = Field(default="eth0", pattern=r"^[A-Za-z0-9_.:@-]{1,15}$")
    wol_supported: str = Field(default="pumbg", pattern=r"^[pumbagsfd]*$")
    wol_enabled: str = Field(default="g", pattern=r"^[pumbagsfd]*$")
    faults: SideNodeFaults = Field(default_factory=SideNodeFaults)
    worker_faults: StubFaults = Field(default_factory=StubFaults)

    @field_validator("name")
    @classmethod
    def _dns_name(cls, value: str) -> str:
        if not _NAME.match(value):
            raise ValueError("must be a lower-case DNS name (a-z, 0-9, '-', '.'; 1-63 characters)")
        return value

    @field_validator("mac")
    @classmethod
    def _mac(cls, value: str | None) -> str | None:
        return None if value is None else format_mac(parse_mac(value))

    @model_validator(mode="after")
    def _consistent(self) -> NodeFileConfig:
        if self.power in ("wol", "wol+bmc") and self.mac is None:
            raise ValueError(f"node {self.name}: a wol node needs a mac")
        if self.secure_on is not None:
            if self.power not in ("wol", "wol+bmc"):
                raise ValueError(f"node {self.name}: secure_on is for wol nodes only")
            try:
                parse_secure_on(self.secure_on.get_secret_value())
            except ValueError as exc:
                raise ValueError(f"secure_on: {exc}") from None
        if self.fakebmc:
            if self.power not in ("fakebmc", "wol+bmc"):
                raise ValueError(f"node {self.name}: fakebmc options are for fakebmc nodes only")
            fixed = sorted(set(self.fakebmc) & _FIXED_BMC_FIELDS)
            if fixed:
                raise ValueError(
                    f"fakebmc: {', '.join(fixed)} come from bmc / initial_power / system_id, "
                    "not from fakebmc"
                )
            validated_replace(FakeBmcOptions, FakeBmcOptions(), self.fakebmc, "fakebmc option")
        return self

    @property
    def secure_on_bytes(self) -> SecretBytes | None:
        if self.secure_on is None:
            return None
        return parse_secure_on(self.secure_on.get_secret_value())

    def bmc_options(self, credentials: BmcCredentials) -> FakeBmcOptions:
        """The fake BMC of this node (fakebmc nodes)."""
        base = FakeBmcOptions(
            username=credentials.username,
            password=credentials.password.get_secret_value(),
            system_ids=(self.system_id,),
            initial_power=self.initial_power,
        )
        return validated_replace(FakeBmcOptions, base, self.fakebmc, "fakebmc option")


class SideNodeFileConfig(BaseModel):
    """The whole file (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(default="sidenodes", min_length=1, max_length=64)
    authorized_keys: list[str] = Field(min_length=1)
    bmc: BmcCredentials | None = None
    admin_token: SecretStr | None = None
    wol_port: int = Field(default=0, ge=0, le=65535)
    tick_interval: float = Field(default=0.05, gt=0, le=10)
    sushy_poll_interval: float = Field(default=0.25, gt=0, le=10)
    sushy_command: str | None = None
    advertise_address: str | None = Field(
        default=None, description="IP address mapped onto this loopback (module docstring)."
    )
    nodes: list[NodeFileConfig] = Field(min_length=1)

    @field_validator("advertise_address")
    @classmethod
    def _ip_address(cls, value: str | None) -> str | None:
        if value is None:
            return None
        try:
            return str(ipaddress.ip_address(value))
        except ValueError:
            raise ValueError("must be an IP address (e.g. 192.0.2.3)") from None

    @model_validator(mode="after")
    def _consistent(self) -> SideNodeFileConfig:
        for field, values in (
            ("name", [n.name for n in self.nodes]),
            ("mac", [n.mac for n in self.nodes if n.mac is not None]),
            ("ssh_port", [n.ssh_port for n in self.nodes if n.ssh_port]),
        ):
            seen: set[object] = set()
            for value in values:
                if value in seen:
                    raise ValueError(f"two nodes have the same {field} {value}")
                seen.add(value)
        if self.bmc is None and any(n.power != "wol" for n in self.nodes):
            raise ValueError("bmc (username, password) is required when a node is BMC-powered")
        return self

    @classmethod
    def from_file(cls, path: Path) -> SideNodeFileConfig:
        data = yaml.safe_load(path.read_text()) or {}
        if not isinstance(data, dict):
            raise ValueError(f"{path}: the side-node config must be a mapping")
        return cls.model_validate(data)

    def file_data(self) -> dict[str, Any]:
        """The config as file content, secrets revealed (write it with mode 0600)."""
        data = self.model_dump(mode="json")
        if self.bmc is not None:
            data["bmc"]["password"] = self.bmc.password.get_secret_value()
        if self.admin_token is not None:
            data["admin_token"] = self.admin_token.get_secret_value()
        for node, raw in zip(self.nodes, data["nodes"], strict=True):
            if node.secure_on is not None:
                raw["secure_on"] = node.secure_on.get_secret_value()
        return data
