"""The worker pool (Arvados `worker/`): cloud instances and side nodes <-> WorkerNodes.

- `workers`     `WorkerPool`, the entry, composing the collaborators below
- `worker`      the `Worker` record and its state table
- `context`     what the collaborators share (adapters, settings, workers, tasks)
- `probes`      SSH targets, the probe loop, what a probe changes
- `admissions`  the create choke point (`admit`) and held declared nodes
- `nodes`       WorkerNode objects: folding, writing, the pool's status fields
- `lifecycle`   create and destroy instances, forget vanished ones
- `cloudsync`   the cloud list: adopt, take over, drop
- `times`       ISO-8601 text of timestamps
- `identity`  per-instance secrets derived from the operator's SSH key
"""
