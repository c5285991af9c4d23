"""Consolidation by drain in `make demo`: the containers of
e2e/demo/consolidation-containers.yaml, each stage applied once the one before is under
way -- timed by conditions the demo reads through the API, never by a clock.

`ConsolidationArrivals.step()` is called from the demo's main loop; it reads the
ContainerDispatches at most every `interval` seconds:

- stage 1 ("first" and "kept") once every container of the first batch
  (e2e/demo/containers.yaml) is complete, so their new VM is not shared with that batch;
- stage 2 ("second") once both of stage 1 are Running: no room is left beside them, so
  it gets a VM of its own -- where "kept" fits once "first" has ended.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

DEMO = Path(__file__).resolve().parent / "demo"
CONTAINERS = DEMO / "consolidation-containers.yaml"
FIRST_BATCH = DEMO / "containers.yaml"
STAGE = "demo.nodewarden.io/stage"


@dataclass
class ConsolidationArrivals:
    """See the module docstring."""

    kubectl: Callable[..., Any]
    namespace: str
    interval: float = 2.0
    stages: list[list[dict[str, Any]]] = field(default_factory=list)
    _next: float = 0.0
    _waiting_for: list[str] = field(default_factory=list)
    _wanted: str = "Complete"

    def __post_init__(self) -> None:
        docs = list(yaml.safe_load_all(CONTAINERS.read_text()))
        by_stage: dict[str, list[dict[str, Any]]] = {}
        for doc in docs:
            by_stage.setdefault(doc["metadata"]["annotations"][STAGE], []).append(doc)
        self.stages = [by_stage[k] for k in sorted(by_stage)]
        self._waiting_for = [
            d["metadata"]["name"] for d in yaml.safe_load_all(FIRST_BATCH.read_text())
        ]

    def step(self) -> None:
        if not self.stages or time.monotonic() < self._next:
            return
        self._next = time.monotonic() + self.interval
        out = self.kubectl(
            "-n",
            self.namespace,
            "get",
            "cd",
            "-o",
            "jsonpath={range .items[*]}{.metadata.name}={.status.phase}{'\\n'}{end}",
            check=False,
        )
        if out.returncode != 0:
            return
        phases = dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)
        if any(phases.get(name) != self._wanted for name in self._waiting_for):
            return
        stage = self.stages.pop(0)
        for container in stage:
            self.kubectl("-n", self.namespace, "apply", "-f", "-", input=json.dumps(container))
        names = [c["metadata"]["name"] for c in stage]
        self._waiting_for, self._wanted = names, "Running"
        print(f">> consolidation demo: applied {', '.join(names)}", file=sys.stderr, flush=True)
