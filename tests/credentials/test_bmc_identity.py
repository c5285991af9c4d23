"""One machine, one BMC (issue 20, item 2), in process: the BMC's identity across nodes."""

from __future__ import annotations

from dataclasses import replace

import pytest

from nodewarden.credentials.bmcidentity import BmcClaim, BmcRegistry, normalised_endpoint


@pytest.mark.parametrize(
    "spelling",
    [
        "https://bmc-7.lab.example",
        "https://BMC-7.Lab.Example:443",
        "https://bmc-7.lab.example/",
        "https://bmc-7.lab.example:443/redfish/v1/",
        "HTTPS://bmc-7.lab.example/redfish",
    ],
)
def test_every_spelling_of_one_endpoint_is_one_bmc(spelling: str) -> None:
    assert normalised_endpoint(spelling) == "https://bmc-7.lab.example:443"


def test_other_ports_hosts_and_bases_are_other_bmcs() -> None:
    seen = {
        normalised_endpoint(e)
        for e in (
            "https://bmc-7.lab.example:8443",
            "https://bmc-8.lab.example",
            "https://chassis.lab.example/bmc1",
            "https://chassis.lab.example/bmc2",
            "https://[fd00::7]",
        )
    }
    assert len(seen) == 5 and "https://[fd00::7]:443" in seen


def claim(
    node: str, endpoint: str = "https://bmc-7", system: str | None = None, **kw: object
) -> BmcClaim:
    return BmcClaim(
        node=node,
        endpoint=normalised_endpoint(endpoint),
        system_id=system,
        created=str(kw.pop("created", "2026-01-01T00:00:00Z")),
        **kw,  # type: ignore[arg-type]
    )


def test_the_newcomer_is_refused_the_first_keeps_serving() -> None:
    reg = BmcRegistry()
    reg.put(claim("victim"), "victim")
    changed = reg.put(claim("attacker", created="2026-02-01T00:00:00Z"), "attacker")
    assert changed == {"attacker"}  # the victim's owner (itself) did not change
    assert reg.owner_for("victim") is None
    owner = reg.owner_for("attacker")
    assert owner is not None and owner.node == "victim"
    assert reg.refused() == 1


def test_a_second_spelling_clashes_once_the_uuid_is_read() -> None:
    reg = BmcRegistry()
    reg.put(claim("victim", "https://bmc-7", uuid="u-1", verified=True), "victim")
    # the same BMC under its address and an explicit system id: unknown until read
    sneaky = claim("attacker", "https://10.0.0.7", "1", created="2026-02-01T00:00:00Z")
    reg.put(sneaky, "attacker")
    assert reg.owner_for("attacker") is None
    reg.put(replace(sneaky, uuid="u-1"), "attacker")
    assert reg.owner_for("attacker").node == "victim"  # type: ignore[union-attr]
    # an unset systemId is the only system: it clashes with any explicit one
    reg.put(claim("third", "https://bmc-7", "1", created="2026-03-01T00:00:00Z"), "third")
    assert reg.owner_for("third").node == "victim"  # type: ignore[union-attr]
    assert reg.owner_for("victim") is None


def test_the_verified_node_keeps_the_bmc_even_if_younger() -> None:
    """An older node naming a BMC that is not its machine's never takes it from the one
    whose host reported the BMC's UUID."""
    reg = BmcRegistry()
    reg.put(claim("squatter", uuid="u-1", created="2025-01-01T00:00:00Z"), "squatter")
    reg.put(claim("real", uuid="u-1", verified=True, created="2026-01-01T00:00:00Z"), "real")
    assert reg.owner_for("real") is None
    assert reg.owner_for("squatter").node == "real"  # type: ignore[union-attr]


def test_deleting_the_holder_hands_the_bmc_on() -> None:
    reg = BmcRegistry()
    reg.put(claim("a"), "a")
    reg.put(claim("b", created="2026-02-01T00:00:00Z"), "b")
    assert reg.put(None, "a") == {"a", "b"}  # b holds it now
    assert reg.owner_for("b") is None and reg.refused() == 0


def test_a_fleet_without_shared_bmcs_costs_a_lookup_per_node() -> None:
    """10,000 nodes each on its own BMC: every put touches only the node itself."""
    reg = BmcRegistry()
    for i in range(10_000):
        assert reg.put(claim(f"n{i}", f"https://bmc-{i}"), f"n{i}") == {f"n{i}"}
    assert reg.refused() == 0 and reg.owner_for("n42") is None
