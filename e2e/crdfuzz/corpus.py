"""A fixed corpus of hostile objects per kind, drawn from the CRD schemas (`schema`).

Derandomized: the same schemas give the same corpus, run after run; a field added to a
model changes it (and is covered). Most objects are ones the API server accepts -- the
longest strings, the largest values, the maximum durations, full maps, odd Unicode --
because those are what reach the operator; a share carries one value outside the schema
(the API server refuses those at admission, which is counted, never an error).

`ISSUE_POLICIES` are the two PowerPolicies of the issue whose durations the schema of
that release let through (before digits were bounded): the cluster test stores them as
an older release would have, by relaxing the CRD while it creates them.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from crdfuzz.schema import body, spec_strategy

KINDS = ("PowerPolicy", "PowerIntent", "WorkerNode", "ContainerDispatch")
PREFIX = {
    "PowerPolicy": "fz-pp",
    "PowerIntent": "fz-pi",
    "WorkerNode": "fz-wn",
    "ContainerDispatch": "fz-cd",
}

ISSUE_POLICIES = {
    "issue-cooldown": {"cooldown": "99999999999h"},
    "issue-idle": {"idleThreshold": "100000000h"},
}


def specs(kind: str, count: int, rejected_share: float = 0.2) -> list[Any]:
    """`count` specs of `kind`: about `rejected_share` with a value outside the schema."""
    hostile = max(1, round(count * rejected_share))
    out: list[Any] = []
    for n, outside in ((count - hostile, False), (hostile, True)):
        drawn: list[Any] = []
        strategy = spec_strategy(kind, hostile=outside)

        @settings(
            max_examples=n,
            derandomize=True,
            database=None,
            phases=[Phase.generate],
            suppress_health_check=list(HealthCheck),
            deadline=None,
        )
        @given(st.data())
        def collect(data: st.DataObject) -> None:
            drawn.append(data.draw(strategy))  # noqa: B023 - run at once, in this iteration

        collect()
        out += drawn[:n]
    return out


def corpus(kind: str, namespace: str, count: int = 50) -> list[dict[str, Any]]:
    """The corpus of `kind` as objects named `<prefix>-<i>` in `namespace`."""
    return [
        body(kind, f"{PREFIX[kind]}-{i:03d}", spec, namespace)
        for i, spec in enumerate(specs(kind, count))
    ]
