"""The power controller's gauges, computed from every node's runtime after each round:
nodes by state and type, transitions in flight, nodes with stale telemetry, transitions
without a Safety Record."""

from __future__ import annotations

from collections.abc import Iterable

from nodewarden.metrics import (
    NODES,
    POWER_STALE_NODES,
    POWER_TRANSITIONS,
    POWER_UNRECORDED_TRANSITIONS,
)
from nodewarden.policy.reasons import ReasonCode
from nodewarden.policy.state import PowerState, TransitionKind, api_state
from nodewarden.power.nodestatus import api_state_of
from nodewarden.power.runtime import NodeRuntime

_STALE = (ReasonCode.TELEMETRY_STALE, ReasonCode.TELEMETRY_MISSING)
_STATE_NAMES = ("Booting", *[api_state(s) for s in PowerState])


def publish(nodes: Iterable[NodeRuntime]) -> None:
    """Set every power-path gauge (zero for combinations no node has)."""
    states: dict[tuple[str, str], int] = {}
    transitions: dict[tuple[str, str], int] = {}
    stale = 0
    unrecorded = 0
    for rt in nodes:
        key = (api_state_of(rt), rt.node_type)
        states[key] = states.get(key, 0) + 1
        t = rt.state.transition
        if t is not None:
            tk = (t.kind.value, rt.state.state.value)
            transitions[tk] = transitions.get(tk, 0) + 1
            if t.kind is not TransitionKind.VERIFY and rt.record is None:
                unrecorded += 1
        if any(r in rt.state.last_reasons for r in _STALE):
            stale += 1
    for state_name in _STATE_NAMES:
        for node_type in ("CloudVM", "SideNode"):
            NODES.labels(state_name, node_type).set(states.get((state_name, node_type), 0))
    for kind in TransitionKind:
        for st in PowerState:
            POWER_TRANSITIONS.labels(kind.value, st.value).set(
                transitions.get((kind.value, st.value), 0)
            )
    POWER_STALE_NODES.set(stale)
    POWER_UNRECORDED_TRANSITIONS.set(unrecorded)
