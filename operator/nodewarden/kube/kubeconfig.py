"""Is this kubeconfig usable? One line naming the file, what is wrong and the fix.

kubernetes_asyncio reports a missing file as "Invalid kube-config file. Expected key
current-context", a YAML mistake as a multi-line parser dump and some shapes as a bare
TypeError. `kubeconfig_problem(path)` reads the file the way the loader will and says
what is wrong in one line (None: usable as far as can be told without contacting the
server). `KubeconfigError` carries that line; `api_client_from` raises it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from nodewarden.cliargs import yaml_mistake

DEFAULT_KUBECONFIG = Path("~/.kube/config")
_FILE_KEYS = {
    "clusters": ("cluster", ("certificate-authority",)),
    "users": ("user", ("client-certificate", "client-key", "tokenFile")),
}


class KubeconfigError(ValueError):
    """The kubeconfig cannot be used; the message names the file and the fix (one line)."""


def one_line(text: str) -> str:
    """`text` with every run of whitespace (newlines included) folded into one space."""
    return " ".join(str(text).split())


def _named(entries: object, name: str) -> Mapping[str, Any] | None:
    for entry in entries if isinstance(entries, list) else []:
        if isinstance(entry, Mapping) and entry.get("name") == name:
            return entry
    return None


def _read(path: Path) -> tuple[Any, str | None]:
    where = f"kubeconfig {path}"
    if not path.exists():
        return None, f"{where}: no such file; pass --kubeconfig FILE or set KUBECONFIG"
    if path.is_dir():
        return None, f"{where}: is a directory; pass the kubeconfig file itself"
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        return None, f"{where}: cannot read it ({exc.strerror or exc}); fix its permissions"
    except UnicodeDecodeError:
        return None, f"{where}: not a text file; pass a kubeconfig (YAML)"
    try:
        return yaml.safe_load(text), None
    except yaml.YAMLError as exc:
        return None, (
            f"{where}: {yaml_mistake(exc)}; fix it or write a new one "
            "(kubectl config view --raw > FILE)"
        )


def kubeconfig_problem(path: Path) -> str | None:
    """What makes `path` unusable as a kubeconfig, in one line; None when it looks usable."""
    data, problem = _read(path)
    if problem is not None:
        return problem
    where = f"kubeconfig {path}"
    if not isinstance(data, Mapping) or not data:
        return (
            f"{where}: empty or not a kubeconfig (expected a mapping with clusters, users, "
            "contexts and current-context)"
        )
    current = data.get("current-context")
    if not current:
        return (
            f"{where}: no current context; choose one with "
            f"kubectl --kubeconfig {path} config use-context NAME"
        )
    context = _named(data.get("contexts"), str(current))
    if context is None or not isinstance(context.get("context"), Mapping):
        return (
            f"{where}: current context {current!r} is not defined under contexts; choose an "
            f"existing one with kubectl --kubeconfig {path} config use-context NAME"
        )
    refs = context["context"]
    for section, ref_key in (("clusters", "cluster"), ("users", "user")):
        name = refs.get(ref_key)
        if section == "users" and not name:
            continue  # a context without a user is allowed (anonymous)
        entry = _named(data.get(section), str(name))
        if entry is None:
            return (
                f"{where}: context {current!r} names {ref_key} {name!r}, which is not defined "
                f"under {section}; fix the context or add the {ref_key}"
            )
        body_key, file_keys = _FILE_KEYS[section]
        body = entry.get(body_key) or {}
        if not isinstance(body, Mapping):
            return f"{where}: {ref_key} {name!r} is not a mapping"
        if section == "clusters" and not body.get("server"):
            return f"{where}: cluster {name!r} has no server URL; add clusters[].cluster.server"
        for key in file_keys:
            value = body.get(key)
            if not value:
                continue
            target = Path(os.path.expanduser(str(value)))
            if not target.is_absolute():
                target = path.parent / target
            if not target.is_file():
                return (
                    f"{where}: {ref_key} {name!r}: {key} {target}: no such file; fix the "
                    "path or embed the data (--embed-certs)"
                )
    return None


def default_kubeconfig() -> Path | None:
    """The kubeconfig the client would use outside a cluster: the single file named by
    $KUBECONFIG, else ~/.kube/config (None: $KUBECONFIG lists several files)."""
    env = os.environ.get("KUBECONFIG", "")
    paths = [p for p in env.split(os.pathsep) if p]
    if len(paths) > 1:
        return None
    return Path(os.path.expanduser(paths[0] if paths else str(DEFAULT_KUBECONFIG)))


def context_namespace(path: Path) -> str | None:
    """The namespace of the kubeconfig's current context, if it sets one."""
    data, problem = _read(path)
    if problem is not None or not isinstance(data, Mapping):
        return None
    context = _named(data.get("contexts"), str(data.get("current-context")))
    body = (context or {}).get("context")
    namespace = body.get("namespace") if isinstance(body, Mapping) else None
    return str(namespace) if namespace else None
