"""The in-memory fleet state every controller shares (Karpenter's `state/`).

- `board`     the power board: each node's power phase as the power controller last
              decided it, read by the dispatcher before it places work
- `policies`  the PowerPolicy book (default policy, built-in fallback)
- `status`    the WorkerNode status writer, flushed by whoever contributes a field
- `admission` admission across processes (sharding, docs/sharding.md section 2): a
              start and a shutdown ordered by the API server, the protocol both follow

Neither `dispatch/` nor `power/` owns these: both read and write them, and the
composition root (`nodewarden.compose`) builds one of each per namespace.
"""
