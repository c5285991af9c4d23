"""Sharding WorkerNodes across replicas (issue 24): the pure core, and its shell.

docs/sharding.md says what is built and what is designed only. The pure core (no I/O, no
asyncio, no kube; modules one concept each) and the shell after it. The cross-process
admission protocol sharding needs is `nodewarden.fleet.admission`, shared by dispatch and
power (which `shards` imports: never the other way).

- `keys`       where a node goes: the stable key of a WorkerNode, its shard by rendezvous
               (highest-random-weight) hashing, the label nodewarden writes on it and the
               name of each shard's Lease.
- `balance`    which shard Leases this replica should acquire or release, from the Leases
               as this replica observed them: at most ceil(shards / live replicas) each,
               the same answer on every replica that sees the same records.
- `resharding` a change of the shard count from n to m: which nodes move, and each move's
               fenced handover (the old owner stops and releases before the new owner
               is assigned), as steps whose preconditions a writer checks against the
               node's labels.
- `elector`    the shard Leases this replica holds: one `LeaderElector` + `Leadership`
               per shard, a membership Lease, `balance.decide` every round.
- `scope`      which nodes the power path acts on, and the fence of each request: its
               node's shard Leadership (`ShardedPowerControl`).
- `labeller`   the shard label of every unlabelled WorkerNode (conditional writes).
"""
