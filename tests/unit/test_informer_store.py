"""The informer store's rules: resourceVersion ordering, fold horizon, relist diff, quiet no-ops."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from nodewarden.kube.store import Delta, Entry, ObjectKey, Store, parse_resource_version

A = ObjectKey("ns", "a")
B = ObjectKey("ns", "b")
C = ObjectKey("ns", "c")


@dataclass(frozen=True)
class M:
    step: int


def test_updates_apply_in_resource_version_order_and_stale_ones_change_nothing() -> None:
    store: Store[M] = Store()
    assert store.upsert(A, 10, M(1)) == Delta("ADDED", A, None, M(1))
    assert store.upsert(A, 12, M(2)) == Delta("MODIFIED", A, M(1), M(2))
    assert store.upsert(A, 11, M(9)) is None  # older than held
    assert store.upsert(A, 12, M(9)) is None  # the same version again
    assert store.get("ns", "a") == M(2)
    assert store.resource_version("ns", "a") == "12"


def test_a_newer_version_with_an_unchanged_model_moves_the_version_silently() -> None:
    store: Store[M] = Store()
    store.upsert(A, 10, M(1))
    assert store.upsert(A, 15, M(1)) is None
    assert store.resource_version("ns", "a") == "15"


def test_delete_removes_unless_the_held_object_is_newer() -> None:
    store: Store[M] = Store()
    store.upsert(A, 20, M(1))
    assert store.delete(A, 19) is None  # a recreated object was folded in first
    assert "a" in {k.name for k in store}
    assert store.delete(A, 21) == Delta("DELETED", A, M(1), None)
    assert store.delete(A, 22) is None and len(store) == 0


def test_fold_never_resurrects_what_the_stream_has_already_passed() -> None:
    store: Store[M] = Store()
    # not held, at or below the horizon: deleted since (or dropped) -> ignored
    assert store.fold(A, 30, M(1), horizon=30) is None
    # not held, newer than the horizon: a create the watch has not delivered yet
    assert store.fold(A, 31, M(1), horizon=30) == Delta("ADDED", A, None, M(1))
    # held: plain ordering; a fold that the transform drops deletes
    assert store.fold(A, 31, M(2), horizon=40) is None
    assert store.fold(A, 41, None, horizon=40) == Delta("DELETED", A, M(1), None)
    # before the first list there is no horizon
    assert store.fold(B, 5, M(1), horizon=None) == Delta("ADDED", B, None, M(1))


def test_replace_diffs_against_the_snapshot_and_keeps_newer_folds() -> None:
    store: Store[M] = Store()
    store.upsert(A, 10, M(1))  # will vanish
    store.upsert(B, 11, M(1))  # will change
    store.upsert(C, 12, M(1))  # unchanged
    store.upsert(ObjectKey("ns", "folded"), 60, M(1))  # written after the snapshot
    snapshot = {
        B: Entry(40, M(2)),
        C: Entry(12, M(1)),
        ObjectKey("ns", "new"): Entry(45, M(1)),
    }
    deltas = store.replace(snapshot, list_rv=50)
    assert deltas == [
        Delta("DELETED", A, M(1), None),
        Delta("MODIFIED", B, M(1), M(2)),
        Delta("ADDED", ObjectKey("ns", "new"), None, M(1)),
    ]
    assert {k.name for k in store} == {"b", "c", "new", "folded"}


def test_items_is_a_snapshot_safe_across_changes() -> None:
    store: Store[M] = Store()
    store.upsert(A, 1, M(1))
    store.upsert(B, 2, M(2))
    seen = []
    for key, model in store.items():
        store.delete(key, 100)
        seen.append((key.name, model.step))
    assert seen == [("a", 1), ("b", 2)] and len(store) == 0


@pytest.mark.parametrize("bad", ["", "12a", None, 12, "-3"])
def test_a_resource_version_that_is_not_a_decimal_integer_is_a_clear_error(bad: object) -> None:
    with pytest.raises(ValueError, match=r"metadata\.resourceVersion"):
        parse_resource_version(bad)
    assert parse_resource_version("0042") == 42
