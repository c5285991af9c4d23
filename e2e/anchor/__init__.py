"""The anchor of issue 23: Karpenter's 1,000-pod scale-out on this project's local control plane.

`build.sh` builds (or finds cached) Karpenter's KWOK provider, KWOK and kube-scheduler from
the Go module proxy; `karpenter` starts them beside the control plane of
`e2e/localcluster.py` (plus node-lifecycle-controller), runs the scenario and measures it.
`benchmarks/bench_anchor.py` runs it and then `bench_dispatch.py` on the same control
plane and prints the ratios.
"""
