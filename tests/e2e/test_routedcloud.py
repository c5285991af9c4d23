"""The e2e cloud plugin's address resolver: stub VM addresses via the stub's table, the
routed network's own addresses (the e2e side nodes) as given, every other one refused."""

from __future__ import annotations

import pytest

from dataplane.routedcloud import RoutedStubResolver
from nodewarden.ssh.addressing import Endpoint, ResolutionRefused


def test_an_address_of_the_routed_network_is_dialled_as_given_without_asking_the_cloud() -> None:
    resolver = RoutedStubResolver("http://192.0.2.3:9", "key", "secret")
    assert resolver.resolve("192.0.2.3", 40123) == Endpoint("192.0.2.3", 40123)
    assert resolver._table.fetches == 0


@pytest.mark.parametrize("host", ["203.0.113.9", "side.example", "127.0.0.1.example"])
def test_other_addresses_are_refused_without_a_packet(host: str) -> None:
    resolver = RoutedStubResolver("http://192.0.2.3:9", "key", "secret")
    with pytest.raises(ResolutionRefused):
        resolver.resolve(host, 22)
    assert resolver._table.fetches == 0
