"""`--plot FILE.png`: nodes on and queue length over time, one line per policy (matplotlib).

The only module of the simulator that touches matplotlib, imported lazily so the
operator and the simulator work without it (`pip install 'nodewarden[plot]'`).
`write_plot(comparison, path)` writes the PNG; `PlotUnavailable` says how to get
matplotlib when it is missing.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from nodewarden.simulate.report import Comparison

_US_PER_HOUR = 3600 * 1_000_000


class PlotUnavailable(RuntimeError):
    """matplotlib is not installed."""


def _pyplot() -> Any:
    try:
        matplotlib = importlib.import_module("matplotlib")
    except ImportError:
        raise PlotUnavailable(
            "--plot needs matplotlib: pip install 'nodewarden[plot]' (or pip install matplotlib)"
        ) from None
    matplotlib.use("Agg")
    return importlib.import_module("matplotlib.pyplot")


def _steps(series: tuple[tuple[int, int, int], ...], column: int) -> tuple[list[float], list[int]]:
    xs = [t / _US_PER_HOUR for t, *_ in series]
    ys = [row[column] for row in series]
    return xs, ys


def write_plot(cmp: Comparison, path: Path) -> None:
    """Draw nodes on and queue length over time per policy; write a PNG to `path`."""
    plt = _pyplot()
    fig, (nodes_ax, queue_ax) = plt.subplots(2, 1, figsize=(12, 7), sharex=True)
    for run in cmp.runs:
        label = run.policy.name
        xs, on = _steps(run.series, 1)
        _, queued = _steps(run.series, 2)
        nodes_ax.step(xs, on, where="post", label=label, linewidth=0.8)
        queue_ax.step(xs, queued, where="post", label=label, linewidth=0.8)
    nodes_ax.set_ylabel("nodes on")
    queue_ax.set_ylabel("queued containers")
    queue_ax.set_xlabel(f"hours since {cmp.trace.start.isoformat()}")
    nodes_ax.set_title(f"{cmp.trace.name}: nodes on and queue length (seed {cmp.seed})")
    nodes_ax.legend(loc="upper right", fontsize="small")
    nodes_ax.grid(alpha=0.3)
    queue_ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(str(path), dpi=100, metadata={"Software": None})
    plt.close(fig)
