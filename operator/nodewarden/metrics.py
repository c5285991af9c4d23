"""Prometheus metrics exported by the operator on /metrics (names listed in the README).

All metrics live in one registry owned by this module so tests can read them and a
second operator instance in the same process (tests) does not collide.
"""

from __future__ import annotations

from typing import Literal, get_args

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info

from nodewarden import __version__
from nodewarden.api.powerpolicy import ResetAction
from nodewarden.scraped import Sourced

REGISTRY = CollectorRegistry(auto_describe=True)

BUILD_INFO = Info("nodewarden_build", "Version of the running operator.", registry=REGISTRY)
BUILD_INFO.info({"version": __version__})

LEADER = Gauge(
    "nodewarden_leader",
    "1 if this replica holds the dispatcher's lease and acts, 0 if it stands by.",
    ["dispatcher_id"],
    registry=REGISTRY,
)

SHARDS_HELD = Gauge(
    "nodewarden_shards_held",
    "Shard Leases this replica holds (sharding on; docs/sharding.md).",
    ["dispatcher_id"],
    registry=REGISTRY,
)

SHARD_HANDOVERS = Counter(
    "nodewarden_shard_handovers_total",
    "Shard Leases taken or given up by this replica, by reason: acquired, rebalanced "
    "(released for the balance), stopping (released on a clean stop), retired (its shard "
    "is at or above a lowered shard count), lost (not renewed in time, another holder, a "
    "stall).",
    ["dispatcher_id", "reason"],
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

CREATE_REFUSALS = Counter(
    "nodewarden_create_refusals",
    "Instance creates refused by a hard cap, by cap (max_nodes, max_hourly_spend, per_type, "
    "creates_stopped, cloud_backoff); planned creates rarely (the plan respects the caps).",
    ["cap"],
    registry=REGISTRY,
)

CREATES_STOPPED = Gauge(
    "nodewarden_creates_stopped",
    "1 while no instance is created at all because the default PowerPolicy is missing or "
    "invalid (it never means unlimited), else 0.",
    registry=REGISTRY,
)

HELD_NODES = Gauge(
    "nodewarden_held_workernodes",
    "Declared CloudVM WorkerNodes waiting for an instance because a cap (or stopped "
    "creates) refuses it; their Launched condition names the cap.",
    registry=REGISTRY,
)

HTTP_CONNECTIONS = Gauge(
    "nodewarden_http_connections",
    "Open connections per listener (api, metrics, probes, ops, all); at most "
    "http.max_connections each.",
    ["listener"],
    registry=REGISTRY,
)

HTTP_CONNECTIONS_DROPPED = Counter(
    "nodewarden_http_connections_dropped",
    "Connections a listener dropped, by listener and why: header_deadline, "
    "request_deadline, header_size, evicted (the oldest stalled one, for a new one), cap.",
    ["listener", "reason"],
    registry=REGISTRY,
)

INVALID_OBJECTS = Gauge(
    "nodewarden_invalid_objects",
    "Objects whose Valid condition is False, by kind.",
    ["kind"],
    registry=REGISTRY,
)

BMC_CLAIMED_TWICE = Gauge(
    "nodewarden_bmc_claimed_twice",
    "WorkerNodes refused their BMC because another WorkerNode holds it (one machine, one "
    "BMC; docs/security.md).",
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

DISPATCH_PLANS = Counter(
    "nodewarden_dispatch_plans_total",
    "Plans the dispatcher made, by trigger (first, change, outstanding, due, backstop); "
    "a tick with none of these plans nothing (dispatch/replan.py).",
    ["trigger"],
    registry=REGISTRY,
)

OVERCOMMITTED_NODES = Gauge(
    "nodewarden_overcommitted_nodes",
    "WorkerNodes found running more than their capacity holds (from their Running "
    "containers and listed runners); each has the condition Overcommitted and takes no new "
    "work until it fits.",
    registry=REGISTRY,
)


def sourced(
    name: str, documentation: str, kind: Literal["gauge", "counter"], labels: list[str]
) -> Sourced:
    metric = Sourced(name, documentation, kind, labels)
    REGISTRY.register(metric)
    return metric


HOURLY_SPEND = sourced(
    "nodewarden_cloud_spend_per_hour",
    "Summed hourly price of the cloud instances that exist now (created and listed, booting "
    "and shutting down included), in the label's currency (cloud.currency) per hour; read "
    "from the worker pool at each scrape.",
    "gauge",
    ["currency"],
)

NODE_POWER = sourced(
    "nodewarden_node_power_watts",
    "A side node's draw at its last BMC power reading (W), by node, policy and power (On, "
    "Off). No series for a node without a reading (cloud VMs, BMCs without a power "
    "resource).",
    "gauge",
    ["node", "policy", "power"],
)

NODE_ENERGY = sourced(
    "nodewarden_node_energy_joules",
    "Energy a side node used since its figures began (status.energy.since), from its BMC "
    "readings (docs/energy.md), by node and policy. Kept in status: it continues across "
    "restarts and failovers.",
    "counter",
    ["node", "policy"],
)

ENERGY_SAVED = sourced(
    "nodewarden_energy_saved_joules",
    "Energy saved against never switching side nodes off: time off x (idle - off draw) - "
    "the cycles' energy above idle, summed per policy and basis (Measured: both draws "
    "measured; Configured: a class's configured draw used). May go down (a cycle's energy "
    "counts when it happens; a node deleted takes its share).",
    "gauge",
    ["policy", "basis"],
)

MONEY_SAVED = sourced(
    "nodewarden_money_saved",
    "Money saved against never-off, per policy and source (energy: side nodes' kWh saved x "
    "the class's price; vm_hours: cloud VM hours avoided x the catalogue price), in the "
    "label's currency.",
    "gauge",
    ["policy", "source", "currency"],
)

VM_AVOIDED = sourced(
    "nodewarden_vm_avoided_seconds",
    "Cloud VM time (seconds; VM hours avoided x 3600) a never-off fleet (one that keeps "
    "every VM it created) would have run beyond this one's, per policy (docs/energy.md).",
    "gauge",
    ["policy"],
)

ENERGY_READS = Counter(
    "nodewarden_energy_reads_total",
    "BMC power readings (one Redfish GET each), by outcome: ok, null (the BMC gave no "
    "value), failed, none (the BMC serves no power reading).",
    ["outcome"],
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
KUBE_THROTTLED = Counter(
    "nodewarden_kube_throttled_total",
    "API requests the API server refused with 429 Too Many Requests and nodewarden retried "
    "after its Retry-After (kube_api.retries_on_429).",
    registry=REGISTRY,
)

EVENTS_DROPPED = Counter(
    "nodewarden_events_dropped_total",
    "Kubernetes Events not posted, by why: queue_full (the bounded queue the background "
    "sender drains was full) or rate_limited (too many for one object).",
    ["why"],
    registry=REGISTRY,
)

LOOP_LAG = Gauge(
    "nodewarden_event_loop_lag_seconds",
    "How late the operator's event loop ran a 1-second timer, last sample.",
    registry=REGISTRY,
)

FENCED = Counter(
    "nodewarden_fenced_actions_total",
    "Actions not sent because this replica's leadership was not valid, or refused by a "
    "target that has seen a newer fencing token, by port (runner, cloud, power, kube).",
    ["port"],
    registry=REGISTRY,
)

UNOWNED_RUNNERS = Gauge(
    "nodewarden_unowned_runners",
    "Runners on this dispatcher's nodes that name no owner (an older operator or runner "
    "program started them): never killed, only reported (WorkerNode RunnersOwned).",
    registry=REGISTRY,
)

# --- the informer feed (nodewarden.kube.informer): one list+watch per hot kind ---------------

INFORMER_EVENTS = Counter(
    "nodewarden_informer_events_total",
    "Watch events received by the informer, by kind and type "
    "(ADDED, MODIFIED, DELETED, BOOKMARK, ERROR).",
    ["kind", "type"],
    registry=REGISTRY,
)

INFORMER_RELISTS = Counter(
    "nodewarden_informer_relists_total",
    "Full LISTs by kind and cause (initial; expired: the watch's resourceVersion was "
    "410 Gone; continue_expired: a page's continue token expired mid-list).",
    ["kind", "cause"],
    registry=REGISTRY,
)

INFORMER_LIST_PAGES = Counter(
    "nodewarden_informer_list_pages_total",
    "LIST pages (requests with limit/continue) read by the informer, by kind.",
    ["kind"],
    registry=REGISTRY,
)

INFORMER_WATCH_RESTARTS = Counter(
    "nodewarden_informer_watch_restarts_total",
    "Watches that ended and were started again, by kind and cause (closed: the server's "
    "timeout ended it; read_timeout: the stream was silent too long; error; expired).",
    ["kind", "cause"],
    registry=REGISTRY,
)

INFORMER_ERRORS = Counter(
    "nodewarden_informer_errors_total",
    "Failed informer requests by kind, operation (list, watch) and class "
    "(http_<status>, timeout, connection, protocol, internal); each one backs off.",
    ["kind", "operation", "class"],
    registry=REGISTRY,
)

INFORMER_STORE_OBJECTS = Gauge(
    "nodewarden_informer_store_objects",
    "Objects held in the informer's store, by kind.",
    ["kind"],
    registry=REGISTRY,
)

INFORMER_LAG = Histogram(
    "nodewarden_informer_lag_seconds",
    "Time from an object's last write (newest metadata.managedFields time, whole seconds) "
    "to the informer seeing the ADDED/MODIFIED event; resolution 1 s, includes clock skew.",
    ["kind"],
    registry=REGISTRY,
    buckets=(1, 2, 3, 5, 10, 30, 60, 300),
)

INFORMER_HANDLER_ERRORS = Counter(
    "nodewarden_informer_handler_errors_total",
    "Exceptions raised by informer handlers or transforms (logged, never stop the feed), "
    "by kind and stage (handler, transform).",
    ["kind", "stage"],
    registry=REGISTRY,
)

STATUS_WRITES = Counter(
    "nodewarden_status_writes_total",
    "Status writes (merge patches of the status subresource) by kind.",
    ["kind"],
    registry=REGISTRY,
)

POWER_TRANSITIONS = Gauge(
    "nodewarden_power_transitions",
    "Power transitions in flight by kind (Shutdown, Wake, Verify) and machine state.",
    ["kind", "state"],
    registry=REGISTRY,
)

POWER_REQUESTS = Counter(
    "nodewarden_power_requests_total",
    "Power requests sent (Redfish reset, Wake-on-LAN packet, SSH poweroff, cloud destroy = "
    "GracefulShutdown) by action, result (accepted, rejected, errored) and resend (true for "
    "a transition's second and later attempts).",
    ["action", "result", "resend"],
    registry=REGISTRY,
)

POWER_CONFIRM_SECONDS = Histogram(
    "nodewarden_power_confirm_seconds",
    "From the first power request of a transition to the trusted source confirming its "
    "effect (kind Shutdown: observed Off; Wake: observed On).",
    ["kind"],
    registry=REGISTRY,
    buckets=(1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1200),
)

POWER_READY_SECONDS = Histogram(
    "nodewarden_power_ready_seconds",
    "From the first wake request of a transition to the node's ready probe passing (the "
    "moment admission may open), by the wake action (On, WakeOnLan).",
    ["action"],
    registry=REGISTRY,
    buckets=(5, 10, 20, 30, 60, 120, 180, 300, 600, 1200, 1800, 3600),
)

BMC_ERROR_CLASSES = (
    "auth",
    "tls",
    "timeout",
    "connection",
    "protocol",
    "rejected",
    "http",
    "discovery",
    "other",
)

BMC_ERRORS = Counter(
    "nodewarden_bmc_errors_total",
    "Errors talking to BMCs (Redfish) by class: auth (401/403), tls (certificate not "
    "accepted), timeout, connection (refused, reset, unreachable), protocol (not Redfish), "
    "rejected (the BMC refused the request: 409, reset type not supported), "
    "http (any other HTTP error: 5xx, 429, 404), discovery (no unique ComputerSystem), other.",
    ["class"],
    registry=REGISTRY,
)

POWER_STALE_NODES = Gauge(
    "nodewarden_power_stale_telemetry_nodes",
    "Nodes whose latest power decision is held back by stale or missing telemetry.",
    registry=REGISTRY,
)

POWER_UNRECORDED_TRANSITIONS = Gauge(
    "nodewarden_power_unrecorded_transitions",
    "Open power transitions whose PowerIntent has no Safety Record yet (should be 0).",
    registry=REGISTRY,
)

KUBE_CONFLICTS = Counter(
    "nodewarden_kube_conflicts_total",
    "Expected write conflicts (HTTP 409: the object changed since it was read; the write is "
    "skipped and the next round works from the newer object), by kind and verb.",
    ["kind", "verb"],
    registry=REGISTRY,
)

POWER_TRANSITION_STATE_SINCE = Gauge(
    "nodewarden_power_transition_state_since_seconds",
    "Per transition kind and machine state with a transition in flight: when (Unix time) "
    "the node that has been in that state longest entered it, that node in label node. "
    "No series when none is in flight; alert on time() - value.",
    ["kind", "state", "node"],
    registry=REGISTRY,
)

POWER_TRANSITION_DEADLINE = Gauge(
    "nodewarden_power_transition_deadline_seconds",
    "Per transition kind and machine state with a transition in flight: the earliest "
    "deadline (Unix time), its node in label node. The controller acts at a deadline "
    "(re-send, abort or BLOCK), so a deadline long past means it is not acting.",
    ["kind", "state", "node"],
    registry=REGISTRY,
)

POWER_BLOCKED_NODES = Gauge(
    "nodewarden_power_blocked_nodes",
    "Nodes whose latest power decision is BLOCK (a person or a policy change must act), "
    "by machine state (BLOCKED: a transition ended blocked; other states: a gate blocks "
    "the wanted transition) and first reason code.",
    ["state", "reason"],
    registry=REGISTRY,
)

POWER_STALE_SINCE = Gauge(
    "nodewarden_power_stale_telemetry_since_seconds",
    "Since when (Unix time) the node held back longest by stale or missing telemetry has "
    "been held back, that node in label node. No series when none is; alert on "
    "time() - value.",
    ["node"],
    registry=REGISTRY,
)


def _zero_children() -> None:
    """Create the power metrics' children for every known label value, at 0, so that
    rate() and increase() count the first event and dashboards show 0, not "no data"."""
    for kind in ("Shutdown", "Wake"):
        POWER_CONFIRM_SECONDS.labels(kind)
    for action in ("On", "WakeOnLan"):
        POWER_READY_SECONDS.labels(action)
    for cls in BMC_ERROR_CLASSES:
        BMC_ERRORS.labels(cls)
    for outcome in ("ok", "null", "failed", "none"):
        ENERGY_READS.labels(outcome)
    for action in get_args(ResetAction):
        for result in ("accepted", "rejected", "errored"):
            for resend in ("false", "true"):
                POWER_REQUESTS.labels(action, result, resend)


_zero_children()

# -- warm capacity (rules.warm, rules.forecast; issue 25 items 5 and 6) ----------------------

WARM_TARGET = Gauge(
    "nodewarden_warm_target_nodes",
    "Warm nodes the warm-capacity levers want of a node class now, by policy, class and "
    "mode (On: enforced; Shadow: what a lever in Shadow would want).",
    ["policy", "node_class", "mode"],
    registry=REGISTRY,
)

FORECAST_DAYS = Gauge(
    "nodewarden_forecast_days_observed",
    "Days of arrivals the forecast of a PowerPolicy has watched (it forecasts from minDays).",
    ["policy"],
    registry=REGISTRY,
)

WARM_CREATES = Counter(
    "nodewarden_warm_creates_total",
    "Cloud instances the dispatcher asked to create for warm capacity (ahead of demand), by "
    "policy, node class and lever mode (Shadow: would have created, nothing done).",
    ["policy", "node_class", "mode"],
    registry=REGISTRY,
)
