"""The instance secrets survive a restart: the master secret is the same for the same key.

A restarted operator reads its SSH key from the Secret again and must derive the same
master (and so the same per-instance secrets), or instances it created before the
restart can never prove their secret and are never trusted.
"""

from __future__ import annotations

import pytest

from nodewarden.dispatch.identity import instance_secret, master_secret
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
