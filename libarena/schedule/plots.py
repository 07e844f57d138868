"""PNG figures like the paper's: cluster throughput over time per policy (Fig. 11), JCT CDF and queue
length over time (Fig. 12). matplotlib is imported only here, with the Agg backend."""

from __future__ import annotations

import io
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from libarena.schedule.simulator import SimulationResult

FIGURES = ("throughput.png", "jct_cdf.png", "queue_length.png")


@dataclass
class RunSeries:
    """What the figures show of one run: its time series and its jobs' completion times."""

    start_time: float
    time_s: np.ndarray
    throughput: np.ndarray
    queued: np.ndarray
    jct_s: np.ndarray

    @classmethod
    def of(cls, res: SimulationResult) -> RunSeries:
        from libarena.schedule.metrics import job_records

        return cls(res.start_time, np.asarray(res.ts_time), np.asarray(res.ts_throughput), np.asarray(res.ts_queued),
                   np.asarray(job_records(res).column("jct_s").to_pylist(), dtype=float))

    @classmethod
    def read(cls, run_dir: str | os.PathLike[str]) -> RunSeries:
        """From the files a run wrote (timeseries.parquet, jobs.parquet); its first tick is its start."""
        from libarena.artifacts import read_table

        ts = read_table(Path(run_dir) / "timeseries.parquet", "timeseries").table
        jobs = read_table(Path(run_dir) / "jobs.parquet", "job_records").table
        time_s = np.asarray(ts.column("time_s").to_pylist(), dtype=float)
        return cls(float(time_s[0]), time_s, np.asarray(ts.column("cluster_throughput").to_pylist(), dtype=float),
                   np.asarray(ts.column("queued_jobs").to_pylist()),
                   np.asarray(jobs.column("jct_s").to_pylist(), dtype=float))


def plot_runs(runs: dict[str, SimulationResult], out_dir: str | os.PathLike[str]) -> list[Path]:
    return plot_series({name: RunSeries.of(res) for name, res in runs.items()}, out_dir)


def plot_series(runs: dict[str, RunSeries], out_dir: str | os.PathLike[str]) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from libarena.artifacts import write_bytes

    out = Path(out_dir)
    start = min(r.start_time for r in runs.values())
    written = []

    def save(fig, name: str) -> None:
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=120, bbox_inches="tight")
        plt.close(fig)
        write_bytes(out / name, buf.getvalue())
        written.append(out / name)

    def over_time(series, ylabel: str, name: str) -> None:  # series: RunSeries -> its time series
        fig, ax = plt.subplots(figsize=(8, 3.2))
        for label, r in runs.items():
            hours = (r.time_s - start) / 3600
            ax.plot(hours, series(r), label=label, linewidth=0.9)
        ax.set_xlabel("time (hours)")
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
        save(fig, name)

    over_time(lambda r: r.throughput, "cluster throughput (samples/s)", "throughput.png")

    fig, ax = plt.subplots(figsize=(5, 3.2))
    for name, r in runs.items():
        jct = np.sort(r.jct_s) / 3600
        ax.plot(jct, np.arange(1, jct.size + 1) / max(1, jct.size), label=name)
    ax.set_xscale("log")
    ax.set_xlabel("JCT (hours)")
    ax.set_ylabel("fraction of jobs")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    save(fig, "jct_cdf.png")

    over_time(lambda r: r.queued, "queued jobs", "queue_length.png")
    return written
