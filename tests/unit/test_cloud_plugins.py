"""cloud.driver_plugin loading: every way a named plugin can be wrong is a PluginError that
names the field and the fix, never a traceback from inside the import."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from nodewarden.cloud.plugins import PluginError, load_plugin


def test_the_stub_cloud_plugin_loads() -> None:
    plugin = load_plugin("nodewarden_doubles.stubcloud:plugin", "nodewarden-stub")
    assert plugin.provider == "nodewarden-stub"


@pytest.mark.parametrize(
    ("spec", "provider", "words"),
    [
        ("no_colon_here", "stub", "expected 'package.module:attribute'"),
        ("nodewarden_no_such_module:plugin", "stub", "install the package"),
        ("nodewarden_doubles.stubcloud:nothing", "stub", "is not a driver plugin"),
        ("nodewarden_doubles.stubcloud:plugin", "ec2", "make them agree"),
    ],
)
def test_a_wrong_plugin_names_the_fix(spec: str, provider: str, words: str) -> None:
    with pytest.raises(PluginError, match=r"cloud\.driver_plugin") as caught:
        load_plugin(spec, provider)
    assert words in str(caught.value)


def test_a_plugin_module_that_raises_while_importing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "nw_broken_plugin.py").write_text("raise RuntimeError('boom at import')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "nw_broken_plugin", raising=False)
    with pytest.raises(PluginError, match="RuntimeError: boom at import"):
        load_plugin("nw_broken_plugin:plugin", "stub")
