"""State BLOCKED: stays until a person acts or the evidence clears it (observed Off,
a fresh verification, a forced cloud-VM shutdown).
"""

from __future__ import annotations

from nodewarden.policy.events import (
    AdmissionClosed,
    ManualOverride,
    PolicyChanged,
)
from nodewarden.policy.reasons import Decision, R
from nodewarden.policy.state import (
    AdmissionState,
    TransitionKind,
)
from nodewarden.policy.states.context import StepContext, observed_off
from nodewarden.policy.states.moves import enter_off, enter_verify, refused, vm_forced_shutdown


def handle_blocked(c: StepContext) -> None:
    ev = c.event
    if observed_off(c, None) and c.state.blocked_transition is not TransitionKind.WAKE:
        # a shutdown confirmed late is recorded; a wake that failed stays BLOCKED while
        # the node stays Off (waking it again needs a person or a policy change)
        enter_off(c)
        return
    if vm_forced_shutdown(c):
        return
    if isinstance(ev, (ManualOverride, PolicyChanged)):
        enter_verify(c, Decision.DEFER)
        return
    if R.CREDENTIALS_REFUSED in c.state.blocked_reasons and not refused(c):
        enter_verify(c, Decision.DEFER)  # an administrator fixed the credentials
        return
    if isinstance(ev, AdmissionClosed):
        c.set(admission=AdmissionState.CLOSED, admission_since=min(ev.at, c.now))
    c.decide(Decision.BLOCK, *c.state.blocked_reasons)
