"""Shared plumbing of the pure power core: the frozen model base and clock checks.

Every value the core takes or returns is immutable (`CoreModel` is a frozen pydantic
model with camelCase aliases, unknown fields rejected), so a step can never mutate the
facts or state it was given, and results serialise to the same JSON shape the
Kubernetes objects use.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from enum import Enum
from typing import Any, TypeVar, cast

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel

CLOCK_SKEW_TOLERANCE = timedelta(seconds=5)
"""A reading stamped later than `now` by more than this is TELEMETRY_FROM_FUTURE."""


class CoreModel(BaseModel):
    """Base of the core's models: frozen, camelCase on the wire, unknown fields rejected."""

    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        alias_generator=to_camel,
        populate_by_name=True,
        validate_default=False,
    )


def require_aware(now: datetime, what: str = "now") -> datetime:
    """Return `now` unchanged; raise ValueError if it is naive (no timezone)."""
    if now.tzinfo is not UTC and now.utcoffset() is None:  # UTC, the usual case, first
        raise ValueError(f"{what} must be timezone-aware (UTC), got naive {now.isoformat()}")
    return now


_M = TypeVar("_M", bound=BaseModel)


class AllFields(frozenset[str]):
    """The fields-set of the models `trusted` builds: every field name of the class,
    immutable and shared by all of them. Pydantic's `model_copy(update=...)` copies the
    fields-set and adds the updated names to the copy; the names are in it already, so
    copying returns this set and `update` checks that and changes nothing."""

    __slots__ = ()

    def __copy__(self) -> AllFields:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> AllFields:
        return self

    def update(self, *others: Iterable[str]) -> None:
        for names in others:
            unknown = set(names) - self
            if unknown:
                raise ValueError(f"not fields of the model: {sorted(unknown)}")


_FIELD_NAMES: dict[type[BaseModel], tuple[AllFields, int]] = {}
"""Per model class: its field names and how many there are."""
# The four instance slots every pydantic model has, set through their descriptors (what
# `object.__setattr__` does, minus the attribute lookup on each call).
_new_instance = object.__new__
_set_dict = BaseModel.__dict__["__dict__"].__set__
_set_fields_set = BaseModel.__dict__["__pydantic_fields_set__"].__set__
_set_extra = BaseModel.__dict__["__pydantic_extra__"].__set__
_set_private = BaseModel.__dict__["__pydantic_private__"].__set__


def trusted(cls: type[_M], values: dict[str, Any]) -> _M:
    """Build the frozen model `cls` from values that are already valid, without
    re-validating them.

    Only for the hot path where every value was produced by validated core models
    (the Safety Record assembled from a gate evaluation): it skips pydantic's
    validation, which would re-check every nested reading. `values` (a dict display at
    the call site, field name -> value, in declaration order) becomes the model's
    `__dict__`, so the result is the object pydantic would build: every field counts as
    set, no extras, no private attributes. Every field must be given (checked by count;
    the call sites list them literally, and tests compare the results with fully
    validated models). The fields-set is every field name, shared by the models of
    `cls` (an `AllFields`: copying a set per model cost ~4 % of a Safety Record).
    """
    try:
        names, count = _FIELD_NAMES[cls]  # a subscript: cheaper than .get() on 3.11
    except KeyError:
        names, count = _FIELD_NAMES[cls] = AllFields(cls.model_fields), len(cls.model_fields)
    if len(values) != count:
        missing = sorted(names - values.keys())
        extra = sorted(values.keys() - names)
        raise TypeError(f"{cls.__name__}: missing fields {missing}, unknown fields {extra}")
    obj = _new_instance(cls)
    _set_dict(obj, values)
    _set_fields_set(obj, names)
    _set_extra(obj, None)
    _set_private(obj, None)
    return obj


def replaced(model: _M, changes: dict[str, Any]) -> _M:
    """`model.model_copy(update=changes)` for a core model (no extras, no private
    attributes), in four C-level steps instead of pydantic's Python `__copy__` (~3x the
    cost; the power round replaces a reading of every node it steps). Like model_copy it
    does not validate `changes`: each must be a field name with a valid value."""
    obj = _new_instance(type(model))
    _set_dict(obj, {**model.__dict__, **changes})
    _set_fields_set(obj, {*model.__pydantic_fields_set__, *changes})  # a set, as model_copy's
    _set_extra(obj, None)
    _set_private(obj, None)
    return obj


_E = TypeVar("_E", bound=Enum)


def fast_members(enum: type[_E]) -> type[_E]:
    """`enum`'s members as the attributes of a plain class: `fast_members(E).X is E.X`.

    On Python 3.11 `E.X` goes through `EnumType.__getattr__`'s slot (no attribute cache)
    and costs ~4x a plain class attribute; the gates and handlers read reason codes on
    every evaluation. Typed as the enum, so mypy checks the names; attribute reads only
    (no iteration, no lookup by value: use the enum itself for those)."""
    return cast("type[_E]", type(f"{enum.__name__}Members", (), dict(enum.__members__)))
