"""Helpers of `test_parity_live.py`: a spy recording what the live power controller's
`step` decides for one node, the simulator's recorded steps in the same shape, which of
them both sides are fed alike, the VM case's fleet, and the idle-since check."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from nodewarden.policy.events import Event
from nodewarden.policy.facts import NodeFacts
from nodewarden.policy.machine import step
from nodewarden.policy.state import NodePowerState
from nodewarden.simulate.engine import Simulation
from nodewarden.simulate.fleet import Fleet, load_fleet

Fed = tuple[int, str, tuple[str, ...], str]
"""(second, decision, reason codes, event kind) of one step."""
FED_ALIKE = {"RequestAccepted", "PolicyChanged"}


def recorder(node: str) -> tuple[list[Fed], Any, list[Any]]:
    """A spy on the live `step` keeping (second, decision, reasons, event) for `node`."""
    seen: list[Fed] = []
    t0: list[datetime] = []

    def spy(
        state: NodePowerState, facts: NodeFacts, event: Event, now: datetime, *a: Any, **k: Any
    ) -> Any:
        result = step(state, facts, event, now, *a, **k)
        if state.node == node:
            t = round((now - t0[0]).total_seconds())
            seen.append(
                (t, result.decision.value, tuple(r.value for r in result.reasons), event.type)
            )
        return result

    return seen, spy, t0


def fed(
    seq: list[Fed], also: frozenset[str] = frozenset()
) -> list[tuple[str, tuple[str, ...], str]]:
    """(decision, reasons, event) of the steps whose event both sides are fed alike: the
    request's answer, a policy edit, the confirming observation. The event of the other
    steps is timing, not a rule: a deadline passing is met live by whichever fact arrives
    in that second's round (a probe report, a BMC read), by the simulator's timer
    (Evaluate); the last step of a drain by the live re-read's answer (DemandReread) or a
    fresh probe (RefreshFacts) in the simulator. `also`: more event kinds fed alike in a case."""
    return [
        s[1:]
        for s in seq
        if s[3] in FED_ALIKE | also or (s[3] == "PowerObserved" and "POWER_OFF_CONFIRMED" in s[2])
    ]


def recorded_steps(sim: Simulation, node: str) -> list[Fed]:
    result = sim.run()
    start = sim.trace.start
    return [
        (round((s.time - start).total_seconds()), s.decision.value, s.reasons, s.event.type)
        for s in result.recordings[node].steps
    ]


def vm_fleet() -> Fleet:
    return load_fleet(
        {
            "cloud": {
                "instanceTypes": [{"name": "small", "vcpus": 2, "ram": "4Gi", "price": 0.1}],
                "billing": {"period": "0s", "minimum": "0s"},
                # the harness's VM: listed and ready at once, gone 5 s after the destroy
                "createLatency": "0s",
                "boot": "0s",
                "shutdown": "5s",
                "listInterval": "5s",
            },
            "probe": {"interval": "5s", "bootInterval": "5s"},
            # in process nothing waits on an API server: the dispatcher's admission
            # acknowledgement and the probe answers come at once, as in the harness
            "controller": {"apiLatency": "0s"},
        }
    )


def idle_unseen(works: list[Any]) -> list[datetime]:
    """Idle-since times that no work reading observed: live, `rules.readings.idle_since`
    is fed the previous reading's idle since, so a node is idle since the first probe
    that saw it idle -- always an observation time."""
    seen = {w.observed_at for w in works}
    return sorted({w.idle_since for w in works if w.idle_since is not None} - seen)
