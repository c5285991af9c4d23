"""The chaos suite: the whole fleet (stub cloud, side nodes behind fake BMCs, two operator
replicas) under cloud, side-node and control-plane faults, checked by invariants.

schedule.py: the seeded fault schedule; fleet.py: the fleet and the driver that plays the
schedule; invariants.py: the checks over the evidence; test_chaos.py: the scenario.
`make chaos` runs the long version; tests/chaos runs the CI variant inside `make test`.
"""
