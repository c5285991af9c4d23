"""Endpoint admission: host patterns, networks and ports, matched without DNS."""

from __future__ import annotations

import pytest

from nodewarden.credentials.admission import (
    AdmissionList,
    Endpoint,
    EndpointRule,
    InvalidRule,
    bmc_endpoint,
)
from nodewarden.credentials.settings import CredentialsConfig


def admits(entries: list[str], host: str, port: int) -> bool:
    return AdmissionList.parse("bmc", entries).admits(Endpoint(host, port))


@pytest.mark.parametrize(
    ("entries", "host", "port", "expected"),
    [
        (["bmc-07.lab.example"], "bmc-07.lab.example", 443, True),
        (["bmc-07.lab.example"], "BMC-07.Lab.Example.", 443, True),
        (["bmc-07.lab.example"], "bmc-08.lab.example", 443, False),
        (["*.lab.example"], "bmc-07.lab.example", 443, True),
        (["*.lab.example"], "a.b.lab.example", 443, True),
        (["*.lab.example"], "lab.example", 443, False),
        (["*.lab.example"], "evil-lab.example", 443, False),
        (["*.lab.example:443"], "bmc.lab.example", 8443, False),
        (["10.20.0.0/16"], "10.20.3.4", 443, True),
        (["10.20.0.0/16"], "10.21.3.4", 443, False),
        (["10.20.0.0/16:623"], "10.20.3.4", 443, False),
        (["127.0.0.1:8443"], "127.0.0.1", 8443, True),
        (["127.0.0.1:8443"], "127.0.0.1", 8444, False),
        (["127.0.0.1"], "127.0.0.2", 22, False),
        (["[::1]:2222"], "::1", 2222, True),
        (["fd00:1::/64"], "fd00:1::5", 22, True),
        (["[fd00:1::/64]:22"], "fd00:1::5", 2222, False),
        # no DNS: a name is never admitted by a network, nor an address by a name
        (["127.0.0.0/8"], "localhost", 22, False),
        (["localhost"], "127.0.0.1", 22, False),
        (["10.0.0.0/8"], "10.0.0.1.nip.io", 22, False),
        ([], "127.0.0.1", 22, False),
    ],
)
def test_matching(entries: list[str], host: str, port: int, expected: bool) -> None:
    assert admits(entries, host, port) is expected


@pytest.mark.parametrize(
    "bad",
    ["", "*.com", "10.0.0.5/16", "bad_name!", "host:99999", "host:abc", "[::1", "[::1]x", "a.*.b"],
)
def test_bad_entries_are_rejected_with_the_entry_named(bad: str) -> None:
    with pytest.raises(InvalidRule):
        EndpointRule.parse(bad)


def test_config_names_the_field_of_a_bad_entry() -> None:
    with pytest.raises(ValueError, match=r"ssh_endpoints: '10\.0\.0\.5/16'"):
        CredentialsConfig(ssh_endpoints=["10.0.0.5/16"])


def test_bmc_endpoint_defaults_to_443() -> None:
    assert bmc_endpoint("https://bmc.lab.example") == Endpoint("bmc.lab.example", 443)
    assert bmc_endpoint("https://127.0.0.1:8443/") == Endpoint("127.0.0.1", 8443)
    assert bmc_endpoint("https://[::1]:9443") == Endpoint("::1", 9443)
