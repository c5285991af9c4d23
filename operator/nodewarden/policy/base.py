"""Shared plumbing of the pure power core: the frozen model base and clock checks.

Every value the core takes or returns is immutable (`CoreModel` is a frozen pydantic
model with camelCase aliases, unknown fields rejected), so a step can never mutate the
facts or state it was given, and results serialise to the same JSON shape the
Kubernetes objects use.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

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
_FIELD_NAMES: dict[type[BaseModel], frozenset[str]] = {}
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
    validated models). The fields-set is a shared frozenset: the models built this way
    are frozen, so nothing adds to it.
    """
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = frozenset(cls.model_fields)
    if len(values) != len(names):
        missing = sorted(names - values.keys())
        extra = sorted(values.keys() - names)
        raise TypeError(f"{cls.__name__}: missing fields {missing}, unknown fields {extra}")
    obj = _new_instance(cls)
    _set_dict(obj, values)
    _set_fields_set(obj, names)
    _set_extra(obj, None)
    _set_private(obj, None)
    return obj
