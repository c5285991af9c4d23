#!/usr/bin/env python3
"""Images without a Docker engine or a registry: Debian base, pause, the operator image.

Everything heavy is cached outside the repository (``~/.cache/nodewarden/images``, or
``$NODEWARDEN_CACHE/images``) under a key made of its inputs, so only the first run on
a machine pays:

- **base**: ``debootstrap --variant=minbase bookworm`` with the apt sources of Debian's
  own images (bookworm, -updates, -security), imported into podman as
  ``localhost/nodewarden-base:debian-<release>``. Key: the suite and the version of
  ``base-files`` the mirror serves (that version is the Debian point release).
- **pause**: the tiny static Go program in ``e2e/dataplane/pause`` in an image ``FROM
  scratch`` (buildah), the sandbox image of every Pod.
- **operator**: the project's ``Dockerfile``, unchanged, with ``BASE_IMAGE`` set to the
  local base (``podman build``). Key: a hash of the Dockerfile, the lock file, pyproject,
  README and every file of ``operator/nodewarden``, plus the base's key.

Each image is also saved as an OCI archive (``ctr images import`` loads it into the
node's containerd). The sandbox's egress re-signs TLS, so pip inside ``podman build``
gets the host's CA bundle through a build-time volume and a pip.conf there; neither is
part of the image.

    python e2e/dataplane/images.py operator [--tag nodewarden:0.1.0]   # `make image`
    python e2e/dataplane/images.py all                                  # print archives
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent
SUITE = "bookworm"
MIRROR = os.environ.get("NODEWARDEN_DEBIAN_MIRROR", "http://deb.debian.org/debian")
SECURITY_MIRROR = os.environ.get(
    "NODEWARDEN_DEBIAN_SECURITY_MIRROR", "http://deb.debian.org/debian-security"
)
PAUSE_SRC = REPO / "e2e" / "dataplane" / "pause"
PAUSE_REF = "localhost/nwe2e-pause:1"
OPERATOR_REPOSITORY = "localhost/nodewarden"
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
OPERATOR_INPUTS = ["Dockerfile", "requirements.lock", "pyproject.toml", "README.md"]
BASE_RECIPE = 2  # bump when base_image() changes what it puts in the base
# What Debian's slim images leave out (dpkg excludes them from later installs too).
SLIM_EXCLUDES = ["/usr/share/doc/*", "/usr/share/man/*", "/usr/share/info/*",
                 "/usr/share/locale/*", "/usr/share/groff/*", "/usr/share/lintian/*",
                 "/usr/share/linda/*"]  # fmt: skip


class ImageError(RuntimeError):
    """An image could not be built; the message names the step."""


def log(msg: str) -> None:
    print(f">> {msg}", file=sys.stderr, flush=True)


def cache_dir() -> Path:
    root = os.environ.get("NODEWARDEN_CACHE") or str(
        Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "nodewarden"
    )
    path = Path(root) / "images"
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextlib.contextmanager
def cache_lock(name: str) -> Iterator[None]:
    """One builder at a time per image (several worktrees share the cache)."""
    with (cache_dir() / f".{name}.lock").open("w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def run(*argv: str, what: str, timeout: float = 1800, **kwargs: object) -> str:
    proc = subprocess.run(
        list(argv), capture_output=True, text=True, timeout=timeout, check=False, **kwargs
    )  # type: ignore[call-overload]
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-25:])
        raise ImageError(f"{what} failed (exit {proc.returncode}):\n{tail}")
    return str(proc.stdout)


def podman_has(ref: str) -> bool:
    return subprocess.run(["podman", "image", "exists", ref], check=False).returncode == 0


@dataclass(frozen=True)
class Built:
    ref: str
    archive: Path


# --- base --------------------------------------------------------------------------------


def base_key() -> str:
    """`<suite>-<base-files version>` as the mirror serves it (the point release)."""
    out = subprocess.run(
        ["apt-cache", "show", "--no-all-versions", "base-files"],
        capture_output=True,
        text=True,
        check=False,
    )
    for line in out.stdout.splitlines():
        if line.startswith("Version:"):
            return f"{SUITE}-{line.split()[1].replace('+', '_')}-r{BASE_RECIPE}"
    raise ImageError("cannot tell the Debian point release: `apt-cache show base-files` failed")


def _debian_sources() -> str:
    """The apt sources of Debian's own container images."""
    keyring = "/usr/share/keyrings/debian-archive-keyring.gpg"
    return (
        f"Types: deb\nURIs: {MIRROR}\nSuites: {SUITE} {SUITE}-updates\nComponents: main\n"
        f"Signed-By: {keyring}\n\n"
        f"Types: deb\nURIs: {SECURITY_MIRROR}\nSuites: {SUITE}-security\nComponents: main\n"
        f"Signed-By: {keyring}\n"
    )


def _slim(root: Path) -> None:
    """Drop apt caches, logs, docs, manuals and translations, as Debian's slim images do."""
    excludes = root / "etc" / "dpkg" / "dpkg.cfg.d" / "nodewarden-slim"
    excludes.write_text("".join(f"path-exclude {p}\n" for p in SLIM_EXCLUDES)
                        + "path-include /usr/share/doc/*/copyright\n")  # fmt: skip
    for junk in (
        "var/lib/apt/lists",
        "var/cache/apt",
        "var/log",
        *[p[1:-2] for p in SLIM_EXCLUDES],
    ):
        for path in (root / junk).rglob("*"):
            if path.name == "copyright" and "doc" in path.parts:
                continue
            if path.is_file() or path.is_symlink():
                path.unlink()  # directories stay: apt and dpkg expect theirs


def base_image() -> str:
    """The Debian base in podman's storage (built by debootstrap once per point release)."""
    key = base_key()
    tarball = cache_dir() / f"base-{key}.tar"
    release_file = cache_dir() / f"base-{key}.release"
    with cache_lock("base"):
        if not tarball.exists():
            log(f"debootstrap {SUITE} (minbase) for the image base, key {key}")
            with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
                root = Path(tmp) / "rootfs"
                run("debootstrap", "--variant=minbase", SUITE, str(root), MIRROR,
                    what="debootstrap", timeout=1800)  # fmt: skip
                (root / "etc" / "apt" / "sources.list").unlink(missing_ok=True)
                sources = root / "etc" / "apt" / "sources.list.d" / "debian.sources"
                sources.write_text(_debian_sources())
                _slim(root)
                release_file.write_text((root / "etc" / "debian_version").read_text().strip())
                partial = tarball.with_suffix(".partial")
                run("tar", "--numeric-owner", "-C", str(root), "-cf", str(partial), ".",
                    what="tar of the base")  # fmt: skip
                partial.rename(tarball)
        ref = f"localhost/nodewarden-base:debian-{release_file.read_text().strip()}-r{BASE_RECIPE}"
        if not podman_has(ref):
            run("podman", "import", "--change", 'CMD ["/bin/bash"]', str(tarball), ref,
                what="podman import of the base")  # fmt: skip
    return ref


# --- pause -------------------------------------------------------------------------------


def _hash_files(paths: list[Path], extra: str = "") -> str:
    digest = hashlib.sha256(extra.encode())
    for path in paths:
        digest.update(str(path.relative_to(REPO)).encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def pause_image() -> Built:
    go_version = run("go", "env", "GOVERSION", what="go env").strip()
    key = _hash_files(sorted(PAUSE_SRC.iterdir()), go_version)
    archive = cache_dir() / f"pause-{key}.oci.tar"
    with cache_lock("pause"):
        if archive.exists():
            return Built(PAUSE_REF, archive)
        log("building the pause image")
        with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
            binary = Path(tmp) / "pause"
            run("go", "build", "-trimpath", "-ldflags=-s -w", "-o", str(binary), ".",
                what="go build pause", cwd=PAUSE_SRC,
                env={**os.environ, "CGO_ENABLED": "0", "GOFLAGS": "-buildvcs=false"})  # fmt: skip
            ctr = run("buildah", "from", "scratch", what="buildah from scratch").strip()
            try:
                run("buildah", "copy", ctr, str(binary), "/pause", what="buildah copy")
                run("buildah", "config", "--entrypoint", '["/pause"]', ctr, what="buildah config")
                run("buildah", "commit", "--quiet", ctr, PAUSE_REF, what="buildah commit")
            finally:
                subprocess.run(["buildah", "rm", ctr], capture_output=True, check=False)
            _save(PAUSE_REF, archive)
    return Built(PAUSE_REF, archive)


def _save(ref: str, archive: Path) -> None:
    partial = archive.with_suffix(".partial")
    partial.unlink(missing_ok=True)
    run("podman", "save", "--format", "oci-archive", "-o", str(partial), ref,
        what=f"podman save {ref}")  # fmt: skip
    partial.rename(archive)


# --- operator ----------------------------------------------------------------------------


def operator_inputs() -> list[Path]:
    files = [REPO / name for name in OPERATOR_INPUTS]
    files += sorted(
        p
        for p in (REPO / "operator" / "nodewarden").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    )
    return files


def operator_key(base_ref: str) -> str:
    return _hash_files(operator_inputs(), base_ref)


@contextlib.contextmanager
def _build_pip_conf() -> Iterator[list[str]]:
    """Volumes that give pip in `podman build` the host's CA bundle (not kept in the image)."""
    if not HOST_CA_BUNDLE.exists():
        yield []
        return
    with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
        conf = Path(tmp) / "pip.conf"
        conf.write_text("[global]\ncert = /etc/nodewarden-build-ca.crt\n")
        yield [
            f"--volume={conf}:/etc/pip.conf:ro",
            f"--volume={HOST_CA_BUNDLE}:/etc/nodewarden-build-ca.crt:ro",
        ]


def operator_image(tag: str | None = None) -> Built:
    """Build the Dockerfile FROM the local base; the ref is keyed by its inputs."""
    base = base_image()
    key = operator_key(base)
    ref = f"{OPERATOR_REPOSITORY}:e2e-{key}"
    archive = cache_dir() / f"operator-{key}.oci.tar"
    with cache_lock("operator"):
        if not podman_has(ref):
            log(f"podman build of the Dockerfile FROM {base} -> {ref}")
            with _build_pip_conf() as volumes:
                run("podman", "build", "--format=docker", "--network=host", "--pull=never", "--layers",
                    f"--build-arg=BASE_IMAGE={base}", *volumes, f"--tag={ref}",
                    f"--file={REPO / 'Dockerfile'}", str(REPO),
                    what="podman build of the operator image", timeout=3600)  # fmt: skip
        if not archive.exists():
            _save(ref, archive)
        if tag:
            run("podman", "tag", ref, tag, what=f"podman tag {tag}")
    return Built(ref, archive)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("what", choices=["base", "pause", "operator", "all"])
    parser.add_argument("--tag", help="also tag the operator image (e.g. nodewarden:0.1.0)")
    args = parser.parse_args(argv)
    try:
        if args.what == "base":
            print(base_image())
            return 0
        built = []
        if args.what in ("pause", "all"):
            built.append(pause_image())
        if args.what in ("operator", "all"):
            built.append(operator_image(args.tag))
    except ImageError as exc:
        print(f"images: {exc}", file=sys.stderr)
        return 1
    for image in built:
        print(f"{image.ref} {image.archive}")
    if args.tag:
        print(f"tagged {args.tag} (podman); push it with: podman push {args.tag} <registry>/...")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
