"""libarena.run.heap: timed and training loops run with the long-lived objects frozen out of the collector."""

from __future__ import annotations

import gc

import pytest

from libarena.run.heap import frozen_heap


def test_frozen_heap_freezes_what_lives_and_still_collects_what_the_loop_drops():
    class Node:
        pass

    assert gc.get_freeze_count() == 0
    with frozen_heap():
        frozen = gc.get_freeze_count()
        assert frozen > 0
        with frozen_heap():  # nested: the outer freeze stands
            assert gc.get_freeze_count() == frozen
        assert gc.get_freeze_count() == frozen
        cycle = Node()
        cycle.self = cycle  # a reference cycle made inside: collected as usual
        del cycle
        assert gc.collect() >= 1
    assert gc.get_freeze_count() == 0


def test_frozen_heap_unfreezes_when_the_loop_fails():
    with pytest.raises(RuntimeError):
        with frozen_heap():
            raise RuntimeError("step failed")
    assert gc.get_freeze_count() == 0


_FAULT_PROBE = """
import ctypes, resource, sys
# small pages for this process whatever the host's transparent-huge-page mode (PR_SET_THP_DISABLE): under
# "always" the trimmed top comes back as a few 2 MiB pages and the faults no longer count the trimming
ctypes.CDLL(None).prctl(41, 1, 0, 0, 0)
import numpy as np
from libarena.run.heap import steady_malloc
steady = steady_malloc() if sys.argv[1] == "steady" else None
# a freed 1 MiB mmap chunk moves glibc's dynamic thresholds to 1 MiB (mmap) and 2 MiB (trim)
del_me = np.ones(1 << 20, dtype=np.uint8); del del_me
def burst():  # eight 0.9 MiB temporaries from the heap's top, freed together: a 7 MiB top to trim (or keep)
    arrays = [np.ones(900 << 10, dtype=np.uint8) for _ in range(8)]
    del arrays
burst()
f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    burst()
print(steady, (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0) / 20)
"""


def _faults_per_burst(mode: str) -> tuple[str, float]:
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _FAULT_PROBE, mode], capture_output=True, text=True, check=True).stdout.split()
    return out[0], float(out[1])


def test_steady_malloc_keeps_repeated_temporaries_from_being_faulted_in_on_every_call():
    steady, with_fixed = _faults_per_burst("steady")
    if steady != "True":
        pytest.skip("the C library has no glibc mallopt")
    _, dynamic = _faults_per_burst("dynamic")
    # glibc's own thresholds trim most of the 7 MiB top after every burst: about 1,300 pages faulted in again each
    # time on the development host (4 KiB pages), against a few with the thresholds fixed
    assert dynamic > 20 * max(with_fixed, 1)
    assert with_fixed < 50


def test_huge_page_heap_env_sets_the_tunable_and_keeps_the_others():
    from libarena.run.heap import huge_page_heap_env

    assert huge_page_heap_env({})["GLIBC_TUNABLES"] == "glibc.malloc.hugetlb=1"
    env = huge_page_heap_env({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=0", "PATH": "/bin"})
    assert env == {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1", "PATH": "/bin"}


def test_heap_pages_says_whether_a_heap_can_be_on_huge_pages(tmp_path):
    from libarena.run.heap import heap_pages

    thp = tmp_path / "enabled"
    advised = {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}
    thp.write_text("always [madvise] never\n")
    assert heap_pages(advised, thp) == {"glibc_tunables": "glibc.malloc.hugetlb=1", "thp_mode": "madvise", "huge_pages": True}
    assert heap_pages({}, thp)["huge_pages"] is False
    thp.write_text("[always] madvise never\n")
    assert heap_pages({}, thp)["huge_pages"] is True
    thp.write_text("always madvise [never]\n")
    assert heap_pages(advised, thp)["huge_pages"] is False
    assert heap_pages(advised, tmp_path / "missing") == {"glibc_tunables": "glibc.malloc.hugetlb=1", "thp_mode": None, "huge_pages": False}


_ADVICE_PROBE = """
import numpy as np
array = np.ones(64 << 20, dtype=np.uint8)  # a 64 MiB chunk glibc maps for it
address, inside, flags = array.ctypes.data, False, None
for line in open("/proc/self/smaps"):
    head = line.split()
    if "-" in head[0] and ":" not in head[0]:
        low, high = (int(x, 16) for x in head[0].split("-"))
        inside = low <= address < high
    elif line.startswith("VmFlags") and inside:
        flags = head[1:]
print("hg" in flags)  # madvise(MADV_HUGEPAGE) was called on the array's mapping
"""


def test_a_process_started_with_huge_page_heap_env_advises_huge_pages_for_its_heap():
    import os
    import platform
    import subprocess
    import sys

    from libarena.run.heap import THP_MODE_PATH, huge_page_heap_env

    libc, version = platform.libc_ver()
    if libc != "glibc" or tuple(int(x) for x in version.split(".")[:2]) < (2, 35) or not THP_MODE_PATH.exists():
        pytest.skip("needs glibc 2.35 or later and a kernel with transparent huge pages")
    if "[madvise]" not in THP_MODE_PATH.read_text():
        # glibc advises huge pages only where the kernel waits to be asked; "always" and "never" need no advice
        pytest.skip(f"transparent huge pages are {THP_MODE_PATH.read_text().strip()!r}, not madvise")
    plain = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}

    def advised(env):
        return subprocess.run([sys.executable, "-c", _ADVICE_PROBE], env=env, capture_output=True, text=True, check=True).stdout.split()

    assert advised(huge_page_heap_env(plain)) == ["True"]
    assert advised(plain) == ["False"]
