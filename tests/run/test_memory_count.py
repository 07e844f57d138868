"""The runtime's count of live bytes per device (the memory arena-run and the profiler's direct measurement report)."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.run.conftest import REPO, device_env

_COUNT = """
import json
import numpy as np, jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from libarena.run.executor import live_bytes_per_device
mesh = Mesh(np.array(jax.devices()).reshape(2), ("dp",))
split = jax.device_put(np.zeros((1024, 256), np.float32), NamedSharding(mesh, P("dp")))  # 512 KiB per device
whole = jax.device_put(np.zeros((1024, 256), np.float32), NamedSharding(mesh, P()))  # 1 MiB on each
alone = jax.device_put(np.zeros((64, 64), np.float32), jax.devices()[1])  # 16 KiB on device 1
print(json.dumps([live_bytes_per_device() for _ in range(3)]))
"""


def test_live_bytes_count_each_devices_buffers_once_however_often_they_are_read():
    """A split array counts its shard on each device, a replicated one its whole size on each, and reading the
    count does not change it (reading a shard's data made an array per shard, which the next read counted too:
    from the second read on, multi-device arrays were counted twice)."""
    proc = subprocess.run([sys.executable, "-c", _COUNT], cwd=REPO, env=device_env(2), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    reads = json.loads(proc.stdout.strip().splitlines()[-1])
    expected = {"0": 512 * 1024 + 1024 * 1024, "1": 512 * 1024 + 1024 * 1024 + 64 * 64 * 4}
    assert reads == [expected] * 3
