"""PNG figures like the paper's: cluster throughput over time per policy (Fig. 11), JCT CDF and queue
length over time (Fig. 12). matplotlib is imported only here, with the Agg backend."""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np

from libarena.schedule.simulator import SimulationResult

FIGURES = ("throughput.png", "jct_cdf.png", "queue_length.png")


def plot_runs(runs: dict[str, SimulationResult], out_dir: str | os.PathLike[str]) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from libarena.artifacts import write_bytes
    from libarena.schedule.metrics import job_records

    out = Path(out_dir)
    start = min(r.start_time for r in runs.values())
    written = []

    def save(fig, name: str) -> None:
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=120, bbox_inches="tight")
        plt.close(fig)
        write_bytes(out / name, buf.getvalue())
        written.append(out / name)

    def over_time(series, ylabel: str, name: str) -> None:  # series: SimulationResult -> its time series
        fig, ax = plt.subplots(figsize=(8, 3.2))
        for label, r in runs.items():
            hours = (np.asarray(r.ts_time) - start) / 3600
            ax.plot(hours, np.asarray(series(r)), label=label, linewidth=0.9)
        ax.set_xlabel("time (hours)")
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
        save(fig, name)

    over_time(lambda r: r.ts_throughput, "cluster throughput (samples/s)", "throughput.png")

    fig, ax = plt.subplots(figsize=(5, 3.2))
    for name, r in runs.items():
        jct = np.sort(np.asarray(job_records(r).column("jct_s").to_pylist(), dtype=float)) / 3600
        ax.plot(jct, np.arange(1, jct.size + 1) / max(1, jct.size), label=name)
    ax.set_xscale("log")
    ax.set_xlabel("JCT (hours)")
    ax.set_ylabel("fraction of jobs")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    save(fig, "jct_cdf.png")

    over_time(lambda r: r.ts_queued, "queued jobs", "queue_length.png")
    return written
