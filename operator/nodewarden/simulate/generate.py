"""A seeded generator of realistic workload traces, and the built-in presets.

A trace is the union of independent job classes and bursts:

* a job class arrives as a Poisson process whose rate follows the day (a sine with its
  peak at 14:00 UTC and `diurnal` as the relative swing) and drops on weekends by
  `weekend`; each container draws its run time from a log-normal (median, sigma,
  clamped) and its shape (vcpus, RAM, scratch, GPUs, GPU model, preemptible) from
  weighted choices;
* bursts arrive on working hours (08:00-18:00 UTC) as a Poisson number per day; each
  brings `size` containers of its job class spread over `spread` seconds.

`generate(spec, seed)` is pure and deterministic: the same spec and seed always give the
same trace, byte for byte once written. `PRESETS` holds the built-in traces (the
benchmark's `bursty-week`: a week, about 7,700 containers, short CPU jobs with a daily
rhythm, bursts of hundreds of batch containers, long GPU jobs), so no large trace file
lives in git; `nodewarden trace generate --preset NAME --seed N -o FILE` writes one.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace
from datetime import timedelta

from nodewarden.simulate.distributions import stream
from nodewarden.simulate.trace import (
    DEFAULT_START,
    ShapeCache,
    Trace,
    TraceContainer,
    shared_resources,
)

_US = 1_000_000
_DAY = 86_400.0


@dataclass(frozen=True, slots=True)
class Shape:
    weight: float
    vcpus: int
    ram: str
    scratch: str = "0"
    gpus: int = 0
    gpu_model: str | None = None
    preemptible: bool = False


@dataclass(frozen=True, slots=True)
class JobClass:
    name: str
    per_day: float
    runtime_median: float
    runtime_sigma: float
    runtime_min: float
    runtime_max: float
    shapes: tuple[Shape, ...]
    priority: int = 500
    diurnal: float = 0.0
    weekend: float = 1.0


@dataclass(frozen=True, slots=True)
class Bursts:
    per_day: float
    size_min: int
    size_max: int
    spread: float
    job: JobClass
    weekend: float = 0.3


@dataclass(frozen=True, slots=True)
class GeneratorSpec:
    name: str
    days: float
    classes: tuple[JobClass, ...]
    bursts: tuple[Bursts, ...] = ()
    start_hour: float = 0.0
    """Hours after Monday 00:00 UTC where the trace begins."""

    def scaled(self, days: float | None = None, scale: float | None = None) -> GeneratorSpec:
        """The spec over `days` days with every rate multiplied by `scale`."""
        factor = 1.0 if scale is None else scale
        return replace(
            self,
            days=self.days if days is None else days,
            classes=tuple(replace(c, per_day=c.per_day * factor) for c in self.classes),
            bursts=tuple(replace(b, per_day=b.per_day * factor) for b in self.bursts),
        )


def _rate_factor(t: float, diurnal: float, weekend: float) -> float:
    """Relative arrival rate at t seconds after Monday 00:00 UTC (mean 1 on weekdays)."""
    hour = (t % _DAY) / 3600.0
    factor = 1.0 + diurnal * math.sin(2 * math.pi * (hour - 8.0) / 24.0)  # peak 14:00
    day = int(t // _DAY) % 7
    return factor * (weekend if day >= 5 else 1.0)


def _draw_job(rng: random.Random, job: JobClass) -> tuple[Shape, float]:
    shape = rng.choices(job.shapes, weights=[s.weight for s in job.shapes])[0]
    runtime = rng.lognormvariate(math.log(job.runtime_median), job.runtime_sigma)
    return shape, min(max(runtime, job.runtime_min), job.runtime_max)


def _class_arrivals(rng: random.Random, job: JobClass, begin: float, horizon: float) -> list[float]:
    """Thinned Poisson arrivals in [begin, horizon) (seconds after Monday 00:00 UTC)
    with the class's daily and weekly rhythm."""
    peak = job.per_day / _DAY * (1.0 + job.diurnal)
    if peak <= 0:
        return []
    out: list[float] = []
    t = begin
    while True:
        t += rng.expovariate(peak)
        if t >= horizon:
            return out
        if rng.random() * (1.0 + job.diurnal) <= _rate_factor(t, job.diurnal, job.weekend):
            out.append(t)


def _burst_arrivals(
    rng: random.Random, bursts: Bursts, begin: float, horizon: float
) -> list[float]:
    """Burst arrivals in [begin, horizon) (seconds after Monday 00:00 UTC)."""
    out: list[float] = []
    for day in range(int(begin // _DAY), math.ceil(horizon / _DAY)):
        weekend = (day % 7) >= 5
        mean = bursts.per_day * (bursts.weekend if weekend else 1.0)
        # Poisson count by inversion (small means)
        count, p, threshold = 0, rng.random(), math.exp(-mean)
        while p > threshold:
            count += 1
            p *= rng.random()
        for _ in range(count):
            first = day * _DAY + rng.uniform(8 * 3600, 18 * 3600)
            size = rng.randint(bursts.size_min, bursts.size_max)
            for _ in range(size):
                t = first + rng.uniform(0, bursts.spread)
                if begin <= t < horizon:
                    out.append(t)
    return out


def generate(spec: GeneratorSpec, seed: int) -> Trace:
    """The trace of `spec` for `seed` (pure, deterministic)."""
    begin = spec.start_hour * 3600.0
    horizon = begin + spec.days * _DAY
    drafts: list[tuple[float, str, int, Shape, float, int]] = []
    for job in spec.classes:
        rng = stream(seed, "generate", spec.name, job.name)
        for index, t in enumerate(_class_arrivals(rng, job, begin, horizon)):
            shape, runtime = _draw_job(rng, job)
            drafts.append((t, job.name, index, shape, runtime, job.priority))
    for number, bursts in enumerate(spec.bursts):
        rng = stream(seed, "generate", spec.name, f"bursts-{number}")
        for index, t in enumerate(_burst_arrivals(rng, bursts, begin, horizon)):
            shape, runtime = _draw_job(rng, bursts.job)
            drafts.append((t, f"burst{number}", index, shape, runtime, bursts.job.priority))
    drafts.sort(key=lambda d: (d[0], d[1], d[2]))
    shapes: ShapeCache = {}
    containers = tuple(
        TraceContainer(
            uuid=f"g{n:07d}",
            arrival=round((t - begin) * _US),
            runtime=max(1, round(runtime * _US)),
            resources=shared_resources(
                shapes,
                shape.vcpus,
                shape.ram,
                shape.scratch,
                shape.gpus,
                shape.gpu_model,
                shape.preemptible,
            ),
            priority=priority,
        )
        for n, (t, _, _, shape, runtime, priority) in enumerate(drafts, start=1)
    )
    end = containers[-1].arrival if containers else 0
    start = DEFAULT_START + timedelta(seconds=begin)
    return Trace(name=spec.name, start=start, containers=containers, end=end)


_SHORT_CPU = JobClass(
    name="short-cpu",
    per_day=700,
    runtime_median=240,
    runtime_sigma=0.9,
    runtime_min=20,
    runtime_max=2 * 3600,
    shapes=(
        Shape(0.35, 1, "1Gi"),
        Shape(0.25, 2, "3Gi"),
        Shape(0.20, 4, "8Gi", "20Gi"),
        Shape(0.10, 1, "1Gi", preemptible=True),
        Shape(0.10, 2, "2Gi", preemptible=True),
    ),
    diurnal=0.7,
    weekend=0.35,
)
_GPU_LONG = JobClass(
    name="gpu-long",
    per_day=10,
    runtime_median=2.5 * 3600,
    runtime_sigma=0.6,
    runtime_min=20 * 60,
    runtime_max=12 * 3600,
    shapes=(
        Shape(0.5, 4, "14Gi", "100Gi", gpus=1),
        Shape(0.2, 12, "48Gi", "200Gi", gpus=1),
        Shape(0.3, 16, "120Gi", "500Gi", gpus=2, gpu_model="a100"),
    ),
    priority=800,
    diurnal=0.3,
    weekend=0.6,
)
_BURST_CPU = JobClass(
    name="burst-cpu",
    per_day=0,
    runtime_median=12 * 60,
    runtime_sigma=0.5,
    runtime_min=60,
    runtime_max=90 * 60,
    shapes=(Shape(0.5, 2, "4Gi"), Shape(0.35, 4, "14Gi", "40Gi"), Shape(0.15, 8, "28Gi", "80Gi")),
    priority=300,
)

_GPU_ONE = JobClass(
    name="gpu-one",
    per_day=440,
    runtime_median=1.5 * 3600,
    runtime_sigma=0.6,
    runtime_min=30 * 60,
    runtime_max=6 * 3600,
    shapes=(Shape(0.6, 4, "14Gi", "100Gi", gpus=1), Shape(0.4, 8, "28Gi", "200Gi", gpus=1)),
    priority=800,
    diurnal=0.3,
)
_BURST_SMALL = JobClass(
    name="burst-small",
    per_day=0,
    runtime_median=6 * 60,
    runtime_sigma=0.6,
    runtime_min=30,
    runtime_max=60 * 60,
    shapes=(Shape(0.6, 1, "2Gi"), Shape(0.4, 2, "4Gi")),
    priority=300,
)

PRESETS: dict[str, GeneratorSpec] = {
    "bursty-week": GeneratorSpec(
        name="bursty-week",
        days=7,
        classes=(_SHORT_CPU, _GPU_LONG),
        bursts=(Bursts(per_day=1.6, size_min=200, size_max=450, spread=15 * 60, job=_BURST_CPU),),
    ),
    "steady-day": GeneratorSpec(
        name="steady-day",
        days=1,
        classes=(replace(_SHORT_CPU, per_day=300), replace(_GPU_LONG, per_day=4)),
    ),
    "dense-day": GeneratorSpec(
        name="dense-day",
        days=1.2,
        start_hour=6.0,
        classes=(replace(_SHORT_CPU, per_day=3000, diurnal=0.5), _GPU_ONE),
        bursts=(Bursts(per_day=20, size_min=20, size_max=120, spread=300, job=_BURST_SMALL),),
    ),
    "smoke": GeneratorSpec(
        name="smoke",
        days=0.25,
        start_hour=9.0,
        classes=(replace(_SHORT_CPU, per_day=400), replace(_GPU_LONG, per_day=8)),
        bursts=(Bursts(per_day=2.0, size_min=20, size_max=40, spread=300, job=_BURST_CPU),),
    ),
}
"""Built-in traces: `bursty-week` (the benchmark), `dense-day` (the benchmark's second
trace: 1.2 days from Monday 06:00, ~6,000 containers, 8 % one-GPU jobs of 30 min-6 h,
~20 bursts a working day of 20-120 small jobs within 5 minutes), `steady-day`, `smoke`
(6 hours, tests)."""
