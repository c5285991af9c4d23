"""`shards.keys`: the shard of a key is stable and total, the load is even, a change of
the shard count moves only the nodes it must (new shards gain, removed shards lose,
never a move between two shards that exist before and after), the label round-trips,
and the package imports nothing but the standard library."""

from __future__ import annotations

import ast
import sys
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nodewarden.shards.keys import (
    MAX_SHARDS,
    label_value,
    lease_name,
    node_key,
    parse_shard,
    score,
    shard_of,
)

KEYS = [node_key("fleet", f"node-{i:05d}") for i in range(6000)]
SHARDS = Path(__file__).resolve().parents[2] / "operator" / "nodewarden" / "shards"


def test_known_answers_pin_the_hash() -> None:
    """The mapping is part of the wire contract (labels written by one version are read by
    the next): a change of hash, personalisation or input encoding must fail here."""
    assert [shard_of(node_key("fleet", f"node-{i}"), 4) for i in range(8)] == KNOWN
    assert score("fleet/node-0", 0) == KNOWN_SCORE


KNOWN = [1, 2, 0, 3, 3, 2, 1, 0]
KNOWN_SCORE = 6978565814191773770


def test_load_is_even() -> None:
    for shards in (2, 3, 4, 8, 16):
        counts = Counter(shard_of(k, shards) for k in KEYS)
        mean = len(KEYS) / shards
        assert set(counts) == set(range(shards))
        assert max(counts.values()) <= mean * 1.15, (shards, counts)
        assert min(counts.values()) >= mean * 0.85, (shards, counts)


@pytest.mark.parametrize(("old", "new"), [(2, 3), (3, 4), (4, 8), (8, 7), (4, 2), (1, 5)])
def test_a_count_change_moves_about_the_minimum(old: int, new: int) -> None:
    moved = sum(1 for k in KEYS if shard_of(k, old) != shard_of(k, new))
    must = abs(new - old) / max(old, new)  # the fraction on shards that appear or vanish
    assert abs(moved / len(KEYS) - must) <= 0.03, (old, new, moved)


@settings(max_examples=200, deadline=None)
@given(
    keys=st.lists(st.text(min_size=1, max_size=30), min_size=1, max_size=40),
    old=st.integers(1, 24),
    new=st.integers(1, 24),
)
def test_no_node_moves_between_two_shards_that_stay(keys: list[str], old: int, new: int) -> None:
    for key in keys:
        source, target = shard_of(key, old), shard_of(key, new)
        assert 0 <= source < old and 0 <= target < new
        if source != target:
            # growing: only to a new shard; shrinking: only from a removed one
            assert target >= old or source >= new, (key, old, new, source, target)


@given(key=st.text(min_size=1, max_size=40), shards=st.integers(1, 32))
def test_same_answer_every_time(key: str, shards: int) -> None:
    assert shard_of(key, shards) == shard_of(key, shards)


def test_counts_out_of_range_are_refused() -> None:
    with pytest.raises(ValueError):
        shard_of("a/b", 0)
    with pytest.raises(ValueError):
        shard_of("a/b", MAX_SHARDS + 1)
    with pytest.raises(ValueError):
        node_key("fleet", "")


@given(shard=st.integers(0, MAX_SHARDS - 1))
def test_label_round_trips(shard: int) -> None:
    assert parse_shard(label_value(shard)) == shard


@pytest.mark.parametrize("value", [None, "", "-1", "07", "x", "1.0", "٣", str(MAX_SHARDS)])
def test_malformed_labels_name_no_shard(value: str | None) -> None:
    assert parse_shard(value) is None


def test_lease_names() -> None:
    assert lease_name("nw", 3) == "nw-shard-3"


def test_the_package_imports_only_the_standard_library() -> None:
    shell = {"elector.py", "scope.py", "labeller.py", "resharder.py", "release.py"}  # kube, fence
    modules = sorted(p for p in SHARDS.glob("*.py") if p.name not in shell)
    assert len(modules) >= 4
    foreign = {}
    for path in modules:
        for node in ast.walk(ast.parse(path.read_text())):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                if top in sys.stdlib_module_names or name.startswith("nodewarden.shards"):
                    continue
                foreign.setdefault(path.name, []).append(name)
    assert foreign == {}
