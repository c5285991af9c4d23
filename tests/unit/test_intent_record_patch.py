"""A later Safety Record replaces the one in a PowerIntent's status exactly: the merge
patch the controller sends nulls every key the new record lacks (RFC 7386 would keep it)."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from nodewarden.power.intents import replacing

_leaf = st.one_of(st.integers(), st.text(max_size=4), st.booleans(), st.lists(st.integers()))
_doc = st.recursive(
    st.dictionaries(st.sampled_from("abcde"), _leaf, max_size=4),
    lambda inner: st.dictionaries(st.sampled_from("abcde"), st.one_of(_leaf, inner), max_size=4),
    max_leaves=12,
)


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386, as the API server applies application/merge-patch+json."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


@settings(max_examples=300, deadline=None)
@given(_doc, _doc)
def test_the_patch_turns_the_old_record_into_the_new_one(old: Any, new: Any) -> None:
    assert merge_patch(old, replacing(old, new)) == new


def test_a_plain_merge_would_keep_stale_evidence() -> None:
    old = {"gates": [1], "intent": {"name": "x"}, "request": {"attempt": 1, "detail": "d"}}
    new = {"gates": [], "request": {"attempt": 2}}
    assert merge_patch(old, new) != new  # why `replacing` exists
    assert merge_patch(old, replacing(old, new)) == new
