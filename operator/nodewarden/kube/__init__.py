"""Kubernetes adapter: typed API access, Secrets, Events and the leader Lease."""
