"""The operator fixes glibc's mmap threshold unless its environment sets it."""

from __future__ import annotations

import platform

import pytest

from nodewarden import heap


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's mallopt")
def test_the_threshold_is_fixed_on_glibc(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    assert heap.tune() is True


def test_the_environment_decides_when_it_sets_the_threshold(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "262144")
    assert heap.tune() is False
