"""Seeded delay distributions for the simulated fleet (boot, shutdown, BMC latency, ...).

A distribution is written in a fleet file in one of these forms (durations Go-style):

    90s                                   fixed
    {fixed: 90s}                          fixed
    {uniform: {min: 60s, max: 2m}}        uniform between min and max
    {lognormal: {median: 90s, sigma: 0.25, min: 45s, max: 10m}}
                                          log-normal around the median, clamped to [min, max]

`Delay.sample(rng)` draws microseconds from a `random.Random` the caller seeds (one stream
per node and purpose, so two policies replayed on the same trace see the same draws in
the same order for the same node). `lower_bound()` is the smallest value a draw can take
(what the oracle may assume), `median()` the distribution's median.
"""

from __future__ import annotations

import math
import random
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from nodewarden.units import Duration, parse_duration

_US = 1_000_000


def to_us(duration: str) -> int:
    """A Go-style duration as integer microseconds."""
    return round(parse_duration(duration).total_seconds() * _US)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class _Uniform(_Strict):
    min: Duration
    max: Duration

    @model_validator(mode="after")
    def _ordered(self) -> _Uniform:
        if to_us(self.min) > to_us(self.max):
            raise ValueError("uniform.min must not exceed uniform.max")
        return self


class _LogNormal(_Strict):
    median: Duration
    sigma: float = Field(ge=0, le=5)
    min: Duration = "0s"
    max: Duration | None = None

    @model_validator(mode="after")
    def _ordered(self) -> _LogNormal:
        if to_us(self.median) <= 0:
            raise ValueError("lognormal.median must be greater than 0s")
        if self.max is not None and to_us(self.min) > to_us(self.max):
            raise ValueError("lognormal.min must not exceed lognormal.max")
        return self


class Delay(_Strict):
    """One of fixed / uniform / lognormal (exactly one is set)."""

    fixed: Duration | None = None
    uniform: _Uniform | None = None
    lognormal: _LogNormal | None = None

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        if isinstance(data, str):
            return {"fixed": data}
        return data

    @model_validator(mode="after")
    def _exactly_one(self) -> Delay:
        chosen = [n for n in ("fixed", "uniform", "lognormal") if getattr(self, n) is not None]
        if len(chosen) != 1:
            raise ValueError(
                "write exactly one of fixed, uniform, lognormal (or a duration such as '90s')"
            )
        return self

    def sample(self, rng: random.Random) -> int:
        """One draw, in microseconds."""
        if self.fixed is not None:
            return to_us(self.fixed)
        if self.uniform is not None:
            return round(rng.uniform(to_us(self.uniform.min), to_us(self.uniform.max)))
        spec = self.lognormal
        assert spec is not None
        value = to_us(spec.median) * math.exp(rng.gauss(0.0, 1.0) * spec.sigma)
        value = max(value, to_us(spec.min))
        if spec.max is not None:
            value = min(value, to_us(spec.max))
        return round(value)

    def lower_bound(self) -> int:
        """The smallest value a draw can take, in microseconds."""
        if self.fixed is not None:
            return to_us(self.fixed)
        if self.uniform is not None:
            return to_us(self.uniform.min)
        assert self.lognormal is not None
        return to_us(self.lognormal.min)

    def median(self) -> int:
        """The distribution's median, in microseconds."""
        if self.fixed is not None:
            return to_us(self.fixed)
        if self.uniform is not None:
            return (to_us(self.uniform.min) + to_us(self.uniform.max)) // 2
        spec = self.lognormal
        assert spec is not None
        value = max(to_us(spec.median), to_us(spec.min))
        return min(value, to_us(spec.max)) if spec.max is not None else value


def stream(seed: int, *parts: str) -> random.Random:
    """An independent, reproducible random stream for (seed, parts...).

    Seeding with a string is stable across processes (it does not depend on
    PYTHONHASHSEED), so the same seed always gives the same draws.
    """
    return random.Random("/".join((str(seed), *parts)))
