"""The side-node process behind a DNAT (`advertise_address`): what callers are told, and its
BMC certificate. Everything is still reached on 127.0.0.1 here; the address is only named."""

from __future__ import annotations

import socket
import ssl
from pathlib import Path

import pytest
from pydantic import ValidationError

from nodewarden.ssh import KnownHostKeys, SshClientKey
from nodewarden_doubles.sidenode.config import SideNodeFileConfig
from nodewarden_doubles.sidenode.process import SideNodeProcess

pytestmark = pytest.mark.slow

ADDRESS = "192.0.2.3"  # RFC 5737: never dialled, only named


def test_advertised_address_names_the_nodes_and_the_bmc_certificate(tmp_path: Path) -> None:
    config = {
        "authorized_keys": [SshClientKey.generate().public_key],
        "bmc": {"username": "admin", "password": "advertise-bmc-pw"},
        "advertise_address": ADDRESS,
        "nodes": [{"name": "gpu", "power": "fakebmc", "initial_power": "On"}],
    }
    with SideNodeProcess(config, workdir=tmp_path) as side:
        info = side.node_info("gpu")
        port, bmc_port = info["ssh"]["port"], int(info["power"]["endpoint"].rsplit(":", 1)[1])
        assert info["ssh"] == {"host": ADDRESS, "port": port}
        assert info["power"]["endpoint"] == f"https://{ADDRESS}:{bmc_port}"
        assert info["known_hosts_line"] == f"[{ADDRESS}]:{port} {info['host_public_key']}"
        KnownHostKeys(info["known_hosts_line"])  # parses
        assert side.state["wol"]["host"] == "127.0.0.1"  # UDP is not mapped
        # the BMC listens on loopback; its certificate verifies for the advertised address
        context = ssl.create_default_context(cadata=side.state["bmc_ca_pem"])
        with (
            socket.create_connection(("127.0.0.1", bmc_port), timeout=10) as raw,
            context.wrap_socket(raw, server_hostname=ADDRESS) as tls,
        ):
            assert tls.version() is not None
        with (
            socket.create_connection(("127.0.0.1", bmc_port), timeout=10) as raw,
            pytest.raises(ssl.SSLCertVerificationError),
        ):
            context.wrap_socket(raw, server_hostname="192.0.2.99")


def test_advertise_address_must_be_an_ip_address() -> None:
    with pytest.raises(ValidationError, match=r"advertise_address\n.*must be an IP address"):
        SideNodeFileConfig.model_validate(
            {
                "authorized_keys": ["ssh-ed25519 AAAA"],
                "advertise_address": "side.example",
                "nodes": [{"name": "w", "power": "wol", "mac": "52:54:00:00:00:01"}],
            }
        )
