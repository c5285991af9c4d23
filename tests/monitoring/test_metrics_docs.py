"""The README's metrics table lists every metric the operator registers, with its type
and labels, and nothing else; docs/operations.md explains every alert the chart ships."""

from __future__ import annotations

import re

import yaml

from localcluster import REPO
from nodewarden.metrics import REGISTRY

README = REPO / "README.md"


def _exported() -> dict[str, tuple[str, str]]:
    """Exported name -> (type, labels as the README writes them)."""
    out: dict[str, tuple[str, str]] = {}
    for family in REGISTRY.collect():
        name = family.name
        if family.type == "counter":
            name += "_total"
        elif family.type == "info":
            name += "_info"
        collector = REGISTRY._names_to_collectors[name]
        labels = ", ".join(getattr(collector, "_labelnames", ()))
        if family.type == "info":
            labels = "version"
        out[name] = (family.type, labels)
    return out


def _documented() -> dict[str, tuple[str, str]]:
    text = README.read_text()
    section = text[text.index("## Metrics\n") : text.index("## Where things are")]
    rows = re.findall(r"^\| `(nodewarden_[a-z_]+)` \| (\w+) \|([^|]*)\|", section, re.M)
    return {name: (kind, labels.strip()) for name, kind, labels in rows}


def test_readme_lists_every_metric_with_its_type_and_labels() -> None:
    exported, documented = _exported(), _documented()
    assert len(exported) > 30
    assert set(exported) - set(documented) == set(), "metrics missing from the README"
    assert set(documented) - set(exported) == set(), "the README lists metrics that do not exist"
    wrong = {n: (documented[n], exported[n]) for n in exported if documented[n] != exported[n]}
    assert wrong == {}, "README type/labels differ from the registry: (README, registry)"


def test_operations_guide_explains_every_alert() -> None:
    rules = yaml.safe_load((REPO / "helm" / "nodewarden" / "files" / "alerts.yaml").read_text())
    alerts = {r["alert"] for g in rules["groups"] for r in g["rules"]}
    guide = (REPO / "docs" / "operations.md").read_text()
    table = guide[guide.index("## Alerts and what to do") : guide.index("## Troubleshooting")]
    explained = set(re.findall(r"^\| (Nodewarden\w+) \|", table, re.M))
    assert alerts == explained
    readme = README.read_text()
    assert all(a in readme for a in alerts), "the README's alert list is incomplete"
