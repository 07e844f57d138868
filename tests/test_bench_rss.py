"""The benchmarks' per-process measure (bench.paper_inputs.run_measured): a tool's peak RSS is its own, not the
benchmark's (Linux keeps a process's peak RSS across exec, so a child forked from a large benchmark process
would report the parent's size), and its exit status passes through."""

from __future__ import annotations

import sys


def test_a_child_of_a_large_process_reports_its_own_peak_rss():
    import numpy as np

    from bench.paper_inputs import run_measured

    ballast = np.ones(300 * 2**20 // 8)  # 300 MiB held by this process while the child runs
    ballast[:] = 2.0
    code, cpu_s, peak = run_measured([sys.executable, "-c", "import numpy as np; a = np.ones(100 * 2**20 // 8); a[:] = 1.0"])
    assert code == 0 and cpu_s > 0
    assert 100 * 2**20 < peak < 250 * 2**20  # its 100 MiB array and an interpreter, none of the 300 MiB
    code, _, peak = run_measured([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"])
    assert code == 128 + 15 and peak < 100 * 2**20
    assert float(ballast[0]) == 2.0


def test_the_wrapper_passes_signals_on_and_names_a_command_it_cannot_start(tmp_path):
    import subprocess

    from bench.paper_inputs import _PEAK_RSS_WRAPPER, run_measured

    rss = tmp_path / "rss.txt"
    proc = subprocess.Popen([sys.executable, "-c", _PEAK_RSS_WRAPPER, str(rss), sys.executable, "-c",
                             "import time; print('up', flush=True); time.sleep(120)"], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "up\n"
    proc.terminate()  # to the wrapper: the tool is stopped too, not orphaned
    assert proc.wait(timeout=30) == 128 + 15 and int(rss.read_text()) > 0
    err = tmp_path / "err.txt"
    with open(err, "w") as stderr:
        code, _, _ = run_measured([str(tmp_path / "no-such-tool")], stderr=stderr)
    assert code == 127 and err.read_text().startswith(f"cannot run {tmp_path / 'no-such-tool'}: No such file")
