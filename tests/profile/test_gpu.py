"""The CUPTI timer on a real NVIDIA GPU (skipped elsewhere; ``make gpu-check`` installs what it needs)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu


def _matmuls(device):
    import jax
    import numpy as np

    a = jax.device_put(np.random.default_rng(0).standard_normal((1024, 1024), dtype=np.float32), device)
    step = jax.jit(lambda x: (x @ x) * (1.0 / 1024))
    return lambda: step(a)


def test_cupti_is_the_automatic_timer_on_a_gpu(gpu_device):
    from libarena.profile.timers import CuptiTimer, select_timer

    assert isinstance(select_timer("auto", gpu_device), CuptiTimer)


def test_cupti_recorder_sees_the_kernels_of_a_region(gpu_device):
    import jax

    import arena_cupti.activity as arena_cupti

    region = _matmuls(gpu_device)
    jax.block_until_ready(region())
    recorder = arena_cupti.KernelActivityRecorder()
    recorder.start()
    jax.block_until_ready(region())
    kernels = recorder.stop()
    assert kernels, "CUPTI reported no kernel for a matmul"
    assert all(k.end_ns >= k.start_ns > 0 and k.name for k in kernels)
    # nothing is recorded once stopped: kernels run between two windows are in neither
    jax.block_until_ready(region())
    recorder.start()
    empty = recorder.stop()
    assert empty == []


def test_cupti_kernel_time_is_positive_and_within_the_host_wall_time(gpu_device):
    from libarena.profile.timers import select_timer

    region = _matmuls(gpu_device)
    cupti = select_timer("cupti", gpu_device).time(region, 3, 10)
    host = select_timer("host", gpu_device).time(region, 3, 10)
    assert 0 < cupti.median <= host.median * 1.05
