"""Prometheus metrics exported by the operator on /metrics (names listed in the README).

All metrics live in one registry owned by this module so tests can read them and a
second operator instance in the same process (tests) does not collide.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info

from nodewarden import __version__

REGISTRY = CollectorRegistry(auto_describe=True)

BUILD_INFO = Info("nodewarden_build", "Version of the running operator.", registry=REGISTRY)
BUILD_INFO.info({"version": __version__})

LEADER = Gauge(
    "nodewarden_leader",
    "1 if this replica holds the dispatcher's lease and acts, 0 if it stands by.",
    ["dispatcher_id"],
    registry=REGISTRY,
)

RECONCILE_TOTAL = Counter(
    "nodewarden_reconcile_total",
    "Reconciles of nodewarden objects by kind and result (ok, invalid, error).",
    ["kind", "result"],
    registry=REGISTRY,
)

RECONCILE_SECONDS = Histogram(
    "nodewarden_reconcile_seconds",
    "Time spent in one reconcile of one object.",
    ["kind"],
    registry=REGISTRY,
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)

INVALID_OBJECTS = Gauge(
    "nodewarden_invalid_objects",
    "Objects whose Valid condition is False, by kind.",
    ["kind"],
    registry=REGISTRY,
)

POWER_DECISIONS = Counter(
    "nodewarden_power_decisions_total",
    "Power decisions by decision (SHUTDOWN, START, DRAIN, DEFER, BLOCK, NONE) and first reason.",
    ["decision", "reason"],
    registry=REGISTRY,
)

NODES = Gauge(
    "nodewarden_nodes",
    "WorkerNodes by state (Booting, Idle, Active, Draining, ShuttingDown, Off, ...) and node type.",
    ["state", "node_type"],
    registry=REGISTRY,
)

CONTAINERS = Gauge(
    "nodewarden_containers",
    "ContainerDispatches by phase.",
    ["phase"],
    registry=REGISTRY,
)

HOURLY_SPEND = Gauge(
    "nodewarden_cloud_spend_per_hour",
    "Summed hourly price of the cloud nodes that exist now, in the catalogue's billing "
    "currency per hour.",
    registry=REGISTRY,
)

CONTAINERS_STARTED = Counter(
    "nodewarden_containers_started_total",
    "Runner starts (attempts), by instance type.",
    ["instance_type"],
    registry=REGISTRY,
)

CONTAINERS_FINISHED = Counter(
    "nodewarden_containers_finished_total",
    "Containers that reached a final phase, by phase (Complete, Cancelled, Failed).",
    ["phase"],
    registry=REGISTRY,
)

CLOUD_OPERATIONS = Counter(
    "nodewarden_cloud_operations_total",
    "Cloud API calls by operation (list, create, destroy, tags) and outcome (ok, error).",
    ["operation", "outcome"],
    registry=REGISTRY,
)

CLOUD_ERRORS = Counter(
    "nodewarden_cloud_errors_total",
    "Classified cloud API errors (quota, capacity, rate_limit, transient, permanent).",
    ["class"],
    registry=REGISTRY,
)

PROBE_SECONDS = Histogram(
    "nodewarden_probe_seconds",
    "Duration of one SSH probe of one node, by outcome.",
    ["outcome"],
    registry=REGISTRY,
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)

KUBE_REQUESTS = Counter(
    "nodewarden_kube_requests_total",
    "Kubernetes API requests made by nodewarden's own code (not kopf's watches), by verb.",
    ["verb"],
    registry=REGISTRY,
)

LOOP_LAG = Gauge(
    "nodewarden_event_loop_lag_seconds",
    "How late the operator's event loop ran a 1-second timer, last sample.",
    registry=REGISTRY,
)
