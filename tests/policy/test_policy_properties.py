"""Property-based tests of the power core (hypothesis).

The stateful test drives the state machine with random sequences of fact changes, clock
advances and events (every event type, including stale and duplicate request outcomes)
under randomly chosen policies, and after every step checks the invariants of issue 3
with an oracle written independently of the gate code:

* never a shutdown request (or the SHUTDOWN decision) while any gate fails;
* never OFF without an observed-Off event;
* never admission Open without observed On and a passing ready probe;
* every non-terminal state has a deadline (in the future);
* same inputs -> same outputs (the step is re-run and compared, record included);
* no ForceOff unless a manual override permitted by the policy is present, and then
  the Safety Record lists it as applied.

Example count: the "nodewarden-policy" settings profile runs 2,000 examples (override
with NODEWARDEN_POLICY_EXAMPLES for quick local runs).
"""

from __future__ import annotations

import os
import re
from collections import Counter
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    rule,
    run_state_machine_as_test,
)
from policy_builders import (
    NODE,
    NOW,
    block_lock,
    capability,
    desired,
    idle_facts,
    intent,
    off_facts,
    off_state,
    on_state,
    policy,
)

from nodewarden.policy.base import CLOCK_SKEW_TOLERANCE
from nodewarden.policy.events import (
    AdmissionClosed,
    DeadlineReached,
    DemandReread,
    Evaluate,
    Event,
    ManualOverride,
    NewDemand,
    PolicyChanged,
    PowerObserved,
    ReadyProbeResult,
    RequestAccepted,
    RequestErrored,
    RequestRejected,
)
from nodewarden.policy.facts import (
    DemandReading,
    InhibitorReading,
    NodeFacts,
    PowerReading,
    ReadyReading,
    UptimeReading,
    WorkReading,
)
from nodewarden.policy.gateblocks import SHUTDOWN_REQUEST_ACTIONS
from nodewarden.policy.gates import evaluate_shutdown
from nodewarden.policy.machine import step
from nodewarden.policy.reasons import Decision
from nodewarden.policy.state import (
    NON_TERMINAL_STATES,
    AdmissionState,
    NodePowerState,
    PowerState,
)
from nodewarden.policy.view import PolicyView

EXAMPLES = int(os.environ.get("NODEWARDEN_POLICY_EXAMPLES", "2000"))
settings.register_profile(
    "nodewarden-policy",
    max_examples=EXAMPLES,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    print_blob=True,
)
PROFILE = settings.get_profile("nodewarden-policy")

FORCE_OFF_POLICY = policy(
    retry={"budget": 0},
    minOn="10m",
    allowedActions=["On", "GracefulShutdown", "ForceOff"],
    inhibitorOverride={"permitted": True, "permitForceOff": True, "allowedRequesters": ["alice"]},
)
POLICIES: list[PolicyView] = [
    FORCE_OFF_POLICY,
    policy(),
    policy(retry={"budget": 0}, deadlines={"ready": "3m", "wake": "3m", "shutdown": "3m"}),
    policy(
        idleThreshold="5m",
        minOn="10m",
        minOff="2m",
        cooldown="1m",
        retry={"budget": 2, "initialBackoff": "5s", "maxBackoff": "1m"},
        allowedActions=["On", "GracefulShutdown", "ForceOff", "WakeOnLan", "SshPoweroff"],
        inhibitorOverride={"permitted": True, "permitForceOff": True},
    ),
    policy(
        inhibitorOverride={"permitted": True, "allowedRequesters": ["bob"]}, telemetryMaxAge="30s"
    ),
    policy(billing={"period": "1h", "windowStart": "50m", "windowEnd": "40m"}),  # invalid
    policy(paused=True),
]

VISITED: Counter[str] = Counter()
TRANSITIONS: set[tuple[str, str]] = set()
SEEN_ACTIONS: Counter[str] = Counter()


def shutdown_oracle(
    facts: NodeFacts,
    prev: NodePowerState,
    now: datetime,
    pol: PolicyView,
    action: str,
    admission: NodePowerState | None = None,
) -> list[str]:
    """Independent statement of the shutdown gates; returns the violated ones.

    `admission` is the state whose admission fields count (the step's result: an
    AdmissionClosed event in the same step is itself the confirmation)."""
    adm = admission or prev
    bad: list[str] = []
    max_age = pol.telemetry_max_age
    if pol.problems or pol.paused:
        bad.append("policy")
    readings = {
        "demand": facts.demand,
        "work": facts.work,
        "power": facts.power,
        "inhibitors": facts.inhibitors,
    }
    for name, reading in readings.items():
        if reading is None:
            bad.append(f"{name} missing")
        elif (
            now - reading.observed_at > max_age or reading.observed_at > now + CLOCK_SKEW_TOLERANCE
        ):
            bad.append(f"{name} not fresh")
    if adm.admission is not AdmissionState.CLOSED or adm.admission_since is None:
        bad.append("admission not closed")
    closed_at = adm.admission_since
    if facts.demand is not None:
        if facts.demand.queued:
            bad.append("demand present")
        if closed_at is not None and facts.demand.observed_at < closed_at:
            bad.append("demand not re-read after closing")
    if facts.work is not None:
        if facts.work.active_jobs:
            bad.append("active jobs")
        if closed_at is not None and facts.work.observed_at < closed_at:
            bad.append("drain not proven after closing")
    if facts.power is None or facts.power.power != "On":
        bad.append("power not On")
    if facts.inhibitors is not None and any(i.blocks_shutdown for i in facts.inhibitors.inhibitors):
        it = facts.intent
        ok = (
            it is not None
            and it.action == "Shutdown"
            and it.override is not None
            and it.override.inhibitors
            and pol.override_permitted
            and (not pol.override_requesters or it.requested_by in pol.override_requesters)
        )
        if not ok:
            bad.append("blocking inhibitor")
    cap = facts.capability
    if cap is None or cap.allowable is None or action not in cap.allowable:
        bad.append("action not allowable on node")
    if action not in pol.allowed_actions:
        bad.append("action not allowed by policy")
    on_candidates = [
        t for t in (facts.uptime.on_since if facts.uptime else None, prev.on_since) if t
    ]
    if not on_candidates or now - max(on_candidates) < pol.min_on:
        bad.append("min-on")
    if prev.last_transition_at is not None and now - prev.last_transition_at < pol.cooldown:
        bad.append("cooldown")
    intent_ = facts.intent
    if intent_ is not None and intent_.action != "Shutdown":
        bad.append("intent is not Shutdown")
    if facts.desired is not None and facts.desired.power == "On":
        bad.append("desired On")
    return bad


class PowerMachine(RuleBasedStateMachine):
    """Random walks through the state machine with the invariants checked at every step."""

    def __init__(self) -> None:
        super().__init__()
        self.now = NOW
        self.policy = POLICIES[0]
        self.state = on_state()
        self.facts = idle_facts()

    # -- setup -----------------------------------------------------------------------------

    @initialize(pol=st.sampled_from(POLICIES), start=st.sampled_from(["on", "off", "unknown"]))
    def setup(self, pol: PolicyView, start: str) -> None:
        self.policy = pol
        if start == "on":
            self.state, self.facts = on_state(), idle_facts()
        elif start == "off":
            self.state, self.facts = off_state(), off_facts()
        else:
            self.state, self.facts = NodePowerState.initial(NODE), idle_facts()

    # -- the clock and the facts (changes without an event) ---------------------------------------

    @rule(seconds=st.sampled_from([1, 5, 30, 61, 121, 300, 601, 1800]))
    def advance(self, seconds: int) -> None:
        self.now += timedelta(seconds=seconds)

    def _at(self, age: int) -> datetime:
        return self.now - timedelta(seconds=age)

    @rule(
        active=st.sampled_from([0, 0, 0, 1]),
        idle_for=st.sampled_from([0, 600, 3600]),
        age=st.sampled_from([0, 0, 10, 200]),
    )
    def refresh_work(self, active: int, idle_for: int, age: int) -> None:
        seen = self._at(age)
        reading = WorkReading(
            source="probe",
            observed_at=seen,
            active_jobs=active,
            idle_since=None if active else seen - timedelta(seconds=idle_for),
        )
        self.facts = self.facts.model_copy(update={"work": reading})

    @rule(
        blocking=st.sampled_from([False, False, False, True]),
        age=st.sampled_from([0, 10, 200, -60]),
    )
    def refresh_inhibitors(self, blocking: bool, age: int) -> None:
        locks = (block_lock(),) if blocking else ()
        reading = InhibitorReading(source="logind", observed_at=self._at(age), inhibitors=locks)
        self.facts = self.facts.model_copy(update={"inhibitors": reading})

    @rule(value=st.sampled_from(["On", "Off", "Unknown"]), age=st.sampled_from([0, 30, 200]))
    def silently_change_power_reading(self, value: str, age: int) -> None:
        reading = PowerReading(source="redfish", observed_at=self._at(age), power=value)
        self.facts = self.facts.model_copy(update={"power": reading})

    @rule(passed=st.booleans(), age=st.sampled_from([0, 30, 200]))
    def silently_change_ready_reading(self, passed: bool, age: int) -> None:
        reading = ReadyReading(source="probe", observed_at=self._at(age), passed=passed)
        self.facts = self.facts.model_copy(update={"ready": reading})

    @rule(up_for=st.sampled_from([60, 1500, 20000]))
    def refresh_uptime(self, up_for: int) -> None:
        reading = UptimeReading(
            source="probe", observed_at=self.now, on_since=self.now - timedelta(seconds=up_for)
        )
        self.facts = self.facts.model_copy(update={"uptime": reading})

    @rule(which=st.sampled_from(["full", "full", "graceful-only", "unknown", "wol", "none"]))
    def change_capability(self, which: str) -> None:
        cap = {
            "full": capability("Redfish", ("On", "GracefulShutdown", "ForceOff")),
            "graceful-only": capability("Redfish", ("On", "GracefulShutdown")),
            "unknown": capability("Redfish", None),
            "wol": capability("WakeOnLan", ("WakeOnLan", "SshPoweroff")),
            "none": None,
        }[which]
        self.facts = self.facts.model_copy(update={"capability": cap})

    @rule(
        power_setting=st.sampled_from(["Auto", "Auto", "On", "Off"]),
        behavior=st.sampled_from(["run", "run", "hold", "drain"]),
    )
    def change_desired(self, power_setting: str, behavior: str) -> None:
        self.facts = self.facts.model_copy(update={"desired": desired(power_setting, behavior)})

    @rule()
    def refresh_everything_healthy(self) -> None:
        """All decisive readings re-read now with benign values (helps walks make progress)."""
        power_value = self.facts.power.power if self.facts.power is not None else "On"
        self.facts = self.facts.model_copy(
            update={
                "demand": DemandReading(source="queue", observed_at=self.now, queued=0),
                "work": WorkReading(
                    source="probe",
                    observed_at=self.now,
                    active_jobs=0,
                    idle_since=self.now - timedelta(hours=1),
                ),
                "inhibitors": InhibitorReading(source="logind", observed_at=self.now),
                "power": PowerReading(source="redfish", observed_at=self.now, power=power_value),
                "uptime": UptimeReading(
                    source="probe", observed_at=self.now, on_since=self.now - timedelta(hours=3)
                ),
            }
        )

    # -- events -------------------------------------------------------------------------------

    @rule()
    def ev_sequence_towards_shutdown(self) -> None:
        """The usual shutdown sequence as separate steps (each checked), so that random
        walks reach the request often enough for the invariants to bite."""
        self.refresh_everything_healthy()
        self._step(Evaluate())
        self.now += timedelta(seconds=1)
        self._step(AdmissionClosed(at=self.now))
        self.now += timedelta(seconds=1)
        self.refresh_everything_healthy()
        self._step(
            DemandReread(reading=DemandReading(source="queue", observed_at=self.now, queued=0))
        )

    @rule()
    def ev_evaluate(self) -> None:
        self._step(Evaluate())

    @rule(switch_policy=st.booleans())
    def ev_sequence_manual_shutdown_refused_by_bmc(self, switch_policy: bool) -> None:
        """A person asks for a shutdown with a ForceOff override; the BMC refuses the
        graceful request. Only policies that permit it may answer with ForceOff (half the
        time the policy is first switched to one that does)."""
        if switch_policy:
            self.policy = FORCE_OFF_POLICY
            self._step(PolicyChanged())
        self._step(
            ManualOverride(intent=intent("Shutdown", override_inhibitors=True, force_off=True))
        )
        self.ev_sequence_towards_shutdown()
        t = self.state.transition
        if t is not None and t.request is not None:
            self.now += timedelta(seconds=1)
            self._step(
                RequestRejected(
                    transition_id=t.id,
                    attempt=t.request.attempt,
                    action=t.request.action,
                    at=self.now,
                    source="bmc",
                )
            )

    @rule()
    def ev_deadline(self) -> None:
        self._step(DeadlineReached())

    @rule(lag=st.sampled_from([0, 1, 30, -5]))
    def ev_admission_closed(self, lag: int) -> None:
        self._step(AdmissionClosed(at=self._at(lag)))

    @rule(
        queued=st.sampled_from([0, 0, 0, 1, 3]),
        age=st.sampled_from([0, 0, 5, 300]),
        reread=st.booleans(),
    )
    def ev_demand(self, queued: int, age: int, reread: bool) -> None:
        reading = DemandReading(source="queue", observed_at=self._at(age), queued=queued)
        self._step(DemandReread(reading=reading) if reread else NewDemand(reading=reading))

    @rule(
        kind=st.sampled_from(["accepted", "accepted", "rejected", "errored"]),
        matching=st.sampled_from([True, True, True, False]),
    )
    def ev_request_outcome(self, kind: str, matching: bool) -> None:
        t = self.state.transition
        if t is not None and t.request is not None:
            tid, attempt, action = t.id, t.request.attempt, t.request.action
        else:
            tid, attempt, action = "no-such-transition", 1, "GracefulShutdown"
        if not matching:
            attempt += 1
        fields: dict[str, Any] = {
            "transition_id": tid,
            "attempt": attempt,
            "action": action,
            "at": self.now,
            "source": "bmc",
        }
        outcome: Event
        if kind == "accepted":
            outcome = RequestAccepted(**fields)
        elif kind == "rejected":
            outcome = RequestRejected(**fields)
        else:
            outcome = RequestErrored(**fields)
        self._step(outcome)

    @rule(
        value=st.sampled_from(["On", "Off", "Off", "PoweringOff", "Unknown"]),
        age=st.sampled_from([0, 0, 3, 400]),
    )
    def ev_power_observed(self, value: str, age: int) -> None:
        reading = PowerReading(source="redfish", observed_at=self._at(age), power=value)
        self._step(PowerObserved(reading=reading))

    @rule(passed=st.sampled_from([True, True, False]), age=st.sampled_from([0, 0, 200]))
    def ev_ready_probe(self, passed: bool, age: int) -> None:
        self._step(
            ReadyProbeResult(
                reading=ReadyReading(source="probe", observed_at=self._at(age), passed=passed)
            )
        )

    @rule(pol=st.sampled_from(POLICIES))
    def ev_policy_changed(self, pol: PolicyView) -> None:
        self.policy = pol
        self._step(PolicyChanged())

    @rule(
        which=st.sampled_from(
            [
                "none",
                "shutdown",
                "shutdown-override",
                "shutdown-force",
                "shutdown-bob",
                "wake",
                "drain",
                "restart",
            ]
        )
    )
    def ev_manual_intent(self, which: str) -> None:
        chosen = {
            "none": None,
            "shutdown": intent("Shutdown"),
            "shutdown-override": intent("Shutdown", override_inhibitors=True),
            "shutdown-force": intent("Shutdown", override_inhibitors=True, force_off=True),
            "shutdown-bob": intent(
                "Shutdown", override_inhibitors=True, force_off=True, requested_by="bob"
            ),
            "wake": intent("Wake"),
            "drain": intent("Drain"),
            "restart": intent("Restart"),
        }[which]
        self._step(ManualOverride(intent=chosen))

    # -- the invariants ------------------------------------------------------------------------------

    def _step(self, event: Event) -> None:
        prev, facts, now, pol = self.state, self.facts, self.now, self.policy
        result = step(prev, facts, event, now, pol)
        again = step(prev, facts, event, now, pol)
        # same inputs -> same outputs, record included
        assert again.next == result.next
        assert again.actions == result.actions
        assert (again.decision, again.reasons) == (result.decision, result.reasons)
        assert again.record == result.record
        merged, nxt = result.facts, result.next
        shutdown_requests = [
            a
            for a in result.actions
            if a.type == "RequestPower" and a.action in SHUTDOWN_REQUEST_ACTIONS
        ]
        # never SHUTDOWN (or a shutdown request) while any gate fails
        if shutdown_requests or result.decision is Decision.SHUTDOWN:
            assert shutdown_requests and result.decision is Decision.SHUTDOWN
            for request in shutdown_requests:
                action = "GracefulShutdown" if request.action == "ForceOff" else request.action
                violated = shutdown_oracle(merged, prev, now, pol, action, nxt)
                assert not violated, (violated, prev.state, event)
            assert result.evaluation is not None and result.evaluation.passed
        # no ForceOff unless an override permitted by policy is present; then it is recorded
        for request in shutdown_requests:
            if request.action == "ForceOff":
                it = merged.intent
                assert it is not None and it.override is not None and it.override.force_off
                assert pol.permit_force_off and "ForceOff" in pol.allowed_actions
                assert not pol.override_requesters or it.requested_by in pol.override_requesters
                assert result.record is not None and result.record.manual_override is not None
                assert "forceOff" in result.record.manual_override.applied
                assert request.override_intent == it.name
        # never OFF without an observed-Off event
        if nxt.state is PowerState.OFF and prev.state is not PowerState.OFF:
            assert isinstance(event, PowerObserved) and event.reading.power == "Off", (
                prev.state,
                event,
                result.reasons,
                facts.power,
            )
            assert merged.power == event.reading
        # never admission open without observed On and a passing ready probe
        if nxt.admission is AdmissionState.OPEN:
            assert merged.power is not None and merged.power.power == "On"
            assert merged.ready is not None and merged.ready.passed
            assert nxt.state in (PowerState.ON_IDLE, PowerState.ACTIVE)
            if prev.admission is not AdmissionState.OPEN:
                assert now - merged.power.observed_at <= pol.telemetry_max_age
                assert now - merged.ready.observed_at <= pol.telemetry_max_age
        # every non-terminal state has a deadline, in the future
        if nxt.state in NON_TERMINAL_STATES:
            assert nxt.transition is not None and nxt.deadline is not None
            assert nxt.deadline > now
            assert any(a.type == "ScheduleRecheck" for a in result.actions)
        # requests always belong to the transition in progress
        for a in result.actions:
            if a.type == "RequestPower":
                assert nxt.transition is not None and a.transition_id == nxt.transition.id
        # the record tells the same story and the state survives JSON
        assert result.record is not None
        assert result.record.decision is result.decision and result.record.policy == pol.version
        assert result.record.state_after is nxt.state
        assert NodePowerState.model_validate(nxt.model_dump(mode="json", by_alias=True)) == nxt
        VISITED[nxt.state.value] += 1
        TRANSITIONS.add((prev.state.value, nxt.state.value))
        for a in result.actions:
            SEEN_ACTIONS[a.type if a.type != "RequestPower" else f"RequestPower:{a.action}"] += 1
        self.state, self.facts = nxt, merged


def test_state_machine_invariants_hold_on_random_event_sequences() -> None:
    VISITED.clear()
    SEEN_ACTIONS.clear()
    TRANSITIONS.clear()
    run_state_machine_as_test(PowerMachine, settings=PROFILE)
    print("states reached:", dict(VISITED))
    print("actions seen:", dict(SEEN_ACTIONS))
    # the walk must actually explore the machine, or the invariants prove little
    if EXAMPLES >= 500:
        for state in PowerState:
            assert VISITED[state.value] > 0, f"never reached {state}: {dict(VISITED)}"
        for action in (
            "RequestPower:GracefulShutdown",
            "RequestPower:On",
            "OpenAdmission",
            "CancelPendingShutdown",
        ):
            assert SEEN_ACTIONS[action] > 0, f"never saw {action}: {dict(SEEN_ACTIONS)}"
        assert SEEN_ACTIONS["RequestPower:ForceOff"] > 0, dict(SEEN_ACTIONS)
    # every state change the walk produced is a row of docs/state-machine.md
    documented = documented_transitions()
    missing = {t for t in TRANSITIONS if t not in documented}
    assert not missing, f"transitions not in docs/state-machine.md: {sorted(missing)}"


def documented_transitions() -> set[tuple[str, str]]:
    """(from, to) pairs of the transition table in docs/state-machine.md."""
    doc = Path(__file__).resolve().parents[2] / "docs" / "state-machine.md"
    pairs: set[tuple[str, str]] = set()
    table = doc.read_text().split("## Transition table", 1)[1].split("\n## ", 1)[0]
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not cells[0].startswith("`"):
            continue
        froms = re.findall(r"`([A-Z_]+)`", cells[0])
        tos = re.findall(r"`([A-Z_]+)`", cells[2])
        pairs.update((f, t) for f in froms for t in tos)
    return pairs


# -- properties of the gate evaluation alone -------------------------------------------------------

ages = st.integers(min_value=-30, max_value=400)


@st.composite
def random_facts(draw: Any) -> tuple[NodeFacts, NodePowerState]:
    def seen(age: int) -> datetime:
        return NOW - timedelta(seconds=age)

    active = draw(st.sampled_from([0, 0, 2]))
    work_at = seen(draw(ages))
    facts = idle_facts(
        demand=draw(
            st.none()
            | st.builds(
                lambda q, a: DemandReading(source="q", observed_at=seen(a), queued=q),
                st.sampled_from([0, 0, 1]),
                ages,
            )
        ),
        work=WorkReading(
            source="p",
            observed_at=work_at,
            active_jobs=active,
            idle_since=None if active else work_at - timedelta(seconds=draw(st.integers(0, 7200))),
        ),
        power=PowerReading(
            source="r",
            observed_at=seen(draw(ages)),
            power=draw(st.sampled_from(["On", "On", "Off", "Unknown"])),
        ),
        inhibitors=InhibitorReading(
            source="l",
            observed_at=seen(draw(ages)),
            inhibitors=draw(st.sampled_from([(), (), (block_lock(),)])),
        ),
        intent=draw(
            st.sampled_from(
                [None, None, intent("Shutdown"), intent("Shutdown", override_inhibitors=True)]
            )
        ),
    )
    closed = draw(st.booleans())
    state = on_state(
        admission=AdmissionState.CLOSED if closed else AdmissionState.OPEN,
        admission_since=seen(draw(st.integers(0, 600))),
        last_transition_at=seen(draw(st.integers(0, 100000))),
        on_since=seen(draw(st.integers(0, 100000))),
    )
    return facts, state


@settings(max_examples=300, deadline=None)
@given(sample=random_facts(), pol=st.sampled_from(POLICIES))
def test_shutdown_decision_only_when_the_oracle_agrees(
    sample: tuple[NodeFacts, NodePowerState], pol: PolicyView
) -> None:
    facts, state = sample
    ev = evaluate_shutdown(facts, NOW, pol, state)
    assert ev == evaluate_shutdown(facts, NOW, pol, state)
    if ev.decision is Decision.SHUTDOWN:
        assert ev.action is not None
        assert not shutdown_oracle(facts, state, NOW, pol, ev.action)
    else:
        assert Decision.SHUTDOWN not in (ev.decision,) and ev.reasons
