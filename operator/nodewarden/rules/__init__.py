"""The shell's rules, pure, shared by the live operator and the simulator.

No I/O, no asyncio, no kube: each rule takes plain values (readings, specs, plans,
snapshots, times) and returns plain values, so `power/`, `dispatch/`, `pool/` and
`simulate/` call the same
code at the same places. Modules: `readings` (readings from plain values: the one
idle-since rule, a VM's destroy capability, its Off once unlisted), `demand` (queued
demand per node and when it is news), `fleet` (the fleet counts: disruption budget,
warm idle nodes), `vm` (a cloud VM's node-manager facts from a pool snapshot),
`nodeview` (the node view the scheduler sees, and the power board's admission,
readiness and wakeability checks), `effects` (what a step's actions mean: the typed
effects the power round and the simulator both carry out), `energy` (a node's meter:
BMC readings into energy, gaps never integrated), `savings` (the never-off
counterfactual, money saved, a policy's sums), `warm` (node classes, warm windows in
IANA time zones, the warm-capacity levers' targets, cloud VMs to create ahead of
demand), `forecast` (the forecast's histogram of arrivals and its warm nodes).

Imports only value modules: `api/`, `policy/`, `scheduling/`, `units` and `fleet.ports`
(never an adapter: readings converted from the adapters' fact types stay in
`power/readings.py`).
"""
