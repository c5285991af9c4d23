"""A fuzz harness built from the CRD schemas in `crds/`, so every field a model adds is fuzzed.

- `schema`: hypothesis strategies for the spec of each kind, read from its generated
  openAPIV3Schema: values the schema admits (boundary lengths and values, the maximum
  durations, odd Unicode where the schema allows any text) and, where asked, hostile
  leaves it does not (one past a bound, wrong types, overflowing durations, deep maps);
- `corpus`: a fixed corpus per kind (derandomized: the same for the same schemas) of
  hostile objects, most of them ones the API server accepts, for the tests that go
  through the real API server and a running operator.

Used by `tests/unit/test_fuzz_inprocess.py` (hypothesis, in process: models, validation,
the policy book, the power round and the resync, thousands of examples), by
`tests/cluster/test_hostile_objects.py` (CI: the corpus through the real API server and
two operator replicas) and by `make fuzz` (the longer real-API run, `e2e/crdfuzz/
test_fuzz_long.py`). Imported by name (`from crdfuzz import ...`; `e2e/` is on the test
path).
"""
