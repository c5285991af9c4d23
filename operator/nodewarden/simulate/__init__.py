"""nodewarden.simulate: replay a workload against PowerPolicies on a simulated clock.

The simulator drives the operator's own pure code (`scheduling.scheduler.plan`,
`scheduling.instancetypes`, the node-manager matrix, the power gates and state machine)
on a simulated fleet, with no sleeps, threads or I/O in its core, and compares policies
with baselines, peers (Arvados, Karpenter, cluster-autoscaler, SLURM), prophets and an
oracle lower bound. docs/simulation.md explains the formats, the
oracle and the table.

    trace       workload traces: CSV / JSONL format, parse and write
    generate    the seeded trace generator and its presets (bursty-week, ...)
    fleet       fleet files: instance types, billing, side nodes, delays
    presets     the built-in fleet
    policies    PowerPolicy files and the never-off / fixed-timeout baselines
    decide      THE seam: every node decision goes through decide_node()
    nodes       simulated nodes (machine path, dispatcher-path VMs)
    engine      the event loop: Simulation(trace, fleet, policy, seed).run()
    accounting  cost, node-hours, waits, cycles
    utilisation price-weighted utilisation (the share of the cost that paid for work)
    oracle      the oracle lower bound and a brute-force optimum for tiny traces
    peers       other schedulers' rules with their own placement, the prophet, sweeps
    report      compare() several policies; the table and the JSON document
    export      ContainerDispatch objects -> trace (pure)
    plot        --plot (matplotlib, lazy)
    cli         `nodewarden simulate`, `nodewarden trace generate|export` (the only I/O)
"""
