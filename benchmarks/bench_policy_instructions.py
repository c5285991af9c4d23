#!/usr/bin/env python3
"""Instructions per node of bench_policy's figures, counted under valgrind: a comparison
of two source trees that the machine's noise does not move.

    .venv/bin/python benchmarks/bench_policy_instructions.py TREE [TREE ...]
        [--modes evaluate,record,step,steprec,steady,event] [--nodes 300] [--rounds 3]

TREE is a checkout (or a `git worktree add --detach /tmp/x fea1317`): each run imports
its `operator/` and `benchmarks/bench_policy.py`. For each tree and mode the same
script runs twice under `valgrind --tool=callgrind`, with `--rounds` rounds and with
none; the difference over nodes x rounds is the figure (start-up and imports cancel
out). `PYTHONHASHSEED=0`, so two runs of one tree agree to a few instructions. Modes,
one per bench_policy figure: evaluate (one direction per node), record (evaluate + Safety
Record), step and steprec (machine.step without / with the record), steady (the steady
round at +30 s with each node's previous record), event (the event-driven round: the
agenda, the fleet tally and a step with its record for each of the 1 % of nodes that
changed; counted per stepped node, so give it --nodes 2000 or more). The calibration
figure and the load are printed first, as every benchmark does; the counts do not depend
on them.
Needs valgrind (Debian package `valgrind`). Takes about 40 s per tree and mode.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))

from calibration import load, summary

MODES = ("evaluate", "record", "step", "steprec", "steady", "event")

_WORKLOAD = r"""
import sys
from datetime import timedelta
tree, mode, nodes, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
sys.path.insert(0, tree + "/operator")
sys.path.insert(0, tree + "/benchmarks")
import bench_policy as b
from nodewarden.api.powerpolicy import PowerPolicySpec
from nodewarden.policy.events import Evaluate
from nodewarden.policy.gates import evaluate_shutdown, evaluate_wake
from nodewarden.policy.machine import step
from nodewarden.policy.state import PowerState
from nodewarden.policy.view import PolicyView
try:
    from nodewarden.policy.record_build import record_for_evaluation
except ImportError:  # before issue 22 it lived in record.py
    from nodewarden.policy.record import record_for_evaluation
fleet = b.make_fleet(nodes)
policy = PolicyView.from_spec(PowerPolicySpec(), name="bench", generation=1)
now, off, tick = b.NOW, PowerState.OFF, Evaluate()
later = now + timedelta(seconds=30)
def evaluate(state, facts, at):
    return (evaluate_wake if state.state is off else evaluate_shutdown)(facts, at, policy, state)
previous = [record_for_evaluation(evaluate(s, f, now), f, now, policy, s) for s, f in fleet]
changed, chosen = b.changed_fleet(fleet, b.STEADY_CHANGED, later)
steady = list(zip(changed, previous))
if mode == "event":  # bench_policy's event-driven round, on the nodes that changed
    from nodewarden.power.agenda import Agenda, Timer
    from nodewarden.rules.fleet import FleetTally
    try:
        from nodewarden.policy.base import replaced
    except ImportError:  # before it, the power round (and the benchmark) used model_copy
        def replaced(model, changes):
            return model.model_copy(update=changes)
    agenda, tally, far = Agenda(), FleetTally(), later + timedelta(hours=1)
    for s, _ in changed:
        agenda.push(Timer.STEP, far, s.node)
        agenda.push(Timer.EXPIRY, far, s.node)
        tally.set(s.node, None, "SideNode", s)
    rows = [steady[i] for i in sorted(chosen)]
    current = {s.node: far for s, _ in changed}
def one_round():
    if mode == "evaluate":
        for s, f in fleet:
            evaluate(s, f, now)
    elif mode == "record":
        for s, f in fleet:
            record_for_evaluation(evaluate(s, f, now), f, now, policy, s)
    elif mode == "step":
        for s, f in fleet:
            step(s, f, tick, now, policy, with_record=False)
    elif mode == "steprec":
        for s, f in fleet:
            step(s, f, tick, now, policy)
    elif mode == "steady":
        for (s, f), prev in steady:
            record_for_evaluation(evaluate(s, f, later), f, later, policy, s, previous=prev)
    else:
        for (s, _), _prev in rows:
            agenda.mark(s.node)
        names = agenda.take_dirty()
        names |= agenda.due(Timer.STEP, later, current.get)
        names |= agenda.due(Timer.EXPIRY, later, current.get)
        for (s, f), prev in rows:
            f = replaced(f, {"fleet": tally.reading(None, later)})
            result = step(s, f, tick, later, policy, previous=prev)
            tally.set(s.node, None, "SideNode", result.next)
            tally.set(s.node, None, "SideNode", s)
one_round()  # warm: the first round fills the policy's memo and the interpreter's caches
for _ in range(rounds):
    one_round()
"""


def instructions(tree: Path, mode: str, nodes: int, rounds: int) -> int:
    """Instructions valgrind counted for the whole process."""
    out = subprocess.run(
        [
            "valgrind",
            "--tool=callgrind",
            "--callgrind-out-file=/dev/null",
            sys.executable,
            "-c",
            _WORKLOAD,
            str(tree),
            mode,
            str(nodes),
            str(rounds),
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONHASHSEED": "0"},
        check=True,
    )
    found = re.search(r"Collected : (\d+)", out.stderr)
    if found is None:
        raise SystemExit(f"valgrind printed no count for {tree} {mode}:\n{out.stderr[-2000:]}")
    return int(found.group(1))


def _counted(mode: str, nodes: int) -> int:
    """The nodes a round of `mode` steps: all, or (event) the ones that changed."""
    if mode != "event":
        return nodes
    import bench_policy  # benchmarks/, beside this script

    return round(nodes * bench_policy.STEADY_CHANGED)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trees", nargs="+", type=Path)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--nodes", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    unknown = sorted(set(modes) - set(MODES))
    if unknown:
        parser.error(f"--modes: unknown {unknown}; choose from {','.join(MODES)}")
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind not found: apt-get install valgrind")
    print(summary())
    print(f"  before: {load()}")
    print(f"  instructions per node ({args.nodes} nodes x {args.rounds} rounds, valgrind)")
    first: dict[str, int] = {}
    for tree in args.trees:
        for mode in modes:
            rounds = instructions(tree, mode, args.nodes, args.rounds)
            none = instructions(tree, mode, args.nodes, 0)
            per_node = (rounds - none) // (_counted(mode, args.nodes) * args.rounds)
            base = first.setdefault(mode, per_node)
            print(f"  {tree!s:40s} {mode:9s} {per_node:9,d}   x{per_node / base:.3f}")
    print(f"  after: {load()}")


if __name__ == "__main__":
    main()
