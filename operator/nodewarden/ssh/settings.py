"""Knobs of the SSH prober: timeouts, keepalive, and the commands of the node contract."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from nodewarden.ssh.protocol import (
    BUSCTL_LIST_INHIBITORS,
    DEFAULT_ETHTOOL_COMMAND,
    DEFAULT_POWEROFF_COMMAND,
    DEFAULT_PRODUCT_UUID_COMMAND,
    DEFAULT_READY_COMMAND,
    DEFAULT_RUNNER,
    DEFAULT_TELEMETRY_COMMAND,
    SYSTEMD_INHIBIT_LIST,
)


class ProbeSettings(BaseModel):
    """How the prober talks to nodes. Defaults follow the Arvados dispatcher where it has one."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    connect_timeout: float = Field(
        default=10.0, gt=0, description="Seconds to establish the TCP connection."
    )
    login_timeout: float = Field(
        default=20.0, gt=0, description="Seconds for the SSH handshake and authentication."
    )
    command_timeout: float = Field(
        default=30.0, gt=0, description="Seconds one command may take; then the connection drops."
    )
    keepalive_interval: float = Field(
        default=15.0, ge=0, description="Seconds between SSH keepalives (0 = off)."
    )
    keepalive_count_max: int = Field(
        default=3, ge=1, description="Unanswered keepalives before the connection counts as dead."
    )
    max_sessions_per_connection: int = Field(
        default=8, ge=1, le=64, description="Concurrent channels per connection (sshd allows 10)."
    )
    encryption_algs: tuple[str, ...] = Field(
        default=(
            "aes128-gcm@openssh.com",
            "aes256-gcm@openssh.com",
            "chacha20-poly1305@openssh.com",
            "aes256-ctr",
            "aes128-ctr",
        ),
        min_length=1,
        description=(
            "Cipher preference. AES-GCM first: with AES-NI it costs the operator far less "
            "CPU per packet than asyncssh's chacha20-poly1305 (measured in bench_probe)."
        ),
    )
    stream: bool = Field(
        default=True,
        description=(
            "Keep 'RUNNER --watch' running on each node's connection: runner list and ready "
            "state pushed on change, no probe commands for them while the stream is up."
        ),
    )
    stream_heartbeat: float = Field(
        default=10.0,
        gt=0,
        le=3600,
        description=(
            "Seconds between the watch command's heartbeats; no line for 3 x this = the "
            "stream has stopped (its facts age by the usual freshness rules)."
        ),
    )
    stream_unsupported_retry: float = Field(
        default=3600.0,
        gt=0,
        description="Seconds before a node whose runner has no --watch is tried with it again.",
    )
    stream_reconnect_max: float = Field(
        default=60.0, gt=0, description="Longest wait between attempts to reopen a stream."
    )
    ready_command: str = Field(default=DEFAULT_READY_COMMAND, min_length=1)
    runner_command: str = Field(
        default=DEFAULT_RUNNER, min_length=1, description="Runner program, e.g. 'sudo crunch-run'."
    )
    inhibitors_command: str = Field(default=BUSCTL_LIST_INHIBITORS, min_length=1)
    inhibitors_fallback_command: str = Field(default=SYSTEMD_INHIBIT_LIST, min_length=1)
    ethtool_command: str = Field(
        default=DEFAULT_ETHTOOL_COMMAND,
        min_length=1,
        description="Template with {iface}, e.g. 'sudo ethtool {iface}'.",
    )
    telemetry_command: str = Field(default=DEFAULT_TELEMETRY_COMMAND, min_length=1)
    poweroff_command: str = Field(default=DEFAULT_POWEROFF_COMMAND, min_length=1)
    product_uuid_command: str = Field(
        default=DEFAULT_PRODUCT_UUID_COMMAND,
        min_length=1,
        description=(
            "Prints the host's DMI product UUID (root-only file): for a login that is not "
            "root, 'sudo -n cat /sys/class/dmi/id/product_uuid' with one sudo rule."
        ),
    )

    @field_validator("ethtool_command")
    @classmethod
    def _one_iface_placeholder(cls, value: str) -> str:
        try:
            rendered = value.format(iface="eth0")
        except (KeyError, IndexError, ValueError):
            raise ValueError("ethtool_command may only use the {iface} placeholder") from None
        if rendered == value:
            raise ValueError("ethtool_command must contain {iface}")
        return value
