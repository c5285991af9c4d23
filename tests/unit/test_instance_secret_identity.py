"""The instance secrets survive a restart: the master secret is the same for the same key.

A restarted operator reads its SSH key from the Secret again and must derive the same
master (and so the same per-instance secrets), or instances it created before the
restart can never prove their secret and are never trusted.
"""

from __future__ import annotations

import hashlib
import hmac

import pytest

from nodewarden.pool.identity import instance_secret, master_secret, new_nonce
from nodewarden.ssh.credentials import SshClientKey


@pytest.mark.parametrize("algorithm", ["ssh-ed25519", "ecdsa-sha2-nistp256"])
def test_the_same_key_gives_the_same_secrets_after_a_reload(algorithm: str) -> None:
    key = SshClientKey.generate(algorithm)
    reloaded = SshClientKey(key.export_private())  # what the next start reads
    first = master_secret(key)
    assert master_secret(key).get_secret_value() == first.get_secret_value()
    assert master_secret(reloaded).get_secret_value() == first.get_secret_value()
    assert (
        instance_secret(master_secret(reloaded), "n1").get_secret_value()
        == instance_secret(first, "n1").get_secret_value()
    )


def test_another_key_gives_other_secrets() -> None:
    one, other = SshClientKey.generate(), SshClientKey.generate()
    assert master_secret(one).get_secret_value() != master_secret(other).get_secret_value()
    assert len(master_secret(one).get_secret_value()) == 32


def test_a_node_re_created_under_the_same_name_gets_another_secret() -> None:
    master = master_secret(SshClientKey.generate())
    first, second = new_nonce(), new_nonce()
    assert first != second and len(first) == 32
    assert (
        instance_secret(master, "warm-1", first).get_secret_value()
        != instance_secret(master, "warm-1", second).get_secret_value()
    )
    # recomputable: the same nonce gives the same secret (after a restart)
    assert (
        instance_secret(master, "warm-1", first).get_secret_value()
        == instance_secret(master, "warm-1", first).get_secret_value()
    )


def test_an_instance_without_a_nonce_keeps_the_old_derivation() -> None:
    """Instances created before nonces were given HMAC(master, node name)."""
    master = master_secret(SshClientKey.generate())
    old = hmac.new(master.get_secret_value(), b"warm-1", hashlib.sha256).hexdigest()
    assert instance_secret(master, "warm-1").get_secret_value() == old
    assert instance_secret(master, "warm-1", new_nonce()).get_secret_value() != old
