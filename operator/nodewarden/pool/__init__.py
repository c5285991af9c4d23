"""The worker pool (Arvados `worker/`): cloud instances and side nodes <-> WorkerNodes.

- `workers`   Worker and its state table, cloud sync/adopt/takeover, probes,
              create/destroy
- `identity`  per-instance secrets derived from the operator's SSH key
"""
