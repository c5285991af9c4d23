"""The operator image as built from the Dockerfile: non-root, no compiler, no pip, no test doubles."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from dataplane import images

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def rootfs() -> Iterator[tuple[Path, dict[str, object]]]:
    if os.geteuid() != 0 or shutil.which("podman") is None:
        pytest.skip("building the image needs root and podman (make e2e installs it)")
    built = images.operator_image()  # cached by its inputs: built once per change
    mount = subprocess.run(["podman", "image", "mount", built.ref], capture_output=True,
                           text=True, check=True).stdout.strip()  # fmt: skip
    config = json.loads(subprocess.run(["podman", "image", "inspect", built.ref],
                                       capture_output=True, text=True, check=True).stdout)[0]  # fmt: skip
    try:
        yield Path(mount), config["Config"]
    finally:
        subprocess.run(["podman", "image", "umount", built.ref], capture_output=True, check=False)


def test_image_runs_as_non_root(rootfs: tuple[Path, dict[str, object]]) -> None:
    _, config = rootfs
    assert config["User"] == "65532:65532"
    assert config["Entrypoint"] == ["nodewarden"]


def test_image_has_no_compiler_pip_or_test_doubles(rootfs: tuple[Path, dict[str, object]]) -> None:
    root, _ = rootfs
    for tool in ("gcc", "cc", "c++", "g++", "clang", "make", "pip", "pip3"):
        for bindir in ("usr/bin", "usr/local/bin", "opt/nodewarden/bin"):
            assert not (root / bindir / tool).exists(), f"/{bindir}/{tool} is in the image"
    site = next((root / "opt" / "nodewarden" / "lib").glob("python3*/site-packages"))
    assert (site / "nodewarden" / "cli.py").exists()
    assert not list(site.glob("nodewarden_doubles*")), "test doubles are in the image"
    assert not list(site.glob("pip")) and not list(site.glob("setuptools"))
    assert not list(root.glob("src/operator/nodewarden_doubles"))


def test_image_python_packages_are_exactly_the_lock(rootfs: tuple[Path, dict[str, object]]) -> None:
    root, _ = rootfs
    site = next((root / "opt" / "nodewarden" / "lib").glob("python3*/site-packages"))
    installed = {}
    for info in site.glob("*.dist-info"):
        name, version = info.name.removesuffix(".dist-info").rsplit("-", 1)
        installed[name.lower().replace("_", "-")] = version
    locked = {}
    for line in (images.REPO / "requirements.lock").read_text().splitlines():
        if "==" in line and not line.startswith((" ", "#")):
            name, version = line.split(" ")[0].split("==")
            locked[name.lower().replace("_", "-")] = version
    build_only = {"setuptools", "wheel"}
    assert installed.pop("nodewarden") == "0.1.0"
    assert installed == {k: v for k, v in locked.items() if k not in build_only}
