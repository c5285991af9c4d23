"""Sharding WorkerNodes across replicas (issue 24), the pure core: no I/O, no asyncio, no kube.

Nothing in the running operator calls this package yet (docs/sharding.md: what is built,
what is designed only). Modules, one concept each:

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

Imports only the standard library (a test walks the imports).
"""
