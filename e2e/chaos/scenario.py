"""The chaos scenario: play a seeded schedule against the fleet, then check every invariant.

`run_chaos(cluster, namespace, workdir, settings)` is the whole scenario; the long
version (`make chaos`, e2e/chaos/test_chaos.py) and the CI variant inside `make test`
(tests/chaos/test_chaos_ci.py) differ only in `ChaosSettings`. The seed and the schedule
are printed at the start (past pytest's capture) and again with any failure, with the
command that replays the run.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from chaos.fleet import SECOND_ID, SECOND_NODES, ChaosFleet
from chaos.invariants import check_all, report
from chaos.report import build_report, write_report
from chaos.schedule import FaultSchedule
from clusterkit import ClusterHandle, wait_for

SEED_ENV = "NODEWARDEN_CHAOS_SEED"


@dataclass(frozen=True)
class ChaosSettings:
    seed: int
    containers: int
    deadline: float
    """Seconds the run may take from the first burst until the queue drains."""
    replay: str
    """The command that replays this run."""
    exclude: frozenset[str] = frozenset()
    """Fault kinds not played (each exposes a known bug: `schedule.KNOWN_BUGS`)."""
    skew: str | None = None
    """FAKETIME of every second replica (`+30s`: wall clock ahead; `make chaos` only)."""
    second_install: bool = False
    """A second install in the namespace, with its own side node (`make chaos` only)."""
    report: Path | None = None
    """Where the run's report goes (`--report FILE.json`); default: report.json in the
    run's work directory. `python3 e2e/chaos/recheck.py FILE.json` recounts it."""


def seed_from(value: str | None) -> int:
    """The given seed, else $NODEWARDEN_CHAOS_SEED, else a fresh random one (printed)."""
    text = value or os.environ.get(SEED_ENV)
    if not text:
        return random.SystemRandom().randrange(1, 1_000_000)
    try:
        return int(text)
    except ValueError:
        raise ValueError(
            f"chaos seed must be an integer, got {text!r} (--chaos-seed / ${SEED_ENV})"
        ) from None


def add_report_option(parser: Any) -> None:
    """`--report FILE.json` of both chaos runs (`make chaos` and the CI variant)."""
    parser.getgroup("chaos").addoption(
        "--report",
        default=None,
        type=Path,
        help="write the chaos run's report here (recount: python3 e2e/chaos/recheck.py FILE)",
    )


def shout(text: str) -> None:
    """Print past pytest's output capture (the seed must be visible while the run goes)."""
    print(text, file=sys.__stderr__, flush=True)
    print(text)


def run_chaos(
    cluster: ClusterHandle, namespace: str, workdir: Path, settings: ChaosSettings
) -> None:
    schedule = FaultSchedule.make(settings.seed, settings.containers, settings.exclude)
    extra = []
    if settings.skew:
        extra.append(f"  every second replica's wall clock skewed {settings.skew} (libfaketime)")
    if settings.second_install:
        extra.append(
            f"  second install {SECOND_ID} in the namespace: {', '.join(SECOND_NODES)}, "
            "the same queue"
        )
    header = "\n".join([schedule.describe(), *extra, f"replay: {settings.replay}"])
    shout(header)
    started = time.monotonic()
    fleet = ChaosFleet.create(
        cluster,
        namespace,
        workdir,
        schedule,
        skew=settings.skew,
        second_install=settings.second_install,
    )
    try:
        drained_in_time = fleet.run(settings.deadline)
        drained = time.monotonic() - started
        orphans = fleet.orphans()
        if drained_in_time:  # 60 s after the drain, nothing of ours may be left unaccounted
            try:
                wait_for(lambda: not fleet.orphans(), timeout=60, interval=2, what="no orphans")
                orphans = []
            except AssertionError:
                orphans = fleet.orphans()
        evidence = fleet.evidence()
        evidence["orphans"] = orphans
        _keep(workdir / "evidence.json", evidence)
        evidence["report"] = build_report(
            evidence,
            seed=settings.seed,
            replay=settings.replay,
            t0=fleet.t0,
            faults=[asdict(i) for i in fleet.injected],
            node_states=fleet.node_states,
        )
        results = check_all(evidence)
        evidence["report"]["harness"] = {name: len(v) for name, v in results.items()}
        report_path = settings.report or workdir / "report.json"
        write_report(report_path, evidence["report"])
        shout(f"chaos report: {report_path} (recount: python3 e2e/chaos/recheck.py {report_path})")
        figures = (
            f"chaos seed {settings.seed}: {len(schedule.containers)} containers "
            f"{Counter((c.get('status') or {}).get('phase') for c in evidence['containers'])}; "
            f"faults injected {dict(fleet.fired())}; operator processes "
            f"{evidence['processes']} (SIGKILLed {evidence['killed']}, exited and restarted "
            f"{len(fleet.exited)}), takeovers "
            f"{fleet.takeovers}; drained after {drained:.0f}s, total "
            f"{time.monotonic() - started:.0f}s\n{report(results)}"
        )
        shout(figures)
        missing = _not_fired(schedule, fleet)
        failed = {name: v for name, v in results.items() if v}
        assert not failed and not missing, (
            f"{len(failed)} invariant(s) violated; faults never injected: {missing}\n"
            f"{figures}\ndrain triggers:\n{fleet.trigger_story()}\n{header}"
        )
    except BaseException:
        shout(f"chaos run FAILED\n{header}")
        raise
    finally:
        fleet.close()


def _not_fired(schedule: FaultSchedule, fleet: ChaosFleet) -> list[str]:
    """Scheduled fault kinds the run never managed to inject (the run would prove less)."""
    fired = fleet.fired()
    wanted = Counter(f.kind for f in schedule.faults) + Counter(t.kind for t in schedule.triggers)
    wanted["ssh-slow"] = sum(1 for f in schedule.faults if f.kind == "leader-kill" and f.delay)
    return [f"{kind} ({fired[kind]}/{n})" for kind, n in wanted.items() if fired[kind] < n]


def _keep(path: Path, evidence: dict[str, Any]) -> None:
    """The evidence for a post-mortem (without the secret values and the logs, kept beside)."""
    kept = {k: v for k, v in evidence.items() if k not in ("secrets", "logs")}
    path.write_text(json.dumps(kept, indent=1, default=str))
