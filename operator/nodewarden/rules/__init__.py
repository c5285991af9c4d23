"""The shell's rules, pure, shared by the live operator and the simulator.

No I/O, no asyncio, no kube: each rule takes plain values (readings, specs, plans,
snapshots, times) and returns plain values, so `power/` and `simulate/` call the same
code at the same places. Modules: `readings` (adapter facts -> the core's readings, the
one idle-since rule), `demand` (queued demand per node and when it is news), `fleet`
(the fleet counts: disruption budget, warm idle nodes), `vm` (a cloud VM's
node-manager facts from a pool snapshot).

Imports only value modules: `api/`, `policy/`, `scheduling/`, `units`, the adapters'
fact types (`cloud.model`, `redfish.facts`, `ssh.facts`) and `fleet.ports`.
"""
